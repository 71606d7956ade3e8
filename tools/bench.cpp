// specula-bench: prompt-processing and decode throughput through the public C
// API (the path applications take), and the cost of a verification forward of
// n = 1, 4, 8, 16 positions (what a speculative step asks of the target).
// Several backends given together are measured in one run, side by side.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/factory.h"
#include "decode/generator.h"
#include "models/llama.h"
#include "specula.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Options {
    std::string model, draft;
    std::string policy = "fixed";
    int gamma = 4;
    float temperature = 0.0f, top_p = 1.0f;
    int top_k = 0;
    uint64_t seed = 1;
    std::string prompt_text;  // the decode runs start from it (tokenized) instead of one token
    int n_prompt = 128, n_decode = 64, depth = 0, reps = 3, threads = 0, context = 256;
    std::vector<int> verify_sizes = {1, 4, 8, 16};
    int draws = 0;  // rows of the model's own logits to time the draw over
    bool residual = false;
    int lookup = 0;  // model-free drafts (session lookup_ngram)
    bool speculative() const { return !draft.empty() || lookup > 0; }
};

struct Speculative {
    double decode_tps = 0, alpha = 0, tokens_per_step = 0, mean_gamma = 0, cost_ratio = 0;
    // The pair's first session (untimed, after the warm-up): a new session starts from what
    // the last one measured, so the timed ones do not pay for measuring the pair again, as a
    // process that runs one session does.
    double first_session_tps = 0;
};

struct Result {
    std::string backend;
    double prompt_tps = 0, decode_tps = 0;
    Speculative spec;
    std::map<int, double> verify_ms;  // n -> median ms of one forward of n positions
    double copy_gbps = 0;             // device-to-device copy, bytes read + written per second
    std::string error;
};

const char* weight_name(specula_weight_type t) {
    return specula::ggml_type_name(specula::GgmlType(t));  // the enum is GGUF's numbering
}

