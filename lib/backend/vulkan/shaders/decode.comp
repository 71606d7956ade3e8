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
// The kept set's search (row_norm): the lane partials of kTileGroup tiles (mass_in), or
// kHistCopies histograms of a radix pass (a quarter of the workgroup each, so fewer atomic adds
// meet on one bin); the first kGather tokens of the rank order. With the arrays above 13 KiB of
// shared memory, under the 16 KiB every Vulkan device has.
const uint kTileGroup = 4u, kRadix = 256u, kHistCopies = 4u, kGather = 512u;
shared uint sh_big[kTileGroup * kDetLanes];  // also kHistCopies * kRadix
shared uint sh_ranked_key[kGather];
shared uint sh_ranked_id[kGather];
shared uint sh_pick[2];

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

// The canonical sum of e(x) over the tokens inside both cuts. The lane partials of kTileGroup
// tiles are summed by their trees side by side (each tree's pairs as lane_tree adds them), a
// barrier per level for the group rather than per level and tile.
float mass_in(uint r, float m, uint cut_key, uint cut_id, uint k_key, uint k_id) {
    const uint l = gl_LocalInvocationID.x;
    for (uint j0 = 0u; j0 < tiles(); j0 += kTileGroup) {
        const uint group = min(kTileGroup, tiles() - j0);
        for (uint g = 0u; g < group; ++g) {
            precise float acc = 0.0;
            for (uint k = 0u; k < kDetLaneItems; ++k) {
                const uint x = (j0 + g) * kDetTile + k * kDetLanes + l;
                if (x >= V()) break;
                const float s = scaled(r, x);
                const uint key = order_key(s);
                if (in_cut(key, x, cut_key, cut_id) && in_cut(key, x, k_key, k_id))
                    acc = acc + det_exp(s - m);
            }
            sh_big[g * kDetLanes + l] = floatBitsToUint(acc);
        }
        for (uint stride = WG / 2u; stride > 0u; stride >>= 1) {
            barrier();
            for (uint i = l; i < group * stride; i += WG) {
                const uint at = (i / stride) * kDetLanes + i % stride;
                precise float t =
                    uintBitsToFloat(sh_big[at]) + uintBitsToFloat(sh_big[at + stride]);
                sh_big[at] = floatBitsToUint(t);
            }
        }
        barrier();
        if (l < group) sh_tiles[j0 + l] = uintBitsToFloat(sh_big[l * kDetLanes]);
        barrier();
    }
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

// Ranked selection and the kept set's search. The rank order is key descending, id ascending;
// the kept set of a filtered row is a prefix of it. SHORTEST_PREFIX finds a prefix by bisecting
// the key space (32 steps) and then the ids (log2 V steps), a pass over the row per step; the
// functions below find the same prefix in fewer passes: the L-th token of the order by radix
// selection (counts of each key byte, then id byte: exact in any order of adding), and a top-p
// prefix by gathering the L first tokens, sorting them, and bisecting their ranks. Every mass
// compared is mass_in's canonical sum of the same set, so the cut is the one SHORTEST_PREFIX
// finds (the set of a rank prefix determines its mass; mass grows with the prefix).

// One radix pass over row r: the byte at shift of the keys (by_id false: of the tokens whose
// key has the bits of prefix under mask) or of the ids (by_id: of the tokens of key `key` whose
// id has the bits of prefix under mask), counted; the bin holding the need-th of them, bins
// taken from the highest down for keys and the lowest up for ids. Returns the bin; need becomes
// the token's place among its bin's.
uint radix_pass(uint r, bool by_id, uint key, uint prefix, uint mask, uint shift, inout uint need) {
    const uint l = gl_LocalInvocationID.x;
    for (uint i = l; i < kHistCopies * kRadix; i += WG) sh_big[i] = 0u;
    barrier();
    const uint copy = l / (WG / kHistCopies);
    for (uint x = l; x < V(); x += WG) {
        const uint k = order_key(scaled(r, x));
        const uint bits = by_id ? x : k;
        if ((by_id ? k == key : true) && (bits & mask) == prefix)
            atomicAdd(sh_big[copy * kRadix + ((bits >> shift) & (kRadix - 1u))], 1u);
    }
    barrier();
    // Position p of the scan is bin p (ids) or 255 - p (keys); an inclusive scan over positions.
    const uint bin = by_id ? l : kRadix - 1u - l;
    uint count = 0u;
    if (l < kRadix)
        for (uint c = 0u; c < kHistCopies; ++c) count += sh_big[c * kRadix + bin];
    sh_u[l] = count;
    for (uint o = 1u; o < kRadix; o <<= 1) {
        barrier();
        const uint t = l >= o && l < kRadix ? sh_u[l - o] : 0u;
        barrier();
        sh_u[l] += t;
    }
    barrier();
    if (l < kRadix && sh_u[l] - count < need && need <= sh_u[l]) {
        sh_pick[0] = bin;
        sh_pick[1] = need - (sh_u[l] - count);
    }
    barrier();
    const uint picked = sh_pick[0];
    need = sh_pick[1];
    barrier();
    return picked;
}

// The key and id of the L-th token of the rank order of row r (1 <= L <= V).
void select_ranked(uint r, uint L, out uint out_key, out uint out_id) {
    uint need = L, key = 0u, mask = 0u;
    for (int shift = 24; shift >= 0; shift -= 8) {
        key |= radix_pass(r, false, 0u, key, mask, uint(shift), need) << uint(shift);
        mask |= (kRadix - 1u) << uint(shift);
    }
    uint id = 0u;
    mask = 0u;
    const int top = V() > 1u ? findMSB(V() - 1u) : 0;  // the largest id's top bit
    for (int shift = top / 8 * 8; shift >= 0; shift -= 8) {
        id |= radix_pass(r, true, key, id, mask, uint(shift), need) << uint(shift);
        mask |= (kRadix - 1u) << uint(shift);
    }
    out_key = key;
    out_id = id;
}

// The L (<= kGather) tokens of the prefix cut (cut_key, cut_id) into sh_ranked_*, in rank order.
bool ranked_before(uint a, uint b) {
    return sh_ranked_key[a] > sh_ranked_key[b] ||
           (sh_ranked_key[a] == sh_ranked_key[b] && sh_ranked_id[a] < sh_ranked_id[b]);
}
void gather_ranked(uint r, uint L, uint cut_key, uint cut_id) {
    const uint l = gl_LocalInvocationID.x;
    if (l == 0u) sh_pick[0] = 0u;
    barrier();
    for (uint x = l; x < V(); x += WG) {
        const uint key = order_key(scaled(r, x));
        if (in_cut(key, x, cut_key, cut_id)) {
            const uint i = atomicAdd(sh_pick[0], 1u);
            if (i < kGather) {  // L of them: the cut is the L-th token's
                sh_ranked_key[i] = key;
                sh_ranked_id[i] = x;
            }
        }
    }
    uint P = 1u;
    while (P < L) P <<= 1;
    for (uint i = L + l; i < P; i += WG) {  // after every token
        sh_ranked_key[i] = 0u;
        sh_ranked_id[i] = NONE;
    }
    barrier();
    for (uint k = 2u; k <= P; k <<= 1) {  // bitonic sort into rank order
        for (uint j = k >> 1; j > 0u; j >>= 1) {
            for (uint i = l; i < P; i += WG) {
                const uint partner = i ^ j;
                const bool out_of_order =
                    (i & k) == 0u ? ranked_before(partner, i) : ranked_before(i, partner);
                if (partner > i && out_of_order) {
                    const uint tk = sh_ranked_key[i], ti = sh_ranked_id[i];
                    sh_ranked_key[i] = sh_ranked_key[partner];
                    sh_ranked_id[i] = sh_ranked_id[partner];
                    sh_ranked_key[partner] = tk;
                    sh_ranked_id[partner] = ti;
                }
            }
            barrier();
        }
    }
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
        const bool top_k = pc.u5 > 0u && pc.u5 < V();
        if (top_k) select_ranked(r, pc.u5, k_key, k_id);
        cut_key = k_key;
        cut_id = k_id;
        if (pc.f1 < 1.0) {
            precise float target = pc.f1 * mass_in(r, m, 0u, NONE, k_key, k_id);
#define TOP_P(key, id) (mass_in(r, m, key, id, k_key, k_id) >= target)
            // The nucleus among the first 64 tokens, else the first kGather, of the top-k set
            // (the whole set reaches the target: its mass is the target's); mass(prefix lo) <
            // target throughout (the empty prefix's 0 to begin with).
            const uint length = top_k ? pc.u5 : V();
            bool found = false;
            uint lo = 0u;
            for (uint attempt = 0u; attempt < 2u; ++attempt) {
                const uint L = min(attempt == 0u ? 64u : kGather, length);
                if (found || !(target > 0.0) || L <= lo) break;
                uint L_key = k_key, L_id = k_id;
                if (L < length) {
                    select_ranked(r, L, L_key, L_id);
                    if (!TOP_P(L_key, L_id)) {
                        lo = L;
                        continue;
                    }
                }
                gather_ranked(r, L, L_key, L_id);
                uint hi = L;
                while (hi - lo > 1u) {
                    const uint mid = lo + (hi - lo) / 2u;
                    if (TOP_P(sh_ranked_key[mid - 1u], sh_ranked_id[mid - 1u]))
                        hi = mid;
                    else
                        lo = mid;
                }
                cut_key = sh_ranked_key[hi - 1u];
                cut_id = sh_ranked_id[hi - 1u];
                found = true;
            }
            if (!found) SHORTEST_PREFIX(TOP_P, cut_key, cut_id)
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
