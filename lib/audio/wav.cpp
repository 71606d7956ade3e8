#include "audio/wav.h"

#include <cstring>
#include <optional>
#include <string>

namespace specula::audio {

namespace {

uint32_t u32(const uint8_t* p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint16_t u16(const uint8_t* p) {
    return uint16_t(p[0] | p[1] << 8);
}

constexpr uint16_t kFormatPcm = 1;
constexpr uint16_t kFormatFloat = 3;
constexpr uint16_t kFormatExtensible = 0xFFFE;

Status bad(size_t offset, const std::string& why) {
    return FormatError("WAV file at byte " + std::to_string(offset) + ": " + why);
}

// One sample at p as a float in [-1, 1].
float sample(const uint8_t* p, int bits, bool is_float) {
    switch (bits) {
        case 8:
            return (float(p[0]) - 128.0f) / 128.0f;
        case 16:
            return float(int16_t(u16(p))) / 32768.0f;
        case 24:  // sign-extended from bit 23
            return float(int32_t(uint32_t(p[0] | p[1] << 8 | p[2] << 16) << 8) >> 8) / 8388608.0f;
        default:
            if (is_float) {
                float f;
                std::memcpy(&f, p, 4);
                return f;
            }
            return float(double(int32_t(u32(p))) / 2147483648.0);
    }
}

}  // namespace

Status decode_wav(std::span<const uint8_t> bytes, Wav* out) {
    const uint8_t* b = bytes.data();
    const size_t size = bytes.size();
    if (size < 12) return bad(0, "shorter than a RIFF header (" + std::to_string(size) + " bytes)");
    if (std::memcmp(b, "RIFF", 4) != 0 || std::memcmp(b + 8, "WAVE", 4) != 0)
        return bad(0, "not a RIFF/WAVE file (wrong magic)");

    struct Format {
        uint16_t tag;
        int channels, rate, bits, block;
    };
    std::optional<Format> fmt;
    for (size_t at = 12; at + 8 <= size;) {
        const uint32_t chunk = u32(b + at + 4);
        const size_t body = at + 8;
        const size_t left = size - body;
        if (std::memcmp(b + at, "fmt ", 4) == 0) {
            if (fmt) return bad(at, "a second fmt chunk");
            if (chunk < 16 || chunk > left)
                return bad(at, "fmt chunk of " + std::to_string(chunk) +
                                   " bytes (16 or more, inside the file)");
            const uint8_t* f = b + body;
            Format v{u16(f), u16(f + 2), int(u32(f + 4)), u16(f + 14), u16(f + 12)};
            if (v.tag == kFormatExtensible) {
                if (chunk < 40)
                    return bad(at, "WAVE_FORMAT_EXTENSIBLE fmt chunk shorter than 40 bytes");
                v.tag = u16(f + 24);  // the sub-format GUID's first two bytes
            }
            if (v.tag != kFormatPcm && v.tag != kFormatFloat)
                return Unsupported("WAV file at byte " + std::to_string(at) + ": sample format " +
                                   std::to_string(v.tag) + " (supported: PCM 1, IEEE float 3)");
            const bool known_bits = v.tag == kFormatFloat ? v.bits == 32
                                                          : (v.bits == 8 || v.bits == 16 ||
                                                             v.bits == 24 || v.bits == 32);
            if (!known_bits)
                return Unsupported("WAV file at byte " + std::to_string(at) + ": " +
                                   std::to_string(v.bits) + "-bit " +
                                   (v.tag == kFormatFloat ? "float" : "PCM") + " samples");
            if (v.channels < 1 || v.channels > 64)
                return bad(at, std::to_string(v.channels) + " channels");
            if (v.rate < 1 || v.rate > 1'000'000)
                return bad(at, "sample rate " + std::to_string(v.rate));
            if (v.block != v.channels * v.bits / 8)
                return bad(at,
                           "block align " + std::to_string(v.block) + " is not channels x bytes");
            fmt = v;
        } else if (std::memcmp(b + at, "data", 4) == 0) {
            if (!fmt) return bad(at, "data chunk before the fmt chunk");
            // Streaming writers leave the size unknown; anything past the end is cut off.
            const size_t available = chunk > left ? left : chunk;
            const size_t frames = available / size_t(fmt->block);
            const int bytes_per_sample = fmt->bits / 8;
            out->mono.assign(frames, 0.0f);
            for (size_t i = 0; i < frames; ++i) {
                const uint8_t* frame = b + body + i * size_t(fmt->block);
                float sum = 0.0f;
                for (int c = 0; c < fmt->channels; ++c)
                    sum +=
                        sample(frame + c * bytes_per_sample, fmt->bits, fmt->tag == kFormatFloat);
                out->mono[i] = sum / float(fmt->channels);
            }
            out->sample_rate = fmt->rate;
            out->channels = fmt->channels;
            out->bits = fmt->bits;
            out->is_float = fmt->tag == kFormatFloat;
            return Status::Ok();
        }
        if (chunk > left) return bad(at, "chunk reaches past the end of the file");
        at = body + chunk + (chunk & 1);  // chunks are padded to even sizes
    }
    return bad(size, fmt ? "no data chunk" : "no fmt chunk");
}

}  // namespace specula::audio
