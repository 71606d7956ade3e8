#version 450
// Element-wise ops over u0 floats, chosen by u1:
//   1: out = act(a) * b (act: u2, device_abi.h's kActivation*)   2: out = a (copy)
//   3: out = act(a) (act: u2)
//   4: out = a + b[i % u2] (b one row of u2 floats broadcast over a's rows, or all of a's shape)
//   5: out = a * f0           6: out = f0 * tanh(a / f0)
//   7: out = the IEEE half nearest a (ties to even; from 65520 on, infinity), as a float
//   binding 0: a, 1: b, 2: out
#include "common.glsl"

layout(constant_id = 0) const uint WG = 64u;

// In bits, not packHalf2x16, whose rounding the specification leaves to the device: a normal
// half's range rounds its 13 dropped bits to even in place, below it multiples of 2^-24.
float nearest_half(float a) {
    const uint u = floatBitsToUint(a);
    const uint magnitude = u & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return a;  // NaN
    if (magnitude >= 0x477ff000u) return uintBitsToFloat((u & 0x80000000u) | 0x7f800000u);
    if (magnitude < 0x38800000u) return roundEven(a * 16777216.0) * (1.0 / 16777216.0);
    return uintBitsToFloat((u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u);
}

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
    } else if (pc.u1 == 7u) {
        r = nearest_half(a);
    } else {
        r = a;
    }
    b2[pc.off2 / 4u + i] = floatBitsToUint(r);
}
