// Every op of a GPU backend against the cpu reference, on random inputs of
// real shapes. Tolerances are relative to the largest reference magnitude:
// both sides compute in fp32 from the same (dequantized) values and differ
// only in summation order and in exp/sqrt.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend_util.h"
#include "core/fp16.h"
#include "format/quant.h"

using namespace specula;

namespace {

const bool kCpuFloatInputs = test::compare_gpus_with_float_inputs_on_the_cpu();

constexpr double kTolerance = 2e-5;

struct Pair {
    std::unique_ptr<Backend> cpu, gpu;
    std::vector<std::unique_ptr<Buffer>> keep;
    std::unique_ptr<Backend> cpu_int;  // a cpu with 8-bit inputs, made when first needed

    // The side that computes the reference of a matmul of `type` over n columns: cpu, or where
    // the gpu multiplies 8-bit inputs and cpu does not, a cpu that does too (the same integer
    // sums, then the same float arithmetic up to its order). It reads cpu's buffers.
    Backend& reference(GgmlType type, int64_t n) {
        if (!gpu->quantizes_inputs(type, n) || cpu->quantizes_inputs(type, n)) return *cpu;
        if (!cpu_int)
            cpu_int =
                create_cpu_backend(2, test::with_path(&specula_backend_options::int8_inputs, true));
        return *cpu_int;
    }

    // The same bytes on both backends.
    std::pair<Tensor, Tensor> tensor(GgmlType type, int64_t cols, int64_t rows,
                                     const std::vector<uint8_t>& bytes) {
        Tensor t{nullptr, 0, type, cols, rows};
        std::unique_ptr<Buffer> a, b;
        EXPECT_TRUE(cpu->allocate(t.bytes(), &a).ok());
        EXPECT_TRUE(gpu->allocate(t.bytes(), &b).ok());
        Tensor ta = t, tb = t;
        ta.buffer = a.get();
        tb.buffer = b.get();
        if (!bytes.empty()) {
            cpu->upload(ta, bytes.data());
            gpu->upload(tb, bytes.data());
        }
        keep.push_back(std::move(a));
        keep.push_back(std::move(b));
        return {ta, tb};
    }

    // f(backend, side) for the cpu (the reference of matmuls of `type` over n columns) and then
    // the gpu; side(t) is t's tensor on that backend.
    template <typename F>
    void on_each(F f, GgmlType type = GgmlType::kF32, int64_t n = 1) {
        for (bool second : {false, true}) {
            const auto side = [second](const std::pair<Tensor, Tensor>& t) {
                return second ? t.second : t.first;
            };
            f(second ? *gpu : reference(type, n), side);
        }
    }
};

std::vector<uint8_t> random_bytes(GgmlType type, int64_t cols, int64_t rows, uint32_t seed,
                                  float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> row(static_cast<size_t>(cols));
    const size_t row_bytes = Tensor{nullptr, 0, type, cols, 1}.row_bytes();
    std::vector<uint8_t> out(row_bytes * size_t(rows));
    for (int64_t r = 0; r < rows; ++r) {
        for (float& x : row)
            x = dist(rng);
        quantize_row(type, row.data(), out.data() + size_t(r) * row_bytes, size_t(cols));
    }
    return out;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> out(n);
    for (float& x : out)
        x = dist(rng);
    return out;
}

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

std::vector<float> read_floats(Backend& be, const Tensor& t) {
    std::vector<float> v(size_t(t.cols * t.rows));
    EXPECT_TRUE(be.download(t, v.data()).ok());
    return v;
}

// The types the models were first made of and one K-quant (super-block addressing), which
// the backend under test runs: what the fused matmuls (norm, rope) and the reruns with other
// shader paths (tests/CMakeLists.txt sets SPECULA_TEST_REPRESENTATIVE_TYPES=1) add does not
// depend on the weight type, and llvmpipe compiles a pipeline per type and variant (seconds
// each).
std::vector<GgmlType> representative_types(const Backend& gpu) {
    std::vector<GgmlType> types;
    for (GgmlType t :
         {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ6_K})
        if (gpu.supports(Backend::Op::kMatmul, t)) types.push_back(t);
    return types;
}

// What a fused matmul adds around its sums (a norm of the input, a rotation or a gate of the
// output) is the same code for every weight type: one type of blocks of 32 and one K-quant.
std::vector<GgmlType> epilogue_types(const Backend& gpu) {
    std::vector<GgmlType> types;
    for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ6_K})
        if (gpu.supports(Backend::Op::kMatmul, t)) types.push_back(t);
    return types;
}

bool is_representative(const Backend& gpu, GgmlType type) {
    const auto types = representative_types(gpu);
    return std::find(types.begin(), types.end(), type) != types.end();
}

// Every weight type the backend under test runs (the cpu runs every one).
std::vector<GgmlType> weight_types(const Backend& gpu) {
    const char* few = std::getenv("SPECULA_TEST_REPRESENTATIVE_TYPES");
    if (few != nullptr && std::string(few) == "1") return representative_types(gpu);
    std::vector<GgmlType> types;
    for (GgmlType t : kWeightTypes)
        if (gpu.supports(Backend::Op::kMatmul, t)) types.push_back(t);
    return types;
}

// The row lengths of `wanted` that are whole blocks of `type`; the K-quants' super-blocks of 256
// take 256 and 768 (768: Q6_K rows that start 2-byte aligned) where none is.
std::vector<int64_t> row_lengths(GgmlType type, std::initializer_list<int64_t> wanted) {
    std::vector<int64_t> lengths;
    const int64_t block = ggml_type_traits(type)->block_size;
    for (int64_t cols : wanted)
        if (cols % block == 0) lengths.push_back(cols);
    if (lengths.empty()) lengths = {block, 3 * block};
    return lengths;
}

std::string case_name(GgmlType type, int64_t cols, int64_t n) {
    return std::string(ggml_type_name(type)) + " cols " + std::to_string(cols) + " n " +
           std::to_string(n);
}

void expect_close(Pair& p, const std::pair<Tensor, Tensor>& t, double tolerance = kTolerance) {
    std::vector<float> a(size_t(t.first.cols * t.first.rows)), b(a.size());
    ASSERT_TRUE(p.cpu->download(t.first, a.data()).ok());
    const Status s = p.gpu->download(t.second, b.data());
    ASSERT_TRUE(s.ok()) << s.message();
    double max_ref = 0, max_err = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        max_ref = std::max(max_ref, double(std::fabs(a[i])));
        max_err = std::max(max_err, double(std::fabs(a[i] - b[i])));
    }
    EXPECT_GT(max_ref, 0.0);
    EXPECT_LE(max_err, tolerance * max_ref)
        << "max |gpu - cpu| = " << max_err << ", max |cpu| = " << max_ref;
}

class BackendOps : public ::testing::TestWithParam<specula_backend_kind> {
  protected:
    void SetUp() override {
        std::string why;
        p.gpu = test::try_backend(GetParam(), &why);
        if (!p.gpu) GTEST_SKIP() << why;
        p.cpu = create_cpu_backend(2);
    }
    // Vulkan applies the norms inside its matmuls on every device from here on (CPU devices
    // otherwise compute them apart); the backend is made anew, before any tensor.
    void fuse_norms_on_vulkan() {
        if (GetParam() != SPECULA_BACKEND_VULKAN) return;
        std::string why;
        p.gpu = test::try_backend(GetParam(), &why,
                                  test::with_path(&specula_backend_options::fused_norm, true));
        ASSERT_TRUE(p.gpu) << why;
    }
    Pair p;
};

// Every type's reader at one and at 19 columns (a pass of 16, then one of 3); the representative
// types at every row length (threads per row follow it) and batch width (the shader's
// column buckets). llvmpipe compiles a pipeline per type, row length and bucket.
TEST_P(BackendOps, MatmulEveryTypeAndBatch) {
    for (GgmlType type : weight_types(*p.gpu)) {
        const bool all = is_representative(*p.gpu, type);
        // 96: Q4_0/Q8_0 rows that start 2-byte aligned
        std::vector<int64_t> lengths = row_lengths(type, {32, 96, 256});
        if (!all) lengths.resize(1);
        for (int64_t cols : lengths) {
            for (int64_t n : {1, 3, 8, 16, 19}) {  // 19: wider than one shader pass
                if (!all && n != 1 && n != 19) continue;
                SCOPED_TRACE(case_name(type, cols, n));
                const int64_t rows = 45;
                auto w = p.tensor(type, cols, rows, random_bytes(type, cols, rows, 1));
                auto x =
                    p.tensor(GgmlType::kF32, cols, n, random_bytes(GgmlType::kF32, cols, n, 2));
                auto out = p.tensor(GgmlType::kF32, rows, n, {});
                p.reference(type, n).matmul(w.first, x.first, out.first, Backend::Accumulate::kNo);
                p.gpu->matmul(w.second, x.second, out.second, Backend::Accumulate::kNo);
                expect_close(p, out);
            }
        }
    }
}

// Accumulate::kYes adds the product to what out holds: the same floats on every backend as the
// product added to it afterwards (one correctly rounded addition per element).
TEST_P(BackendOps, MatmulAccumulatesLikeAdd) {
    const int64_t cols = 256, rows = 45;
    for (int64_t n : {1, 8}) {
        SCOPED_TRACE("n " + std::to_string(n));
        auto w =
            p.tensor(GgmlType::kQ8_0, cols, rows, random_bytes(GgmlType::kQ8_0, cols, rows, 7));
        auto x = p.tensor(GgmlType::kF32, cols, n, random_bytes(GgmlType::kF32, cols, n, 8));
        const auto residual = random_bytes(GgmlType::kF32, rows, n, 9);
        auto sum = p.tensor(GgmlType::kF32, rows, n, residual);
        auto product = p.tensor(GgmlType::kF32, rows, n, {});
        auto residual_t = p.tensor(GgmlType::kF32, rows, n, residual);
        p.on_each(
            [&](Backend& be, auto pick) {
                be.matmul(pick(w), pick(x), pick(sum), Backend::Accumulate::kYes);
                be.matmul(pick(w), pick(x), pick(product), Backend::Accumulate::kNo);
                std::vector<float> expected = read_floats(be, pick(residual_t));
                const std::vector<float> prod = read_floats(be, pick(product));
                for (size_t i = 0; i < expected.size(); ++i)
                    expected[i] = expected[i] + prod[i];
                EXPECT_EQ(read_floats(be, pick(sum)), expected) << be.info().name;
            },
            GgmlType::kQ8_0, n);
        expect_close(p, sum);
    }
}

