#include "asr/rules.h"

#include <algorithm>
#include <cmath>

namespace specula::asr {

TokenRules token_rules(const Rules& r) {
    const WhisperTokens& t = r.tokens;
    TokenRules out;
    out.eot = t.eot;
    out.sot = t.sot;
    out.translate = t.translate;
    out.transcribe = t.transcribe;
    out.solm = t.solm;
    out.prev = t.prev;
    out.nosp = t.nosp;
    out.no_timestamps = t.no_timestamps;
    if (t.multilingual) {
        out.language_begin = t.language(0);
        out.language_end = t.language(t.n_languages);
    }
    out.timestamp_begin = t.timestamp_begin;
    out.space = r.space;
    out.timestamps = r.timestamps;
    out.suppress_blank = r.suppress_blank;
    out.max_initial_timestamp = r.max_initial_timestamp;
    out.max_timestamp = r.max_timestamp;
    return out;
}

void apply_rules(const Rules& r, std::span<const int32_t> sampled, std::span<float> logits) {
    const TokenRules rules = token_rules(r);
    apply_token_rules(rules, RulesState::of(rules, sampled), logits);
}

void log_softmax(std::span<const float> logits, std::span<double> out) {
    double max = -INFINITY;
    for (float z : logits)
        max = std::max(max, double(z));
    double sum = 0;
    for (float z : logits)
        sum += std::exp(double(z) - max);
    const double log_z = max + std::log(sum);
    for (size_t i = 0; i < logits.size(); ++i)
        out[i] = double(logits[i]) - log_z;
}

}  // namespace specula::asr
