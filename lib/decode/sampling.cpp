#include "decode/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace specula {

int32_t argmax(std::span<const float> logits) {
    int32_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
        if (logits[i] > logits[size_t(best)]) best = int32_t(i);
    return best;
}

std::vector<TokenProb> processed_distribution(std::span<const float> logits,
                                              const SamplingParams& p) {
    const size_t n = logits.size();
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    // Descending logit, ties to the lower id: one total order used by top-k and top-p alike.
    auto before = [&](int32_t a, int32_t b) {
        return logits[size_t(a)] > logits[size_t(b)] ||
               (logits[size_t(a)] == logits[size_t(b)] && a < b);
    };
    // Only top-k and top-p need the order; plain temperature sampling skips the sort.
    size_t keep = n;
    if (p.top_k > 0 && size_t(p.top_k) < n) {
        keep = size_t(p.top_k);
        std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(keep), order.end(), before);
    } else if (p.top_p < 1.0f) {
        std::sort(order.begin(), order.end(), before);
    }
    order.resize(keep);

    const float inv_t = 1.0f / p.temperature;
    float max_logit = logits[size_t(order[0])];
    for (int32_t t : order)
        max_logit = std::max(max_logit, logits[size_t(t)]);
    const float max = max_logit * inv_t;
    std::vector<float> probs(keep);
    double sum = 0.0;
    for (size_t i = 0; i < keep; ++i)
        sum += probs[i] = std::exp(logits[size_t(order[i])] * inv_t - max);
    for (float& x : probs)
        x = float(x / sum);

    if (p.top_p < 1.0f) {
        // The smallest prefix (in the order above) whose mass reaches top_p; at least one token.
        double mass = 0.0;
        size_t cut = 0;
        while (cut < keep) {
            mass += probs[cut++];
            if (mass >= double(p.top_p)) break;
        }
        keep = cut;
        for (size_t i = 0; i < keep; ++i)
            probs[i] = float(probs[i] / mass);
    }

    std::vector<TokenProb> out(keep);
    for (size_t i = 0; i < keep; ++i)
        out[i] = {order[i], probs[i]};
    if (keep < n || p.top_p < 1.0f)  // otherwise already in token order
        std::sort(out.begin(), out.end(),
                  [](const TokenProb& a, const TokenProb& b) { return a.token < b.token; });
    return out;
}

int32_t exponential_race(std::span<const TokenProb> candidates, uint64_t seed, RandomStream stream,
                         uint32_t step, uint32_t row) {
    int32_t best = -1;
    float best_score = 0.0f;
    for (const TokenProb& c : candidates) {
        if (!(c.prob > 0.0f)) continue;
        // E = -log(u) > 0 because u lies strictly inside (0, 1).
        const float e = -std::log(philox_uniform(seed, stream, step, row, uint32_t(c.token)));
        const float score = c.prob / e;
        if (best < 0 || score > best_score) {
            best = c.token;
            best_score = score;
        }
    }
    return best;
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint32_t step,
                     RandomStream stream, uint32_t row) {
    if (p.temperature <= 0.0f) return argmax(logits);
    return exponential_race(processed_distribution(logits, p), p.seed, stream, step, row);
}

}  // namespace specula
