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

layout(std430, binding = 1) readonly buffer XVectors { vec4 x4[]; };  // binding 1 again

// (row, column) sums reduced per round through shared memory: no more than there are
// (shared memory costs every workgroup, on some devices per byte).
const uint PAIRS = R * N < 32u ? R * N : 32u;
shared float partial[PAIRS][WG];
// One sum per (row, column) and subgroup on the subgroup path.
const uint SUBGROUPS = WG / (SUBGROUP > 4u ? SUBGROUP : 4u);
shared float subgroup_sums[R * N][SUBGROUP > 0u ? SUBGROUPS : 1u];

void write_out(uint i, uint r0, float v) {
    const uint r = i / N, c = i % N;
    const uint at = pc.off2 / 4u + c * pc.u3 + r0 + r;
    if (c < pc.u2 && r0 + r < pc.u1) b2[at] = floatBitsToUint(pc.u4 != 0u ? uintBitsToFloat(b2[at]) + v : v);
}

void main() {
    const uint t = gl_LocalInvocationID.x, l = t % T, q = l % 4u;
    const uint r0 = (group_index() * (WG / T) + t / T) * R;
    const uint cols = pc.u0, rows = pc.u1, n = pc.u2;
    const uint blocks = cols / 32u, row_bytes = blocks * BLOCK_BYTES;
    float acc[R * N];
    [[unroll]] for (uint i = 0u; i < R * N; ++i) acc[i] = 0.0;
    for (uint b = l / 4u; b < blocks; b += T / 4u) {
        float wq[R * 8u];
        [[unroll]] for (uint r = 0u; r < R; ++r) {
            float w8[8];
            if (r0 + r < rows) {
                load_quarter(pc.off0 + (r0 + r) * row_bytes + b * BLOCK_BYTES, q, w8);
            } else {
                [[unroll]] for (uint j = 0u; j < 8u; ++j) w8[j] = 0.0;
            }
            [[unroll]] for (uint j = 0u; j < 8u; ++j) wq[8u * r + j] = w8[j];
        }
        [[unroll]] for (uint c = 0u; c < N; ++c) {
            if (c >= n) break;
            const uint xi = pc.off1 / 16u + (c * cols + b * 32u + q * 8u) / 4u;
            const vec4 lo = x4[xi], hi = x4[xi + 1u];
            [[unroll]] for (uint r = 0u; r < R; ++r) {
                float s = wq[8u * r] * lo.x;
                s = fma(wq[8u * r + 1u], lo.y, s);
                s = fma(wq[8u * r + 2u], lo.z, s);
                s = fma(wq[8u * r + 3u], lo.w, s);
                s = fma(wq[8u * r + 4u], hi.x, s);
                s = fma(wq[8u * r + 5u], hi.y, s);
                s = fma(wq[8u * r + 6u], hi.z, s);
                s = fma(wq[8u * r + 7u], hi.w, s);
                acc[r * N + c] += s;
            }
        }
    }
    if (SUBGROUP > 0u) {
        [[unroll]] for (uint i = 0u; i < R * N; ++i) {
            float v = acc[i];
            for (uint m = SUBGROUP / 2u; m > 0u; m /= 2u) v += subgroupShuffleXor(v, m);
            if (t % SUBGROUP == 0u) subgroup_sums[i][t / SUBGROUP] = v;
        }
        barrier();
        const uint first = (t - l) / SUBGROUP;  // this group's subgroups, in order
        for (uint i = l; i < R * N; i += T) {
            float v = subgroup_sums[i][first];
            for (uint k = 1u; k < T / SUBGROUP; ++k) v += subgroup_sums[i][first + k];
            write_out(i, r0, v);
        }
        return;
    }
    [[unroll]] for (uint p0 = 0u; p0 < R * N; p0 += PAIRS) {
        [[unroll]] for (uint k = 0u; k < PAIRS; ++k)
            if (p0 + k < R * N) partial[k][t] = acc[p0 + k];
        barrier();
        for (uint stride = T / 2u; stride > 0u; stride /= 2u) {
            if (l < stride)
                [[unroll]] for (uint k = 0u; k < PAIRS; ++k)
                    if (p0 + k < R * N) partial[k][t] += partial[k][t + stride];
            barrier();
        }
        for (uint k = l; k < PAIRS && p0 + k < R * N; k += T) write_out(p0 + k, r0, partial[k][t - l]);
        barrier();
    }
}
