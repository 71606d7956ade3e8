// Bit-identical copies of lib/core/detmath.h and lib/core/philox.h: read the
// comments there. Every value is `precise` (no contraction or reassociation)
// and every constant is given by its bits.

// Their constants, the canonical-sum geometry and the stream ids come from
// lib/core/device_abi.h (included by common.glsl).

float det_exp(float x) {
    if (!(x >= uintBitsToFloat(kBitsExpCutoff))) return 0.0;
    precise float k = floor(x * uintBitsToFloat(kBitsLog2E) + 0.5);
    precise float r = (x - k * uintBitsToFloat(kBitsLn2Hi)) - k * uintBitsToFloat(kBitsLn2Lo);
    precise float p = uintBitsToFloat(kBitsInv7Fact);
    p = p * r + uintBitsToFloat(kBitsInv6Fact);
    p = p * r + uintBitsToFloat(kBitsInv5Fact);
    p = p * r + uintBitsToFloat(kBitsInv4Fact);
    p = p * r + uintBitsToFloat(kBitsInv3Fact);
    p = p * r + uintBitsToFloat(kBitsInv2Fact);
    p = p * r + 1.0;
    p = p * r + 1.0;
    precise float result = p * uintBitsToFloat(uint(127 + int(k)) << 23);
    return result;
}

float det_recip(float z) {
    precise float r = uintBitsToFloat(kRecipMagic - floatBitsToUint(z));
    [[unroll]] for (int i = 0; i < 4; ++i) r = r * (2.0 - z * r);
    return r;
}

float det_log(float u) {
    const uint b = floatBitsToUint(u);
    int e = int(b >> 23) - 127;
    precise float f = uintBitsToFloat((b & 0x007FFFFFu) | 0x3F800000u);
    if (f > uintBitsToFloat(kBitsSqrt2)) {
        f = f * 0.5;
        e = e + 1;
    }
    precise float y = f - 1.0;
    precise float t = y * det_recip(y + 2.0);
    precise float t2 = t * t;
    precise float s = uintBitsToFloat(kBitsInv11);
    s = s * t2 + uintBitsToFloat(kBitsInv9);
    s = s * t2 + uintBitsToFloat(kBitsInv7);
    s = s * t2 + uintBitsToFloat(kBitsInv5);
    s = s * t2 + uintBitsToFloat(kBitsInv3);
    s = s * t2 + 1.0;
    precise float ef = float(e);
    precise float low = (t + t) * s + ef * uintBitsToFloat(kBitsLn2Lo);
    precise float result = ef * uintBitsToFloat(kBitsLn2Hi) + low;
    return result;
}

uint order_key(float s) {
    const uint b = floatBitsToUint(s);
    return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
}

uvec4 philox4x32_10(uvec4 c, uvec2 k) {
    [[unroll]] for (int round = 0; round < 10; ++round) {
        uint hi0, lo0, hi1, lo1;
        umulExtended(kPhiloxMul0, c.x, hi0, lo0);
        umulExtended(kPhiloxMul1, c.z, hi1, lo1);
        c = uvec4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k += uvec2(kPhiloxWeyl0, kPhiloxWeyl1);
    }
    return c;
}

// The uniform in (0, 1) at (seed, stream, step, row, element).
float philox_uniform(uvec2 seed, uint stream, uint step, uint row, uint element) {
    const uint bits = philox4x32_10(uvec4(element, row, step, stream), seed).x;
    precise float u = (float(bits >> 9) + 0.5) * uintBitsToFloat(kBitsTwoToMinus23);
    return u;
}

float race_weight(float u) {
    precise float e = -det_log(u);
    return det_recip(e);
}

bool race_cannot_win(float a, float best, float u) {
    precise float bound = best * ((1.0 - u) * uintBitsToFloat(kBitsRaceSlack));
    return a < bound;
}
