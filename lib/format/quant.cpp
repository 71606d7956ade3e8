#include "format/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"

namespace specula {

bool is_runnable_weight_type(GgmlType type) {
    for (GgmlType t : kWeightTypes)
        if (t == type) return true;
    return false;
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

void quantize_q4_1(const float* x, BlockQ4_1* out, size_t n_blocks) {
    for (size_t b = 0; b < n_blocks; ++b, x += 32) {
        const auto [lo, hi] = std::minmax_element(x, x + 32);
        const float min = *lo, d = (*hi - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].scale = float_to_half(d);
        out[b].min = float_to_half(min);
        for (int j = 0; j < 16; ++j) {
            const auto q0 = uint8_t(std::min(15, int(int8_t((x[j] - min) * id + 0.5f))));
            const auto q1 = uint8_t(std::min(15, int(int8_t((x[j + 16] - min) * id + 0.5f))));
            out[b].quants[j] = uint8_t(q0 | (q1 << 4));
        }
    }
}

// The low four bits of 5-bit values q[0..31] into nibbles (element j low, j + 16 high) and
// their fifth bits into the 32-bit mask `high`.
void pack_five_bits(const int* q, uint8_t* quants, uint8_t* high) {
    uint32_t mask = 0;
    for (int j = 0; j < 16; ++j) {
        quants[j] = uint8_t((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
        mask |= uint32_t((q[j] >> 4) & 1) << j;
        mask |= uint32_t((q[j + 16] >> 4) & 1) << (j + 16);
    }
    for (int i = 0; i < 4; ++i)
        high[i] = uint8_t(mask >> (8 * i));
}

void quantize_q5_0(const float* x, BlockQ5_0* out, size_t n_blocks) {
    for (size_t b = 0; b < n_blocks; ++b, x += 32) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; ++j) {
            if (std::fabs(x[j]) > amax) {
                amax = std::fabs(x[j]);
                max = x[j];
            }
        }
        const float d = max / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].scale = float_to_half(d);
        int q[32];
        for (int j = 0; j < 32; ++j)
            q[j] = std::min(31, int(int8_t(x[j] * id + 16.5f)));
        pack_five_bits(q, out[b].quants, out[b].high);
    }
}

void quantize_q5_1(const float* x, BlockQ5_1* out, size_t n_blocks) {
    for (size_t b = 0; b < n_blocks; ++b, x += 32) {
        const auto [lo, hi] = std::minmax_element(x, x + 32);
        const float min = *lo, d = (*hi - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].scale = float_to_half(d);
        out[b].min = float_to_half(min);
        int q[32];
        for (int j = 0; j < 32; ++j)
            q[j] = std::min(31, int(uint8_t((x[j] - min) * id + 0.5f)));
        pack_five_bits(q, out[b].quants, out[b].high);
    }
}

int nearest_int(float v) {
    return int(std::nearbyint(v));
}

// Q4_K / Q5_K: each block of 32 gets the scale and min of its range (min at most 0, so that
// zero is representable), both quantized to 6 bits against the super-block's largest; then
// every element is rounded against its block's quantized scale and min. levels: 15 or 31.
void quantize_k_with_min(const float* x, int levels, uint16_t* d_out, uint16_t* dmin_out,
                         uint8_t* scales, uint8_t* q) {
    float scale[8], min[8], max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; ++j) {
        const auto [lo, hi] = std::minmax_element(x + 32 * j, x + 32 * j + 32);
        const float low = std::min(*lo, 0.0f);
        scale[j] = (*hi - low) / float(levels);
        min[j] = -low;
        max_scale = std::max(max_scale, scale[j]);
        max_min = std::max(max_min, min[j]);
    }
    const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    std::memset(scales, 0, shared::kKScaleBytes);
    for (int j = 0; j < 8; ++j) {
        const auto ls = uint8_t(std::min(63, nearest_int(inv_scale * scale[j])));
        const auto lm = uint8_t(std::min(63, nearest_int(inv_min * min[j])));
        if (j < 4) {
            scales[j] = ls;
            scales[j + 4] = lm;
        } else {
            scales[j + 4] = uint8_t((ls & 0xF) | ((lm & 0xF) << 4));
            scales[j - 4] |= uint8_t((ls >> 4) << 6);
            scales[j] |= uint8_t((lm >> 4) << 6);
        }
    }
    *d_out = float_to_half(max_scale / 63.0f);
    *dmin_out = float_to_half(max_min / 63.0f);
    const float d = half_to_float(*d_out), dmin = half_to_float(*dmin_out);
    for (int j = 0; j < 8; ++j) {
        uint8_t sc = 0, m = 0;
        k_scale_min(j, scales, &sc, &m);
        const float dj = d * float(sc), mj = dmin * float(m);
        for (int l = 0; l < 32; ++l)
            q[32 * j + l] =
                dj != 0.0f ? uint8_t(std::clamp(nearest_int((x[32 * j + l] + mj) / dj), 0, levels))
                           : 0;
    }
}

