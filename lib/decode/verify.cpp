#include "decode/verify.h"

#include <cmath>
#include <vector>

namespace specula {

namespace {

// The processed distribution as a dense vector over the vocabulary.
std::vector<float> dense(std::span<const float> logits, const SamplingParams& p) {
    std::vector<float> d(logits.size(), 0.0f);
    for (const TokenProb& tp : processed_distribution(logits, p))
        d[size_t(tp.token)] = tp.prob;
    return d;
}

std::vector<TokenProb> sparse(const std::vector<float>& weights) {
    std::vector<TokenProb> out;
    for (size_t x = 0; x < weights.size(); ++x)
        if (weights[x] > 0.0f) out.push_back({int32_t(x), weights[x]});
    return out;
}

int32_t residual_draw(const std::vector<float>& weights, const SamplingParams& p, uint32_t step,
                      int row) {
    return exponential_race(sparse(weights), p.seed, RandomStream::kResidual, step, uint32_t(row));
}

}  // namespace

VerifyResult verify(std::span<const float> target_logits, std::span<const float> draft_logits,
                    std::span<const int32_t> drafts, int n_vocab, const SamplingParams& p,
                    uint32_t step) {
    const size_t V = size_t(n_vocab);
    const int gamma = int(drafts.size());
    auto target_row = [&](int c) { return target_logits.subspan(size_t(c) * V, V); };
    auto draft_row = [&](int c) { return draft_logits.subspan(size_t(c) * V, V); };
    VerifyResult r;

    if (p.temperature <= 0.0f) {
        while (r.n_accepted < gamma &&
               argmax(target_row(r.n_accepted)) == drafts[size_t(r.n_accepted)])
            ++r.n_accepted;
        r.token = argmax(target_row(r.n_accepted));
        return r;
    }

    std::vector<float> p_row, q_row;
    for (; r.n_accepted < gamma; ++r.n_accepted) {
        const int c = r.n_accepted;
        const auto x = size_t(drafts[size_t(c)]);
        p_row = dense(target_row(c), p);
        q_row = dense(draft_row(c), p);
        const float u = philox_uniform(p.seed, RandomStream::kAccept, step, uint32_t(c), 0);
        // u < p/q without a division; q(x) > 0 because x was drawn from q.
        if (!(u * q_row[x] < p_row[x])) break;
    }
    if (r.n_accepted < gamma) {
        // Rejected: p_row and q_row hold row n. Draw from the residual max(0, p - q).
        std::vector<float> residual(V);
        for (size_t x = 0; x < V; ++x)
            residual[x] = std::max(0.0f, p_row[x] - q_row[x]);
        r.token = residual_draw(residual, p, step, r.n_accepted);
        // An all-zero residual needs p == q, under which no rejection happens; rounding
        // could still produce one, and then p itself is the right distribution.
        if (r.token < 0) r.token = residual_draw(p_row, p, step, r.n_accepted);
    } else {
        r.token = residual_draw(dense(target_row(gamma), p), p, step, gamma);
    }
    return r;
}

VerifyResult verify_sigmoid(std::span<const float> target_logits,
                            std::span<const float> draft_logits, std::span<const int32_t> drafts,
                            int n_vocab, const SamplingParams& p, const SigmoidScale& scale,
                            uint32_t step) {
    if (p.temperature <= 0.0f) return verify(target_logits, draft_logits, drafts, n_vocab, p, step);
    const size_t V = size_t(n_vocab);
    const int gamma = int(drafts.size());
    const float inv_t = 1.0f / p.temperature, inv_range = 1.0f / (scale.beta - scale.alpha);
    auto sigmoid = [&](float z) {
        return 1.0f / (1.0f + std::exp(-((z * inv_t - scale.alpha) * inv_range)));
    };
    VerifyResult r;
    for (; r.n_accepted < gamma; ++r.n_accepted) {
        const int c = r.n_accepted;
        const auto x = size_t(drafts[size_t(c)]);
        const float u = philox_uniform(p.seed, RandomStream::kAccept, step, uint32_t(c), 0);
        if (!(u * sigmoid(draft_logits[size_t(c) * V + x]) <
              sigmoid(target_logits[size_t(c) * V + x])))
            break;
    }
    if (r.n_accepted < gamma) {
        const size_t n = size_t(r.n_accepted);
        std::vector<float> residual(V);
        for (size_t x = 0; x < V; ++x)
            residual[x] = std::max(
                0.0f, sigmoid(target_logits[n * V + x]) - sigmoid(draft_logits[n * V + x]));
        r.token = residual_draw(residual, p, step, r.n_accepted);
        if (r.token >= 0) return r;
    }
    r.token = residual_draw(dense(target_logits.subspan(size_t(r.n_accepted) * V, V), p), p, step,
                            r.n_accepted);
    return r;
}

}  // namespace specula
