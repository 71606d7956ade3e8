"""A live transcription test's audio: held-out-style sentences (sentences.txt, written for this
test, not in the bundled pair's training text) spoken by espeak-ng voice variants that the pair
never heard (tools/train/asr_data.py holds them out), one after another with pauses between
them, as one mono 16-bit WAV at espeak-ng's own rate (22,050 Hz: the stream resamples it) and
another at 16 kHz, and the truth: each sentence's start and end (the first and last sample above 2% of its peak) and
text, as truth.tsv (start_ms, end_ms, text).

    /usr/bin/python3 make_stream.py OUT_DIR [--repeat N] [--silence-s S]

--pause-s MIN MAX draws the pauses after the sentences (1.0 .. 1.6 s; pauses shorter than the
stream's end_silence_ms make one long utterance). --repeat spreads N copies of the sentence list (each with its own voices), and --silence-s
inserts S seconds of silence between copies: the long-run (memory) test's hour of audio.
"""
import argparse
import os
import random
import subprocess
import wave

import numpy as np

HELD_OUT_VOICES = ["Andy", "Boris", "Ed", "Gene2", "Lee", "Linda", "Paul", "Storm", "anika",
                   "female2", "male2", "male6"]
ACCENTS = ["en", "en-us", "en-gb-x-rp", "en-us-nyc"]


def speak(text, voice, speed, pitch):
    out = subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch),
                          "--stdout", text], capture_output=True, check=True).stdout
    with wave.open(__import__("io").BytesIO(out)) as w:
        rate = w.getframerate()
        x = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float64) / 32768
    return x, rate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--silence-s", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pause-s", type=float, nargs=2, default=(1.0, 1.6),
                    help="the pause after each sentence is drawn from this range")
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "sentences.txt")) as f:
        sentences = [l.strip() for l in f if l.strip()]
    rng = random.Random(a.seed)
    pieces, truth, rate, at = [], [], None, 0
    for copy in range(a.repeat):
        if copy > 0 and a.silence_s > 0:
            n = int(a.silence_s * rate)
            pieces.append(np.zeros(n))
            at += n
        for text in sentences:
            voice = rng.choice(ACCENTS) + "+" + rng.choice(HELD_OUT_VOICES)
            x, r = speak(text, voice, rng.randint(155, 185), rng.randint(35, 65))
            assert rate in (None, r), "espeak-ng changed its rate"
            rate = r
            x *= 0.9 / max(1e-9, np.abs(x).max())
            loud = np.flatnonzero(np.abs(x) > 0.02 * np.abs(x).max())
            truth.append((at + loud[0], at + loud[-1], text))
            pause = np.zeros(int(rng.uniform(*a.pause_s) * rate))
            pieces += [x, pause]
            at += len(x) + len(pause)
    audio = np.concatenate(pieces)
    os.makedirs(a.out, exist_ok=True)
    with wave.open(os.path.join(a.out, "stream.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    # The same audio at 16 kHz (a band-limited resampling through the FFT): a stream that
    # pushes it resamples nothing (the long-run test, where the resampler would be most of
    # the work).
    n16 = len(audio) * 16000 // rate
    at16k = np.fft.irfft(np.fft.rfft(audio)[: n16 // 2 + 1], n16) * (n16 / len(audio))
    with wave.open(os.path.join(a.out, "stream16k.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.clip(at16k, -1, 1) * 32767).astype("<i2").tobytes())
    with open(os.path.join(a.out, "truth.tsv"), "w") as f:
        for s, e, text in truth:
            f.write(f"{1000 * s // rate}\t{1000 * e // rate}\t{text}\n")
    print(f"{len(audio) / rate:.1f} s, {len(truth)} sentences, {rate} Hz")


if __name__ == "__main__":
    main()
