// The Llama decoder on the cpu backend: batch invariance, KV rollback, limits.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "models/llama.h"
#include "test_util.h"

using namespace specula;

namespace {

struct Loaded {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<LlamaModel> model;
};

Loaded load(GgmlType type, int n_threads = 2) {
    const std::string path =
        test::make_model(std::string("llama-") + ggml_type_name(type), test::small_spec(type, 1));
    Loaded l;
    l.backend = create_cpu_backend(n_threads);
    std::unique_ptr<MappedFile> file;
    EXPECT_TRUE(MappedFile::open(path, &file).ok());
    const Status s = LlamaModel::load(*l.backend, std::move(file), nullptr, &l.model);
    EXPECT_TRUE(s.ok()) << s.message();
    return l;
}

const std::vector<int32_t> kTokens = {1, 15043, 3186, 29892, 920, 526, 366, 29973, 306, 626, 2691};

class WeightTypeTest : public ::testing::TestWithParam<GgmlType> {};

// docs/DESIGN.md "Batch invariance": a position's logits are bit-identical whether it was computed
// alone or in a batch.
TEST_P(WeightTypeTest, BatchInvariance) {
    Loaded l = load(GetParam());
    ASSERT_TRUE(l.model);
    const int V = l.model->config().n_vocab;
    std::unique_ptr<LlamaContext> one, batch, split;
    ASSERT_TRUE(LlamaContext::create(*l.model, 64, 16, &one).ok());
    ASSERT_TRUE(LlamaContext::create(*l.model, 64, 16, &batch).ok());
    ASSERT_TRUE(LlamaContext::create(*l.model, 64, 16, &split).ok());

    std::vector<float> sequential;
    for (int32_t t : kTokens) {
        std::vector<float> logits;
        ASSERT_TRUE(one->forward(std::span(&t, 1), true, &logits).ok());
        sequential.insert(sequential.end(), logits.begin(), logits.end());
    }
    std::vector<float> batched;
    ASSERT_TRUE(batch->forward(kTokens, true, &batched).ok());
    ASSERT_EQ(batched.size(), sequential.size());
    EXPECT_EQ(std::memcmp(batched.data(), sequential.data(), batched.size() * sizeof(float)), 0);

    // A prefix of 3, then a batch of 8 (a verification batch after a prompt).
    std::vector<float> head, tail;
    ASSERT_TRUE(split->forward(std::span(kTokens).first(3), true, &head).ok());
    ASSERT_TRUE(split->forward(std::span(kTokens).subspan(3, 8), true, &tail).ok());
    EXPECT_EQ(
        std::memcmp(tail.data(), sequential.data() + 3 * size_t(V), tail.size() * sizeof(float)),
        0);
}

TEST_P(WeightTypeTest, ThreadCountDoesNotChangeLogits) {
    Loaded a = load(GetParam(), 1), b = load(GetParam(), 3);
    std::unique_ptr<LlamaContext> ca, cb;
    ASSERT_TRUE(LlamaContext::create(*a.model, 32, 16, &ca).ok());
    ASSERT_TRUE(LlamaContext::create(*b.model, 32, 16, &cb).ok());
    std::vector<float> la, lb;
    ASSERT_TRUE(ca->forward(kTokens, true, &la).ok());
    ASSERT_TRUE(cb->forward(kTokens, true, &lb).ok());
    EXPECT_EQ(la, lb);
}

INSTANTIATE_TEST_SUITE_P(Types, WeightTypeTest,
                         ::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0,
                                           GgmlType::kQ4_0),
                         [](const auto& info) { return std::string(ggml_type_name(info.param)); });

TEST(Llama, RollbackThenReevaluateGivesTheSameLogits) {
    Loaded l = load(GgmlType::kQ8_0);
    std::unique_ptr<LlamaContext> ctx;
    ASSERT_TRUE(LlamaContext::create(*l.model, 32, 16, &ctx).ok());
    std::vector<float> first, again, other;
    ASSERT_TRUE(ctx->forward(std::span(kTokens).first(6), true, &first).ok());
    ctx->truncate(3);
    EXPECT_EQ(ctx->n_past(), 3);
    const std::vector<int32_t> different = {42, 43, 44};
    ASSERT_TRUE(ctx->forward(different, true, &other).ok());  // overwrite positions 3..5
    ctx->truncate(3);
    ASSERT_TRUE(ctx->forward(std::span(kTokens).subspan(3, 3), true, &again).ok());
    const size_t V = size_t(l.model->config().n_vocab);
    EXPECT_TRUE(std::equal(again.begin(), again.end(), first.begin() + 3 * std::ptrdiff_t(V)));
    EXPECT_FALSE(std::equal(other.begin(), other.end(), again.begin()));
}

TEST(Llama, ContextAndBatchLimitsAreErrors) {
    Loaded l = load(GgmlType::kQ8_0);
    std::unique_ptr<LlamaContext> ctx;
    ASSERT_TRUE(LlamaContext::create(*l.model, 8, 4, &ctx).ok());
    std::vector<float> logits;
    EXPECT_EQ(ctx->forward(std::span(kTokens).first(5), false, &logits).code(),
              SPECULA_ERR_INVALID_ARGUMENT);
    ASSERT_TRUE(ctx->forward(std::span(kTokens).first(4), false, &logits).ok());
    ASSERT_TRUE(ctx->forward(std::span(kTokens).first(4), false, &logits).ok());
    EXPECT_EQ(ctx->forward(std::span(kTokens).first(1), false, &logits).code(),
              SPECULA_ERR_CONTEXT_FULL);
    const int32_t bad = 1 << 30;
    ctx->truncate(0);
    EXPECT_EQ(ctx->forward(std::span(&bad, 1), false, &logits).code(),
              SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(LlamaContext::create(*l.model, 0, 4, &ctx).code(), SPECULA_ERR_INVALID_ARGUMENT);
}

}  // namespace

namespace {

// tests/CMakeLists.txt runs this program once per instruction set the kernels are compiled
// for, naming it in SPECULA_CPU_SIMD; the other tests then run on it.
TEST(CpuBackend, RunsTheInstructionSetTheEnvironmentNames) {
    auto backend = create_cpu_backend(1);
    const std::string name = backend->info().name;
    EXPECT_NE(name.find(cpu::simd_target()), std::string::npos) << name;
    const char* wanted = std::getenv("SPECULA_CPU_SIMD");
    if (wanted == nullptr) GTEST_SKIP() << "SPECULA_CPU_SIMD is not set";
    const Status s = cpu_simd_environment();
    if (s.code() == SPECULA_ERR_NO_DEVICE) GTEST_SKIP() << "not runnable here: " << s.message();
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_STREQ(cpu::simd_target(), wanted);
    EXPECT_EQ(cpu::use_simd_target("NO_SUCH_SET"), cpu::SimdChoice::kUnknown);
    EXPECT_EQ(cpu::use_simd_target(wanted), cpu::SimdChoice::kChosen);
    EXPECT_STREQ(cpu::simd_target(), wanted);
}

TEST(CpuBackend, OutOfMemoryIsAStatus) {
    auto backend = create_cpu_backend(1);
    std::unique_ptr<Buffer> huge;
    EXPECT_EQ(backend->allocate(size_t(1) << 42, &huge).code(), SPECULA_ERR_OUT_OF_MEMORY);
}

}  // namespace
