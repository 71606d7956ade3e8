#!/usr/bin/env bash
# On a machine with a GPU: the whole test suite and the benchmarks of a finished build, every log
# written under OUT_DIR and a summary printed last.
#   bash tools/gpu_report.sh [BUILD_DIR] [OUT_DIR]
# Builds nothing: BUILD_DIR (default build/release) must hold a Release build with the tests
# and tools. CTest asks for the Khronos validation layer on every Vulkan test, so the layer must
# be installed (or found through VK_ADD_LAYER_PATH). The benchmark models are random Llama
# models of about 1.1B parameters (Llama 3.2 1B's shape with a 32000-token vocabulary), made
# here in Q8_0 and Q4_0, and one of Llama 3 8B's widths in Q4_0.
# SPECULA_REPORT_SHAPE overrides the 1B files' specula-make-model shape options (smaller, for a
# quick rehearsal on a machine without a GPU), SPECULA_REPORT_SHAPE_8B the 8B file's;
# SPECULA_REPORT_MODELS is where they are written (default OUT_DIR/models, 1.8 GB, and 4.1 GB
# while the 8B step runs); SPECULA_REPORT_TEST_SECONDS bounds the test run;
# SPECULA_REPORT_STEPS picks steps (default: tests bench 8b verify speculative pairs profile, and
# peer where LLAMA_CPP_BIN names a folder with llama.cpp's llama-bench and
# llama-speculative-simple, built elsewhere with its GPU backend: the dialled 8B pair and the 1B
# file beside it, alternating, three rounds; SPECULA_REPORT_PEER_BACKEND is specula's backend
# there, default cuda, and SPECULA_REPORT_PAIR_SHAPE the pair's shape options).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${1:-build/release}
out=${2:-gpu-report}
mkdir -p "$out"
shape=${SPECULA_REPORT_SHAPE:-"--n-embd 2048 --n-layer 16 --n-head 32 --n-head-kv 8 --n-ff 8192 --n-ctx 2048"}

default_steps="tests bench 8b verify speculative pairs profile${LLAMA_CPP_BIN:+ peer}"
steps=" ${SPECULA_REPORT_STEPS:-$default_steps} "
step() { echo "== $1 ($(date +%T))"; }
want() { [[ "$steps" == *" $1 "* ]]; }

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

if want tests; then
step "the whole test suite"
timeout "${SPECULA_REPORT_TEST_SECONDS:-600}" ctest --test-dir "$build" -j 8 --timeout 300 --output-on-failure \
  >"$out/ctest.log" 2>&1
echo "ctest exit $?"
grep -E "tests passed|Failed|\*\*\*|Not Run|Skipped" "$out/ctest.log" | tail -n 30
fi
wait

want bench && step "decode, prompt and verification forwards on the random models"
want bench && for type in q8_0 q4_0; do
  "$build/tools/specula-bench" -m "$models/random-1b-$type.gguf" --backend cuda,vulkan \
    -p 128 -n 128 -r 5 --verify 1,4,8,16 --json "$out/bench-$type.json" 2>&1 | tee "$out/bench-$type.txt"
done

