#include "sampling/verify.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace specula {

namespace {

std::vector<TokenProb> sparse(const std::vector<float>& weights) {
    std::vector<TokenProb> out;
    for (size_t x = 0; x < weights.size(); ++x)
        if (weights[x] > 0.0f) out.push_back({int32_t(x), weights[x]});
    return out;
}

}  // namespace

VerifyResult verify(std::span<const float> target_logits, std::span<const float> draft_logits,
                    std::span<const int32_t> drafts, int n_vocab, const SamplingParams& p,
                    uint32_t step, RandomStream stream, uint32_t row_offset) {
    const size_t V = size_t(n_vocab);
    const int gamma = int(drafts.size());
    auto target_row = [&](int c) { return target_logits.subspan(size_t(c) * V, V); };
    auto draft_row = [&](int c) { return draft_logits.subspan(size_t(c) * V, V); };
    VerifyResult r;

    if (p.greedy()) {
        while (r.n_accepted < gamma &&
               argmax(target_row(r.n_accepted)) == drafts[size_t(r.n_accepted)])
            ++r.n_accepted;
        r.token = argmax(target_row(r.n_accepted));
        return r;
    }

    const float inv_t = p.inv_temperature();
    RowNorm pn, qn;
    for (; r.n_accepted < gamma; ++r.n_accepted) {
        const int c = r.n_accepted;
        const auto x = uint32_t(drafts[size_t(c)]);
        pn = row_norm(target_row(c), p);
        qn = row_norm(draft_row(c), p);
        const float px = processed_prob(target_row(c)[x], x, pn, inv_t);
        const float qx = processed_prob(draft_row(c)[x], x, qn, inv_t);
        const float u =
            philox_uniform(p.seed, RandomStream::kAccept, step, row_offset + uint32_t(c), 0);
        // u < p/q without a division; q(x) > 0 because x was drawn from q.
        if (!(u * qx < px)) break;
    }
    const int n = r.n_accepted;
    const uint32_t row = row_offset + uint32_t(n);
    if (n < gamma)  // rejected: pn and qn are row n's
        r.token = residual_race(target_row(n), pn, draft_row(n), qn, p, stream, step, row);
    else
        r.token =
            residual_race(target_row(n), row_norm(target_row(n), p), {}, {}, p, stream, step, row);
    return r;
}

VerifyResult verify_sigmoid(std::span<const float> target_logits,
                            std::span<const float> draft_logits, std::span<const int32_t> drafts,
                            int n_vocab, const SamplingParams& p, const SigmoidScale& scale,
                            uint32_t step) {
    if (p.greedy()) return verify(target_logits, draft_logits, drafts, n_vocab, p, step);
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
        r.token = exponential_race(sparse(residual), p.seed, RandomStream::kResidual, step,
                                   uint32_t(r.n_accepted));
        if (r.token >= 0) return r;
    }
    const auto bonus_row = target_logits.subspan(size_t(r.n_accepted) * V, V);
    r.token = residual_race(bonus_row, row_norm(bonus_row, p), {}, {}, p, RandomStream::kResidual,
                            step, uint32_t(r.n_accepted));
    return r;
}

}  // namespace specula