void quantize_q4_k(const float* x, BlockQ4_K* out, size_t n_blocks) {
    for (size_t b = 0; b < n_blocks; ++b, x += 256) {
        uint8_t q[256];
        quantize_k_with_min(x, 15, &out[b].d, &out[b].dmin, out[b].scales, q);
        for (int j = 0; j < 4; ++j)  // blocks 2j and 2j + 1 share 32 bytes
            for (int l = 0; l < 32; ++l)
                out[b].quants[32 * j + l] = uint8_t(q[64 * j + l] | (q[64 * j + 32 + l] << 4));
    }
}

void quantize_q5_k(const float* x, BlockQ5_K* out, size_t n_blocks) {
    for (size_t b = 0; b < n_blocks; ++b, x += 256) {
        uint8_t q[256];
        quantize_k_with_min(x, 31, &out[b].d, &out[b].dmin, out[b].scales, q);
        std::memset(out[b].high, 0, sizeof(out[b].high));
        for (int j = 0; j < 4; ++j) {
            for (int l = 0; l < 32; ++l) {
                const uint8_t lo = q[64 * j + l], hi = q[64 * j + 32 + l];
                out[b].quants[32 * j + l] = uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
                out[b].high[l] |= uint8_t(((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1)));
            }
        }
    }
}

// Q6_K: each block of 16 gets the scale of its value of largest magnitude (which maps to
// -32), quantized to 8 bits against the super-block's largest.
void quantize_q6_k(const float* x, BlockQ6_K* out, size_t n_blocks) {
    for (size_t b = 0; b < n_blocks; ++b, x += 256) {
        float scale[16], max_scale = 0.0f, max_abs = 0.0f;
        for (int j = 0; j < 16; ++j) {
            float amax = 0.0f, max = 0.0f;
            for (int l = 0; l < 16; ++l) {
                if (std::fabs(x[16 * j + l]) > amax) {
                    amax = std::fabs(x[16 * j + l]);
                    max = x[16 * j + l];
                }
            }
            scale[j] = max / -32.0f;
            if (std::fabs(scale[j]) > max_abs) {
                max_abs = std::fabs(scale[j]);
                max_scale = scale[j];
            }
        }
        const float iscale = max_abs > 0.0f ? -128.0f / max_scale : 0.0f;
        out[b].d = float_to_half(iscale != 0.0f ? 1.0f / iscale : 0.0f);
        const float d = half_to_float(out[b].d);
        uint8_t q[256];
        for (int j = 0; j < 16; ++j) {
            out[b].scales[j] = int8_t(std::min(127, nearest_int(iscale * scale[j])));
            const float dj = d * float(out[b].scales[j]);
            for (int l = 0; l < 16; ++l)
                q[16 * j + l] =
                    dj != 0.0f ? uint8_t(std::clamp(nearest_int(x[16 * j + l] / dj), -32, 31) + 32)
                               : 32;
        }
        for (int h = 0; h < 2; ++h) {
            const uint8_t* qh = q + 128 * h;
            for (int l = 0; l < 32; ++l) {
                out[b].low[64 * h + l] = uint8_t((qh[l] & 0xF) | ((qh[l + 64] & 0xF) << 4));
                out[b].low[64 * h + 32 + l] =
                    uint8_t((qh[l + 32] & 0xF) | ((qh[l + 96] & 0xF) << 4));
                out[b].high[32 * h + l] =
                    uint8_t((qh[l] >> 4) | ((qh[l + 32] >> 4) << 2) | ((qh[l + 64] >> 4) << 4) |
                            ((qh[l + 96] >> 4) << 6));
            }
        }
    }
}

uint32_t five_bit_mask(const uint8_t* high) {
    return uint32_t(high[0]) | uint32_t(high[1]) << 8 | uint32_t(high[2]) << 16 |
           uint32_t(high[3]) << 24;
}

}  // namespace