// The feed-forward's gated product equals its three ops (two products, gated_mul) bit for bit on
// the same backend, whether the backend computes it in one pass or not, and the cpu's within
// the tolerance, with either activation. A gate and up of different types take the three ops.
// Batches wider than the verification batch (the Whisper encoder's 1500 columns, prompts): on
// Vulkan the tiled matmul, whose tiles of 64 rows x 64 columns here end inside the matrix, its
// sum added to the output or written.
TEST_P(BackendOps, MatmulOfManyColumns) {
    if (GetParam() == SPECULA_BACKEND_VULKAN) {  // CPU devices take slices unless told
        std::string why;
        p.gpu = test::try_backend(GetParam(), &why,
                                  test::with_path(&specula_backend_options::tiled, true));
        ASSERT_TRUE(p.gpu) << why;
    }
    for (GgmlType type : weight_types(*p.gpu)) {
        for (int64_t cols : row_lengths(type, {96, 256})) {
            for (int64_t n : {18, 150}) {  // 18: one more than a verification batch
                SCOPED_TRACE(case_name(type, cols, n));
                const int64_t rows = 130;
                auto w = p.tensor(type, cols, rows, random_bytes(type, cols, rows, 31));
                auto x =
                    p.tensor(GgmlType::kF32, cols, n, random_bytes(GgmlType::kF32, cols, n, 32));
                auto out =
                    p.tensor(GgmlType::kF32, rows, n, random_bytes(GgmlType::kF32, rows, n, 33));
                auto sum =
                    p.tensor(GgmlType::kF32, rows, n, random_bytes(GgmlType::kF32, rows, n, 34));
                p.on_each(
                    [&](Backend& be, auto pick) {
                        be.matmul(pick(w), pick(x), pick(out), Backend::Accumulate::kNo);
                        be.matmul(pick(w), pick(x), pick(sum), Backend::Accumulate::kYes);
                    },
                    type, n);
                expect_close(p, out);
                expect_close(p, sum);
            }
        }
    }
}

TEST_P(BackendOps, MatmulGatedIsTwoMatmulsAndGatedMul) {
    // Two matrices of one type (one pass on Vulkan: blocks of 32, and super-blocks), and of two
    // (the three ops).
    const std::vector<std::pair<GgmlType, GgmlType>> types = {{GgmlType::kQ8_0, GgmlType::kQ8_0},
                                                              {GgmlType::kQ6_K, GgmlType::kQ6_K},
                                                              {GgmlType::kQ8_0, GgmlType::kQ4_0},
                                                              {GgmlType::kQ4_K, GgmlType::kQ6_K}};
    for (auto [gate_type, up_type] : types) {
        if (!p.gpu->supports(Backend::Op::kMatmul, gate_type) ||
            !p.gpu->supports(Backend::Op::kMatmul, up_type))
            continue;
        for (int64_t cols : row_lengths(gate_type, {96, 256})) {
            for (int64_t n : {1, 8, 19}) {  // 19: a pass of 16 columns, then one of 3
                const auto act = n == 8    ? Backend::Activation::kGeluTanh
                                 : n == 19 ? Backend::Activation::kGeluErf
                                           : Backend::Activation::kSilu;
                SCOPED_TRACE(case_name(gate_type, cols, n) + " up " + ggml_type_name(up_type) +
                             ", activation " + std::to_string(uint32_t(act)));
                const int64_t rows = 45;
                auto wg = p.tensor(gate_type, cols, rows, random_bytes(gate_type, cols, rows, 11));
                auto wu = p.tensor(up_type, cols, rows, random_bytes(up_type, cols, rows, 12));
                auto x =
                    p.tensor(GgmlType::kF32, cols, n, random_bytes(GgmlType::kF32, cols, n, 13));
                auto gated = p.tensor(GgmlType::kF32, rows, n, {});
                auto scratch = p.tensor(GgmlType::kF32, rows, n, {});
                auto three = p.tensor(GgmlType::kF32, rows, n, {});
                auto up = p.tensor(GgmlType::kF32, rows, n, {});
                p.on_each(
                    [&](Backend& be, auto pick) {
                        be.matmul_gated(act, pick(wg), pick(wu), pick(x), pick(gated),
                                        pick(scratch));
                        be.matmul(pick(wg), pick(x), pick(three), Backend::Accumulate::kNo);
                        be.matmul(pick(wu), pick(x), pick(up), Backend::Accumulate::kNo);
                        be.gated_mul(act, pick(three), pick(up), pick(three));
                        EXPECT_EQ(read_floats(be, pick(gated)), read_floats(be, pick(three)))
                            << be.info().name;
                    },
                    gate_type, n);
                expect_close(p, gated);
            }
        }
    }
}

// A normed input (Backend::normed) read by a matmul and a gated matmul gives what rms_norm and
// then the op give on the cpu. Vulkan (here on every device) leaves the norm pending and applies
// it in the matmul shader; the norm's sums then run in another order, hence the tolerance, not
// bit for bit.
TEST_P(BackendOps, MatmulOfANormedInput) {
    const bool fused = GetParam() == SPECULA_BACKEND_VULKAN;
    fuse_norms_on_vulkan();
    for (GgmlType type : epilogue_types(*p.gpu)) {
        for (int64_t cols : row_lengths(type, {96, 256})) {
            for (int64_t n : {1, 8, 19}) {
                SCOPED_TRACE(case_name(type, cols, n));
                const int64_t rows = 45;
                auto w = p.tensor(type, cols, rows, random_bytes(type, cols, rows, 21));
                auto wu = p.tensor(type, cols, rows, random_bytes(type, cols, rows, 22));
                auto x = p.tensor(GgmlType::kF32, cols, n,
                                  random_bytes(GgmlType::kF32, cols, n, 23, 3.0f));
                auto norm =
                    p.tensor(GgmlType::kF32, cols, 1, random_bytes(GgmlType::kF32, cols, 1, 24));
                auto h = p.tensor(GgmlType::kF32, cols, n, {});
                auto out = p.tensor(GgmlType::kF32, rows, n, {});
                auto gated = p.tensor(GgmlType::kF32, rows, n, {});
                auto up = p.tensor(GgmlType::kF32, rows, n, {});
                Backend& cpu = p.reference(type, n);
                cpu.rms_norm(x.first, norm.first, 1e-5f, h.first);
                cpu.matmul(w.first, h.first, out.first, Backend::Accumulate::kNo);
                cpu.matmul_gated(Backend::Activation::kSilu, w.first, wu.first, h.first,
                                 gated.first, up.first);
                const Backend::MatmulInput in =
                    p.gpu->normed(x.second, norm.second, 1e-5f, h.second);
                // Wider than a verification batch, Vulkan's tiled matmul (where the device takes
                // it) wants plain inputs: either is right there.
                if (n <= SPECULA_MAX_GAMMA + 1) {
                    EXPECT_EQ(in.has_norm(), fused);
                }
                p.gpu->matmul(w.second, in, out.second, Backend::Accumulate::kNo);
                p.gpu->matmul_gated(Backend::Activation::kSilu, w.second, wu.second, in,
                                    gated.second, up.second);
                expect_close(p, out);
                expect_close(p, gated);
            }
        }
    }
}

// A rotated product (matmul_rope: the q and k projections) equals matmul and then rope bit for
// bit on the same backend, whether the backend rotates in the matmul or not, for a plain and a
// normed input (on Vulkan with the norm inside the matmul), and the cpu's within the tolerance.
TEST_P(BackendOps, MatmulRopeIsMatmulThenRope) {
    fuse_norms_on_vulkan();
    // 3 heads of 64 rows, rotating 48 of each head's dims, at scattered positions.
    const int head_dim = 64, n_rot = 48;
    const int64_t rows = 3 * head_dim;
    const auto table_values = rope_table(100, n_rot, 10000.0f);
    auto table = p.tensor(GgmlType::kF32, n_rot, 100, as_bytes(table_values));
    std::vector<int32_t> positions(19);
    for (size_t i = 0; i < positions.size(); ++i)
        positions[i] = int32_t(i * 37 % 100);
    for (GgmlType type : epilogue_types(*p.gpu)) {
        for (int64_t n : {1, 8, 19}) {
            for (bool with_norm : {false, true}) {
                const int64_t cols = row_lengths(type, {96}).front();
                SCOPED_TRACE(case_name(type, cols, n) + (with_norm ? " normed" : ""));
                auto w = p.tensor(type, cols, rows, random_bytes(type, cols, rows, 31));
                auto x = p.tensor(GgmlType::kF32, cols, n,
                                  random_bytes(GgmlType::kF32, cols, n, 32, 3.0f));
                auto norm =
                    p.tensor(GgmlType::kF32, cols, 1, random_bytes(GgmlType::kF32, cols, 1, 33));
                auto pos = p.tensor(
                    GgmlType::kI32, n, 1,
                    as_bytes(std::vector<int32_t>(positions.begin(), positions.begin() + n)));
                auto h = p.tensor(GgmlType::kF32, cols, n, {});
                auto rotated = p.tensor(GgmlType::kF32, rows, n, {});
                auto two_ops = p.tensor(GgmlType::kF32, rows, n, {});
                p.on_each(
                    [&](Backend& be, auto pick) {
                        const Backend::MatmulInput in =
                            with_norm ? be.normed(pick(x), pick(norm), 1e-5f, pick(h))
                                      : Backend::MatmulInput(pick(x));
                        be.matmul_rope(pick(w), in, pick(rotated),
                                       {pick(pos), pick(table), head_dim, n_rot});
                        be.matmul(pick(w), in, pick(two_ops), Backend::Accumulate::kNo);
                        be.rope(pick(two_ops), pick(pos), pick(table), head_dim, n_rot);
                        EXPECT_EQ(read_floats(be, pick(rotated)), read_floats(be, pick(two_ops)))
                            << be.info().name;
                    },
                    type, n);
                expect_close(p, rotated);
            }
        }
    }
}

TEST_P(BackendOps, GetRowsEveryType) {
    for (GgmlType type : weight_types(*p.gpu)) {
        const int64_t cols = row_lengths(type, {96}).back();
        auto table = p.tensor(type, cols, 50, random_bytes(type, cols, 50, 3));
        auto ids = p.tensor(GgmlType::kI32, 5, 1, as_bytes(std::vector<int32_t>{0, 49, 7, 7, 21}));
        auto out = p.tensor(GgmlType::kF32, cols, 5, {});
        p.cpu->get_rows(table.first, ids.first, out.first);
        p.gpu->get_rows(table.second, ids.second, out.second);
        expect_close(p, out, 0.0);  // a copy: exact
    }
}

