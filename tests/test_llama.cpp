// The Llama decoder on the cpu backend: batch invariance, KV rollback, limits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "core/fp16.h"
#include "format/quant.h"
#include "models/llama.h"
#include "quantizer.h"
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

// The cpu kernels read every weight exactly as dequantize_row() gives it (each SIMD target:
// test_llama_<target> runs this suite), and a product of one row is that row's dot product in
// the kernels' one order (dot_f32), whatever the type.
TEST_P(WeightTypeTest, CpuKernelsReadEachWeightAsDequantizeRow) {
    const GgmlType type = GetParam();
    const int64_t cols = 768, rows = 5;  // 768: Q6_K rows that start 2-byte aligned
    const size_t row_bytes = Tensor{nullptr, 0, type, cols, 1}.row_bytes();
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> values(static_cast<size_t>(cols * rows)), x(static_cast<size_t>(cols));
    for (float& v : values)
        v = dist(rng);
    for (float& v : x)
        v = dist(rng);
    std::vector<uint8_t> w(row_bytes * size_t(rows));
    for (int64_t r = 0; r < rows; ++r)
        quantize_row(type, values.data() + r * cols, w.data() + size_t(r) * row_bytes,
                     size_t(cols));
    std::vector<float> products(static_cast<size_t>(rows));
    cpu::MatmulArgs a;
    a.type = type;
    a.w = w.data();
    a.row_bytes = row_bytes;
    a.cols = cols;
    a.x = x.data();
    a.n = 1;
    a.out = products.data();
    a.out_stride = rows;
    cpu::matmul_rows(a, 0, rows);
    for (int64_t r = 0; r < rows; ++r) {
        SCOPED_TRACE("row " + std::to_string(r));
        std::vector<float> expected(static_cast<size_t>(cols)), decoded(expected.size());
        dequantize_row(type, w.data() + size_t(r) * row_bytes, expected.data(), size_t(cols));
        cpu::decode_row(type, w.data() + size_t(r) * row_bytes, cols, decoded.data());
        ASSERT_EQ(std::memcmp(decoded.data(), expected.data(), decoded.size() * sizeof(float)), 0);
        EXPECT_EQ(products[size_t(r)], cpu::dot_f32(expected.data(), x.data(), cols));
    }
}