// Prompt and decode tokens/s through the C API.
bool run_api(const Options& o, specula_backend_kind kind, Result* r, specula_model_info* info) {
    specula_backend_params bp = specula_backend_default_params();
    bp.kind = kind;
    bp.n_threads = o.threads;
    specula_backend* backend = nullptr;
    specula_model* model = nullptr;
    specula_status s = specula_backend_create(&bp, &backend);
    if (s == SPECULA_OK) s = specula_model_load(backend, o.model.c_str(), nullptr, &model);
    if (s == SPECULA_OK) s = specula_model_get_info(model, info);
    specula_device_info dev{};
    if (s == SPECULA_OK) s = specula_backend_get_info(backend, &dev);
    r->backend = dev.name;
    std::vector<int32_t> prompt(static_cast<size_t>(std::max(o.n_prompt, 1 + o.depth)));
    for (size_t i = 0; i < prompt.size() && s == SPECULA_OK; ++i)
        prompt[i] = int32_t((i * 7919 + 13) % size_t(info->n_vocab));
    specula_session_params sp = specula_session_default_params();
    sp.temperature = 0.0f;
    sp.n_ctx = uint32_t(std::max(o.n_prompt, 1 + o.depth + o.n_decode) + 8);
    specula_generate_params gp = specula_generate_default_params();
    gp.max_tokens = o.n_decode;
    gp.stop_at_eos = false;
    sp.temperature = o.temperature;
    sp.top_k = o.top_k;
    sp.top_p = o.top_p;
    sp.seed = o.seed;
    // The decode runs' context: one token (and --depth more), as llama-bench's tg N, or a text.
    std::vector<int32_t> start(prompt.begin(), prompt.begin() + 1 + o.depth);
    if (s == SPECULA_OK && !o.prompt_text.empty()) {
        start.resize(o.prompt_text.size() + 2);
        size_t n = 0;
        s = specula_tokenize(model, o.prompt_text.data(), o.prompt_text.size(), true, start.data(),
                             start.size(), &n);
        start.resize(n);
        sp.n_ctx = std::max(sp.n_ctx, uint32_t(n + size_t(o.n_decode) + 8));
    }
    specula_model* draft = nullptr;
    if (s == SPECULA_OK && !o.draft.empty())
        s = specula_model_load(backend, o.draft.c_str(), nullptr, &draft);
    std::vector<double> pp, tg, spec_tg, alpha, per_step, gamma, cost;
    double first_tg = 0;
    const std::vector<bool> variants =
        o.speculative() ? std::vector<bool>{false, true} : std::vector<bool>{false};
    // Repetition -1 is an untimed warm-up, as llama-bench does: the first prompt of a freshly
    // loaded model pages its mapped weights in (and a GPU backend builds its pipelines).
    for (int rep = -1; rep < o.reps && s == SPECULA_OK; ++rep) {
        // The target alone, then (with a draft) speculative decoding, alternating so that
        // both see the same machine conditions.
        for (const bool speculative : variants) {
            specula_session_params p = sp;
            p.draft = speculative ? draft : nullptr;
            p.lookup_ngram = speculative ? o.lookup : 0;
            specula_gamma_policy_from_name(o.policy.c_str(), &p.gamma_policy);  // checked
            p.coupled_acceptance = !o.residual;
            p.gamma = o.gamma;
            p.gamma_max = std::max(o.gamma, 8);
            // As llama-bench's tests: pp N evaluates the prompt in a fresh session, tg N
            // generates N tokens in another one that holds a single token (and --depth more).
            specula_session* session = nullptr;
            specula_session_stats prompt_stats{}, st{};
            if (!speculative) {
                s = specula_session_create(model, &p, &session);
                if (s == SPECULA_OK)
                    s = specula_session_eval(session, prompt.data(), size_t(o.n_prompt));
                if (s == SPECULA_OK) s = specula_session_get_stats(session, &prompt_stats);
                specula_session_free(session);
                session = nullptr;
            }
            // The pair's first session is created before the warm-up's pair session, which
            // then stores what it measured: it starts afresh but runs after the one-time costs.
            specula_session* first = nullptr;
            if (rep < 0 && speculative && s == SPECULA_OK)
                s = specula_session_create(model, &p, &first);
            const auto generate_in = [&](specula_session* in, specula_session_stats* out) {
                specula_status g = specula_session_eval(in, start.data(), start.size());
                if (g == SPECULA_OK) g = specula_generate(in, &gp, nullptr, 0, nullptr);
                if (g == SPECULA_OK) g = specula_session_get_stats(in, out);
                return g;
            };
            if (s == SPECULA_OK) s = specula_session_create(model, &p, &session);
            if (s == SPECULA_OK) s = generate_in(session, &st);
            specula_session_free(session);
            if (first != nullptr && s == SPECULA_OK) {
                specula_session_stats first_st{};
                s = generate_in(first, &first_st);
                first_tg = double(first_st.n_generated) / first_st.generate_seconds;
            }
            specula_session_free(first);
            if (s != SPECULA_OK) break;
            if (rep < 0) continue;
            if (!speculative) {
                pp.push_back(double(prompt_stats.n_prompt_tokens) / prompt_stats.prompt_seconds);
                tg.push_back(double(st.n_generated) / st.generate_seconds);
            } else {
                spec_tg.push_back(double(st.n_generated) / st.generate_seconds);
                alpha.push_back(st.acceptance_rate);
                per_step.push_back(st.tokens_per_step);
                gamma.push_back(double(st.n_drafted) / double(st.n_steps));
                // c: one draft forward over one target forward, both measured in this run.
                cost.push_back(st.n_drafted > 0 ? (st.draft_seconds / double(st.n_drafted)) /
                                                      (st.target_seconds / double(st.n_steps))
                                                : 0.0);
            }
        }
    }
    r->spec = {median(spec_tg), median(alpha), median(per_step),
               median(gamma),   median(cost),  first_tg};
    specula_model_free(draft);
    if (s != SPECULA_OK)
        r->error = std::string(specula_status_name(s)) + ": " + specula_last_error();
    r->prompt_tps = median(pp);
    r->decode_tps = median(tg);
    specula_model_free(model);
    specula_backend_free(backend);
    return s == SPECULA_OK;
}

