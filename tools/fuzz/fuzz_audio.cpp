// libFuzzer target: arbitrary bytes through the audio decoder (specula's WAV reader, libsndfile
// for FLAC, MP3, Ogg and the rest). Any crash or sanitizer report is a bug; decoded samples
// must lie within [-1, 1] (the decoder clamps what lossy formats overshoot and zeroes what is
// not finite), but a WAV file's own float samples, which it passes through.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "audio/sound_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    specula::audio::Wav wav;
    if (!specula::audio::decode_audio({data, size}, &wav).ok() || wav.is_float) return 0;
    for (float x : wav.mono)
        if (!(x >= -1.0f && x <= 1.0f)) std::abort();
    return 0;
}
