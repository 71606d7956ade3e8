#version 450
// Sampling and speculative verification on the device (docs/DESIGN.md, "Sampling and
// random numbers"), one pass per MODE; the host records them in order
// (VulkanBackend::verify). The arithmetic is that of lib/sampling/sampling.cpp and
// verify.cpp, bit for bit.
//
//   binding 0: target logits, batch * (gamma + 1) rows of V    1: draft logits, batch * gamma rows
//   binding 2: drafts (I32)    3: scratch    4: result (I32)    5: token (I32)
//   u0 V, u1 batch, u2 gamma, u3 rows per sequence (verify_rows_per_sequence),
//   u4 tiles per row, u5 top-k (0 off), u6 stream, u7 step, u8 row offset, u9/u10 seed,
//   u11 flags (kVerifyFlag*)
// The passes, the scratch layout and the constants are lib/core/device_abi.h's.
// Passes in order: tile max, row max, tile sum (unfiltered), row norm, accept, race,
// finish; greedy: tile max, accept.
//   f0 1 / temperature, f1 top-p (clamped)
//
// Row r of the R = batch * rows-per-sequence rows: the target rows of sequence b,
// then its draft rows. Scratch (32-bit words): tile max, tile argmax, tile sum
// (R * tiles each), row norms (R * 4: max, cut key, cut id, 1 / sum), accepted
// counts (batch), race winners (batch * tiles * 4).
#include "common.glsl"
#include "detmath.glsl"

layout(constant_id = 0) const uint WG = 256u;  // the host sets kDetLanes
layout(constant_id = 1) const uint MODE = 0u;

const uint NONE = 0xFFFFFFFFu;

shared float sh_f[kDetLanes];
shared uint sh_u[kDetLanes];
shared float sh_g[kDetLanes];
shared uint sh_v[kDetLanes];
shared float sh_tiles[kDetLanes];

uint V() { return pc.u0; }
uint gamma() { return pc.u2; }
uint rows_per_seq() { return pc.u3; }
uint tiles() { return pc.u4; }
bool greedy() { return (pc.u11 & kVerifyFlagGreedy) != 0u; }
uvec2 seed() { return uvec2(pc.u9, pc.u10); }

uint R() { return pc.u1 * rows_per_seq(); }
uint scratch(uint word) { return pc.off3 / 4u + word; }
uint tile_max_at(uint r, uint j) { return scratch(verify_tile_max_word(tiles(), r, j)); }
uint tile_arg_at(uint r, uint j) { return scratch(verify_tile_arg_word(R(), tiles(), r, j)); }
uint tile_sum_at(uint r, uint j) { return scratch(verify_tile_sum_word(R(), tiles(), r, j)); }
uint norm_at(uint r) { return scratch(verify_norm_word(R(), tiles(), r)); }
uint accepted_at(uint b) { return scratch(verify_accepted_word(R(), tiles(), b)); }
uint race_at(uint b, uint j) { return scratch(verify_race_word(R(), tiles(), pc.u1, b, j)); }

uint target_row(uint b, uint c) { return b * rows_per_seq() + c; }
uint draft_row(uint b, uint c) { return b * rows_per_seq() + gamma() + 1u + c; }

float logit(uint r, uint x) {
    const uint b = r / rows_per_seq(), c = r % rows_per_seq();
    if (c <= gamma()) return uintBitsToFloat(b0[pc.off0 / 4u + (b * (gamma() + 1u) + c) * V() + x]);
    return uintBitsToFloat(b1[pc.off1 / 4u + (b * gamma() + c - gamma() - 1u) * V() + x]);
}
float scaled(uint r, uint x) {
    precise float s = logit(r, x) * pc.f0;
    return s;
}
uint draft_token(uint b, uint c) { return b2[pc.off2 / 4u + b * gamma() + c]; }
uint noise_row(uint b, uint c) { return pc.u8 + b * kVerifyRowsPerSequence + c; }

bool in_cut(uint key, uint x, uint cut_key, uint cut_id) {
    return key > cut_key || (key == cut_key && x <= cut_id);
}

