#include "asr/rules.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace specula::asr {

namespace {
constexpr float kMasked = -std::numeric_limits<float>::infinity();
}

void apply_rules(const Rules& r, std::span<const int32_t> sampled, std::span<float> logits) {
    const WhisperTokens& t = r.tokens;
    const auto n = int32_t(logits.size());
    const auto mask = [&](int32_t from, int32_t to) {  // [from, to)
        for (int32_t i = std::max(from, 0); i < std::min(to, n); ++i)
            logits[size_t(i)] = kMasked;
    };
    const bool initial = sampled.empty();
    if (r.suppress_blank && initial) {
        mask(t.eot, t.eot + 1);
        if (r.space >= 0) mask(r.space, r.space + 1);
    }
    // Every special token but <|endoftext|> and the timestamps.
    for (int32_t id : {t.sot, t.translate, t.transcribe, t.solm, t.prev, t.nosp, t.no_timestamps})
        mask(id, id + 1);
    if (t.multilingual) mask(t.language(0), t.language(t.n_languages));
    if (!r.timestamps) {
        mask(t.timestamp_begin, n);
        return;
    }

    mask(t.timestamp_begin + r.max_timestamp + 1, n);
    const auto is_ts = [&](int32_t id) { return id >= t.timestamp_begin; };
    const size_t k = sampled.size();
    const bool last_ts = k >= 1 && is_ts(sampled[k - 1]);
    const bool penultimate_ts = k < 2 || is_ts(sampled[k - 2]);
    if (last_ts) {
        if (penultimate_ts)
            mask(t.timestamp_begin, n);  // a pair is closed: text (or the end) follows
        else
            mask(0, t.eot);  // a pair is open: a timestamp or the end follows
    }
    // Timestamps do not go back, and a segment is not empty.
    for (size_t i = k; i-- > 0;)
        if (is_ts(sampled[i])) {
            mask(t.timestamp_begin, last_ts && !penultimate_ts ? sampled[i] : sampled[i] + 1);
            break;
        }
    if (initial) {
        mask(0, t.timestamp_begin);
        if (r.max_initial_timestamp >= 0) mask(t.timestamp_begin + r.max_initial_timestamp + 1, n);
    }
    // Where the timestamps together are likelier than any one text token, a timestamp it is.
    double ts_max = -INFINITY, text_max = -INFINITY;
    for (int32_t i = 0; i < n; ++i) {
        const double z = logits[size_t(i)];
        if (i >= t.timestamp_begin)
            ts_max = std::max(ts_max, z);
        else
            text_max = std::max(text_max, z);
    }
    if (ts_max == -INFINITY || text_max == -INFINITY) return;
    double ts_sum = 0;
    for (int32_t i = t.timestamp_begin; i < n; ++i)
        ts_sum += std::exp(double(logits[size_t(i)]) - ts_max);
    // Both sides share the log-softmax's normaliser: compare the logits' log-sum-exp directly.
    if (std::log(ts_sum) + ts_max > text_max) mask(0, t.timestamp_begin);
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
