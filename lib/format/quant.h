// GGUF's block layouts for the weight types specula runs, used unchanged in
// memory so files load without conversion. Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 are quantized with
// ggml's reference rounding, so a model quantized here matches one quantized there. The
// K-quants (Q4_K, Q5_K, Q6_K) are quantized with each block's plain range (ggml searches for a
// slightly better scale per block): the layout and its decoding are ggml's, the rounding of a
// freshly quantized model may differ from llama.cpp's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/device_abi.h"
#include "format/gguf.h"

namespace specula {

constexpr int kQ8_0BlockSize = int(shared::kBlockWeights);
constexpr int kQ4_0BlockSize = int(shared::kBlockWeights);

struct BlockQ8_0 {
    uint16_t scale;  // fp16
    int8_t quants[kQ8_0BlockSize];
};
static_assert(sizeof(BlockQ8_0) == shared::kQ8_0BlockBytes);

struct BlockQ4_0 {
    uint16_t scale;                      // fp16
    uint8_t quants[kQ4_0BlockSize / 2];  // element j in the low nibble of byte j, j+16 in the high
};
static_assert(sizeof(BlockQ4_0) == shared::kQ4_0BlockBytes);

struct BlockQ4_1 {
    uint16_t scale, min;  // fp16: x = scale * q + min
    uint8_t quants[16];   // as Q4_0, unsigned
};
static_assert(sizeof(BlockQ4_1) == shared::kQ4_1BlockBytes);

struct BlockQ5_0 {
    uint16_t scale;      // fp16: x = scale * (q - 16)
    uint8_t high[4];     // bit j: the fifth bit of element j (little-endian 32 bits)
    uint8_t quants[16];  // low four bits, as Q4_0
};
static_assert(sizeof(BlockQ5_0) == shared::kQ5_0BlockBytes);

struct BlockQ5_1 {
    uint16_t scale, min;  // fp16: x = scale * q + min
    uint8_t high[4];
    uint8_t quants[16];
};
static_assert(sizeof(BlockQ5_1) == shared::kQ5_1BlockBytes);

// Q4_K and Q5_K: element l of block j (32 elements) is d * sc_j * q - dmin * m_j, with 6-bit
// sc_j and m_j packed in `scales` (k_scale_min()); q's low four bits are in the low (j even)
// or high (j odd) nibbles of quants[32 * (j / 2) + l], Q5_K's fifth is bit j of high[l].
struct BlockQ4_K {
    uint16_t d, dmin;  // fp16
    uint8_t scales[shared::kKScaleBytes];
    uint8_t quants[128];
};
static_assert(sizeof(BlockQ4_K) == shared::kQ4_KBlockBytes);

struct BlockQ5_K {
    uint16_t d, dmin;
    uint8_t scales[shared::kKScaleBytes];
    uint8_t high[32];
    uint8_t quants[128];
};
static_assert(sizeof(BlockQ5_K) == shared::kQ5_KBlockBytes);

// Q6_K: element i of half h (128 elements, i = 32 k + l) is d * scales[8 h + 2 k + l / 16] *
// (q - 32), q's low four bits in the low (k < 2) or high nibble of low[64 h + 32 (k % 2) + l],
// its top two at bits 2 k of high[32 h + l].
struct BlockQ6_K {
    uint8_t low[128];
    uint8_t high[64];
    int8_t scales[16];
    uint16_t d;  // fp16
};
static_assert(sizeof(BlockQ6_K) == shared::kQ6_KBlockBytes);

// Q4_K / Q5_K: the scale and min of block j (0..7) from the 12 packed bytes (ggml's
// get_scale_min_k4): blocks 0..3 in the low six bits of bytes j and j + 4, blocks 4..7 in the
// nibbles of byte j + 4 and the top two bits of bytes j - 4 and j.
// Also the CUDA kernels' (SPECULA_ABI_FN: host and device).
SPECULA_ABI_FN void k_scale_min(int j, const uint8_t* s, uint8_t* scale, uint8_t* min) {
    if (j < 4) {
        *scale = s[j] & 63;
        *min = s[j + 4] & 63;
    } else {
        *scale = uint8_t((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *min = uint8_t((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

// Every weight type the runtime computes with, in GGUF's type order: backends say which of
// them they run (Backend::supports).
inline constexpr GgmlType kWeightTypes[] = {
    GgmlType::kF32,  GgmlType::kF16,  GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
    GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

// Whether the runtime can compute with this weight type.
bool is_runnable_weight_type(GgmlType type);

// Block b of a row of a quantized type other than Q8_0 and Q4_0 (elements 32 b .. 32 b + 31)
// as floats: each is computed as ggml computes it (a product, then the min added or
// subtracted, never fused), which the backends' kernels reproduce.
void dequantize_block32(GgmlType type, const uint8_t* row, size_t b, float* y);

// Row conversions; n must be a multiple of the type's block size (256 for the K-quants).
void quantize_row(GgmlType type, const float* src, void* dst, size_t n);
void dequantize_row(GgmlType type, const void* src, float* dst, size_t n);

}  // namespace specula
