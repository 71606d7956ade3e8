// specula-eval-pair: how good a target/draft pair is, through the public C API.
//   - held-out perplexity of each model (non-overlapping windows of --window tokens),
//   - the acceptance rate α of the pair over --prompts prompts cut from the
//     held-out text, tokens per target call, and the speedup of speculative
//     decoding over the target alone, both timed in this run; greedy, or sampled
//     with --temp (--top-k, --top-p, --seed), where the draft's distribution must
//     match the target's as the sampler shapes both.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "specula.h"

namespace {

struct Failure {
    std::string what;
};

void check(specula_status s, const char* what) {
    if (s != SPECULA_OK) throw Failure{std::string(what) + ": " + specula_last_error()};
}

std::vector<int32_t> tokenize(specula_model* m, const std::string& text) {
    size_t n = 0;
    std::vector<int32_t> ids(text.size() + 2);
    check(specula_tokenize(m, text.data(), text.size(), false, ids.data(), ids.size(), &n),
          "tokenize");
    ids.resize(n);
    return ids;
}

double perplexity(specula_model* m, const std::vector<int32_t>& ids, int window, int n_vocab) {
    specula_session_params sp = specula_session_default_params();
    sp.n_ctx = uint32_t(window);
    specula_session* s = nullptr;
    check(specula_session_create(m, &sp, &s), "session");
    std::vector<float> logits(static_cast<size_t>(n_vocab));
    double nll = 0;
    size_t count = 0;
    for (size_t w = 0; w + size_t(window) + 1 <= ids.size(); w += size_t(window)) {
        check(specula_session_reset(s), "reset");
        for (int i = 0; i < window; ++i) {
            check(specula_session_eval(s, &ids[w + size_t(i)], 1), "eval");
            check(specula_session_get_logits(s, logits.data(), logits.size()), "logits");
            double max = logits[0], sum = 0;
            for (float z : logits)
                max = std::max(max, double(z));
            for (float z : logits)
                sum += std::exp(double(z) - max);
            nll += max + std::log(sum) - double(logits[size_t(ids[w + size_t(i) + 1])]);
            ++count;
        }
    }
    specula_session_free(s);
    return std::exp(nll / double(count));
}

struct Generation {
    specula_session_stats stats{};
    std::vector<int32_t> tokens;
};

struct Sampler {
    float temperature = 0.0f;
    int32_t top_k = 0;
    float top_p = 1.0f;
    uint64_t seed = 1;
    bool coupled = true;  // specula_session_params::coupled_acceptance
};

Generation generate(specula_model* target, specula_model* draft, const std::vector<int32_t>& prompt,
                    int n, int gamma, const std::string& policy, const Sampler& sampler) {
    specula_session_params sp = specula_session_default_params();
    sp.temperature = sampler.temperature;
    sp.top_k = sampler.top_k;
    sp.top_p = sampler.top_p;
    sp.seed = sampler.seed;
    sp.coupled_acceptance = sampler.coupled;
    sp.n_ctx = uint32_t(prompt.size() + size_t(n) + 32);
    sp.draft = draft;
    sp.gamma = gamma;
    sp.gamma_max = std::max(gamma, 8);
    check(specula_gamma_policy_from_name(policy.c_str(), &sp.gamma_policy), "--gamma-policy");
    specula_session* s = nullptr;
    check(specula_session_create(target, &sp, &s), "session");
    Generation g;
    g.tokens.resize(size_t(n));
    size_t got = 0;
    specula_generate_params gp = specula_generate_default_params();
    gp.max_tokens = n;
    gp.stop_at_eos = false;
    specula_status st = specula_session_eval(s, prompt.data(), prompt.size());
    if (st == SPECULA_OK) st = specula_generate(s, &gp, g.tokens.data(), g.tokens.size(), &got);
    if (st == SPECULA_OK) st = specula_session_get_stats(s, &g.stats);
    specula_session_free(s);
    check(st, "generate");
    g.tokens.resize(got);
    return g;
}

}  // namespace

