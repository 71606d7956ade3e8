#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "core/detmath.h"
#include "sampling/sampling.h"

using namespace specula;

namespace {

const std::vector<float> kLogits = {1.0f, 2.5f, -1.0f, 2.5f, 0.0f, 0.7f};

TEST(Sampling, GreedyTakesTheLowestIdAmongTies) {
    EXPECT_EQ(argmax(kLogits), 1);
    SamplingParams p;
    p.temperature = 0.0f;
    EXPECT_EQ(sample_token(kLogits, p, 0), 1);
}

// argmax and row_norm find their results by shortcuts (maxima by order key, candidates from
// block maxima, the race over the kept ids only); the definitions, restated plainly, must
// agree on rows full of ties, signed zeros, infinities and NaN, at vocabulary sizes that
// are no multiple of any block.
TEST(Sampling, ShortcutsMatchTheDefinitions) {
    std::mt19937 rng(11);
    auto definition_argmax = [](std::span<const float> z) {
        int32_t best = 0;
        for (size_t i = 1; i < z.size(); ++i)
            if (z[i] > z[size_t(best)]) best = int32_t(i);
        return best;
    };
    for (int trial = 0; trial < 400; ++trial) {
        const size_t n = 1 + size_t(rng() % 700);
        std::vector<float> z(n);
        for (float& v : z)
            v = float(int(rng() % 9) - 4) * 0.75f;  // few values: many ties
        const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN};
        for (int k = 0; k < 3; ++k)
            if (rng() % 4 == 0) z[rng() % n] = specials[rng() % 6];
        if (trial % 5 == 1) z[0] = specials[rng() % 6];  // NaN first: argmax is 0
        if (trial % 7 == 0) std::fill(z.begin(), z.end(), trial % 2 ? 0.0f : -0.0f);
        if (trial % 7 == 0) z[rng() % n] = trial % 2 ? -0.0f : 0.0f;
        ASSERT_EQ(argmax(z), definition_argmax(z)) << "trial " << trial;

        if (std::any_of(z.begin(), z.end(), [](float v) { return std::isnan(v) || std::isinf(v); }))
            continue;  // row_norm requires finite rows
        SamplingParams p;
        p.temperature = 0.5f + float(rng() % 4) * 0.25f;
        p.top_k = 1 + int(rng() % std::min<size_t>(n, 80));
        const float inv_t = p.inv_temperature();
        const RowNorm norm = row_norm(z, p);
        float max = -INFINITY;
        for (float v : z)
            if (v * inv_t > max) max = v * inv_t;
        ASSERT_EQ(det::to_bits(norm.max), det::to_bits(max)) << "trial " << trial;
        std::vector<uint32_t> order(n);
        std::iota(order.begin(), order.end(), 0u);
        auto key = [&](uint32_t x) { return det::order_key(z[x] * inv_t); };
        std::stable_sort(order.begin(), order.end(),
                         [&](uint32_t a, uint32_t b) { return key(a) > key(b); });
        if (size_t(p.top_k) >= n) continue;  // not cut
        std::vector<uint32_t> kept(order.begin(), order.begin() + p.top_k);
        std::sort(kept.begin(), kept.end());
        EXPECT_EQ(norm.ids, kept) << "trial " << trial;
        EXPECT_EQ(norm.cut_id, order[size_t(p.top_k) - 1]);
        EXPECT_EQ(norm.cut_key, key(norm.cut_id));
        for (uint32_t x = 0; x < n; ++x)
            EXPECT_EQ(norm.kept(key(x), x), std::binary_search(kept.begin(), kept.end(), x));
    }
}

TEST(Sampling, ProcessedDistributionIsTheScaledSoftmax) {
    SamplingParams p;
    p.temperature = 0.7f;
    const auto d = processed_distribution(kLogits, p);
    ASSERT_EQ(d.size(), kLogits.size());
    double z = 0;
    for (float l : kLogits)
        z += std::exp(double(l) / 0.7);
    for (const auto& tp : d)
        EXPECT_NEAR(tp.prob, std::exp(double(kLogits[size_t(tp.token)]) / 0.7) / z, 1e-6);
}

