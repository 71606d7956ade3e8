#version 450
// out[c][r] = dot(w[r], x[c]) for c < n <= 16: each weight block is read once
// for all n columns. A row is shared by THREADS_PER_ROW threads (chosen from
// the row length alone), WG / THREADS_PER_ROW rows per workgroup. Every column
// is reduced in the same order whatever n is (batch invariance), and products
// accumulate through fma() so that no compiler contracts them differently in
// different columns.
//   binding 0: w (rows x cols, weight type), 1: x (n x cols, f32), 2: out (n x rows, f32)
// The per-column loops run to N, a specialization constant (1, 2, 4, 8 or 16: few
// pipelines to compile), so they unroll into registers; columns n..N-1 are skipped.
//   u0 = cols, u1 = rows, u2 = n (<= N), u3 = out row stride (floats)
#include "common.glsl"

layout(constant_id = 0) const uint WG = 64u;
layout(constant_id = 1) const uint THREADS_PER_ROW = 64u;
layout(constant_id = 2) const uint N = 1u;  // at least the number of columns

shared float partial[N][WG];

void main() {
    const uint tid = gl_LocalInvocationID.x, lane = tid % THREADS_PER_ROW;
    const uint row = group_index() * (WG / THREADS_PER_ROW) + tid / THREADS_PER_ROW;
    const bool valid = row < pc.u1;  // no early return: every thread reaches the barriers
    const uint cols = pc.u0, n = pc.u2;
    const uint row_bytes = cols / 32u * BLOCK_BYTES;
    float acc[N];
    for (uint c = 0u; c < N; ++c) acc[c] = 0.0;
    for (uint blk = lane; valid && blk < cols / 32u; blk += THREADS_PER_ROW) {
        float w[32];
        load_block(pc.off0 + row * row_bytes + blk * BLOCK_BYTES, w);
        for (uint c = 0u; c < N; ++c) {
            if (c >= n) break;
            const uint xo = pc.off1 / 4u + c * cols + blk * 32u;
            float s = 0.0;
            [[unroll]] for (uint j = 0u; j < 32u; ++j) s = fma(w[j], uintBitsToFloat(b1[xo + j]), s);
            acc[c] += s;
        }
    }
    for (uint c = 0u; c < N; ++c) partial[c][tid] = acc[c];
    barrier();
    for (uint stride = THREADS_PER_ROW / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride)
            for (uint c = 0u; c < N; ++c) partial[c][tid] += partial[c][tid + stride];
        barrier();
    }
    if (valid && lane == 0u)
        for (uint c = 0u; c < N && c < n; ++c) b2[pc.off2 / 4u + c * pc.u3 + row] = floatBitsToUint(partial[c][tid]);
}
