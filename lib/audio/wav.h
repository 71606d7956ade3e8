// RIFF/WAVE decoding for speech input (host side): the samples of a file's bytes as floats in
// [-1, 1], every channel mixed down to one.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace specula::audio {

struct Wav {
    std::vector<float> mono;  // the channels' mean, per frame
    int sample_rate = 0;      // frames per second
    int channels = 0;         // in the file
    int bits = 0;             // per sample in the file
    bool is_float = false;    // IEEE float samples (else integer PCM)
};

// Walks the RIFF chunks (LIST, fact, ... before or after `data` are skipped) and decodes
// integer PCM of 8 (unsigned), 16, 24 or 32 bits and 32-bit float, also inside
// WAVE_FORMAT_EXTENSIBLE. A malformed or unsupported file is SPECULA_ERR_FORMAT / _UNSUPPORTED
// naming the byte offset and the reason. A `data` chunk whose size reaches past the end of the
// file (streaming writers leave 0 or 0xFFFFFFFF there) is read up to the last whole frame.
Status decode_wav(std::span<const uint8_t> bytes, Wav* out);

}  // namespace specula::audio
