#version 450
// A mask program (sampling/mask_program.h) on the rows of a speculative step, in place, bit for
// bit lib/sampling/mask_program.cpp's apply_mask_program_to_step: one workgroup per row; row r
// sees the state of the tokens sampled before the step, then drafts[0, first_row + r).
//
//   binding 0: logits, rows of V (F32, read and written)    1: drafts (I32)
//   binding 2: the program and the state (kMaskWord*)        3: log-sum-exp, one F32 per row
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
bool is_marked(int id) { return id >= word(kMaskWordMarkedBegin); }

struct State {
    int count, last, penultimate, last_marked;
};

State after(State s, int token) {
    State t;
    t.count = s.count + 1;
    t.last = token;
    t.penultimate = s.last;
    t.last_marked = is_marked(token) ? token : s.last_marked;
    return t;
}

// The ranges of the masks whose conditions hold for this row's state, settled once per row.
int n_ranges = 0;
int range_from[kMaskMaxMasks];
int range_to[kMaskMaxMasks];

int bound(uint at, State s) {
    const uint base = uint(word(at));
    const int value = base == kMaskBaseVocab ? V() : base == kMaskBaseLastMarked ? s.last_marked : 0;
    return value + word(at + 1u);
}

void settle_ranges(State s) {
    uint holds = 0u;
    if (s.count == 0) holds |= kMaskIfInitial;
    if (s.count >= 1 && is_marked(s.last)) holds |= kMaskIfLastMarked;
    if (s.count < 2 || is_marked(s.penultimate)) holds |= kMaskIfPairClosed;
    if (s.last_marked >= 0) holds |= kMaskIfAnyMarked;
    const int count = min(word(kMaskWordCount), int(kMaskMaxMasks));
    for (int m = 0; m < count; ++m) {
        const uint at = kMaskWordFirstMask + uint(m) * kMaskWordsPerMask;
        const uint all = uint(word(at)), none = uint(word(at + 1u));
        if ((holds & all) != all || (holds & none) != 0u) continue;
        range_from[n_ranges] = bound(at + 2u, s);
        range_to[n_ranges] = bound(at + 4u, s);
        ++n_ranges;
    }
}

// Whether a mask of the program covers token x.
bool ruled_out(int x) {
    for (int m = 0; m < n_ranges; ++m)
        if (x >= range_from[m] && x < range_to[m]) return true;
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
int outweigh_begin;
bool outweighed = false;  // the outweigh rule masks the tokens below outweigh_begin

float logit(int x) { return uintBitsToFloat(b0[row_at + uint(x)]); }
float ruled(int x) { return ruled_out(x) ? kMasked : logit(x); }
float masked(int x) { return outweighed && x < outweigh_begin ? kMasked : ruled(x); }

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
    State state;
    state.count = word(kMaskWordStateCount);
    state.last = word(kMaskWordStateLast);
    state.penultimate = word(kMaskWordStatePenultimate);
    state.last_marked = word(kMaskWordStateLastMarked);
    const uint drafts_seen = pc.u1 + r;
    for (uint i = 0u; i < drafts_seen; ++i)
        state = after(state, int(b1[pc.off1 / 4u + i]));
    settle_ranges(state);

    // Where the tokens from outweigh_begin together are likelier than any one below, one of
    // them it is.
    outweigh_begin = word(kMaskWordOutweighBegin);
    if (outweigh_begin >= 0) {
        const int ob = min(outweigh_begin, n);
        float above_max = kMasked, below_max = kMasked;
        for (int x = int(gl_LocalInvocationID.x); x < n; x += int(WG)) {
            const float z = ruled(x);
            if (x >= ob)
                above_max = max(above_max, z);
            else
                below_max = max(below_max, z);
        }
        above_max = reduce_max(above_max);
        below_max = reduce_max(below_max);
        if (above_max != kMasked && below_max != kMasked) {
            const float above_sum = sum_exp(ob, n - ob, above_max, false);
            precise float above_lse = det_log(above_sum) + above_max;
            outweighed = above_lse > below_max;
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
