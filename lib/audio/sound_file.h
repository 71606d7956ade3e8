// Speech input in the formats people have (host side): WAV through specula's own reader
// (audio/wav.h), FLAC, MP3 and Ogg (Vorbis, Opus) through libsndfile, a well-kept decoder of all
// of them. The samples come as floats in [-1, 1], the channels mixed down to one.
#pragma once

#include <cstdint>
#include <span>

#include "audio/wav.h"
#include "core/status.h"

namespace specula::audio {

// The most audio a file may decode to (a compressed file of silence can hold hours in a few
// kilobytes): four hours at its own rate.
constexpr int64_t kMaxDecodedSeconds = 4 * 3600;

// A RIFF/WAVE file by decode_wav(); anything else by libsndfile, which recognises the format from
// its bytes. A file neither reads is SPECULA_ERR_FORMAT naming libsndfile's reason; longer than
// kMaxDecodedSeconds, or of more than 64 channels or a rate past 768 kHz, SPECULA_ERR_UNSUPPORTED.
// `out->bits` is 0 for compressed formats.
Status decode_audio(std::span<const uint8_t> bytes, Wav* out);

}  // namespace specula::audio
