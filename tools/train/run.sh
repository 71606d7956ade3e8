#!/usr/bin/env bash
# One command that rebuilds the bundled demo pair from scratch (about an hour on
# 2 cores): trains both models (fixed seed), writes them as Q8_0 GGUF with
# specula's writer, regenerates the tokenizer test vectors, and evaluates the
# pair (held-out perplexity, greedy acceptance rate, speedup).
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-900}
bash tools/setup-debian.sh train
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release --target specula-import specula-eval-pair
/usr/bin/python3 tools/train/train.py --out build/train --steps "$steps" --seed 1234 | tee build/train/train.log
for m in target draft; do
  build/release/tools/specula-import "build/train/$m.manifest.json" -o "examples/models/specula-demo-$m.gguf" --type q8_0
done
/usr/bin/python3 tools/train/make_vocab_tests.py build/train/target.manifest.json \
  tests/data/ggml-vocab-gpt-2.gguf.inp build/train/heldout.txt tests/data/specula-demo-vocab
build/release/tools/specula-eval-pair -m examples/models/specula-demo-target.gguf \
  --model-draft examples/models/specula-demo-draft.gguf -f build/train/heldout.txt --json build/train/eval.json
