// Shared by every compute shader: six storage buffers seen as 32-bit words
// (no 8/16-bit storage needed), one push-constant block, and readers for the
// GGUF weight layouts. Offsets in the push constants are in bytes.
// Shaders that read weights are also built with SMALL_STORAGE, for devices with
// 8- and 16-bit storage: they then read halves, bytes and quants as such.
#extension GL_EXT_control_flow_attributes : enable
#include "device_abi.h"
#if defined(SMALL_STORAGE)
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_8bit_storage : require
#endif

layout(local_size_x_id = 0) in;

layout(std430, binding = 0) buffer Buffer0 { uint b0[]; };
layout(std430, binding = 1) buffer Buffer1 { uint b1[]; };
layout(std430, binding = 2) buffer Buffer2 { uint b2[]; };
layout(std430, binding = 3) buffer Buffer3 { uint b3[]; };
layout(std430, binding = 4) buffer Buffer4 { uint b4[]; };
layout(std430, binding = 5) buffer Buffer5 { uint b5[]; };

layout(push_constant) uniform PushConstants {
    uint off0, off1, off2, off3, off4, off5;  // byte offsets of the tensors in bindings 0..5
    uint u0, u1, u2, u3, u4, u5, u6, u7, u8, u9, u10, u11;
    float f0, f1;
} pc;

// The linear index of this workgroup when a large grid is folded into x and y.
uint group_index() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

// erf(x) to 1.5e-7 (device_abi.h's kErf*): GLSL has no erf.
float erf_approx(float x) {
    const float t = 1.0 / (1.0 + kErfP * abs(x));
    const float poly = t * (kErfA1 + t * (kErfA2 + t * (kErfA3 + t * (kErfA4 + t * kErfA5))));
    return sign(x) * (1.0 - poly * exp(-x * x));
}

// act(g) for device_abi.h's activation `act` (elementwise.comp).
float activated(uint act, float g) {
    if (act == kActivationGeluTanh) {
        const float z = kGeluTanhScale * fma(kGeluTanhCubic * g, g * g, g);
        return g / (1.0 + exp(-2.0 * z));
    }
    if (act == kActivationGeluErf) return 0.5 * g * (1.0 + erf_approx(g * 0.70710678118654752));
    return g / (1.0 + exp(-g));
}

// The feed-forward's gate: act(g) * u (elementwise.comp, and the gated matmul's output).
float gated_times(uint act, float g, float u) { return activated(act, g) * u; }

// Element `second` of the pair (a, b) rotated by the angle of cosine c and sine s (rope.comp,
// and the rotating matmul's output). precise: never contracted into fma, so every pipeline
// rounds a rotation alike (and as the cpu reference does).
float rotated(float a, float b, float c, float s, bool second) {
    precise float r = second ? a * s + b * c : a * c - b * s;
    return r;
}

// Weight element types: each shader that reads weights is compiled once per type
// with one of these defined, and reads a row in blocks of 32 weights, eight at a time.
// The K-quants' blocks of 32 lie in super-blocks of 256 (BLOCK_WEIGHTS, BLOCK_BYTES).
#if defined(WEIGHT_F32)
const uint BLOCK_BYTES = kF32BlockBytes;
#elif defined(WEIGHT_F16)
const uint BLOCK_BYTES = kF16BlockBytes;
#elif defined(WEIGHT_Q8_0)
const uint BLOCK_BYTES = kQ8_0BlockBytes;
#elif defined(WEIGHT_Q4_0)
const uint BLOCK_BYTES = kQ4_0BlockBytes;
#elif defined(WEIGHT_Q4_1)
const uint BLOCK_BYTES = kQ4_1BlockBytes;
#elif defined(WEIGHT_Q5_0)
const uint BLOCK_BYTES = kQ5_0BlockBytes;
#elif defined(WEIGHT_Q5_1)
const uint BLOCK_BYTES = kQ5_1BlockBytes;
#elif defined(WEIGHT_Q4_K)
const uint BLOCK_BYTES = kQ4_KBlockBytes;
#elif defined(WEIGHT_Q5_K)
const uint BLOCK_BYTES = kQ5_KBlockBytes;
#elif defined(WEIGHT_Q6_K)
const uint BLOCK_BYTES = kQ6_KBlockBytes;
#endif
#if defined(WEIGHT_Q4_K) || defined(WEIGHT_Q5_K) || defined(WEIGHT_Q6_K)
const uint BLOCK_WEIGHTS = kSuperBlockWeights;
#else
const uint BLOCK_WEIGHTS = kBlockWeights;
#endif

// Weights are read from binding 0, or with which = 3 from binding 3 (the second matrix of the
// gated matmul); `which` is a constant wherever these are inlined, so the choice costs nothing.
uint weight_word(uint which, uint i) { return which == 3u ? b3[i] : b0[i]; }

