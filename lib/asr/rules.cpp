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

MaskProgram mask_program(const TokenRules& r) {
    using B = MaskProgram::Bound;
    constexpr uint32_t kZero = shared::kMaskBaseZero, kVocab = shared::kMaskBaseVocab,
                       kLastTimestamp = shared::kMaskBaseLastMarked;
    constexpr uint32_t kInitial = shared::kMaskIfInitial, kLastTs = shared::kMaskIfLastMarked,
                       kPairClosed = shared::kMaskIfPairClosed, kAnyTs = shared::kMaskIfAnyMarked;
    MaskProgram p;
    p.marked_begin = r.timestamp_begin;
    const auto mask = [&](int32_t from, int32_t to, uint32_t all = 0, uint32_t none = 0) {
        p.masks.push_back({all, none, B{kZero, from}, B{kZero, to}});
    };
    const int32_t tb = r.timestamp_begin;
    // SuppressBlank: <|endoftext|> and " " may not come first.
    if (r.suppress_blank) {
        mask(r.eot, r.eot + 1, kInitial);
        if (r.space >= 0) mask(r.space, r.space + 1, kInitial);
    }
    // Every special token but <|endoftext|> and the timestamps.
    for (int32_t id : {r.sot, r.translate, r.transcribe, r.solm, r.prev, r.nosp, r.no_timestamps})
        mask(id, id + 1);
    mask(r.language_begin, r.language_end);
    const B vocab{kVocab, 0};
    if (!r.timestamps) {
        p.masks.push_back({0, 0, B{kZero, tb}, vocab});
        return p;
    }
    // ApplyTimestampRules. Past the window's last timestamp, none.
    p.masks.push_back({0, 0, B{kZero, tb + r.max_timestamp + 1}, vocab});
    // A pair of timestamps is closed: text (or the end) follows; a pair is open: a timestamp or
    // the end.
    p.masks.push_back({kLastTs | kPairClosed, 0, B{kZero, tb}, vocab});
    mask(0, r.eot, kLastTs, kPairClosed);
    // Timestamps do not go back, and a segment is not empty: after an open pair's timestamp the
    // next may repeat it (the pair closes), otherwise it is later than the last.
    p.masks.push_back({kAnyTs | kLastTs, kPairClosed, B{kZero, tb}, B{kLastTimestamp, 0}});
    p.masks.push_back({kAnyTs, kLastTs, B{kZero, tb}, B{kLastTimestamp, 1}});
    p.masks.push_back({kAnyTs | kLastTs | kPairClosed, 0, B{kZero, tb}, B{kLastTimestamp, 1}});
    // The first token is a timestamp, of at most max_initial_timestamp.
    mask(0, tb, kInitial);
    if (r.max_initial_timestamp >= 0)
        p.masks.push_back({kInitial, 0, B{kZero, tb + r.max_initial_timestamp + 1}, vocab});
    // Where the timestamps together are likelier than any one text token, a timestamp it is.
    p.outweigh_begin = tb;
    return p;
}

void apply_rules(const Rules& r, std::span<const int32_t> sampled, std::span<float> logits) {
    const MaskProgram program = mask_program(token_rules(r));
    apply_mask_program(program, MaskState::of(program, sampled), logits);
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
