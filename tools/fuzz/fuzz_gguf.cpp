// libFuzzer target: arbitrary bytes through the GGUF reader, the model's tokenizer
// construction, and the C API's model load from memory (a session of 8 positions
// evaluating one token where the load succeeds). Any crash, leak or sanitizer report
// is a bug.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "format/gguf.h"
#include "specula.h"
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
    static specula_backend* backend = [] {
        specula_backend_params bp = specula_backend_default_params();
        bp.kind = SPECULA_BACKEND_CPU;
        bp.n_threads = 1;
        specula_backend* b = nullptr;
        return specula_backend_create(&bp, &b) == SPECULA_OK ? b : nullptr;
    }();
    specula_model* model = nullptr;
    if (backend != nullptr &&
        specula_model_load_from_memory(backend, data, size, nullptr, &model) == SPECULA_OK) {
        specula_session_params sp = specula_session_default_params();
        sp.n_ctx = 8;
        specula_session* session = nullptr;
        if (specula_session_create(model, &sp, &session) == SPECULA_OK) {
            const int32_t token = 0;
            (void)specula_session_eval(session, &token, 1);
            specula_session_free(session);
        }
        specula_model_free(model);
    }
    return 0;
}
