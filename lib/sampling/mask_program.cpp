#include "sampling/token_rules.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/detmath.h"
#include "sampling/row_kernels.h"

namespace specula {

namespace {
constexpr float kMasked = -std::numeric_limits<float>::infinity();
}

RulesState RulesState::after(const TokenRules& rules, int32_t token) const {
    RulesState s;
    s.count = count + 1;
    s.last = token;
    s.penultimate = last;
    s.last_timestamp = rules.is_timestamp(token) ? token : last_timestamp;
    return s;
}

RulesState RulesState::of(const TokenRules& rules, std::span<const int32_t> sampled) {
    RulesState s;
    for (int32_t token : sampled)
        s = s.after(rules, token);
    return s;
}

void apply_token_rules(const TokenRules& r, const RulesState& s, std::span<float> logits) {
    const auto n = int32_t(logits.size());
    const auto mask = [&](int32_t from, int32_t to) {  // [from, to)
        for (int32_t i = std::max(from, 0); i < std::min(to, n); ++i)
            logits[size_t(i)] = kMasked;
    };
    const bool initial = s.count == 0;
    if (r.suppress_blank && initial) {
        mask(r.eot, r.eot + 1);
        if (r.space >= 0) mask(r.space, r.space + 1);
    }
    // Every special token but <|endoftext|> and the timestamps.
    for (int32_t id : {r.sot, r.translate, r.transcribe, r.solm, r.prev, r.nosp, r.no_timestamps})
        mask(id, id + 1);
    mask(r.language_begin, r.language_end);
    if (!r.timestamps) {
        mask(r.timestamp_begin, n);
        return;
    }

    mask(r.timestamp_begin + r.max_timestamp + 1, n);
    const bool last_ts = s.count >= 1 && r.is_timestamp(s.last);
    const bool penultimate_ts = s.count < 2 || r.is_timestamp(s.penultimate);
    if (last_ts) {
        if (penultimate_ts)
            mask(r.timestamp_begin, n);  // a pair is closed: text (or the end) follows
        else
            mask(0, r.eot);  // a pair is open: a timestamp or the end follows
    }
    // Timestamps do not go back, and a segment is not empty.
    if (s.last_timestamp >= 0)
        mask(r.timestamp_begin,
             last_ts && !penultimate_ts ? s.last_timestamp : s.last_timestamp + 1);
    if (initial) {
        mask(0, r.timestamp_begin);
        if (r.max_initial_timestamp >= 0) mask(r.timestamp_begin + r.max_initial_timestamp + 1, n);
    }
    // Where the timestamps together are likelier than any one text token, a timestamp it is:
    // both sides share the log-softmax's normaliser, so the log-sum-exp of the timestamps' logits
    // is compared with the largest text logit.
    // (row_kernels.h: the scalar definitions, a vector of tokens at a time.)
    const int32_t n_text = std::clamp(r.timestamp_begin, 0, n);
    const float* ts = logits.data() + n_text;
    const auto n_ts = uint32_t(n - n_text);
    const float text_max = rows::max_value(logits.data(), uint32_t(n_text), 1.0f);
    const float ts_max = rows::max_value(ts, n_ts, 1.0f);
    if (!(ts_max > kMasked) || !(text_max > kMasked)) return;
    // Summed over the timestamps only (1501 of Whisper's 51,865 tokens), in the canonical order.
    const float ts_sum = rows::kept_weight_sum({ts, 1.0f, ts_max}, n_ts);
    if (det::log_positive(ts_sum) + ts_max > text_max) mask(0, r.timestamp_begin);
}

void apply_token_rules_to_step(const TokenRules& rules, const RulesState& state,
                               std::span<const int32_t> drafts, int first_row,
                               std::span<float> logits, int n_vocab, std::span<float> lse) {
    RulesState s = state;
    for (int i = 0; i < first_row; ++i)
        s = s.after(rules, drafts[size_t(i)]);
    const size_t rows = logits.size() / size_t(n_vocab);
    for (size_t r = 0; r < rows; ++r) {
        if (r > 0) s = s.after(rules, drafts[size_t(first_row) + r - 1]);
        const auto row = logits.subspan(r * size_t(n_vocab), size_t(n_vocab));
        apply_token_rules(rules, s, row);
        if (!lse.empty()) lse[r] = log_sum_exp(row);
    }
}

std::array<int32_t, shared::kRulesWords> rules_words(const TokenRules& r, const RulesState& s) {
    std::array<int32_t, shared::kRulesWords> w{};
    w[shared::kRulesWordEot] = r.eot;
    w[shared::kRulesWordSot] = r.sot;
    w[shared::kRulesWordTranslate] = r.translate;
    w[shared::kRulesWordTranscribe] = r.transcribe;
    w[shared::kRulesWordSolm] = r.solm;
    w[shared::kRulesWordPrev] = r.prev;
    w[shared::kRulesWordNosp] = r.nosp;
    w[shared::kRulesWordNoTimestamps] = r.no_timestamps;
    w[shared::kRulesWordLanguageBegin] = r.language_begin;
    w[shared::kRulesWordLanguageEnd] = r.language_end;
    w[shared::kRulesWordTimestampBegin] = r.timestamp_begin;
    w[shared::kRulesWordSpace] = r.space;
    w[shared::kRulesWordFlags] = int32_t((r.timestamps ? shared::kRulesFlagTimestamps : 0u) |
                                         (r.suppress_blank ? shared::kRulesFlagSuppressBlank : 0u));
    w[shared::kRulesWordMaxInitialTimestamp] = r.max_initial_timestamp;
    w[shared::kRulesWordMaxTimestamp] = r.max_timestamp;
    w[shared::kRulesWordCount] = s.count;
    w[shared::kRulesWordLast] = s.last;
    w[shared::kRulesWordPenultimate] = s.penultimate;
    w[shared::kRulesWordLastTimestamp] = s.last_timestamp;
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
