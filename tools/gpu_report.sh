#!/usr/bin/env bash
# On a machine with a GPU: the GPU tests and the benchmarks of a finished build, every log
# written under OUT_DIR and a summary printed last.
#   bash tools/gpu_report.sh [BUILD_DIR] [OUT_DIR]
# Builds nothing: BUILD_DIR (default build/release) must hold a Release build with the tests
# and tools. The benchmark models are random Llama models of about 1.1B parameters (Llama 3.2
# 1B's shape with a 32000-token vocabulary), made here in Q8_0 and Q4_0.
# SPECULA_REPORT_SHAPE overrides their specula-make-model shape options (smaller, for a quick
# rehearsal on a machine without a GPU); SPECULA_REPORT_MODELS is where they are written
# (default OUT_DIR/models, 1.8 GB); SPECULA_REPORT_TEST_SECONDS bounds the test run.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
out=${2:-gpu-report}
mkdir -p "$out"
shape=${SPECULA_REPORT_SHAPE:-"--n-embd 2048 --n-layer 16 --n-head 32 --n-head-kv 8 --n-ff 8192 --n-ctx 2048"}

step() { echo "== $1 ($(date +%T))"; }

step "devices"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv \
  2>&1 | tee "$out/devices.txt"

step "make the benchmark models"
models=${SPECULA_REPORT_MODELS:-$out/models}
mkdir -p "$models"
for type in q8_0 q4_0; do
  # shellcheck disable=SC2086  # the shape is a list of options
  "$build/tools/specula-make-model" --vocab tests/data/ggml-vocab-llama-spm.gguf $shape \
    --type $type --name "random-1b-$type" -o "$models/random-1b-$type.gguf" >"$out/make-$type.log" 2>&1 &
done

step "GPU tests (labels cuda, vulkan, exactness)"
timeout "${SPECULA_REPORT_TEST_SECONDS:-600}" ctest --test-dir "$build" -L "cuda|vulkan|exactness" -j 4 --timeout 300 --output-on-failure \
  >"$out/ctest.log" 2>&1
echo "ctest exit $?"
grep -E "tests passed|Failed|\*\*\*|Not Run|Skipped" "$out/ctest.log" | tail -n 30
wait

step "decode, prompt and verification forwards on the random models"
for type in q8_0 q4_0; do
  "$build/tools/specula-bench" -m "$models/random-1b-$type.gguf" --backend cuda,vulkan \
    -p 128 -n 128 -r 5 --verify 1,4,8,16 --json "$out/bench-$type.json" 2>&1 | tee "$out/bench-$type.txt"
done

step "the verify passes: tiled vs multi-dispatch vs host readback"
for backend in cuda vulkan; do
  "$build/tools/specula-bench-verify" --backend $backend -r 20 --json "$out/verify-$backend.json" \
    2>&1 | tee "$out/verify-$backend.txt"
done

step "speculative decoding with the demo pair"
for temp in 0 0.8; do
  "$build/tools/specula-bench" -m examples/models/specula-demo-target.gguf \
    --model-draft examples/models/specula-demo-draft.gguf --backend cuda,vulkan,cpu \
    -p 32 -n 128 -r 3 --gamma 4 --gamma-policy fixed --temp $temp --verify 0 2>&1 | tee "$out/spec-$temp.txt"
done
step "done"