// A subset's columns (3 rows of 40: the first, the last, runs and gaps) spread over 100 columns,
// the rest filled: the same copy on every backend, and by its definition.
TEST_P(BackendOps, ExpandColumnsIsTheSameCopy) {
    std::vector<int32_t> kept, map(100, -1);  // map: each column's source column, or -1
    for (int32_t c = 0; c < 100; ++c)
        if (c == 0 || c == 99 || c % 7 < 3 || c % 11 == 5) kept.push_back(c);
    kept.resize(40);
    kept.back() = 99;
    for (size_t j = 0; j < kept.size(); ++j)
        map[size_t(kept[j])] = int32_t(j);
    auto src = p.tensor(GgmlType::kF32, 40, 3, random_bytes(GgmlType::kF32, 40, 3, 8));
    auto ids = p.tensor(GgmlType::kI32, 40, 1, as_bytes(kept));
    auto out = p.tensor(GgmlType::kF32, 100, 3, {});
    std::vector<float> s(40 * 3);
    ASSERT_TRUE(p.cpu->download(src.first, s.data()).ok());
    for (const float fill : {-std::numeric_limits<float>::infinity(), 2.5f}) {
        p.cpu->expand_columns(src.first, ids.first, fill, out.first);
        p.gpu->expand_columns(src.second, ids.second, fill, out.second);
        std::vector<float> a(100 * 3), b(a.size());
        ASSERT_TRUE(p.cpu->download(out.first, a.data()).ok());
        ASSERT_TRUE(p.gpu->download(out.second, b.data()).ok());
        EXPECT_EQ(a, b);
        for (size_t r = 0; r < 3; ++r)
            for (size_t c = 0; c < 100; ++c)
                EXPECT_EQ(a[r * 100 + c], map[c] < 0 ? fill : s[r * 40 + size_t(map[c])]);
    }
}

TEST_P(BackendOps, NormRopeAndElementwise) {
    auto x = p.tensor(GgmlType::kF32, 256, 7, random_bytes(GgmlType::kF32, 256, 7, 4));
    auto y = p.tensor(GgmlType::kF32, 256, 7, random_bytes(GgmlType::kF32, 256, 7, 5));
    auto w = p.tensor(GgmlType::kF32, 256, 1, random_bytes(GgmlType::kF32, 256, 1, 6));
    auto out = p.tensor(GgmlType::kF32, 256, 7, {});
    p.cpu->rms_norm(x.first, w.first, 1e-5f, out.first);
    p.gpu->rms_norm(x.second, w.second, 1e-5f, out.second);
    expect_close(p, out);

    for (auto act : {Backend::Activation::kSilu, Backend::Activation::kGeluTanh}) {
        p.cpu->gated_mul(act, x.first, y.first, out.first);
        p.gpu->gated_mul(act, x.second, y.second, out.second);
        expect_close(p, out);
    }
    p.cpu->copy(x.first, out.first);
    p.gpu->copy(x.second, out.second);
    expect_close(p, out, 0.0);
    p.cpu->scale(out.first, 33.941125f);  // Gemma 3 1B's sqrt(1152)
    p.gpu->scale(out.second, 33.941125f);
    expect_close(p, out, 0.0);
    p.cpu->soft_cap(out.first, 30.0f);  // Gemma 2's final logits'
    p.gpu->soft_cap(out.second, 30.0f);
    expect_close(p, out);

    // 4 heads of 64, rotating 48 of each head's dims, at scattered positions.
    const auto table = rope_table(100, 48, 10000.0f);
    auto tab = p.tensor(GgmlType::kF32, 48, 100, as_bytes(table));
    auto pos =
        p.tensor(GgmlType::kI32, 7, 1, as_bytes(std::vector<int32_t>{0, 1, 2, 50, 99, 3, 77}));
    p.cpu->rope(x.first, pos.first, tab.first, 64, 48);
    p.gpu->rope(x.second, pos.second, tab.second, 64, 48);
    expect_close(p, x);
}

TEST_P(BackendOps, LayerNormActivationsAndBias) {
    // Rows of Whisper's widths, offset from zero (a layer norm must subtract the mean).
    for (int64_t cols : {384, 512, 100}) {
        std::vector<float> xs(size_t(cols) * 5);
        std::mt19937 rng{uint32_t(cols)};
        std::normal_distribution<float> dist(3.0f, 2.0f);
        for (float& v : xs)
            v = dist(rng);
        auto x = p.tensor(GgmlType::kF32, cols, 5, as_bytes(xs));
        auto w = p.tensor(GgmlType::kF32, cols, 1, random_bytes(GgmlType::kF32, cols, 1, 7));
        auto b = p.tensor(GgmlType::kF32, cols, 1, random_bytes(GgmlType::kF32, cols, 1, 8));
        auto out = p.tensor(GgmlType::kF32, cols, 5, {});
        p.on_each([&](Backend& be, auto side) {
            be.layer_norm(side(x), side(w), side(b), 1e-5f, side(out));
        });
        expect_close(p, out);
        for (auto act : {Backend::Activation::kSilu, Backend::Activation::kGeluTanh,
                         Backend::Activation::kGeluErf}) {
            SCOPED_TRACE(uint32_t(act));
            p.on_each([&](Backend& be, auto side) { be.activate(act, side(x), side(out)); });
            expect_close(p, out);
        }
        p.on_each([&](Backend& be, auto side) { be.add_bias(side(x), side(b)); });
        expect_close(p, x);
        // A bias of x's shape: added element by element (positional embeddings).
        auto whole = p.tensor(GgmlType::kF32, cols, 5, random_bytes(GgmlType::kF32, cols, 5, 9));
        p.on_each([&](Backend& be, auto side) { be.add_bias(side(x), side(whole)); });
        expect_close(p, x);
    }
}

// F32 tensors on one backend, each in a buffer of its own that lives as long as this.
class CpuTensors {
  public:
    explicit CpuTensors(Backend& be) : be_(be) {}
    Tensor operator()(int64_t cols, int64_t rows, const std::vector<float>* values) {
        std::unique_ptr<Buffer> buf;
        EXPECT_TRUE(be_.allocate(size_t(cols * rows) * 4, &buf).ok());
        Tensor t{buf.get(), 0, GgmlType::kF32, cols, rows};
        if (values) be_.upload(t, values->data());
        keep_.push_back(std::move(buf));
        return t;
    }

  private:
    Backend& be_;
    std::vector<std::unique_ptr<Buffer>> keep_;
};

TEST_P(BackendOps, Im2colIsTheSameCopy) {
    // Whisper's two convolutions (kernel 3, padding 1): 80 mel bands at stride 1, then the width
    // at stride 2; a kernel of 5 padded by 2, and one of 4 unpadded at stride 3.
    struct Case {
        int64_t channels, frames, cols;
        Backend::Convolution conv;
    };
    for (const Case& c :
         {Case{80, 30, 256, {3, 1, 1}}, Case{64, 31, 192, {3, 2, 1}}, Case{64, 30, 192, {3, 2, 1}},
          Case{24, 17, 128, {5, 1, 2}}, Case{24, 17, 96, {4, 3, 0}}}) {
        SCOPED_TRACE("kernel " + std::to_string(c.conv.kernel) + " stride " +
                     std::to_string(c.conv.stride) + " padding " + std::to_string(c.conv.padding));
        auto x = p.tensor(GgmlType::kF32, c.channels, c.frames,
                          random_bytes(GgmlType::kF32, c.channels, c.frames, 9));
        auto out = p.tensor(GgmlType::kF32, c.cols, c.conv.out_rows(c.frames), {});
        p.on_each([&](Backend& be, auto side) { be.im2col(side(x), c.conv, side(out)); });
        expect_close(p, out, 0.0);
    }
}

TEST(CpuOps, ConvolutionIsIm2colThenMatmul) {
    // conv1d(x, w, stride, padding) by its definition against matmul(w, im2col(x)), for
    // Whisper's kernel of 3 padded by 1 and other kernels and paddings.
    auto cpu = create_cpu_backend(2);
    const int64_t C = 5, T = 9, O = 4;
    std::mt19937 rng{3};
    std::normal_distribution<float> dist;
    std::vector<float> xs(size_t(C * T));
    for (float& v : xs)
        v = dist(rng);
    CpuTensors make(*cpu);
    for (const Backend::Convolution conv :
         {Backend::Convolution{3, 1, 1}, {3, 2, 1}, {5, 1, 2}, {2, 2, 0}, {4, 1, 3}}) {
        const int64_t K = conv.kernel, rows = conv.out_rows(T);
        std::vector<float> ws(size_t(O * C * K));
        for (float& v : ws)
            v = dist(rng);
        const Tensor x = make(C, T, &xs), w = make(K * C, O, &ws),
                     cols = make(K * C, rows, nullptr), out = make(O, rows, nullptr);
        cpu->im2col(x, conv, cols);
        cpu->matmul(w, cols, out, Backend::Accumulate::kNo);
        const std::vector<float> got = read_floats(*cpu, out);
        for (int64_t t = 0; t < rows; ++t)
            for (int64_t o = 0; o < O; ++o) {
                double want = 0;
                for (int64_t c = 0; c < C; ++c)
                    for (int64_t k = 0; k < K; ++k) {
                        const int64_t src = conv.stride * t + k - conv.padding;
                        if (src >= 0 && src < T)
                            want +=
                                double(ws[size_t((o * C + c) * K + k)]) * xs[size_t(src * C + c)];
                    }
                EXPECT_NEAR(got[size_t(t * O + o)], want, 1e-5)
                    << "kernel " << K << " stride " << conv.stride << " padding " << conv.padding
                    << " t " << t;
            }
    }
}

TEST(CpuOps, LayerNormGeluAndBiasByTheirDefinitions) {
    auto cpu = create_cpu_backend(2);
    const std::vector<float> xs = {1.0f, 2.0f, 3.0f, 6.0f, -1.5f, 0.0f, 0.5f, 3.0f};
    const std::vector<float> w = {1.0f, 2.0f, 0.5f, 1.0f}, b = {0.0f, 1.0f, -1.0f, 0.25f};
    CpuTensors make(*cpu);
    const Tensor x = make(4, 2, &xs), tw = make(4, 1, &w), tb = make(4, 1, &b),
                 out = make(4, 2, nullptr);
    cpu->layer_norm(x, tw, tb, 0.0f, out);
    const std::vector<float> got = read_floats(*cpu, out);
    for (int r = 0; r < 2; ++r) {
        double mean = 0, var = 0;
        for (int i = 0; i < 4; ++i)
            mean += xs[size_t(r * 4 + i)] / 4.0;
        for (int i = 0; i < 4; ++i)
            var += (xs[size_t(r * 4 + i)] - mean) * (xs[size_t(r * 4 + i)] - mean) / 4.0;
        for (int i = 0; i < 4; ++i)
            EXPECT_NEAR(
                got[size_t(r * 4 + i)],
                (xs[size_t(r * 4 + i)] - mean) / std::sqrt(var) * w[size_t(i)] + b[size_t(i)],
                1e-5);
    }
    cpu->activate(Backend::Activation::kGeluErf, x, out);
    const std::vector<float> g = read_floats(*cpu, out);
    EXPECT_NEAR(g[0], 0.8413447, 1e-6);   // 1 * Phi(1)
    EXPECT_NEAR(g[4], -0.1002101, 1e-6);  // -1.5 * Phi(-1.5)
    EXPECT_EQ(g[5], 0.0f);
    cpu->add_bias(x, tb);
    const std::vector<float> added = read_floats(*cpu, x);
    for (size_t i = 0; i < xs.size(); ++i)
        EXPECT_EQ(added[i], xs[i] + b[i % 4]);
    cpu->add_bias(x, out);  // element by element: out still holds gelu(xs)
    const std::vector<float> twice = read_floats(*cpu, x);
    for (size_t i = 0; i < xs.size(); ++i)
        EXPECT_EQ(twice[i], added[i] + g[i]);
    cpu->scale(x, 0.3f);
    const std::vector<float> scaled = read_floats(*cpu, x);
    for (size_t i = 0; i < xs.size(); ++i)
        EXPECT_EQ(scaled[i], twice[i] * 0.3f);
    cpu->soft_cap(x, 1.5f);
    const std::vector<float> capped = read_floats(*cpu, x);
    for (size_t i = 0; i < xs.size(); ++i)
        EXPECT_NEAR(capped[i], 1.5 * std::tanh(scaled[i] / 1.5), 1e-6);
}

