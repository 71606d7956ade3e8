// GGUF's block layouts for the weight types specula runs, used unchanged in
// memory so files load without conversion. Quantization follows ggml's
// reference rounding, so a model quantized here matches one quantized there.
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

// Whether the runtime can compute with this weight type.
bool is_runnable_weight_type(GgmlType type);
// Their names, for messages: "F32, F16, ...".
std::string runnable_weight_type_names();

// Row conversions; n must be a multiple of the type's block size.
void quantize_row(GgmlType type, const float* src, void* dst, size_t n);
void dequantize_row(GgmlType type, const void* src, float* dst, size_t n);

}  // namespace specula
