// fp16 conversion, quantized block layouts and the Philox generator.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <set>

#include "core/detmath.h"
#include "core/fp16.h"
#include "core/philox.h"
#include "format/quant.h"

using namespace specula;

TEST(Fp16, EveryHalfRoundTrips) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = half_to_float(uint16_t(h));
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f))));
        } else {
            EXPECT_EQ(float_to_half(f), uint16_t(h)) << h;
        }
    }
}

TEST(Fp16, RoundsToNearestEven) {
    EXPECT_EQ(half_to_float(0x3c00), 1.0f);
    EXPECT_EQ(float_to_half(1.0f + 0x1.0p-11f), 0x3c00);  // halfway, even stays
    EXPECT_EQ(float_to_half(1.0f + 0x1.8p-11f), 0x3c01);
    EXPECT_EQ(float_to_half(65520.0f), 0x7c00);    // overflows to infinity
    EXPECT_EQ(float_to_half(0x1.0p-25f), 0x0000);  // halfway to the smallest subnormal: even
    EXPECT_EQ(float_to_half(0x1.8p-25f), 0x0001);
    EXPECT_EQ(half_to_float(0x0001), 0x1.0p-24f);
}

TEST(Quant, Q8_0MatchesItsDefinition) {
    std::vector<float> x(64);
    for (size_t i = 0; i < x.size(); ++i)
        x[i] = std::sin(float(i)) * 3.0f;
    std::vector<BlockQ8_0> q(2);
    quantize_row(GgmlType::kQ8_0, x.data(), q.data(), 64);
    std::vector<float> y(64);
    dequantize_row(GgmlType::kQ8_0, q.data(), y.data(), 64);
    for (size_t b = 0; b < 2; ++b) {
        const float d = half_to_float(q[b].scale);
        int max_q = 0;
        for (int j = 0; j < 32; ++j) {
            EXPECT_EQ(y[b * 32 + size_t(j)], d * float(q[b].quants[j]));
            EXPECT_NEAR(y[b * 32 + size_t(j)], x[b * 32 + size_t(j)], d * 0.51f + 1e-3f);
            max_q = std::max(max_q, std::abs(int(q[b].quants[j])));
        }
        EXPECT_EQ(max_q, 127);
    }
}

TEST(Quant, Q4_0NibbleLayout) {
    // Element j lives in the low nibble of byte j, element j+16 in the high nibble.
    BlockQ4_0 b{};
    b.scale = float_to_half(0.5f);
    for (int j = 0; j < 16; ++j)
        b.quants[j] = uint8_t(j | ((15 - j) << 4));
    std::vector<float> y(32);
    dequantize_row(GgmlType::kQ4_0, &b, y.data(), 32);
    for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(y[size_t(j)], 0.5f * float(j - 8));
        EXPECT_EQ(y[size_t(j) + 16], 0.5f * float(7 - j));
    }
}

TEST(Quant, Q4_0RoundTripError) {
    std::vector<float> x(32);
    for (size_t i = 0; i < x.size(); ++i)
        x[i] = float(i) - 20.0f;
    BlockQ4_0 b{};
    quantize_row(GgmlType::kQ4_0, x.data(), &b, 32);
    std::vector<float> y(32);
    dequantize_row(GgmlType::kQ4_0, &b, y.data(), 32);
    const float d = std::fabs(half_to_float(b.scale));
    EXPECT_EQ(y[0], -20.0f);  // the extreme value maps exactly to -8 d
    for (size_t i = 0; i < 32; ++i)
        EXPECT_LE(std::fabs(y[i] - x[i]), d * 0.5f + 1e-4f) << i;
}

// Known-answer vectors of the Random123 reference implementation (kat_vectors).
TEST(Philox, KnownAnswers) {
    EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
              (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
    EXPECT_EQ(
        philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
        (PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
    EXPECT_EQ(
        philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
        (PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, UniformsAreInsideTheOpenInterval) {
    EXPECT_GT(uniform_from_bits(0), 0.0f);
    EXPECT_LT(uniform_from_bits(0xffffffffu), 1.0f);
    double sum = 0;
    const int n = 100000;
    std::set<float> distinct;
    for (int i = 0; i < n; ++i) {
        const float u = philox_uniform(42, RandomStream::kSample, 0, 0, uint32_t(i));
        ASSERT_GT(u, 0.0f);
        ASSERT_LT(u, 1.0f);
        sum += u;
        distinct.insert(u);
    }
    EXPECT_NEAR(sum / n, 0.5, 0.005);
    EXPECT_GT(distinct.size(), size_t(n * 0.99));
    // Streams are independent draws for the same coordinates.
    EXPECT_NE(philox_uniform(42, RandomStream::kDraft, 3, 1, 7),
              philox_uniform(42, RandomStream::kResidual, 3, 1, 7));
}

// The deterministic functions need not be correctly rounded, but they must be accurate:
// sampling draws from their values.
TEST(DetMath, AccurateToAFewUlp) {
    double worst_exp = 0, worst_log = 0, worst_recip = 0;
    for (float x = -40.0f; x <= 0.0f; x += 0.0137f) {
        const double want = std::exp(double(x));
        worst_exp = std::max(worst_exp, std::fabs(det::exp_nonpositive(x) - want) / want);
    }
    EXPECT_EQ(det::exp_nonpositive(0.0f), 1.0f);
    EXPECT_EQ(det::exp_nonpositive(-40.1f), 0.0f);
    EXPECT_EQ(det::exp_nonpositive(-INFINITY), 0.0f);
    for (uint32_t i = 0; i < 200000; ++i) {
        const float u = uniform_from_bits(i * 21473u);
        const double want = std::log(double(u));
        worst_log = std::max(
            worst_log, std::fabs(det::log_positive(u) - want) / std::max(std::fabs(want), 1e-30));
        const float z = 1.0f + float(i) * 0.37f;
        worst_recip = std::max(worst_recip, std::fabs(det::reciprocal(z) * double(z) - 1.0));
    }
    std::printf("max relative error: exp %.2e, log %.2e, reciprocal %.2e\n", worst_exp, worst_log,
                worst_recip);
    EXPECT_LT(worst_exp, 5e-7);
    EXPECT_LT(worst_log, 5e-7);
    EXPECT_LT(worst_recip, 3e-7);
}

TEST(DetMath, CanonicalSumIsTheTiledTree) {
    // 5000 ones: the first tile's lanes hold 16 each, the second tile's 904 ones sit in
    // lanes 0..255 (4 in lanes < 136, 3 above); exact in floats either way.
    EXPECT_EQ(det::canonical_sum(5000, [](uint32_t) { return 1.0f; }), 5000.0f);
    // Order matters for these values, and the canonical order is fixed: pin one result.
    const float a = det::canonical_sum(9000, [](uint32_t i) { return 1.0f / float(i + 1); });
    const float b = det::canonical_sum(9000, [](uint32_t i) { return 1.0f / float(i + 1); });
    EXPECT_EQ(a, b);
    EXPECT_NEAR(a, std::log(9000.0) + 0.5772156649, 1e-4);
}