TEST_P(BackendOps, AttentionWithCacheAndGroupedHeads) {
    for (int head_dim : {32, 64, 128}) {
        const int n_head = 8, n_head_kv = 2, ctx = 300, pos0 = 150, n = 9;
        SCOPED_TRACE("head_dim " + std::to_string(head_dim));
        auto q = p.tensor(GgmlType::kF32, n_head * head_dim, n,
                          random_bytes(GgmlType::kF32, n_head * head_dim, n, 7));
        auto k = p.tensor(GgmlType::kF32, n_head_kv * head_dim, ctx,
                          random_bytes(GgmlType::kF32, n_head_kv * head_dim, ctx, 8));
        auto v = p.tensor(GgmlType::kF32, n_head_kv * head_dim, ctx,
                          random_bytes(GgmlType::kF32, n_head_kv * head_dim, ctx, 9));
        auto out = p.tensor(GgmlType::kF32, n_head * head_dim, n, {});
        const float scale = 1.0f / std::sqrt(float(head_dim));
        p.on_each([&](Backend& be, auto side) {
            be.attention(
                {side(q), side(k), side(v), side(out), n_head, n_head_kv, head_dim, scale, pos0});
        });
        expect_close(p, out);
    }
}

// Gemma's and Phi-3's attention: a sliding window over a cache of several key chunks (rows
// whose window starts inside a chunk, and the first rows, whose window holds every key) and
// scores large enough for the soft cap to bend them.
TEST_P(BackendOps, AttentionWithASlidingWindowAndASoftCap) {
    const int n_head = 8, n_head_kv = 2, head_dim = 64, ctx = 700, n = 9;
    const int width = n_head * head_dim, kv_width = n_head_kv * head_dim;
    auto q = p.tensor(GgmlType::kF32, width, n, random_bytes(GgmlType::kF32, width, n, 17));
    auto k =
        p.tensor(GgmlType::kF32, kv_width, ctx, random_bytes(GgmlType::kF32, kv_width, ctx, 18));
    auto v =
        p.tensor(GgmlType::kF32, kv_width, ctx, random_bytes(GgmlType::kF32, kv_width, ctx, 19));
    auto out = p.tensor(GgmlType::kF32, width, n, {});
    for (auto [pos0, window, soft_cap] :
         {std::tuple{600, 300, 0.0f}, {600, 77, 3.0f}, {0, 4, 0.0f}, {500, 0, 2.0f}}) {
        SCOPED_TRACE("pos0 " + std::to_string(pos0) + ", window " + std::to_string(window) +
                     ", soft cap " + std::to_string(soft_cap));
        const int p0 = pos0, w = window;  // (clang 14 cannot capture a structured binding)
        const float cap = soft_cap;
        p.on_each([&](Backend& be, auto side) {
            be.attention({.q = side(q),
                          .k = side(k),
                          .v = side(v),
                          .out = side(out),
                          .n_head = n_head,
                          .n_head_kv = n_head_kv,
                          .head_dim = head_dim,
                          .scale = 1.0f,
                          .pos0 = p0,
                          .window = w,
                          .soft_cap = cap});
        });
        expect_close(p, out);
    }
}

// A row's attention is the same alone as in a batch, bit for bit, over contexts of several
// key chunks: a decode step and a verification batch may take another path (CUDA spreads few
// rows' chunks over blocks) than a prompt of many rows; with a sliding window too.
TEST_P(BackendOps, AttentionOfARowIsTheSameAloneAndInABatch) {
    const int n_head = 8, n_head_kv = 2, head_dim = 64, ctx = 700, pos0 = 600, n = 64;
    const int width = n_head * head_dim, kv_width = n_head_kv * head_dim;
    auto q = p.tensor(GgmlType::kF32, width, n, random_bytes(GgmlType::kF32, width, n, 21));
    auto k =
        p.tensor(GgmlType::kF32, kv_width, ctx, random_bytes(GgmlType::kF32, kv_width, ctx, 22));
    auto v =
        p.tensor(GgmlType::kF32, kv_width, ctx, random_bytes(GgmlType::kF32, kv_width, ctx, 23));
    auto batch = p.tensor(GgmlType::kF32, width, n, {}),
         alone = p.tensor(GgmlType::kF32, width, n, {});
    Backend& gpu = *p.gpu;
    const float scale = 1.0f / std::sqrt(float(head_dim));
    for (int window : {0, 250}) {
        SCOPED_TRACE("window " + std::to_string(window));
        Backend::Attention a{.q = q.second,
                             .k = k.second,
                             .v = v.second,
                             .out = batch.second,
                             .n_head = n_head,
                             .n_head_kv = n_head_kv,
                             .head_dim = head_dim,
                             .scale = scale,
                             .pos0 = pos0,
                             .window = window,
                             .soft_cap = window > 0 ? 1.5f : 0.0f};
        gpu.attention(a);
        for (int i = 0; i < n; ++i) {
            a.q = q.second.row_range(i, 1);
            a.out = alone.second.row_range(i, 1);
            a.pos0 = pos0 + i;
            gpu.attention(a);
        }
        const auto got = read_floats(gpu, batch.second), b = read_floats(gpu, alone.second);
        EXPECT_EQ(std::memcmp(got.data(), b.data(), got.size() * sizeof(float)), 0);
    }
}

TEST_P(BackendOps, AttentionOverAFixedSetOfKeys) {
    // Whisper's: the encoder's over all 1500 positions (here 1500 keys, heads of 64), and the
    // cross-attention of a few decoder rows over the encoder's output.
    for (auto [n, keys] : {std::pair{5, 1500}, {3, 37}}) {
        const int n_head = 6, head_dim = 64, width = n_head * head_dim;
        auto q = p.tensor(GgmlType::kF32, width, n, random_bytes(GgmlType::kF32, width, n, 10));
        auto k =
            p.tensor(GgmlType::kF32, width, keys, random_bytes(GgmlType::kF32, width, keys, 11));
        auto v =
            p.tensor(GgmlType::kF32, width, keys, random_bytes(GgmlType::kF32, width, keys, 12));
        auto out = p.tensor(GgmlType::kF32, width, n, {});
        const float scale = 1.0f / std::sqrt(float(head_dim));
        const int n_keys = keys;  // (clang 14 cannot capture a structured binding)
        p.on_each([&](Backend& be, auto side) {
            be.attention({.q = side(q),
                          .k = side(k),
                          .v = side(v),
                          .out = side(out),
                          .n_head = n_head,
                          .n_head_kv = n_head,
                          .head_dim = head_dim,
                          .scale = scale,
                          .n_keys = n_keys});
        });
        expect_close(p, out);
    }
}

TEST(CpuOps, AttentionOverFixedKeysByItsDefinition) {
    // Two rows, one head of 4, three keys: every row sees all three (no causal mask).
    auto cpu = create_cpu_backend(1);
    const std::vector<float> qs = {1, 0, 0, 0, 0, 1, 0, 0};
    const std::vector<float> ks = {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0};
    const std::vector<float> vs = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    CpuTensors make(*cpu);
    const Tensor q = make(4, 2, &qs), k = make(4, 3, &ks), v = make(4, 3, &vs),
                 out = make(4, 2, nullptr);
    cpu->attention({.q = q,
                    .k = k,
                    .v = v,
                    .out = out,
                    .n_head = 1,
                    .n_head_kv = 1,
                    .head_dim = 4,
                    .scale = 1.0f,
                    .n_keys = 3});
    const std::vector<float> got = read_floats(*cpu, out);
    for (int r = 0; r < 2; ++r) {
        double w[3], sum = 0;
        for (int t = 0; t < 3; ++t) {
            double dot = 0;
            for (int d = 0; d < 4; ++d)
                dot += qs[size_t(r * 4 + d)] * ks[size_t(t * 4 + d)];
            sum += w[t] = std::exp(dot);
        }
        for (int d = 0; d < 4; ++d) {
            double want = 0;
            for (int t = 0; t < 3; ++t)
                want += w[t] / sum * vs[size_t(t * 4 + d)];
            EXPECT_NEAR(got[size_t(r * 4 + d)], want, 1e-5) << "row " << r << " dim " << d;
        }
    }
}

// Row i of Backend::Attention's output by its definition, in doubles (q, k, v as the host's
// floats of a.q, a.k and a.v): the keys the row sees, softmax of the scaled (and capped) scores.
std::vector<double> attention_by_definition(const Backend::Attention& a,
                                            const std::vector<float>& qs,
                                            const std::vector<float>& ks,
                                            const std::vector<float>& vs, int i) {
    const int width = a.n_head * a.head_dim, kv_width = a.n_head_kv * a.head_dim;
    const int group = a.n_head / a.n_head_kv, first = a.first_key(i), seen = a.keys_seen(i);
    std::vector<double> out(static_cast<size_t>(width));
    for (int h = 0; h < a.n_head; ++h) {
        const size_t kv = size_t(h / group) * size_t(a.head_dim);
        std::vector<double> w;
        double sum = 0;
        for (int t = first; t < seen; ++t) {
            double dot = 0;
            for (int d = 0; d < a.head_dim; ++d)
                dot += double(qs[size_t(i * width + h * a.head_dim + d)]) *
                       ks[size_t(t) * size_t(kv_width) + kv + size_t(d)];
            double s = double(a.scale) * dot;
            if (a.soft_cap > 0) s = a.soft_cap * std::tanh(s / a.soft_cap);
            w.push_back(std::exp(s));
            sum += w.back();
        }
        for (int d = 0; d < a.head_dim; ++d) {
            double want = 0;
            for (int t = first; t < seen; ++t)
                want +=
                    w[size_t(t - first)] / sum * vs[size_t(t) * size_t(kv_width) + kv + size_t(d)];
            out[size_t(h * a.head_dim + d)] = want;
        }
    }
    return out;
}

