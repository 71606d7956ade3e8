#!/usr/bin/env python3
"""Synthetic English speech for the bundled Whisper pair: sentences of three manuals packaged
by Debian (Python's, python3.11-doc, PSF licence; Perl's, perl-doc, Artistic or GPL;
PostgreSQL's, postgresql-doc-15, PostgreSQL licence) whose words are all in Debian's wamerican
word list, spoken by espeak-ng with 8 accents, ~90 voice variants, and random speed, pitch and
loudness. Sentences and voice variants are held out by a fixed rule.

Writes <out>/asr_data.npz: log-mel windows exactly as specula's front end computes them
(lib/audio/mel.cpp: periodic Hann, 400-point transform, hop 160, reflection at the start,
silence appended, log10 floored at max - 8, scaled (x + 4) / 4), the sentences, the voice of
each clip, and the speech's start and end (for timestamp tokens).

    /usr/bin/python3 tools/train/asr_data.py --header for-tests-ggml-tiny.en.bin --out DIR
"""
import argparse
import glob
import hashlib
import html.parser
import multiprocessing
import os
import random
import re
import struct
import subprocess
import sys

import numpy as np

# Each manual: where its files are, and how a file becomes paragraphs of plain prose.
PYTHON_DOCS = "/usr/share/doc/python3.11/html/_sources/**/*.rst.txt"
PERL_DOCS = "/usr/share/perl/5.*/pod/*.pod"
POSTGRESQL_DOCS = "/usr/share/doc/postgresql-doc-15/html/*.html"
WORDS = "/usr/share/dict/american-english"
ACCENTS = ["en", "en-us", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp", "en-gb-x-gbcwmd",
           "en-029", "en-us-nyc"]
# Variants that are not plain speech (whispered, robotic announcers) or are test voices.
NOT_SPEECH = {"whisper", "female_whisper", "Half-LifeAnnouncementSystem", "Demonic", "fast_test"}
SAMPLE_RATE, HOP, FFT = 16000, 160, 400


def read_header(path):
    """The mel filters and the token bytes of a whisper.cpp model file."""
    with open(path, "rb") as f:
        b = f.read()
    magic, *hp = struct.unpack_from("<12i", b, 0)
    assert magic == 0x67676D6C, "not a whisper.cpp model file"
    off = 48
    n_mel, n_fft = struct.unpack_from("<2i", b, off)
    off += 8
    filters = np.frombuffer(b, np.float32, n_mel * n_fft, off).reshape(n_mel, n_fft)
    off += 4 * n_mel * n_fft
    (n_tokens,) = struct.unpack_from("<i", b, off)
    off += 4
    tokens = []
    for _ in range(n_tokens):
        (n,) = struct.unpack_from("<i", b, off)
        tokens.append(b[off + 4 : off + 4 + n])
        off += 4 + n
    return hp, filters.copy(), tokens


def rst_paragraphs(text):
    for p in re.split(r"\n\s*\n", text):
        p = p.strip()
        if p.startswith(("..", "::", ">>>", "*", "-", "|", "=", "#")):
            continue
        p = " ".join(p.split())
        p = re.sub(r":[a-z:]+:`~?([^`<]*)`", r"\1", p)
        p = re.sub(r"``([^`]*)``", r"\1", p)
        yield re.sub(r"\*([a-z]+)\*", r"\1", p)


def pod_paragraphs(text):
    for p in re.split(r"\n\s*\n", text):
        if p.startswith(("=", " ", "\t")):  # commands and verbatim (code) paragraphs
            continue
        p = " ".join(p.split())
        for _ in range(3):  # nested formatting codes: C<...>, I<...>, L<text|link>, ...
            p = re.sub(r"[A-Z]<([^<>|]*)(\|[^<>]*)?>", r"\1", p)
        yield p


class _HtmlParagraphs(html.parser.HTMLParser):
    """The text of each <p> element, code inside it included (the filter drops such sentences)."""

    def __init__(self):
        super().__init__()
        self.depth, self.text, self.out = 0, [], []

    def handle_starttag(self, tag, attrs):
        if tag == "p":
            self.depth += 1

    def handle_endtag(self, tag):
        if tag == "p" and self.depth:
            self.depth -= 1
            self.out.append(" ".join("".join(self.text).split()))
            self.text = []

    def handle_data(self, data):
        if self.depth:
            self.text.append(data)


