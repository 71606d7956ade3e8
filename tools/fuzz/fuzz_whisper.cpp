// libFuzzer target: arbitrary bytes through the whisper.cpp model file reader. Any crash or
// sanitizer report is a bug; a file that parses must have its tensors' data inside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "format/whisper_ggml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    specula::WhisperGgmlFile file;
    if (!specula::WhisperGgmlFile::parse({data, size}, &file).ok()) return 0;
    for (const auto& t : file.tensors())
        if (t.data.data() < data || t.data.data() + t.data.size() > data + size ||
            t.data.size() != t.n_bytes)
            std::abort();
    if (file.mel_filters().size() != size_t(file.n_mel_filters()) * 201) std::abort();
    return 0;
}
