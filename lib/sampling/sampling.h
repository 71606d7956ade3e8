// Turning logits into a token. The processed distribution (temperature, then
// top-k, then top-p) is defined here once, in the deterministic arithmetic of
// core/detmath.h, and every backend's sampling and verify kernels compute
// exactly it (docs/DESIGN.md "Sampling and random numbers"): the same logits and seed give the same
// token on the cpu, Vulkan and CUDA backends.
//
// With s(x) = z(x) * (1 / T) and m = max s, a token's weight is
// e(x) = exp_nonpositive(s(x) - m). Tokens are ranked by (order_key(s) desc,
// id asc); top-k keeps the first k, top-p then keeps the shortest prefix whose
// canonical mass reaches top_p times the mass of the top-k set. The kept set
// is always such a prefix, so it is stored as a cut (key, id). p(x) = e(x) *
// (1 / Z) for kept x, with Z the canonical sum of e over the kept set.
//
// A token is drawn by an exponential race: argmax_x a(x) * w(x) with w(x) = 1 / E_x,
// E_x ~ Exp(1) from Philox at (seed, stream, step, row, x). That needs no sort and
// no scan, and draws x with probability a(x) / sum a for any weights a >= 0.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/philox.h"
#include "specula.h"

namespace specula {

// Temperatures below this are greedy: 1/T must stay far from overflow when it scales logits
// (below FLT_MIN it is infinite), and at 1e-6 logits 4e-5 apart already differ by more than the
// e^-40 below which a probability counts as 0, so sampling is argmax but for near-ties.
constexpr float kMinTemperature = SPECULA_MIN_TEMPERATURE;

struct SamplingParams {
    float temperature = 0.0f;  // < kMinTemperature: greedy
    int top_k = 0;             // <= 0: off
    float top_p = 1.0f;        // >= 1: off
    uint64_t seed = 0;

    bool greedy() const { return !(temperature >= kMinTemperature); }
    // Whether top-k or top-p removes tokens from a vocabulary of n_vocab.
    bool filtered(int n_vocab) const { return (top_k > 0 && top_k < n_vocab) || top_p < 1.0f; }
    float inv_temperature() const { return greedy() ? 1.0f : 1.0f / temperature; }
    // top_p clamped away from 0 so that the kept set is never empty.
    float nucleus() const;
};

// What p(x) needs beyond the logit itself (see the file comment).
struct RowNorm {
    float max = 0.0f;
    uint32_t cut_key = 0;  // kept: order_key(s) > cut_key, or == cut_key and id <= cut_id
    uint32_t cut_id = UINT32_MAX;
    float inv_sum = 0.0f;
    // The kept tokens in increasing order where top-k or top-p cut the row (empty: all kept).
    std::vector<uint32_t> ids;

    bool kept(uint32_t key, uint32_t x) const {
        return key > cut_key || (key == cut_key && x <= cut_id);
    }
};

// Requires temperature > 0 and a non-empty row without NaN.
RowNorm row_norm(std::span<const float> logits, const SamplingParams& p);

// p(x) for the logit z of token x of a row normalised by `norm`.
float processed_prob(float z, uint32_t x, const RowNorm& norm, float inv_temperature);

struct TokenProb {
    int32_t token;
    float prob;
};

// Lowest id among the maximal logits.
int32_t argmax(std::span<const float> logits);

// The tokens with p(x) > 0 and their probabilities, in increasing token order.
std::vector<TokenProb> processed_distribution(std::span<const float> logits,
                                              const SamplingParams& p);

// The exponential race over explicit weights (no need to normalise); -1 when no
// candidate has positive weight. Ties go to the lower id.
int32_t exponential_race(std::span<const TokenProb> candidates, uint64_t seed, RandomStream stream,
                         uint32_t step, uint32_t row);

// The race over a(x) = max(0, p(x) - q(x)) (q = 0 when q_logits is empty); when no a(x) is
// positive (p == q, which a rejection rules out in exact arithmetic) the race over p(x)
// with the same noise; 0 if even that has no candidate. pn and qn are the rows' norms.
int32_t residual_race(std::span<const float> p_logits, const RowNorm& pn,
                      std::span<const float> q_logits, const RowNorm& qn, const SamplingParams& p,
                      RandomStream stream, uint32_t step, uint32_t row);

// Greedy when p.greedy(), else one race over the processed distribution.
int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint32_t step,
                     RandomStream stream = RandomStream::kSample, uint32_t row = 0);

}  // namespace specula