#if defined(SMALL_STORAGE)
// The weight bindings again, as halves and bytes.
layout(std430, binding = 0) readonly buffer Halves0 { float16_t halves0[]; };
layout(std430, binding = 0) readonly buffer Signed0 { int8_t signed0[]; };
layout(std430, binding = 0) readonly buffer Bytes0 { uint8_t bytes0[]; };
layout(std430, binding = 3) readonly buffer Halves3 { float16_t halves3[]; };
layout(std430, binding = 3) readonly buffer Signed3 { int8_t signed3[]; };
layout(std430, binding = 3) readonly buffer Bytes3 { uint8_t bytes3[]; };
// Converted before they are chosen: arithmetic on 8/16-bit values (a select is) needs more
// than storage features.
float weight_half(uint which, uint i) { return which == 3u ? float(halves3[i]) : float(halves0[i]); }
int weight_int8(uint which, uint i) { return which == 3u ? int(signed3[i]) : int(signed0[i]); }
uint weight_uint8(uint which, uint i) { return which == 3u ? uint(bytes3[i]) : uint(bytes0[i]); }
#endif

#if defined(WEIGHT_F32) || defined(WEIGHT_F16) || defined(WEIGHT_Q8_0) || defined(WEIGHT_Q4_0) || \
    defined(WEIGHT_Q4_1) || defined(WEIGHT_Q5_0) || defined(WEIGHT_Q5_1) || defined(WEIGHT_Q4_K) || \
    defined(WEIGHT_Q5_K) || defined(WEIGHT_Q6_K)
// Bytes of a row of `cols` weights.
uint row_bytes_of(uint cols) { return cols / BLOCK_WEIGHTS * BLOCK_BYTES; }

// The half at an even byte offset (a block's scale).
float half_at(uint which, uint byte) {
    return unpackHalf2x16((weight_word(which, byte >> 2) >> ((byte & 2u) << 3)) & 0xFFFFu).x;
}

// Four bytes starting at an even byte offset (blocks of 34 and 18 bytes leave their quants
// 2-byte aligned): one or two word loads.
uint quant_word(uint which, uint byte) {
    const uint i = byte >> 2;
    const uint lo = weight_word(which, i);
    return (byte & 2u) == 0u ? lo : (lo >> 16) | (weight_word(which, i + 1u) << 16);
}

// The byte at any offset, and four bytes from any offset (little-endian).
uint byte_at(uint which, uint byte) { return bitfieldExtract(weight_word(which, byte >> 2), int((byte & 3u) * 8u), 8); }
uint word_at(uint which, uint byte) {
    const uint i = byte >> 2, s = (byte & 3u) * 8u;
    const uint lo = weight_word(which, i);
    return s == 0u ? lo : (lo >> s) | (weight_word(which, i + 1u) << (32u - s));
}
// Eight 4-bit values from eight bytes at `byte`, at bit `shift` (0 or 4) of each.
void nibbles8(uint which, uint byte, uint shift, out uint v[8]) {
    [[unroll]] for (uint i = 0u; i < 2u; ++i) {
        const uint word = word_at(which, byte + 4u * i);
        [[unroll]] for (uint k = 0u; k < 4u; ++k) v[4u * i + k] = bitfieldExtract(word, int(8u * k + shift), 4);
    }
}
// Q4_K / Q5_K: the scale and min of block j (0..7) from the 12 bytes at `at` (format/quant.h).
void k_scale_min(uint which, uint at, uint j, out float scale, out float min) {
    if (j < 4u) {
        scale = float(byte_at(which, at + j) & 63u);
        min = float(byte_at(which, at + j + 4u) & 63u);
    } else {
        const uint packed = byte_at(which, at + j + 4u);
        scale = float((packed & 0xFu) | ((byte_at(which, at + j - 4u) >> 6) << 4));
        min = float((packed >> 4) | ((byte_at(which, at + j) >> 6) << 4));
    }
}

// Eight consecutive weights: quarter q (0..3) of block b (weights 32 b ..) of the row
// starting at byte `row` of the weight binding `which`.
void load_quarter(uint which, uint row, uint b, uint q, out float w[8]) {
#if defined(WEIGHT_Q4_K) || defined(WEIGHT_Q5_K) || defined(WEIGHT_Q6_K)
    const uint at = row + b / 8u * BLOCK_BYTES;  // the super-block
#else
    const uint at = row + b * BLOCK_BYTES;
#endif
#if defined(SMALL_STORAGE) && defined(WEIGHT_F16)
    [[unroll]] for (uint j = 0u; j < 8u; ++j) w[j] = weight_half(which, at / 2u + q * 8u + j);
#elif defined(SMALL_STORAGE) && defined(WEIGHT_Q8_0)
    const float d = weight_half(which, at / 2u);
    [[unroll]] for (uint j = 0u; j < 8u; ++j)
        w[j] = d * float(weight_int8(which, at + kBlockScaleBytes + q * 8u + j));
#elif defined(SMALL_STORAGE) && defined(WEIGHT_Q4_0)
    // Weights 0..15 are the low nibbles of bytes 0..15, weights 16..31 the high ones.
    const float d = weight_half(which, at / 2u);
    const uint shift = q < 2u ? 0u : 4u;
    [[unroll]] for (uint j = 0u; j < 8u; ++j)
        w[j] = d * float(int((weight_uint8(which, at + kBlockScaleBytes + (q % 2u) * 8u + j) >> shift) & 0xFu) - 8);
#elif defined(WEIGHT_F32)
    [[unroll]] for (uint j = 0u; j < 8u; ++j) w[j] = uintBitsToFloat(weight_word(which, at / 4u + q * 8u + j));
#elif defined(WEIGHT_F16)
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
        const vec2 h = unpackHalf2x16(weight_word(which, at / 4u + q * 4u + j));
        w[2u * j] = h.x;
        w[2u * j + 1u] = h.y;
    }
