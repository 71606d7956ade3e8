#include "audio/sound_file.h"

#include <sndfile.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace specula::audio {

namespace {

// libsndfile reads from memory through callbacks over this cursor.
struct Cursor {
    std::span<const uint8_t> bytes;
    sf_count_t at = 0;
};

sf_count_t length(void* user) {
    return sf_count_t(static_cast<Cursor*>(user)->bytes.size());
}

sf_count_t seek(sf_count_t offset, int whence, void* user) {
    auto* c = static_cast<Cursor*>(user);
    const sf_count_t size = sf_count_t(c->bytes.size());
    const sf_count_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? c->at : size;
    c->at = std::clamp<sf_count_t>(base + offset, 0, size);
    return c->at;
}

sf_count_t read(void* to, sf_count_t count, void* user) {
    auto* c = static_cast<Cursor*>(user);
    const sf_count_t n = std::clamp<sf_count_t>(sf_count_t(c->bytes.size()) - c->at, 0, count);
    if (n > 0) std::memcpy(to, c->bytes.data() + c->at, size_t(n));
    c->at += n;
    return n;
}

sf_count_t write(const void*, sf_count_t, void*) {
    return 0;
}

sf_count_t tell(void* user) {
    return static_cast<Cursor*>(user)->at;
}

bool is_riff(std::span<const uint8_t> b) {
    return b.size() >= 4 &&
           (std::memcmp(b.data(), "RIFF", 4) == 0 || std::memcmp(b.data(), "RIFX", 4) == 0 ||
            std::memcmp(b.data(), "RF64", 4) == 0);
}

struct CloseFile {
    void operator()(SNDFILE* f) const { sf_close(f); }
};

}  // namespace

Status decode_audio(std::span<const uint8_t> bytes, Wav* out) {
    if (is_riff(bytes)) return decode_wav(bytes, out);
    if (bytes.empty()) return FormatError("an empty file is no audio");
    Cursor cursor{bytes};
    SF_VIRTUAL_IO io{length, seek, read, write, tell};
    SF_INFO info{};
    std::unique_ptr<SNDFILE, CloseFile> file(sf_open_virtual(&io, SFM_READ, &info, &cursor));
    if (file == nullptr)
        return FormatError("not audio that WAV or libsndfile reads (" +
                           std::string(sf_strerror(nullptr)) + ")");
    if (info.channels <= 0 || info.channels > 64)
        return Unsupported(std::to_string(info.channels) + " channels");
    if (info.samplerate <= 0 || info.samplerate > 768000)
        return Unsupported("a sample rate of " + std::to_string(info.samplerate) + " Hz");
    const int64_t most = kMaxDecodedSeconds * info.samplerate;
    const size_t channels = size_t(info.channels);
    try {
        Wav w;
        w.sample_rate = info.samplerate;
        w.channels = info.channels;
        w.is_float = false;
        // The header's frame count may be absent or wrong (MP3, streamed Ogg): read to the end.
        std::vector<float> chunk(4096 * channels);
        for (;;) {
            const sf_count_t n = sf_readf_float(file.get(), chunk.data(), 4096);
            if (n <= 0) break;
            if (int64_t(w.mono.size()) + n > most)
                return Unsupported("audio longer than " +
                                   std::to_string(kMaxDecodedSeconds / 3600) + " hours");
            for (sf_count_t i = 0; i < n; ++i) {
                float sum = 0;
                for (size_t c = 0; c < channels; ++c)
                    sum += chunk[size_t(i) * channels + c];
                // Lossy decoders overshoot full scale a little; Whisper hears [-1, 1].
                const float x = sum / float(channels);
                w.mono.push_back(std::isfinite(x) ? std::clamp(x, -1.0f, 1.0f) : 0.0f);
            }
        }
        if (sf_error(file.get()) != SF_ERR_NO_ERROR)
            return FormatError("decoding failed after " + std::to_string(w.mono.size()) +
                               " frames (" + sf_strerror(file.get()) + ")");
        *out = std::move(w);
    } catch (const std::bad_alloc&) {
        return OutOfMemory("decoding audio");
    }
    return Status::Ok();
}

}  // namespace specula::audio
