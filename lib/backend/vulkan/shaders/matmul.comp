#version 450
// out[c][r] = dot(w[r], x[c]) for c < n <= 16. A workgroup holds WG / T groups of T
// threads (T from the row length alone), and each group computes R rows for N
// columns: thread l of a group takes quarter l % 4 of blocks l / 4, l / 4 + T / 4,
// ... of each of its rows, so neighbouring threads read neighbouring weight blocks
// and 16-byte pieces of x, and each x value loaded serves all R rows. A row's sum is
// reduced in one fixed order (per thread in block order, then a butterfly over each
// subgroup and the subgroups in order, or without usable subgroups a tree over the
// group in shared memory) that depends neither on n nor on R: batch invariant. Products go through
// fma() so that no compiler contracts them differently in different pipelines.
//   binding 0: w (rows x cols, weight type), 1: x (n x cols, f32, 16-byte aligned),
//   2: out (n x rows, f32)
// GATED = 1 + act (device_abi.h's kActivation*): out[c][r] = act(dot(w[r], x[c])) * dot(w3[r],
// x[c]) with w3 (the same shape and type) in binding 3: each group computes its R rows of both
// matrices, reduced as above.
// NORMED = 1: x[c] is first rms-normed with the weight in binding 4 (f32) and eps f0: x is read
// times the weight, each thread also sums the squares of the x it reads (in block order, like
// its products), that sum is reduced with the products, and every product of column c is then
// scaled by 1 / sqrt(mean(x[c]^2) + eps). The normed x never exists: no rms_norm dispatch, and
// no barrier between it and the matmuls.
// ROPE = 1 (never with GATED): out is rotated as rope.comp rotates it, pairs of rows (2j, 2j + 1)
// of the first u6 dims of every head of u5 rows, by the angles at table (binding 5, u6 floats
// per position) row positions[c] (binding 3, i32). R is even, so both rows of a pair are in
// one group.
// N is a specialization constant (1, 2, 4, 8 or 16: few pipelines to compile), so
// the per-column loops unroll into registers; columns n..N-1 are skipped.
//   u0 = cols, u1 = rows, u2 = n (<= N), u3 = out row stride (floats), u4 = 1: out += sum
#extension GL_KHR_shader_subgroup_shuffle : enable
#include "common.glsl"

layout(constant_id = 0) const uint WG = 128u;
layout(constant_id = 1) const uint R = 4u;  // rows per group
layout(constant_id = 2) const uint N = 1u;  // at least the number of columns
layout(constant_id = 3) const uint T = 128u;  // threads per group: a power of two, 4..WG
// The device's fixed subgroup size, at most T, with subgroups made of consecutive
// invocations; 0: no subgroup operations.
layout(constant_id = 4) const uint SUBGROUP = 0u;
layout(constant_id = 5) const uint GATED = 0u;
layout(constant_id = 6) const uint NORMED = 0u;
layout(constant_id = 7) const uint ROPE = 0u;

const uint MATRICES = GATED != 0u ? 2u : 1u;
const uint PRODUCTS = MATRICES * R * N;  // matrix m, row r, column c at (m * R + r) * N + c
const uint SUMS = PRODUCTS + (NORMED != 0u ? N : 0u);  // then column c's sum of squares
const uint GROUPS = WG / T;

layout(std430, binding = 1) readonly buffer XVectors { vec4 x4[]; };  // binding 1 again
layout(std430, binding = 4) readonly buffer NormVectors { vec4 norm4[]; };  // binding 4 again

// Without subgroups, (row, column) sums reduced per round through shared memory: no more than
// there are (shared memory costs every workgroup, on some devices per byte); with subgroups,
// one row that is never used.
const uint PAIRS = SUMS < 32u ? SUMS : 32u;
shared float partial[SUBGROUP > 0u ? 1u : PAIRS][WG];
// One sum per (row, column) and subgroup on the subgroup path.
const uint SUBGROUPS = WG / (SUBGROUP > 4u ? SUBGROUP : 4u);
shared float subgroup_sums[SUMS][SUBGROUP > 0u ? SUBGROUPS : 1u];
// Gated, normed or rotated, a group's sums depend on each other (both products of a row; a
// column's sum of squares; the two rows of a pair): they wait here until all are reduced.
const bool STAGED = GATED != 0u || NORMED != 0u || ROPE != 0u;
shared float staged[STAGED ? GROUPS : 1u][STAGED ? SUMS : 1u];

void write_out(uint i, uint r0, float v) {
    const uint r = i / N, c = i % N;
    const uint at = pc.off2 / 4u + c * pc.u3 + r0 + r;
    if (c < pc.u2 && r0 + r < pc.u1) b2[at] = floatBitsToUint(pc.u4 != 0u ? uintBitsToFloat(b2[at]) + v : v);
}

// Sum i of group g is reduced: written out, or kept until the group's others are there.
void reduced(uint g, uint i, uint r0, float v) {
    if (STAGED) {
        staged[g][i] = v;
    } else {
        write_out(i, r0, v);
    }
}