// The memory-bandwidth ceiling the decode figures are compared with: the backend's own copy
// op over 512 MiB, far more than any cache, bytes read plus bytes written per second of device
// time (Backend::mark_time), median of five. Eight buffers of 64 MiB each way, a size every
// device's storage-buffer range allows.
specula::Status measure_copy_bandwidth(specula::Backend& backend, double* gbps) {
    using namespace specula;
    constexpr int64_t kCols = 1 << 20, kRows = 16, kPieces = 8;
    std::vector<std::unique_ptr<Buffer>> buffers(2 * kPieces);
    Status s = Status::Ok();
    for (auto& b : buffers)
        if (s.ok()) s = backend.allocate(size_t(kCols * kRows) * sizeof(float), &b);
    if (!s.ok()) return s;
    const auto copy_all = [&] {
        for (int64_t i = 0; i < kPieces; ++i)
            backend.copy({buffers[size_t(2 * i)].get(), 0, GgmlType::kF32, kCols, kRows},
                         {buffers[size_t(2 * i + 1)].get(), 0, GgmlType::kF32, kCols, kRows});
    };
    copy_all();  // warm-up: first touch, pipeline creation
    s = backend.flush();
    std::vector<double> rates;
    for (int rep = 0; s.ok() && rep < 5; ++rep) {
        backend.mark_time(0);
        copy_all();
        backend.mark_time(1);
        s = backend.flush();
        const double bytes = 2.0 * double(kPieces * kCols * kRows) * sizeof(float);
        rates.push_back(bytes / backend.seconds_between(0, 1) / 1e9);
    }
    *gbps = median(rates);
    return s;
}

