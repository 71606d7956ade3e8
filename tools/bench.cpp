// specula-bench: prompt-processing and decode throughput of a model on a
// backend, through the public C API (the path applications take).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "specula.h"

namespace {

struct Run {
    double prompt_tps = 0, decode_tps = 0;
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    std::string model_path, backend_name = "auto", json_path;
    int n_prompt = 128, n_decode = 64, reps = 3, threads = 0;
    CLI::App app{"specula-bench: prompt and decode tokens/s"};
    app.add_option("-m,--model", model_path)->required();
    app.add_option("--backend", backend_name)
        ->check(CLI::IsMember({"auto", "cpu", "vulkan", "cuda"}));
    app.add_option("-p,--n-prompt", n_prompt, "prompt tokens (one batched evaluation)");
    app.add_option("-n,--n-decode", n_decode, "generated tokens (greedy, one forward each)");
    app.add_option("-r,--reps", reps, "repetitions; the median is reported");
    app.add_option("--threads", threads);
    app.add_option("--json", json_path,
                   "also write the results as JSON to this file ('-' for stdout)");
    CLI11_PARSE(app, argc, argv);

    const std::map<std::string, specula_backend_kind> kinds = {{"auto", SPECULA_BACKEND_AUTO},
                                                               {"cpu", SPECULA_BACKEND_CPU},
                                                               {"vulkan", SPECULA_BACKEND_VULKAN},
                                                               {"cuda", SPECULA_BACKEND_CUDA}};
    specula_backend_params bp = specula_backend_default_params();
    bp.kind = kinds.at(backend_name);
    bp.n_threads = threads;
    specula_backend* backend = nullptr;
    specula_model* model = nullptr;
    auto die = [&](const char* what, specula_status s) {
        std::fprintf(stderr, "specula-bench: %s: %s (%s)\n", what, specula_last_error(),
                     specula_status_name(s));
        specula_model_free(model);
        specula_backend_free(backend);
        return 1;
    };
    specula_status s = specula_backend_create(&bp, &backend);
    if (s != SPECULA_OK) return die("backend", s);
    if ((s = specula_model_load(backend, model_path.c_str(), nullptr, &model)) != SPECULA_OK)
        return die("load", s);
    specula_model_info info{};
    specula_device_info dev{};
    (void)specula_model_get_info(model, &info);
    (void)specula_backend_get_info(backend, &dev);

    std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
    for (size_t i = 0; i < prompt.size(); ++i)
        prompt[i] = int32_t((i * 7919 + 13) % size_t(info.n_vocab));
    specula_session_params sp = specula_session_default_params();
    sp.temperature = 0.0f;
    sp.n_ctx = uint32_t(n_prompt + n_decode + 8);
    specula_generate_params gp = specula_generate_default_params();
    gp.max_tokens = n_decode;
    gp.stop_at_eos = false;

    std::vector<double> pp, tg;
    for (int r = 0; r < reps; ++r) {
        specula_session* session = nullptr;
        if ((s = specula_session_create(model, &sp, &session)) != SPECULA_OK)
            return die("session", s);
        specula_session_stats st{};
        if ((s = specula_session_eval(session, prompt.data(), prompt.size())) == SPECULA_OK &&
            (s = specula_generate(session, &gp, nullptr, 0, nullptr)) == SPECULA_OK)
            s = specula_session_get_stats(session, &st);
        specula_session_free(session);
        if (s != SPECULA_OK) return die("run", s);
        pp.push_back(double(st.n_prompt_tokens) / st.prompt_seconds);
        tg.push_back(double(st.n_generated) / st.generate_seconds);
    }
    const double pp_tps = median(pp), tg_tps = median(tg);
    const double gb_per_token = double(info.weight_bytes) / 1e9;

    std::printf("| model | params | weights | backend | test | tokens/s |\n");
    std::printf("|---|---|---|---|---|---|\n");
    const char* wt = info.weight_type == SPECULA_WEIGHT_Q8_0   ? "Q8_0"
                     : info.weight_type == SPECULA_WEIGHT_Q4_0 ? "Q4_0"
                     : info.weight_type == SPECULA_WEIGHT_F16  ? "F16"
                                                               : "F32";
    std::printf("| %s | %.1fM | %s %.0f MB | %s | pp%d | %.2f |\n", info.name,
                double(info.n_params) / 1e6, wt, double(info.weight_bytes) / 1e6, dev.name,
                n_prompt, pp_tps);
    std::printf("| %s | %.1fM | %s %.0f MB | %s | tg%d | %.2f |\n", info.name,
                double(info.n_params) / 1e6, wt, double(info.weight_bytes) / 1e6, dev.name,
                n_decode, tg_tps);
    std::printf("decode reads %.3f GB of weights per token: %.2f GB/s effective\n", gb_per_token,
                gb_per_token * tg_tps);

    if (!json_path.empty()) {
        nlohmann::json j = {{"model", info.name},
                            {"n_params", info.n_params},
                            {"weight_type", wt},
                            {"weight_bytes", info.weight_bytes},
                            {"backend", dev.name},
                            {"n_prompt", n_prompt},
                            {"n_decode", n_decode},
                            {"reps", reps},
                            {"prompt_tokens_per_s", pp_tps},
                            {"decode_tokens_per_s", tg_tps},
                            {"prompt_runs", pp},
                            {"decode_runs", tg}};
        if (json_path == "-") {
            std::printf("%s\n", j.dump(2).c_str());
        } else {
            std::ofstream(json_path) << j.dump(2) << "\n";
        }
    }
    specula_model_free(model);
    specula_backend_free(backend);
    return 0;
}
