// The C ABI: errors as status values, callbacks, determinism, bad files.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "backend_util.h"  // with validation on, any error the layer reports fails the run
#include "specula.h"
#include "test_util.h"
#if defined(SPECULA_HAVE_VULKAN)
#include "format/gguf.h"
#include "platform/vulkan_loader.h"
#endif

namespace {

std::string model_path() {
    static const std::string path = [] {
        specula::RandomLlamaSpec spec = specula::test::small_spec(specula::GgmlType::kQ8_0, 1);
        spec.n_ctx = 128;
        return specula::test::make_model("api", spec);
    }();
    return path;
}

std::string write_bytes(const std::string& name, const std::vector<char>& bytes) {
    const std::string path = (specula::test::temp_dir() / name).string();
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    return path;
}

std::vector<char> read_bytes(const std::string& path) {
    return specula::test::read_file_bytes(path);
}

class Api : public ::testing::Test {
  protected:
    void SetUp() override {
        specula_backend_params bp = specula_backend_default_params();
        bp.kind = SPECULA_BACKEND_CPU;
        ASSERT_EQ(specula_backend_create(&bp, &backend), SPECULA_OK);
        ASSERT_EQ(specula_model_load(backend, model_path().c_str(), nullptr, &model), SPECULA_OK)
            << specula_last_error();
    }
    void TearDown() override {
        specula_model_free(model);
        specula_backend_free(backend);
    }

    std::vector<int32_t> tokenize(const std::string& text) {
        std::vector<int32_t> ids(text.size() + 2);
        size_t n = 0;
        EXPECT_EQ(
            specula_tokenize(model, text.data(), text.size(), true, ids.data(), ids.size(), &n),
            SPECULA_OK);
        ids.resize(n);
        return ids;
    }

    std::vector<int32_t> generate(const specula_session_params& sp, const std::string& prompt,
                                  int n) {
        return generate(model, sp, prompt, n);
    }
    std::vector<int32_t> generate(specula_model* m, const specula_session_params& sp,
                                  const std::string& prompt, int n,
                                  specula_session_stats* stats = nullptr) {
        specula_session* s = nullptr;
        EXPECT_EQ(specula_session_create(m, &sp, &s), SPECULA_OK);
        const auto ids = tokenize(prompt);
        EXPECT_EQ(specula_session_eval(s, ids.data(), ids.size()), SPECULA_OK);
        specula_generate_params gp = specula_generate_default_params();
        gp.max_tokens = n;
        gp.stop_at_eos = false;
        std::vector<int32_t> out(static_cast<size_t>(n));
        size_t got = 0;
        EXPECT_EQ(specula_generate(s, &gp, out.data(), out.size(), &got), SPECULA_OK);
        out.resize(got);
        if (stats != nullptr) {
            EXPECT_EQ(specula_session_get_stats(s, stats), SPECULA_OK);
        }
        specula_session_free(s);
        return out;
    }