INSTANTIATE_TEST_SUITE_P(Types, WeightTypeTest, ::testing::ValuesIn(kWeightTypes),
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

Status load_file(Backend& backend, const std::string& path, std::unique_ptr<LlamaModel>* out) {
    std::unique_ptr<MappedFile> file;
    SPECULA_TRY(MappedFile::open(path, &file));
    return LlamaModel::load(backend, std::move(file), nullptr, out);
}

// Granite reads its four scales as llama.cpp does (its logits' scale required), and a file with
// a tensor the forward would not apply (a bias of the attention's output) is refused by name
// rather than run without it. The scales' effect on the logits: parity_numpy_*_granite_q8_0.
TEST(Llama, GraniteReadsItsScalesAndRefusesWhatItWouldNotApply) {
    RandomLlamaSpec spec = test::small_spec(GgmlType::kQ8_0, 1);
    spec.arch = "granite";
    const std::string path = test::make_model("granite", spec);
    std::unique_ptr<Backend> backend = create_cpu_backend(2);
    std::unique_ptr<LlamaModel> model;
    Status s = load_file(*backend, path, &model);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(model->config().embedding_scale, spec.embedding_scale);
    EXPECT_EQ(model->config().residual_scale, spec.residual_scale);
    EXPECT_EQ(model->config().attention_scale, spec.attention_scale);
    EXPECT_EQ(model->config().logit_scale, spec.logit_scale);

    const std::string no_logit_scale = (test::temp_dir() / "granite-no-logit-scale.gguf").string();
    test::GgufEdit drop;
    drop.metadata = [](std::vector<std::pair<std::string, GgufValue>>* m) {
        std::erase_if(*m, [](const auto& kv) { return kv.first == "granite.logit_scale"; });
    };
    ASSERT_TRUE(test::write_edited_gguf(path, drop, no_logit_scale).ok());
    s = load_file(*backend, no_logit_scale, &model);
    EXPECT_EQ(s.code(), SPECULA_ERR_FORMAT) << s.message();

    const std::string with_bias = (test::temp_dir() / "granite-output-bias.gguf").string();
    // The file with one tensor more: a bias of blk.0's attention output (its norm's bytes).
    {
        std::unique_ptr<MappedFile> file;
        ASSERT_TRUE(MappedFile::open(path, &file).ok());
        GgufFile g;
        ASSERT_TRUE(GgufFile::parse(file->bytes(), &g).ok());
        GgufWriter w;
        for (const auto& [key, value] : g.metadata())
            w.set(key, value);
        for (const GgufTensorInfo& t : g.tensors())
            ASSERT_TRUE(w.add_tensor(t.name, t.type, t.shape, {t.data.begin(), t.data.end()}).ok());
        const GgufTensorInfo* norm = g.find_tensor("blk.0.attn_norm.weight");
        ASSERT_NE(norm, nullptr);
        ASSERT_TRUE(w.add_tensor("blk.0.attn_output.bias", norm->type, norm->shape,
                                 {norm->data.begin(), norm->data.end()})
                        .ok());
        ASSERT_TRUE(w.write(with_bias).ok());
    }
    s = load_file(*backend, with_bias, &model);
    EXPECT_EQ(s.code(), SPECULA_ERR_UNSUPPORTED) << s.message();
    EXPECT_NE(s.message().find("blk.0.attn_output.bias"), std::string::npos) << s.message();
}

// Phi-3 attends over a sliding window: the key is read, and a context longer than the window is
// a context like any other (the window's mask is the attention op's; parity.py checks its
// numbers, tests/CMakeLists.txt parity_numpy_*_phi3_*). LongRoPE's factors come in pairs: a
// file with one of the two is refused.
TEST(Llama, Phi3ReadsItsSlidingWindow) {
    RandomLlamaSpec spec = test::small_spec(GgmlType::kQ8_0, 1);
    spec.arch = "phi3";
    spec.n_ctx = 256;
    spec.sliding_window = 64;
    spec.longrope = true;
    const std::string path = test::make_model("phi3-window-64", spec);
    std::unique_ptr<Backend> backend = create_cpu_backend(2);
    std::unique_ptr<LlamaModel> model;
    Status s = load_file(*backend, path, &model);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(model->config().sliding_window, 64);
    std::unique_ptr<LlamaContext> ctx;
    s = LlamaContext::create(*model, 256, 8, &ctx);
    EXPECT_TRUE(s.ok()) << s.message();

    const std::string one_factor = (test::temp_dir() / "phi3-one-factor.gguf").string();
    test::GgufEdit edit;
    edit.tensor = [](const GgufTensorInfo& t, std::vector<int64_t>* shape,
                     std::vector<uint8_t>* data) {
        if (t.name != "rope_factors_long.weight") return false;
        shape->clear();  // left out
        data->clear();
        return true;
    };
    ASSERT_TRUE(test::write_edited_gguf(path, edit, one_factor).ok());
    s = load_file(*backend, one_factor, &model);
    EXPECT_EQ(s.code(), SPECULA_ERR_FORMAT) << s.message();
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

// The vector GELU is x Phi(x) to within the erf approximation's 1.5e-7 (device_abi.h), on
// whole vectors and on a tail, for tiny, ordinary and huge inputs of either sign.
TEST(CpuKernels, GeluIsXTimesPhi) {
    create_cpu_backend(1);  // applies SPECULA_CPU_SIMD to the kernels called below
    std::vector<float> x;
    for (int i = 0; i <= 1000; ++i)
        x.push_back(-12.0f + 0.024f * float(i));
    for (const float v : {1e-30f, -1e-30f, 1e20f, -1e20f, 30.0f, -30.0f})
        x.push_back(v);
    std::vector<float> out(x.size());
    cpu::activate(shared::kActivationGeluErf, x.data(), out.data(), int64_t(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
        const double v = x[i], phi = 0.5 * (1.0 + std::erf(v / std::sqrt(2.0)));
        EXPECT_NEAR(out[i], v * phi, 3e-7 * std::max(1.0, std::abs(v))) << "x = " << v;
    }
}

// The gated activations (device_abi.h's kActivation*) are their definitions, SiLU g / (1 + e^-g),
// GELU's tanh form g / 2 (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) and its exact form g Phi(g),
// times up, and alone (activate) without it: on whole vectors and a tail, for tiny, ordinary and
// huge gates of either sign.
TEST(CpuKernels, GatedActivationsAreTheirDefinitions) {
    create_cpu_backend(1);  // applies SPECULA_CPU_SIMD to the kernels called below
    std::vector<float> g, up;
    for (int i = 0; i <= 1000; ++i) {
        g.push_back(-12.0f + 0.024f * float(i));
        up.push_back(0.5f + 0.001f * float(i));
    }
    for (const float v : {1e-30f, -1e-30f, 1e20f, -1e20f, 30.0f, -30.0f}) {
        g.push_back(v);
        up.push_back(1.0f);
    }
    std::vector<float> out(g.size()), alone(g.size());
    for (uint32_t act :
         {shared::kActivationSilu, shared::kActivationGeluTanh, shared::kActivationGeluErf}) {
        cpu::gated_times(act, g.data(), up.data(), out.data(), int64_t(g.size()));
        cpu::activate(act, g.data(), alone.data(), int64_t(g.size()));
        for (size_t i = 0; i < g.size(); ++i) {
            const double x = g[i];
            const double want =
                act == shared::kActivationSilu ? x / (1.0 + std::exp(-x))
                : act == shared::kActivationGeluTanh
                    ? 0.5 * x *
                          (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)))
                    : 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
            EXPECT_NEAR(out[i], want * up[i], 1e-6 * std::max(1.0, std::abs(want * up[i])))
                << "activation " << act << ", g = " << x;
            EXPECT_EQ(alone[i] * up[i], out[i]) << "activation " << act << ", g = " << x;
        }
    }
}

// kernels.h's definition of the integer matmul, restated with plain integers and std::fma:
// inputs quantized per block (nearest even of x * (1 / dx)), then per weight row and input,
// over the blocks in order, acc = fma(sum qw * qx, dw * dx, acc); for the types with a min
// (x = d1 * q - m1) then also acc = fma(dx * sum qx, -m1, acc); Q6_K's per half of the block,
// with q = the weight + 32 and d_half = dw * s_half: acc = fma(sum_half q qx, d_half * dx, acc)
// and the offsets' acc = fma(dx * sum_half qx, -32 d_half, acc). Compared for a row count
// that is no whole number of groups and more inputs than one tile, with the weights packed
// beforehand and as they are used.
class IntegerMatmul : public ::testing::TestWithParam<GgmlType> {};

TEST_P(IntegerMatmul, IsTheDefinedSum) {
    const GgmlType type = GetParam();
    create_cpu_backend(1);  // applies SPECULA_CPU_SIMD to the kernels called below
    const bool k_min = type == GgmlType::kQ4_K || type == GgmlType::kQ5_K;
    const bool q6_k = type == GgmlType::kQ6_K;
    const bool with_min = cpu::has_block_min(type);
    constexpr int64_t kRows = 40, kN = 19;  // with n >= 16 a group is expanded
    const int64_t kCols = k_min || q6_k ? 512 : 96, kBlocks = kCols / 32;
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const size_t row_bytes = Tensor{nullptr, 0, type, kCols, 1}.row_bytes();
    std::vector<uint8_t> w(row_bytes * kRows);
    std::vector<float> row(kCols), x(kN * kCols);
    for (int64_t r = 0; r < kRows; ++r) {
        for (float& v : row)
            v = dist(rng);
        quantize_row(type, row.data(), w.data() + size_t(r) * row_bytes, kCols);
    }
    for (float& v : x)
        v = dist(rng) * 3.0f;
    x[5] = 0.5f;  // a block whose largest |x| is exact

    cpu::QuantizedInputArrays arrays;
    arrays.resize(kN, kCols);
    const size_t blocks = x.size() / 32;
    arrays.quantize(x.data(), 0, int64_t(blocks) / 2);  // in two parts, as threads split it
    arrays.quantize(x.data(), int64_t(blocks) / 2, int64_t(blocks));
    const cpu::QuantizedInputs& qx = arrays.view();
    const int8_t* q = qx.q;
    const float *d = qx.d, *dsums = qx.dsum, *dsums_lo = qx.dsum_lo, *dsums_hi = qx.dsum_hi;
    const int32_t* sums = qx.sum;
    for (size_t b = 0; b < blocks; ++b) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j)
            amax = std::max(amax, std::fabs(x[b * 32 + size_t(j)]));
        const float dx = amax / 127.0f, inv = dx != 0.0f ? 1.0f / dx : 0.0f;
        ASSERT_EQ(d[b], dx) << "block " << b;
        int32_t sum = 0, sum_lo = 0;
        for (int j = 0; j < 32; ++j) {
            const size_t i = b * 32 + size_t(j);
            ASSERT_EQ(q[i], int8_t(std::nearbyint(x[i] * inv))) << "input " << i;
            sum += q[i];
            if (j == 15) sum_lo = sum;
        }
        ASSERT_EQ(sums[b], sum) << "block " << b;
        ASSERT_EQ(dsums[b], dx * float(sum)) << "block " << b;
        ASSERT_EQ(dsums_lo[b], dx * float(sum_lo)) << "block " << b;
        ASSERT_EQ(dsums_hi[b], dx * float(sum - sum_lo)) << "block " << b;
    }

    // Weight (r, j) as an integer, and the block's scale and min (x = scale * q - min).
    auto k_block = [&](int64_t r, int64_t b, uint8_t* sc, uint8_t* m) {
        const uint8_t* p =
            w.data() + size_t(r) * row_bytes + size_t(b / 8) * row_bytes / (kCols / 256);
        k_scale_min(int(b % 8), reinterpret_cast<const BlockQ4_K*>(p)->scales, sc,
                    m);  // Q5_K: same head
        return p;
    };
    // Q4_1, Q5_0, Q5_1: element j's integer (Q5_0: q - 16) and the block's d and m (x = d * q +
    // m).
    auto small_block = [&](int64_t r, int64_t j, float* d, float* m) {
        const uint8_t* p =
            w.data() + size_t(r) * row_bytes + size_t(j / 32) * row_bytes / size_t(kCols / 32);
        const int l = int(j % 32);
        int q = 0;
        if (type == GgmlType::kQ4_1) {
            const auto& blk = *reinterpret_cast<const BlockQ4_1*>(p);
            q = l < 16 ? blk.quants[l] & 15 : blk.quants[l - 16] >> 4;
            *d = half_to_float(blk.scale);
            *m = half_to_float(blk.min);
        } else {
            const bool q5_0 = type == GgmlType::kQ5_0;
            const uint8_t* high = q5_0 ? reinterpret_cast<const BlockQ5_0*>(p)->high
                                       : reinterpret_cast<const BlockQ5_1*>(p)->high;
            const uint8_t* quants = q5_0 ? reinterpret_cast<const BlockQ5_0*>(p)->quants
                                         : reinterpret_cast<const BlockQ5_1*>(p)->quants;
            q = (l < 16 ? quants[l] & 15 : quants[l - 16] >> 4) | ((high[l / 8] >> (l % 8)) & 1)
                                                                      << 4;
            *d = half_to_float(reinterpret_cast<const BlockQ5_0*>(p)->scale);
            *m = q5_0 ? 0.0f : half_to_float(reinterpret_cast<const BlockQ5_1*>(p)->min);
            if (q5_0) q -= 16;
        }
        return q;
    };
    // Q6_K: element j's q - 32, and the scale of its half times d.
    auto q6 = [&](int64_t r, int64_t j, float* half_scale) {
        const auto& blk =
            reinterpret_cast<const BlockQ6_K*>(w.data() + size_t(r) * row_bytes)[j / 256];
        const int i = int(j % 256), h = i / 128, k = i % 128 / 32, l = i % 32;
        const int low = (blk.low[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15;
        const int high = (blk.high[32 * h + l] >> (2 * k)) & 3;
        *half_scale = float(blk.scales[8 * h + 2 * k + l / 16]);
        return (low | high << 4) - 32;
    };
    auto weight = [&](int64_t r, int64_t j) {
        const uint8_t* p = w.data() + size_t(r) * row_bytes;
        if (q6_k) {
            float unused = 0.0f;
            return q6(r, j, &unused);
        }
        if (!k_min && (with_min || type == GgmlType::kQ5_0)) {
            float d = 0.0f, m = 0.0f;
            return small_block(r, j, &d, &m);
        }
        if (with_min) {
            uint8_t sc = 0, m = 0;
            const int s = int(j / 32 % 8), l = int(j % 32);
            p = k_block(r, j / 32, &sc, &m);
            const uint8_t* quants = type == GgmlType::kQ4_K
                                        ? reinterpret_cast<const BlockQ4_K*>(p)->quants
                                        : reinterpret_cast<const BlockQ5_K*>(p)->quants;
            int q = (quants[32 * (s / 2) + l] >> (4 * (s % 2))) & 15;
            if (type == GgmlType::kQ5_K)
                q |= ((reinterpret_cast<const BlockQ5_K*>(p)->high[l] >> s) & 1) << 4;
            return q;
        }
        if (type == GgmlType::kQ8_0)
            return int(reinterpret_cast<const BlockQ8_0*>(p)[j / 32].quants[j % 32]);
        const auto& blk = reinterpret_cast<const BlockQ4_0*>(p)[j / 32];
        const uint8_t byte = blk.quants[j % 16];
        return int(j % 32 < 16 ? byte & 15 : byte >> 4) - 8;
    };
    auto scale = [&](int64_t r, int64_t b) {
        const uint8_t* p = w.data() + size_t(r) * row_bytes;
        if (!k_min && (with_min || type == GgmlType::kQ5_0)) {
            float d = 0.0f, m = 0.0f;
            small_block(r, b * 32, &d, &m);
            return d;
        }
        if (with_min) {
            uint8_t sc = 0, m = 0;
            p = k_block(r, b, &sc, &m);
            return half_to_float(reinterpret_cast<const BlockQ4_K*>(p)->d) * float(sc);
        }
        return half_to_float(type == GgmlType::kQ8_0
                                 ? reinterpret_cast<const BlockQ8_0*>(p)[b].scale
                                 : reinterpret_cast<const BlockQ4_0*>(p)[b].scale);
    };
    std::vector<float> expected(kN * kRows);
    double max_ref = 0.0;
    for (int64_t c = 0; c < kN; ++c) {
        for (int64_t r = 0; r < kRows; ++r) {
            float acc = 0.0f;
            for (int64_t b = 0; b < kBlocks; ++b) {
                const float dx = d[size_t(c * kBlocks + b)];
                if (q6_k) {
                    int32_t half[2] = {0, 0};
                    float s[2] = {0.0f, 0.0f};
                    for (int64_t j = b * 32; j < b * 32 + 32; ++j)
                        half[(j % 32) / 16] +=
                            (q6(r, j, &s[(j % 32) / 16]) + 32) * q[size_t(c * kCols + j)];
                    const float dw = half_to_float(
                        reinterpret_cast<const BlockQ6_K*>(w.data() + size_t(r) * row_bytes)[b / 8]
                            .d);
                    const float d_lo = dw * s[0], d_hi = dw * s[1];
                    const size_t i = size_t(c * kBlocks + b);
                    acc = std::fma(float(half[0]), d_lo * dx, acc);
                    acc = std::fma(float(half[1]), d_hi * dx, acc);
                    acc = std::fma(dsums_lo[i], -32.0f * d_lo, acc);
                    acc = std::fma(dsums_hi[i], -32.0f * d_hi, acc);
                    continue;
                }
                int32_t isum = 0;
                for (int64_t j = b * 32; j < b * 32 + 32; ++j)
                    isum += weight(r, j) * q[size_t(c * kCols + j)];
                acc = std::fma(float(isum), scale(r, b) * dx, acc);
                if (with_min) {
                    float m1 = 0.0f;  // x = d1 * q - m1
                    if (k_min) {
                        uint8_t sc = 0, m = 0;
                        const uint8_t* p = k_block(r, b, &sc, &m);
                        m1 = half_to_float(reinterpret_cast<const BlockQ4_K*>(p)->dmin) * float(m);
                    } else {
                        float d = 0.0f, m = 0.0f;
                        small_block(r, b * 32, &d, &m);
                        m1 = -m;
                    }
                    acc = std::fma(dsums[size_t(c * kBlocks + b)], -m1, acc);
                }
            }
            expected[size_t(c * kRows + r)] = acc;
            max_ref = std::max(max_ref, double(std::fabs(acc)));
        }
    }

    std::vector<uint8_t> packed(cpu::packed_bytes(type, kRows, kCols));
    cpu::pack_rows(type, w.data(), row_bytes, kRows, kCols, 0, (kRows + 15) / 16, packed.data());
    for (const uint8_t* p : {static_cast<const uint8_t*>(packed.data()), (const uint8_t*)nullptr}) {
        std::vector<float> out(expected.size(), -1.0f);
        cpu::MatmulArgs a{type, w.data(), row_bytes, kCols, x.data(), kN, out.data(), kRows, false};
        a.qx = &qx;
        a.packed = p;
        cpu::matmul_rows(a, 0, 32);
        cpu::matmul_rows(a, 32, kRows);
        for (size_t i = 0; i < out.size(); ++i)  // FMA where the instruction set has it
            ASSERT_NEAR(out[i], expected[i], 1e-6 * max_ref)
                << "input " << i / kRows << " row " << i % kRows << (p ? " packed" : " unpacked");
    }
}

INSTANTIATE_TEST_SUITE_P(Cpu, IntegerMatmul,
                         ::testing::Values(GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                           GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                                           GgmlType::kQ5_K, GgmlType::kQ6_K),
                         [](const auto& info) { return std::string(ggml_type_name(info.param)); });

TEST(CpuBackend, OutOfMemoryIsAStatus) {
    auto backend = create_cpu_backend(1);
    std::unique_ptr<Buffer> huge;
    EXPECT_EQ(backend->allocate(size_t(1) << 42, &huge).code(), SPECULA_ERR_OUT_OF_MEMORY);
}

}  // namespace

