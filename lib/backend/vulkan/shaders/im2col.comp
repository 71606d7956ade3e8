#version 450
// The inputs of a convolution as rows (Backend::im2col): element (t, j) of out, j = K c + k <
// K C, is x[stride * t + k - padding][c], 0 outside x and in columns j >= K C.
//   binding 0: x (T rows of C), 1: out; u0 = out elements, u1 = out cols, u2 = C, u3 = T,
//   u4 = stride, u5 = K (kernel taps), u6 = padding
#include "common.glsl"

layout(constant_id = 0) const uint WG = 64u;

void main() {
    const uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.u0) return;
    const uint t = i / pc.u1, j = i % pc.u1;
    float v = 0.0;
    if (j < pc.u5 * pc.u2) {
        const int src = int(pc.u4 * t + j % pc.u5) - int(pc.u6);
        if (src >= 0 && src < int(pc.u3)) v = uintBitsToFloat(b0[pc.off0 / 4u + uint(src) * pc.u2 + j / pc.u5]);
    }
    b1[pc.off1 / 4u + i] = floatBitsToUint(v);
}
