#version 450
// Whisper's token rules on the rows of a speculative step, in place, bit for bit those of
// lib/sampling/token_rules.cpp (apply_token_rules_to_step): one workgroup per row; row r sees
// the state of the tokens sampled before the step, then drafts[0, first_row + r).
//
//   binding 0: logits, rows of V (F32, read and written)    1: drafts (I32)
//   binding 2: the rules and the state (kRulesWord*)         3: log-sum-exp, one F32 per row
//   u0 V, u1 first_row, u2 1: write the log-sum-exp
//
// Every thread reads all of its row's logits it needs before any thread writes (the
// reductions' barriers order them), and the masked row is a function of the row as it was.
#include "common.glsl"
#include "detmath.glsl"

layout(constant_id = 0) const uint WG = 256u;  // the host sets kDetLanes

shared float sh_f[kDetLanes];
shared float sh_tiles[kDetLanes];

const float kMasked = -1.0 / 0.0;

int word(uint i) { return int(b2[pc.off2 / 4u + i]); }
int V() { return int(pc.u0); }
int ts_begin() { return word(kRulesWordTimestampBegin); }
bool is_timestamp(int id) { return id >= ts_begin(); }

struct State {
    int count, last, penultimate, last_timestamp;
};

State after(State s, int token) {
    State t;
    t.count = s.count + 1;
    t.last = token;
    t.penultimate = s.last;
    t.last_timestamp = is_timestamp(token) ? token : s.last_timestamp;
    return t;
}

bool in_range(int x, int from, int to) { return x >= from && x < to; }

// Whether a rule that does not read the logits masks token x (apply_token_rules, in order).
bool ruled_out(int x, State s) {
    const uint flags = uint(word(kRulesWordFlags));
    const bool initial = s.count == 0;
    if ((flags & kRulesFlagSuppressBlank) != 0u && initial &&
        (x == word(kRulesWordEot) || x == word(kRulesWordSpace)))
        return true;
    if (x == word(kRulesWordSot) || x == word(kRulesWordTranslate) ||
        x == word(kRulesWordTranscribe) || x == word(kRulesWordSolm) ||
        x == word(kRulesWordPrev) || x == word(kRulesWordNosp) ||
        x == word(kRulesWordNoTimestamps))
        return true;
    if (in_range(x, word(kRulesWordLanguageBegin), word(kRulesWordLanguageEnd))) return true;
    const int tb = ts_begin();
    if ((flags & kRulesFlagTimestamps) == 0u) return x >= tb;
    if (x >= tb + word(kRulesWordMaxTimestamp) + 1) return true;
    const bool last_ts = s.count >= 1 && is_timestamp(s.last);
    const bool penultimate_ts = s.count < 2 || is_timestamp(s.penultimate);
    if (last_ts) {
        if (penultimate_ts && x >= tb) return true;
        if (!penultimate_ts && x < word(kRulesWordEot)) return true;
    }
    if (s.last_timestamp >= 0 &&
        in_range(x, tb, last_ts && !penultimate_ts ? s.last_timestamp : s.last_timestamp + 1))
        return true;
    if (initial) {
        if (x < tb) return true;
        const int max_initial = word(kRulesWordMaxInitialTimestamp);
        if (max_initial >= 0 && x >= tb + max_initial + 1) return true;
    }
    return false;
}

// Workgroup reductions; every invocation calls them (uniform control flow).
float reduce_max(float v) {
    const uint l = gl_LocalInvocationID.x;
    sh_f[l] = v;
    for (uint stride = WG / 2u; stride > 0u; stride >>= 1) {
        barrier();
        if (l < stride) sh_f[l] = max(sh_f[l], sh_f[l + stride]);  // any order: max is exact
    }
    barrier();
    const float r = sh_f[0];
    barrier();
    return r;
}
// The lane tree of det::canonical_sum.
float lane_tree(float v) {
    const uint l = gl_LocalInvocationID.x;
    sh_f[l] = v;
    for (uint stride = WG / 2u; stride > 0u; stride >>= 1) {
        barrier();
        if (l < stride) {
            precise float s = sh_f[l] + sh_f[l + stride];
            sh_f[l] = s;
        }
    }
    barrier();
    const float r = sh_f[0];
    barrier();
    return r;
}

