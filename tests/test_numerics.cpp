// fp16 conversion, quantized block layouts and the Philox generator.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

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

// Every quantized type reconstructs normal data to within its precision: the root-mean-square
// error relative to the data's (measured: Q8_0 0.005, Q4_0 0.086, Q4_1 0.073, Q5_0 0.043, Q5_1
// 0.034, Q4_K 0.073, Q5_K 0.035, Q6_K 0.019); elements decoded from the wrong places are far off.
TEST(Quant, EveryTypeReconstructsWithinItsPrecision) {
    const std::map<GgmlType, double> bound = {{GgmlType::kQ8_0, 0.008}, {GgmlType::kQ4_0, 0.13},
                                              {GgmlType::kQ4_1, 0.11},  {GgmlType::kQ5_0, 0.065},
                                              {GgmlType::kQ5_1, 0.05},  {GgmlType::kQ4_K, 0.11},
                                              {GgmlType::kQ5_K, 0.05},  {GgmlType::kQ6_K, 0.03}};
    std::mt19937 rng(9);
    std::normal_distribution<float> dist(0.5f, 1.0f);  // off-centre: the Q*_1 / K mins matter
    std::vector<float> x(1024), y(x.size());
    for (float& v : x)
        v = dist(rng);
    for (auto [type, max_error] : bound) {
        SCOPED_TRACE(ggml_type_name(type));
        const GgmlTypeTraits* traits = ggml_type_traits(type);
        std::vector<uint8_t> q(x.size() / traits->block_size * traits->block_bytes);
        quantize_row(type, x.data(), q.data(), x.size());
        dequantize_row(type, q.data(), y.data(), y.size());
        double err = 0, norm = 0;
        for (size_t i = 0; i < x.size(); ++i) {
            err += double(y[i] - x[i]) * double(y[i] - x[i]);
            norm += double(x[i]) * double(x[i]);
        }
        EXPECT_LE(std::sqrt(err / norm), max_error);
    }
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

// The canonical order restated here independently: tiles of 4096, lane l of a tile adds
// elements l, l + 256, ... in order, lanes and then tiles are summed by a halving tree.
float canonical_order_by_hand(const std::vector<float>& v) {
    auto tree = [](std::vector<float> x) {
        for (size_t half = x.size() / 2; half > 0; half /= 2)
            for (size_t i = 0; i < half; ++i)
                x[i] = x[i] + x[i + half];
        return x[0];
    };
    std::vector<float> tiles(256, 0.0f);
    for (size_t t = 0; t * 4096 < v.size(); ++t) {
        std::vector<float> lanes(256, 0.0f);
        for (size_t i = t * 4096; i < std::min(v.size(), (t + 1) * 4096); ++i)
            lanes[i % 256] = lanes[i % 256] + v[i];
        tiles[t] = tree(lanes);
    }
    return tree(tiles);
}

TEST(DetMath, CanonicalSumIsTheTiledTree) {
    // Values whose float sum depends on the order, between lanes and between tiles: tile 2
    // is tile 0 negated, so the two cancel exactly only where the tree pairs them first;
    // summed in another order, the small tiles 1 and 3 are lost against 1e8.
    std::vector<float> v(3 * 4096 + 500);
    for (size_t i = 0; i < v.size(); ++i) {
        const size_t tile = i / 4096, j = i % 4096;
        const float large = 1e8f / 4096.0f * (1.0f + float(j % 13) / 7.0f);
        v[i] = tile == 0 ? large : tile == 2 ? -v[j] : 1e-4f / float(j + 1);
    }
    float left_to_right = 0.0f;
    for (float x : v)
        left_to_right += x;
    const float canonical =
        det::canonical_sum(uint32_t(v.size()), [&](uint32_t i) { return v[i]; });
    EXPECT_EQ(canonical, canonical_order_by_hand(v));
    EXPECT_NE(canonical, left_to_right);  // so the comparison above can fail
}

TEST(DetMath, SparseCanonicalSumIsTheDenseOne) {
    uint64_t state = 12345;
    auto next = [&] {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return uint32_t(state >> 33);
    };
    for (uint32_t n : {7u, 300u, 4096u, 9000u, 151936u}) {
        for (uint32_t count : {1u, 40u, 1000u}) {
            std::set<uint32_t> chosen;
            while (chosen.size() < std::min(count, n))
                chosen.insert(next() % n);
            std::vector<float> v(n, 0.0f);
            for (uint32_t i : chosen)  // positive, spread over many magnitudes
                v[i] = std::ldexp(float(next() % 1000 + 1), -int(next() % 40));
            const std::vector<uint32_t> ids(chosen.begin(), chosen.end());
            auto value = [&](uint32_t i) { return v[i]; };
            EXPECT_EQ(det::canonical_sum_sparse(n, ids, value), det::canonical_sum(n, value))
                << "n = " << n << ", " << count << " nonzero";
        }
    }
}