def html_paragraphs(text):
    parser = _HtmlParagraphs()
    parser.feed(text)
    return parser.out


CORPORA = [(PYTHON_DOCS, rst_paragraphs), (PERL_DOCS, pod_paragraphs), (POSTGRESQL_DOCS, html_paragraphs)]


def sentences():
    """Prose sentences of 3 to 12 dictionary words, ending in '.' or '?'."""
    words = {w.strip() for w in open(WORDS) if w.strip().isalpha() and w.strip().islower()}
    out = set()
    for pattern, paragraphs in CORPORA:
        files = sorted(glob.glob(pattern, recursive=True))
        if not files:
            sys.exit(f"no files at {pattern}: tools/setup-debian.sh train-asr installs the manuals")
        for f in files:
            for p in paragraphs(open(f, encoding="utf-8", errors="replace").read()):
                for s in re.split(r"(?<=[.!?])\s+", p):
                    if not re.fullmatch(r"[A-Z][a-z']*(,? [A-Za-z][a-z']*)*,?[.?]", s):
                        continue
                    ws = re.findall(r"[A-Za-z']+", s)
                    if 3 <= len(ws) <= 12 and all(w.lower() in words or w in ("I", "Python") for w in ws):
                        out.add(s)
    return sorted(out)


def held_out(key, percent):
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % 100 < percent


def variants():
    out = subprocess.run(["espeak-ng", "--voices=variant"], capture_output=True, text=True).stdout
    return sorted({l.split()[3] for l in out.splitlines()[1:] if len(l.split()) > 3} - NOT_SPEECH)


