// Writes the log-mel spectrogram of raw float32 samples (16 kHz mono) under raw float32 filters
// (n_mel rows of 201), as raw float32 laid out as audio::LogMel::data: the mel parity test's input.
// Usage: specula-dump-mel samples.f32 filters.f32 n_mel out.f32
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "audio/mel.h"

namespace {

bool read_floats(const char* path, std::vector<float>* out) {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) return false;
    out->resize(size_t(f.tellg()) / sizeof(float));
    f.seekg(0);
    return bool(f.read(reinterpret_cast<char*>(out->data()), std::streamsize(out->size() * 4)));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s samples.f32 filters.f32 n_mel out.f32\n", argv[0]);
        return 2;
    }
    std::vector<float> samples;
    specula::audio::MelFilters filters;
    filters.n_mel = std::atoi(argv[3]);
    if (!read_floats(argv[1], &samples) || !read_floats(argv[2], &filters.weights)) {
        std::fprintf(stderr, "specula-dump-mel: cannot read the inputs\n");
        return 1;
    }
    specula::audio::LogMel mel;
    const specula::Status s = specula::audio::log_mel(samples, filters, &mel);
    if (!s.ok()) {
        std::fprintf(stderr, "specula-dump-mel: %s\n", s.message().c_str());
        return 1;
    }
    std::ofstream o(argv[4], std::ios::binary);
    o.write(reinterpret_cast<const char*>(mel.data.data()), std::streamsize(mel.data.size() * 4));
    std::printf("%d bands x %d frames\n", mel.n_mel, mel.n_frames);
    return o.good() ? 0 : 1;
}
