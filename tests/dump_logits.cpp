// Writes the logits of every position of a token sequence, evaluated one
// token at a time through the C API, as raw float32: the parity test's input.
// Usage: specula-dump-logits model.gguf out.f32 backend token...
//        specula-dump-logits --probe backend   (exit 77 when the backend has no device here)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "specula.h"

int main(int argc, char** argv) {
    if (argc == 3 && std::strcmp(argv[1], "--probe") == 0) {
        specula_backend_params bp = specula_backend_default_params();
        specula_backend* backend = nullptr;
        if (specula_backend_kind_from_name(argv[2], &bp.kind) != SPECULA_OK) return 2;
        const specula_status s = specula_backend_create(&bp, &backend);
        specula_backend_free(backend);
        if (s == SPECULA_ERR_NO_DEVICE) std::printf("skipped: %s\n", specula_last_error());
        return s == SPECULA_OK ? 0 : s == SPECULA_ERR_NO_DEVICE ? 77 : 1;
    }
    if (argc < 5) {
        std::fprintf(stderr, "usage: %s model.gguf out.f32 cpu|vulkan|cuda token...\n", argv[0]);
        return 2;
    }
    specula_backend_params bp = specula_backend_default_params();
    if (specula_backend_kind_from_name(argv[3], &bp.kind) != SPECULA_OK) {
        std::fprintf(stderr, "specula-dump-logits: %s\n", specula_last_error());
        return 2;
    }
    specula_backend* backend = nullptr;
    specula_model* model = nullptr;
    specula_session* session = nullptr;
    specula_model_info info{};
    specula_session_params sp = specula_session_default_params();
    sp.n_ctx = 256;
    specula_status s = specula_backend_create(&bp, &backend);
    if (s == SPECULA_ERR_NO_DEVICE) {
        std::fprintf(stderr, "specula-dump-logits: skipped: %s\n", specula_last_error());
        return 77;
    }
    if (s == SPECULA_OK) s = specula_model_load(backend, argv[1], nullptr, &model);
    if (s == SPECULA_OK) s = specula_model_get_info(model, &info);
    if (s == SPECULA_OK) s = specula_session_create(model, &sp, &session);
    std::vector<float> all, logits(size_t(info.n_vocab > 0 ? info.n_vocab : 1));
    for (int i = 4; i < argc && s == SPECULA_OK; ++i) {
        const int32_t t = std::atoi(argv[i]);
        s = specula_session_eval(session, &t, 1);
        if (s == SPECULA_OK) s = specula_session_get_logits(session, logits.data(), logits.size());
        all.insert(all.end(), logits.begin(), logits.end());
    }
    if (s == SPECULA_OK) {
        FILE* f = std::fopen(argv[2], "wb");
        if (f == nullptr || std::fwrite(all.data(), sizeof(float), all.size(), f) != all.size())
            s = SPECULA_ERR_IO;
        if (f != nullptr) std::fclose(f);
    }
    if (s != SPECULA_OK)
        std::fprintf(stderr, "specula-dump-logits: %s (%s)\n", specula_last_error(),
                     specula_status_name(s));
    specula_session_free(session);
    specula_model_free(model);
    specula_backend_free(backend);
    return s == SPECULA_OK ? 0 : 1;
}