uint row_at;  // the row's first word in binding 0
State state;  // the state this row sees
bool timestamps_win = false;

float logit(int x) { return uintBitsToFloat(b0[row_at + uint(x)]); }
float ruled(int x) { return ruled_out(x, state) ? kMasked : logit(x); }
float masked(int x) { return timestamps_win && x < ts_begin() ? kMasked : ruled(x); }

// det::canonical_sum over i < n of det_exp(value(from + i) - m), value = ruled or masked.
float sum_exp(int from, int n, float m, bool final_row) {
    const uint l = gl_LocalInvocationID.x;
    const uint tiles = (uint(n) + kDetTile - 1u) / kDetTile;
    for (uint j = 0u; j < tiles; ++j) {
        precise float acc = 0.0;
        for (uint k = 0u; k < kDetLaneItems; ++k) {
            const uint i = j * kDetTile + k * kDetLanes + l;
            if (i >= uint(n)) break;
            const int x = from + int(i);
            precise float d = (final_row ? masked(x) : ruled(x)) - m;
            acc = acc + det_exp(d);
        }
        const float t = lane_tree(acc);
        if (l == 0u) sh_tiles[j] = t;
    }
    barrier();
    const float total = lane_tree(l < tiles ? sh_tiles[l] : 0.0);
    return total;
}

void main() {
    const uint r = group_index();
    const int n = V();
    row_at = pc.off0 / 4u + r * uint(n);
    state.count = word(kRulesWordCount);
    state.last = word(kRulesWordLast);
    state.penultimate = word(kRulesWordPenultimate);
    state.last_timestamp = word(kRulesWordLastTimestamp);
    const uint drafts_seen = pc.u1 + r;
    for (uint i = 0u; i < drafts_seen; ++i)
        state = after(state, int(b1[pc.off1 / 4u + i]));

    // Where the timestamps together are likelier than any one text token, a timestamp it is.
    const int tb = ts_begin();
    const bool rules_timestamps = (uint(word(kRulesWordFlags)) & kRulesFlagTimestamps) != 0u;
    if (rules_timestamps) {
        float ts_max = kMasked, text_max = kMasked;
        for (int x = int(gl_LocalInvocationID.x); x < n; x += int(WG)) {
            const float z = ruled(x);
            if (x >= tb)
                ts_max = max(ts_max, z);
            else
                text_max = max(text_max, z);
        }
        ts_max = reduce_max(ts_max);
        text_max = reduce_max(text_max);
        if (ts_max != kMasked && text_max != kMasked) {
            const float ts_sum = sum_exp(tb, n - tb, ts_max, false);
            precise float ts_lse = det_log(ts_sum) + ts_max;
            timestamps_win = ts_lse > text_max;
        }
    }

    float lse = 0.0;
    if (pc.u2 != 0u) {
        float m = kMasked;
        for (int x = int(gl_LocalInvocationID.x); x < n; x += int(WG))
            m = max(m, masked(x));
        m = reduce_max(m);
        if (m == kMasked) {
            lse = kMasked;
        } else {
            const float sum = sum_exp(0, n, m, true);
            precise float with_log = m + det_log(sum);
            lse = sum > 0.0 ? with_log : m;  // an infinite max: no finite sum
        }
    }
    barrier();  // every read of the row above is done

    for (int x = int(gl_LocalInvocationID.x); x < n; x += int(WG))
        b0[row_at + uint(x)] = floatBitsToUint(masked(x));
    if (pc.u2 != 0u && gl_LocalInvocationID.x == 0u) b3[pc.off3 / 4u + r] = floatBitsToUint(lse);
}
