// Rules that mask a row of logits by the tokens sampled before it: Whisper's suppression and
// timestamp rules (asr/rules.h says whose they are). They sit beside sampling and verification
// because the speculative step applies them on the device to every drafted and verified row, each
// from the prefix that row sees (the tokens sampled so far plus the drafts before it), so that
// the draft's and the target's distributions are the processed ones verification needs.
//
// The one decision that depends on the logits themselves (timestamps outweigh text) uses det::
// arithmetic, so every backend masks the same row the same way.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "core/device_abi.h"

namespace specula {

// Token ids as plain integers (no model types: backends include this).
struct TokenRules {
    int32_t eot = 0, sot = 0, translate = 0, transcribe = 0, solm = 0, prev = 0, nosp = 0,
            no_timestamps = 0;
    int32_t language_begin = 0, language_end = 0;  // [begin, end): the language tokens
    int32_t timestamp_begin = 0;                   // every id from here is a timestamp
    int32_t space = -1;  // the token " " (suppressed first, with <|endoftext|>); -1: none
    bool timestamps = true;
    bool suppress_blank = true;
    // The first timestamp is at most <|max_initial_timestamp * 0.02|>; < 0: no limit.
    int32_t max_initial_timestamp = 50;
    // The last timestamp a window has: <|max_timestamp * 0.02|>.
    int32_t max_timestamp = 1500;

    bool is_timestamp(int32_t id) const { return id >= timestamp_begin; }
};

// What the rules read of the tokens sampled before a row.
struct RulesState {
    int32_t count = 0;                    // tokens sampled
    int32_t last = -1, penultimate = -1;  // the last two (-1: none)
    int32_t last_timestamp = -1;          // the latest timestamp among them (-1: none)

    static RulesState of(const TokenRules& rules, std::span<const int32_t> sampled);
    RulesState after(const TokenRules& rules, int32_t token) const;
};

// Masks (sets to -infinity) the logits of the tokens that may not follow, in place.
void apply_token_rules(const TokenRules& rules, const RulesState& state, std::span<float> logits);

// The rows of a speculative step, in place: row r (0 <= r < rows) sees the tokens sampled
// before the step (`state`), then drafts[0, first_row + r). lse: one float per row for
// log_sum_exp() of the masked row, or empty.
void apply_token_rules_to_step(const TokenRules& rules, const RulesState& state,
                               std::span<const int32_t> drafts, int first_row,
                               std::span<float> logits, int n_vocab, std::span<float> lse);

// The rules and a state as the words a device reads (core/device_abi.h: kRulesWord*).
std::array<int32_t, shared::kRulesWords> rules_words(const TokenRules& rules,
                                                     const RulesState& state);

// log(sum exp(z)) of a row (masked entries -infinity) in det:: arithmetic: max + ln of the
// canonical sum of exp(z - max). -infinity for a row masked whole. A token's log-probability
// (temperature 1) is its logit minus this.
float log_sum_exp(std::span<const float> logits);

}  // namespace specula