def log_mel(x, filters, frames):
    """specula's front end (lib/audio/mel.cpp) for the first `frames` frames of x + silence."""
    n = frames * HOP + FFT
    padded = np.zeros(n + FFT // 2, np.float64)
    padded[FFT // 2 : FFT // 2 + min(len(x), n)] = x[:n]
    padded[: FFT // 2] = x[1 : FFT // 2 + 1][::-1]  # x[-i] = x[i]
    window = 0.5 * (1 - np.cos(2 * np.pi * np.arange(FFT) / FFT))
    idx = np.arange(frames)[:, None] * HOP + np.arange(FFT)[None, :]
    spec = np.fft.rfft(padded[idx] * window, axis=1)
    power = spec.real**2 + spec.imag**2
    mel = np.log10(np.maximum(power @ filters.T.astype(np.float64), 1e-10))
    # Frames past the audio see only silence (the runtime sets them to the floor exactly).
    audio_frames = (len(x) + FFT // 2 + HOP - 1) // HOP
    mel[audio_frames:] = -10.0
    mel = np.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32).T  # [n_mels, frames]


def synthesize(job):
    text, voice, speed, pitch, amp, gain, noise_db, seed = job
    wav = subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-a",
                          str(amp), "--stdout", text], capture_output=True, check=True).stdout
    raw = subprocess.run(["sox", "-t", "wav", "-", "-t", "raw", "-r", str(SAMPLE_RATE), "-e",
                          "float", "-b", "32", "-c", "1", "-"], input=wav, capture_output=True,
                         check=True).stdout
    x = np.frombuffer(raw, np.float32).astype(np.float64) * gain
    if noise_db is not None:
        rms = np.sqrt(np.mean(x**2)) + 1e-9
        x = x + np.random.default_rng(seed).normal(0, rms * 10 ** (-noise_db / 20), len(x))
    loud = np.flatnonzero(np.abs(x) > 0.02 * np.abs(x).max())
    start, end = (loud[0], loud[-1]) if len(loud) else (0, len(x))
    return x, start / SAMPLE_RATE, end / SAMPLE_RATE


def make_clip(args):
    job, filters, frames = args
    x, start, end = synthesize(job)
    if len(x) > frames * HOP:
        return None
    return log_mel(x, filters, frames).astype(np.float16), start, end


def write_eval_set(directory, n, sents, voices, seed):
    """n clips of held-out sentences by held-out voices as 16 kHz WAV files, and list.tsv
    (file, reference) for specula-eval-asr."""
    import wave
    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "list.tsv"), "w") as listing:
        for i in range(n):
            text = rng.choice(sents)
            voice = rng.choice(ACCENTS) + "+" + rng.choice(voices)
            x, _, _ = synthesize((text, voice, rng.randint(150, 200), rng.randint(30, 70), 100,
                                  1.0, None, 0))
            name = f"clip{i:03d}.wav"
            with wave.open(os.path.join(directory, name), "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(SAMPLE_RATE)
                w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
            listing.write(f"{name}\t{text}\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--header", required=True, help="whisper.cpp file with the mel filters")
    ap.add_argument("--out", required=True)
    ap.add_argument("--clips", type=int, default=16000, help="training clips")
    ap.add_argument("--heldout-clips", type=int, default=300)
    ap.add_argument("--n-audio-ctx", type=int, default=250, help="window: n_audio_ctx / 50 s")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--eval-dir", help="only write an evaluation set of WAV files here")
    ap.add_argument("--eval-clips", type=int, default=100)
    ap.add_argument("--word-salad", type=float, default=0.0,
                    help="share of training clips that speak random words of the training sentences "
                         "(no sentence to learn by heart: only hearing transcribes them)")
    a = ap.parse_args()
    _, filters, _ = read_header(a.header)
    frames = 2 * a.n_audio_ctx
    sents = sentences()
    voices = variants()
    train_s = [s for s in sents if not held_out(s, 4)]
    held_s = [s for s in sents if held_out(s, 4)]
    train_v = [v for v in voices if not held_out(v, 12)]
    held_v = [v for v in voices if held_out(v, 12)]
    print(f"{len(sents)} sentences ({len(held_s)} held out), {len(voices)} variants "
          f"({len(held_v)} held out: {' '.join(held_v)})", flush=True)
    if a.eval_dir:
        write_eval_set(a.eval_dir, a.eval_clips, held_s, held_v, a.seed + 1)
        return
    rng = random.Random(a.seed)
    train_words = sorted({w for t in train_s for w in t.rstrip(".?").replace(",", "").lower().split()})

    def salad():
        ws = [rng.choice(train_words) for _ in range(rng.randint(3, 10))]
        return " ".join(ws).capitalize() + "."

    def jobs(n, ss, vs, salad_share=0.0):
        out = []
        for i in range(n):
            text = salad() if rng.random() < salad_share else rng.choice(ss)
            voice = rng.choice(ACCENTS) + "+" + rng.choice(vs)
            noise = rng.choice([None, rng.uniform(15, 40)])
            out.append((text, voice, rng.randint(140, 210), rng.randint(25, 75),
                        rng.randint(60, 180), rng.uniform(0.3, 1.0), noise, a.seed * 1000003 + i))
        return out

    sets = {"train": jobs(a.clips, train_s, train_v, a.word_salad),
            "heldout": jobs(a.heldout_clips, held_s, held_v)}
    os.makedirs(a.out, exist_ok=True)
    arrays = {}
    with multiprocessing.Pool(a.jobs) as pool:
        for name, js in sets.items():
            clips = pool.map(make_clip, [(j, filters, frames) for j in js], chunksize=16)
            keep = [i for i, c in enumerate(clips) if c is not None]
            arrays[name + "_mel"] = np.stack([clips[i][0] for i in keep])
            arrays[name + "_text"] = np.array([js[i][0] for i in keep])
            arrays[name + "_voice"] = np.array([js[i][1] for i in keep])
            arrays[name + "_span"] = np.array([[clips[i][1], clips[i][2]] for i in keep], np.float32)
            print(f"{name}: {len(keep)} clips of {len(js)} fit {frames / 100:.1f} s", flush=True)
    spoken = sorted(set(sents) | set(arrays["train_text"].tolist()))  # the salads' too
    np.savez(os.path.join(a.out, "asr_data.npz"), **arrays,
             all_sentences=np.array(spoken), n_audio_ctx=a.n_audio_ctx)


if __name__ == "__main__":
    main()