namespace {

QuantizeOptions quantize_options(const std::string& scheme, bool allow_requantize = false) {
    QuantizeOptions options;
    options.scheme = scheme;
    options.allow_requantize = allow_requantize;
    return options;
}

// llama.cpp's Q4_K_M of a 32-block Llama (Llama 2 7B's shape): its loader reports 193 Q4_K and
// 33 Q6_K matrices (output, and attn_v and ffn_down in 16 blocks each).
TEST(Quantize, TheKMixesAreLlamaCpps) {
    std::map<GgmlType, int> counts;
    const char* per_block[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                               "ffn_gate", "ffn_up", "ffn_down"};
    auto count = [&](const std::string& name) {
        GgmlType t{};
        ASSERT_TRUE(quantized_type("q4_k_m", name, 32, 4096, &t).ok());
        ++counts[t];
    };
    count("token_embd.weight");
    count("output.weight");
    for (int l = 0; l < 32; ++l)
        for (const char* m : per_block)
            count("blk." + std::to_string(l) + "." + m + ".weight");
    EXPECT_EQ(counts[GgmlType::kQ4_K], 193);
    EXPECT_EQ(counts[GgmlType::kQ6_K], 33);
    // Rows that are not whole super-blocks take llama.cpp's fallbacks.
    GgmlType t{};
    ASSERT_TRUE(quantized_type("q4_k_m", "blk.5.attn_q.weight", 32, 4096 + 32, &t).ok());
    EXPECT_EQ(t, GgmlType::kQ5_0);
    ASSERT_TRUE(quantized_type("q5_k_m", "blk.5.attn_q.weight", 32, 4096 + 32, &t).ok());
    EXPECT_EQ(t, GgmlType::kQ5_1);
    ASSERT_TRUE(quantized_type("q4_k_m", "output.weight", 32, 4096 + 32, &t).ok());
    EXPECT_EQ(t, GgmlType::kQ8_0);
    EXPECT_EQ(quantized_type("q3_k_xl", "output.weight", 32, 4096, &t).code(),
              SPECULA_ERR_INVALID_ARGUMENT);
}

// --output-tensor-type replaces output.weight's type alone, with the same fallbacks.
TEST(Quantize, TheOutputTensorTypeReplacesTheHeadsTypeAlone) {
    GgmlType t{};
    ASSERT_TRUE(quantized_type("q4_k_m", "output.weight", 32, 4096, &t, "q4_k").ok());
    EXPECT_EQ(t, GgmlType::kQ4_K);
    ASSERT_TRUE(quantized_type("q4_k_m", "output.weight", 32, 4096, &t, "q8_0").ok());
    EXPECT_EQ(t, GgmlType::kQ8_0);
    ASSERT_TRUE(quantized_type("q4_k_m", "output.weight", 32, 4096 + 32, &t, "q4_k").ok());
    EXPECT_EQ(t, GgmlType::kQ5_0);
    ASSERT_TRUE(quantized_type("q4_k_m", "blk.0.attn_v.weight", 32, 4096, &t, "q4_k").ok());
    EXPECT_EQ(t, GgmlType::kQ6_K);
    ASSERT_TRUE(quantized_type("q4_k_m", "token_embd.weight", 32, 4096, &t, "q8_0").ok());
    EXPECT_EQ(t, GgmlType::kQ4_K);
    EXPECT_EQ(quantized_type("q8_0", "output.weight", 32, 4096, &t, "q4_k_m").code(),
              SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(quantized_type("q8_0", "output.weight", 32, 4096, &t, "q2_k").code(),
              SPECULA_ERR_INVALID_ARGUMENT);
}

// An F16 model quantized to Q4_K_M loads and predicts what the F16 model predicts, nearly:
// closer than Q4_0 (4 bits, one scale per 32) and farther than Q8_0. A quantized model is
// requantized only when asked.
TEST(Quantize, AQuantizedModelLoadsAndStaysCloseToItsSource) {
    RandomLlamaSpec spec = test::small_spec(GgmlType::kF16, 21);
    spec.n_embd = 256;
    spec.n_ff = 512;
    spec.n_layer = 3;
    const std::string f16 = test::make_model("quantize-source-f16", spec);
    auto quantized = [&](const std::string& scheme, QuantizeReport* report) {
        const std::string path = (test::temp_dir() / ("quantize-" + scheme + ".gguf")).string();
        const Status s = quantize_gguf(f16, path, quantize_options(scheme), report);
        EXPECT_TRUE(s.ok()) << s.message();
        return path;
    };
    QuantizeReport report;
    const std::string q4 = quantized("q4_k_m", &report);
    EXPECT_EQ(report.types.at("output.weight"), GgmlType::kQ6_K);
    EXPECT_EQ(report.types.at("blk.2.ffn_down.weight"), GgmlType::kQ6_K);  // the last eighth
    EXPECT_EQ(report.types.at("blk.0.attn_q.weight"), GgmlType::kQ4_K);
    EXPECT_EQ(report.types.at("blk.0.attn_norm.weight"), GgmlType::kF32);
    EXPECT_LT(report.bytes_out * 2, report.bytes_in);
    QuantizeOptions coarse_head = quantize_options("q4_k_m");
    coarse_head.output_type = "q4_k";
    const std::string q4_head = (test::temp_dir() / "quantize-q4_k_m-head-q4_k.gguf").string();
    QuantizeReport head_report;
    ASSERT_TRUE(quantize_gguf(f16, q4_head, coarse_head, &head_report).ok());
    EXPECT_EQ(head_report.types.at("output.weight"), GgmlType::kQ4_K);
    EXPECT_EQ(head_report.types.at("blk.2.ffn_down.weight"), GgmlType::kQ6_K);
    EXPECT_LT(head_report.bytes_out, report.bytes_out);
    coarse_head.output_type = "q9_9";
    EXPECT_EQ(quantize_gguf(f16, q4_head, coarse_head, nullptr).code(),
              SPECULA_ERR_INVALID_ARGUMENT);

    auto logits_of = [](const std::string& path) {
        auto backend = create_cpu_backend(2);
        std::unique_ptr<MappedFile> file;
        EXPECT_TRUE(MappedFile::open(path, &file).ok());
        std::unique_ptr<LlamaModel> model;
        const Status st = LlamaModel::load(*backend, std::move(file), nullptr, &model);
        EXPECT_TRUE(st.ok()) << st.message();
        std::unique_ptr<LlamaContext> ctx;
        EXPECT_TRUE(LlamaContext::create(*model, 32, 16, &ctx).ok());
        std::vector<float> logits;
        EXPECT_TRUE(ctx->forward(kTokens, true, &logits).ok());
        return logits;
    };
    const std::vector<float> reference = logits_of(f16);
    auto error = [&](const std::string& path) {  // relative root-mean-square
        const std::vector<float> b = logits_of(path);
        EXPECT_EQ(b.size(), reference.size());
        double err = 0, norm = 0;
        for (size_t i = 0; i < reference.size() && i < b.size(); ++i) {
            err += double(reference[i] - b[i]) * double(reference[i] - b[i]);
            norm += double(reference[i]) * double(reference[i]);
        }
        return std::sqrt(err / norm);
    };
    const double e_q4_k_m = error(q4), e_q4_0 = error(quantized("q4_0", nullptr)),
                 e_q8_0 = error(quantized("q8_0", nullptr));
    std::printf("logits' relative rms error: q8_0 %.4f, q4_k_m %.4f, q4_0 %.4f\n", e_q8_0, e_q4_k_m,
                e_q4_0);
    EXPECT_LT(e_q8_0, e_q4_k_m);
    EXPECT_LT(e_q4_k_m, e_q4_0);

    const std::string again = (test::temp_dir() / "quantize-requantized.gguf").string();
    EXPECT_EQ(quantize_gguf(q4, again, quantize_options("q8_0"), nullptr).code(),
              SPECULA_ERR_INVALID_ARGUMENT);
    const Status s = quantize_gguf(q4, again, quantize_options("q8_0", true), &report);
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(report.types.at("output.weight"), GgmlType::kQ8_0);
}

}  // namespace
