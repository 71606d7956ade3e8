#!/usr/bin/env bash
# The demo command: installs the build dependencies, builds specula (Release)
# and generates text on the best available backend.
#
# Until a trained target/draft pair is bundled, the demo runs a randomly
# initialised ~25M-parameter Llama with the real Llama SentencePiece
# vocabulary: the text is meaningless, the path (GGUF load, tokenizer,
# forward passes, sampling, streaming through the C API) is the real one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-debian.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j "$(nproc)"
model=build/release/demo-random-llama.gguf
if [ ! -f "$model" ]; then
  build/release/tools/specula-make-model --vocab tests/data/ggml-vocab-llama-spm.gguf -o "$model" \
    --n-embd 384 --n-layer 6 --n-head 6 --n-head-kv 2 --n-ff 1024 --n-ctx 512 --type q8_0 --name demo-random-llama
fi
build/release/examples/specula-cli -m "$model" -p "${1:-Once upon a time}" -n 48 --backend auto --temp 0.8 --seed 1
