// Logit masks that depend on the tokens sampled before a row: a small program of masked ranges,
// each under conditions on those tokens, and one rule that reads the logits themselves. Generic:
// Whisper's suppression and timestamp rules are one such program, written by lib/asr
// (asr/rules.h). They sit beside sampling and verification because the speculative step applies
// them on the device to every drafted and verified row, each from the prefix that row sees (the
// tokens sampled so far plus the drafts before it), so that the draft's and the target's
// distributions are the processed ones verification needs.
//
// The outweigh rule compares logits in det:: arithmetic, so every backend masks the same row the
// same way.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "core/device_abi.h"

namespace specula {

struct MaskProgram {
    // A bound of a range: base + offset, the base device_abi.h's kMaskBase* (zero, the
    // vocabulary's size, the latest marked token seen).
    struct Bound {
        uint32_t base = shared::kMaskBaseZero;
        int32_t offset = 0;
    };
    // Tokens [from, to) masked where every condition of when_all holds and none of when_none
    // (device_abi.h's kMaskIf*); an empty or inverted range masks nothing.
    struct Mask {
        uint32_t when_all = 0, when_none = 0;
        Bound from, to;
    };
    // Tokens from this id on are marked (the conditions and the state follow them; Whisper's
    // timestamps).
    int32_t marked_begin = 0;
    std::vector<Mask> masks;  // at most kMaskMaxMasks
    // Where >= 0: after the masks, if log(sum exp) of the logits [outweigh_begin, V) exceeds the
    // largest logit below outweigh_begin, those below are masked too (Whisper: timestamps
    // together likelier than any one text token force one).
    int32_t outweigh_begin = -1;

    bool is_marked(int32_t id) const { return id >= marked_begin; }
};

// What a program reads of the tokens sampled before a row.
struct MaskState {
    int32_t count = 0;                    // tokens sampled
    int32_t last = -1, penultimate = -1;  // the last two (-1: none)
    int32_t last_marked = -1;             // the latest marked one among them (-1: none)

    static MaskState of(const MaskProgram& program, std::span<const int32_t> sampled);
    MaskState after(const MaskProgram& program, int32_t token) const;
    // The kMaskIf* conditions that hold.
    uint32_t conditions(const MaskProgram& program) const;
};

// Masks (sets to -infinity) the logits of the tokens that may not follow, in place.
void apply_mask_program(const MaskProgram& program, const MaskState& state,
                        std::span<float> logits);

// The rows of a speculative step, in place: row r (0 <= r < rows) sees the tokens sampled
// before the step (`state`), then drafts[0, first_row + r). lse: one float per row for
// log_sum_exp() of the masked row, or empty.
void apply_mask_program_to_step(const MaskProgram& program, const MaskState& state,
                                std::span<const int32_t> drafts, int first_row,
                                std::span<float> logits, int n_vocab, std::span<float> lse);

// The program and a state as the words a device reads (core/device_abi.h: kMaskWord*).
std::array<int32_t, shared::kMaskProgramWords> program_words(const MaskProgram& program,
                                                             const MaskState& state);

// log(sum exp(z)) of a row (masked entries -infinity) in det:: arithmetic: max + ln of the
// canonical sum of exp(z - max). -infinity for a row masked whole. A token's log-probability
// (temperature 1) is its logit minus this.
float log_sum_exp(std::span<const float> logits);

}  // namespace specula