// p(x) of row r (sampling/sampling.cpp: processed_prob).
float prob(uint r, uint x) {
    const uint at = norm_at(r);
    const float s = scaled(r, x);
    if (!in_cut(order_key(s), x, b3[at + 1u], b3[at + 2u])) return 0.0;
    precise float p = det_exp(s - uintBitsToFloat(b3[at])) * uintBitsToFloat(b3[at + 3u]);
    return p;
}

// (value, id) pairs: the larger value wins, ties go to the lower id.
bool better(float v, uint id, float best_v, uint best_id) {
    return v > best_v || (v == best_v && id < best_id);
}

// Workgroup reductions; every invocation calls them (uniform control flow).
uint reduce_count(uint v) {
    const uint l = gl_LocalInvocationID.x;
    sh_u[l] = v;
    for (uint stride = WG / 2u; stride > 0u; stride >>= 1) {
        barrier();
        if (l < stride) sh_u[l] += sh_u[l + stride];
    }
    barrier();
    const uint r = sh_u[0];
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
// Argmax of (value, id) pairs into sh_f[0]/sh_u[0] (and of a second set into sh_g/sh_v).
void reduce_best(float v, uint id, float v2, uint id2) {
    const uint l = gl_LocalInvocationID.x;
    sh_f[l] = v;
    sh_u[l] = id;
    sh_g[l] = v2;
    sh_v[l] = id2;
    for (uint stride = WG / 2u; stride > 0u; stride >>= 1) {
        barrier();
        if (l < stride) {
            if (better(sh_f[l + stride], sh_u[l + stride], sh_f[l], sh_u[l])) {
                sh_f[l] = sh_f[l + stride];
                sh_u[l] = sh_u[l + stride];
            }
            if (better(sh_g[l + stride], sh_v[l + stride], sh_g[l], sh_v[l])) {
                sh_g[l] = sh_g[l + stride];
                sh_v[l] = sh_v[l + stride];
            }
        }
    }
    barrier();
}

// The row maximum m, written by the row-max pass into the row's norm.
float row_max(uint r) { return uintBitsToFloat(b3[norm_at(r)]); }

void write_row_max(uint r) {
    const uint l = gl_LocalInvocationID.x;
    sh_f[l] = l < tiles() ? uintBitsToFloat(b3[tile_max_at(r, l)]) : -1.0 / 0.0;
    for (uint stride = WG / 2u; stride > 0u; stride >>= 1) {
        barrier();
        if (l < stride) sh_f[l] = max(sh_f[l], sh_f[l + stride]);  // any order: max is exact
    }
    if (l == 0u) b3[norm_at(r)] = floatBitsToUint(sh_f[0]);
}

// Tokens of row r inside the cut (key, id), canonically.
uint count_in(uint r, uint cut_key, uint cut_id) {
    uint n = 0u;
    for (uint x = gl_LocalInvocationID.x; x < V(); x += WG)
        n += in_cut(order_key(scaled(r, x)), x, cut_key, cut_id) ? 1u : 0u;
    return reduce_count(n);
}
// The canonical sum of e(x) over tokens inside both cuts.
float mass_in(uint r, float m, uint cut_key, uint cut_id, uint k_key, uint k_id) {
    const uint l = gl_LocalInvocationID.x;
    for (uint j = 0u; j < tiles(); ++j) {
        precise float acc = 0.0;
        for (uint k = 0u; k < kDetLaneItems; ++k) {
            const uint x = j * kDetTile + k * kDetLanes + l;
            if (x >= V()) break;
            const float s = scaled(r, x);
            const uint key = order_key(s);
            if (in_cut(key, x, cut_key, cut_id) && in_cut(key, x, k_key, k_id))
                acc = acc + det_exp(s - m);
        }
        const float t = lane_tree(acc);
        if (l == 0u) sh_tiles[j] = t;
    }
    barrier();
    return lane_tree(l < tiles() ? sh_tiles[l] : 0.0);
}

void write_outputs(uint b, uint n, uint token) {
    if ((pc.u11 & kVerifyFlagWriteResult) != 0u) {
        const uint at = pc.off4 / 4u + b * (gamma() + 2u);
        b4[at] = n;
        for (uint i = 0u; i < n; ++i) b4[at + 1u + i] = draft_token(b, i);
        b4[at + 1u + n] = token;
    }
    if ((pc.u11 & kVerifyFlagWriteToken) != 0u) b5[pc.off5 / 4u + b] = token;
}

void tile_max(uint r, uint j) {
    const uint l = gl_LocalInvocationID.x;
    float best = -1.0 / 0.0;
    uint arg = NONE;
    for (uint k = 0u; k < kDetLaneItems; ++k) {
        const uint x = j * kDetTile + k * kDetLanes + l;
        if (x >= V()) break;
        const float s = scaled(r, x);
        if (better(s, x, best, arg)) {
            best = s;
            arg = x;
        }
    }
    reduce_best(best, arg, 0.0, NONE);
    if (l == 0u) {
        b3[tile_max_at(r, j)] = floatBitsToUint(sh_f[0]);
        b3[tile_arg_at(r, j)] = sh_u[0];
    }
}

void tile_sum(uint r, uint j) {
    const uint l = gl_LocalInvocationID.x;
    const float m = row_max(r);
    precise float acc = 0.0;
    for (uint k = 0u; k < kDetLaneItems; ++k) {
        const uint x = j * kDetTile + k * kDetLanes + l;
        if (x >= V()) break;
        acc = acc + det_exp(scaled(r, x) - m);
    }
    const float t = lane_tree(acc);
    if (l == 0u) b3[tile_sum_at(r, j)] = floatBitsToUint(t);
}

// Largest key T with pred(T, all ids), then the smallest id J with pred(T, J): the
// shortest prefix of the rank order that satisfies a monotone predicate.
#define SHORTEST_PREFIX(PRED, out_key, out_id)                                   \
    {                                                                            \
        uint lo = 0u, hi = NONE;                                                 \
        if (PRED(hi, NONE)) lo = hi;                                             \
        while (hi - lo > 1u) {                                                   \
            const uint mid = lo + (hi - lo) / 2u;                                \
            if (PRED(mid, NONE)) lo = mid; else hi = mid;                        \
        }                                                                        \
        out_key = lo;                                                            \
        uint jlo = 0u, jhi = V() - 1u;                                           \
        if (PRED(out_key, 0u)) jhi = 0u;                                         \
        while (jhi - jlo > 1u) {                                                 \
            const uint mid = jlo + (jhi - jlo) / 2u;                             \
            if (PRED(out_key, mid)) jhi = mid; else jlo = mid;                   \
        }                                                                        \
        out_id = jhi;                                                            \
    }

void row_norm(uint r) {
    const uint l = gl_LocalInvocationID.x;
    const float m = row_max(r);
    uint cut_key = 0u, cut_id = NONE;
    float sum;
    if ((pc.u11 & kVerifyFlagFiltered) == 0u) {
        sum = lane_tree(l < tiles() ? uintBitsToFloat(b3[tile_sum_at(r, l)]) : 0.0);
    } else {
        uint k_key = 0u, k_id = NONE;
        if (pc.u5 > 0u && pc.u5 < V()) {
#define TOP_K(key, id) (count_in(r, key, id) >= pc.u5)
            SHORTEST_PREFIX(TOP_K, k_key, k_id)
        }
        cut_key = k_key;
        cut_id = k_id;
        if (pc.f1 < 1.0) {
            precise float target = pc.f1 * mass_in(r, m, 0u, NONE, k_key, k_id);
#define TOP_P(key, id) (mass_in(r, m, key, id, k_key, k_id) >= target)
            SHORTEST_PREFIX(TOP_P, cut_key, cut_id)
        }
        sum = mass_in(r, m, cut_key, cut_id, cut_key, cut_id);
    }
    if (l == 0u) {
        const uint at = norm_at(r);
        b3[at] = floatBitsToUint(m);
        b3[at + 1u] = cut_key;
        b3[at + 2u] = cut_id;
        b3[at + 3u] = floatBitsToUint(det_recip(sum));
    }
}

uint row_argmax(uint r) {
    float best = -1.0 / 0.0;
    uint arg = NONE;
    for (uint j = 0u; j < tiles(); ++j) {
        const float v = uintBitsToFloat(b3[tile_max_at(r, j)]);
        const uint id = b3[tile_arg_at(r, j)];
        if (better(v, id, best, arg)) {
            best = v;
            arg = id;
        }
    }
    return arg == NONE ? 0u : arg;
}

void accept(uint b) {
    uint n = 0u;
    if (greedy()) {
        while (n < gamma() && row_argmax(target_row(b, n)) == draft_token(b, n)) ++n;
        b3[accepted_at(b)] = n;
        write_outputs(b, n, row_argmax(target_row(b, n)));
        return;
    }
    for (; n < gamma(); ++n) {
        const uint x = draft_token(b, n);
        const float p = prob(target_row(b, n), x), q = prob(draft_row(b, n), x);
        const float u = philox_uniform(seed(), kStreamAccept, pc.u7, noise_row(b, n), 0u);
        precise float uq = u * q;
        if (!(uq < p)) break;
    }
    b3[accepted_at(b)] = n;
}

void race(uint b, uint j) {
    const uint l = gl_LocalInvocationID.x;
    const uint n = b3[accepted_at(b)];
    const uint pr = target_row(b, n);
    const bool has_q = n < gamma();
    float best_a = 0.0, best_p = 0.0;
    uint arg_a = NONE, arg_p = NONE;
    for (uint k = 0u; k < kDetLaneItems; ++k) {
        const uint x = j * kDetTile + k * kDetLanes + l;
        if (x >= V()) break;
        const float p = prob(pr, x);
        if (!(p > 0.0)) continue;
        const float q = has_q ? prob(draft_row(b, n), x) : 0.0;
        const float u = philox_uniform(seed(), pc.u6, pc.u7, noise_row(b, n), x);
        precise float ax = max(0.0, p - q);
        if (arg_p != NONE && race_cannot_win(p, best_p, u) &&
            (arg_a == NONE ? !(ax > 0.0) : race_cannot_win(ax, best_a, u)))
            continue;
        const float w = race_weight(u);
        precise float a = ax * w;
        precise float s = p * w;
        if (a > 0.0 && better(a, x, best_a, arg_a)) {
            best_a = a;
            arg_a = x;
        }
        if (better(s, x, best_p, arg_p)) {
            best_p = s;
            arg_p = x;
        }
    }
    reduce_best(best_a, arg_a, best_p, arg_p);
    if (l == 0u) {
        const uint at = race_at(b, j);
        b3[at] = floatBitsToUint(sh_f[0]);
        b3[at + 1u] = sh_u[0];
        b3[at + 2u] = floatBitsToUint(sh_g[0]);
        b3[at + 3u] = sh_v[0];
    }
}

void finish(uint b) {
    float best_a = 0.0, best_p = 0.0;
    uint arg_a = NONE, arg_p = NONE;
    for (uint j = 0u; j < tiles(); ++j) {
        const uint at = race_at(b, j);
        if (better(uintBitsToFloat(b3[at]), b3[at + 1u], best_a, arg_a)) {
            best_a = uintBitsToFloat(b3[at]);
            arg_a = b3[at + 1u];
        }
        if (better(uintBitsToFloat(b3[at + 2u]), b3[at + 3u], best_p, arg_p)) {
            best_p = uintBitsToFloat(b3[at + 2u]);
            arg_p = b3[at + 3u];
        }
    }
    const uint token = arg_a != NONE ? arg_a : (arg_p != NONE ? arg_p : 0u);
    write_outputs(b, b3[accepted_at(b)], token);
}

void main() {
    const uint g = group_index();
    if (MODE == kVerifyPassTileMax) {
        tile_max(g / tiles(), g % tiles());
    } else if (MODE == kVerifyPassTileSum) {
        tile_sum(g / tiles(), g % tiles());
    } else if (MODE == kVerifyPassRowMax) {
        write_row_max(g);
    } else if (MODE == kVerifyPassRowNorm) {
        row_norm(g);
    } else if (MODE == kVerifyPassAccept) {
        if (gl_LocalInvocationID.x == 0u) accept(g);
    } else if (MODE == kVerifyPassRace) {
        race(g / tiles(), g % tiles());
    } else {
        if (gl_LocalInvocationID.x == 0u) finish(g);
    }
}
