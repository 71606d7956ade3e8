#!/usr/bin/env bash
# One command that rebuilds the bundled demo pair from scratch (about two hours on
# 2 cores): trains both models (fixed seed), writes them as Q8_0 GGUF with
# specula's writer, distils the draft further from the Q8_0 target as the sampler
# shapes it (distill_draft.py), regenerates the tokenizer test vectors, and evaluates the
# pair (held-out perplexity, acceptance rate greedy and sampled, speedup).
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-900}
bash tools/setup-debian.sh train
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release --target specula-import specula-eval-pair specula-cli
/usr/bin/python3 tools/train/train.py --out build/train --steps "$steps" --seed 1234 | tee build/train/train.log
for m in target draft; do
  build/release/tools/specula-import "build/train/$m.manifest.json" -o "examples/models/specula-demo-$m.gguf" --type q8_0
done
/usr/bin/python3 tools/train/distill_draft.py --out build/train/distill --steps 2000 --seed 1234 \
  --threads 1 | tee build/train/distill.log
build/release/tools/specula-import build/train/distill/draft.manifest.json \
  -o examples/models/specula-demo-draft.gguf --type q8_0
# A third stage for the coupled acceptance (the default when sampling): from the draft just
# written, its acceptance probability itself in the loss, at the sampler's settings without
# top-p, three quarters of each batch the target's own samples.
/usr/bin/python3 tools/train/distill_draft.py --out build/train/coupled --steps 1200 --lr 5e-4 \
  --top-p 1.0 --coupled 2.0 --sampled-share 0.75 --seed 1235 --threads 1 | tee build/train/coupled.log
build/release/tools/specula-import build/train/coupled/draft.manifest.json \
  -o examples/models/specula-demo-draft.gguf --type q8_0
/usr/bin/python3 tools/train/make_vocab_tests.py build/train/target.manifest.json \
  tests/data/ggml-vocab-gpt-2.gguf.inp build/train/heldout.txt tests/data/specula-demo-vocab
build/release/tools/specula-eval-pair -m examples/models/specula-demo-target.gguf \
  --model-draft examples/models/specula-demo-draft.gguf -f build/train/heldout.txt --json build/train/eval.json
build/release/tools/specula-eval-pair -m examples/models/specula-demo-target.gguf \
  --model-draft examples/models/specula-demo-draft.gguf -f build/train/heldout.txt \
  --temp 0.8 --top-k 40 --top-p 0.95 --residual --json build/train/eval-sampled.json
