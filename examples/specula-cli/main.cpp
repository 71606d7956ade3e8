// specula-cli: generate text with a GGUF model through the public C API.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "specula.h"

namespace {

int fail(const char* what, specula_status s) {
    std::fprintf(stderr, "specula-cli: %s: %s (%s)\n", what, specula_last_error(),
                 specula_status_name(s));
    return 1;
}

bool print_piece(int32_t, const char* piece, size_t len, void*) {
    std::fwrite(piece, 1, len, stdout);
    std::fflush(stdout);
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    std::string model_path, prompt = "Once upon a time", backend_name = "auto";
    int n_predict = 64, threads = 0, top_k = 40;
    unsigned ctx = 0;
    float temp = 0.8f, top_p = 0.95f;
    uint64_t seed = 0x5eed;
    bool no_bos = false;
    CLI::App app{"specula: generate text with a GGUF model"};
    app.add_option("-m,--model", model_path, "model GGUF")->required();
    app.add_option("-p,--prompt", prompt);
    app.add_option("-n,--n-predict", n_predict, "tokens to generate");
    app.add_option("--temp", temp, "temperature (0 = greedy)");
    app.add_option("--top-k", top_k, "0 = off");
    app.add_option("--top-p", top_p, "1 = off");
    app.add_option("--seed", seed);
    app.add_option("--ctx", ctx, "context length (0 = the model's)");
    app.add_option("--threads", threads, "cpu threads (0 = all)");
    app.add_option("--backend", backend_name, "auto, cpu, vulkan or cuda")
        ->check(CLI::IsMember({"auto", "cpu", "vulkan", "cuda"}));
    app.add_flag("--no-bos", no_bos, "do not start with the BOS token");
    CLI11_PARSE(app, argc, argv);

    const std::map<std::string, specula_backend_kind> kinds = {{"auto", SPECULA_BACKEND_AUTO},
                                                               {"cpu", SPECULA_BACKEND_CPU},
                                                               {"vulkan", SPECULA_BACKEND_VULKAN},
                                                               {"cuda", SPECULA_BACKEND_CUDA}};
    specula_backend_params bp = specula_backend_default_params();
    bp.kind = kinds.at(backend_name);
    bp.n_threads = threads;
    specula_backend* backend = nullptr;
    specula_status s = specula_backend_create(&bp, &backend);
    if (s != SPECULA_OK) return fail("backend", s);
    specula_device_info dev{};
    (void)specula_backend_get_info(backend, &dev);

    specula_model* model = nullptr;
    if ((s = specula_model_load(backend, model_path.c_str(), nullptr, &model)) != SPECULA_OK) {
        specula_backend_free(backend);
        return fail("load", s);
    }
    specula_model_info info{};
    (void)specula_model_get_info(model, &info);
    std::fprintf(stderr, "model: %s, %d layers, %d dims, vocab %d, %.1fM params; backend: %s\n",
                 info.name, info.n_layer, info.n_embd, info.n_vocab, double(info.n_params) / 1e6,
                 dev.name);

    specula_session_params sp = specula_session_default_params();
    sp.n_ctx = ctx;
    sp.seed = seed;
    sp.temperature = temp;
    sp.top_k = top_k;
    sp.top_p = top_p;
    specula_session* session = nullptr;
    int rc = 0;
    std::vector<int32_t> tokens(prompt.size() + 2);
    size_t n_tokens = 0;
    specula_generate_params gp = specula_generate_default_params();
    gp.max_tokens = n_predict;
    gp.on_token = print_piece;
    specula_session_stats st{};
    if ((s = specula_session_create(model, &sp, &session)) != SPECULA_OK) {
        rc = fail("session", s);
    } else if ((s = specula_tokenize(model, prompt.data(), prompt.size(), !no_bos, tokens.data(),
                                     tokens.size(), &n_tokens)) != SPECULA_OK) {
        rc = fail("tokenize", s);
    } else if ((s = specula_session_eval(session, tokens.data(), n_tokens)) != SPECULA_OK) {
        rc = fail("prompt", s);
    } else {
        std::fputs(prompt.c_str(), stdout);
        s = specula_generate(session, &gp, nullptr, 0, nullptr);
        std::fputs("\n", stdout);
        std::fflush(stdout);
        if (s != SPECULA_OK) rc = fail("generate", s);
        (void)specula_session_get_stats(session, &st);
        std::fprintf(
            stderr, "prompt: %llu tokens, %.1f tokens/s; generated: %llu tokens, %.2f tokens/s\n",
            (unsigned long long)st.n_prompt_tokens, double(st.n_prompt_tokens) / st.prompt_seconds,
            (unsigned long long)st.n_generated, double(st.n_generated) / st.generate_seconds);
    }
    specula_session_free(session);
    specula_model_free(model);
    specula_backend_free(backend);
    return rc;
}
