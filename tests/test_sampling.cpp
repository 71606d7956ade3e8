#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "backend/cpu/kernels.h"
#include "core/detmath.h"
#include "sampling/row_kernels.h"
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
// strided maxima, the race over the kept ids only); the definitions, restated plainly, must
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

// Top-p by its definition (sampling.h): the shortest prefix of the ranking whose canonical mass
// reaches top_p times the top-k set's, every prefix's mass summed over the whole row. Rows whose
// likely tokens sit together at low ids (as in a BPE vocabulary), rows of ties, rows where
// rounding decides, with and without top-k.
TEST(Sampling, TopPKeepsTheShortestPrefixReachingItsMass) {
    std::mt19937 rng(23);
    for (int trial = 0; trial < 300; ++trial) {
        const uint32_t n = 1 + rng() % (trial % 3 == 0 ? 300 : 2500);
        std::vector<float> z(n);
        std::normal_distribution<float> wide(0.0f, 3.0f);
        for (uint32_t x = 0; x < n; ++x) {
            switch (trial % 4) {
                case 0:  // likely tokens first
                    z[x] = 8.0f - 12.0f * float(x) / float(n) + wide(rng) * 0.3f;
                    break;
                case 1:  // ties
                    z[x] = float(int(rng() % 6)) * 0.5f;
                    break;
                default:
                    z[x] = wide(rng);
            }
        }
        SamplingParams p;
        p.temperature = 0.5f + float(rng() % 4) * 0.25f;
        p.top_k = trial % 5 == 0 ? 0 : 1 + int(rng() % std::min<uint32_t>(n, 120));
        p.top_p = trial % 7 == 0 ? 0.999f : 0.05f + float(rng() % 90) * 0.01f;
        const float inv_t = p.inv_temperature();
        std::vector<uint32_t> order(n);
        std::iota(order.begin(), order.end(), 0u);
        auto key = [&](uint32_t x) { return det::order_key(z[x] * inv_t); };
        std::stable_sort(order.begin(), order.end(),
                         [&](uint32_t a, uint32_t b) { return key(a) > key(b); });
        float max = -INFINITY;
        for (float v : z)
            max = std::max(max, v * inv_t);
        std::vector<uint32_t> rank(n);
        for (uint32_t i = 0; i < n; ++i)
            rank[order[i]] = i;
        auto mass = [&](uint32_t prefix) {
            return det::canonical_sum(n, [&](uint32_t x) {
                return rank[x] < prefix ? det::exp_nonpositive(z[x] * inv_t - max) : 0.0f;
            });
        };
        const uint32_t length = p.top_k > 0 ? std::min(n, uint32_t(p.top_k)) : n;
        if (trial % 2 == 1 && length > 2) {
            // A top_p whose target is exactly some prefix's mass: the answer then hangs on
            // rounding, where any other order of addition may miss it by a token.
            const float whole = mass(length), at = mass(1 + rng() % (length - 1));
            float q = at / whole;
            for (int step = 0; step < 64 && q * whole != at; ++step)
                q = std::nextafter(q, q * whole < at ? 2.0f : 0.0f);
            if (q * whole == at && q < 1.0f) p.top_p = q;
        }
        const float target = p.nucleus() * mass(length);
        uint32_t lo = 0, hi = length;  // mass(lo) < target <= mass(hi), by bisection
        while (hi - lo > 1) {
            const uint32_t mid = lo + (hi - lo) / 2;
            (mass(mid) >= target ? hi : lo) = mid;
        }
        const RowNorm norm = row_norm(z, p);
        SCOPED_TRACE(::testing::Message() << "trial " << trial << " n " << n << " k " << p.top_k
                                          << " p " << p.top_p << " kept " << hi);
        ASSERT_EQ(det::to_bits(norm.inv_sum), det::to_bits(det::reciprocal(mass(hi))));
        for (uint32_t x = 0; x < n; ++x)
            ASSERT_EQ(norm.kept(key(x), x), hi == n || rank[x] < hi) << x;
        if (hi < n) {
            std::vector<uint32_t> kept(order.begin(), order.begin() + hi);
            std::sort(kept.begin(), kept.end());
            EXPECT_EQ(norm.ids, kept);
        }
    }
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

namespace {

// The races of rows::residual_races restated from their definitions, token by token.
rows::Races races_by_definition(const rows::Row& p, const rows::Row* q, uint32_t n, uint64_t seed,
                                uint32_t stream, uint32_t step, uint32_t row) {
    auto prob = [](const rows::Row& r, uint32_t x) {
        const float s = r.z[x] * r.inv_t;
        const uint32_t key = det::order_key(s);
        const bool kept = key > r.cut_key || (key == r.cut_key && x <= r.cut_id);
        return kept ? det::exp_nonpositive(s - r.max) * r.inv_sum : 0.0f;
    };
    rows::Races out;
    float score_a = 0.0f, score_p = 0.0f;
    for (uint32_t x = 0; x < n; ++x) {
        const float px = prob(p, x);
        if (!(px > 0.0f)) continue;
        const float qx = q ? prob(*q, x) : 0.0f;
        const float w = det::race_weight(philox_uniform(seed, RandomStream(stream), step, row, x));
        const float a = std::max(0.0f, px - qx) * w, b = px * w;
        if (a > 0.0f && (out.best_a < 0 || a > score_a)) out.best_a = int32_t(x), score_a = a;
        if (out.best_p < 0 || b > score_p) out.best_p = int32_t(x), score_p = b;
    }
    return out;
}

}  // namespace

// The vectorised row kernels compute their scalar definitions bit for bit on every
// instruction set this build runs here (NEON under qemu): rows of many lengths (past and
// inside whole vectors and tiles), ties, -inf, cuts through ties, with and without a q row.
TEST(Sampling, RowKernelsAreTheirDefinitionsOnEveryInstructionSet) {
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
        std::mt19937 rng(5);
        for (const uint32_t n : {1u, 7u, 16u, 17u, 63u, 255u, 1000u, 4096u, 4097u, 9001u}) {
            SCOPED_TRACE(n);
            std::normal_distribution<float> z(0.0f, 3.0f), noise(0.0f, 0.5f);
            std::vector<float> pz(n), qz(n);
            for (uint32_t x = 0; x < n; ++x) {
                pz[x] = x % 11 == 3 ? std::round(z(rng)) : z(rng);  // ties
                if (x % 97 == 5) pz[x] = -INFINITY;
                qz[x] = pz[x] + noise(rng);
            }
            const float inv_t = 1.25f;
            // keys, maxima and the ids at or above a key
            std::vector<uint32_t> keys(n), maxima(n), ids(n + 64);
            int32_t want_max = INT32_MIN;
            for (uint32_t x = 0; x < n; ++x)
                want_max = std::max(want_max, int32_t(det::order_key(pz[x] * inv_t) ^ 0x80000000u));
            EXPECT_EQ(rows::max_signed_key(pz.data(), n, inv_t), want_max);
            // first_equal is std::find: each value's first place, -0 for +0, NaN nowhere
            for (const uint32_t at : {0u, n / 3, n - 1}) {
                const float v = pz[at] == 0.0f ? -pz[at] : pz[at];
                EXPECT_EQ(rows::first_equal(pz.data(), n, v),
                          uint32_t(std::find(pz.begin(), pz.end(), v) - pz.begin()));
            }
            EXPECT_EQ(rows::first_equal(pz.data(), n, 1e30f), n);
            EXPECT_EQ(rows::first_equal(pz.data(), n, NAN), n);
            EXPECT_EQ(rows::order_keys(pz.data(), n, inv_t, keys.data()), want_max);
            for (uint32_t x = 0; x < n; ++x)
                ASSERT_EQ(keys[x], det::order_key(pz[x] * inv_t)) << x;
            for (const uint32_t m : {1u, 1 + n / 9, std::min(n, 80u), n}) {
                rows::strided_maxima(keys.data(), n, m, maxima.data());
                for (uint32_t j = 0; j < m; ++j) {
                    uint32_t want = 0;
                    for (uint32_t x = j; x < n; x += m)
                        want = std::max(want, keys[x]);
                    ASSERT_EQ(maxima[j], want) << "m " << m << " set " << j;
                }
            }
            const uint32_t least = keys[rng() % n];
            std::vector<uint32_t> want_ids;
            for (uint32_t x = 0; x < n; ++x)
                if (keys[x] >= least) want_ids.push_back(x);
            ids.resize(rows::ids_with_key_at_least(keys.data(), n, least, ids.data()));
            EXPECT_EQ(ids, want_ids);
            // sums and races, uncut and cut at a token's key (ties cut inside)
            const float max = *std::max_element(pz.begin(), pz.end()) * inv_t;
            for (int cut = 0; cut < 2; ++cut) {
                rows::Row p{pz.data(), inv_t, max};
                if (cut) {
                    const uint32_t at = rng() % n;
                    p.cut_key = keys[at];
                    p.cut_id = at;
                }
                const float sum = det::canonical_sum(n, [&](uint32_t x) {
                    const uint32_t key = keys[x];
                    const bool kept = key > p.cut_key || (key == p.cut_key && x <= p.cut_id);
                    return kept ? det::exp_nonpositive(pz[x] * inv_t - max) : 0.0f;
                });
                EXPECT_EQ(det::to_bits(rows::kept_weight_sum(p, n)), det::to_bits(sum)) << cut;
                p.inv_sum = sum > 0.0f ? det::reciprocal(sum) : 1.0f;
                rows::Row q{qz.data(), inv_t, max + 0.5f};
                q.inv_sum = det::reciprocal(rows::kept_weight_sum(q, n));
                for (uint32_t step = 0; step < 3; ++step) {
                    for (const rows::Row* qr : {static_cast<const rows::Row*>(nullptr),
                                                static_cast<const rows::Row*>(&q)}) {
                        const rows::Races got = rows::residual_races(p, qr, n, 77, 4, step, 2);
                        const rows::Races want = races_by_definition(p, qr, n, 77, 4, step, 2);
                        EXPECT_EQ(got.best_a, want.best_a) << "step " << step;
                        EXPECT_EQ(got.best_p, want.best_p) << "step " << step;
                    }
                }
            }
        }
    }
    cpu::use_simd_target(names.front());  // the best again
}

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
