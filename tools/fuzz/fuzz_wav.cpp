// libFuzzer target: arbitrary bytes through the WAV decoder. Any crash or sanitizer report is
// a bug; a decoded file's samples must be finite for integer PCM and within [-1, 1].
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "audio/wav.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    specula::audio::Wav wav;
    if (!specula::audio::decode_wav({data, size}, &wav).ok() || wav.is_float) return 0;
    for (float x : wav.mono)
        if (!(x >= -1.0f && x <= 1.0f)) std::abort();
    return 0;
}
