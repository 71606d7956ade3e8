#include "sampling/sampling.h"

#include <algorithm>
#include <cfloat>
#include <numeric>

#include "core/detmath.h"

namespace specula {

float SamplingParams::nucleus() const {
    return std::max(top_p, FLT_MIN);
}

int32_t argmax(std::span<const float> logits) {
    int32_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
        if (logits[i] > logits[size_t(best)]) best = int32_t(i);
    return best;
}

RowNorm row_norm(std::span<const float> logits, const SamplingParams& p) {
    const auto n = uint32_t(logits.size());
    const float inv_t = p.inv_temperature();
    RowNorm norm;
    norm.max = -INFINITY;
    for (float z : logits)
        if (z * inv_t > norm.max) norm.max = z * inv_t;
    auto weight = [&](uint32_t x) { return det::exp_nonpositive(logits[x] * inv_t - norm.max); };
    auto key = [&](uint32_t x) { return det::order_key(logits[x] * inv_t); };

    if (p.filtered(int(n))) {
        // Rank order (key desc, id asc); the kept set is a prefix of it, at most top_k long,
        // so only that prefix is sorted.
        std::vector<uint32_t> keys(n), order(n);
        for (uint32_t x = 0; x < n; ++x)
            keys[x] = key(x);
        std::iota(order.begin(), order.end(), 0u);
        uint32_t length = n;
        if (p.top_k > 0 && uint32_t(p.top_k) < n) length = uint32_t(p.top_k);
        std::partial_sort(order.begin(), order.begin() + length, order.end(),
                          [&](uint32_t a, uint32_t b) {
                              return keys[a] > keys[b] || (keys[a] == keys[b] && a < b);
                          });
        auto cut_at = [&](uint32_t prefix) {  // the first `prefix` tokens
            RowNorm c = norm;
            c.cut_id = order[prefix - 1];
            c.cut_key = keys[c.cut_id];
            return c;
        };
        // The mass of a prefix: over its tokens alone where it is short (the same float).
        std::vector<uint32_t> ids;
        auto mass = [&](uint32_t prefix) {
            if (prefix * 8 > n) {
                const RowNorm c = cut_at(prefix);
                return det::canonical_sum(
                    n, [&](uint32_t x) { return c.kept(keys[x], x) ? weight(x) : 0.0f; });
            }
            ids.assign(order.begin(), order.begin() + prefix);
            std::sort(ids.begin(), ids.end());
            return det::canonical_sum_sparse(n, ids, weight);
        };
        uint32_t kept = length;
        if (p.top_p < 1.0f) {
            // The shortest prefix whose mass reaches top_p * mass(top-k set); mass grows
            // monotonically with the prefix (rounding is monotone), so bisect.
            const float target = p.nucleus() * mass(length);
            uint32_t lo = 0, hi = length;  // mass(prefix lo) < target <= mass(prefix hi)
            while (hi - lo > 1) {
                const uint32_t mid = lo + (hi - lo) / 2;
                (mass(mid) >= target ? hi : lo) = mid;
            }
            kept = hi;
        }
        norm = cut_at(kept);
        norm.inv_sum = det::reciprocal(mass(kept));
        return norm;
    }
    norm.inv_sum = det::reciprocal(det::canonical_sum(n, weight));
    return norm;
}

float processed_prob(float z, uint32_t x, const RowNorm& norm, float inv_temperature) {
    const float s = z * inv_temperature;
    if (!norm.kept(det::order_key(s), x)) return 0.0f;
    return det::exp_nonpositive(s - norm.max) * norm.inv_sum;
}

std::vector<TokenProb> processed_distribution(std::span<const float> logits,
                                              const SamplingParams& p) {
    const RowNorm norm = row_norm(logits, p);
    std::vector<TokenProb> out;
    for (size_t x = 0; x < logits.size(); ++x) {
        const float prob = processed_prob(logits[x], uint32_t(x), norm, p.inv_temperature());
        if (prob > 0.0f) out.push_back({int32_t(x), prob});
    }
    return out;
}

int32_t exponential_race(std::span<const TokenProb> candidates, uint64_t seed, RandomStream stream,
                         uint32_t step, uint32_t row) {
    int32_t best = -1;
    float best_score = 0.0f;
    for (const TokenProb& c : candidates) {
        if (!(c.prob > 0.0f)) continue;
        const float u = philox_uniform(seed, stream, step, row, uint32_t(c.token));
        if (best >= 0 && det::race_cannot_win(c.prob, best_score, u)) continue;
        const float score = c.prob * det::race_weight(u);
        if (best < 0 || score > best_score) {
            best = c.token;
            best_score = score;
        }
    }
    return best;
}

int32_t residual_race(std::span<const float> p_logits, const RowNorm& pn,
                      std::span<const float> q_logits, const RowNorm& qn, const SamplingParams& p,
                      RandomStream stream, uint32_t step, uint32_t row) {
    const float inv_t = p.inv_temperature();
    int32_t best_a = -1, best_p = -1;
    float score_a = 0.0f, score_p = 0.0f;
    for (uint32_t x = 0; x < uint32_t(p_logits.size()); ++x) {
        const float px = processed_prob(p_logits[x], x, pn, inv_t);
        if (!(px > 0.0f)) continue;
        const float qx = q_logits.empty() ? 0.0f : processed_prob(q_logits[x], x, qn, inv_t);
        const float u = philox_uniform(p.seed, stream, step, row, x);
        const float ax = std::max(0.0f, px - qx);
        if (best_p >= 0 && det::race_cannot_win(px, score_p, u) &&
            (best_a < 0 ? !(ax > 0.0f) : det::race_cannot_win(ax, score_a, u)))
            continue;
        const float w = det::race_weight(u);
        const float a = ax * w, b = px * w;
        if (a > 0.0f && (best_a < 0 || a > score_a)) {
            best_a = int32_t(x);
            score_a = a;
        }
        if (best_p < 0 || b > score_p) {
            best_p = int32_t(x);
            score_p = b;
        }
    }
    return best_a >= 0 ? best_a : std::max(best_p, 0);
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint32_t step,
                     RandomStream stream, uint32_t row) {
    if (p.greedy()) return argmax(logits);
    return residual_race(logits, row_norm(logits, p), {}, {}, p, stream, step, row);
}

}  // namespace specula
