// Highway compiles this file once per instruction set (foreach_target.h) and
// HWY_DYNAMIC_DISPATCH calls the best one the machine supports.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/kernels.cpp"
// The register tiles are arrays of vectors, which the sizeless vector types of SVE and RVV
// cannot form: ARM runs NEON.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "backend/cpu/kernels.h"
#include "format/quant.h"

HWY_BEFORE_NAMESPACE();
namespace specula::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 lanes, so that a lane count divides the 32 weights of a block, and a Q4_0
// vector's nibbles come from one 16-byte half.
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;
constexpr int64_t kLanes = int64_t(hn::MaxLanes(DF()));
static_assert(32 % kLanes == 0);

// Tiles of rows x inputs: their accumulators, one input vector each and a weight vector
// fit the register file (32 vector registers with AVX-512 and NEON, 16 otherwise).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_ARCH_ARM
constexpr int kTileCols = 4;
#else
constexpr int kTileCols = 2;
#endif
constexpr int kTileRows = int(kRowTile);

void DecodeRow(GgmlType type, const uint8_t* src, int64_t cols, float* dst) {
    const DF d;
    const float* halves = half_table();
    switch (type) {
        case GgmlType::kF32:
            std::copy_n(reinterpret_cast<const float*>(src), cols, dst);
            return;
        case GgmlType::kF16: {
            const hn::Rebind<hwy::float16_t, DF> dh;
            const auto* h = reinterpret_cast<const hwy::float16_t*>(src);
            int64_t j = 0;
            for (; j + kLanes <= cols; j += kLanes)
                hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, h + j)), d, dst + j);
            const auto* bits = reinterpret_cast<const uint16_t*>(src);
            for (; j < cols; ++j)
                dst[j] = halves[bits[j]];
            return;
        }
        case GgmlType::kQ8_0: {
            const hn::Rebind<int8_t, DF> d8;
            const hn::Rebind<int32_t, DF> d32;
            const auto* blocks = reinterpret_cast<const BlockQ8_0*>(src);
            for (int64_t b = 0; b < cols / kQ8_0BlockSize; ++b, dst += kQ8_0BlockSize) {
                const VF scale = hn::Set(d, halves[blocks[b].scale]);
                for (int64_t j = 0; j < kQ8_0BlockSize; j += kLanes) {
                    const auto q = hn::PromoteTo(d32, hn::LoadU(d8, blocks[b].quants + j));
                    hn::StoreU(hn::Mul(hn::ConvertTo(d, q), scale), d, dst + j);
                }
            }
            return;
        }
        case GgmlType::kQ4_0: {
            const hn::Rebind<uint8_t, DF> d8;
            const hn::Rebind<int32_t, DF> d32;
            const auto low = hn::Set(d32, 15), offset = hn::Set(d32, 8);
            const auto* blocks = reinterpret_cast<const BlockQ4_0*>(src);
            for (int64_t b = 0; b < cols / kQ4_0BlockSize; ++b, dst += kQ4_0BlockSize) {
                const VF scale = hn::Set(d, halves[blocks[b].scale]);
                // Weight j is the low nibble of byte j, weight j + 16 the high nibble.
                for (int64_t j = 0; j < kQ4_0BlockSize; j += kLanes) {
                    const auto bytes = hn::PromoteTo(d32, hn::LoadU(d8, blocks[b].quants + j % 16));
                    const auto q = j < 16 ? hn::And(bytes, low) : hn::ShiftRight<4>(bytes);
                    hn::StoreU(hn::Mul(hn::ConvertTo(d, hn::Sub(q, offset)), scale), d, dst + j);
                }
            }
            return;
        }
        default:
            return;  // the backend decodes only the types it loads
    }
}

// out[c * out_stride + r] (+)= dot(w[r], x[c]) for R rows and C inputs.
template <int R, int C>
void Tile(const float* w, int64_t w_stride, const float* x, int64_t cols, float* out,
          int64_t out_stride, bool accumulate) {
    const DF d;
    VF acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c)
            acc[r][c] = hn::Zero(d);
    int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
        VF xv[C];
        for (int c = 0; c < C; ++c)
            xv[c] = hn::LoadU(d, x + c * cols + j);
        for (int r = 0; r < R; ++r) {
            const VF wv = hn::LoadU(d, w + r * w_stride + j);
            for (int c = 0; c < C; ++c)
                acc[r][c] = hn::MulAdd(wv, xv[c], acc[r][c]);
        }
    }
    float tail[R][C] = {};
    for (; j < cols; ++j)
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < C; ++c)
                tail[r][c] += w[r * w_stride + j] * x[c * cols + j];
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) {
            const float v = hn::GetLane(hn::SumOfLanes(d, acc[r][c])) + tail[r][c];
            float& o = out[c * out_stride + r];
            o = accumulate ? o + v : v;
        }
    }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, bool);