TEST(Sampling, TopKAndTopPCut) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 1;
    auto d = processed_distribution(kLogits, p);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].token, 1);          // of the tied maxima, the lower id
    EXPECT_FLOAT_EQ(d[0].prob, 1.0f);  // 1 / Z by Newton steps: within an ulp

    p.top_k = 3;
    d = processed_distribution(kLogits, p);
    ASSERT_EQ(d.size(), 3u);
    EXPECT_EQ(d[0].token, 0);
    EXPECT_EQ(d[1].token, 1);
    EXPECT_EQ(d[2].token, 3);

    p.top_k = 0;
    p.top_p = 1e-6f;
    d = processed_distribution(kLogits, p);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].token, 1);

    // Each of the two maxima holds 0.40 of the mass, so reaching 0.5 takes both.
    p.top_p = 0.5f;
    d = processed_distribution(kLogits, p);
    double total = 0;
    for (const auto& tp : d)
        total += tp.prob;
    EXPECT_NEAR(total, 1.0, 1e-6);
    EXPECT_EQ(d.size(), 2u);
}

// Pearson chi-square of `draws` samples of `sampler` against the processed distribution.
double chi_square(const SamplingParams& p, int draws,
                  const std::function<int32_t(uint32_t)>& sampler) {
    std::vector<int> counts(kLogits.size());
    for (int i = 0; i < draws; ++i)
        ++counts[size_t(sampler(uint32_t(i)))];
    double chi2 = 0;
    for (const auto& tp : processed_distribution(kLogits, p)) {
        const double expected = tp.prob * draws;
        chi2 += (counts[size_t(tp.token)] - expected) * (counts[size_t(tp.token)] - expected) /
                expected;
    }
    return chi2;
}

// 5 degrees of freedom; P(chi2 > 25.74) = 1e-4: a false alarm once in ten thousand runs.
constexpr double kCritical = 25.74;

TEST(Sampling, ExponentialRaceFollowsTheDistribution) {
    SamplingParams p;
    p.temperature = 1.3f;
    p.seed = 1234;
    const double chi2 =
        chi_square(p, 40000, [&](uint32_t step) { return sample_token(kLogits, p, step); });
    EXPECT_LT(chi2, kCritical);
}

TEST(Sampling, APlantedBugFailsTheSameTest) {
    // Racing p * u instead of p / E: plausible-looking, but biased toward likely tokens.
    SamplingParams p;
    p.temperature = 1.3f;
    p.seed = 1234;
    const double chi2 = chi_square(p, 40000, [&](uint32_t step) {
        int32_t best = -1;
        float best_score = -1;
        for (const auto& tp : processed_distribution(kLogits, p)) {
            const float score = tp.prob * philox_uniform(p.seed, RandomStream::kSample, step, 0,
                                                         uint32_t(tp.token));
            if (score > best_score) best = tp.token, best_score = score;
        }
        return best;
    });
    EXPECT_GT(chi2, kCritical);
}

TEST(Sampling, SameSeedAndStepGiveTheSameToken) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.seed = 99;
    int differ = 0;
    for (uint32_t step = 0; step < 64; ++step) {
        EXPECT_EQ(sample_token(kLogits, p, step), sample_token(kLogits, p, step));
        SamplingParams q = p;
        q.seed = 100;
        differ += sample_token(kLogits, p, step) != sample_token(kLogits, q, step);
    }
    EXPECT_GT(differ, 10);
}

}  // namespace

// Temperatures too small to invert safely are greedy: at 1e-38 and below, 1/T overflows the
// logits to infinities (every draw came out as token 0).
TEST(Sampling, TinyTemperaturesAreGreedy) {
    const std::vector<float> logits = {0.5f, -1.0f, 3.25f, 3.0f, -7.0f};
    for (float t : {1e-38f, 3e-39f, 1e-42f, 1e-7f}) {
        const SamplingParams p{t, 0, 1.0f, 3};
        EXPECT_TRUE(p.greedy()) << t;
        for (uint32_t step = 0; step < 20; ++step)
            EXPECT_EQ(sample_token(logits, p, step), 2) << t;
    }
    EXPECT_FALSE((SamplingParams{1e-6f, 0, 1.0f, 3}).greedy());
}
