#version 450
// The inputs of a kernel-3, padding-1 convolution as rows (Backend::im2col3): element (t, j) of
// out, j = 3c + k < 3C, is x[stride * t + k - 1][c], 0 outside x and in columns j >= 3C.
//   binding 0: x (T rows of C), 1: out; u0 = out elements, u1 = out cols, u2 = C, u3 = T,
//   u4 = stride
#include "common.glsl"

layout(constant_id = 0) const uint WG = 64u;

void main() {
    const uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.u0) return;
    const uint t = i / pc.u1, j = i % pc.u1;
    float v = 0.0;
    if (j < 3u * pc.u2) {
        const int src = int(pc.u4 * t + j % 3u) - 1;
        if (src >= 0 && src < int(pc.u3)) v = uintBitsToFloat(b0[pc.off0 / 4u + uint(src) * pc.u2 + j / 3u]);
    }
    b1[pc.off1 / 4u + i] = floatBitsToUint(v);
}