template <int R, int... Cs>
constexpr std::array<TileFn, sizeof...(Cs)> TileRow(std::integer_sequence<int, Cs...>) {
    return {&Tile<R, Cs + 1>...};
}
template <int... Rs>
constexpr std::array<std::array<TileFn, kTileCols>, sizeof...(Rs)> TileTable(
    std::integer_sequence<int, Rs...>) {
    return {TileRow<Rs + 1>(std::make_integer_sequence<int, kTileCols>())...};
}
// kTiles[r - 1][c - 1] computes r rows for c inputs.
constexpr auto kTiles = TileTable(std::make_integer_sequence<int, kTileRows>());

void MatmulRows(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
    thread_local std::vector<float> decoded;
    const bool in_place = a.type == GgmlType::kF32;
    if (!in_place && decoded.size() < size_t(kTileRows * a.cols))
        decoded.resize(size_t(kTileRows * a.cols));
    for (int64_t r0 = row_begin; r0 < row_end; r0 += kTileRows) {
        const int rows = int(std::min<int64_t>(kTileRows, row_end - r0));
        const uint8_t* src = a.w + size_t(r0) * a.row_bytes;
        const float* w = reinterpret_cast<const float*>(src);
        int64_t w_stride = int64_t(a.row_bytes / sizeof(float));
        if (!in_place) {
            for (int r = 0; r < rows; ++r)
                DecodeRow(a.type, src + size_t(r) * a.row_bytes, a.cols,
                          decoded.data() + r * a.cols);
            w = decoded.data();
            w_stride = a.cols;
        }
        for (int64_t c0 = 0; c0 < a.n; c0 += kTileCols) {
            const int n = int(std::min<int64_t>(kTileCols, a.n - c0));
            kTiles[size_t(rows - 1)][size_t(n - 1)](w, w_stride, a.x + c0 * a.cols, a.cols,
                                                    a.out + c0 * a.out_stride + r0, a.out_stride,
                                                    a.accumulate);
        }
    }
}

float DotF32(const float* a, const float* b, int64_t n) {
    float out = 0.0f;
    Tile<1, 1>(a, 0, b, n, &out, 0, false);
    return out;
}

void AxpyF32(float p, const float* v, float* acc, int64_t n) {
    const DF d;
    const VF pv = hn::Set(d, p);
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        hn::StoreU(hn::MulAdd(pv, hn::LoadU(d, v + j), hn::LoadU(d, acc + j)), d, acc + j);
    for (; j < n; ++j)
        acc[j] += p * v[j];
}

const char* TargetName() {
    return hwy::TargetName(HWY_TARGET);
}

}  // namespace HWY_NAMESPACE
}  // namespace specula::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "core/fp16.h"

namespace specula::cpu {

HWY_EXPORT(MatmulRows);
HWY_EXPORT(DecodeRow);
HWY_EXPORT(DotF32);
HWY_EXPORT(AxpyF32);
HWY_EXPORT(TargetName);

void matmul_rows(const MatmulArgs& args, int64_t row_begin, int64_t row_end) {
    HWY_DYNAMIC_DISPATCH(MatmulRows)(args, row_begin, row_end);
}
void decode_row(GgmlType type, const uint8_t* src, int64_t cols, float* dst) {
    HWY_DYNAMIC_DISPATCH(DecodeRow)(type, src, cols, dst);
}
float dot_f32(const float* a, const float* b, int64_t n) {
    return HWY_DYNAMIC_DISPATCH(DotF32)(a, b, n);
}
void axpy_f32(float p, const float* v, float* acc, int64_t n) {
    HWY_DYNAMIC_DISPATCH(AxpyF32)(p, v, acc, n);
}
const char* simd_target() {
    return HWY_DYNAMIC_DISPATCH(TargetName)();
}

const float* half_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (uint32_t i = 0; i < 65536; ++i)
            t[i] = half_to_float(uint16_t(i));
        return t;
    }();
    return table.data();
}

}  // namespace specula::cpu
#endif  // HWY_ONCE
