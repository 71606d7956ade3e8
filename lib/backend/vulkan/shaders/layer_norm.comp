#version 450
// out[r] = (x[r] - mean) / sqrt(var + eps) * weight + bias; one workgroup per row, the mean and
// then the variance (population) each summed by a tree in shared memory.
//   binding 0: x, 1: weight, 2: bias, 3: out; u0 = cols, u1 = rows; f0 = eps
#include "common.glsl"

layout(constant_id = 0) const uint WG = 64u;
shared float partial[WG];

float row_sum(float s) {
    const uint tid = gl_LocalInvocationID.x;
    partial[tid] = s;
    barrier();
    for (uint stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride) partial[tid] += partial[tid + stride];
        barrier();
    }
    const float total = partial[0];
    barrier();  // partial is written again by the next sum
    return total;
}

void main() {
    const uint row = group_index();
    if (row >= pc.u1) return;
    const uint cols = pc.u0, tid = gl_LocalInvocationID.x;
    const uint xo = pc.off0 / 4u + row * cols;
    float s = 0.0;
    for (uint i = tid; i < cols; i += WG)
        s += uintBitsToFloat(b0[xo + i]);
    const float mean = row_sum(s) / float(cols);
    s = 0.0;
    for (uint i = tid; i < cols; i += WG) {
        const float d = uintBitsToFloat(b0[xo + i]) - mean;
        s = fma(d, d, s);
    }
    const float scale = 1.0 / sqrt(row_sum(s) / float(cols) + pc.f0);
    for (uint i = tid; i < cols; i += WG)
        b3[pc.off3 / 4u + row * cols + i] = floatBitsToUint(
            (uintBitsToFloat(b0[xo + i]) - mean) * scale * uintBitsToFloat(b1[pc.off1 / 4u + i]) +
            uintBitsToFloat(b2[pc.off2 / 4u + i]));
}
