#!/usr/bin/env python3
"""Writes tokenizer test vectors for the demo vocabulary in llama.cpp's format
(inputs separated by "\\n__ggml_vocab_test__\\n", one line of ids per input),
encoded by tools/train/bpe.py: the tokenization the models were trained with.
tests/test_tokenizer.cpp checks that specula's C++ tokenizer agrees.

    /usr/bin/python3 tools/train/make_vocab_tests.py build/train/target.manifest.json \\
        tests/data/ggml-vocab-gpt-2.gguf.inp build/train/heldout.txt tests/data/specula-demo-vocab
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402

manifest, llama_inputs, heldout, out = sys.argv[1:5]
meta = json.load(open(manifest))["metadata"]
merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"][1]]
enc = bpe.Encoder(merges)
assert enc.tokens == meta["tokenizer.ggml.tokens"][1]

sep = "\n__ggml_vocab_test__\n"
cases = [c for c in open(llama_inputs, encoding="utf-8").read().split(sep) if c != ""]
text = open(heldout, encoding="utf-8").read()
cases += [text[i:i + 400] for i in range(0, min(len(text), 400 * 12), 400)]
with open(out + ".inp", "w", encoding="utf-8") as f:
    f.write("".join(c + sep for c in cases))
with open(out + ".out", "w", encoding="utf-8") as f:
    for c in cases:
        f.write(" " + " ".join(str(i) for i in enc.encode(c)) + "\n")
print(f"{len(cases)} cases written to {out}.inp/.out")
