#include "sampling/sampling.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <functional>
#include <memory>

#include "core/detmath.h"

namespace specula {

float SamplingParams::nucleus() const {
    return std::max(top_p, FLT_MIN);
}

namespace {

// det::order_key without a branch, as a signed integer (order_key - 2^31), so that loops over
// a row vectorise on every x86-64 (SSE2 compares signed integers only).
inline int32_t signed_key(float v) {
    const auto b = int32_t(det::to_bits(v));
    return b ^ ((b >> 31) & 0x7FFFFFFF);
}

// The float whose signed_key is k.
float from_signed_key(int32_t k) {
    return det::from_bits(uint32_t(k >= 0 ? k : k ^ 0x7FFFFFFF));
}

// The value of the largest order key of s(x) over the row: the row's maximum when the row
// has no NaN, else possibly a NaN (keys rank NaNs beyond the infinities).
template <class Value>
float max_by_key(uint32_t n, const Value& s) {
    int32_t best = INT32_MIN;
    for (uint32_t x = 0; x < n; ++x)
        best = std::max(best, signed_key(s(x)));
    return from_signed_key(best);
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
    // The definition: the first logit that no later one exceeds.
    auto first_maximal = [&] {
        int32_t best = 0;
        for (size_t i = 1; i < logits.size(); ++i)
            if (logits[i] > logits[size_t(best)]) best = int32_t(i);
        return best;
    };
    // Without NaN that is the lowest id equal to the maximum, which two passes find faster
    // (no load of the best logit per token); a row with a NaN takes the definition.
    const auto n = uint32_t(logits.size());
    if (n == 0) return 0;
    const float m = max_by_key(n, [&](uint32_t x) { return logits[x]; });
    const auto it = std::find(logits.begin(), logits.end(), m);
    if (std::isnan(logits[0]) || it == logits.end()) return first_maximal();
    return int32_t(it - logits.begin());
}

RowNorm row_norm(std::span<const float> logits, const SamplingParams& p) {
    const auto n = uint32_t(logits.size());
    const float inv_t = p.inv_temperature();
    auto s = [&](uint32_t x) { return logits[x] * inv_t; };
    const bool filtered = p.filtered(int(n));
    // Order keys (filtered rows rank by them), and the maxima of blocks of them.
    std::unique_ptr<uint32_t[]> keys;
    std::vector<uint32_t> maxima;
    uint32_t length = n, block = n;
    if (filtered) {
        if (p.top_k > 0 && uint32_t(p.top_k) < n) length = uint32_t(p.top_k);
        // At least 2 * length blocks (see below).
        block = std::max(1u, n / (2 * length));
        keys = std::make_unique_for_overwrite<uint32_t[]>(n);
        uint32_t* k = keys.get();
        const float* z = logits.data();
        for (uint32_t x = 0; x < n; x += block) {
            const uint32_t end = std::min(n, x + block);
            int32_t m = INT32_MIN;
            for (uint32_t i = x; i < end; ++i) {
                const int32_t key = signed_key(z[i] * inv_t);
                k[i] = uint32_t(key) ^ 0x80000000u;  // order_key
                m = std::max(m, key);
            }
            maxima.push_back(uint32_t(m) ^ 0x80000000u);
        }
    }
    RowNorm norm;
    // The definition: the first s(x) that no later one exceeds. The maximum by key is the same
    // float but where it is a zero (which sign comes first matters) or the row has a NaN.
    if (filtered) {
        int32_t m = INT32_MIN;
        for (uint32_t key : maxima)
            m = std::max(m, int32_t(key ^ 0x80000000u));
        norm.max = from_signed_key(m);
    } else {
        norm.max = max_by_key(n, s);
    }
    if (norm.max == 0.0f || std::isnan(norm.max)) {
        norm.max = -INFINITY;
        for (uint32_t x = 0; x < n; ++x)
            if (s(x) > norm.max) norm.max = s(x);
    }
    auto weight = [&](uint32_t x) { return det::exp_nonpositive(s(x) - norm.max); };

    if (filtered) {
        // Rank order (key desc, id asc); the kept set is a prefix of it, at most top_k long,
        // so only that prefix is sorted, and only tokens that can be in it are ranked: the
        // maxima of at least `length` disjoint blocks are keys of distinct tokens, so the
        // length-th largest of them bounds the length-th largest key from below.
        std::vector<uint32_t> bound(maxima);
        std::nth_element(bound.begin(), bound.begin() + (length - 1), bound.end(),
                         std::greater<>());
        const uint32_t least = bound[length - 1];
        std::vector<uint32_t> order;
        for (uint32_t b = 0; b < uint32_t(maxima.size()); ++b) {
            if (maxima[b] < least) continue;
            for (uint32_t x = b * block; x < std::min(n, (b + 1) * block); ++x)
                if (keys[x] >= least) order.push_back(x);
        }
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
        norm.ids.assign(order.begin(), order.begin() + kept);
        std::sort(norm.ids.begin(), norm.ids.end());
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
    // p(x) > 0 only for kept tokens: where the row was cut, the race runs over them alone.
    auto each_kept = [&](const auto& f) {
        if (!pn.ids.empty()) {
            for (uint32_t x : pn.ids)
                f(x);
        } else {
            for (uint32_t x = 0; x < uint32_t(p_logits.size()); ++x)
                f(x);
        }
    };
    each_kept([&](uint32_t x) {
        const float px = processed_prob(p_logits[x], x, pn, inv_t);
        if (!(px > 0.0f)) return;
        const float qx = q_logits.empty() ? 0.0f : processed_prob(q_logits[x], x, qn, inv_t);
        const float u = philox_uniform(p.seed, stream, step, row, x);
        const float ax = std::max(0.0f, px - qx);
        if (best_p >= 0 && det::race_cannot_win(px, score_p, u) &&
            (best_a < 0 ? !(ax > 0.0f) : det::race_cannot_win(ax, score_a, u)))
            return;
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
    });
    return best_a >= 0 ? best_a : std::max(best_p, 0);
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint32_t step,
                     RandomStream stream, uint32_t row) {
    if (p.greedy()) return argmax(logits);
    return residual_race(logits, row_norm(logits, p), {}, {}, p, stream, step, row);
}

}  // namespace specula
