// Sample-rate conversion for speech input (host side): Whisper hears 16 kHz mono, files come
// at any rate. libsamplerate's band-limited sinc converter does it (a well-kept library; a
// hand-written resampler would need its own proof of the anti-aliasing filter).
#pragma once

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
