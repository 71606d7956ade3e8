// Whisper's log-mel spectrogram (host side), as whisper.cpp and OpenAI's audio.py compute it:
// the audio followed by 30 s of silence, a short-time Fourier transform of 400-sample frames
// every 160 samples (a periodic Hann window, the first frame centred on sample 0 with the
// signal reflected before it), each frame's power spectrum weighed by the model's mel filters,
// log10 of at least 1e-10, everything below (maximum - 8) raised to it, then (x + 4) / 4.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"

namespace specula::audio {

constexpr int kWhisperFftSize = 400;                      // samples per frame (25 ms)
constexpr int kWhisperHop = 160;                          // samples between frames (10 ms)
constexpr int kWhisperFftBins = kWhisperFftSize / 2 + 1;  // 0 .. Nyquist
constexpr int kWhisperChunkSamples = 30 * 16000;          // the silence appended (30 s)
constexpr int kWhisperChunkFrames = kWhisperChunkSamples / kWhisperHop;  // frames per window

// A model's filter bank: n_mel rows of kWhisperFftBins weights (80 or 128 rows in real files).
struct MelFilters {
    int n_mel = 0;
    std::vector<float> weights;  // weights[m * kWhisperFftBins + k]
};

struct LogMel {
    int n_mel = 0;
    int n_frames = 0;         // (samples + kWhisperChunkSamples) / kWhisperHop
    std::vector<float> data;  // data[m * n_frames + t], as whisper.cpp lays it out
};

// Calls fn(begin, end) on chunks that cover [0, n), on any threads, and returns when all are
// done (Backend::parallel_for_host).
using ParallelFor = std::function<void(size_t n, const std::function<void(size_t, size_t)>& fn)>;

// The log-mel of 16 kHz mono samples; with parallel_for, its frames of audio are computed in
// blocks on its threads (the same values however they are shared). Filters of the wrong size
// and samples that are not finite numbers are SPECULA_ERR_INVALID_ARGUMENT; an FFT plan or
// buffer that cannot be had is SPECULA_ERR_OUT_OF_MEMORY.
Status log_mel(std::span<const float> samples, const MelFilters& filters, LogMel* out,
               const ParallelFor& parallel_for = nullptr);

}  // namespace specula::audio