void write_staged(uint g, uint l, uint r0) {
    if (!STAGED) return;
    barrier();
    for (uint i = l; i < R * N; i += T) {
        const uint r = i / N, c = i % N;
        // Normed, every sum of column c is scaled (times 1.0 otherwise: exact).
        const float scale =
            NORMED != 0u ? 1.0 / sqrt(staged[g][PRODUCTS + c] / float(pc.u0) + pc.f0) : 1.0;
        float v = staged[g][i] * scale;
        if (GATED != 0u) v = gated_times(GATED - 1u, v, staged[g][R * N + i] * scale);
        if (ROPE != 0u && c < pc.u2) {
            const uint d = (r0 + r) % pc.u5;  // the row's dimension in its head
            if (d < pc.u6) {
                const uint first = i - (r % 2u) * N;  // row r & ~1, column c
                const uint angle = pc.off5 / 4u + b3[pc.off3 / 4u + c] * pc.u6 + (d & ~1u);
                v = rotated(staged[g][first] * scale, staged[g][first + N] * scale,
                            uintBitsToFloat(b5[angle]), uintBitsToFloat(b5[angle + 1u]), r % 2u == 1u);
            }
        }
        write_out(i, r0, v);
    }
}

void main() {
    const uint t = gl_LocalInvocationID.x, l = t % T, q = l % 4u;
    const uint g = t / T, r0 = (group_index() * GROUPS + g) * R;
    const uint cols = pc.u0, rows = pc.u1, n = pc.u2;
    const uint blocks = cols / kBlockWeights, row_bytes = row_bytes_of(cols);
    float acc[SUMS];
    [[unroll]] for (uint i = 0u; i < SUMS; ++i) acc[i] = 0.0;
    for (uint b = l / 4u; b < blocks; b += T / 4u) {
        float wq[MATRICES * R * 8u];
        [[unroll]] for (uint mr = 0u; mr < MATRICES * R; ++mr) {  // matrix mr / R, row mr % R
            const uint r = mr % R, which = mr < R ? 0u : 3u;
            const uint off = mr < R ? pc.off0 : pc.off3;
            float w8[8];
            if (r0 + r < rows) {
                load_quarter(which, off + (r0 + r) * row_bytes, b, q, w8);
            } else {
                [[unroll]] for (uint j = 0u; j < 8u; ++j) w8[j] = 0.0;
            }
            [[unroll]] for (uint j = 0u; j < 8u; ++j) wq[8u * mr + j] = w8[j];
        }
        vec4 norm_lo = vec4(1.0), norm_hi = vec4(1.0);
        if (NORMED != 0u) {
            const uint ni = pc.off4 / 16u + (b * kBlockWeights + q * 8u) / 4u;
            norm_lo = norm4[ni];
            norm_hi = norm4[ni + 1u];
        }
        [[unroll]] for (uint c = 0u; c < N; ++c) {
            if (c >= n) break;
            const uint xi = pc.off1 / 16u + (c * cols + b * kBlockWeights + q * 8u) / 4u;
            vec4 lo = x4[xi], hi = x4[xi + 1u];
            if (NORMED != 0u) {
                float ss = lo.x * lo.x;
                ss = fma(lo.y, lo.y, ss);
                ss = fma(lo.z, lo.z, ss);
                ss = fma(lo.w, lo.w, ss);
                ss = fma(hi.x, hi.x, ss);
                ss = fma(hi.y, hi.y, ss);
                ss = fma(hi.z, hi.z, ss);
                ss = fma(hi.w, hi.w, ss);
                acc[PRODUCTS + c] += ss;
                lo *= norm_lo;
                hi *= norm_hi;
            }
            [[unroll]] for (uint mr = 0u; mr < MATRICES * R; ++mr) {
                float s = wq[8u * mr] * lo.x;
                s = fma(wq[8u * mr + 1u], lo.y, s);
                s = fma(wq[8u * mr + 2u], lo.z, s);
                s = fma(wq[8u * mr + 3u], lo.w, s);
                s = fma(wq[8u * mr + 4u], hi.x, s);
                s = fma(wq[8u * mr + 5u], hi.y, s);
                s = fma(wq[8u * mr + 6u], hi.z, s);
                s = fma(wq[8u * mr + 7u], hi.w, s);
                acc[mr * N + c] += s;
            }
        }
    }
    if (SUBGROUP > 0u) {
        [[unroll]] for (uint i = 0u; i < SUMS; ++i) {
            float v = acc[i];
            for (uint m = SUBGROUP / 2u; m > 0u; m /= 2u) v += subgroupShuffleXor(v, m);
            if (t % SUBGROUP == 0u) subgroup_sums[i][t / SUBGROUP] = v;
        }
        barrier();
        const uint first = (t - l) / SUBGROUP;  // this group's subgroups, in order
        for (uint i = l; i < SUMS; i += T) {
            float v = subgroup_sums[i][first];
            for (uint k = 1u; k < T / SUBGROUP; ++k) v += subgroup_sums[i][first + k];
            reduced(g, i, r0, v);
        }
        write_staged(g, l, r0);
        return;
    }
    [[unroll]] for (uint p0 = 0u; p0 < SUMS; p0 += PAIRS) {
        [[unroll]] for (uint k = 0u; k < PAIRS; ++k)
            if (p0 + k < SUMS) partial[k][t] = acc[p0 + k];
        barrier();
        for (uint stride = T / 2u; stride > 0u; stride /= 2u) {
            if (l < stride)
                [[unroll]] for (uint k = 0u; k < PAIRS; ++k)
                    if (p0 + k < SUMS) partial[k][t] += partial[k][t + stride];
            barrier();
        }
        for (uint k = l; k < PAIRS && p0 + k < SUMS; k += T) reduced(g, p0 + k, r0, partial[k][t - l]);
        barrier();
    }
    write_staged(g, l, r0);
}
