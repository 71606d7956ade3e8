// Sequences stepped together (docs/DESIGN.md "Sessions stepped together"): one forward of several
// contexts (LlamaBatch) leaves each context's cache and logits bit for bit as its own forward
// would, on every backend and every architecture's options; plain steps of several generators in
// one forward emit what each emits alone; sessions generating from several threads at once
// generate what each generates alone, sharing forwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cstring>
#include <thread>

#include "backend_util.h"
#include "decode/generator.h"
#include "models/llama.h"
#include "specula.h"
#include "test_util.h"

using namespace specula;

namespace {

struct Case {
    specula_backend_kind kind;
    const char* arch;
    GgmlType type;
};

std::string model_file(const Case& c, uint64_t seed = 21) {
    RandomLlamaSpec spec = test::small_spec(c.type, seed);
    spec.arch = c.arch;
    spec.n_ctx = 128;
    if (spec.arch == "gemma2" || spec.arch == "gemma3") spec.sliding_window = 8;
    return test::make_model(
        std::string("batch-") + c.arch + "-" + ggml_type_name(c.type) + "-" + std::to_string(seed),
        spec);
}

std::vector<float> logits_of(LlamaContext& ctx) {
    std::vector<float> out(size_t(ctx.n_vocab()));
    EXPECT_TRUE(ctx.backend().download(ctx.logits(1), out.data()).ok());
    return out;
}

// Three sequences of different lengths (so different positions and caches), a few tokens each.
std::vector<int32_t> prompt(int i) {
    std::vector<int32_t> p(size_t(3 + 4 * i));
    for (size_t j = 0; j < p.size(); ++j)
        p[j] = int32_t(100 + 37 * i + 11 * int(j));
    return p;
}

class BatchOn : public ::testing::TestWithParam<Case> {};

TEST_P(BatchOn, EachContextGetsWhatItsOwnForwardGives) {
    const Case& c = GetParam();
    std::string why;
    auto backend = test::try_backend(c.kind, &why);
    if (!backend) GTEST_SKIP() << why;
    auto model = test::load_llama(*backend, model_file(c));
    constexpr int kSequences = 3;
    std::unique_ptr<LlamaBatch> batch;
    ASSERT_TRUE(LlamaBatch::create(*model, int(kVerificationColumns), &batch).ok());
    std::vector<std::unique_ptr<LlamaContext>> alone(kSequences), together(kSequences);
    std::vector<LlamaContext*> stepped;
    std::vector<float> unused;
    for (int i = 0; i < kSequences; ++i) {
        for (auto* ctx : {&alone[size_t(i)], &together[size_t(i)]}) {
            ASSERT_TRUE(LlamaContext::create(*model, 64, 16, ctx).ok());
            ASSERT_TRUE((*ctx)->forward(prompt(i), false, &unused).ok());
        }
        stepped.push_back(together[size_t(i)].get());
    }
    // Past Gemma's window of 8 keys for every sequence: the window's start moves per sequence.
    for (int step = 0; step < 10; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        std::vector<int32_t> tokens;
        for (int i = 0; i < kSequences; ++i)
            tokens.push_back(int32_t(200 + 13 * step + 7 * i));
        ASSERT_TRUE(batch->record(stepped, tokens).ok());
        for (int i = 0; i < kSequences; ++i) {
            std::vector<float> own;
            ASSERT_TRUE(
                alone[size_t(i)]->forward(std::span(&tokens[size_t(i)], 1), true, &own).ok());
            const std::vector<float> shared = logits_of(*together[size_t(i)]);
            EXPECT_EQ(together[size_t(i)]->n_past(), alone[size_t(i)]->n_past());
            ASSERT_EQ(shared.size(), own.size());
            EXPECT_EQ(std::memcmp(shared.data(), own.data(), own.size() * sizeof(float)), 0)
                << "sequence " << i;
        }
    }
}

std::vector<Case> cases() {
    std::vector<Case> out;
    for (auto kind : {SPECULA_BACKEND_CPU, SPECULA_BACKEND_VULKAN, SPECULA_BACKEND_CUDA}) {
        for (const char* arch : {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "granite"})
            out.push_back({kind, arch, GgmlType::kQ8_0});
        out.push_back({kind, "llama", GgmlType::kQ4_K});
    }
    return out;
}

INSTANTIATE_TEST_SUITE_P(Backends, BatchOn, ::testing::ValuesIn(cases()), [](const auto& info) {
    return std::string(test::backend_name(info.param.kind)) + "_" + info.param.arch + "_" +
           ggml_type_name(info.param.type);
});

TEST(Batch, RefusesWhatItCannotStepAndChangesNothing) {
    std::string why;
    auto backend = test::try_backend(SPECULA_BACKEND_CPU, &why);
    ASSERT_NE(backend, nullptr) << why;
    const Case c{SPECULA_BACKEND_CPU, "llama", GgmlType::kQ8_0};
    auto model = test::load_llama(*backend, model_file(c));
    auto other = test::load_llama(*backend, model_file(c, 22));
    std::unique_ptr<LlamaBatch> batch;
    ASSERT_TRUE(LlamaBatch::create(*model, 2, &batch).ok());
    EXPECT_EQ(batch->max_rows(), 2);
    std::unique_ptr<LlamaContext> a, b, shorter, foreign, full;
    ASSERT_TRUE(LlamaContext::create(*model, 64, 8, &a).ok());
    ASSERT_TRUE(LlamaContext::create(*model, 64, 8, &b).ok());
    ASSERT_TRUE(LlamaContext::create(*model, 32, 8, &shorter).ok());
    ASSERT_TRUE(LlamaContext::create(*other, 64, 8, &foreign).ok());
    ASSERT_TRUE(LlamaContext::create(*model, 4, 8, &full).ok());
    std::vector<float> unused;
    ASSERT_TRUE(full->forward(std::vector<int32_t>{5, 6, 7, 8}, false, &unused).ok());
    const std::vector<int32_t> two = {5, 6}, three = {5, 6, 7};
    const auto refused = [&](std::vector<LlamaContext*> contexts, std::span<const int32_t> tokens,
                             specula_status code) {
        const Status s = batch->record(contexts, tokens);
        EXPECT_EQ(s.code(), code) << s.message();
        for (LlamaContext* ctx : {a.get(), b.get(), shorter.get(), foreign.get()})
            EXPECT_EQ(ctx->n_past(), 0);
        EXPECT_EQ(full->n_past(), 4);
    };
    refused({a.get(), a.get()}, two, SPECULA_ERR_INVALID_ARGUMENT);
    refused({a.get(), shorter.get()}, two, SPECULA_ERR_INVALID_ARGUMENT);
    refused({a.get(), foreign.get()}, two, SPECULA_ERR_INVALID_ARGUMENT);
    refused({a.get(), b.get(), shorter.get()}, three, SPECULA_ERR_INVALID_ARGUMENT);  // > 2
    refused({a.get(), b.get()}, three, SPECULA_ERR_INVALID_ARGUMENT);  // tokens != contexts
    refused({}, {}, SPECULA_ERR_INVALID_ARGUMENT);
    refused({a.get(), b.get()}, std::vector<int32_t>{5, 1 << 20}, SPECULA_ERR_INVALID_ARGUMENT);
    std::unique_ptr<LlamaBatch> batch_of_full;
    ASSERT_TRUE(LlamaBatch::create(*model, 2, &batch_of_full).ok());
    std::unique_ptr<LlamaContext> c4;
    ASSERT_TRUE(LlamaContext::create(*model, 4, 8, &c4).ok());
    const Status s = batch_of_full->record(std::vector{c4.get(), full.get()}, two);
    EXPECT_EQ(s.code(), SPECULA_ERR_CONTEXT_FULL) << s.message();
    EXPECT_EQ(c4->n_past(), 0);
    EXPECT_EQ(full->n_past(), 4);
}

// Generators whose plain steps share one forward emit, greedy and sampled, what each emits
// alone; with a draft too, stepping alone (drafting) between shared steps.
TEST(Batch, PlainStepsTogetherEmitWhatEachEmitsAlone) {
    std::string why;
    auto backend = test::try_backend(SPECULA_BACKEND_CPU, &why);
    ASSERT_NE(backend, nullptr) << why;
    const Case c{SPECULA_BACKEND_CPU, "llama", GgmlType::kQ8_0};
    auto model = test::load_llama(*backend, model_file(c));
    auto draft_model = test::load_llama(*backend, model_file(c, 23));
    std::unique_ptr<LlamaBatch> batch;
    ASSERT_TRUE(LlamaBatch::create(*model, 4, &batch).ok());
    for (float temperature : {0.0f, 0.8f}) {
        SCOPED_TRACE("temperature " + std::to_string(temperature));
        constexpr int kSequences = 3, kTokens = 24;
        struct Sequence {
            std::unique_ptr<LlamaContext> target, draft;
            std::unique_ptr<Generator> gen;
        };
        const auto start = [&](int i, bool with_draft, Sequence* s) {
            ASSERT_TRUE(LlamaContext::create(*model, 64, 32, &s->target).ok());
            if (with_draft) {
                ASSERT_TRUE(LlamaContext::create(*draft_model, 64, 32, &s->draft).ok());
            }
            Generator::Config config;
            config.sampling = {temperature, 40, 0.95f, uint64_t(7 + i)};
            config.coupled = true;
            config.policy = GammaPolicy::kFixed;
            config.gamma = 3;
            s->gen = std::make_unique<Generator>(*s->target, s->draft.get(), config);
            ASSERT_TRUE(s->gen->append(prompt(i)).ok());
        };
        std::vector<std::vector<int32_t>> expected(kSequences);
        for (int i = 0; i < kSequences; ++i) {
            Sequence s;
            ASSERT_NO_FATAL_FAILURE(start(i, false, &s));
            while (expected[size_t(i)].size() < kTokens)
                ASSERT_TRUE(s.gen->step(1, &expected[size_t(i)]).ok());
        }
        std::vector<Sequence> seqs(kSequences);
        for (int i = 0; i < kSequences; ++i)
            ASSERT_NO_FATAL_FAILURE(start(i, i == 1, &seqs[size_t(i)]));
        std::vector<std::vector<int32_t>> got(kSequences);
        for (int round = 0; round < kTokens; ++round) {
            if (round % 5 == 4) {  // a step alone: the one with a draft drafts
                for (int i = 0; i < kSequences; ++i)
                    ASSERT_TRUE(seqs[size_t(i)].gen->step(4, &got[size_t(i)]).ok());
                continue;
            }
            std::vector<LlamaContext*> contexts;
            std::vector<int32_t> tokens(kSequences);
            for (int i = 0; i < kSequences; ++i) {
                ASSERT_TRUE(seqs[size_t(i)].gen->prepare_plain_step(&tokens[size_t(i)]).ok());
                contexts.push_back(seqs[size_t(i)].target.get());
            }
            ASSERT_TRUE(batch->record(contexts, tokens).ok());
            for (int i = 0; i < kSequences; ++i)
                ASSERT_TRUE(seqs[size_t(i)].gen->finish_plain_step(&got[size_t(i)]).ok());
        }
        for (int i = 0; i < kSequences; ++i) {
            got[size_t(i)].resize(kTokens);
            EXPECT_EQ(got[size_t(i)], expected[size_t(i)]) << "sequence " << i;
        }
        EXPECT_GT(seqs[1].gen->stats().drafted, 0u);
    }
}

// The C API: sessions of one model generating from several threads at once generate what each
// generates alone (greedy with the demo pair's draft, and sampled without one), and share
// forwards (specula_session_stats::n_shared_steps).
TEST(Batch, SessionsOnThreadsGenerateWhatEachGeneratesAlone) {
    specula_backend_params bp = specula_backend_default_params();
    bp.kind = SPECULA_BACKEND_CPU;
    specula_backend* backend = nullptr;
    ASSERT_EQ(specula_backend_create(&bp, &backend), SPECULA_OK);
    specula_model *target = nullptr, *draft = nullptr;
    ASSERT_EQ(specula_model_load(backend, SPECULA_MODELS_DIR "/specula-demo-target.gguf", nullptr,
                                 &target),
              SPECULA_OK);
    ASSERT_EQ(
        specula_model_load(backend, SPECULA_MODELS_DIR "/specula-demo-draft.gguf", nullptr, &draft),
        SPECULA_OK);
    const std::vector<std::string> prompts = {"The json module can be used to", "Once upon a time",
                                              "def main():", "import os\nimport sys\n"};
    constexpr int kTokens = 48;
    for (bool sampled : {false, true}) {
        SCOPED_TRACE(sampled ? "sampled" : "greedy");
        const size_t n = prompts.size();
        std::vector<specula_session*> sessions(n);
        for (size_t i = 0; i < n; ++i) {
            specula_session_params sp = specula_session_default_params();
            sp.n_ctx = 256;
            if (sampled) {
                sp.temperature = 0.8f;
                sp.top_k = 40;
                sp.seed = 11 + i;
            } else {
                sp.draft = draft;
            }
            ASSERT_EQ(specula_session_create(target, &sp, &sessions[i]), SPECULA_OK);
        }
        // The threads' generations run in step: each token waits for every session's token of
        // the same rank (a session that ends leaves the barrier), so that they all generate at
        // once however the threads are scheduled; alone, nothing waits.
        std::barrier<> in_step{std::ptrdiff_t(n)};
        const auto run = [&](size_t i, std::vector<int32_t>* out, bool together) {
            specula_session* s = sessions[i];
            EXPECT_EQ(specula_session_reset(s), SPECULA_OK);
            std::vector<int32_t> ids(512);
            size_t count = 0;
            EXPECT_EQ(specula_tokenize(target, prompts[i].data(), prompts[i].size(), true,
                                       ids.data(), ids.size(), &count),
                      SPECULA_OK);
            EXPECT_EQ(specula_session_eval(s, ids.data(), count), SPECULA_OK);
            specula_generate_params gp = specula_generate_default_params();
            gp.max_tokens = kTokens;
            gp.stop_at_eos = false;
            if (together) {
                gp.on_token_user_data = &in_step;
                gp.on_token = [](int32_t, const char*, size_t, void* barrier) {
                    static_cast<std::barrier<>*>(barrier)->arrive_and_wait();
                    return true;
                };
            }
            out->assign(kTokens, -1);
            size_t got = 0;
            EXPECT_EQ(specula_generate(s, &gp, out->data(), out->size(), &got), SPECULA_OK)
                << specula_last_error();
            EXPECT_EQ(got, size_t(kTokens));
            if (together) in_step.arrive_and_drop();
        };
        std::vector<std::vector<int32_t>> alone(n), together(n);
        for (size_t i = 0; i < n; ++i)
            run(i, &alone[i], false);
        std::vector<std::thread> threads;
        for (size_t i = 0; i < n; ++i)
            threads.emplace_back(run, i, &together[i], true);
        for (std::thread& t : threads)
            t.join();
        uint64_t shared = 0;
        for (size_t i = 0; i < n; ++i) {
            EXPECT_EQ(together[i], alone[i]) << "session " << i;
            specula_session_stats st{};
            ASSERT_EQ(specula_session_get_stats(sessions[i], &st), SPECULA_OK);
            EXPECT_LE(st.n_shared_steps, st.n_steps);
            shared += st.n_shared_steps;
            specula_session_free(sessions[i]);
        }
        // Four sessions generating in step find each other waiting.
        EXPECT_GT(shared, 0u);
    }
    specula_model_free(draft);
    specula_model_free(target);
    specula_backend_free(backend);
}

}  // namespace
