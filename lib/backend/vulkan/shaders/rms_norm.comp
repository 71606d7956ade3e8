#version 450
// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight; one workgroup per row.
//   binding 0: x, 1: weight, 2: out; u0 = cols, u1 = rows; f0 = eps
#include "common.glsl"

layout(constant_id = 0) const uint WG = 64u;
shared float partial[WG];

void main() {
    const uint row = group_index();
    if (row >= pc.u1) return;
    const uint cols = pc.u0, tid = gl_LocalInvocationID.x;
    const uint xo = pc.off0 / 4u + row * cols;
    float s = 0.0;
    for (uint i = tid; i < cols; i += WG) {
        const float v = uintBitsToFloat(b0[xo + i]);
        s = fma(v, v, s);
    }
    partial[tid] = s;
    barrier();
    for (uint stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride) partial[tid] += partial[tid + stride];
        barrier();
    }
    const float scale = 1.0 / sqrt(partial[0] / float(cols) + pc.f0);
    for (uint i = tid; i < cols; i += WG)
        b2[pc.off2 / 4u + row * cols + i] =
            floatBitsToUint(uintBitsToFloat(b0[xo + i]) * scale * uintBitsToFloat(b1[pc.off1 / 4u + i]));
}