// Causal rows with a sliding window and a soft cap (Backend::Attention) against the definition in
// doubles, heads of whole vectors and of a vector and a tail, shared by two query heads each; a
// row alone is bit for bit the row in the batch, and a window that holds every key is none.
TEST(CpuOps, WindowedAndSoftCappedAttentionByTheirDefinitions) {
    auto cpu = create_cpu_backend(2);
    CpuTensors make(*cpu);
    const int n_head = 4, n_head_kv = 2, ctx = 60, pos0 = 37, n = 6;
    for (int head_dim : {64, 40}) {
        const int width = n_head * head_dim, kv_width = n_head_kv * head_dim;
        const std::vector<float> qs = random_floats(size_t(width) * n, 51);
        const std::vector<float> ks = random_floats(size_t(kv_width) * ctx, 52);
        const std::vector<float> vs = random_floats(size_t(kv_width) * ctx, 53);
        const Tensor q = make(width, n, &qs), k = make(kv_width, ctx, &ks),
                     v = make(kv_width, ctx, &vs), out = make(width, n, nullptr);
        for (auto [window, soft_cap] : {std::pair{5, 0.0f}, {0, 0.5f}, {19, 0.25f}, {17, 0.0f}}) {
            SCOPED_TRACE("head_dim " + std::to_string(head_dim) + ", window " +
                         std::to_string(window) + ", soft cap " + std::to_string(soft_cap));
            Backend::Attention a{.q = q,
                                 .k = k,
                                 .v = v,
                                 .out = out,
                                 .n_head = n_head,
                                 .n_head_kv = n_head_kv,
                                 .head_dim = head_dim,
                                 .scale = 0.3f,
                                 .pos0 = pos0,
                                 .window = window,
                                 .soft_cap = soft_cap};
            cpu->attention(a);
            const std::vector<float> got = read_floats(*cpu, out);
            for (int i = 0; i < n; ++i) {
                const std::vector<double> want = attention_by_definition(a, qs, ks, vs, i);
                for (int j = 0; j < width; ++j)
                    ASSERT_NEAR(got[size_t(i * width + j)], want[size_t(j)], 1e-5)
                        << "row " << i << " head " << j / head_dim << " dim " << j % head_dim;
            }
            for (int i = 0; i < n; ++i) {
                Backend::Attention row = a;
                row.q = q.row_range(i, 1);
                row.out = out.row_range(i, 1);
                row.pos0 = pos0 + i;
                cpu->attention(row);
            }
            EXPECT_EQ(read_floats(*cpu, out), got) << "rows alone";
            if (window > 0) continue;
            a.window = pos0 + n;  // every key of every row
            cpu->attention(a);
            EXPECT_EQ(read_floats(*cpu, out), got) << "a window of every key";
        }
    }
}

// The cpu takes rows of a head in blocks where every row sees the same keys: a row's result is
// bit for bit what it is alone (the verification batch of a Whisper decoder's cross-attention
// must not change its logits), for heads of whole vectors and of a vector and a tail; and it is
// the definition's, over more keys than the kernels weigh at once (their sums carried across).
TEST(CpuOps, AttentionOverFixedKeysIsTheSameForARowAloneAndInABlock) {
    auto cpu = create_cpu_backend(2);
    CpuTensors make(*cpu);
    for (int head_dim : {64, 40}) {
        SCOPED_TRACE("head_dim " + std::to_string(head_dim));
        const int n_head = 2, width = n_head * head_dim, n = 13, keys = 300;
        const std::vector<float> qs = random_floats(size_t(width) * n, 21);
        const std::vector<float> ks = random_floats(size_t(width) * keys, 22);
        const std::vector<float> vs = random_floats(size_t(width) * keys, 23);
        const Tensor q = make(width, n, &qs), k = make(width, keys, &ks),
                     v = make(width, keys, &vs), out = make(width, n, nullptr);
        Backend::Attention a{.q = q,
                             .k = k,
                             .v = v,
                             .out = out,
                             .n_head = n_head,
                             .n_head_kv = n_head,
                             .head_dim = head_dim,
                             .scale = 0.125f,
                             .n_keys = keys};
        cpu->attention(a);
        const std::vector<float> together = read_floats(*cpu, out);
        for (int r = 0; r < n; ++r) {
            const std::vector<double> want = attention_by_definition(a, qs, ks, vs, r);
            for (int j = 0; j < width; ++j)
                ASSERT_NEAR(together[size_t(r * width + j)], want[size_t(j)], 1e-5)
                    << "row " << r << " head " << j / head_dim << " dim " << j % head_dim;
        }
        for (int r = 0; r < n; ++r) {
            a.q = q.row_range(r, 1);
            a.out = out.row_range(r, 1);
            cpu->attention(a);
        }
        EXPECT_EQ(read_floats(*cpu, out), together);
    }
}

// A backend's options: what the app sets through specula_backend_params is what the backend
// does; the environment's hooks fill only the fields left AUTO, each for its own kind. Fails if
// a backend reads the environment over its options, or the options are not passed on.
TEST(BackendOptions, TheAppsChoicesHoldAndTheEnvironmentFillsTheRest) {
    const test::ScopedEnv float_inputs("SPECULA_CPU_FLOAT_INPUTS", "1");
    const test::ScopedEnv tiled("SPECULA_VULKAN_TILED", "0");
    EXPECT_EQ(resolve_options(SPECULA_BACKEND_CPU, {}).int8_inputs, SPECULA_PATH_OFF);
    const specula_backend_options int8 =
        test::with_path(&specula_backend_options::int8_inputs, true);
    EXPECT_EQ(resolve_options(SPECULA_BACKEND_CPU, int8).int8_inputs, SPECULA_PATH_ON);
    EXPECT_EQ(resolve_options(SPECULA_BACKEND_VULKAN, {}).tiled, SPECULA_PATH_OFF);
    EXPECT_EQ(resolve_options(SPECULA_BACKEND_CUDA, {}).tiled, SPECULA_PATH_AUTO);
    EXPECT_EQ(resolve_options(SPECULA_BACKEND_VULKAN, {}).int8_inputs, SPECULA_PATH_AUTO);
    // Through the factory, as specula_backend_create makes them.
    for (const specula_path path : {SPECULA_PATH_AUTO, SPECULA_PATH_ON, SPECULA_PATH_OFF}) {
        specula_backend_params params = specula_backend_default_params();
        params.kind = SPECULA_BACKEND_CPU;
        params.options.int8_inputs = path;
        std::unique_ptr<Backend> cpu;
        ASSERT_TRUE(create_backend(params, &cpu).ok());
        // AUTO: the environment's float inputs.
        EXPECT_EQ(cpu->quantizes_inputs(GgmlType::kQ8_0, 1), path == SPECULA_PATH_ON) << path;
    }
}

// supports() tells a model what the backend does: where it says the norm is applied inside the
// matmuls, normed() leaves it pending for them; where not, normed() computes it. Every backend
// present, Vulkan with its fused_norm option on and off. Fails if the answer and the path differ.
TEST(BackendSupports, NormedMatmulIsWhatNormedDoes) {
    struct Made {
        specula_backend_kind kind;
        specula_backend_options options;
    };
    std::vector<Made> backends = {
        {SPECULA_BACKEND_CPU, {}}, {SPECULA_BACKEND_CUDA, {}}, {SPECULA_BACKEND_VULKAN, {}}};
    for (const bool fused : {false, true})
        backends.push_back(
            {SPECULA_BACKEND_VULKAN, test::with_path(&specula_backend_options::fused_norm, fused)});
    int checked = 0;
    for (const Made& m : backends) {
        std::string why;
        auto be = test::try_backend(m.kind, &why, m.options);
        if (!be) continue;
        SCOPED_TRACE(be->info().name);
        std::vector<std::unique_ptr<Buffer>> keep;
        auto tensor = [&](int64_t cols, int64_t rows) {
            std::unique_ptr<Buffer> b;
            EXPECT_TRUE(be->allocate(size_t(cols * rows) * 4, &b).ok());
            Tensor t{b.get(), 0, GgmlType::kF32, cols, rows};
            keep.push_back(std::move(b));
            return t;
        };
        const Tensor x = tensor(256, 2), w = tensor(256, 1), out = tensor(256, 2);
        const Backend::MatmulInput in = be->normed(x, w, 1e-5f, out);
        EXPECT_EQ(in.has_norm(), be->supports(Backend::Op::kNormedMatmul, GgmlType::kQ8_0));
        ++checked;
    }
    EXPECT_GE(checked, 1);
}

// Weights that a model multiplies only as whole matrices (WeightUse::kMatmul) are kept only
// repacked, read straight from unaligned bytes (whisper.cpp's files do not align their tensors)
// without a copy of the file's layout: the products are those of the same bytes loaded for any
// use, the buffer no longer reads the host, and reading its rows otherwise is a status, not a
// crash. Fails if the unaligned groups are packed from the wrong rows or kept as a copy.
TEST(CpuOps, WeightsForProductsOnlyAreKeptOnlyRepacked) {
    auto cpu = create_cpu_backend(2, test::with_path(&specula_backend_options::int8_inputs, true));
    CpuTensors make(*cpu);
    const int64_t cols = 256, rows = 40, n = 3;  // two whole groups of 16 rows and a part
    for (GgmlType type : kWeightTypes) {
        if (!cpu::has_integer_kernel(type)) continue;
        SCOPED_TRACE(ggml_type_name(type));
        const std::vector<uint8_t> bytes = random_bytes(type, cols, rows, 43);
        std::vector<uint8_t> shifted(bytes.size() + 1);  // the same bytes at an odd address
        std::copy(bytes.begin(), bytes.end(), shifted.begin() + 1);
        const std::span<const uint8_t> odd(shifted.data() + 1, bytes.size());
        std::unique_ptr<Buffer> any, only;
        ASSERT_TRUE(cpu->load_weights(bytes, type, cols, rows, WeightUse::kAny, &any).ok());
        ASSERT_TRUE(cpu->load_weights(odd, type, cols, rows, WeightUse::kMatmul, &only).ok());
        EXPECT_TRUE(any->reads_host());
        EXPECT_FALSE(only->reads_host());
        const std::vector<float> xs = random_floats(size_t(cols * n), 44);
        const Tensor x = make(cols, n, &xs), out = make(rows, n, nullptr);
        cpu->matmul({any.get(), 0, type, cols, rows}, x, out, Backend::Accumulate::kNo);
        const std::vector<float> expected = read_floats(*cpu, out);
        cpu->matmul({only.get(), 0, type, cols, rows}, x, out, Backend::Accumulate::kNo);
        EXPECT_EQ(read_floats(*cpu, out), expected);

        const int32_t id = 1;
        std::unique_ptr<Buffer> id_buffer;
        ASSERT_TRUE(cpu->allocate(sizeof id, &id_buffer).ok());
        const Tensor ids{id_buffer.get(), 0, GgmlType::kI32, 1, 1};
        cpu->upload(ids, &id);
        cpu->get_rows({only.get(), 0, type, cols, rows}, ids, make(cols, 1, nullptr));
        EXPECT_EQ(cpu->flush().code(), SPECULA_ERR_INVALID_ARGUMENT);
        std::vector<uint8_t> row(bytes.size());
        EXPECT_EQ(cpu->download({only.get(), 0, type, cols, rows}, row.data()).code(),
                  SPECULA_ERR_INVALID_ARGUMENT);
        // A view at an offset is multiplied from the file's layout, which it does not keep.
        const Tensor view = Tensor{only.get(), 0, type, cols, rows}.row_range(16, 16);
        cpu->matmul(view, x, make(16, n, nullptr), Backend::Accumulate::kNo);
        EXPECT_EQ(cpu->flush().code(), SPECULA_ERR_INVALID_ARGUMENT);
    }
}

