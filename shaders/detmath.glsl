// Bit-identical copies of lib/core/detmath.h and lib/core/philox.h: read the
// comments there. Every value is `precise` (no contraction or reassociation)
// and every constant is given by its bits.

const float DET_EXP_CUTOFF = -40.0;
const uint DET_LANES = 256u;
const uint DET_LANE_ITEMS = 16u;
const uint DET_TILE = DET_LANES * DET_LANE_ITEMS;

float det_exp(float x) {
    if (!(x >= DET_EXP_CUTOFF)) return 0.0;
    precise float k = floor(x * uintBitsToFloat(0x3FB8AA3Bu) + 0.5);
    precise float r = (x - k * uintBitsToFloat(0x3F317200u)) - k * uintBitsToFloat(0x35BFBE8Eu);
    precise float p = uintBitsToFloat(0x39500D01u);
    p = p * r + uintBitsToFloat(0x3AB60B61u);
    p = p * r + uintBitsToFloat(0x3C088889u);
    p = p * r + uintBitsToFloat(0x3D2AAAABu);
    p = p * r + uintBitsToFloat(0x3E2AAAABu);
    p = p * r + uintBitsToFloat(0x3F000000u);
    p = p * r + 1.0;
    p = p * r + 1.0;
    precise float result = p * uintBitsToFloat(uint(127 + int(k)) << 23);
    return result;
}

float det_recip(float z) {
    precise float r = uintBitsToFloat(0x7EF311C3u - floatBitsToUint(z));
    [[unroll]] for (int i = 0; i < 4; ++i) r = r * (2.0 - z * r);
    return r;
}

float det_log(float u) {
    const uint b = floatBitsToUint(u);
    int e = int(b >> 23) - 127;
    precise float f = uintBitsToFloat((b & 0x007FFFFFu) | 0x3F800000u);
    if (f > uintBitsToFloat(0x3FB504F3u)) {
        f = f * 0.5;
        e = e + 1;
    }
    precise float y = f - 1.0;
    precise float t = y * det_recip(y + 2.0);
    precise float t2 = t * t;
    precise float s = uintBitsToFloat(0x3DBA2E8Cu);
    s = s * t2 + uintBitsToFloat(0x3DE38E39u);
    s = s * t2 + uintBitsToFloat(0x3E124925u);
    s = s * t2 + uintBitsToFloat(0x3E4CCCCDu);
    s = s * t2 + uintBitsToFloat(0x3EAAAAABu);
    s = s * t2 + 1.0;
    precise float ef = float(e);
    precise float low = (t + t) * s + ef * uintBitsToFloat(0x35BFBE8Eu);
    precise float result = ef * uintBitsToFloat(0x3F317200u) + low;
    return result;
}

uint order_key(float s) {
    const uint b = floatBitsToUint(s);
    return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
}

uvec4 philox4x32_10(uvec4 c, uvec2 k) {
    [[unroll]] for (int round = 0; round < 10; ++round) {
        uint hi0, lo0, hi1, lo1;
        umulExtended(0xD2511F53u, c.x, hi0, lo0);
        umulExtended(0xCD9E8D57u, c.z, hi1, lo1);
        c = uvec4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k += uvec2(0x9E3779B9u, 0xBB67AE85u);
    }
    return c;
}

// The uniform in (0, 1) at (seed, stream, step, row, element).
float philox_uniform(uvec2 seed, uint stream, uint step, uint row, uint element) {
    const uint bits = philox4x32_10(uvec4(element, row, step, stream), seed).x;
    precise float u = (float(bits >> 9) + 0.5) * uintBitsToFloat(0x34000000u);
    return u;
}

float race_weight(float u) {
    precise float e = -det_log(u);
    return det_recip(e);
}

bool race_cannot_win(float a, float best, float u) {
    precise float bound = best * ((1.0 - u) * 0.999);
    return a < bound;
}
