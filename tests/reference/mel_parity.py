#!/usr/bin/env python3
"""Parity of specula's log-mel spectrogram (audio::log_mel, through specula-dump-mel) with the
NumPy reference (mel_ref.py), for 80 and 128 bands, on noise with a chirp, a clip shorter than
the reflected padding, silence, and whisper.cpp's jfk.wav when the shared data is there.

Tolerance: max |delta| <= 1e-4 and mean |delta| <= 1e-6 on the normalised values (about -1 to
+2; measured: at most 1.4e-5, mean 7e-8). specula transforms in float32 (as whisper.cpp and
torch.stft do), the reference in float64; the filters are the librosa formula's, checked
against a real model file's when the shared data is there."""
import argparse
import os
import subprocess
import sys
import tempfile
import wave

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mel_ref  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--dump-mel", required=True)
ap.add_argument("--shared-data", default="", help="../shared/data: whisper.cpp's files, used when present")
ap.add_argument("--emulator", default="", help="runs the programs of a cross build (e.g. qemu-aarch64-static)")
args = ap.parse_args()

rng = np.random.default_rng(7)
t = np.arange(int(3.3 * mel_ref.SAMPLE_RATE)) / mel_ref.SAMPLE_RATE
signals = {
    "noise+chirp 3.3 s": 0.05 * rng.standard_normal(t.size) + 0.4 * np.sin(2 * np.pi * (100 + 1500 * t) * t),
    "120 samples": 0.3 * rng.standard_normal(120),
    "silence 1 s": np.zeros(mel_ref.SAMPLE_RATE),
}
jfk = os.path.join(args.shared_data, "audio", "jfk.wav")
if args.shared_data and os.path.exists(jfk):
    with wave.open(jfk) as w:
        assert w.getframerate() == 16000 and w.getsampwidth() == 2 and w.getnchannels() == 1
        signals["jfk.wav"] = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2") / 32768.0

filters = {80: mel_ref.mel_filters(80), 128: mel_ref.mel_filters(128)}
# The formula is the one the model files' filters came from: check it against a real one.
stored = os.path.join(args.shared_data, "whisper", "for-tests-ggml-tiny.bin")
if args.shared_data and os.path.exists(stored):
    diff = np.abs(mel_ref.filters_of_ggml_file(stored) - filters[80]).max()
    print(f"mel filters of for-tests-ggml-tiny.bin vs librosa's formula: max |delta| = {diff:.2e}")
    if diff > 1e-6:
        sys.exit(1)
    filters[80] = mel_ref.filters_of_ggml_file(stored)

failed = False
with tempfile.TemporaryDirectory() as tmp:
    for (name, x), n_mel in [(s, n) for s in signals.items() for n in (80, 128)]:
        x = np.asarray(x, dtype=np.float32)
        paths = [os.path.join(tmp, f) for f in ("x.f32", "filters.f32", "mel.f32")]
        x.tofile(paths[0])
        filters[n_mel].astype(np.float32).tofile(paths[1])
        subprocess.run(args.emulator.split() + [args.dump_mel, paths[0], paths[1], str(n_mel), paths[2]],
                       check=True, stdout=subprocess.DEVNULL)
        ref = mel_ref.log_mel(x, filters[n_mel])
        ours = np.fromfile(paths[2], dtype=np.float32).reshape(n_mel, -1)
        if ours.shape != ref.shape:
            print(f"{name}, {n_mel} bands: shape {ours.shape}, reference {ref.shape}")
            failed = True
            continue
        d = np.abs(ours - ref)
        ok = d.max() <= 1e-4 and d.mean() <= 1e-6
        failed |= not ok
        print(f"{name}, {n_mel} bands, {ref.shape[1]} frames: max |delta| {d.max():.2e}, mean {d.mean():.2e}"
              f"{'' if ok else '  FAILED'}")
sys.exit(1 if failed else 0)
