// Turning logits into a token. The processed distribution (temperature, then
// top-k, then top-p) is defined here once; the verify kernels of every backend
// must reproduce it exactly (DESIGN §6). A sampled token is the winner of an
// exponential race, argmax_x p(x) / E_x with E_x ~ Exp(1) drawn from Philox at
// (seed, stream, step, 0, x): it needs no sort of the vocabulary and no scan,
// and the same logits give the same token on every backend.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/philox.h"

namespace specula {

struct SamplingParams {
    float temperature = 0.0f;  // <= 0: greedy
    int top_k = 0;             // <= 0: off
    float top_p = 1.0f;        // >= 1: off
    uint64_t seed = 0;
};

struct TokenProb {
    int32_t token;
    float prob;
};

// Lowest id among the maximal logits.
int32_t argmax(std::span<const float> logits);

// The tokens that keep non-zero probability after processing, with their
// normalised probabilities, in increasing token order. Requires temperature > 0.
std::vector<TokenProb> processed_distribution(std::span<const float> logits,
                                              const SamplingParams& p);

// A token with probability prob / sum(prob) over the candidates with prob > 0
// (no need to normalise): argmax prob(x) / E_x with E_x = -log u and u from
// Philox at (seed, stream, step, row, x). Ties go to the earlier candidate; -1
// when no candidate has positive weight.
int32_t exponential_race(std::span<const TokenProb> candidates, uint64_t seed, RandomStream stream,
                         uint32_t step, uint32_t row);

// Greedy when temperature <= 0, else one race over the processed distribution.
int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint32_t step,
                     RandomStream stream = RandomStream::kSample, uint32_t row = 0);

}  // namespace specula
