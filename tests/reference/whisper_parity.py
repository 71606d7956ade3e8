#!/usr/bin/env python3
"""Parity of specula's Whisper encoder and decoder (specula-dump-whisper) with the NumPy
reference (whisper_ref.py), per weight type and backend, on a random model of tiny's layout
with a short audio context (64 positions: 1.28 s windows), 2 blocks, width 128, 80 mel bands,
the English-only vocabulary, and 2.2 s of noise with a chirp. The reference computes its own
log-mel (mel_ref.py) from the same samples.

Tolerances (max |delta| / max |ref|): 1e-5 for the encoder's output and the logits: float32
arithmetic through the convolutions, four LayerNorms per block and GELU against float64 (the
mel's own float32 error, at most ~1e-5, is inside it). The cpu backend's 8-bit inputs of
quantized matmuls are not modelled: those types run with SPECULA_CPU_FLOAT_INPUTS=1 (and CUDA
with SPECULA_CUDA_INT8_INPUTS=0)."""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mel_ref  # noqa: E402
import whisper_ref  # noqa: E402

TOLERANCE = 1e-5
# <|startoftranscript|> <|notimestamps|> a few text tokens, <|0.00|> and <|endoftext|> (.en ids).
TOKENS = [50257, 50362, 464, 2068, 7586, 21831, 18045, 625, 50363, 262, 16931, 50256]

ap = argparse.ArgumentParser()
ap.add_argument("--make-whisper", required=True)
ap.add_argument("--dump-whisper", required=True)
ap.add_argument("--type", required=True, choices=["f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
ap.add_argument("--backend", default="cpu")
ap.add_argument("--emulator", default="")
args = ap.parse_args()

rng = np.random.default_rng(11)
t = np.arange(int(2.2 * mel_ref.SAMPLE_RATE)) / mel_ref.SAMPLE_RATE
samples = (0.05 * rng.standard_normal(t.size) + 0.4 * np.sin(2 * np.pi * (200 + 900 * t) * t)).astype(np.float32)

with tempfile.TemporaryDirectory() as tmp:
    model, wav = os.path.join(tmp, "model.bin"), os.path.join(tmp, "samples.f32")
    enc_path, logits_path = os.path.join(tmp, "enc.f32"), os.path.join(tmp, "logits.f32")
    samples.tofile(wav)
    run = args.emulator.split()
    subprocess.run(run + [args.make_whisper, "-o", model, "--shape", "tiny", "--en", "--type", args.type,
                          "--n-audio-ctx", "64", "--width", "128", "--heads", "4", "--layers", "2",
                          "--seed", "5"], check=True)
    env = dict(os.environ)
    if args.backend == "cpu" and args.type not in ("f32", "f16"):
        env["SPECULA_CPU_FLOAT_INPUTS"] = "1"
    if args.backend == "cuda":
        env["SPECULA_CUDA_INT8_INPUTS"] = "0"
    dump = subprocess.run(run + [args.dump_whisper, model, wav, args.backend, enc_path, logits_path]
                          + [str(t) for t in TOKENS], env=env)
    if dump.returncode == 77:
        sys.exit(77)
    dump.check_returncode()
    f = whisper_ref.WhisperFile(model)
    width = f.h["n_audio_state"]
    enc = np.fromfile(enc_path, dtype=np.float32).reshape(-1, width).astype(np.float64)
    logits = np.fromfile(logits_path, dtype=np.float32).reshape(len(TOKENS), -1).astype(np.float64)
    mel = mel_ref.log_mel(samples.astype(np.float64), f.filters)
    ref_enc = whisper_ref.encode(f, mel)
    ref_logits = whisper_ref.decode(f, ref_enc, TOKENS)

ok = True
for what, ours, ref in (("encoder output", enc, ref_enc), ("logits", logits, ref_logits)):
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    print(f"{args.type} on {args.backend}: {what}: max |delta| / max |ref| = {err:.3e} (tolerance {TOLERANCE:.0e}), "
          f"max |ref| = {np.abs(ref).max():.3f}")
    ok &= bool(err <= TOLERANCE)
agree = (logits.argmax(axis=1) == ref_logits.argmax(axis=1)).mean()
print(f"argmax agreement {agree:.3f}")
sys.exit(0 if ok and agree == 1.0 else 1)