// The copy bandwidth, then the verification forward: n positions with all n logits rows, after
// a context of `context` tokens, rolled back after each repetition.
bool run_device(const Options& o, specula_backend_kind kind, Result* r) {
    using namespace specula;
    specula_backend_params bp = specula_backend_default_params();
    bp.kind = kind;
    bp.n_threads = o.threads;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<MappedFile> file;
    std::unique_ptr<LlamaModel> model;
    std::unique_ptr<LlamaContext> ctx;
    Status s = create_backend(bp, &backend);
    if (s.ok()) s = measure_copy_bandwidth(*backend, &r->copy_gbps);
    if (s.ok() && o.verify_sizes.empty()) return true;
    if (s.ok()) s = MappedFile::open(o.model, &file);
    if (s.ok()) s = LlamaModel::load(*backend, std::move(file), nullptr, &model);
    if (s.ok()) s = LlamaContext::create(*model, o.context + 32, 16, &ctx);
    std::vector<int32_t> tokens(static_cast<size_t>(o.context));
    for (size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = int32_t((i * 104729 + 7) % size_t(model ? model->config().n_vocab : 1));
    std::vector<float> logits;
    for (size_t i = 0; s.ok() && i < tokens.size(); i += 16)
        s = ctx->forward(std::span(tokens).subspan(i, std::min<size_t>(16, tokens.size() - i)),
                         false, &logits);
    // A verification forward as a speculative step records it: the ids already on the device,
    // every row's logits left there for the verify passes (none downloaded), one wait.
    for (int n : o.verify_sizes) {
        std::vector<double> ms;
        if (s.ok()) backend->upload(ctx->input_ids(0, n), tokens.data());
        for (int rep = 0; s.ok() && rep < std::max(o.reps, 3); ++rep) {
            const auto t0 = Clock::now();
            s = ctx->record(ctx->input_ids(0, n), true);
            if (s.ok()) s = backend->flush();
            ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
            ctx->truncate(o.context);
        }
        r->verify_ms[n] = median(ms);
    }
    if (!s.ok()) r->error = s.message();
    return s.ok();
}

// The cost of a draw (temperature, top-k, top-p of the options) on the host, as the cpu
// backend draws: over rows of logits the model itself produced, decoding its own samples from
// the prompt text (or one token), since a row's shape (how its likely tokens lie) decides
// what top-k and top-p cost. Median microseconds per row of row_norm alone and of a whole draw.
bool time_draws(const Options& o, double* norm_us, double* draw_us) {
    specula_backend_params bp = specula_backend_default_params();
    bp.kind = SPECULA_BACKEND_CPU;
    bp.n_threads = o.threads;
    specula_backend* backend = nullptr;
    specula_model* model = nullptr;
    specula_session* session = nullptr;
    specula_model_info info{};
    specula_session_params sp = specula_session_default_params();
    sp.n_ctx = uint32_t(o.draws + 64 + int(o.prompt_text.size()));
    specula_status s = specula_backend_create(&bp, &backend);
    if (s == SPECULA_OK) s = specula_model_load(backend, o.model.c_str(), nullptr, &model);
    if (s == SPECULA_OK) s = specula_model_get_info(model, &info);
    if (s == SPECULA_OK) s = specula_session_create(model, &sp, &session);
    std::vector<int32_t> start(o.prompt_text.size() + 2, 0);
    size_t n = 1;
    if (s == SPECULA_OK && !o.prompt_text.empty())
        s = specula_tokenize(model, o.prompt_text.data(), o.prompt_text.size(), true, start.data(),
                             start.size(), &n);
    if (s == SPECULA_OK) s = specula_session_eval(session, start.data(), n);
    specula::SamplingParams p;
    p.temperature = o.temperature;
    p.top_k = o.top_k;
    p.top_p = o.top_p;
    p.seed = o.seed;
    const auto V = size_t(info.n_vocab);
    std::vector<float> rows(size_t(o.draws) * V);
    for (int i = 0; i < o.draws && s == SPECULA_OK; ++i) {
        const std::span<float> row(rows.data() + size_t(i) * V, V);
        s = specula_session_get_logits(session, row.data(), V);
        const int32_t token = specula::sample_token(row, p, uint32_t(i));
        if (s == SPECULA_OK) s = specula_session_eval(session, &token, 1);
    }
    if (s != SPECULA_OK) std::fprintf(stderr, "specula-bench: draws: %s\n", specula_last_error());
    specula_session_free(session);
    specula_model_free(model);
    specula_backend_free(backend);
    if (s != SPECULA_OK) return false;
    std::vector<double> norm, draw;
    uint64_t sink = 0;  // keeps the results alive
    for (int rep = 0; rep < std::max(o.reps, 1); ++rep) {
        auto t0 = Clock::now();
        for (int i = 0; i < o.draws; ++i)
            sink += specula::row_norm({rows.data() + size_t(i) * V, V}, p).ids.size();
        auto t1 = Clock::now();
        for (int i = 0; i < o.draws; ++i)
            sink += uint64_t(specula::sample_token({rows.data() + size_t(i) * V, V}, p,
                                                   uint32_t(rep * o.draws + i)));
        auto t2 = Clock::now();
        norm.push_back(std::chrono::duration<double>(t1 - t0).count() * 1e6 / o.draws);
        draw.push_back(std::chrono::duration<double>(t2 - t1).count() * 1e6 / o.draws);
    }
    const volatile uint64_t keep = sink;
    (void)keep;
    *norm_us = median(norm);
    *draw_us = median(draw);
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    std::string backends = "auto", json_path;
    CLI::App app{"specula-bench: prompt, decode and verification-batch throughput"};
    app.add_option("-m,--model", o.model)->required();
    app.add_option("--model-draft", o.draft,
                   "draft model: also measure speculative decoding against the target alone");
    app.add_option("--lookup", o.lookup,
                   "model-free drafts (prompt lookup) of suffixes up to this long: also measure "
                   "speculative decoding with them against the target alone (with or without "
                   "--model-draft)");
    app.add_option("--gamma", o.gamma, "drafts per step (fixed) or the adaptive policies' start")
        ->check(CLI::Range(1, SPECULA_MAX_GAMMA));
    app.add_flag("--residual", o.residual,
                 "Leviathan et al.'s acceptance test instead of the coupled acceptance");
    app.add_option("--gamma-policy", o.policy)
        ->check(CLI::IsMember({"fixed", "heuristic", "analytic", "auto"}));
    app.add_option("--temp", o.temperature, "sampling temperature of the decode runs (0 = greedy)");
    app.add_option("--top-k", o.top_k, "top-k of the decode runs (0 = off)");
    app.add_option("--top-p", o.top_p, "top-p of the decode runs (1 = off)");
    app.add_option("--seed", o.seed, "sampling seed of the decode runs");
    app.add_option("--prompt-text", o.prompt_text,
                   "the decode runs continue this text (tokenized) instead of a single token");
    app.add_option("--backend", backends,
                   "one or more of auto, cpu, vulkan, cuda, comma-separated (measured in one run)");
    app.add_option("-p,--n-prompt", o.n_prompt, "prompt tokens (one batched evaluation)");
    app.add_option("-d,--depth", o.depth, "tokens in the context before the decode runs begin");
    app.add_option("-n,--n-decode", o.n_decode, "generated tokens (greedy, one forward each)");
    app.add_option("-r,--reps", o.reps, "repetitions; the median is reported");
    app.add_option("-c,--context", o.context, "context length before each verification forward");
    app.add_option("--verify", o.verify_sizes,
                   "verification batch sizes (0 to skip): forwards of n positions whose logits "
                   "stay on the device, as a speculative step's target forward")
        ->delimiter(',');
    app.add_option("--threads", o.threads, "cpu threads (0 = all cores), as llama-bench's -t");
    app.add_option("--draws", o.draws,
                   "also time a draw (--temp, --top-k, --top-p) on the host over this many rows "
                   "of logits the model produced decoding its own samples");
    app.add_option("--json", json_path,
                   "also write the results as JSON to this file ('-' for stdout)");
    CLI11_PARSE(app, argc, argv);
    if (o.draws > 0 && !(o.temperature > 0)) {
        std::fprintf(stderr, "specula-bench: --draws times a sampled draw: give --temp > 0\n");
        return 2;
    }
    o.verify_sizes.erase(std::remove_if(o.verify_sizes.begin(), o.verify_sizes.end(),
                                        [](int n) { return n <= 0 || n > 16; }),
                         o.verify_sizes.end());

    std::vector<Result> results;
    specula_model_info info{};
    std::stringstream names(backends);
    for (std::string name; std::getline(names, name, ',');) {
        specula_backend_kind kind{};
        if (specula_backend_kind_from_name(name.c_str(), &kind) != SPECULA_OK) {
            std::fprintf(stderr, "specula-bench: %s\n", specula_last_error());
            return 2;
        }
        Result r;
        if (run_api(o, kind, &r, &info)) run_device(o, kind, &r);
        if (!r.error.empty())
            std::fprintf(stderr, "specula-bench: %s: %s\n", name.c_str(), r.error.c_str());
        results.push_back(r);
    }

    std::printf("model: %s, %.1fM params, %s, %.0f MB of weights\n\n", info.name,
                double(info.n_params) / 1e6, weight_name(info.weight_type),
                double(info.weight_bytes) / 1e6);
    // The bound is the fastest copy any backend of this run measured: the memory's bandwidth,
    // not how well one backend's copy op reaches it.
    double best_copy_gbps = 0;
    for (const Result& r : results)
        best_copy_gbps = std::max(best_copy_gbps, r.copy_gbps);
    std::printf(
        "| backend | pp%d tok/s | tg%d tok/s | weight GB/s at decode | copy GB/s | "
        "of the bandwidth bound |",
        o.n_prompt, o.n_decode);
    for (int n : o.verify_sizes)
        std::printf(" verify n=%d ms (x n=1) |", n);
    std::printf("\n|---|---|---|---|---|---|");
    for (size_t i = 0; i < o.verify_sizes.size(); ++i)
        std::printf("---|");
    std::printf("\n");
    for (const Result& r : results) {
        const double weight_gbps = double(info.weight_bytes) / 1e9 * r.decode_tps;
        std::printf("| %s | %.2f | %.2f | %.2f | %.1f | %.1f%% |", r.backend.c_str(), r.prompt_tps,
                    r.decode_tps, weight_gbps, r.copy_gbps,
                    best_copy_gbps > 0 ? 100.0 * weight_gbps / best_copy_gbps : 0.0);
        for (int n : o.verify_sizes) {
            const double base = r.verify_ms.count(1) ? r.verify_ms.at(1) : 0.0;
            const double v = r.verify_ms.count(n) ? r.verify_ms.at(n) : 0.0;
            std::printf(" %.2f (%.2fx) |", v, base > 0 ? v / base : 0.0);
        }
        std::printf("\n");
    }
    if (results.size() > 1 && results[0].decode_tps > 0) {
        std::printf("\nratios to %s, measured in this run:", results[0].backend.c_str());
        for (size_t i = 1; i < results.size(); ++i)
            std::printf(" %s decode %.3fx, prompt %.3fx;", results[i].backend.c_str(),
                        results[i].decode_tps / results[0].decode_tps,
                        results[i].prompt_tps / results[0].prompt_tps);
        std::printf("\n");
    }

    if (o.speculative()) {
        const std::string source = !o.draft.empty() && o.lookup > 0 ? "the draft and the lookup"
                                   : o.lookup > 0
                                       ? "the lookup (" + std::to_string(o.lookup) + "-grams)"
                                       : "the draft";
        std::printf(
            "\nspeculative decoding (%s%s gamma %d, temperature %.2f, top-k %d, top-p %.2f), "
            "target alone vs with %s, alternating in this run:\n",
            o.policy.c_str(), o.residual ? " residual" : " coupled", o.gamma, double(o.temperature),
            o.top_k, double(o.top_p), source.c_str());
        std::printf(
            "| backend | target tok/s | speculative tok/s | measured speedup | alpha | "
            "tokens/target call | mean gamma | c | Thm 3.8 speedup | first session |\n");
        std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
        for (const Result& r : results) {
            const double predicted =
                specula::expected_speedup(r.spec.alpha, r.spec.cost_ratio, r.spec.mean_gamma);
            const auto ratio = [&](double tps) {
                return r.decode_tps > 0 ? tps / r.decode_tps : 0;
            };
            std::printf(
                "| %s | %.2f | %.2f | %.3fx | %.3f | %.2f | %.2f | %.3f | %.3fx | %.3fx |\n",
                r.backend.c_str(), r.decode_tps, r.spec.decode_tps, ratio(r.spec.decode_tps),
                r.spec.alpha, r.spec.tokens_per_step, r.spec.mean_gamma, r.spec.cost_ratio,
                predicted, ratio(r.spec.first_session_tps));
        }
    }

    if (o.draws > 0) {
        double norm_us = 0, draw_us = 0;
        if (!time_draws(o, &norm_us, &draw_us)) return 1;
        std::printf(
            "\ndraws over %d rows of the model's own logits (temperature %.2f, top-k %d, top-p "
            "%.2f; host, as the cpu backend draws): row norm %.2f us, whole draw %.2f us a row\n",
            o.draws, double(o.temperature), o.top_k, double(o.top_p), norm_us, draw_us);
    }

    if (!json_path.empty()) {
        nlohmann::json j = {{"model", info.name},
                            {"n_params", info.n_params},
                            {"weight_type", weight_name(info.weight_type)},
                            {"weight_bytes", info.weight_bytes},
                            {"n_prompt", o.n_prompt},
                            {"depth", o.depth},
                            {"n_decode", o.n_decode},
                            {"reps", o.reps},
                            {"context", o.context},
                            {"results", nlohmann::json::array()}};
        for (const Result& r : results) {
            nlohmann::json v = nlohmann::json::object();
            for (const auto& [n, ms] : r.verify_ms)
                v[std::to_string(n)] = ms;
            j["results"].push_back({{"backend", r.backend},
                                    {"prompt_tokens_per_s", r.prompt_tps},
                                    {"decode_tokens_per_s", r.decode_tps},
                                    {"verify_ms", v},
                                    {"copy_gb_per_s", r.copy_gbps},
                                    {"error", r.error}});
        }
        if (json_path == "-") {
            std::printf("%s\n", j.dump(2).c_str());
        } else {
            std::ofstream(json_path) << j.dump(2) << "\n";
        }
    }
    for (const Result& r : results)
        if (!r.error.empty()) return 1;
    return 0;
}