// A prompt's inputs are quantized for the integer kernels by the backend's threads, a share of
// the blocks each: a row's product is bit for bit what it is alone, however wide the batch.
TEST(CpuOps, AWideBatchOfQuantizedInputsIsEachRowAlone) {
    auto cpu = create_cpu_backend(2, test::with_path(&specula_backend_options::int8_inputs, true));
    CpuTensors make(*cpu);
    // 76800 blocks of inputs, which the threads split; the products take them 128 inputs at a
    // time (512 KiB), the last 88.
    const int64_t cols = 4096, rows = 48, n = 600;
    for (GgmlType type : kWeightTypes) {
        if (!cpu::has_integer_kernel(type)) continue;
        SCOPED_TRACE(ggml_type_name(type));
        ASSERT_TRUE(cpu->quantizes_inputs(type, n));
        const std::vector<uint8_t> bytes = random_bytes(type, cols, rows, 41);  // read in place
        std::unique_ptr<Buffer> weights;
        ASSERT_TRUE(cpu->load_weights(bytes, type, cols, rows, WeightUse::kAny, &weights).ok());
        const Tensor w{weights.get(), 0, type, cols, rows};
        const std::vector<float> xs = random_floats(size_t(cols * n), 42);
        const Tensor x = make(cols, n, &xs), out = make(rows, n, nullptr);
        cpu->matmul(w, x, out, Backend::Accumulate::kNo);
        const std::vector<float> together = read_floats(*cpu, out);
        for (int64_t r : {int64_t(0), n / 2 - 1, n / 2, n - 1}) {
            cpu->matmul(w, x.row_range(r, 1), out.row_range(r, 1), Backend::Accumulate::kNo);
            const std::vector<float> alone = read_floats(*cpu, out.row_range(r, 1));
            ASSERT_EQ(alone, std::vector<float>(together.begin() + r * rows,
                                                together.begin() + (r + 1) * rows))
                << "row " << r;
        }
    }
}

// AMX's tile multiplies (batches of 16 inputs and more, where the CPU has them) give the
// integer sums of the vector kernels: every type's product is the same floats with them and
// without, over whole tiles and the inputs past the last, written or added to what out holds.
TEST(CpuOps, AmxTilesGiveTheVectorKernelsFloats) {
    if (!cpu::amx_available()) GTEST_SKIP() << "no AMX on this CPU or system";
    std::unique_ptr<Backend> on = create_cpu_backend(
                                 2, test::with_path(&specula_backend_options::amx, true)),
                             off = create_cpu_backend(
                                 2, test::with_path(&specula_backend_options::amx, false));
    EXPECT_NE(std::string(on->info().name).find("AMX"), std::string::npos) << on->info().name;
    EXPECT_EQ(std::string(off->info().name).find("AMX"), std::string::npos) << off->info().name;
    // 2.5 groups of rows; 150 inputs: 9 tiles and 6 more, at 4096 columns in two blocks of
    // inputs (128, then 22)
    const int64_t rows = 40, n = 150;
    for (GgmlType type : kWeightTypes) {
        if (!cpu::has_integer_kernel(type)) continue;
        for (int64_t cols : row_lengths(type, {96, 4096})) {
            SCOPED_TRACE(case_name(type, cols, n));
            const std::vector<uint8_t> bytes = random_bytes(type, cols, rows, 43);
            const std::vector<float> xs = random_floats(size_t(cols * n), 44),
                                     residual = random_floats(size_t(rows * n), 45);
            std::vector<float> got[2][2];  // [amx][accumulate]
            for (int amx = 0; amx < 2; ++amx) {
                Backend& be = amx ? *on : *off;
                CpuTensors make(be);
                std::unique_ptr<Buffer> weights;
                ASSERT_TRUE(
                    be.load_weights(bytes, type, cols, rows, WeightUse::kAny, &weights).ok());
                const Tensor w{weights.get(), 0, type, cols, rows};
                const Tensor x = make(cols, n, &xs), out = make(rows, n, nullptr),
                             sum = make(rows, n, &residual);
                be.matmul(w, x, out, Backend::Accumulate::kNo);
                be.matmul(w, x, sum, Backend::Accumulate::kYes);
                got[amx][0] = read_floats(be, out);
                got[amx][1] = read_floats(be, sum);
            }
            ASSERT_EQ(got[1][0], got[0][0]);
            ASSERT_EQ(got[1][1], got[0][1]);
        }
    }
}

// The cpu backend reads causal attention's keys from a transpose it keeps beside the cache: the
// keys are the cache's as it is now, whichever op wrote into it since (an upload, a matmul into
// rows already read, a rewrite after a rollback), bit for bit what a backend that never read the
// cache before computes.
TEST(CpuOps, CausalAttentionReadsTheKeysAsTheyAreNow) {
    const int n_head = 4, n_head_kv = 2, head_dim = 32, ctx = 40;
    const int width = n_head * head_dim, kv_width = n_head_kv * head_dim;
    const std::vector<float> qs = random_floats(size_t(width) * 8, 31);
    const std::vector<float> ks = random_floats(size_t(kv_width) * ctx, 32);
    const std::vector<float> vs = random_floats(size_t(kv_width) * ctx, 33);
    const std::vector<float> other = random_floats(size_t(kv_width) * ctx, 34);
    const std::vector<float> w = random_floats(size_t(kv_width) * width, 35);
    // Attention of rows at pos0.. over the cache; `fresh`: on a backend that never saw it.
    auto attend = [&](Backend& be, CpuTensors& make, const Tensor& k, const Tensor& v, int pos0,
                      int n) {
        const Tensor q = make(width, n, &qs), out = make(width, n, nullptr);
        be.attention({.q = q,
                      .k = k,
                      .v = v,
                      .out = out,
                      .n_head = n_head,
                      .n_head_kv = n_head_kv,
                      .head_dim = head_dim,
                      .scale = 0.17f,
                      .pos0 = pos0});
        return read_floats(be, out);
    };
    auto fresh = [&](const std::vector<float>& keys, int pos0, int n) {
        auto be = create_cpu_backend(2);
        CpuTensors make(*be);
        return attend(*be, make, make(kv_width, ctx, &keys), make(kv_width, ctx, &vs), pos0, n);
    };
    auto cpu = create_cpu_backend(2);
    CpuTensors make(*cpu);
    std::vector<float> keys = ks;
    const Tensor k = make(kv_width, ctx, &keys), v = make(kv_width, ctx, &vs);
    EXPECT_EQ(attend(*cpu, make, k, v, 0, 8), fresh(keys, 0, 8));

    // Keys 3..5, read above, uploaded anew.
    std::copy_n(other.begin() + 3 * kv_width, 3 * kv_width, keys.begin() + 3 * kv_width);
    cpu->upload(k.row_range(3, 3), keys.data() + 3 * kv_width);
    EXPECT_EQ(attend(*cpu, make, k, v, 8, 2), fresh(keys, 8, 2));

    // A rollback to 6: keys 6..9 rewritten by a matmul (as a forward writes its keys), then read.
    const Tensor x = make(width, 4, &qs), wt = make(width, kv_width, &w);
    cpu->matmul(wt, x, k.row_range(6, 4), Backend::Accumulate::kNo);
    std::vector<float> written(size_t(kv_width) * 4);
    ASSERT_TRUE(cpu->download(k.row_range(6, 4), written.data()).ok());
    std::copy(written.begin(), written.end(), keys.begin() + 6 * kv_width);
    EXPECT_EQ(attend(*cpu, make, k, v, 6, 4), fresh(keys, 6, 4));
}

// Floats whose nearest halves test every branch of a rounding to F16: ties to even in the
// normal and subnormal ranges, the edges of both, overflow, infinities, NaN, zeros, and a
// sweep of bit patterns.
std::vector<float> half_rounding_cases() {
    std::vector<float> xs = {0.0f,
                             -0.0f,
                             1.0f + 0x1p-11f,
                             1.0f + 3 * 0x1p-11f,  // ties: down, up
                             -(1.0f + 0x1p-11f),
                             0x1p-25f,  // tie below the least half
                             3 * 0x1p-25f,
                             0x1p-14f - 0x1p-26f,  // subnormal tie; edge
                             0x1p-14f,
                             65504.0f,
                             65519.99f,
                             65520.0f,
                             -65520.0f,
                             1e30f,
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::denorm_min(),
                             std::numeric_limits<float>::quiet_NaN()};
    for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += 4099)
        xs.push_back(std::bit_cast<float>(uint32_t(bits)));
    return xs;
}

// round_to_half is core/fp16.h's conversion there and back, bit for bit (NaN as a NaN), on every
// instruction set this build runs here.
TEST(CpuOps, RoundToHalfIsTheNearestHalfOnEveryInstructionSet) {
    const std::vector<float> xs = half_rounding_cases();
    std::string targets = cpu::runnable_simd_targets();
    std::vector<std::string> names;
    for (size_t at = 0; at < targets.size();) {
        const size_t end = std::min(targets.find(' ', at), targets.size());
        names.push_back(targets.substr(at, end - at));
        at = end + 1;
    }
    for (const std::string& target : names) {
        ASSERT_EQ(cpu::use_simd_target(target), cpu::SimdChoice::kChosen);
        SCOPED_TRACE(target);
        std::vector<float> got = xs;
        cpu::round_to_half(got.data(), int64_t(got.size()));
        int wrong = 0;
        for (size_t i = 0; i < xs.size() && wrong < 5; ++i) {
            const float want = half_to_float(float_to_half(xs[i]));
            if (std::isnan(want) ? std::isnan(got[i])
                                 : std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want))
                continue;
            ++wrong;
            ADD_FAILURE() << std::hexfloat << xs[i] << " -> " << got[i] << ", not " << want;
        }
    }
    cpu::use_simd_target(names.front());  // the best again
}

