#!/usr/bin/env bash
# The speech demo: installs the build dependencies, builds specula (Release) and transcribes
# the bundled clip (examples/audio/held-out-sentence.wav: a sentence and a voice the pair never
# heard in training) and any WAV files given, with the bundled Whisper pair
# (examples/models/specula-whisper-{target,draft}.bin, the draft proposing the tokens of
# specula-whisper-draft.tokens; tools/train/README.md) on the best
# available backend, as tools/demo.sh does for text. It prints the transcript, the acceptance
# rate, tokens per target call, and the speedup over the target alone, measured in the same run
# (greedy with the temperature fallback, the library's default: the pair's transcript is the
# target alone's either way, and --compare fails where it is not).
#   bash tools/demo-asr.sh [more.wav ...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-debian.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j "$(nproc)"
for audio in examples/audio/held-out-sentence.wav "$@"; do
  echo "== $audio"
  build/release/examples/specula-asr -m examples/models/specula-whisper-target.bin \
    --md examples/models/specula-whisper-draft.bin \
    --draft-tokens examples/models/specula-whisper-draft.tokens -f "$audio" --no-timestamps \
    --backend "${SPECULA_DEMO_BACKEND:-auto}" --compare
done