# One SPECULA_VULKAN_* or SPECULA_CUDA_* switch against its alternative on a 1B model, the
# settings alternating so that both see the machine alike: compare NAME TYPE "VALUES" OUT_FILE.
compare() {
  local backend=vulkan
  [[ "$1" == SPECULA_CUDA_* ]] && backend=cuda
  for value in $3; do
    printf '%s=%s %s ' "$1" "$value" "$2"
    env "$1=$value" "$build/tools/specula-bench" -m "$models/random-1b-$2.gguf" \
      --backend $backend -p 16 -n 128 -r 3 --verify 1,8 2>&1 | grep '^| [^b-]'
  done | tee -a "$out/$4"
}
if want bench; then
step "Vulkan weight reads: 8/16-bit storage (1) vs 32-bit words (0), alternating"
for type in q8_0 q4_0; do compare SPECULA_VULKAN_SMALL_STORAGE $type "1 0 1 0" bench-vulkan-reads.txt; done
step "Vulkan barriers: only where a dispatch depends on another vs after every dispatch, alternating"
compare SPECULA_VULKAN_BARRIERS q8_0 "deps all deps all" bench-vulkan-barriers.txt
step "Vulkan: norms applied in the matmuls (1) vs rms_norm dispatches (0), alternating"
for type in q8_0 q4_0; do compare SPECULA_VULKAN_FUSED_NORM $type "1 0 1 0" bench-vulkan-fused-norm.txt; done
step "Vulkan: q and k rotated in their matmuls (1) vs rope dispatches (0), alternating"
compare SPECULA_VULKAN_FUSED_ROPE q8_0 "1 0 1 0" bench-vulkan-fused-rope.txt
step "CUDA: weights in 16-byte loads through shared memory (1) vs each thread's own (0)"
for type in q8_0 q4_0; do compare SPECULA_CUDA_STAGED $type "1 0 1 0" bench-cuda-staged.txt; done
step "CUDA: gate, up and silu in one kernel (1) vs three (0)"
compare SPECULA_CUDA_FUSED_GATE q8_0 "1 0 1 0" bench-cuda-fused-gate.txt
step "CUDA: Q8_0 and Q4_0 times 8-bit inputs (1) vs float inputs (0)"
for type in q8_0 q4_0; do compare SPECULA_CUDA_INT8_INPUTS $type "1 0 1 0" bench-cuda-int8-inputs.txt; done
step "CUDA: Q8_0 and Q4_0 on tensor cores (1) vs dp4a (0)"
for type in q8_0 q4_0; do compare SPECULA_CUDA_TENSOR_CORES $type "0 1 0 1" bench-cuda-tensor-cores.txt; done
fi

if want 8b; then
  # An 8B-shaped Q4_0 file (Llama 3 8B's widths with the 32000-token vocabulary, 4.1 GB; drawn on
  # every core): decode and verification forwards, as for the 1B files.
  step "decode and verification forwards at 8B (Q4_0)"
  shape8b=${SPECULA_REPORT_SHAPE_8B:-"--n-embd 4096 --n-layer 32 --n-head 32 --n-head-kv 8 --n-ff 14336 --n-ctx 2048"}
  # shellcheck disable=SC2086  # the shape is a list of options
  "$build/tools/specula-make-model" --vocab tests/data/ggml-vocab-llama-spm.gguf $shape8b \
    --type q4_0 --name random-8b-q4_0 -o "$models/random-8b-q4_0.gguf" >"$out/make-8b.log" 2>&1 &&
    "$build/tools/specula-bench" -m "$models/random-8b-q4_0.gguf" --backend cuda,vulkan -p 0 -n 128 \
      -r 3 --verify 1,8 2>&1 | tee "$out/bench-8b.txt"
  rm -f "$models/random-8b-q4_0.gguf"
fi

want verify && step "the verify passes: tiled vs multi-dispatch vs host readback"
want verify && for backend in cuda vulkan; do
  "$build/tools/specula-bench-verify" --backend $backend -r 20 --json "$out/verify-$backend.json" \
    2>&1 | tee "$out/verify-$backend.txt"
done

want speculative && step "speculative decoding with the demo pair"
want speculative && for temp in 0 0.8; do
  "$build/tools/specula-bench" -m examples/models/specula-demo-target.gguf \
    --model-draft examples/models/specula-demo-draft.gguf --backend cuda,vulkan,cpu \
    -p 32 -n 128 -r 3 --gamma 4 --gamma-policy fixed --temp $temp --verify 0 2>&1 | tee "$out/spec-$temp.txt"
