#!/usr/bin/env python3
"""The tokens the bundled speech pair's draft proposes (specula_asr_draft_load, FR-Spec): the
text tokens of the training sentences (held-out sentences excluded), most frequent first, one
id per line; with --top, only that many. specula adds the special and timestamp tokens.

    /usr/bin/python3 tools/train/draft_vocab.py --header for-tests-ggml-tiny.en.bin --out F
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from asr_data import held_out, read_header, sentences  # noqa: E402
from train_asr import Bpe  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--header", required=True, help="whisper.cpp file with the vocabulary")
    ap.add_argument("--out", required=True)
    ap.add_argument("--top", type=int, default=0, help="keep the most frequent N (0: all)")
    a = ap.parse_args()
    _, _, vocab = read_header(a.header)
    bpe = Bpe(vocab)
    counts = collections.Counter()
    for s in sentences():
        if not held_out(s, 4):  # asr_data.py's rule: these sentences are never trained on
            counts.update(bpe.encode(" " + s))
    ranked = [t for t, _ in counts.most_common(a.top or None)]
    with open(a.out, "w") as f:
        f.write("".join(f"{t}\n" for t in ranked))
    print(f"{len(ranked)} of {len(counts)} tokens, {sum(counts[t] for t in ranked)} of "
          f"{sum(counts.values())} token occurrences")


if __name__ == "__main__":
    main()