// Keys and values exact in F16, read from the copies in halves (Attention::half_exact), give the
// floats the copies in floats give, bit for bit: a decoder's cross-attention (every row sees
// every key; 1, 5 and 37 rows) and causal rows, and after values and keys are written anew.
TEST(CpuOps, HalfExactAttentionIsTheSameFloatsAsOverFloats) {
    const int n_head = 6, head_dim = 64, width = n_head * head_dim;
    for (const int n_keys : {1500, 37, 0}) {
        SCOPED_TRACE("n_keys " + std::to_string(n_keys));
        const int ctx = n_keys > 0 ? n_keys : 300;
        auto cpu = create_cpu_backend(2);
        CpuTensors make(*cpu);
        const std::vector<float> qs = random_floats(size_t(width) * 37, 61);
        std::vector<float> ks = random_floats(size_t(width) * size_t(ctx), 62);
        std::vector<float> vs = random_floats(size_t(width) * size_t(ctx), 63);
        for (auto* x : {&ks, &vs})
            for (float& f : *x)
                f = half_to_float(float_to_half(f * 4.0f));
        const Tensor k = make(width, ctx, &ks), v = make(width, ctx, &vs);
        const auto attend = [&](int pos0, int rows, bool half_exact) {
            const Tensor q = make(width, rows, &qs), out = make(width, rows, nullptr);
            cpu->attention({.q = q,
                            .k = k,
                            .v = v,
                            .out = out,
                            .n_head = n_head,
                            .n_head_kv = n_head,
                            .head_dim = head_dim,
                            .scale = 0.125f,
                            .pos0 = pos0,
                            .n_keys = n_keys,
                            .half_exact = half_exact});
            return read_floats(*cpu, out);
        };
        for (const int rows : {1, 5, 37}) {
            const int pos0 = n_keys > 0 ? 0 : ctx - rows;
            const std::vector<float> halves = attend(pos0, rows, true);
            EXPECT_EQ(halves, attend(pos0, rows, false)) << rows << " rows";
        }
        // Values 20..29 and keys 3..5 anew, after both copies were read.
        const std::vector<float> other = random_floats(size_t(width) * 10, 64);
        for (size_t i = 0; i < other.size(); ++i)
            vs[20 * size_t(width) + i] = half_to_float(float_to_half(other[i]));
        cpu->upload(v.row_range(20, 10), vs.data() + 20 * width);
        for (size_t i = 0; i < 3 * size_t(width); ++i)
            ks[3 * size_t(width) + i] = -ks[3 * size_t(width) + i];
        cpu->upload(k.row_range(3, 3), ks.data() + 3 * width);
        const int pos0 = n_keys > 0 ? 0 : ctx - 5;
        const std::vector<float> halves = attend(pos0, 5, true);
        EXPECT_EQ(halves, attend(pos0, 5, false));
        auto fresh = create_cpu_backend(2);
        CpuTensors make_fresh(*fresh);
        const Tensor q = make_fresh(width, 5, &qs), out = make_fresh(width, 5, nullptr);
        fresh->attention({.q = q,
                          .k = make_fresh(width, ctx, &ks),
                          .v = make_fresh(width, ctx, &vs),
                          .out = out,
                          .n_head = n_head,
                          .n_head_kv = n_head,
                          .head_dim = head_dim,
                          .scale = 0.125f,
                          .pos0 = pos0,
                          .n_keys = n_keys});
        EXPECT_EQ(halves, read_floats(*fresh, out));
    }
}

// round_to_half gives the cpu's floats, bit for bit.
TEST_P(BackendOps, RoundToHalfIsTheCpus) {
    std::vector<float> xs = half_rounding_cases();
    xs.resize(xs.size() / 64 * 64);
    const auto n = int64_t(xs.size() / 64);
    auto x = p.tensor(GgmlType::kF32, 64, n, as_bytes(xs));
    p.on_each([&](Backend& be, auto side) { be.round_to_half(side(x)); });
    std::vector<float> a(xs.size()), b(xs.size());
    ASSERT_TRUE(p.cpu->download(x.first, a.data()).ok());
    ASSERT_TRUE(p.gpu->download(x.second, b.data()).ok());
    int wrong = 0;
    for (size_t i = 0; i < a.size() && wrong < 5; ++i) {
        if (std::isnan(a[i]) ? std::isnan(b[i])
                             : std::bit_cast<uint32_t>(a[i]) == std::bit_cast<uint32_t>(b[i]))
            continue;
        ++wrong;
        ADD_FAILURE() << std::hexfloat << xs[i] << ": cpu " << a[i] << ", gpu " << b[i];
    }
}

// Two backends of one kind used in turn from one thread (two GPUs, or one GPU twice): each
// backend's work runs on its own device and buffers, whatever the other did last. CUDA selects
// its device on every call for this.
TEST_P(BackendOps, TwoBackendsUsedInTurnFromOneThread) {
    std::string why;
    std::unique_ptr<Backend> other = test::try_backend(GetParam(), &why);
    ASSERT_TRUE(other) << why;
    const int64_t cols = 256, rows = 45, n = 3;
    const auto wb = random_bytes(GgmlType::kQ8_0, cols, rows, 31);
    const auto xb = random_bytes(GgmlType::kF32, cols, n, 32);
    auto w = p.tensor(GgmlType::kQ8_0, cols, rows, wb);
    auto x = p.tensor(GgmlType::kF32, cols, n, xb);
    auto out = p.tensor(GgmlType::kF32, rows, n, {});
    auto norm = p.tensor(GgmlType::kF32, cols, 1, random_bytes(GgmlType::kF32, cols, 1, 33));
    Pair second;  // the cpu and the other backend
    second.cpu = create_cpu_backend(1);
    second.gpu = std::move(other);
    auto w2 = second.tensor(GgmlType::kQ8_0, cols, rows, wb);
    auto x2 = second.tensor(GgmlType::kF32, cols, n, xb);
    auto out2 = second.tensor(GgmlType::kF32, rows, n, {});
    for (int round = 0; round < 3; ++round) {
        p.gpu->matmul(w.second, x.second, out.second, Backend::Accumulate::kNo);
        second.gpu->matmul(w2.second, x2.second, out2.second, Backend::Accumulate::kYes);
        p.gpu->rms_norm(x.second, norm.second, 1e-5f, x.second);  // changes what the next reads
        p.reference(GgmlType::kQ8_0, n)
            .matmul(w.first, x.first, out.first, Backend::Accumulate::kNo);
        second.reference(GgmlType::kQ8_0, n)
            .matmul(w2.first, x2.first, out2.first, Backend::Accumulate::kYes);
        // By the backend that read x: it knows its input changed.
        p.reference(GgmlType::kQ8_0, n).rms_norm(x.first, norm.first, 1e-5f, x.first);
    }
    expect_close(p, out);
    expect_close(second, out2, 3 * kTolerance);  // three accumulated products
}

TEST_P(BackendOps, OutOfMemoryIsAStatusAndTheBackendSurvives) {
    std::unique_ptr<Buffer> huge, small;
    const Status s = p.gpu->allocate(size_t(1) << 42, &huge);  // 4 TiB
    EXPECT_EQ(s.code(), SPECULA_ERR_OUT_OF_MEMORY) << s.message();
    EXPECT_FALSE(s.message().empty());
    ASSERT_TRUE(p.gpu->allocate(1024, &small).ok());
    EXPECT_TRUE(p.gpu->flush().ok());
    // Ops still run, and the refusal is not reported again by the next one.
    const std::vector<float> values = {1.0f, 2.0f, 3.0f, 4.0f};
    auto src = p.tensor(GgmlType::kF32, 4, 1, as_bytes(values));
    auto dst = p.tensor(GgmlType::kF32, 4, 1, {});
    p.gpu->copy(src.second, dst.second);
    EXPECT_EQ(read_floats(*p.gpu, dst.second), values);
}

// The backend of `kind` created with the path off and on, the other options `base` (both null
// where there is none, `off` null where there is none with it off; *why says why).
struct SwitchedBackends {
    std::unique_ptr<Backend> off, on;
};
SwitchedBackends backends_with_switch(specula_backend_kind kind,
                                      specula_path specula_backend_options::*path, std::string* why,
                                      specula_backend_options base = {}) {
    SwitchedBackends b;
    b.off = test::try_backend(kind, why, test::with_path(path, false, base));
    if (b.off) b.on = test::try_backend(kind, why, test::with_path(path, true, base));
    return b;
}

// Plain, gated and rotated products of random weights of `type` (and with `with_norm` one of an
// input normed inside the matmul) on both backends of p, which must give the same floats bit
// for bit (two ways of computing the same sums). The rotated product's rows are the whole
// heads of 64 among `rows`; seeds seed .. seed + 4.
void expect_matmul_variants_identical(Pair& p, GgmlType type, int64_t cols, int64_t rows, int64_t n,
                                      bool with_norm, uint32_t seed) {
    const int head_dim = 64, n_rot = 64;
    const int64_t rotated_rows = rows / head_dim * head_dim;
    const auto table_values = rope_table(32, n_rot, 10000.0f);
    auto table = p.tensor(GgmlType::kF32, n_rot, 32, as_bytes(table_values));
    auto w = p.tensor(type, cols, rows, random_bytes(type, cols, rows, seed));
    auto wu = p.tensor(type, cols, rows, random_bytes(type, cols, rows, seed + 1));
    auto x = p.tensor(GgmlType::kF32, cols, n, random_bytes(GgmlType::kF32, cols, n, seed + 2));
    auto wr = p.tensor(type, cols, rotated_rows, random_bytes(type, cols, rotated_rows, seed + 3));
    auto norm_w =
        p.tensor(GgmlType::kF32, cols, 1, random_bytes(GgmlType::kF32, cols, 1, seed + 4));
    std::vector<int32_t> positions(static_cast<size_t>(n));
    for (size_t i = 0; i < positions.size(); ++i)
        positions[i] = int32_t(i * 7 % 32);
    auto pos = p.tensor(GgmlType::kI32, n, 1, as_bytes(positions));
    auto out = p.tensor(GgmlType::kF32, rows, n, {});
    auto normed = p.tensor(GgmlType::kF32, rows, n, {});
    auto gated = p.tensor(GgmlType::kF32, rows, n, {});
    auto up = p.tensor(GgmlType::kF32, rows, n, {});
    auto rotated = p.tensor(GgmlType::kF32, rotated_rows, n, {});
    auto scratch = p.tensor(GgmlType::kF32, cols, n, {});
    p.on_each([&](Backend& be, auto pick) {
        be.matmul(pick(w), pick(x), pick(out), Backend::Accumulate::kNo);
        if (with_norm)
            be.matmul(pick(w), be.normed(pick(x), pick(norm_w), 1e-5f, pick(scratch)), pick(normed),
                      Backend::Accumulate::kNo);
        be.matmul_gated(Backend::Activation::kSilu, pick(w), pick(wu), pick(x), pick(gated),
                        pick(up));
        be.matmul_rope(pick(wr), pick(x), pick(rotated), {pick(pos), pick(table), head_dim, n_rot});
    });
    expect_close(p, out, 0.0);
    if (with_norm) expect_close(p, normed, 0.0);
    expect_close(p, gated, 0.0);
    expect_close(p, rotated, 0.0);
}