done
# A pair that cannot pay (the 1B Q8_0 target, its own weights at Q4_0 as draft) with the default
# policy: what it costs against the target alone.
want speculative && for backend in cuda vulkan; do
  "$build/examples/specula-cli" -m "$models/random-1b-q8_0.gguf" -md "$models/random-1b-q4_0.gguf" \
    -p "The json module can be used to" -n 128 --temp 0 --backend $backend --compare 2>&1 |
    grep -E "target alone|acceptance rate" | tee -a "$out/spec-1b-pair.txt"
done
if want pairs; then
  # Dialled pairs of released shapes (docs/benchmarks.md "Choosing a draft"): Llama 3.2 1B's
  # (Q8_0, late scale 0.2: α ≈ 0.96) and Llama 3.1 8B's (Q4_0, late scale SPECULA_REPORT_LATE_8B,
  # 0.05: α ≈ 0.7 on an H200; at 0.3 its draft agreed on no token), each with a draft of its
  # first 2 layers; the default policy against the target alone, alternating in one run, greedy
  # and sampled, three prompts (4.5 GB of files while this step runs).
  step "speculative decoding with dialled pairs of Llama 3.2 1B's and Llama 3.1 8B's shapes"
  # shellcheck disable=SC2086  # pair_maker is a command and its options
  pair_maker="$build/tools/specula-make-model --vocab tests/data/ggml-vocab-llama-spm.gguf --n-ctx 2048 --head-scale 4 --draft-layers 2"
  $pair_maker --shape llama3.2-1b --type q8_0 --late-scale 0.2 -o "$models/pair-1b-t.gguf" \
    --draft-output "$models/pair-1b-d.gguf" >"$out/make-pairs.log" 2>&1
  $pair_maker --shape llama3.1-8b --type q4_0 --late-scale "${SPECULA_REPORT_LATE_8B:-0.05}" \
    -o "$models/pair-8b-t.gguf" --draft-output "$models/pair-8b-d.gguf" >>"$out/make-pairs.log" 2>&1
  for pair in 1b 8b; do
    for sampling in "--temp 0" "--temp 0.8 --top-k 40 --top-p 0.95 --seed 1"; do
      for prompt in "The json module can be used to" "Once upon a time" "def fibonacci(n):"; do
        echo "$pair, $sampling, $prompt" | tee -a "$out/pairs.txt"
        # shellcheck disable=SC2086  # the sampling options are a list
        "$build/tools/specula-bench" -m "$models/pair-$pair-t.gguf" --model-draft "$models/pair-$pair-d.gguf" \
          --backend cuda,vulkan -p 0 -n 128 -r 3 --verify 0 $sampling --gamma-policy auto --gamma 8 \
          --prompt-text "$prompt" 2>&1 | tail -n 4 | tee -a "$out/pairs.txt"
      done
    done
  done
  rm -f "$models"/pair-*.gguf
