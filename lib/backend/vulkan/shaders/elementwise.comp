#version 450
// Element-wise ops over u0 floats, chosen by u1:
//   1: out = act(a) * b (act: u2, device_abi.h's kActivation*)   2: out = a (copy)
//   3: out = act(a) (act: u2)
//   4: out = a + b[i % u2] (b one row of u2 floats broadcast over a's rows, or all of a's shape)
//   5: out = a * f0           6: out = f0 * tanh(a / f0)
//   binding 0: a, 1: b, 2: out
#include "common.glsl"

layout(constant_id = 0) const uint WG = 64u;

void main() {
    const uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.u0) return;
    const float a = uintBitsToFloat(b0[pc.off0 / 4u + i]);
    float r;
    if (pc.u1 == 1u) {
        r = gated_times(pc.u2, a, uintBitsToFloat(b1[pc.off1 / 4u + i]));
    } else if (pc.u1 == 3u) {
        r = activated(pc.u2, a);
    } else if (pc.u1 == 4u) {
        r = a + uintBitsToFloat(b1[pc.off1 / 4u + i % pc.u2]);
    } else if (pc.u1 == 5u) {
        r = a * pc.f0;
    } else if (pc.u1 == 6u) {
        // tanh as e^x ratios overflows for large x; tanh(±10) is already ±1 in floats.
        r = tanh(clamp(a * (1.0 / pc.f0), -10.0, 10.0)) * pc.f0;
    } else {
        r = a;
    }
    b2[pc.off2 / 4u + i] = floatBitsToUint(r);
}
