// libFuzzer target: arbitrary bytes through the GGUF reader, then through the
// model's tokenizer construction. Any crash, leak or sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    specula::GgufFile file;
    if (!specula::GgufFile::parse({data, size}, &file).ok()) return 0;
    for (const auto& t : file.tensors()) {
        volatile uint8_t sink = t.data.empty() ? 0 : t.data[t.data.size() - 1];
        (void)sink;
    }
    std::unique_ptr<specula::Tokenizer> tok;
    if (specula::Tokenizer::from_gguf(file, &tok).ok()) {
        const auto ids = tok->encode("Hello world, 123 ü", true);
        (void)tok->decode(ids);
    }
    return 0;
}
