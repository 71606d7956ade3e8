#include "sampling/mask_program.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "core/detmath.h"
#include "sampling/row_kernels.h"

namespace specula {

namespace {
constexpr float kMasked = -std::numeric_limits<float>::infinity();
}

MaskState MaskState::after(const MaskProgram& program, int32_t token) const {
    MaskState s;
    s.count = count + 1;
    s.last = token;
    s.penultimate = last;
    s.last_marked = program.is_marked(token) ? token : last_marked;
    return s;
}

MaskState MaskState::of(const MaskProgram& program, std::span<const int32_t> sampled) {
    MaskState s;
    for (int32_t token : sampled)
        s = s.after(program, token);
    return s;
}

uint32_t MaskState::conditions(const MaskProgram& program) const {
    uint32_t c = 0;
    if (count == 0) c |= shared::kMaskIfInitial;
    if (count >= 1 && program.is_marked(last)) c |= shared::kMaskIfLastMarked;
    if (count < 2 || program.is_marked(penultimate)) c |= shared::kMaskIfPairClosed;
    if (last_marked >= 0) c |= shared::kMaskIfAnyMarked;
    return c;
}

void apply_mask_program(const MaskProgram& p, const MaskState& s, std::span<float> logits) {
    const auto n = int32_t(logits.size());
    const uint32_t holds = s.conditions(p);
    const auto value = [&](const MaskProgram::Bound& b) {
        const int32_t base = b.base == shared::kMaskBaseVocab        ? n
                             : b.base == shared::kMaskBaseLastMarked ? s.last_marked
                                                                     : 0;
        return base + b.offset;
    };
    for (const MaskProgram::Mask& m : p.masks) {
        if ((holds & m.when_all) != m.when_all || (holds & m.when_none) != 0) continue;
        for (int32_t i = std::max(value(m.from), 0); i < std::min(value(m.to), n); ++i)
            logits[size_t(i)] = kMasked;
    }
    if (p.outweigh_begin < 0) return;
    // Where the tokens from outweigh_begin together are likelier than any one below it, one of
    // them it is: both sides share the log-softmax's normaliser, so their logits' log-sum-exp
    // is compared with the largest logit below. (row_kernels.h: the scalar definitions, a
    // vector of tokens at a time.)
    const int32_t below = std::clamp(p.outweigh_begin, 0, n);
    const float* above = logits.data() + below;
    const auto n_above = uint32_t(n - below);
    const float below_max = rows::max_value(logits.data(), uint32_t(below), 1.0f);
    const float above_max = rows::max_value(above, n_above, 1.0f);
    if (!(above_max > kMasked) || !(below_max > kMasked)) return;
    // Summed over those tokens only (Whisper's 1501 timestamps of 51,865), in the canonical order.
    const float above_sum = rows::kept_weight_sum({above, 1.0f, above_max}, n_above);
    if (det::log_positive(above_sum) + above_max > below_max)
        std::fill(logits.begin(), logits.begin() + below, kMasked);
}

void apply_mask_program_to_step(const MaskProgram& program, const MaskState& state,
                                std::span<const int32_t> drafts, int first_row,
                                std::span<float> logits, int n_vocab, std::span<float> lse) {
    MaskState s = state;
    for (int i = 0; i < first_row; ++i)
        s = s.after(program, drafts[size_t(i)]);
    const size_t rows = logits.size() / size_t(n_vocab);
    for (size_t r = 0; r < rows; ++r) {
        if (r > 0) s = s.after(program, drafts[size_t(first_row) + r - 1]);
        const auto row = logits.subspan(r * size_t(n_vocab), size_t(n_vocab));
        apply_mask_program(program, s, row);
        if (!lse.empty()) lse[r] = log_sum_exp(row);
    }
}

std::array<int32_t, shared::kMaskProgramWords> program_words(const MaskProgram& p,
                                                             const MaskState& s) {
    // A program's writer keeps to kMaskMaxMasks (asr/rules.cpp: Whisper's has at most 18).
    assert(p.masks.size() <= shared::kMaskMaxMasks);
    std::array<int32_t, shared::kMaskProgramWords> w{};
    w[shared::kMaskWordMarkedBegin] = p.marked_begin;
    w[shared::kMaskWordOutweighBegin] = p.outweigh_begin;
    w[shared::kMaskWordCount] = int32_t(std::min<size_t>(p.masks.size(), shared::kMaskMaxMasks));
    w[shared::kMaskWordStateCount] = s.count;
    w[shared::kMaskWordStateLast] = s.last;
    w[shared::kMaskWordStatePenultimate] = s.penultimate;
    w[shared::kMaskWordStateLastMarked] = s.last_marked;
    for (size_t m = 0; m < size_t(w[shared::kMaskWordCount]); ++m) {
        int32_t* at = w.data() + shared::kMaskWordFirstMask + m * shared::kMaskWordsPerMask;
        const MaskProgram::Mask& mask = p.masks[m];
        at[0] = int32_t(mask.when_all);
        at[1] = int32_t(mask.when_none);
        at[2] = int32_t(mask.from.base);
        at[3] = mask.from.offset;
        at[4] = int32_t(mask.to.base);
        at[5] = mask.to.offset;
    }
    return w;
}

float log_sum_exp(std::span<const float> logits) {
    const auto n = uint32_t(logits.size());
    const float max = rows::max_value(logits.data(), n, 1.0f);
    if (!(max > kMasked)) return kMasked;
    const float sum = rows::kept_weight_sum({logits.data(), 1.0f, max}, n);
    return sum > 0.0f ? max + det::log_positive(sum) : max;  // an infinite max: no finite sum
}

}  // namespace specula