    specula_backend* backend = nullptr;
    specula_model* model = nullptr;
};

TEST_F(Api, NullArgumentsAreErrorsWithMessages) {
    EXPECT_EQ(specula_backend_create(nullptr, nullptr), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_STRNE(specula_last_error(), "");
    specula_model* m = nullptr;
    EXPECT_EQ(specula_model_load(nullptr, "x", nullptr, &m), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(specula_model_load(backend, nullptr, nullptr, &m), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(specula_session_eval(nullptr, nullptr, 0), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(specula_generate(nullptr, nullptr, nullptr, 0, nullptr),
              SPECULA_ERR_INVALID_ARGUMENT);
    specula_model_free(nullptr);
    specula_session_free(nullptr);
    specula_backend_free(nullptr);
}

TEST_F(Api, BackendNamesRoundTrip) {
    for (auto kind : {SPECULA_BACKEND_CPU, SPECULA_BACKEND_VULKAN, SPECULA_BACKEND_CUDA,
                      SPECULA_BACKEND_AUTO}) {
        specula_backend_kind back{};
        ASSERT_EQ(specula_backend_kind_from_name(specula_backend_kind_name(kind), &back),
                  SPECULA_OK);
        EXPECT_EQ(back, kind);
    }
    specula_backend_kind k{};
    EXPECT_EQ(specula_backend_kind_from_name("metal", &k), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(specula_last_error()).find("metal"), std::string::npos);
}

TEST_F(Api, GammaPolicyNames) {
    for (auto [name, policy] : {std::pair{"fixed", SPECULA_GAMMA_FIXED},
                                {"heuristic", SPECULA_GAMMA_HEURISTIC},
                                {"analytic", SPECULA_GAMMA_ANALYTIC},
                                {"auto", SPECULA_GAMMA_AUTO}}) {
        specula_gamma_policy back =
            SPECULA_GAMMA_FIXED == policy ? SPECULA_GAMMA_ANALYTIC : SPECULA_GAMMA_FIXED;
        ASSERT_EQ(specula_gamma_policy_from_name(name, &back), SPECULA_OK);
        EXPECT_EQ(back, policy) << name;
    }
    specula_gamma_policy p{};
    EXPECT_EQ(specula_gamma_policy_from_name("greedy", &p), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(specula_last_error()).find("greedy"), std::string::npos);
    EXPECT_EQ(specula_gamma_policy_from_name(nullptr, &p), SPECULA_ERR_INVALID_ARGUMENT);
}

TEST_F(Api, AutoBackendNeverTakesASoftwareDevice) {
    specula_backend_params p = specula_backend_default_params();
    p.kind = SPECULA_BACKEND_AUTO;
    specula_backend* b = nullptr;
    ASSERT_EQ(specula_backend_create(&p, &b), SPECULA_OK);
    specula_device_info d{};
    ASSERT_EQ(specula_backend_get_info(b, &d), SPECULA_OK);
    EXPECT_FALSE(d.is_software) << d.name;  // llvmpipe is slower than the cpu backend
    specula_backend_free(b);
}

TEST_F(Api, DevicesAndInfo) {
    size_t n = 0;
    ASSERT_EQ(specula_device_count(&n), SPECULA_OK);
    ASSERT_GE(n, 1u);
    specula_device_info d{};
    ASSERT_EQ(specula_device_get(0, &d), SPECULA_OK);
    EXPECT_EQ(d.kind, SPECULA_BACKEND_CPU);
    EXPECT_EQ(specula_device_get(n, &d), SPECULA_ERR_INVALID_ARGUMENT);
    specula_model_info info{};
    ASSERT_EQ(specula_model_get_info(model, &info), SPECULA_OK);
    EXPECT_STREQ(info.architecture, "llama");
    EXPECT_STREQ(info.tokenizer, "llama");
    EXPECT_EQ(info.n_vocab, 32000);
    EXPECT_EQ(info.n_layer, 2);
    EXPECT_EQ(info.n_head_kv, 2);
    EXPECT_EQ(info.weight_type, SPECULA_WEIGHT_Q8_0);
    EXPECT_EQ(info.bos_token, 1);
}

TEST_F(Api, TokenizeReportsTheNeededSize) {
    const std::string text = "Hello world, how are you?";
    size_t n = 0;
    EXPECT_EQ(specula_tokenize(model, text.data(), text.size(), true, nullptr, 0, &n),
              SPECULA_ERR_BUFFER_TOO_SMALL);
    EXPECT_GT(n, 3u);
    std::vector<int32_t> ids(n);
    ASSERT_EQ(specula_tokenize(model, text.data(), text.size(), true, ids.data(), ids.size(), &n),
              SPECULA_OK);
    std::vector<char> buf(64);
    size_t len = 0;
    ASSERT_EQ(specula_detokenize(model, ids.data(), n, buf.data(), buf.size(), &len), SPECULA_OK);
    EXPECT_EQ(std::string(buf.data(), len), text);
    EXPECT_EQ(specula_detokenize(model, ids.data(), n, buf.data(), 3, &len),
              SPECULA_ERR_BUFFER_TOO_SMALL);
    EXPECT_EQ(len, text.size());
    const int32_t bad = -5;
    EXPECT_EQ(specula_detokenize(model, &bad, 1, buf.data(), buf.size(), &len),
              SPECULA_ERR_INVALID_ARGUMENT);
}

TEST_F(Api, TokenizeParsesSpecialTokensWhenAsked) {
    const std::string text = "</s>Hi";
    std::vector<int32_t> ids(16);
    size_t n = 0;
    specula_model_info info{};
    ASSERT_EQ(specula_model_get_info(model, &info), SPECULA_OK);
    ASSERT_EQ(specula_tokenize(model, text.data(), text.size(), SPECULA_TOKENIZE_PARSE_SPECIAL,
                               ids.data(), ids.size(), &n),
              SPECULA_OK);
    ASSERT_GE(n, 2u);
    EXPECT_EQ(ids[0], info.eos_token);
    ASSERT_EQ(specula_tokenize(model, text.data(), text.size(), 0, ids.data(), ids.size(), &n),
              SPECULA_OK);
    EXPECT_EQ(std::count(ids.begin(), ids.begin() + std::ptrdiff_t(n), info.eos_token), 0);
    ASSERT_EQ(specula_tokenize(model, text.data(), text.size(),
                               SPECULA_TOKENIZE_ADD_BOS | SPECULA_TOKENIZE_PARSE_SPECIAL,
                               ids.data(), ids.size(), &n),
              SPECULA_OK);
    EXPECT_EQ(ids[0], info.bos_token);
    EXPECT_EQ(ids[1], info.eos_token);
    EXPECT_EQ(specula_tokenize(model, text.data(), text.size(), 4, ids.data(), ids.size(), &n),
              SPECULA_ERR_INVALID_ARGUMENT);
    // A control token's text is its own, though detokenizing leaves it out.
    char piece[16];
    size_t len = 0;
    ASSERT_EQ(specula_token_text(model, info.eos_token, piece, sizeof piece, &len), SPECULA_OK);
    EXPECT_EQ(std::string(piece, len), "</s>");
    ASSERT_EQ(specula_detokenize(model, &info.eos_token, 1, piece, sizeof piece, &len), SPECULA_OK);
    EXPECT_EQ(len, 0u);
    EXPECT_EQ(specula_token_text(model, -1, piece, sizeof piece, &len),
              SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(specula_token_ends_generation(model, info.eos_token));
    EXPECT_FALSE(specula_token_ends_generation(model, info.bos_token));
    EXPECT_FALSE(specula_token_ends_generation(nullptr, info.eos_token));
}

// The families' texts are checked against the real Jinja templates by the chat_oracle tests;
// this checks the C boundary.
TEST_F(Api, ChatTemplatesFormatConversations) {
    const specula_chat_message chat[] = {{"system", "Be brief."}, {"user", "Hi"}};
    size_t len = 0;
    // The demo model's file has no tokenizer.chat_template.
    EXPECT_EQ(specula_chat_apply_template(model, nullptr, chat, 2, true, nullptr, 0, &len),
              SPECULA_ERR_UNSUPPORTED);
    EXPECT_EQ(specula_chat_apply_template(model, "{{ messages }}", chat, 2, true, nullptr, 0, &len),
              SPECULA_ERR_UNSUPPORTED);
    ASSERT_EQ(specula_chat_apply_template(model, "chatml", chat, 2, true, nullptr, 0, &len),
              SPECULA_ERR_BUFFER_TOO_SMALL);
    std::string text(len, '\0');
    ASSERT_EQ(
        specula_chat_apply_template(model, "chatml", chat, 2, true, text.data(), text.size(), &len),
        SPECULA_OK);
    EXPECT_EQ(text,
              "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\n");
    // Templates that write the BOS write the model's.
    std::vector<char> buf(256);
    ASSERT_EQ(
        specula_chat_apply_template(model, "gemma", chat, 2, false, buf.data(), buf.size(), &len),
        SPECULA_OK);
    EXPECT_EQ(std::string(buf.data(), len),
              "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n");
    const specula_chat_message twice[] = {{"user", "a"}, {"user", "b"}};
    EXPECT_EQ(
        specula_chat_apply_template(model, "gemma", twice, 2, true, buf.data(), buf.size(), &len),
        SPECULA_ERR_INVALID_ARGUMENT);
    const specula_chat_message broken[] = {{"user", nullptr}};
    EXPECT_EQ(
        specula_chat_apply_template(model, "chatml", broken, 1, true, buf.data(), buf.size(), &len),
        SPECULA_ERR_INVALID_ARGUMENT);
}

TEST_F(Api, GreedyAndSeededGenerationAreDeterministic) {
    specula_session_params sp = specula_session_default_params();
    sp.temperature = 0.0f;
    EXPECT_EQ(generate(sp, "Once upon a time", 12), generate(sp, "Once upon a time", 12));
    sp.temperature = 1.0f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.seed = 7;
    const auto a = generate(sp, "Once upon a time", 12);
    EXPECT_EQ(a, generate(sp, "Once upon a time", 12));
    sp.seed = 8;
    EXPECT_NE(a, generate(sp, "Once upon a time", 12));
}

// A server's slot changes the sampling per request: what follows is what a new session with
// those settings generates (with a draft too), and values out of range leave it as it was.
TEST_F(Api, SetSamplingGeneratesWhatANewSessionWould) {
    specula_session_params sp = specula_session_default_params();
    sp.temperature = 0.0f;
    sp.draft = model;  // a draft that is the target: every path of the pair runs
    specula_session* s = nullptr;
    ASSERT_EQ(specula_session_create(model, &sp, &s), SPECULA_OK);
    const auto run = [&](const std::string& prompt) {
        const auto ids = tokenize(prompt);
        EXPECT_EQ(specula_session_eval(s, ids.data(), ids.size()), SPECULA_OK);
        specula_generate_params gp = specula_generate_default_params();
        gp.max_tokens = 12;
        gp.stop_at_eos = false;
        std::vector<int32_t> out(12);
        size_t got = 0;
        EXPECT_EQ(specula_generate(s, &gp, out.data(), out.size(), &got), SPECULA_OK);
        out.resize(got);
        return out;
    };
    const auto greedy = generate(sp, "Once upon a time", 12);
    EXPECT_EQ(run("Once upon a time"), greedy);
    for (uint64_t seed : {7u, 8u}) {
        specula_session_params sampled = sp;
        sampled.temperature = 1.0f;
        sampled.top_k = 20;
        sampled.top_p = 0.9f;
        sampled.seed = seed;
        ASSERT_EQ(specula_session_set_sampling(s, 1.0f, 20, 0.9f, seed), SPECULA_OK);
        EXPECT_EQ(run("Once upon a time"), generate(sampled, "Once upon a time", 12));
    }
    EXPECT_EQ(specula_session_set_sampling(s, 1.0f, 20, 1.5f, 1), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(specula_session_set_sampling(s, -1.0f, 0, 1.0f, 1), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(specula_session_set_sampling(nullptr, 0.0f, 0, 1.0f, 1),
              SPECULA_ERR_INVALID_ARGUMENT);
    ASSERT_EQ(specula_session_set_sampling(s, 0.0f, 0, 1.0f, 0), SPECULA_OK);
    EXPECT_EQ(run("Once upon a time"), greedy);
    specula_session_free(s);
}

// A new session of a pair starts from what the last one measured: with a draft that costs
// about ten times its target (another random model, four times as wide and deep), which no
// acceptance rate pays for, it does not draft where the first session did, in its third step.
// Fails if sessions start afresh.
TEST_F(Api, ANewSessionOfAPairStartsFromWhatTheLastOneMeasured) {
    specula::RandomLlamaSpec spec = specula::test::small_spec(specula::GgmlType::kQ8_0, 2);
    spec.n_ctx = 128;
    spec.n_embd *= 4;
    spec.n_ff *= 8;
    spec.n_layer *= 4;
    specula_model* draft = nullptr;
    ASSERT_EQ(specula_model_load(backend, specula::test::make_model("api-other", spec).c_str(),
                                 nullptr, &draft),
              SPECULA_OK);
    specula_session_params sp = specula_session_default_params();
    sp.temperature = 0.0f;
    sp.draft = draft;
    sp.gamma_policy = SPECULA_GAMMA_AUTO;
    std::vector<uint64_t> drafted;
    for (int session = 0; session < 2; ++session) {
        specula_session_stats st{};
        generate(model, sp, "Once upon a time", 12, &st);
        drafted.push_back(st.n_drafted);
    }
    EXPECT_GE(drafted[0], 2u);  // its measuring step of two drafts
    EXPECT_EQ(drafted[1], 0u);
    specula_model_free(draft);
}

// specula.h: a model may be shared by several sessions. Four threads, each with its own
// sessions on one model and backend (plain and speculative, greedy and sampled), get the
// tokens a single thread gets.
TEST_F(Api, SessionsOnOneModelFromFourThreads) {
    specula_model* draft = nullptr;
    ASSERT_EQ(specula_model_load(backend, model_path().c_str(), nullptr, &draft), SPECULA_OK);
    std::vector<specula_session_params> cases;
    for (specula_model* d : {static_cast<specula_model*>(nullptr), draft}) {
        for (float temperature : {0.0f, 0.9f}) {
            specula_session_params sp = specula_session_default_params();
            sp.temperature = temperature;
            sp.seed = 11;
            sp.draft = d;
            sp.gamma_policy = SPECULA_GAMMA_FIXED;  // γ from timings would change sampled tokens
            sp.gamma = 3;
            cases.push_back(sp);
        }
    }
    std::vector<std::vector<int32_t>> expected;
    for (const auto& sp : cases)
        expected.push_back(generate(sp, "Once upon a time", 16));
    std::vector<std::vector<std::vector<int32_t>>> got(4);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < got.size(); ++t) {
        threads.emplace_back([&, t] {
            for (size_t run = 0; run < 5; ++run)
                got[t].push_back(generate(cases[(t + run) % cases.size()], "Once upon a time", 16));
        });
    }
    for (auto& thread : threads)
        thread.join();
    for (size_t t = 0; t < got.size(); ++t)
        for (size_t run = 0; run < got[t].size(); ++run)
            EXPECT_EQ(got[t][run], expected[(t + run) % cases.size()])
                << "thread " << t << ", run " << run;
    specula_model_free(draft);
}

TEST_F(Api, GenerateContinuesWhereItStopped) {
    specula_session_params sp = specula_session_default_params();
    sp.temperature = 0.0f;
    const auto whole = generate(sp, "The", 10);
    specula_session* s = nullptr;
    ASSERT_EQ(specula_session_create(model, &sp, &s), SPECULA_OK);
    const auto ids = tokenize("The");
    ASSERT_EQ(specula_session_eval(s, ids.data(), ids.size()), SPECULA_OK);
    specula_generate_params gp = specula_generate_default_params();
    gp.stop_at_eos = false;
    gp.max_tokens = 4;
    std::vector<int32_t> parts(10);
    size_t n1 = 0, n2 = 0;
    ASSERT_EQ(specula_generate(s, &gp, parts.data(), 4, &n1), SPECULA_OK);
    gp.max_tokens = 6;
    ASSERT_EQ(specula_generate(s, &gp, parts.data() + 4, 6, &n2), SPECULA_OK);
    EXPECT_EQ(parts, whole);
    specula_session_stats st{};
    ASSERT_EQ(specula_session_get_stats(s, &st), SPECULA_OK);
    EXPECT_EQ(st.n_generated, 10u);
    EXPECT_EQ(st.n_past, ids.size() + 9);  // the last token is sampled but not yet evaluated
    EXPECT_EQ(st.n_host_waits, st.n_forward_calls);

    ASSERT_EQ(specula_session_reset(s), SPECULA_OK);
    ASSERT_EQ(specula_session_eval(s, ids.data(), ids.size()), SPECULA_OK);
    gp.max_tokens = 10;
    ASSERT_EQ(specula_generate(s, &gp, parts.data(), 10, &n1), SPECULA_OK);
    EXPECT_EQ(parts, whole);

    // A buffer smaller than max_tokens receives the first tokens; the count is of them all.
    ASSERT_EQ(specula_session_reset(s), SPECULA_OK);
    ASSERT_EQ(specula_session_eval(s, ids.data(), ids.size()), SPECULA_OK);
    std::vector<int32_t> few(4, -1);
    ASSERT_EQ(specula_generate(s, &gp, few.data(), 3, &n1), SPECULA_OK);
    EXPECT_EQ(n1, 10u);
    EXPECT_EQ(few, (std::vector<int32_t>{whole[0], whole[1], whole[2], -1}));
    specula_session_free(s);
}

TEST_F(Api, CallbacksStreamStopAndAbort) {
    specula_session_params sp = specula_session_default_params();
    specula_session* s = nullptr;
    ASSERT_EQ(specula_session_create(model, &sp, &s), SPECULA_OK);
    specula_generate_params gp = specula_generate_default_params();
    EXPECT_EQ(specula_generate(s, &gp, nullptr, 0, nullptr),
              SPECULA_ERR_INVALID_ARGUMENT);  // no prompt yet
    const auto ids = tokenize("Hi");
    ASSERT_EQ(specula_session_eval(s, ids.data(), ids.size()), SPECULA_OK);

    struct Seen {
        int count = 0;
        std::string text;
    } seen;
    gp.stop_at_eos = false;
    gp.max_tokens = 20;
    gp.on_token = [](int32_t, const char* piece, size_t len, void* user) {
        auto* s = static_cast<Seen*>(user);
        s->text.append(piece, len);
        return ++s->count < 5;
    };
    gp.on_token_user_data = &seen;
    size_t n = 0;
    ASSERT_EQ(specula_generate(s, &gp, nullptr, 0, &n), SPECULA_OK);
    EXPECT_EQ(seen.count, 5);
    EXPECT_EQ(n, 5u);

    int polls = 0;
    gp.on_token = nullptr;
    gp.should_abort = [](void* user) { return ++*static_cast<int*>(user) > 3; };
    gp.should_abort_user_data = &polls;
    EXPECT_EQ(specula_generate(s, &gp, nullptr, 0, &n), SPECULA_ERR_ABORTED);
    EXPECT_EQ(n, 3u);
    specula_session_free(s);
}

TEST_F(Api, ContextFullIsReported) {
    specula_session_params sp = specula_session_default_params();
    sp.n_ctx = 8;
    specula_session* s = nullptr;
    ASSERT_EQ(specula_session_create(model, &sp, &s), SPECULA_OK);
    const auto ids = tokenize("Hi");
    ASSERT_EQ(specula_session_eval(s, ids.data(), ids.size()), SPECULA_OK);
    specula_generate_params gp = specula_generate_default_params();
    gp.stop_at_eos = false;
    gp.max_tokens = 50;
    size_t n = 0;
    EXPECT_EQ(specula_generate(s, &gp, nullptr, 0, &n), SPECULA_ERR_CONTEXT_FULL);
    EXPECT_EQ(n, 8 - ids.size() + 1);
    specula_session_free(s);
}

// A context larger than the backend can hold is refused before anything is allocated (with
// overcommit, allocating it layer by layer got the process killed); one beyond the training
// context (128 here) works with a warning; the model serves sessions afterwards.
TEST_F(Api, HugeContextsAreOutOfMemoryAndLongOnesAreWarned) {
    std::vector<std::string> warnings;
    specula_set_log_callback(
        [](specula_log_level level, const char* m, void* user) {
            if (level >= SPECULA_LOG_WARN)
                static_cast<std::vector<std::string>*>(user)->push_back(m);
        },
        &warnings);
    specula_session_params sp = specula_session_default_params();
    specula_session* s = nullptr;
    for (uint32_t n_ctx : {1u << 30, 0xFFFFFFFFu}) {
        sp.n_ctx = n_ctx;
        EXPECT_EQ(specula_session_create(model, &sp, &s), SPECULA_ERR_OUT_OF_MEMORY) << n_ctx;
        EXPECT_EQ(s, nullptr);
        EXPECT_NE(std::string(specula_last_error()).find("MiB"), std::string::npos);
    }
    EXPECT_TRUE(warnings.empty());
    sp.n_ctx = 512;
    ASSERT_EQ(specula_session_create(model, &sp, &s), SPECULA_OK);
    specula_set_log_callback(nullptr, nullptr);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find("training context of 128"), std::string::npos) << warnings[0];
    const auto ids = tokenize("Hi");
    EXPECT_EQ(specula_session_eval(s, ids.data(), ids.size()), SPECULA_OK);
    specula_session_free(s);
}

// What a session holds is reported so an app can tell whether a pair fits: the difference
// between two context lengths is exactly their KV caches and rotation tables.
TEST_F(Api, SessionMemoryIsReported) {
    uint64_t available = 0;
    ASSERT_EQ(specula_backend_available_memory(backend, &available), SPECULA_OK);
    EXPECT_GT(available, 0u);  // Linux's MemAvailable
    specula_model_info info{};
    ASSERT_EQ(specula_model_get_info(model, &info), SPECULA_OK);
    uint64_t bytes[2][2] = {};
    for (int i = 0; i < 2; ++i) {
        specula_session_params sp = specula_session_default_params();
        sp.n_ctx = 64u << i;
        if (i == 1) sp.draft = model;  // the model drafting for itself
        specula_session* s = nullptr;
        ASSERT_EQ(specula_session_create(model, &sp, &s), SPECULA_OK);
        ASSERT_EQ(specula_session_memory(s, &bytes[i][0], &bytes[i][1]), SPECULA_OK);
        EXPECT_EQ(specula_session_memory(s, nullptr, &bytes[i][1]), SPECULA_ERR_INVALID_ARGUMENT);
        specula_session_free(s);
    }
    const uint64_t head_dim = uint64_t(info.n_embd / info.n_head);
    const uint64_t kv_dim = head_dim * uint64_t(info.n_head_kv);
    const uint64_t per_position = (2 * uint64_t(info.n_layer) * kv_dim + head_dim) * sizeof(float);
    EXPECT_EQ(bytes[1][0] - bytes[0][0], 64 * per_position);
    EXPECT_EQ(bytes[0][1], 0u);           // no draft
    EXPECT_EQ(bytes[1][1], bytes[1][0]);  // the same model and context as the target
    EXPECT_EQ(specula_backend_available_memory(nullptr, &available), SPECULA_ERR_INVALID_ARGUMENT);
}

TEST_F(Api, BadFilesFailCleanlyAndLeaveLoadedModelsWorking) {
    const auto good = read_bytes(model_path());
    specula_model* m = nullptr;
    EXPECT_EQ(specula_model_load(backend, "/nonexistent/model.gguf", nullptr, &m), SPECULA_ERR_IO);
    EXPECT_EQ(m, nullptr);

    auto bytes = good;
    bytes[0] = 'X';
    EXPECT_EQ(specula_model_load(backend, write_bytes("magic.gguf", bytes).c_str(), nullptr, &m),
              SPECULA_ERR_FORMAT);
    EXPECT_NE(std::string(specula_last_error()).find("magic"), std::string::npos);

    for (size_t cut : {size_t(10), good.size() / 3, good.size() - 100}) {
        bytes.assign(good.begin(), good.begin() + std::ptrdiff_t(cut));
        EXPECT_EQ(specula_model_load(backend, write_bytes("cut.gguf", bytes).c_str(), nullptr, &m),
                  SPECULA_ERR_FORMAT)
            << cut;
    }
    EXPECT_EQ(specula_model_load(backend, write_bytes("empty.gguf", {}).c_str(), nullptr, &m),
              SPECULA_ERR_FORMAT);
    EXPECT_EQ(specula_model_load(backend, specula::test::temp_dir().c_str(), nullptr, &m),
              SPECULA_ERR_IO);

    // A vocabulary-only file is valid GGUF but not a model.
    EXPECT_EQ(specula_model_load(backend, specula::test::data_path("ggml-vocab-gpt-2.gguf").c_str(),
                                 nullptr, &m),
              SPECULA_ERR_UNSUPPORTED);

    specula_session_params sp = specula_session_default_params();
    sp.temperature = 0.0f;
    EXPECT_EQ(generate(sp, "still works", 4).size(), 4u);
}

// Rope scaling as llama.cpp reads it (a linear factor, Llama 3's rope_freqs factors) loads and
// generates; scaling it does not run (YaRN) and factors it cannot use are named, not ignored.
TEST_F(Api, RopeScalingLoadsOrIsRefusedByName) {
    auto spec = specula::test::small_spec(specula::GgmlType::kQ8_0, 5);
    spec.llama3_rope = true;
    spec.rope_scale = 2.0f;
    const auto good = read_bytes(specula::test::make_model("rope-scaling", spec));
    specula_model* m = nullptr;
    ASSERT_EQ(specula_model_load(backend, write_bytes("rope.gguf", good).c_str(), nullptr, &m),
              SPECULA_OK)
        << specula_last_error();
    specula_model_free(m);
    m = nullptr;

    auto bytes = good;
    const std::string linear = "linear";
    auto at = std::search(bytes.begin(), bytes.end(), linear.begin(), linear.end());
    ASSERT_NE(at, bytes.end());
    std::copy_n("yarn_x", 6, at);
    EXPECT_EQ(specula_model_load(backend, write_bytes("yarn.gguf", bytes).c_str(), nullptr, &m),
              SPECULA_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(specula_last_error()).find("rope scaling 'yarn_x'"), std::string::npos)
        << specula_last_error();

    // A factor of zero in rope_freqs.weight.
    specula::GgufFile gguf;
    const std::span<const uint8_t> view(reinterpret_cast<const uint8_t*>(good.data()), good.size());
    ASSERT_TRUE(specula::GgufFile::parse(view, &gguf).ok());
    const specula::GgufTensorInfo* freqs = gguf.find_tensor("rope_freqs.weight");
    ASSERT_NE(freqs, nullptr);
    bytes = good;
    std::fill_n(bytes.begin() + (freqs->data.data() - view.data()), 4, 0);
    EXPECT_EQ(specula_model_load(backend, write_bytes("freqs.gguf", bytes).c_str(), nullptr, &m),
              SPECULA_ERR_FORMAT);
    EXPECT_NE(std::string(specula_last_error()).find("rope_freqs.weight"), std::string::npos)
        << specula_last_error();
    EXPECT_EQ(m, nullptr);
}

TEST_F(Api, ProgressIsReportedAndCanCancel) {
    struct Progress {
        int calls = 0;
        float last = 0;
        bool cancel = false;
    } p;
    specula_model_params mp = specula_model_default_params();
    mp.progress = [](float f, void* user) {
        auto* p = static_cast<Progress*>(user);
        EXPECT_GE(f, p->last);
        p->last = f;
        ++p->calls;
        return !p->cancel;
    };
    mp.progress_user_data = &p;
    specula_model* m = nullptr;
    ASSERT_EQ(specula_model_load(backend, model_path().c_str(), &mp, &m), SPECULA_OK);
    EXPECT_GT(p.calls, 10);
    EXPECT_FLOAT_EQ(p.last, 1.0f);
    specula_model_free(m);
    p = Progress{0, 0, true};
    EXPECT_EQ(specula_model_load(backend, model_path().c_str(), &mp, &m), SPECULA_ERR_ABORTED);
    EXPECT_EQ(m, nullptr);
}

// Probes of the C API that used to hang, read misaligned data, lose the last progress step or
// run into undefined behaviour that only a sanitizer build reports.
TEST_F(Api, MisuseGetsAStatusNeverUndefinedBehaviour) {
    // C enums holding values outside their enumerators are checked as integers.
    specula_backend_params bp = specula_backend_default_params();
    specula_backend* b = nullptr;
    for (int kind : {1000, -1, 3, 99}) {
        std::memcpy(&bp.kind, &kind, sizeof kind);
        EXPECT_EQ(specula_backend_create(&bp, &b), SPECULA_ERR_INVALID_ARGUMENT) << kind;
        EXPECT_EQ(b, nullptr);
    }
    specula_session_params sp = specula_session_default_params();
    specula_session* s = nullptr;
    for (int policy : {7, -1}) {
        std::memcpy(&sp.gamma_policy, &policy, sizeof policy);
        EXPECT_EQ(specula_session_create(model, &sp, &s), SPECULA_ERR_INVALID_ARGUMENT) << policy;
    }
    // Two acceptance tests at once: refused, not one silently chosen.
    sp = specula_session_default_params();
    sp.sigmoid_verify = true;
    EXPECT_EQ(specula_session_create(model, &sp, &s), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(specula_last_error()).find("coupled"), std::string::npos);
    sp.coupled_acceptance = false;
    ASSERT_EQ(specula_session_create(model, &sp, &s), SPECULA_OK);
    specula_session_free(s);
    // Empty texts into a NULL buffer: nothing to copy.
    size_t length = 99;
    EXPECT_EQ(specula_detokenize(model, nullptr, 0, nullptr, 0, &length), SPECULA_OK);
    EXPECT_EQ(length, 0u);
    const int32_t bos = tokenize("")[0];
    EXPECT_EQ(specula_detokenize(model, &bos, 1, nullptr, 0, &length), SPECULA_OK);
    EXPECT_EQ(length, 0u);
    // A thread per requested thread would be 100000 threads: the machine's count at most.
    bp = specula_backend_default_params();
    bp.kind = SPECULA_BACKEND_CPU;
    bp.n_threads = 100000;
    ASSERT_EQ(specula_backend_create(&bp, &b), SPECULA_OK);
    specula_device_info info{};
    EXPECT_EQ(specula_backend_get_info(b, &info), SPECULA_OK);
    EXPECT_NE(std::string(info.name).find(std::to_string(std::thread::hardware_concurrency()) +
                                          " threads"),
              std::string::npos)
        << info.name;
    specula_backend_free(b);
}

TEST_F(Api, OnlyRegularFilesAreOpened) {
    const std::string fifo = (specula::test::temp_dir() / "model.fifo").string();
    ::unlink(fifo.c_str());
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    specula_model* m = nullptr;
    EXPECT_EQ(specula_model_load(backend, fifo.c_str(), nullptr, &m), SPECULA_ERR_IO);  // no hang
    EXPECT_NE(std::string(specula_last_error()).find("regular file"), std::string::npos);
    EXPECT_EQ(specula_model_load(backend, specula::test::temp_dir().c_str(), nullptr, &m),
              SPECULA_ERR_IO);
    ::unlink(fifo.c_str());
}

TEST_F(Api, ProgressEndsAtOneWithATiedHeadAndTruncatedVocabulariesLoad) {
    specula::RandomLlamaSpec spec = specula::test::small_spec(specula::GgmlType::kQ8_0, 3);
    spec.tied_output = true;
    spec.vocab_path = specula::test::data_path("ggml-vocab-gpt-2.gguf");
    spec.n_vocab = 300;  // its BOS/EOS id (50256) lies beyond: left out of the file
    const std::string path = specula::test::make_model("api-tied-300", spec);
    float last = 0;
    specula_model_params mp = specula_model_default_params();
    mp.progress = [](float f, void* user) {
        *static_cast<float*>(user) = f;
        return true;
    };
    mp.progress_user_data = &last;
    specula_model* m = nullptr;
    ASSERT_EQ(specula_model_load(backend, path.c_str(), &mp, &m), SPECULA_OK)
        << specula_last_error();
    EXPECT_EQ(last, 1.0f);
    specula_model_free(m);
}

// A model read into memory does not depend on its file: truncating the file afterwards (which
// faults a process reading weights from a mapping) changes nothing.
TEST_F(Api, AModelReadIntoMemorySurvivesItsFileBeingTruncated) {
    const auto bytes = read_bytes(model_path());
    const std::string path = write_bytes("in-memory.gguf", bytes);
    specula_model_params mp = specula_model_default_params();
    mp.read_into_memory = true;
    specula_model* m = nullptr;
    ASSERT_EQ(specula_model_load(backend, path.c_str(), &mp, &m), SPECULA_OK);
    ASSERT_EQ(::truncate(path.c_str(), off_t(bytes.size() / 2)), 0);
    specula_session_params sp = specula_session_default_params();
    sp.temperature = 0.0f;
    EXPECT_EQ(generate(m, sp, "Hello", 6), generate(sp, "Hello", 6));
    specula_model_free(m);
}

// The same model from a buffer: the same tokens, the buffer no longer needed; bad bytes are
// refused as from a file, and loaded models keep working.
TEST_F(Api, ModelsLoadFromMemory) {
    std::vector<char> bytes = read_bytes(model_path());
    specula_model* m = nullptr;
    ASSERT_EQ(specula_model_load_from_memory(backend, bytes.data(), bytes.size(), nullptr, &m),
              SPECULA_OK);
    std::fill(bytes.begin(), bytes.end(), 0);  // the model holds its own copy
    specula_session_params sp = specula_session_default_params();
    sp.temperature = 0.0f;
    EXPECT_EQ(generate(m, sp, "Hello", 6), generate(sp, "Hello", 6));
    specula_model_free(m);

    bytes = read_bytes(model_path());
    specula_model* bad = nullptr;
    EXPECT_EQ(
        specula_model_load_from_memory(backend, bytes.data(), bytes.size() / 2, nullptr, &bad),
        SPECULA_ERR_FORMAT);
    bytes[0] = 'X';
    EXPECT_EQ(specula_model_load_from_memory(backend, bytes.data(), bytes.size(), nullptr, &bad),
              SPECULA_ERR_FORMAT);
    EXPECT_EQ(specula_model_load_from_memory(backend, nullptr, 10, nullptr, &bad),
              SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(specula_model_load_from_memory(backend, nullptr, 0, nullptr, &bad),
              SPECULA_ERR_FORMAT);
    EXPECT_EQ(bad, nullptr);
    EXPECT_EQ(generate(sp, "Hello", 3).size(), 3u);
}

// ulimit -v: a worker thread cannot be started. The constructor used to wait forever for the
// workers it had started; now backend creation returns OUT_OF_MEMORY. Run in a child process
// (the limit is process-wide) with an alarm, so a hang fails instead of blocking the suite.
TEST(ApiProcess, ThreadsThatCannotStartAreOutOfMemory) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "sanitizers reserve more address space than the limit leaves";
#else
    constexpr int kLimitNotEnforced = 6;
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        ::alarm(20);
        // Each thread reserves an 8 MiB stack: a limit a little above what is mapped now
        // lets a few start and refuses the rest.
        std::ifstream statm("/proc/self/statm");
        size_t pages = 0;
        statm >> pages;
        const rlim_t limit = rlim_t(pages) * rlim_t(::sysconf(_SC_PAGE_SIZE)) + (64u << 20);
        const rlimit rl{limit, limit};
        if (::setrlimit(RLIMIT_AS, &rl) != 0) ::_exit(3);
        // Emulators such as qemu-user accept the limit without enforcing it.
        void* beyond = ::mmap(nullptr, 256u << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (beyond != MAP_FAILED) ::_exit(kLimitNotEnforced);
        specula_backend_params bp = specula_backend_default_params();
        bp.kind = SPECULA_BACKEND_CPU;
        specula_backend* b = nullptr;
        int made = 0;
        std::vector<specula_backend*> backends;
        specula_status st = SPECULA_OK;
        while (st == SPECULA_OK && made < 1000) {  // backends of every core until threads fail
            st = specula_backend_create(&bp, &b);
            if (st == SPECULA_OK) backends.push_back(b), ++made;
        }
        for (specula_backend* x : backends)
            specula_backend_free(x);
        ::_exit(st == SPECULA_ERR_OUT_OF_MEMORY ? 0 : st == SPECULA_OK ? 4 : 5);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_FALSE(WIFSIGNALED(status)) << "signal " << WTERMSIG(status) << " (SIGALRM: a hang)";
    if (WEXITSTATUS(status) == kLimitNotEnforced)
        GTEST_SKIP() << "RLIMIT_AS is not enforced here (an emulator)";
    EXPECT_EQ(WEXITSTATUS(status), 0);
#endif
}

TEST_F(Api, MissingBackendsAreReportedAndCpuStillWorks) {
    specula_backend_params bp = specula_backend_default_params();
    bp.kind = SPECULA_BACKEND_CUDA;
    specula_backend* b = nullptr;
    const specula_status s = specula_backend_create(&bp, &b);
    if (s == SPECULA_OK) {
        specula_backend_free(b);
        GTEST_SKIP() << "a CUDA device is present";
    }
    EXPECT_EQ(s, SPECULA_ERR_NO_DEVICE);
    EXPECT_EQ(b, nullptr);
    specula_session_params sp = specula_session_default_params();
    EXPECT_EQ(generate(sp, "cpu", 2).size(), 2u);
}

#if defined(SPECULA_HAVE_VULKAN)
// While one lives, the Vulkan loader's entry point *slot is `fake`: the runtime's handling of
// what a driver may answer (a lost device, no memory left) is tested on any Vulkan device.
template <typename Fn>
class SwappedEntryPoint {
  public:
    SwappedEntryPoint(Fn* slot, Fn fake) : slot_(slot), real_(*slot) { *slot = fake; }
    ~SwappedEntryPoint() { *slot_ = real_; }
    SwappedEntryPoint(const SwappedEntryPoint&) = delete;
    SwappedEntryPoint& operator=(const SwappedEntryPoint&) = delete;

  private:
    Fn* slot_;
    Fn real_;
};

specula_backend* vulkan_backend_or_null() {
    specula_backend_params bp = specula_backend_default_params();
    bp.kind = SPECULA_BACKEND_VULKAN;
    specula_backend* b = nullptr;
    return specula_backend_create(&bp, &b) == SPECULA_OK ? b : nullptr;
}

// The fixture's model on the cpu backend, and the same model on a Vulkan backend.
class VulkanFaults : public Api {
  protected:
    void SetUp() override {
        Api::SetUp();
        vulkan = vulkan_backend_or_null();
        if (vulkan == nullptr) GTEST_SKIP() << "no Vulkan device";
        ASSERT_EQ(specula_model_load(vulkan, model_path().c_str(), nullptr, &on_vulkan),
                  SPECULA_OK);
        greedy.temperature = 0.0f;
        before = generate(on_vulkan, greedy, "faults", 6);
        ASSERT_EQ(before.size(), 6u);
    }
    void TearDown() override {
        specula_model_free(on_vulkan);
        specula_backend_free(vulkan);
        Api::TearDown();
    }

    specula_backend* vulkan = nullptr;
    specula_model* on_vulkan = nullptr;
    specula_session_params greedy = specula_session_default_params();
    std::vector<int32_t> before;  // the greedy tokens after "faults" before any fault
};

TEST_F(VulkanFaults, LostDeviceIsAStatusAndNothingElseIsLost) {
    specula_session* s = nullptr;
    ASSERT_EQ(specula_session_create(on_vulkan, &greedy, &s), SPECULA_OK);
    const auto ids = tokenize("faults");
    {
        const SwappedEntryPoint loss(
            &specula::vk::vkQueueSubmit,
            +[](VkQueue, uint32_t, const VkSubmitInfo*, VkFence) { return VK_ERROR_DEVICE_LOST; });
        EXPECT_EQ(specula_session_eval(s, ids.data(), ids.size()), SPECULA_ERR_DEVICE_LOST);
        EXPECT_NE(std::string(specula_last_error()).find("lost"), std::string::npos)
            << specula_last_error();
    }
    // The loss is kept (a real one cannot be undone): every later call on that backend reports
    // it, and none reaches the device.
    EXPECT_EQ(specula_session_eval(s, ids.data(), ids.size()), SPECULA_ERR_DEVICE_LOST);
    specula_generate_params gp = specula_generate_default_params();
    std::vector<int32_t> out(4);
    size_t got = 0;
    EXPECT_EQ(specula_generate(s, &gp, out.data(), out.size(), &got), SPECULA_ERR_DEVICE_LOST);
    EXPECT_EQ(got, 0u);
    specula_model* m = nullptr;
    EXPECT_EQ(specula_model_load(vulkan, model_path().c_str(), nullptr, &m),
              SPECULA_ERR_DEVICE_LOST);
    EXPECT_EQ(m, nullptr);

    // The cpu backend's model never noticed; the lost one is freed without a crash or a leak.
    EXPECT_EQ(generate(greedy, "cpu", 3).size(), 3u);
    specula_session_free(s);
    specula_model_free(on_vulkan);
    specula_backend_free(vulkan);
    on_vulkan = nullptr;

    // A new backend on the same device works as before.
    vulkan = vulkan_backend_or_null();
    ASSERT_NE(vulkan, nullptr);
    ASSERT_EQ(specula_model_load(vulkan, model_path().c_str(), nullptr, &on_vulkan), SPECULA_OK);
    EXPECT_EQ(generate(on_vulkan, greedy, "faults", 6), before);
}

TEST_F(VulkanFaults, OutOfDeviceMemoryIsAStatusAndTheBackendSurvives) {
    // The device runs out of memory part way through the weights of a second model (as a draft
    // too large for what the target left would), then part way through a session's buffers.
    static PFN_vkAllocateMemory real_allocate = specula::vk::vkAllocateMemory;
    static int allocations_left = 0;
    const SwappedEntryPoint full(
        &specula::vk::vkAllocateMemory,
        +[](VkDevice d, const VkMemoryAllocateInfo* info, const VkAllocationCallbacks* callbacks,
            VkDeviceMemory* memory) {
            return allocations_left-- > 0 ? real_allocate(d, info, callbacks, memory)
                                          : VK_ERROR_OUT_OF_DEVICE_MEMORY;
        });
    for (int left : {0, 3, 9}) {
        allocations_left = left;
        specula_model* m = nullptr;
        EXPECT_EQ(specula_model_load(vulkan, model_path().c_str(), nullptr, &m),
                  SPECULA_ERR_OUT_OF_MEMORY)
            << left;
        EXPECT_EQ(m, nullptr);
        EXPECT_NE(std::string(specula_last_error()).find("memory"), std::string::npos)
            << specula_last_error();
    }
    for (int left : {0, 5}) {
        allocations_left = left;
        specula_session* s = nullptr;
        EXPECT_EQ(specula_session_create(on_vulkan, &greedy, &s), SPECULA_ERR_OUT_OF_MEMORY)
            << left;
        EXPECT_EQ(s, nullptr);
    }

    // What was loaded still works, and so does loading once memory is there again.
    allocations_left = 1 << 30;
    EXPECT_EQ(generate(on_vulkan, greedy, "faults", 6), before);
    specula_model* m = nullptr;
    ASSERT_EQ(specula_model_load(vulkan, model_path().c_str(), nullptr, &m), SPECULA_OK);
    EXPECT_EQ(generate(m, greedy, "faults", 6), before);
    specula_model_free(m);
}
#endif

TEST_F(Api, LogCallbackReceivesMessages) {
    std::vector<std::string> messages;
    specula_set_log_callback(
        [](specula_log_level, const char* m, void* user) {
            static_cast<std::vector<std::string>*>(user)->push_back(m);
        },
        &messages);
    specula_model* m = nullptr;
    EXPECT_NE(specula_model_load(backend, "/nonexistent.gguf", nullptr, &m), SPECULA_OK);
    specula_set_log_callback(nullptr, nullptr);
    ASSERT_FALSE(messages.empty());
    EXPECT_NE(messages.back().find("nonexistent"), std::string::npos);
}

}  // namespace