#elif defined(WEIGHT_Q8_0)
    const float d = half_at(which, at);
    [[unroll]] for (uint i = 0u; i < 2u; ++i) {
        const int v = int(quant_word(which, at + kBlockScaleBytes + q * 8u + 4u * i));
        [[unroll]] for (uint k = 0u; k < 4u; ++k) w[4u * i + k] = d * float(bitfieldExtract(v, int(8u * k), 8));
    }
#elif defined(WEIGHT_Q4_0)
    // Weights 0..15 are the low nibbles of bytes 0..15, weights 16..31 the high ones.
    const float d = half_at(which, at);
    const uint shift = q < 2u ? 0u : 4u;
    [[unroll]] for (uint i = 0u; i < 2u; ++i) {
        const uint v = quant_word(which, at + kBlockScaleBytes + (q % 2u) * 8u + 4u * i);
        [[unroll]] for (uint k = 0u; k < 4u; ++k)
            w[4u * i + k] = d * float(int(bitfieldExtract(v, int(8u * k + shift), 4)) - 8);
    }
#elif defined(WEIGHT_Q4_1)
    const float d = half_at(which, at), m = half_at(which, at + 2u);
    uint v[8];
    nibbles8(which, at + 4u + (q % 2u) * 8u, q < 2u ? 0u : 4u, v);
    [[unroll]] for (uint j = 0u; j < 8u; ++j) w[j] = float(v[j]) * d + m;
#elif defined(WEIGHT_Q5_0) || defined(WEIGHT_Q5_1)
    // Element i: the nibble of byte i % 16 (low for i < 16), and bit i of the 32-bit mask.
#if defined(WEIGHT_Q5_0)
    const float d = half_at(which, at), m = 0.0;
    const uint mask = word_at(which, at + 2u), quants = at + 6u;
    const float offset = 16.0;
#else
    const float d = half_at(which, at), m = half_at(which, at + 2u);
    const uint mask = word_at(which, at + 4u), quants = at + 8u;
    const float offset = 0.0;
#endif
    uint v[8];
    nibbles8(which, quants + (q % 2u) * 8u, q < 2u ? 0u : 4u, v);
    [[unroll]] for (uint j = 0u; j < 8u; ++j)
        w[j] = (float(v[j] | (bitfieldExtract(mask, int(8u * q + j), 1) << 4)) - offset) * d + m;
#elif defined(WEIGHT_Q4_K) || defined(WEIGHT_Q5_K)
    const uint s = b % 8u;  // elements 8 q .. 8 q + 7 of block s of the super-block
    float scale, min;
    k_scale_min(which, at + 4u, s, scale, min);
    const float d1 = half_at(which, at) * scale, m1 = half_at(which, at + 2u) * min;
#if defined(WEIGHT_Q4_K)
    const uint quants = at + 4u + kKScaleBytes;
#else
    const uint high = at + 4u + kKScaleBytes, quants = high + 32u;
#endif
    uint v[8];
    nibbles8(which, quants + 32u * (s / 2u) + 8u * q, 4u * (s % 2u), v);
#if defined(WEIGHT_Q5_K)
    [[unroll]] for (uint i = 0u; i < 2u; ++i) {
        const uint bits = word_at(which, high + 8u * q + 4u * i);
        [[unroll]] for (uint k = 0u; k < 4u; ++k) v[4u * i + k] |= bitfieldExtract(bits, int(8u * k + s), 1) << 4;
    }
#endif
    [[unroll]] for (uint j = 0u; j < 8u; ++j) w[j] = d1 * float(v[j]) - m1;
#elif defined(WEIGHT_Q6_K)
    // Block b % 8 is part p of half h: low nibbles at 64 h + 32 (p % 2), top bits 2 p of the
    // high bytes at 128 + 32 h, a scale per 16 elements at 192 + 8 h + 2 p (format/quant.h).
    const uint h = (b % 8u) / 4u, p = b % 4u;
    uint v[8];
    nibbles8(which, at + 64u * h + 32u * (p % 2u) + 8u * q, 4u * (p / 2u), v);
    const float d = half_at(which, at + 208u) *
                    float(bitfieldExtract(int(byte_at(which, at + 192u + 8u * h + 2u * p + q / 2u)), 0, 8));
    [[unroll]] for (uint i = 0u; i < 2u; ++i) {
        const uint bits = word_at(which, at + 128u + 32u * h + 8u * q + 4u * i);
        [[unroll]] for (uint k = 0u; k < 4u; ++k)
            w[4u * i + k] = d * float(int(v[4u * i + k] | (bitfieldExtract(bits, int(8u * k + 2u * p), 2) << 4)) - 32);
    }
#endif
}
#endif