void dequantize_block32(GgmlType type, const uint8_t* row, size_t b, float* y) {
    switch (type) {
        case GgmlType::kQ4_1: {
            const auto& k = reinterpret_cast<const BlockQ4_1*>(row)[b];
            const float d = half_to_float(k.scale), m = half_to_float(k.min);
            for (int j = 0; j < 16; ++j) {
                y[j] = float(k.quants[j] & 0xF) * d + m;
                y[j + 16] = float(k.quants[j] >> 4) * d + m;
            }
            break;
        }
        case GgmlType::kQ5_0:
        case GgmlType::kQ5_1: {
            const bool q5_0 = type == GgmlType::kQ5_0;
            const uint8_t* p = row + b * (q5_0 ? sizeof(BlockQ5_0) : sizeof(BlockQ5_1));
            const auto& k0 = *reinterpret_cast<const BlockQ5_0*>(p);
            const auto& k1 = *reinterpret_cast<const BlockQ5_1*>(p);
            const uint32_t mask = five_bit_mask(q5_0 ? k0.high : k1.high);
            const uint8_t* quants = q5_0 ? k0.quants : k1.quants;
            const float d = half_to_float(k0.scale), m = q5_0 ? 0.0f : half_to_float(k1.min);
            for (int j = 0; j < 32; ++j) {
                const int low = j < 16 ? quants[j] & 0xF : quants[j - 16] >> 4;
                const int q = (low | int((mask >> j) & 1) << 4) - (q5_0 ? 16 : 0);
                y[j] = q5_0 ? float(q) * d : float(q) * d + m;
            }
            break;
        }
        case GgmlType::kQ4_K:
        case GgmlType::kQ5_K: {
            const bool q4 = type == GgmlType::kQ4_K;
            const uint8_t* p = row + b / 8 * (q4 ? sizeof(BlockQ4_K) : sizeof(BlockQ5_K));
            const auto& k4 = *reinterpret_cast<const BlockQ4_K*>(p);
            const auto& k5 = *reinterpret_cast<const BlockQ5_K*>(p);
            const int s = int(b % 8);
            uint8_t sc = 0, m = 0;
            k_scale_min(s, k4.scales, &sc, &m);
            const float d1 = half_to_float(k4.d) * float(sc),
                        m1 = half_to_float(k4.dmin) * float(m);
            const uint8_t* quants = (q4 ? k4.quants : k5.quants) + 32 * (s / 2);
            for (int l = 0; l < 32; ++l) {
                int q = (quants[l] >> (4 * (s % 2))) & 0xF;
                if (!q4) q |= ((k5.high[l] >> s) & 1) << 4;
                y[l] = d1 * float(q) - m1;
            }
            break;
        }
        case GgmlType::kQ6_K: {
            const auto& k = reinterpret_cast<const BlockQ6_K*>(row)[b / 8];
            const int h = int(b % 8) / 4, part = int(b % 4);
            const float d = half_to_float(k.d);
            for (int l = 0; l < 32; ++l) {
                const int low = (k.low[64 * h + 32 * (part % 2) + l] >> (4 * (part / 2))) & 0xF;
                const int high = (k.high[32 * h + l] >> (2 * part)) & 3;
                y[l] =
                    d * float(k.scales[8 * h + 2 * part + l / 16]) * float((low | high << 4) - 32);
            }
            break;
        }
        default:
            break;
    }
}

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
        case GgmlType::kQ4_1:
            quantize_q4_1(src, static_cast<BlockQ4_1*>(dst), n / 32);
            break;
        case GgmlType::kQ5_0:
            quantize_q5_0(src, static_cast<BlockQ5_0*>(dst), n / 32);
            break;
        case GgmlType::kQ5_1:
            quantize_q5_1(src, static_cast<BlockQ5_1*>(dst), n / 32);
            break;
        case GgmlType::kQ4_K:
            quantize_q4_k(src, static_cast<BlockQ4_K*>(dst), n / 256);
            break;
        case GgmlType::kQ5_K:
            quantize_q5_k(src, static_cast<BlockQ5_K*>(dst), n / 256);
            break;
        case GgmlType::kQ6_K:
            quantize_q6_k(src, static_cast<BlockQ6_K*>(dst), n / 256);
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
        case GgmlType::kQ4_1:
        case GgmlType::kQ5_0:
        case GgmlType::kQ5_1:
        case GgmlType::kQ4_K:
        case GgmlType::kQ5_K:
        case GgmlType::kQ6_K:
            for (size_t b = 0; b < n / 32; ++b)
                dequantize_block32(type, static_cast<const uint8_t*>(src), b, dst + 32 * b);
            break;
        default:
            break;
    }
}

}  // namespace specula
