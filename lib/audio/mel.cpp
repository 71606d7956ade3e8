#include "audio/mel.h"

#include <kiss_fftr.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <numbers>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace specula::audio {

namespace {

struct FftrFree {
    void operator()(kiss_fftr_state* plan) const { kiss_fftr_free(plan); }
};
using FftrPlan = std::unique_ptr<kiss_fftr_state, FftrFree>;

// The signal as the transform sees it: sample i of the audio followed by the appended silence,
// for i in [-kWhisperFftSize / 2, n + kWhisperChunkSamples + kWhisperFftSize / 2), reflected at
// 0 (x[-i] = x[i], as torch.stft's centre padding does, after audio.py appends the silence).
float padded_sample(std::span<const float> x, long i) {
    if (i < 0) i = -i;
    return size_t(i) < x.size() ? x[size_t(i)] : 0.0f;
}

// Frames [begin, end) of the spectrogram, each log10 of its mel bands' power (unscaled), into
// out->data; returns their largest value, or nothing when its FFT plan cannot be had. A frame
// does not depend on the others, so any split of the frames among threads gives the same values.
std::optional<float> log_mel_frames(std::span<const float> samples, const MelFilters& filters,
                                    std::span<const float> window,
                                    std::span<const std::pair<int, int>> support, long begin,
                                    long end, LogMel* out) {
    FftrPlan plan(kiss_fftr_alloc(kWhisperFftSize, 0, nullptr, nullptr));  // one per thread
    if (!plan) return std::nullopt;
    float frame[kWhisperFftSize];
    kiss_fft_cpx spectrum[kWhisperFftBins];
    double power[kWhisperFftBins];
    float top = -std::numeric_limits<float>::infinity();
    for (long t = begin; t < end; ++t) {
        const long first = t * kWhisperHop - kWhisperFftSize / 2;
        for (int j = 0; j < kWhisperFftSize; ++j)
            frame[j] = window[j] * padded_sample(samples, first + j);
        kiss_fftr(plan.get(), frame, spectrum);
        for (int k = 0; k < kWhisperFftBins; ++k)
            power[k] =
                double(spectrum[k].r) * spectrum[k].r + double(spectrum[k].i) * spectrum[k].i;
        for (int m = 0; m < out->n_mel; ++m) {
            const float* w = filters.weights.data() + size_t(m) * kWhisperFftBins;
            double sum = 0.0;
            for (int k = support[size_t(m)].first; k < support[size_t(m)].second; ++k)
                sum += double(w[k]) * power[k];
            const float v = float(std::log10(std::max(sum, 1e-10)));
            out->data[size_t(m) * size_t(out->n_frames) + size_t(t)] = v;
            top = std::max(top, v);
        }
    }
    return top;
}

// Frames a thread is given at least (a frame takes about 2 µs).
constexpr long kMinFramesPerThread = 100;

}  // namespace

Status log_mel(std::span<const float> samples, const MelFilters& filters, LogMel* out,
               const ParallelFor& parallel_for) {
    if (filters.n_mel <= 0 ||
        filters.weights.size() != size_t(filters.n_mel) * size_t(kWhisperFftBins))
        return InvalidArgument("mel filters: " + std::to_string(filters.weights.size()) +
                               " weights for " + std::to_string(filters.n_mel) + " bands of " +
                               std::to_string(kWhisperFftBins) + " frequency bins");
    for (size_t i = 0; i < samples.size(); ++i)
        if (!std::isfinite(samples[i]))
            return InvalidArgument("audio sample " + std::to_string(i) + " is not a finite number");
    const long n_total = long(samples.size()) + kWhisperChunkSamples;
    if (n_total / kWhisperHop > long(1 << 30) / filters.n_mel)
        return InvalidArgument("audio of " + std::to_string(samples.size()) +
                               " samples is too long for one spectrogram");
    try {
        out->n_mel = filters.n_mel;
        // Frames centred on samples 0, hop, ..., all of the padded signal but the last
        // (audio.py drops it).
        out->n_frames = int(n_total / kWhisperHop);
        out->data.resize(size_t(out->n_mel) * size_t(out->n_frames));  // every value set below
        // Frames past the audio see only silence: their spectrum is zero.
        const long audio_frames = std::min<long>(
            out->n_frames,
            (long(samples.size()) + kWhisperFftSize / 2 + kWhisperHop - 1) / kWhisperHop);
        // Each band's non-zero weights (a mel filter spans a few bins): the sums skip only
        // products with a zero weight, which add exactly nothing.
        std::vector<std::pair<int, int>> support(size_t(filters.n_mel), {0, 0});
        for (int m = 0; m < filters.n_mel; ++m) {
            const float* w = filters.weights.data() + size_t(m) * kWhisperFftBins;
            int lo = 0, hi = kWhisperFftBins;
            while (lo < hi && w[lo] == 0.0f)
                ++lo;
            while (hi > lo && w[hi - 1] == 0.0f)
                --hi;
            support[size_t(m)] = {lo, hi};
        }
        // A periodic Hann window (torch.hann_window's default).
        std::array<float, kWhisperFftSize> window;
        for (int j = 0; j < kWhisperFftSize; ++j)
            window[size_t(j)] =
                float(0.5 * (1.0 - std::cos(2.0 * std::numbers::pi * j / kWhisperFftSize)));
        const float floor = -10.0f;  // log10(1e-10)
        float top = audio_frames < out->n_frames ? floor : -std::numeric_limits<float>::infinity();
        // Blocks of frames, which parallel_for shares among its threads; a chunk of blocks is
        // computed with one FFT plan, and its largest value kept at its first block.
        const long blocks = std::max<long>(1, audio_frames / kMinFramesPerThread);
        const auto block_start = [&](size_t b) { return audio_frames * long(b) / blocks; };
        std::vector<std::optional<float>> tops(static_cast<size_t>(blocks),
                                               -std::numeric_limits<float>::infinity());
        const std::function<void(size_t, size_t)> chunk = [&](size_t b0, size_t b1) {
            tops[b0] = log_mel_frames(samples, filters, window, support, block_start(b0),
                                      block_start(b1), out);
        };
        if (parallel_for && blocks > 1) {
            parallel_for(size_t(blocks), chunk);
        } else {
            chunk(0, size_t(blocks));
        }
        for (const std::optional<float>& v : tops) {
            if (!v) return OutOfMemory("cannot allocate an FFT plan");
            top = std::max(top, *v);
        }
        // The silent frames (most of a short clip's spectrogram: the 30 s appended) are one
        // value, written once per band after the frames of audio are scaled.
        const float silent = (std::max(floor, top - 8.0f) + 4.0f) / 4.0f;
        for (int m = 0; m < out->n_mel; ++m) {
            float* band = out->data.data() + size_t(m) * size_t(out->n_frames);
            for (long t = 0; t < audio_frames; ++t)
                band[t] = (std::max(band[t], top - 8.0f) + 4.0f) / 4.0f;
            std::fill(band + audio_frames, band + out->n_frames, silent);
        }
    } catch (const std::bad_alloc&) {
        return OutOfMemory("cannot allocate a spectrogram of " +
                           std::to_string(n_total / kWhisperHop) + " frames");
    }
    return Status::Ok();
}

}  // namespace specula::audio
