#version 450
// Element-wise ops over u0 floats, chosen by u1:
//   1: out = silu(a) * b      2: out = a (copy)
//   binding 0: a, 1: b, 2: out
#include "common.glsl"

layout(constant_id = 0) const uint WG = 64u;

void main() {
    const uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.u0) return;
    const float a = uintBitsToFloat(b0[pc.off0 / 4u + i]);
    float r;
    if (pc.u1 == 1u) {
        r = silu_times(a, uintBitsToFloat(b1[pc.off1 / 4u + i]));
    } else {
        r = a;
    }
    b2[pc.off2 / 4u + i] = floatBitsToUint(r);
}
