// The device verify and sampling passes against the cpu reference: the same
// logits and seed must give the same n and tokens, bit for bit (docs/DESIGN.md "Sampling and random
// numbers"), over vocabulary sizes that are and are not multiples of the tile, every sampling mode,
// γ from 0 (plain sampling) to 16, batches, ties and -inf logits.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "asr/rules.h"
#include "backend/cpu/cpu_backend.h"
#include "backend_util.h"
#include "sampling/mask_program.h"
#include "sampling/verify.h"

using namespace specula;

namespace {

struct Case {
    int V, gamma, batch;
    SamplingParams sampling;
    const char* what;
};

std::string describe(const Case& c) {
    return std::string(c.what) + " V " + std::to_string(c.V) + " gamma " + std::to_string(c.gamma) +
           " batch " + std::to_string(c.batch);
}

// Target logits, draft logits near them (so some drafts pass and some fail), drafts
// sampled from the draft rows as a real draft model would, and a few ties and -inf.
struct Inputs {
    std::vector<float> target, draft;
    std::vector<int32_t> drafts;
};

Inputs make_inputs(const Case& c, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> z(0.0f, 3.0f), noise(0.0f, 0.7f);
    const auto V = size_t(c.V), g = size_t(c.gamma), B = size_t(c.batch);
    Inputs in;
    in.target.resize(B * (g + 1) * V);
    for (float& x : in.target)
        x = z(rng);
    for (size_t i = 0; i < in.target.size(); i += 13)
        in.target[i] = std::round(in.target[i]);  // ties
    for (size_t i = 5; i < in.target.size(); i += 101)
        in.target[i] = -INFINITY;
    in.draft.resize(B * g * V);
    for (size_t b = 0; b < B; ++b)
        for (size_t r = 0; r < g; ++r)
            for (size_t x = 0; x < V; ++x)
                in.draft[(b * g + r) * V + x] = in.target[(b * (g + 1) + r) * V + x] + noise(rng);
    for (size_t b = 0; b < B; ++b)
        for (size_t r = 0; r < g; ++r)
            in.drafts.push_back(sample_token(std::span(in.draft).subspan((b * g + r) * V, V),
                                             c.sampling, seed, RandomStream::kDraft, uint32_t(r)));
    return in;
}

// Runs VerifyArgs on a backend and returns the result words and the token words.
struct Outcome {
    std::vector<int32_t> result, token;
};

Outcome run(Backend& backend, const Case& c, const Inputs& in, uint32_t step) {
    std::vector<std::unique_ptr<Buffer>> keep;
    auto tensor = [&](GgmlType type, int64_t cols, int64_t rows, const void* data) {
        Tensor t{nullptr, 0, type, cols, std::max<int64_t>(rows, 1)};
        std::unique_ptr<Buffer> b;
        EXPECT_TRUE(backend.allocate(t.bytes(), &b).ok());
        t.buffer = b.get();
        keep.push_back(std::move(b));
        if (data != nullptr) backend.upload(t, data);
        return t;
    };
    const int64_t g = c.gamma, B = c.batch;
    VerifyArgs a;
    a.target = tensor(GgmlType::kF32, c.V, B * (g + 1), in.target.data());
    if (g > 0) {
        a.draft = tensor(GgmlType::kF32, c.V, B * g, in.draft.data());
        a.drafts = tensor(GgmlType::kI32, B * g, 1, in.drafts.data());
    }
    a.batch = c.batch;
    a.gamma = c.gamma;
    a.sampling = c.sampling;
    a.step = step;
    if (g == 0) {  // the shape of on-device draft sampling
        a.stream = RandomStream::kDraft;
        a.row_offset = 3;
    }
    a.result = tensor(GgmlType::kI32, B * (g + 2), 1, nullptr);
    a.token = tensor(GgmlType::kI32, B, 1, nullptr);
    backend.verify(a);
    Outcome o{std::vector<int32_t>(size_t(B * (g + 2))), std::vector<int32_t>(size_t(B))};
    EXPECT_TRUE(backend.download(a.result, o.result.data()).ok());
    const Status s = backend.download(a.token, o.token.data());
    EXPECT_TRUE(s.ok()) << s.message();
    return o;
}

SamplingParams sp(float t, int k = 0, float p = 1.0f) {
    return {t, k, p, 0x5eed0000abcdull};
}

class VerifyOn : public ::testing::TestWithParam<specula_backend_kind> {
  protected:
    void SetUp() override {
        std::string why;
        gpu = test::try_backend(GetParam(), &why);
        if (!gpu) GTEST_SKIP() << why;
        cpu = create_cpu_backend(2);
    }
    void check(const Case& c, int steps) {
        SCOPED_TRACE(describe(c));
        int accepted = 0, judged = 0;
        for (int s = 0; s < steps; ++s) {
            const Inputs in = make_inputs(c, 1000u + uint32_t(s));
            const Outcome want = run(*cpu, c, in, uint32_t(s)), got = run(*gpu, c, in, uint32_t(s));
            ASSERT_EQ(got.result, want.result) << "step " << s;
            ASSERT_EQ(got.token, want.token) << "step " << s;
            for (int b = 0; b < c.batch; ++b) {
                accepted += want.result[size_t(b * (c.gamma + 2))];
                judged += std::min(want.result[size_t(b * (c.gamma + 2))] + 1, c.gamma);
            }
        }
        if (c.gamma >= 4 && steps * c.batch >= 8) {
            // Both outcomes occur, so the comparison covered accept and reject paths.
            EXPECT_GT(accepted, 0);
            EXPECT_LT(accepted, judged);
        }
    }
    std::unique_ptr<Backend> cpu, gpu;
};

TEST_P(VerifyOn, SameNAndTokensAsTheCpuReference) {
    const Case cases[] = {
        {7, 1, 1, sp(1.0f), "T=1"},
        {1000, 4, 1, sp(1.0f), "T=1"},
        {4097, 4, 3, sp(0.7f), "T=0.7, one token past a tile"},
        {1000, 16, 1, sp(1.3f), "T=1.3"},
        {1000, 4, 1, sp(0.0f), "greedy"},
        {1000, 16, 2, sp(0.0f), "greedy"},
        {1000, 4, 1, sp(0.8f, 40), "top-k 40"},
        {1000, 4, 1, sp(1.0f, 0, 0.9f), "top-p 0.9"},
        {1000, 4, 2, sp(1.0f, 50, 0.8f), "top-k 50 + top-p 0.8"},
        {1000, 4, 1, sp(0.7f, 1), "top-k 1"},
        {1000, 4, 1, sp(1.0f, 0, 1e-7f), "top-p tiny"},
        {300, 4, 1, sp(1.0f, 0, 0.9f), "top-p 0.9 over a row the device gathers whole"},
        {50, 4, 1, sp(1.0f, 0, 0.9f), "top-p 0.9 over a row shorter than 64"},
        {1000, 0, 4, sp(1.0f), "sampling (gamma 0)"},
        {1000, 0, 2, sp(0.9f, 20, 0.7f), "sampling with top-k and top-p"},
    };
    for (const Case& c : cases)
        check(c, 12);
}

TEST_P(VerifyOn, LargeVocabularies) {
    const Case cases[] = {
        {32000, 4, 1, sp(1.0f), "T=1"},
        {51866, 8, 1, sp(0.8f), "T=0.8"},
        {151936, 8, 1, sp(1.0f), "T=1"},
        {151936, 4, 1, sp(0.0f), "greedy"},
        {32000, 2, 1, sp(1.0f, 40, 0.9f), "top-k 40 + top-p 0.9"},
        {51866, 1, 1, sp(1.0f, 0, 0.95f), "top-p 0.95"},
    };
    for (const Case& c : cases)
        check(c, 3);
}

// Whisper's rules in the layout of an English model with `n_timestamps` timestamps at the end.
asr::TokenRules whisper_like_rules(int V, int n_timestamps, bool timestamps) {
    asr::TokenRules r;
    r.timestamp_begin = V - n_timestamps;
    r.eot = r.timestamp_begin - 108;
    r.sot = r.eot + 1;
    r.language_begin = r.sot + 1;
    r.language_end = r.language_begin + 99;
    r.translate = r.language_end;
    r.transcribe = r.translate + 1;
    r.solm = r.transcribe + 1;
    r.prev = r.solm + 1;
    r.nosp = r.prev + 1;
    r.no_timestamps = r.nosp + 1;
    r.space = 220;
    r.max_timestamp = n_timestamps - 1;
    r.timestamps = timestamps;
    return r;
}

// The device runs a mask program (Whisper's rules, asr::mask_program) on a step's rows as
// sampling/mask_program.cpp does, bit for bit, each row from its own prefix (the state, then the
// drafts before it), with each row's log-sum-exp.
TEST_P(VerifyOn, MaskProgramsMaskEveryRowAsTheHostDoes) {
    struct RulesCase {
        int V, n_timestamps, first_row, rows;
        bool timestamps;
        const char* what;
    };
    const RulesCase cases[] = {
        {1000, 101, 0, 5, true, "small vocabulary"},
        {1000, 101, 3, 4, true, "rows after three drafts"},
        {1000, 101, 0, 3, false, "no timestamps"},
        {51864, 1501, 0, 9, true, "English Whisper"},
        {51866, 1501, 2, 3, true, "multilingual Whisper, rows after two drafts"},
    };
    int timestamps_won = 0, text_kept = 0;
    for (const RulesCase& c : cases) {
        for (uint32_t seed = 0; seed < 6; ++seed) {
            SCOPED_TRACE(std::string(c.what) + " seed " + std::to_string(seed));
            std::mt19937 rng(seed);
            std::normal_distribution<float> z(0.0f, 3.0f);
            const asr::TokenRules rules = whisper_like_rules(c.V, c.n_timestamps, c.timestamps);
            const MaskProgram program = asr::mask_program(rules);
            const int tb = rules.timestamp_begin;
            auto text = [&] { return int(rng() % uint32_t(rules.eot)); };
            auto timestamp = [&] { return tb + int(rng() % 40u); };
            // States: the start of a window, text after text (where only the logits decide
            // between text and a timestamp), and a random history; drafts of both kinds.
            std::vector<int32_t> history;
            if (seed % 3 == 1) history = {text(), text()};
            if (seed % 3 == 2)
                for (int i = 0; i < 6; ++i)
                    history.push_back(rng() % 2 ? text() : timestamp());
            const MaskState state = MaskState::of(program, history);
            std::vector<int32_t> drafts(size_t(c.first_row + c.rows));
            for (int32_t& d : drafts)
                d = rng() % 3 == 0 ? timestamp() : text();
            // Half the rows put much weight on the timestamps.
            std::vector<float> logits(size_t(c.rows) * size_t(c.V));
            for (int row = 0; row < c.rows; ++row)
                for (int x = 0; x < c.V; ++x) {
                    float& v = logits[size_t(row) * size_t(c.V) + size_t(x)];
                    v = z(rng) + (row % 2 == 1 && x >= tb ? 6.0f : 0.0f);
                    if (x % 97 == 5) v = -INFINITY;
                }

            std::vector<float> want = logits, want_lse(size_t(c.rows));
            apply_mask_program_to_step(program, state, drafts, c.first_row, want, c.V, want_lse);
            // Past a window's first token, no rule but the logits' masks all text (the
            // pair-open rule keeps <|endoftext|>).
            MaskState row_state = MaskState::of(program, history);
            for (int i = 0; i < c.first_row; ++i)
                row_state = row_state.after(program, drafts[size_t(i)]);
            for (int row = 0; row < c.rows; ++row) {
                if (row > 0)
                    row_state = row_state.after(program, drafts[size_t(c.first_row + row - 1)]);
                if (row_state.count == 0 || !c.timestamps) continue;
                bool text_left = false;
                for (int x = 0; x < tb && !text_left; ++x)
                    text_left = want[size_t(row) * size_t(c.V) + size_t(x)] != -INFINITY;
                (text_left ? text_kept : timestamps_won) += 1;
            }

            std::vector<std::unique_ptr<Buffer>> keep;
            auto tensor = [&](GgmlType type, int64_t cols, int64_t rows, const void* data) {
                Tensor t{nullptr, 0, type, cols, rows};
                std::unique_ptr<Buffer> b;
                EXPECT_TRUE(gpu->allocate(t.bytes(), &b).ok());
                t.buffer = b.get();
                keep.push_back(std::move(b));
                if (data != nullptr) gpu->upload(t, data);
                return t;
            };
            MaskArgs a;
            a.logits = tensor(GgmlType::kF32, c.V, c.rows, logits.data());
            a.drafts = tensor(GgmlType::kI32, int64_t(drafts.size()), 1, drafts.data());
            a.first_row = c.first_row;
            a.program = program;
            a.state = state;
            a.log_sum_exp = tensor(GgmlType::kF32, c.rows, 1, nullptr);
            const uint64_t waits = gpu->host_waits();
            gpu->mask_logits(a);
            // On the device the rules add no wait to a step (the host default reads the rows):
            // what supports() says.
            EXPECT_EQ(gpu->host_waits() == waits,
                      gpu->supports(Backend::Op::kMaskLogits, GgmlType::kF32));
            std::vector<float> got(logits.size()), got_lse(size_t(c.rows));
            ASSERT_TRUE(gpu->download(a.logits, got.data()).ok());
            ASSERT_TRUE(gpu->download(a.log_sum_exp, got_lse.data()).ok());
            for (size_t i = 0; i < got.size(); ++i)
                ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
                    << "row " << i / size_t(c.V) << " token " << i % size_t(c.V);
            for (size_t row = 0; row < got_lse.size(); ++row)
                ASSERT_EQ(std::bit_cast<uint32_t>(got_lse[row]),
                          std::bit_cast<uint32_t>(want_lse[row]))
                    << "row " << row << ": " << got_lse[row] << " vs " << want_lse[row];
        }
    }
    // Both outcomes of the one rule that reads the logits occurred.
    EXPECT_GT(timestamps_won, 10);
    EXPECT_GT(text_kept, 10);
}

INSTANTIATE_TEST_SUITE_P(Gpu, VerifyOn,
                         ::testing::Values(SPECULA_BACKEND_VULKAN, SPECULA_BACKEND_CUDA),
                         [](const auto& info) {
                             return std::string(test::backend_name(info.param));
                         });

}  // namespace
