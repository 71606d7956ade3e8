#include "format/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"

namespace specula {

namespace {
constexpr GgmlType kRunnableWeightTypes[] = {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0,
                                             GgmlType::kQ4_0};
}  // namespace

bool is_runnable_weight_type(GgmlType type) {
    for (GgmlType t : kRunnableWeightTypes)
        if (t == type) return true;
    return false;
}

std::string runnable_weight_type_names() {
    std::string names;
    for (GgmlType t : kRunnableWeightTypes)
        names += (names.empty() ? "" : ", ") + std::string(ggml_type_name(t));
    return names;
}

namespace {

void quantize_q8_0(const float* x, BlockQ8_0* out, size_t n_blocks) {
    for (size_t b = 0; b < n_blocks; ++b, x += kQ8_0BlockSize) {
        float amax = 0.0f;
        for (int j = 0; j < kQ8_0BlockSize; ++j)
            amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].scale = float_to_half(d);
        for (int j = 0; j < kQ8_0BlockSize; ++j)
            out[b].quants[j] = int8_t(std::roundf(x[j] * id));
    }
}

void quantize_q4_0(const float* x, BlockQ4_0* out, size_t n_blocks) {
    for (size_t b = 0; b < n_blocks; ++b, x += kQ4_0BlockSize) {
        // The signed value of largest magnitude maps to -8, so the full range [-8, 7] is used.
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < kQ4_0BlockSize; ++j) {
            if (std::fabs(x[j]) > amax) {
                amax = std::fabs(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].scale = float_to_half(d);
        for (int j = 0; j < kQ4_0BlockSize / 2; ++j) {
            const auto lo = uint8_t(std::min(15, int(int8_t(x[j] * id + 8.5f))));
            const auto hi = uint8_t(std::min(15, int(int8_t(x[j + 16] * id + 8.5f))));
            out[b].quants[j] = uint8_t(lo | (hi << 4));
        }
    }
}

}  // namespace

void quantize_row(GgmlType type, const float* src, void* dst, size_t n) {
    switch (type) {
        case GgmlType::kF32:
            std::memcpy(dst, src, n * sizeof(float));
            break;
        case GgmlType::kF16: {
            auto* d = static_cast<uint16_t*>(dst);
            for (size_t i = 0; i < n; ++i)
                d[i] = float_to_half(src[i]);
            break;
        }
        case GgmlType::kQ8_0:
            quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n / kQ8_0BlockSize);
            break;
        case GgmlType::kQ4_0:
            quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), n / kQ4_0BlockSize);
            break;
        default:
            break;
    }
}

void dequantize_row(GgmlType type, const void* src, float* dst, size_t n) {
    switch (type) {
        case GgmlType::kF32:
            std::memcpy(dst, src, n * sizeof(float));
            break;
        case GgmlType::kF16: {
            const auto* s = static_cast<const uint16_t*>(src);
            for (size_t i = 0; i < n; ++i)
                dst[i] = half_to_float(s[i]);
            break;
        }
        case GgmlType::kQ8_0: {
            const auto* blocks = static_cast<const BlockQ8_0*>(src);
            for (size_t b = 0; b < n / kQ8_0BlockSize; ++b) {
                const float d = half_to_float(blocks[b].scale);
                for (int j = 0; j < kQ8_0BlockSize; ++j)
                    dst[b * kQ8_0BlockSize + j] = d * float(blocks[b].quants[j]);
            }
            break;
        }
        case GgmlType::kQ4_0: {
            const auto* blocks = static_cast<const BlockQ4_0*>(src);
            for (size_t b = 0; b < n / kQ4_0BlockSize; ++b) {
                const float d = half_to_float(blocks[b].scale);
                float* out = dst + b * kQ4_0BlockSize;
                for (int j = 0; j < kQ4_0BlockSize / 2; ++j) {
                    out[j] = d * float(int(blocks[b].quants[j] & 0x0f) - 8);
                    out[j + 16] = d * float(int(blocks[b].quants[j] >> 4) - 8);
                }
            }
            break;
        }
        default:
            break;
    }
}

}  // namespace specula
