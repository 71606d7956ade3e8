#include <gtest/gtest.h>

#include <cmath>
#include <functional>

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
