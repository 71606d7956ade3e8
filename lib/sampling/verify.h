// The speculative acceptance test and residual resampling (Leviathan et al.
// Algorithm 1; Chen et al. Theorem 1), host reference. Given the target's
// γ+1 logits rows, the draft's γ rows and the γ drafted tokens, it returns how
// many drafts are accepted and the one token that follows them, so that the
// emitted tokens are distributed exactly as the target's processed
// distribution. GPU verify kernels must return the same n and token for the
// same logits and seed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/device_abi.h"
#include "sampling/sampling.h"

namespace specula {

struct VerifyResult {
    int n_accepted = 0;  // 0..γ
    int32_t token = -1;  // the resampled token (n < γ) or the bonus token (n == γ)
};

// The draft model's token for draft position `row` of a step: sample_token on
// stream kDraft, so draft noise is never reused by verify.
inline int32_t draft_token(std::span<const float> draft_logits, const SamplingParams& p,
                           uint32_t step, uint32_t row) {
    return sample_token(draft_logits, p, step, RandomStream::kDraft, row);
}

// target_logits: (γ+1) rows of n_vocab; draft_logits: γ rows; drafts: γ tokens.
// Greedy (p.greedy()): accept while argmax p_c == x_c; the token is argmax p_n.
// Sampled: accept x_c when u_c * q_c(x_c) < p_c(x_c) with u_c from stream kAccept at
// (step, row_offset + c); on the first rejection the residual race over max(0, p_n - q_n),
// after γ acceptances the race over p_γ (the bonus token), both on `stream` (kResidual in a
// speculative step) at (step, row_offset + n). With γ = 0 this is sampling from p_0.
VerifyResult verify(std::span<const float> target_logits, std::span<const float> draft_logits,
                    std::span<const int32_t> drafts, int n_vocab, const SamplingParams& p,
                    uint32_t step, RandomStream stream = RandomStream::kResidual,
                    uint32_t row_offset = 0);

// Sequence b of a batch of verifications draws its noise at rows offset by b * 256.
constexpr uint32_t kVerifyRowsPerSequence = shared::kVerifyRowsPerSequence;

// The noise of the draw at a position of the sequence where it must not depend on how the
// steps are cut (plain decoding; the coupled acceptance): step 0, row position * 256, which a
// batch of one-row sequences that begins at that row also reads for its later positions.
// Positions below kMaxPositions; the speculative steps' own draws (row_offset < 256) never meet
// it.
constexpr size_t kMaxPositions = size_t(1) << 24;
constexpr uint32_t position_row(size_t position) {
    return uint32_t(position) * kVerifyRowsPerSequence;
}

// The non-exact sigmoid variant (Wagner et al. 2024, §3.2.2), opt-in. It replaces the
// softmax of both models by the element-wise p̂(x) = σ((z(x)/T - alpha) / (beta - alpha)),
// accepts x_c when u_c * q̂_c(x_c) < p̂_c(x_c), and on rejection draws from max(0, p̂_n - q̂_n);
// the bonus token is drawn from the exact processed p_γ. Top-k and top-p are not applied
// to p̂ and q̂. Its output is NOT the target's distribution: see docs/DESIGN.md for measurements.
struct SigmoidScale {
    float alpha = -1000.0f;  // < 0
    float beta = 1000.0f;    // > 0
};
VerifyResult verify_sigmoid(std::span<const float> target_logits,
                            std::span<const float> draft_logits, std::span<const int32_t> drafts,
                            int n_vocab, const SamplingParams& p, const SigmoidScale& scale,
                            uint32_t step);

}  // namespace specula