#ifdef SPECULA_HAVE_VULKAN
// With 8/16-bit storage, weights are read as halves and bytes; the 32-bit word reads (devices
// without it) must give the same floats. Both are forced here, whatever the device's default.
TEST(VulkanWeightReads, SmallStorageAndWordReadsAgreeBitForBit) {
    std::string why;
    auto [words, small] =
        backends_with_switch(SPECULA_BACKEND_VULKAN, &specula_backend_options::small_storage, &why);
    if (!words) GTEST_SKIP() << why;
    ASSERT_TRUE(small) << why;
    EXPECT_FALSE(vulkan_reads_small_storage(*words));
    if (!vulkan_reads_small_storage(*small)) GTEST_SKIP() << "no 8/16-bit storage on this device";
    Pair p{std::move(words), std::move(small), {}, {}};  // the pair's "cpu" reads words here
    for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
        for (int64_t cols : {96, 256}) {  // 96: Q4_0/Q8_0 rows that start 2-byte aligned
            for (int64_t n : {1, 70}) {   // 70: the tiled matmul
                SCOPED_TRACE(case_name(type, cols, n));
                const int64_t rows = 45;
                auto w = p.tensor(type, cols, rows, random_bytes(type, cols, rows, 1));
                auto x =
                    p.tensor(GgmlType::kF32, cols, n, random_bytes(GgmlType::kF32, cols, n, 2));
                const std::vector<int32_t> row_ids = {0, 44, 7};
                auto ids = p.tensor(GgmlType::kI32, 3, 1, as_bytes(row_ids));
                auto out = p.tensor(GgmlType::kF32, rows, n, {});
                auto rows_out = p.tensor(GgmlType::kF32, cols, 3, {});
                p.on_each([&](Backend& be, auto pick) {
                    be.matmul(pick(w), pick(x), pick(out), Backend::Accumulate::kNo);
                    be.get_rows(pick(w), pick(ids), pick(rows_out));
                });
                expect_close(p, out, 0.0);
                expect_close(p, rows_out, 0.0);
            }
        }
    }
}

// Where a driver may choose among several subgroup sizes, the matmul's pipelines require one
// (the pin_subgroup option). Pinned to the device's own size (=1 on a device of one size),
// the pipelines that require it must sum as the others do, bit for bit: plain, gated, rotated
// and with the norm applied in the matmul, every batch width, rows long enough for whole
// subgroups. The validation layer checks the pipelines' creation.
TEST(VulkanSubgroups, APinnedSizeSumsAsTheDevicesOwn) {
    std::string why;
    auto [own, pinned] =
        backends_with_switch(SPECULA_BACKEND_VULKAN, &specula_backend_options::pin_subgroup, &why);
    if (!own) GTEST_SKIP() << why;
    ASSERT_TRUE(pinned) << why;
    bool own_pinned = true, is_pinned = false;
    const uint32_t own_size = vulkan_matmul_subgroup(*own, &own_pinned);
    const uint32_t size = vulkan_matmul_subgroup(*pinned, &is_pinned);
    EXPECT_FALSE(own_pinned);
    if (!is_pinned) GTEST_SKIP() << "this device cannot require a subgroup size";
    if (own_size != size) GTEST_SKIP() << "the device's own subgroup size is not the pinned one";
    Pair p{std::move(own), std::move(pinned), {}, {}};  // the pair's "cpu" is unpinned
    // One weight type: the sums after the weight reads are the same code for every type (and
    // llvmpipe compiles each type's pipelines anew, ~15 s a type). Rows of 256 and 2048
    // weights: 32 and 128 threads per row.
    for (int64_t cols : {256, 2048}) {
        for (int64_t n : {1, 8, 17}) {
            SCOPED_TRACE(case_name(GgmlType::kQ4_0, cols, n));
            expect_matmul_variants_identical(p, GgmlType::kQ4_0, cols, 2 * 64 + 6, n, true, 51);
        }
    }
}
#endif

// CUDA's matmul kernels read their weights themselves or through shared memory in 16-byte loads
// (the staged option, the default where type and row length allow): both must give the same
// floats, plain, gated and rotated, at every batch width (each with its own rows per block),
// for the dp4a kernel and for the tensor cores' (Q8_0 and Q4_0, where the device has them).
TEST(CudaMatmulReads, StagedAndDirectGiveTheSameFloats) {
    for (const bool tensor_cores : {false, true}) {
        SCOPED_TRACE(tensor_cores ? "tensor cores" : "dp4a");
        std::string why;
        auto [direct, staged] = backends_with_switch(
            SPECULA_BACKEND_CUDA, &specula_backend_options::staged, &why,
            test::with_path(&specula_backend_options::tensor_cores, tensor_cores));
        if (!direct) GTEST_SKIP() << why;
        ASSERT_TRUE(staged) << why;
        Pair p{std::move(direct), std::move(staged), {}, {}};  // the pair's "cpu" reads directly
        // Every type: the staged ones (Q8_0, Q4_0/1, Q5_0/1, Q4_K, Q5_K) and those read directly
        // either way. Rows of whole 256-weight groups, which the staged reads need; a step of a
        // block's four warps covers 1024 weights: 256, the first warp's one step alone; 2304,
        // three steps for the first warp and two for the others (each step's loads issued while
        // the last is multiplied); 6144, six steps each. 198 rows: a last block part filled.
        for (GgmlType type : weight_types(*p.gpu)) {
            if (tensor_cores && type != GgmlType::kQ8_0 && type != GgmlType::kQ4_0)
                continue;  // the other types took matmul_kernel in the first pass
            for (int64_t cols : {256, 2304, 6144}) {
                for (int64_t n : {1, 2, 3, 8, 17}) {
                    SCOPED_TRACE(case_name(type, cols, n));
                    expect_matmul_variants_identical(p, type, cols, 3 * 64 + 6, n, false, 41);
                }
            }
        }
    }
}

// On tensor cores (the tensor_cores option, sm_80 and later) Q8_0 and Q4_0 times 8-bit
// inputs sum in another order than matmul_kernel's dp4a: a column's floats must be the same in
// every verification batch, alone (1), in one tile of 8 columns (5, 8), in two (9, 16) and past
// a slice (17), plain, gated and rotated; and the two orders agree within the tolerance.
TEST(CudaTensorCores, AColumnIsTheSameAloneAndInABatch) {
    std::string why;
    auto [dp4a, mma] =
        backends_with_switch(SPECULA_BACKEND_CUDA, &specula_backend_options::tensor_cores, &why);
    if (!dp4a) GTEST_SKIP() << why;
    ASSERT_TRUE(mma) << why;
    Pair p{std::move(dp4a), std::move(mma), {}, {}};  // the pair's "cpu" multiplies by dp4a
    const int head_dim = 64, n_rot = 64;
    const int64_t rows = 3 * 64 + 6, rotated_rows = 3 * 64, widest = kVerificationColumns;
    const auto table_values = rope_table(32, n_rot, 10000.0f);
    auto table = p.tensor(GgmlType::kF32, n_rot, 32, as_bytes(table_values));
    std::vector<int32_t> positions(static_cast<size_t>(widest));
    for (size_t i = 0; i < positions.size(); ++i)
        positions[i] = int32_t(i * 7 % 32);
    for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
        for (int64_t cols : {256, 2304}) {  // one chunk of blocks for a warp; several
            auto w = p.tensor(type, cols, rows, random_bytes(type, cols, rows, 61));
            auto wu = p.tensor(type, cols, rows, random_bytes(type, cols, rows, 62));
            auto wr =
                p.tensor(type, cols, rotated_rows, random_bytes(type, cols, rotated_rows, 63));
            const auto x_bytes = random_bytes(GgmlType::kF32, cols, widest, 64);
            std::vector<float> batch_out, batch_gated, batch_rotated;  // of the widest batch
            for (int64_t n :
                 {widest, int64_t{1}, int64_t{5}, int64_t{8}, int64_t{9}, int64_t{16}}) {
                SCOPED_TRACE(case_name(type, cols, n));
                auto x = p.tensor(GgmlType::kF32, cols, n,
                                  {x_bytes.begin(), x_bytes.begin() + n * cols * 4});
                const std::vector<int32_t> first(positions.begin(), positions.begin() + n);
                auto pos = p.tensor(GgmlType::kI32, n, 1, as_bytes(first));
                auto out = p.tensor(GgmlType::kF32, rows, n, {});
                auto gated = p.tensor(GgmlType::kF32, rows, n, {});
                auto up = p.tensor(GgmlType::kF32, rows, n, {});
                auto rotated = p.tensor(GgmlType::kF32, rotated_rows, n, {});
                p.on_each([&](Backend& be, auto pick) {
                    be.matmul(pick(w), pick(x), pick(out), Backend::Accumulate::kNo);
                    be.matmul_gated(Backend::Activation::kGeluTanh, pick(w), pick(wu), pick(x),
                                    pick(gated), pick(up));
                    be.matmul_rope(pick(wr), pick(x), pick(rotated),
                                   {pick(pos), pick(table), head_dim, n_rot});
                });
                expect_close(p, out);
                expect_close(p, gated);
                expect_close(p, rotated);
                const auto mine = [&](const std::pair<Tensor, Tensor>& t) {
                    return read_floats(*p.gpu, t.second);
                };
                if (n == widest) {
                    batch_out = mine(out);
                    batch_gated = mine(gated);
                    batch_rotated = mine(rotated);
                    continue;
                }
                const auto first_columns = [&](const std::vector<float>& v, int64_t per_column) {
                    return std::vector<float>(v.begin(), v.begin() + n * per_column);
                };
                EXPECT_EQ(mine(out), first_columns(batch_out, rows));
                EXPECT_EQ(mine(gated), first_columns(batch_gated, rows));
                EXPECT_EQ(mine(rotated), first_columns(batch_rotated, rotated_rows));
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Gpu, BackendOps,
                         ::testing::Values(SPECULA_BACKEND_VULKAN, SPECULA_BACKEND_CUDA),
                         [](const auto& info) {
                             return std::string(test::backend_name(info.param));
                         });

}  // namespace