fi
if want peer; then
  # Beside llama.cpp (LLAMA_CPP_BIN): its plain decoding (llama-bench) and speculative decoding
  # (llama-speculative-simple, drafts of at most 8 and 16, greedy; 8, sampled) against
  # specula-bench's target alone and pair, on the same files, the programs alternating, three
  # rounds; then the 1B Q8_0 file's plain decoding.
  step "beside llama.cpp: the dialled 8B pair, plain and speculative, and the 1B Q8_0 file"
  peer_prompt="The json module can be used to"
  # shellcheck disable=SC2086  # pair_maker is a command and its options
  pair_maker="$build/tools/specula-make-model --vocab tests/data/ggml-vocab-llama-spm.gguf --n-ctx 2048 --head-scale 4 --draft-layers 2"
  # shellcheck disable=SC2086  # the shape is a list of options
  $pair_maker ${SPECULA_REPORT_PAIR_SHAPE:---shape llama3.1-8b} --type q4_0 \
    --late-scale "${SPECULA_REPORT_LATE_8B:-0.05}" -o "$models/pair-8b-t.gguf" \
    --draft-output "$models/pair-8b-d.gguf" >>"$out/make-pairs.log" 2>&1
  peer_backend=${SPECULA_REPORT_PEER_BACKEND:-cuda}
  peer_spec() {
    "$LLAMA_CPP_BIN/llama-speculative-simple" -m "$models/pair-8b-t.gguf" -md "$models/pair-8b-d.gguf" \
      --spec-type draft-simple -p "$peer_prompt" -n 128 --spec-draft-n-min 0 -ngl 99 -ngld 99 \
      -c 2048 "$@" 2>&1 | grep -E "decoded|n_drafted|n_accept|accept  " | tr '\n' ' '
    echo
  }
  for round in 1 2 3; do
    echo "-- round $round"
    "$LLAMA_CPP_BIN/llama-bench" -m "$models/pair-8b-t.gguf" -ngl 99 -p 0 -n 128 -r 1 2>&1 | grep -E "tg128|error"
    for m in 8 16; do printf 'llama.cpp greedy, drafts <= %s: ' $m; peer_spec --spec-draft-n-max $m --temp 0; done
    printf 'llama.cpp sampled, drafts <= 8: '
    peer_spec --spec-draft-n-max 8 --temp 0.8 --top-k 40 --top-p 0.95 --seed 1
    for sampling in "--temp 0" "--temp 0.8 --top-k 40 --top-p 0.95 --seed 1"; do
      echo "specula $sampling"
      # shellcheck disable=SC2086  # the sampling options are a list
      "$build/tools/specula-bench" -m "$models/pair-8b-t.gguf" --model-draft "$models/pair-8b-d.gguf" \
        --backend "$peer_backend" -p 0 -n 128 -r 3 --verify 0 --gamma-policy auto --gamma 8 $sampling \
        --prompt-text "$peer_prompt" 2>&1 | tail -n 1
    done
    "$LLAMA_CPP_BIN/llama-bench" -m "$models/random-1b-q8_0.gguf" -ngl 99 -p 0 -n 128 -r 1 2>&1 | grep -E "tg128|error"
    "$build/tools/specula-bench" -m "$models/random-1b-q8_0.gguf" --backend "$peer_backend" -p 0 \
      -n 128 -r 3 --verify 0 2>&1 | grep -A2 "^| backend" | tail -n 1
  done | tee "$out/peer.txt"
  rm -f "$models"/pair-8b-*.gguf
fi
if want profile; then
  step "where a decode step's device time goes (Q8_0)"
  SPECULA_VULKAN_PROFILE=1 "$build/tools/specula-bench" -m "$models/random-1b-q8_0.gguf" \
    --backend vulkan -p 16 -n 64 -r 1 --verify 0 2>&1 | grep -A12 "vulkan profile" | tee "$out/profile-vulkan.txt"
  # Nsight Compute, where installed: kernel durations at the clocks and caches the run has.
  if command -v ncu >/dev/null; then
    ncu --metrics gpu__time_duration.sum --cache-control none --clock-control none \
      --launch-skip 1500 --launch-count 400 --csv --print-units base \
      "$build/tools/specula-bench" -m "$models/random-1b-q8_0.gguf" --backend cuda -p 16 -n 64 -r 1 \
      --verify 0 >"$out/profile-cuda.csv" 2>"$out/profile-cuda.err"
    python3 - "$out/profile-cuda.csv" <<'PY' | tee "$out/profile-cuda.txt"
import collections, csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
by_kernel = collections.defaultdict(lambda: [0, 0.0])
for r in rows:
    name = r["Kernel Name"].split("(")[0][-40:] + " grid " + r["Grid Size"]
    by_kernel[name][0] += 1
    by_kernel[name][1] += float(r["Metric Value"].replace(",", "")) / 1e3
total = sum(v[1] for v in by_kernel.values())
print(f"cuda kernels: {len(rows)} launches, {total:.1f} us")
for name, (n, us) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1]):
    print(f"  {name:64s} {n:5d} x {us / n:8.2f} us = {100 * us / total:5.1f}%")
PY
  fi
fi
step "done"
