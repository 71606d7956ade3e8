#!/usr/bin/env bash
# The demo command: installs the build dependencies, builds specula (Release)
# and runs speculative decoding with the bundled target/draft pair
# (examples/models/) on the best available backend: CUDA, else a Vulkan GPU,
# else the cpu backend (SPECULA_DEMO_BACKEND=vulkan asks for llvmpipe). It prints the text, the
# acceptance rate, tokens per target call, and the speedup over the target
# alone, measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-debian.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j "$(nproc)"
build/release/examples/specula-cli \
  -m examples/models/specula-demo-target.gguf -md examples/models/specula-demo-draft.gguf \
  -p "${1:-The json module}" -n "${SPECULA_DEMO_TOKENS:-96}" --temp 0 \
  --gamma-policy analytic --draft-max 8 --backend "${SPECULA_DEMO_BACKEND:-auto}" --compare
