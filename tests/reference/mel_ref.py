"""NumPy reference of Whisper's log-mel spectrogram, written from OpenAI's audio.py (the
definition whisper.cpp follows): pad 30 s of zeros, torch.stft(n_fft=400, hop=160,
periodic Hann window, center=True with reflect padding), drop the last frame, power
spectrum, mel filters, log10 of at least 1e-10, clamp to max - 8, (x + 4) / 4. All in
float64 here."""
import struct

import numpy as np

SAMPLE_RATE, N_FFT, HOP, CHUNK = 16000, 400, 160, 30 * 16000


def mel_filters(n_mels, sr=SAMPLE_RATE, n_fft=N_FFT):
    """librosa.filters.mel(sr, n_fft, n_mels) (Slaney mel scale and area normalisation): the
    filters OpenAI's mel_filters.npz holds and whisper.cpp's model files copy."""
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0

    def hz_to_mel(f):
        f = np.asarray(f, dtype=np.float64)
        return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)

    def mel_to_hz(m):
        return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)

    fft_freqs = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2:] - mel_f[:-2]))[:, None]
    return weights.astype(np.float32)


def filters_of_ggml_file(path):
    """The mel filters stored in a whisper.cpp ggml model file (after the magic and 11 hparams)."""
    with open(path, "rb") as f:
        head = f.read(56)
        magic, = struct.unpack("<I", head[:4])
        assert magic == 0x67676D6C, hex(magic)
        n_mel, n_fft = struct.unpack("<2i", head[48:56])
        return np.frombuffer(f.read(4 * n_mel * n_fft), dtype="<f4").reshape(n_mel, n_fft)


def log_mel(samples, filters):
    x = np.concatenate([np.asarray(samples, dtype=np.float64), np.zeros(CHUNK)])
    x = np.pad(x, (N_FFT // 2, N_FFT // 2), mode="reflect")
    window = 0.5 * (1 - np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT))
    n_frames = 1 + (len(x) - N_FFT) // HOP
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP][:n_frames]
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2
    power = power[:-1]  # audio.py drops the last frame
    mel = np.log10(np.maximum(power @ filters.astype(np.float64).T, 1e-10)).T
    mel = np.maximum(mel, mel.max() - 8.0)
    return (mel + 4.0) / 4.0