int main(int argc, char** argv) {
    std::string target_path, draft_path, text_path, backend_name = "cpu", json_path,
                                                    policy = "fixed";
    int n_prompts = 50, prompt_tokens = 32, n_generate = 32, window = 128, ppl_tokens = 16384,
        gamma = 4;
    Sampler sampler;
    CLI::App app{"specula-eval-pair: perplexity and speculative acceptance of a target/draft pair"};
    app.add_option("-m,--model", target_path)->required();
    app.add_option("--model-draft", draft_path)->required();
    app.add_option("-f,--text", text_path, "held-out text")->required();
    app.add_option("--backend", backend_name)
        ->check(CLI::IsMember({"auto", "cpu", "vulkan", "cuda"}));
    app.add_option("--prompts", n_prompts);
    app.add_option("--prompt-tokens", prompt_tokens);
    app.add_option("-n,--n-generate", n_generate);
    app.add_option("--gamma", gamma);
    app.add_option("--gamma-policy", policy)
        ->check(CLI::IsMember({"fixed", "heuristic", "analytic", "auto"}));
    app.add_option("--temp", sampler.temperature, "sampling temperature (0 = greedy)");
    app.add_option("--top-k", sampler.top_k, "top-k when sampling (0 = off)");
    app.add_option("--top-p", sampler.top_p, "top-p when sampling (1 = off)");
    app.add_option("--seed", sampler.seed, "seed of the sampled runs (prompt i uses seed + i)");
    bool residual = false;
    app.add_flag("--residual", residual,
                 "Leviathan et al.'s acceptance test instead of the coupled acceptance");
    app.add_option("--window", window, "perplexity window (tokens)");
    app.add_option("--ppl-tokens", ppl_tokens, "held-out tokens scored for perplexity");
    app.add_option("--json", json_path);
    CLI11_PARSE(app, argc, argv);
    sampler.coupled = !residual;

    specula_backend* backend = nullptr;
    specula_model *target = nullptr, *draft = nullptr;
    int rc = 0;
    try {
        specula_backend_params bp = specula_backend_default_params();
        check(specula_backend_kind_from_name(backend_name.c_str(), &bp.kind), "backend");
        check(specula_backend_create(&bp, &backend), "backend");
        check(specula_model_load(backend, target_path.c_str(), nullptr, &target), "load target");
        check(specula_model_load(backend, draft_path.c_str(), nullptr, &draft), "load draft");
        specula_model_info info{};
        specula_device_info dev{};
        check(specula_model_get_info(target, &info), "info");
        check(specula_backend_get_info(backend, &dev), "device");
        std::ifstream f(text_path);
        std::stringstream ss;
        ss << f.rdbuf();
        const std::vector<int32_t> ids = tokenize(target, ss.str());
        if (ids.size() < size_t(n_prompts) * size_t(prompt_tokens + 1))
            throw Failure{"the held-out text is too short"};

        const std::vector<int32_t> scored(
            ids.begin(),
            ids.begin() + std::min<std::ptrdiff_t>(ppl_tokens + 1, std::ptrdiff_t(ids.size())));
        const double ppl_target = perplexity(target, scored, window, info.n_vocab);
        const double ppl_draft = perplexity(draft, scored, window, info.n_vocab);

        const bool greedy = sampler.temperature < SPECULA_MIN_TEMPERATURE;
        uint64_t drafted = 0, evaluated = 0, accepted = 0, steps = 0, generated = 0, mismatches = 0;
        double t_alone = 0, t_spec = 0;
        for (int p = 0; p < n_prompts; ++p) {
            const size_t at = ids.size() / size_t(n_prompts) * size_t(p);
            const std::vector<int32_t> prompt(ids.begin() + std::ptrdiff_t(at),
                                              ids.begin() + std::ptrdiff_t(at) + prompt_tokens);
            Sampler s = sampler;
            s.seed += uint64_t(p);
            const Generation alone =
                generate(target, nullptr, prompt, n_generate, gamma, policy, s);
            const Generation spec = generate(target, draft, prompt, n_generate, gamma, policy, s);
            // Greedy outputs, and sampled ones with the coupled acceptance, are the target
            // alone's; Leviathan et al.'s test only keeps the distribution.
            const bool same = greedy || sampler.coupled;
            mismatches += same && alone.tokens != spec.tokens;
            t_alone += alone.stats.generate_seconds;
            t_spec += spec.stats.generate_seconds;
            drafted += spec.stats.n_drafted;
            evaluated += spec.stats.n_evaluated;
            accepted += spec.stats.n_accepted;
            steps += spec.stats.n_steps;
            generated += spec.stats.n_generated;
        }
        const double alpha = evaluated ? double(accepted) / double(evaluated) : 0.0;
        std::printf("pair: %s + draft on %s\n", info.name, dev.name);
        std::printf("held-out perplexity (%zu tokens, windows of %d): target %.2f, draft %.2f\n",
                    scored.size() - 1, window, ppl_target, ppl_draft);
        if (greedy)
            std::printf("greedy speculative decoding, %d prompts x %d tokens, %s gamma %d:\n",
                        n_prompts, n_generate, policy.c_str(), gamma);
        else
            std::printf(
                "sampled speculative decoding (T %.2f, top-k %d, top-p %.2f, %s acceptance), %d "
                "prompts x %d tokens, %s gamma %d:\n",
                double(sampler.temperature), sampler.top_k, double(sampler.top_p),
                sampler.coupled ? "coupled" : "residual", n_prompts, n_generate, policy.c_str(),
                gamma);
        std::printf(
            "  acceptance rate alpha %.3f (%llu of %llu judged drafts; %llu drafted in all), %.2f "
            "tokens per target call\n",
            alpha, (unsigned long long)accepted, (unsigned long long)evaluated,
            (unsigned long long)drafted, double(generated) / double(steps));
        std::printf(
            "  speedup over the target alone (same run): %.3fx (%.2f vs %.2f tokens/s); outputs "
            "differing from the target alone's where they must not: %llu\n",
            t_alone / t_spec, double(generated) / t_spec, double(generated) / t_alone,
            (unsigned long long)mismatches);
        if (!json_path.empty()) {
            nlohmann::json j = {{"target", info.name},
                                {"backend", dev.name},
                                {"perplexity_target", ppl_target},
                                {"perplexity_draft", ppl_draft},
                                {"ppl_tokens", scored.size() - 1},
                                {"window", window},
                                {"prompts", n_prompts},
                                {"n_generate", n_generate},
                                {"gamma", gamma},
                                {"policy", policy},
                                {"temperature", sampler.temperature},
                                {"top_k", sampler.top_k},
                                {"top_p", sampler.top_p},
                                {"acceptance", sampler.coupled ? "coupled" : "residual"},
                                {"alpha", alpha},
                                {"accepted", accepted},
                                {"judged", evaluated},
                                {"drafted", drafted},
                                {"tokens_per_target_call", double(generated) / double(steps)},
                                {"speedup", t_alone / t_spec},
                                {"outputs_differing", mismatches}};
            std::ofstream(json_path) << j.dump(2) << "\n";
        }
        rc = mismatches == 0 ? 0 : 1;  // where the output must equal the target alone's
    } catch (const Failure& e) {
        std::fprintf(stderr, "specula-eval-pair: %s\n", e.what.c_str());
        rc = 1;
    }
    specula_model_free(draft);
    specula_model_free(target);
    specula_backend_free(backend);
    return rc;
}
