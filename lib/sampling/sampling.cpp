#include "sampling/sampling.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <functional>
#include <memory>

#include "core/detmath.h"
#include "sampling/row_kernels.h"

namespace specula {

float SamplingParams::nucleus() const {
    return std::max(top_p, FLT_MIN);
}

namespace {

// Rows whose kept set is at most this fraction of the vocabulary race over their kept ids one
// by one; longer ones over the whole row, a vector of tokens at a time.
constexpr uint32_t kSparseRaceFraction = 16;

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
    const float m = rows::max_value(logits.data(), n, 1.0f);
    const uint32_t at = rows::first_equal(logits.data(), n, m);
    if (std::isnan(logits[0]) || at == n) return first_maximal();
    return int32_t(at);
}

RowNorm row_norm(std::span<const float> logits, const SamplingParams& p) {
    const auto n = uint32_t(logits.size());
    const float inv_t = p.inv_temperature();
    auto s = [&](uint32_t x) { return logits[x] * inv_t; };
    const bool filtered = p.filtered(int(n));
    // Scratch reused by the calls of a thread (a row's keys and ranked ids: 16 KB and more),
    // grown, never shrunk, so that it is not refilled per call.
    thread_local std::vector<uint32_t> keys, order;
    RowNorm norm;
    // The definition: the first s(x) that no later one exceeds. The maximum by key is the same
    // float but where it is a zero (which sign comes first matters) or the row has a NaN.
    if (filtered) {
        if (keys.size() < n) keys.resize(n);
        norm.max = rows::from_signed_key(rows::order_keys(logits.data(), n, inv_t, keys.data()));
    } else {
        norm.max = rows::max_value(logits.data(), uint32_t(logits.size()), inv_t);
    }
    if (norm.max == 0.0f || std::isnan(norm.max)) {
        norm.max = -INFINITY;
        for (uint32_t x = 0; x < n; ++x)
            if (s(x) > norm.max) norm.max = s(x);
    }
    if (!filtered) {
        norm.inv_sum = det::reciprocal(rows::kept_weight_sum({logits.data(), inv_t, norm.max}, n));
        return norm;
    }
    auto weight = [&](uint32_t x) { return det::exp_nonpositive(s(x) - norm.max); };

    // Rank order (key desc, id asc); the kept set is a prefix of it, at most top_k long.
    // rank(L) sorts the first L tokens of the ranking into order[0..L), ranking only tokens that
    // can be among them: the maxima of at least L disjoint sets of tokens are keys of distinct
    // tokens, so the L-th largest of them bounds the L-th largest key from below. The sets are
    // strided (ids equal modulo m), not runs of neighbours: a vocabulary's likely tokens are
    // often near each other (a BPE vocabulary's common words have low ids), and runs would let
    // a few of them share a maximum and loosen the bound.
    const uint32_t length = p.top_k > 0 && uint32_t(p.top_k) < n ? uint32_t(p.top_k) : n;
    if (order.size() < n + 64) order.resize(n + 64);
    thread_local std::vector<uint32_t> maxima;
    const auto by_rank = [&](uint32_t a, uint32_t b) {
        return keys[a] > keys[b] || (keys[a] == keys[b] && a < b);
    };
    // The tokens that can be among the first L, ascending, into order[0..count).
    // 2L sets, rounded up to whole vectors of 16 lanes for strided_maxima.
    auto candidates = [&](uint32_t L) {
        const uint32_t m = std::min(n, (2 * L + 15) / 16 * 16);
        maxima.resize(m);
        rows::strided_maxima(keys.data(), n, m, maxima.data());
        std::nth_element(maxima.begin(), maxima.begin() + (L - 1), maxima.end(), std::greater<>());
        return rows::ids_with_key_at_least(keys.data(), n, maxima[L - 1], order.data());
    };
    uint32_t ranked = 0;  // order[0..ranked) is the ranking's start
    auto rank = [&](uint32_t L) {
        std::partial_sort(order.begin(), order.begin() + L, order.begin() + candidates(L), by_rank);
        ranked = L;
    };
    if (p.top_p >= 1.0f) {
        // Top-k alone: the kept set is the first `length` of the ranking, which only its last
        // token (found by selection, not a sort) and its mass need; the candidates come in
        // ascending order, as the sparse sum and norm.ids take them.
        const uint32_t count = candidates(length);
        norm.ids.assign(order.begin(), order.begin() + count);
        std::nth_element(order.begin(), order.begin() + (length - 1), order.begin() + count,
                         by_rank);
        norm.cut_id = order[length - 1];
        norm.cut_key = keys[norm.cut_id];
        std::erase_if(norm.ids, [&](uint32_t x) { return !norm.kept(keys[x], x); });
        norm.inv_sum = det::reciprocal(det::canonical_sum_sparse(n, norm.ids, weight));
        return norm;
    }
    auto cut_at = [&](uint32_t prefix) {  // the first `prefix` tokens
        RowNorm c = norm;
        c.cut_id = order[prefix - 1];
        c.cut_key = keys[c.cut_id];
        return c;
    };
    // The weights of the ranking's first tokens (w[i] of order[i]), computed once each, and
    // those tokens by id with their ranks (by_id, made again when the ranking grows): a short
    // prefix's mass is the sparse sum over the entries of by_id ranked below it, no sort per
    // prefix.
    thread_local std::vector<float> w, values;
    thread_local std::vector<std::pair<uint32_t, uint32_t>> by_id;
    thread_local std::vector<uint32_t> ids;
    w.clear();
    by_id.clear();
    auto weigh = [&](uint32_t prefix) {
        for (auto i = uint32_t(w.size()); i < prefix; ++i)
            w.push_back(weight(order[i]));
    };
    // The prefix's tokens ascending into ids, their weights into values.
    auto prefix_ids = [&](uint32_t prefix) {
        weigh(prefix);
        if (by_id.size() != ranked) {
            by_id.clear();
            for (uint32_t i = 0; i < ranked; ++i)
                by_id.emplace_back(order[i], i);
            std::sort(by_id.begin(), by_id.end());
        }
        ids.clear();
        values.clear();
        for (const auto& [x, i] : by_id) {
            if (i >= prefix) continue;
            ids.push_back(x);
            values.push_back(w[i]);
        }
    };
    // The mass of a prefix: the whole row's without a cut; over its tokens alone where it is
    // short (the same float); else the row's with the cut.
    auto compute_mass = [&](uint32_t prefix) {
        if (prefix == n) return rows::kept_weight_sum({logits.data(), inv_t, norm.max}, n);
        if (prefix * 8 > n) {
            const RowNorm c = cut_at(prefix);
            return rows::kept_weight_sum({logits.data(), inv_t, c.max, c.cut_key, c.cut_id}, n);
        }
        prefix_ids(prefix);
        size_t next = 0;  // canonical_sum_sparse asks for the ids' values in their order
        return det::canonical_sum_sparse(n, ids, [&](uint32_t) { return values[next++]; });
    };
    // The last masses computed (the search asks for some twice); no prefix is UINT32_MAX long.
    std::array<std::pair<uint32_t, float>, 4> recent;
    recent.fill({UINT32_MAX, 0.0f});
    size_t next_recent = 0;
    auto mass = [&](uint32_t prefix) {
        for (const auto& [at, m] : recent)
            if (at == prefix) return m;
        const float m = compute_mass(prefix);
        recent[next_recent++ % recent.size()] = {prefix, m};
        return m;
    };

    // Top-p: the shortest prefix whose mass reaches top_p * mass(top-k set); mass grows
    // monotonically with the prefix (rounding is monotone). Without top-k the ranked prefix
    // starts short and grows fourfold until its mass reaches the target: a nucleus is usually
    // a small part of the vocabulary, which is then never sorted.
    uint32_t lo = 0, hi = std::min(length, length == n ? 64u : length);
    rank(hi);
    const float target = p.nucleus() * mass(length);
    while (hi < length && mass(hi) < target) {
        lo = hi;
        hi = std::min(length, 4 * hi);
        if (hi < length) rank(hi);
    }
    if (hi == length && length == n && lo > 0) rank(std::min(n, hi));  // the whole row
    // Now mass(prefix lo) < target <= mass(prefix hi): bisect, after a guess where the prefix
    // is short. The running sum of the ranked weights (another order of addition: close, not
    // equal) points at the answer, and the exact masses at it and next to it usually settle it
    // (two masses instead of a bisection's six).
    if (hi - lo > 1 && hi * 8 <= n) {
        weigh(hi);
        uint32_t k = hi;
        double running = lo > 0 ? double(mass(lo)) : 0.0;  // the tokens before lo
        for (uint32_t i = lo; i < hi; ++i)
            if ((running += double(w[i])) >= double(target)) {
                k = i + 1;
                break;
            }
        (mass(k) >= target ? hi : lo) = k;
        const uint32_t next = hi == k ? k - 1 : k + 1;
        if (next > lo && next < hi) (mass(next) >= target ? hi : lo) = next;
    }
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        (mass(mid) >= target ? hi : lo) = mid;
    }
    const uint32_t kept = hi;
    if (kept == n) {  // nothing cut after all (top-p reached only with the whole row)
        norm.inv_sum = det::reciprocal(mass(n));
        return norm;
    }
    norm = cut_at(kept);
    norm.inv_sum = det::reciprocal(mass(kept));
    norm.ids.assign(order.begin(), order.begin() + kept);
    std::sort(norm.ids.begin(), norm.ids.end());
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
    const auto n = uint32_t(p_logits.size());
    if (pn.ids.empty() || pn.ids.size() * kSparseRaceFraction > n) {
        // The whole row, a vector of tokens at a time (the same races, bit for bit).
        const rows::Row pr{p_logits.data(), inv_t, pn.max, pn.cut_key, pn.cut_id, pn.inv_sum};
        const rows::Row qr{q_logits.data(), inv_t, qn.max, qn.cut_key, qn.cut_id, qn.inv_sum};
        const rows::Races r = rows::residual_races(pr, q_logits.empty() ? nullptr : &qr, n, p.seed,
                                                   uint32_t(stream), step, row);
        return r.best_a >= 0 ? r.best_a : std::max(r.best_p, 0);
    }
    int32_t best_a = -1, best_p = -1;
    float score_a = 0.0f, score_p = 0.0f;
    // p(x) > 0 only for kept tokens: where the row was cut, the race runs over them alone.
    std::for_each(pn.ids.begin(), pn.ids.end(), [&](uint32_t x) {
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
