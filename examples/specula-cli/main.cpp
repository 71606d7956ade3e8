// specula-cli: generate text with a GGUF model through the public C API.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "specula.h"

namespace {

int fail(const char* what, specula_status s) {
    std::fprintf(stderr, "specula-cli: %s: %s (%s)\n", what, specula_last_error(),
                 specula_status_name(s));
    return 1;
}

// With --compare the timed runs keep the text in memory (printed afterwards): a write to the
// terminal per token would be timed in one run and not in the other.
bool keep_piece(int32_t, const char* piece, size_t len, void* text) {
    static_cast<std::string*>(text)->append(piece, len);
    return true;
}

bool print_piece(int32_t, const char* piece, size_t len, void*) {
    std::fwrite(piece, 1, len, stdout);
    std::fflush(stdout);
    return true;
}

// A short untimed generation, so that one-time costs (a GPU backend compiles its
// pipelines on first use) fall outside the timed runs compared below.
void warm_up(specula_model* model, specula_session_params sp, const std::vector<int32_t>& prompt,
             size_t n_prompt) {
    specula_generate_params gp = specula_generate_default_params();
    gp.max_tokens = 32;
    specula_session* session = nullptr;
    if (specula_session_create(model, &sp, &session) == SPECULA_OK &&
        specula_session_eval(session, prompt.data(), n_prompt) == SPECULA_OK)
        (void)specula_generate(session, &gp, nullptr, 0, nullptr);
    specula_session_free(session);
}

// One timed generation in a fresh session; its text is kept in memory.
specula_status timed_generation(specula_model* model, const specula_session_params& sp,
                                const std::vector<int32_t>& prompt, size_t n_prompt,
                                specula_generate_params gp, specula_session_stats* st,
                                std::string* text) {
    text->clear();
    gp.on_token = keep_piece;
    gp.on_token_user_data = text;
    specula_session* session = nullptr;
    specula_status s = specula_session_create(model, &sp, &session);
    if (s == SPECULA_OK) s = specula_session_eval(session, prompt.data(), n_prompt);
    if (s == SPECULA_OK) s = specula_generate(session, &gp, nullptr, 0, nullptr);
    if (s == SPECULA_OK) s = specula_session_get_stats(session, st);
    specula_session_free(session);
    return s;
}

double tokens_per_second(const specula_session_stats& st) {
    return double(st.n_generated) / st.generate_seconds;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// The same generation without the draft, timed in this run: the speedup is measured, not
// assumed. The target alone and the pair alternate, kCompareRuns each (the pair's first is the
// run above), and the medians are compared: the machine's speed drifts between runs.
constexpr int kCompareRuns = 3;
// The texts are compared too: greedy, or sampled with the coupled acceptance, the pair's must
// be the target alone's.
int compare_with_target_alone(specula_model* model, const specula_session_params& sp,
                              const std::vector<int32_t>& prompt, size_t n_prompt,
                              const specula_generate_params& gp, const specula_session_stats& spec,
                              const std::string& pair_text) {
    specula_session_params alone_params = sp;
    alone_params.draft = nullptr;
    alone_params.lookup_ngram = 0;
    std::vector<double> alone, pair = {tokens_per_second(spec)};
    specula_session_stats st{};
    std::string alone_text, text;
    for (int run = 0; run < kCompareRuns; ++run) {
        specula_status s =
            timed_generation(model, alone_params, prompt, n_prompt, gp, &st, &alone_text);
        if (s != SPECULA_OK) return fail("target alone", s);
        alone.push_back(tokens_per_second(st));
        if (run + 1 == kCompareRuns) break;
        specula_session_stats again{};
        s = timed_generation(model, sp, prompt, n_prompt, gp, &again, &text);
        if (s != SPECULA_OK) return fail("speculative", s);
        pair.push_back(tokens_per_second(again));
    }
    const bool same = alone_text == pair_text;
    const bool must_be_same = !(sp.temperature >= SPECULA_MIN_TEMPERATURE) || sp.coupled_acceptance;
    // The run above was the pair's first session (created before the warm-ups); the later ones
    // start from what the last session of the pair measured.
    std::fprintf(stderr,
                 "target alone: %llu tokens, %.2f tokens/s; speculative %.2f tokens/s (medians of "
                 "%d runs each, alternating); speculative speedup %.2fx (measured in this run; "
                 "%.2fx in the pair's first session, which measures it); the same text as the "
                 "target alone: %s\n",
                 (unsigned long long)st.n_generated, median(alone), median(pair), kCompareRuns,
                 median(pair) / median(alone), pair.front() / median(alone), same ? "yes" : "no");
    if (must_be_same && !same) {
        std::fprintf(stderr, "specula-cli: the speculative text differs from the target alone's\n");
        return 1;
    }
    return 0;
}

}  // namespace

// -cnv: a conversation, one user turn per line of standard input. The session keeps its
// context between turns: each turn evaluates only the text the chat template adds after what
// the context already holds (the template's text up to the last reply, that reply as generated,
// and the token that ended it). A template that rewrites earlier turns (Qwen3 drops the
// reasoning of earlier replies, Mistral moves the system message) gets the whole conversation
// evaluated again: the context always holds exactly the text the template writes.
struct Reply {
    specula_model* model;
    std::string text;
    int32_t end = -1;  // the token that ended it, -1 when max_tokens did
};

bool chat_piece(int32_t token, const char* piece, size_t len, void* user) {
    auto* reply = static_cast<Reply*>(user);
    if (specula_token_ends_generation(reply->model, token)) {
        reply->end = token;
        return false;
    }
    reply->text.append(piece, len);
    std::fwrite(piece, 1, len, stdout);
    std::fflush(stdout);
    return true;
}

specula_status chat_text(specula_model* model, const char* tmpl,
                         const std::vector<std::pair<std::string, std::string>>& history,
                         std::string* text) {
    std::vector<specula_chat_message> messages;
    for (const auto& [role, content] : history)
        messages.push_back({role.c_str(), content.c_str()});
    size_t len = 0;
    specula_status s = specula_chat_apply_template(model, tmpl, messages.data(), messages.size(),
                                                   true, nullptr, 0, &len);
    if (s != SPECULA_ERR_BUFFER_TOO_SMALL) return s;
    text->resize(len);
    return specula_chat_apply_template(model, tmpl, messages.data(), messages.size(), true,
                                       text->data(), text->size(), &len);
}

int converse(specula_model* model, specula_session* session, specula_generate_params gp,
             const std::string& system, const char* tmpl) {
    std::vector<std::pair<std::string, std::string>> history;
    if (!system.empty()) history.emplace_back("system", system);
    std::string context, line, text;
    std::vector<int32_t> tokens;
    specula_status s = SPECULA_OK;
    int turns = 0, kept = 0;
    size_t evaluated = 0;
    for (;;) {
        std::fputs("\n> ", stdout);
        std::fflush(stdout);
        if (!std::getline(std::cin, line)) break;
        if (line.empty()) continue;
        history.emplace_back("user", line);
        if ((s = chat_text(model, tmpl, history, &text)) != SPECULA_OK)
            return fail("chat template", s);
        size_t from = context.size();
        ++turns;
        if (text.starts_with(context)) {
            kept += turns > 1;
        } else {
            if ((s = specula_session_reset(session)) != SPECULA_OK) return fail("reset", s);
            from = 0;
            context.clear();
        }
        const std::string feed = text.substr(from);
        size_t n = 0;
        tokens.resize(feed.size() + 1);
        if ((s = specula_tokenize(model, feed.data(), feed.size(), SPECULA_TOKENIZE_PARSE_SPECIAL,
                                  tokens.data(), tokens.size(), &n)) != SPECULA_OK)
            return fail("tokenize", s);
        if ((s = specula_session_eval(session, tokens.data(), n)) != SPECULA_OK)
            return fail("prompt", s);
        evaluated += n;
        context += feed;
        Reply reply{model, {}, -1};
        gp.stop_at_eos = false;  // chat_piece stops at the end of the reply, and records it
        gp.on_token = chat_piece;
        gp.on_token_user_data = &reply;
        if ((s = specula_generate(session, &gp, nullptr, 0, nullptr)) != SPECULA_OK)
            return fail("generate", s);
        context += reply.text;
        if (reply.end >= 0) {
            char end[64];
            size_t len = 0;
            if (specula_token_text(model, reply.end, end, sizeof end, &len) == SPECULA_OK)
                context.append(end, len);
            else
                context += '\x01';  // no template text matches: the next turn starts afresh
        }
        history.emplace_back("assistant", reply.text);
    }
    std::fputs("\n", stdout);
    specula_session_stats st{};
    (void)specula_session_get_stats(session, &st);
    std::fprintf(stderr,
                 "conversation: %d turns, the context kept in %d of them; %zu prompt tokens "
                 "evaluated, %u in the context\n",
                 turns, kept, evaluated, st.n_past);
    return 0;
}

int main(int argc, char** argv) {
    std::string model_path, draft_path, prompt = "Once upon a time", backend_name = "auto",
                                        policy = "auto";
    int n_predict = 64, threads = 0, top_k = 40, draft_max = 5;
    unsigned ctx = 0;
    float temp = 0.8f, top_p = 0.95f;
    uint64_t seed = 0x5eed;
    bool no_bos = false, compare = false, sigmoid = false, conversation = false, residual = false;
    std::string chat_template, system_prompt;
    float sigmoid_range = 1000.0f;
    CLI::App app{"specula: generate text with a GGUF model"};
    app.add_option("-m,--model", model_path, "model GGUF")->required();
    app.add_option("--model-draft", draft_path,
                   "draft model GGUF: speculative decoding (also -md)");
    app.add_option("--draft-max", draft_max,
                   "drafts per step: the fixed gamma, or the adaptive policies' bound")
        ->check(CLI::Range(1, SPECULA_MAX_GAMMA));
    app.add_option("--gamma-policy", policy,
                   "fixed, heuristic, analytic or auto (analytic, but heuristic when sampling with "
                   "--residual)")
        ->check(CLI::IsMember({"fixed", "heuristic", "analytic", "auto"}));
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
    app.add_flag(
        "--residual", residual,
        "Leviathan et al.'s acceptance test and residual resampling instead of the coupled "
        "acceptance: more drafts accepted, but the sampled text depends on the draft");
    app.add_flag("--sigmoid-verify", sigmoid,
                 "NOT exact: the sigmoid approximation in the acceptance test");
    app.add_option("--sigmoid-range", sigmoid_range, "sigmoid scale: alpha = -R, beta = R");
    app.add_flag("--compare", compare,
                 "with a draft: also generate with the target alone and print the speedup");
    int lookup = 0;
    app.add_option("--lookup", lookup,
                   "model-free drafts (prompt lookup): propose what followed earlier occurrences "
                   "of the last tokens, looking up suffixes of up to this many tokens (0 = off; "
                   "with or without -md)")
        ->check(CLI::Range(0, SPECULA_MAX_LOOKUP_NGRAM));
    app.add_flag("--conversation", conversation,
                 "chat: one user turn per line of standard input, formatted by the model's chat "
                 "template, the context kept between turns (also -cnv)");
    app.add_option("--chat-template", chat_template,
                   "a chat template (Jinja) or family name (llama3, chatml, gemma, "
                   "mistral-v3-tekken, phi3) instead of the model's");
    app.add_option("--system", system_prompt, "with -cnv: the system message");
    // llama.cpp's spellings "-md" and "-cnv" are not valid CLI11 short options: accept them by
    // translation.
    std::vector<std::string> args(argv + 1, argv + argc);
    for (auto& a : args) {
        if (a == "-md") a = "--model-draft";
        if (a == "-cnv") a = "--conversation";
    }
    std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector
    try {
        app.parse(args);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }

    specula_backend_params bp = specula_backend_default_params();
    specula_status s = specula_backend_kind_from_name(backend_name.c_str(), &bp.kind);
    if (s != SPECULA_OK) return fail("backend", s);
    bp.n_threads = threads;
    specula_backend* backend = nullptr;
    s = specula_backend_create(&bp, &backend);
    if (s != SPECULA_OK) return fail("backend", s);
    specula_device_info dev{};
    (void)specula_backend_get_info(backend, &dev);

    specula_model* model = nullptr;
    if ((s = specula_model_load(backend, model_path.c_str(), nullptr, &model)) != SPECULA_OK) {
        specula_backend_free(backend);
        return fail("load", s);
    }
    specula_model* draft = nullptr;
    if (!draft_path.empty() &&
        (s = specula_model_load(backend, draft_path.c_str(), nullptr, &draft)) != SPECULA_OK) {
        specula_model_free(model);
        specula_backend_free(backend);
        return fail("load draft", s);
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
    sp.draft = draft;
    sp.lookup_ngram = lookup;
    const bool speculative = draft != nullptr || lookup > 0;
    sp.sigmoid_verify = sigmoid;
    sp.coupled_acceptance = !residual && !sigmoid;
    sp.sigmoid_alpha = -sigmoid_range;
    sp.sigmoid_beta = sigmoid_range;
    s = specula_gamma_policy_from_name(policy.c_str(), &sp.gamma_policy);
    if (s != SPECULA_OK) return fail("--gamma-policy", s);
    sp.gamma_max = draft_max;
    sp.gamma = policy == "fixed" ? draft_max : std::min(5, draft_max);
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
    } else if (conversation) {
        rc = converse(model, session, gp, system_prompt,
                      chat_template.empty() ? nullptr : chat_template.c_str());
    } else if ((s = specula_tokenize(model, prompt.data(), prompt.size(), !no_bos, tokens.data(),
                                     tokens.size(), &n_tokens)) != SPECULA_OK) {
        rc = fail("tokenize", s);
    } else if ((s = specula_session_eval(session, tokens.data(), n_tokens)) != SPECULA_OK) {
        rc = fail("prompt", s);
    } else {
        if (compare && speculative) {
            warm_up(model, sp, tokens, n_tokens);
            specula_session_params alone = sp;
            alone.draft = nullptr;
            alone.lookup_ngram = 0;
            warm_up(model, alone, tokens, n_tokens);
        }
        std::fputs(prompt.c_str(), stdout);
        std::string text;
        if (compare && speculative) {
            gp.on_token = keep_piece;
            gp.on_token_user_data = &text;
        }
        s = specula_generate(session, &gp, nullptr, 0, nullptr);
        std::fputs(text.c_str(), stdout);
        std::fputs("\n", stdout);
        std::fflush(stdout);
        if (s != SPECULA_OK) rc = fail("generate", s);
        (void)specula_session_get_stats(session, &st);
        std::fprintf(
            stderr, "prompt: %llu tokens, %.1f tokens/s; generated: %llu tokens, %.2f tokens/s\n",
            (unsigned long long)st.n_prompt_tokens, double(st.n_prompt_tokens) / st.prompt_seconds,
            (unsigned long long)st.n_generated, double(st.n_generated) / st.generate_seconds);
        if (speculative) {
            std::fprintf(
                stderr,
                "speculative: %llu steps, acceptance rate %.3f (%llu of %llu judged drafts), "
                "%.2f tokens per "
                "target call, last gamma %d\n  acceptance by draft position:",
                (unsigned long long)st.n_steps, st.acceptance_rate,
                (unsigned long long)st.n_accepted, (unsigned long long)st.n_evaluated,
                st.tokens_per_step, st.last_gamma);
            for (int i = 0; i < SPECULA_MAX_GAMMA && st.evaluated_at[i] > 0; ++i)
                std::fprintf(stderr, " %.2f",
                             double(st.accepted_at[i]) / double(st.evaluated_at[i]));
            std::fprintf(stderr,
                         "\n  time: draft %.3f s, target %.3f s, verify %.3f s; host waits %llu\n",
                         st.draft_seconds, st.target_seconds, st.verify_seconds,
                         (unsigned long long)st.n_host_waits);
            if (lookup > 0)
                std::fprintf(stderr, "  lookup: %llu of %llu drafts accepted\n",
                             (unsigned long long)st.n_lookup_accepted,
                             (unsigned long long)st.n_lookup_drafted);
            if (compare && rc == 0)
                rc = compare_with_target_alone(model, sp, tokens, n_tokens, gp, st, text);
        }
    }
    specula_session_free(session);
    specula_model_free(draft);
    specula_model_free(model);
    specula_backend_free(backend);
    return rc;
}
