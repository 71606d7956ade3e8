// Sample-rate conversion for speech input (host side): Whisper hears 16 kHz mono, files come
// at any rate. libsamplerate's band-limited sinc converter does it (a well-kept library; a
// hand-written resampler would need its own proof of the anti-aliasing filter).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "core/status.h"

namespace specula::audio {

// What Whisper models hear.
constexpr int kWhisperSampleRate = 16000;

// Mono `in` at from_rate Hz as to_rate Hz (about in.size() * to_rate / from_rate samples),
// band-limited below the lower Nyquist frequency (SRC_SINC_BEST_QUALITY). Equal rates copy.
// Rates must be positive and within a factor of 256 of each other (SPECULA_ERR_INVALID_ARGUMENT).
Status resample(std::span<const float> in, int from_rate, int to_rate, std::vector<float>* out);

}  // namespace specula::audio

namespace specula::audio {

// A stream's conversion: pieces of any length in, the converted samples out as they are ready
// (libsamplerate keeps the filter's state between pieces, so the output is the whole stream's).
class StreamResampler {
  public:
    // Rates as resample()'s.
    static Status create(int from_rate, int to_rate, std::unique_ptr<StreamResampler>* out);
    ~StreamResampler();
    StreamResampler(const StreamResampler&) = delete;
    StreamResampler& operator=(const StreamResampler&) = delete;

    // Appends the samples `in` yields so far to `out`; `last`: the stream ends with `in`
    // (the filter's tail is flushed).
    Status push(std::span<const float> in, bool last, std::vector<float>* out);
    int from_rate() const { return from_; }

  private:
    StreamResampler() = default;
    void* state_ = nullptr;  // libsamplerate's SRC_STATE
    int from_ = 0, to_ = 0;
};

}  // namespace specula::audio
