// Highway compiles this file once per instruction set (foreach_target.h) and
// HWY_DYNAMIC_DISPATCH calls the best one the machine supports.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/kernels.cpp"
// The register tiles are arrays of vectors, which the sizeless vector types of SVE and RVV
// cannot form: ARM runs NEON.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/aligned.h"
#include "core/device_abi.h"
#include "core/fp16.h"
#include "format/quant.h"
#include "hwy/contrib/math/math-inl.h"

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
constexpr int kChains = 2;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_ARCH_ARM
constexpr int kTileRows = 4, kTileCols = 2, kRowCols = 8;
#else
constexpr int kTileRows = 2, kTileCols = 2, kRowCols = 4;
#endif
static_assert(kRowTile % kTileRows == 0);

template <GgmlType T>
constexpr bool kQuantized = T != GgmlType::kF32&& T != GgmlType::kF16;

// Weights of one type read as floats, each exactly as dequantize_row() gives it: F32 and F16
// rows as whole vectors at element j (a multiple of kLanes) and single elements past the last
// whole vector; quantized rows (whole blocks) a block at a time.
template <GgmlType T>
struct Weights {
    const uint8_t* rows;
    size_t row_bytes;
    const float* halves = half_table();  // fetched once: a call in the loop spills the tile

    const uint8_t* row(int r) const { return rows + size_t(r) * row_bytes; }

    VF vector(DF d, int r, int64_t j) const {
        if constexpr (T == GgmlType::kF32) {
            return hn::LoadU(d, reinterpret_cast<const float*>(row(r)) + j);
        } else {
            static_assert(T == GgmlType::kF16);
            const hn::Rebind<hwy::float16_t, DF> dh;
            return hn::PromoteTo(
                d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(row(r)) + j));
        }
    }

    // The kPerBlock vectors of block b of a quantized row (vector q of the row is out[q %
    // kPerBlock] of block q / kPerBlock), the block's address, scale and bytes read once.
    static constexpr int kPerBlock = int(32 / kLanes);
    void block(DF d, int r, int64_t b, VF* out) const {
        const hn::Rebind<int32_t, DF> d32;
        if constexpr (T == GgmlType::kQ8_0) {
            const hn::Rebind<int8_t, DF> d8;
            const auto& blk = reinterpret_cast<const BlockQ8_0*>(row(r))[b];
            const VF scale = hn::Set(d, halves[blk.scale]);
            for (int k = 0; k < kPerBlock; ++k)
                out[k] = hn::Mul(
                    hn::ConvertTo(d, hn::PromoteTo(d32, hn::LoadU(d8, blk.quants + k * kLanes))),
                    scale);
        } else if constexpr (T == GgmlType::kQ4_0) {
            const hn::Rebind<uint8_t, DF> d8;
            const auto& blk = reinterpret_cast<const BlockQ4_0*>(row(r))[b];
            const VF scale = hn::Set(d, halves[blk.scale]);
            for (int k = 0; k < kPerBlock / 2; ++k) {
                const auto bytes = hn::PromoteTo(d32, hn::LoadU(d8, blk.quants + k * kLanes));
                out[k] = hn::Mul(nibble_values(d, hn::And(bytes, hn::Set(d32, 15))), scale);
                out[k + kPerBlock / 2] = hn::Mul(nibble_values(d, hn::ShiftRight<4>(bytes)), scale);
            }
        } else if constexpr (T == GgmlType::kQ4_1) {
            const auto& blk = reinterpret_cast<const BlockQ4_1*>(row(r))[b];
            const VF scale = hn::Set(d, halves[blk.scale]), min = hn::Set(d, halves[blk.min]);
            for (int k = 0; k < kPerBlock; ++k) {
                const int l = k * int(kLanes);  // elements l .. l + kLanes - 1 of the block
                const VI q = Nibbles(blk.quants + l % 16, l < 16 ? 0 : 4);
                out[k] = hn::Add(hn::Mul(hn::ConvertTo(d, q), scale), min);
            }
        } else if constexpr (T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1) {
            using Block = std::conditional_t<T == GgmlType::kQ5_0, BlockQ5_0, BlockQ5_1>;
            const auto& blk = reinterpret_cast<const Block*>(row(r))[b];
            int32_t mask;
            std::memcpy(&mask, blk.high, 4);
            const VF scale = hn::Set(d, halves[blk.scale]);
            for (int k = 0; k < kPerBlock; ++k) {
                const int l = k * int(kLanes);
                const VI fifth =
                    hn::And(hn::Shr(hn::Set(d32, mask), hn::Iota(d32, l)), hn::Set(d32, 1));
                const VI q =
                    hn::Or(Nibbles(blk.quants + l % 16, l < 16 ? 0 : 4), hn::ShiftLeft<4>(fifth));
                if constexpr (T == GgmlType::kQ5_0) {
                    out[k] = hn::Mul(hn::ConvertTo(d, hn::Sub(q, hn::Set(d32, 16))), scale);
                } else {
                    out[k] =
                        hn::Add(hn::Mul(hn::ConvertTo(d, q), scale), hn::Set(d, halves[blk.min]));
                }
            }
        } else if constexpr (T == GgmlType::kQ4_K || T == GgmlType::kQ5_K) {
            using Block = std::conditional_t<T == GgmlType::kQ4_K, BlockQ4_K, BlockQ5_K>;
            const auto& blk = reinterpret_cast<const Block*>(row(r))[b / 8];
            const int s = int(b % 8);
            uint8_t sc = 0, m = 0;
            k_scale_min(s, blk.scales, &sc, &m);
            const VF d1 = hn::Set(d, halves[blk.d] * float(sc));
            const VF m1 = hn::Set(d, halves[blk.dmin] * float(m));
            for (int k = 0; k < kPerBlock; ++k) {
                const int l = k * int(kLanes);
                VI q = Nibbles(blk.quants + 32 * (s / 2) + l, 4 * (s % 2));
                if constexpr (T == GgmlType::kQ5_K)
                    q = hn::Or(q,
                               hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(Bytes(blk.high + l), s),
                                                        hn::Set(d32, 1))));
                out[k] = hn::Sub(hn::Mul(d1, hn::ConvertTo(d, q)), m1);
            }
        } else {
            static_assert(T == GgmlType::kQ6_K);
            const auto& blk = reinterpret_cast<const BlockQ6_K*>(row(r))[b / 8];
            const int h = int(b % 8) / 4, part = int(b % 4);
            const float scale = halves[blk.d];
            for (int k = 0; k < kPerBlock; ++k) {
                const int l = k * int(kLanes);
                const VI low = Nibbles(blk.low + 64 * h + 32 * (part % 2) + l, 4 * (part / 2));
                const VI high = hn::And(hn::ShiftRightSame(Bytes(blk.high + 32 * h + l), 2 * part),
                                        hn::Set(d32, 3));
                const VI q = hn::Sub(hn::Or(low, hn::ShiftLeft<4>(high)), hn::Set(d32, 32));
                const float sl = scale * float(blk.scales[8 * h + 2 * part + l / 16]);
                out[k] = hn::Mul(hn::Set(d, sl), hn::ConvertTo(d, q));
            }
        }
    }
    using VI = hn::Vec<hn::Rebind<int32_t, DF>>;
    // kLanes bytes as 32-bit lanes.
    static VI Bytes(const uint8_t* p) {
        const hn::Rebind<uint8_t, DF> d8;
        return hn::PromoteTo(hn::Rebind<int32_t, DF>(), hn::LoadU(d8, p));
    }
    // The nibbles of kLanes bytes at bit `shift` (0 or 4).
    static VI Nibbles(const uint8_t* p, int shift) {
        return hn::And(hn::ShiftRightSame(Bytes(p), shift), hn::Set(hn::Rebind<int32_t, DF>(), 15));
    }
    // float(q - 8) for nibbles q: one permute of a 16-entry table where a vector has 16
    // lanes, else the subtraction and conversion (the same floats).
    static VF nibble_values(DF d, hn::Vec<hn::Rebind<int32_t, DF>> q) {
        if constexpr (kLanes == 16) {
            return hn::TableLookupLanes(hn::Iota(d, -8.0f), hn::IndicesFromVec(d, q));
        } else {
            const hn::Rebind<int32_t, DF> d32;
            return hn::ConvertTo(d, hn::Sub(q, hn::Set(d32, 8)));
        }
    }

    float scalar(int r, int64_t j) const {
        if constexpr (T == GgmlType::kF16) {
            return halves[reinterpret_cast<const uint16_t*>(row(r))[j]];
        } else {
            return reinterpret_cast<const float*>(row(r))[j];
        }
    }
};

template <GgmlType T>
void DecodeRowOf(const uint8_t* src, int64_t cols, float* dst) {
    const DF d;
    const Weights<T> w{src, 0};
    if constexpr (kQuantized<T>) {
        for (int64_t b = 0; b < cols / 32; ++b) {
            VF v[Weights<T>::kPerBlock];
            w.block(d, 0, b, v);
            for (int k = 0; k < Weights<T>::kPerBlock; ++k)
                hn::StoreU(v[k], d, dst + b * 32 + k * kLanes);
        }
    } else {
        int64_t j = 0;
        for (; j + kLanes <= cols; j += kLanes)
            hn::StoreU(w.vector(d, 0, j), d, dst + j);
        for (; j < cols; ++j)
            dst[j] = w.scalar(0, j);
    }
}

// Calls f(std::integral_constant<GgmlType, T>) for the weight types the backend loads.
template <class F>
void WithType(GgmlType type, F&& f) {
    switch (type) {
        case GgmlType::kF32:
            return f(std::integral_constant<GgmlType, GgmlType::kF32>());
        case GgmlType::kF16:
            return f(std::integral_constant<GgmlType, GgmlType::kF16>());
        case GgmlType::kQ8_0:
            return f(std::integral_constant<GgmlType, GgmlType::kQ8_0>());
        case GgmlType::kQ4_0:
            return f(std::integral_constant<GgmlType, GgmlType::kQ4_0>());
        case GgmlType::kQ4_1:
            return f(std::integral_constant<GgmlType, GgmlType::kQ4_1>());
        case GgmlType::kQ5_0:
            return f(std::integral_constant<GgmlType, GgmlType::kQ5_0>());
        case GgmlType::kQ5_1:
            return f(std::integral_constant<GgmlType, GgmlType::kQ5_1>());
        case GgmlType::kQ4_K:
            return f(std::integral_constant<GgmlType, GgmlType::kQ4_K>());
        case GgmlType::kQ5_K:
            return f(std::integral_constant<GgmlType, GgmlType::kQ5_K>());
        case GgmlType::kQ6_K:
            return f(std::integral_constant<GgmlType, GgmlType::kQ6_K>());
        default:
            return;  // the loader refuses other types (is_runnable_weight_type)
    }
}

void DecodeRow(GgmlType type, const uint8_t* src, int64_t cols, float* dst) {
    WithType(type, [&](auto t) { DecodeRowOf<t()>(src, cols, dst); });
}

// Keeps v in a register: GCC otherwise folds a weight vector's load into each of the C
// multiply-adds that use it (20 loads for 16 multiply-adds in a 4 x 2 tile); pinned, prompts
// measured ~15% faster. An empty asm statement changes no value.
HWY_INLINE void KeepInRegister(VF& v) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    asm("" : "+v"(v.raw));
#elif HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3
    asm("" : "+x"(v.raw));
#elif HWY_TARGET == HWY_NEON
    asm("" : "+w"(v.raw));
#else
    (void)v;
#endif
}

// out[c * out_stride + r] (+)= dot(w[r], x[c]) for R rows and C inputs. Vector q of a row
// (elements q * kLanes ...) is added into accumulator q % kChains, so that kChains chains of
// multiply-adds are in flight even for one row and one input; the chains are summed in a
// fixed tree, then the lanes.
template <GgmlType T, int R, int C>
void Tile(const Weights<T>& w, const float* x, int64_t cols, float* out, int64_t out_stride,
          bool accumulate) {
    const DF d;
    VF acc[R][C][kChains];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c)
            for (int k = 0; k < kChains; ++k)
                acc[r][c][k] = hn::Zero(d);
    float tail[R][C] = {};
    if constexpr (kQuantized<T>) {
        // Block by block (quantized rows are whole blocks): vector q of the row is added into
        // chain q % kChains, in order, as below.
        constexpr int kPer = Weights<T>::kPerBlock;
        static_assert(kPer % kChains == 0);
        for (int64_t j = 0; j < cols; j += 32) {
            for (int r = 0; r < R; ++r) {
                VF wv[kPer];
                w.block(d, r, j / 32, wv);
                for (int k = 0; k < kPer; ++k)
                    for (int c = 0; c < C; ++c)
                        acc[r][c][k % kChains] =
                            hn::MulAdd(wv[k], hn::LoadU(d, x + c * cols + j + k * kLanes),
                                       acc[r][c][k % kChains]);
            }
        }
    } else {
        int64_t j = 0;
        for (; j + kChains * kLanes <= cols; j += kChains * kLanes) {
            for (int k = 0; k < kChains; ++k) {
                VF xv[C];
                for (int c = 0; c < C; ++c)
                    xv[c] = hn::LoadU(d, x + c * cols + j + k * kLanes);
                for (int r = 0; r < R; ++r) {
                    VF wv = w.vector(d, r, j + k * kLanes);
                    if constexpr (C > 1) KeepInRegister(wv);
                    for (int c = 0; c < C; ++c)
                        acc[r][c][k] = hn::MulAdd(wv, xv[c], acc[r][c][k]);
                }
            }
        }
        static_assert(kChains == 2);  // so at most one whole vector is left, for chain 0
        if (j + kLanes <= cols) {
            for (int r = 0; r < R; ++r) {
                const VF wv = w.vector(d, r, j);
                for (int c = 0; c < C; ++c)
                    acc[r][c][0] = hn::MulAdd(wv, hn::LoadU(d, x + c * cols + j), acc[r][c][0]);
            }
            j += kLanes;
        }
        for (; j < cols; ++j)
            for (int r = 0; r < R; ++r)
                for (int c = 0; c < C; ++c)
                    tail[r][c] += w.scalar(r, j) * x[c * cols + j];
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) {
            const VF sum = hn::Add(acc[r][c][0], acc[r][c][1]);
            const float v = hn::GetLane(hn::SumOfLanes(d, sum)) + tail[r][c];
            float& o = out[c * out_stride + r];
            o = accumulate ? o + v : v;
        }
    }
}

template <GgmlType T>
using TileFn = void (*)(const Weights<T>&, const float*, int64_t, float*, int64_t, bool);

template <GgmlType T, int R, int... Cs>
constexpr std::array<TileFn<T>, sizeof...(Cs)> TileRow(std::integer_sequence<int, Cs...>) {
    return {&Tile<T, R, Cs + 1>...};
}
template <int... Rs>
constexpr std::array<std::array<TileFn<GgmlType::kF32>, kTileCols>, sizeof...(Rs)> F32Tiles(
    std::integer_sequence<int, Rs...>) {
    return {TileRow<GgmlType::kF32, Rs + 1>(std::make_integer_sequence<int, kTileCols>())...};
}
// kF32Tiles[r - 1][c - 1] computes r rows of floats for c inputs.
constexpr auto kF32Tiles = F32Tiles(std::make_integer_sequence<int, kTileRows>());

// Rows [begin, end) one at a time for C inputs (one call per matmul and thread: the rows'
// loop stays inside).
template <GgmlType T, int C>
void RowByRow(const MatmulArgs& a, int64_t begin, int64_t end) {
    Weights<T> w{a.w + size_t(begin) * a.row_bytes, a.row_bytes};
    for (int64_t r = begin; r < end; ++r, w.rows += a.row_bytes)
        Tile<T, 1, C>(w, a.x, a.cols, a.out + r, a.out_stride, a.accumulate);
}
template <GgmlType T, int... Cs>
constexpr std::array<void (*)(const MatmulArgs&, int64_t, int64_t), sizeof...(Cs)> RowByRowTable(
    std::integer_sequence<int, Cs...>) {
    return {&RowByRow<T, Cs + 1>...};
}
// kRowByRow<T>[c - 1]: rows of type T for c inputs.
template <GgmlType T>
constexpr auto kRowByRow = RowByRowTable<T>(std::make_integer_sequence<int, kRowCols>());

// ---- Quantized weights times 8-bit inputs (kernels.h) ----

// A packed group is units of packed_unit_blocks(T) blocks. A unit: its rows' unit scales
// (Q4_K / Q5_K: every row's f16 d, then every row's f16 dmin; Q6_K: every row's f16 d), then
// its blocks. A block: its rows' scales (the f16 d; Q4_1 / Q5_1: every row's f16 d, then every
// row's f16 m; Q4_K / Q5_K: every row's 6-bit scale as a byte, then every row's min; Q6_K:
// every row's int8 s_lo, then every row's s_hi), then kChunks chunks of kGroupRows rows x 4
// bytes, then kHighBits more such chunks. Q8_0: chunk k holds columns 4k..4k+3 as unsigned
// bytes, the weight + 128. The other types: chunk k holds the low 4 bits of columns 4k + i in
// its low nibbles and of columns 16 + 4k + i in its high ones; the bits above them, kHighBits
// per weight, are fields of the high chunks' bytes: field f = 2k + nibble of byte 4r + i (row r)
// is at bit kHighBits * f of the high chunks taken as one integer per byte, so that one shift
// and one mask of a chunk put it above its nibble. The values are the weights' integers plus
// kOffset.
// kExpanded: the same group with every value a byte, 8 chunks a block and no high chunks
// (ExpandGroup); Q8_0's stored layout already is.
template <GgmlType T, bool kExpanded = false>
struct Packed {
    static constexpr int kChunks = kExpanded ? 8 : packed_chunks(T);
    static constexpr int kHighBits = kExpanded ? 0 : packed_high_bits(T);
    static constexpr int kUnitBlocks = packed_unit_blocks(T);
    static constexpr int32_t kOffset = T == GgmlType::kQ8_0   ? 128
                                       : T == GgmlType::kQ4_0 ? 8
                                       : T == GgmlType::kQ5_0 ? 16
                                       : T == GgmlType::kQ6_K ? 32
                                                              : 0;
    static constexpr size_t kScaleBytes = packed_scale_bytes(T);
    static constexpr size_t kUnitScaleBytes = packed_unit_scale_bytes(T);
    static constexpr size_t kBytes =
        kExpanded ? size_t(kGroupRows) * (kScaleBytes + 32) : packed_block_bytes(T);
    static constexpr size_t kUnitBytes = kGroupRows * kUnitScaleBytes + kUnitBlocks * kBytes;
    static constexpr size_t kChunkBytes = size_t(kGroupRows) * 4;
    static constexpr bool kNibbles = kChunks == 4;
    // The high bits of chunk k's nibble n (0: low, 1: high) are in high chunk
    // high_chunk(k, n) from bit high_shift(k, n) on.
    static constexpr int kFields = 8 / (kHighBits > 0 ? kHighBits : 8);  // per byte
    static constexpr int high_chunk(int k, int n) { return (2 * k + n) / kFields; }
    static constexpr int high_shift(int k, int n) { return kHighBits * ((2 * k + n) % kFields); }

    static size_t group_bytes(int64_t cols) { return size_t(cols / 32 / kUnitBlocks) * kUnitBytes; }
    // The unit of block b of a group, and the block.
    template <class Byte>
    static Byte* unit(Byte* group, int64_t b) {
        return group + size_t(b / kUnitBlocks) * kUnitBytes;
    }
    template <class Byte>
    static Byte* block(Byte* group, int64_t b) {
        return unit(group, b) + kGroupRows * kUnitScaleBytes + size_t(b % kUnitBlocks) * kBytes;
    }
};

template <GgmlType T>
constexpr bool kInteger = kQuantized<T>;

// Block b of a row as it is packed: row r's scales into its unit's scale area `unit` (the same
// values again for each block of the unit) and the block's `scales`, and its 32 values.
template <GgmlType T>
void PackedBlock(const uint8_t* row, int64_t b, uint8_t* unit, uint8_t* scales, int r, uint8_t* v) {
    constexpr int R = int(kGroupRows);
    if constexpr (T == GgmlType::kQ8_0) {
        const auto& blk = reinterpret_cast<const BlockQ8_0*>(row)[b];
        std::memcpy(scales + 2 * r, &blk.scale, 2);
        for (int j = 0; j < 32; ++j)
            v[j] = uint8_t(blk.quants[j] ^ 0x80);
    } else if constexpr (T == GgmlType::kQ4_0 || T == GgmlType::kQ4_1 || T == GgmlType::kQ5_0 ||
                         T == GgmlType::kQ5_1) {
        using Block = std::conditional_t<
            T == GgmlType::kQ4_0, BlockQ4_0,
            std::conditional_t<T == GgmlType::kQ4_1, BlockQ4_1,
                               std::conditional_t<T == GgmlType::kQ5_0, BlockQ5_0, BlockQ5_1>>>;
        const auto& blk = reinterpret_cast<const Block*>(row)[b];
        for (int j = 0; j < 16; ++j) {
            v[j] = uint8_t(blk.quants[j] & 0xF);
            v[j + 16] = uint8_t(blk.quants[j] >> 4);
        }
        if constexpr (T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1) {
            uint32_t mask;
            std::memcpy(&mask, blk.high, 4);
            for (int j = 0; j < 32; ++j)
                v[j] = uint8_t(v[j] | ((mask >> j) & 1) << 4);
        }
        std::memcpy(scales + 2 * r, &blk.scale, 2);
        if constexpr (T == GgmlType::kQ4_1 || T == GgmlType::kQ5_1)
            std::memcpy(scales + 2 * (R + r), &blk.min, 2);
    } else if constexpr (T == GgmlType::kQ6_K) {
        const auto& blk = reinterpret_cast<const BlockQ6_K*>(row)[b / 8];
        const int h = int(b % 8) / 4, part = int(b % 4);
        std::memcpy(unit + 2 * r, &blk.d, 2);
        scales[r] = uint8_t(blk.scales[8 * h + 2 * part]);
        scales[R + r] = uint8_t(blk.scales[8 * h + 2 * part + 1]);
        for (int l = 0; l < 32; ++l) {
            const int low = (blk.low[64 * h + 32 * (part % 2) + l] >> (4 * (part / 2))) & 0xF;
            const int high = (blk.high[32 * h + l] >> (2 * part)) & 3;
            v[l] = uint8_t(low | high << 4);
        }
    } else {
        static_assert(T == GgmlType::kQ4_K || T == GgmlType::kQ5_K);
        using Block = std::conditional_t<T == GgmlType::kQ4_K, BlockQ4_K, BlockQ5_K>;
        const auto& blk = reinterpret_cast<const Block*>(row)[b / 8];
        const int s = int(b % 8);
        k_scale_min(s, blk.scales, &scales[r], &scales[R + r]);
        std::memcpy(unit + 2 * r, &blk.d, 2);
        std::memcpy(unit + 2 * (R + r), &blk.dmin, 2);
        for (int l = 0; l < 32; ++l) {
            v[l] = uint8_t((blk.quants[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF);
            if constexpr (T == GgmlType::kQ5_K) v[l] |= uint8_t(((blk.high[l] >> s) & 1) << 4);
        }
    }
}

template <GgmlType T>
void PackRowsOf(const uint8_t* src, size_t row_bytes, int64_t rows, int64_t cols, int64_t g0,
                int64_t g1, uint8_t* dst) {
    using P = Packed<T>;
    const int64_t nb = cols / 32;
    const size_t group_bytes = P::group_bytes(cols);
    for (int64_t g = g0; g < g1; ++g) {
        uint8_t* group = dst + size_t(g - g0) * group_bytes;
        std::fill_n(group, group_bytes, uint8_t(0));  // rows past the end: scale 0
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t* blk = P::block(group, b);
            uint8_t* chunks = blk + kGroupRows * P::kScaleBytes;
            uint8_t* high = chunks + P::kChunks * P::kChunkBytes;
            for (int r = 0; r < int(kGroupRows); ++r) {
                const int64_t row = g * kGroupRows + r;
                if (row >= rows) break;
                uint8_t v[32];
                PackedBlock<T>(src + size_t(row) * row_bytes, b, P::unit(group, b), blk, r, v);
                for (int k = 0; k < P::kChunks; ++k) {
                    for (int i = 0; i < 4; ++i) {
                        uint8_t& chunk = chunks[size_t(k) * P::kChunkBytes + size_t(4 * r + i)];
                        if constexpr (!P::kNibbles) {
                            chunk = v[4 * k + i];
                            continue;
                        }
                        chunk = uint8_t((v[4 * k + i] & 0xF) | (v[16 + 4 * k + i] & 0xF) << 4);
                        if constexpr (P::kHighBits > 0) {
                            for (int n = 0; n < 2; ++n)
                                high[size_t(P::high_chunk(k, n)) * P::kChunkBytes +
                                     size_t(4 * r + i)] |=
                                    uint8_t((v[16 * n + 4 * k + i] >> 4) << P::high_shift(k, n));
                        }
                    }
                }
            }
        }
    }
}

void PackRows(GgmlType type, const uint8_t* src, size_t row_bytes, int64_t rows, int64_t cols,
              int64_t g0, int64_t g1, uint8_t* dst) {
    WithType(type, [&](auto t) {
        if constexpr (kInteger<t()>) PackRowsOf<t()>(src, row_bytes, rows, cols, g0, g1, dst);
    });
}

using DI = hn::Rebind<int32_t, DF>;
using VI = hn::Vec<DI>;

void QuantizeInputs(const float* x, int64_t blocks, const QuantizedInputArrays::Out& out) {
    const DF df;
    const DI di;
    const hn::Rebind<int8_t, DF> d8;
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const float* xb = x + blk * 32;
        VF m = hn::Zero(df);
        for (int k = 0; k < 32 / kLanes; ++k)
            m = hn::Max(m, hn::Abs(hn::LoadU(df, xb + k * kLanes)));
        const float dx = hn::GetLane(hn::MaxOfLanes(df, m)) / 127.0f;
        const VF inv = hn::Set(df, dx != 0.0f ? 1.0f / dx : 0.0f);
        VI s = hn::Zero(di);
        int32_t sum_lo = 0;
        for (int k = 0; k < 32 / kLanes; ++k) {
            const VF v = hn::Mul(hn::LoadU(df, xb + k * kLanes), inv);
#if HWY_TARGET == HWY_SCALAR
            // Highway's scalar NearestInt rounds x + 0.5 first (0.49999997 becomes 1).
            const VI qi = hn::Set(di, int32_t(std::nearbyint(hn::GetLane(v))));
#else
            const VI qi = hn::NearestInt(v);
#endif
            hn::StoreU(hn::DemoteTo(d8, qi), d8, out.q + blk * 32 + k * kLanes);
            s = hn::Add(s, qi);
            if ((k + 1) * kLanes == 16) sum_lo = hn::GetLane(hn::SumOfLanes(di, s));
        }
        const int32_t sum = hn::GetLane(hn::SumOfLanes(di, s));
        out.d[blk] = dx;
        out.sum[blk] = sum;
        out.dsum[blk] = dx * float(sum);
        out.dsum_lo[blk] = dx * float(sum_lo);
        out.dsum_hi[blk] = dx * float(sum - sum_lo);
    }
}

HWY_INLINE int32_t Load4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

#undef SPECULA_INT_KERNEL
#if HWY_TARGET != HWY_SCALAR
using DU8 = hn::Repartition<uint8_t, DI>;  // a lane's 4 bytes
using VU8 = hn::Vec<DU8>;
#if HWY_TARGET == HWY_AVX3_DL
// Compiled with AVX512-VNNI (which the AVX3_DL target requires of the CPU): a 4-byte dot
// product per lane in one instruction.
// The whole target string: Clang's attribute replaces the target's, GCC's adds to it.
#define SPECULA_INT_KERNEL __attribute__((target(HWY_TARGET_STR ",avx512vnni")))
struct IntSums {
    VI s;
    using Input = VI;  // 4 signed bytes in each lane
    HWY_INLINE IntSums() : s(hn::Zero(DI())) {}
    static HWY_INLINE Input input(int32_t x4) { return hn::Set(DI(), x4); }
    // Each lane += its 4 unsigned bytes of w times the 4 signed bytes of x.
    HWY_INLINE SPECULA_INT_KERNEL void add(VU8 w, Input x) {
        s.raw = _mm512_dpbusd_epi32(s.raw, w.raw, x.raw);
    }
    HWY_INLINE VI get() const { return s; }
};
// AMX (Intel's tile multiplies, from Sapphire Rapids on): one TDPBSUD multiplies a tile of 16
// inputs' 32 signed bytes by a packed block's 8 chunks of 16 rows x 4 unsigned bytes (the
// layout AMX reads its second operand in) into the 16 x 16 integer sums of a group tile of
// kTileInputs inputs: the sums IntSums gives, so the epilogue, and every float, is the same.
// The inputs are first copied in tile order (TileOrder): a tile's block is 512 contiguous
// bytes. The sums of the next kAmxSums tiles' blocks are asked for before the float epilogue
// of the current ones, which hides the tile multiplies' latency behind it. Tiles 0-3: sums
// (16 x 16 int32); 4, 5: inputs; 6, 7: weights (Q6_K: each block's halves apart, 16 columns).
#define SPECULA_AMX_KERNEL __attribute__((target(HWY_TARGET_STR ",avx512vnni,amx-tile,amx-int8")))
constexpr bool kHasAmxKernel = true;
static_assert(kGroupRows == 16 && kLanes == 16 && kTileInputs == 16);
constexpr int64_t kTileBlockBytes = kTileInputs * 32;  // a tile's inputs of one block
constexpr int kAmxSums = 4;                            // tiles of sums in flight
using AmxSums = int32_t[kAmxSums][kTileInputs * kGroupRows];
struct alignas(64) AmxTiles {
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
};
// halves: the tiles of Q6_K, whose blocks have a scale per half (16 columns a tile).
SPECULA_AMX_KERNEL void AmxConfigure(bool halves) {
    static const AmxTiles whole{.bytes_per_row = {64, 64, 64, 64, 32, 32, 64, 64},
                                .rows = {16, 16, 16, 16, 16, 16, 8, 8}},
        half{.bytes_per_row = {64, 64, 64, 64, 16, 16, 64, 64},
             .rows = {16, 16, 16, 16, 16, 16, 4, 4}};
    _tile_loadconfig(halves ? &half : &whole);
}
SPECULA_AMX_KERNEL void AmxRelease() {
    _tile_release();
}
// Sums tile k (< count) of the integer sums of weights w[k] (4 or 8 chunks of 64 bytes) with
// inputs x[k] (a tile's, 32 bytes apart): sums[k][c * 16 + r].
SPECULA_AMX_KERNEL HWY_NOINLINE void AmxTileSums(const uint8_t* const* w, const int8_t* const* x,
                                                 int count, AmxSums& sums) {
    // GCC's tile intrinsics are asm statements that do not say they read or write memory.
    asm volatile("" ::: "memory");
// Sums tile k from inputs loaded into tile `in` and weights into tile `wt` (a macro: GCC's
// tile intrinsics take a tile's number as a token).
#define SPECULA_AMX_SUM(k, in, wt) \
    do {                           \
        _tile_zero(k);             \
        _tile_loadd(in, x[k], 32); \
        _tile_loadd(wt, w[k], 64); \
        _tile_dpbsud(k, in, wt);   \
    } while (false)
    SPECULA_AMX_SUM(0, 4, 6);
    if (count > 1) SPECULA_AMX_SUM(1, 5, 7);
    if (count > 2) SPECULA_AMX_SUM(2, 4, 6);
    if (count > 3) SPECULA_AMX_SUM(3, 5, 7);
#undef SPECULA_AMX_SUM
    _tile_stored(0, sums[0], 64);
    if (count > 1) _tile_stored(1, sums[1], 64);
    if (count > 2) _tile_stored(2, sums[2], 64);
    if (count > 3) _tile_stored(3, sums[3], 64);
    asm volatile("" ::: "memory");
}
#else
#define SPECULA_INT_KERNEL
// Highway 1.0.3 has no 8-bit dot product: bytes are widened to 16 bits and multiplied and
// summed in pairs; a lane of lo (hi) holds one of the two pairs of a row of the vector's lower
// (upper) half until get() adds them. The same integers as one 4-byte product.
struct IntSums {
    using D16 = hn::Repartition<int16_t, DI>;
    VI lo, hi;
    using Input = hn::Vec<D16>;  // x0 x1 x2 x3 x0 x1 ... as 16-bit integers
    // Written out (GCC compiles an implicit constructor without the target's options on NEON).
    HWY_INLINE IntSums() : lo(hn::Zero(DI())), hi(hn::Zero(DI())) {}
    static HWY_INLINE Input input(int32_t x4) {
        const hn::Repartition<int8_t, DI> d8;
        return hn::PromoteTo(D16(), hn::LowerHalf(hn::BitCast(d8, hn::Set(DI(), x4))));
    }
    static HWY_INLINE VI pairs(hn::Vec<D16> a, Input b) {
        const DI di;
        VI odd = hn::Zero(di);
        const VI even = hn::ReorderWidenMulAccumulate(di, a, b, hn::Zero(di), odd);
        return hn::RearrangeToOddPlusEven(even, odd);
    }
    HWY_INLINE void add(VU8 w, Input x) {
        const D16 d16;
        const hn::Half<DU8> dh;
        lo = hn::Add(lo, pairs(hn::PromoteTo(d16, hn::LowerHalf(dh, w)), x));
        hi = hn::Add(hi, pairs(hn::PromoteTo(d16, hn::UpperHalf(dh, w)), x));
    }
    HWY_INLINE VI get() const {
        const DI di;
        return hn::Add(hn::ConcatEven(di, hi, lo), hn::ConcatOdd(di, hi, lo));
    }
};
#endif
#else
#define SPECULA_INT_KERNEL
#endif
#if HWY_TARGET != HWY_AVX3_DL
constexpr bool kHasAmxKernel = false;
#endif

// Inputs computed together by one group tile (accumulators: C float vectors and C integer
// sums per row vector).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_ARCH_ARM
constexpr int kIntCols = 8;
#else
constexpr int kIntCols = 4;
#endif
constexpr int kRowVecs = int(kGroupRows / kLanes);

#if HWY_TARGET != HWY_SCALAR
// The values of chunk k of a stored block's nibbles (rows from `chunks` on, the high chunks
// after the block's chunks): columns 4k + i (low) and 16 + 4k + i (high).
template <GgmlType T>
HWY_INLINE void Unpack(const uint8_t* chunks, int k, VU8* low, VU8* high) {
    using P = Packed<T>;
    const DU8 du8;
    const VU8 bytes = hn::LoadU(du8, chunks + k * P::kChunkBytes);
    *low = hn::And(bytes, hn::Set(du8, 15));
    *high = hn::ShiftRight<4>(bytes);
    if constexpr (P::kHighBits > 0) {
        // Shifted as 16-bit lanes: what crosses into the next byte lies outside the mask.
        const hn::Repartition<uint16_t, DU8> du16;
        const uint8_t* high_chunks = chunks + P::kChunks * P::kChunkBytes;
        const VU8 mask = hn::Set(du8, uint8_t(((1 << P::kHighBits) - 1) << 4));
        const auto above = [&](int n) {  // the bits above nibble n, in place
            const auto e = hn::BitCast(
                du16, hn::LoadU(du8, high_chunks + P::high_chunk(k, n) * P::kChunkBytes));
            const int shift = 4 - P::high_shift(k, n);
            return hn::BitCast(
                du8, shift >= 0 ? hn::ShiftLeftSame(e, shift) : hn::ShiftRightSame(e, -shift));
        };
        *low = hn::OrAnd(*low, above(0), mask);
        *high = hn::OrAnd(*high, above(1), mask);
    }
}

// A group of n_blocks stored blocks as Packed<T, true>: products with many inputs unpack each
// block once instead of once per tile of inputs (Q6_K prompts ~30% faster).
template <GgmlType T>
void ExpandGroup(const uint8_t* group, int64_t n_blocks, uint8_t* out) {
    using P = Packed<T>;
    using E = Packed<T, true>;
    const DU8 du8;
    for (int64_t b = 0; b < n_blocks; ++b) {
        if (b % P::kUnitBlocks == 0)
            std::memcpy(E::unit(out, b), P::unit(group, b), kGroupRows * P::kUnitScaleBytes);
        const uint8_t* src = P::block(group, b);
        uint8_t* dst = E::block(out, b);
        std::memcpy(dst, src, kGroupRows * P::kScaleBytes);
        src += kGroupRows * P::kScaleBytes;
        dst += kGroupRows * P::kScaleBytes;
        for (int h = 0; h < kRowVecs; ++h) {
            for (int k = 0; k < 4; ++k) {
                VU8 low, high;
                Unpack<T>(src + h * kLanes * 4, k, &low, &high);
                hn::StoreU(low, du8, dst + k * P::kChunkBytes + h * kLanes * 4);
                hn::StoreU(high, du8, dst + (4 + k) * P::kChunkBytes + h * kLanes * 4);
            }
        }
    }
}
#endif

// The integer sums of rows h * kLanes .. of a packed block (at `blk`) with inputs c0 + c (their
// quantized values of the block at xq + c * stride): lo[c] over the block, or for Q6_K over its
// first 16 columns and hi[c] over the other 16.
template <GgmlType T, int C, bool kExpanded>
SPECULA_INT_KERNEL HWY_INLINE void BlockSums(const uint8_t* blk, int h, const int8_t* xq,
                                             int64_t stride, VI* lo, VI* hi) {
    using P = Packed<T, kExpanded>;
    constexpr bool kHalves = T == GgmlType::kQ6_K;
    const uint8_t* chunks = blk + kGroupRows * P::kScaleBytes;
#if HWY_TARGET == HWY_SCALAR
    const uint8_t* high = chunks + P::kChunks * P::kChunkBytes;
    for (int c = 0; c < C; ++c) {
        const int8_t* xc = xq + c * stride;
        int32_t s[2] = {0, 0};
        for (int k = 0; k < P::kChunks; ++k) {
            for (int i = 0; i < 4; ++i) {
                const int w = chunks[size_t(k) * P::kChunkBytes + size_t(4 * h + i)];
                if constexpr (!P::kNibbles) {
                    s[kHalves && k >= 4 ? 1 : 0] += w * xc[4 * k + i];
                    continue;
                }
                for (int n = 0; n < 2; ++n) {
                    int value = n == 0 ? w & 15 : w >> 4;
                    if constexpr (P::kHighBits > 0) {
                        const int e =
                            high[size_t(P::high_chunk(k, n)) * P::kChunkBytes + size_t(4 * h + i)];
                        value |= ((e >> P::high_shift(k, n)) & ((1 << P::kHighBits) - 1)) << 4;
                    }
                    s[kHalves ? n : 0] += value * xc[16 * n + 4 * k + i];
                }
            }
        }
        lo[c] = hn::Set(DI(), s[0]);
        if constexpr (kHalves) hi[c] = hn::Set(DI(), s[1]);
    }
#else
    chunks += h * kLanes * 4;
    IntSums sums[C], sums_hi[kHalves ? C : 1];  // zero
    if constexpr (!P::kNibbles) {
        // Columns 0..15, then 16..31 (a separate loop: a sum chosen per chunk at run time
        // would keep the sums in memory).
        for (int k = 0; k < 8; ++k) {
            const VU8 bytes = hn::LoadU(DU8(), chunks + k * P::kChunkBytes);
            for (int c = 0; c < C; ++c)
                sums[c].add(bytes, IntSums::input(Load4(xq + c * stride + 4 * k)));
            if (kHalves && k == 3) break;
        }
        if constexpr (kHalves) {
            for (int k = 4; k < 8; ++k) {
                const VU8 bytes = hn::LoadU(DU8(), chunks + k * P::kChunkBytes);
                for (int c = 0; c < C; ++c)
                    sums_hi[c].add(bytes, IntSums::input(Load4(xq + c * stride + 4 * k)));
            }
        }
    }
    for (int k = 0; k < P::kChunks && P::kNibbles; ++k) {
        VU8 low, high_nibble;
        Unpack<T>(chunks, k, &low, &high_nibble);
        for (int c = 0; c < C; ++c) {
            sums[c].add(low, IntSums::input(Load4(xq + c * stride + 4 * k)));
            (kHalves ? sums_hi[c] : sums[c])
                .add(high_nibble, IntSums::input(Load4(xq + c * stride + 16 + 4 * k)));
        }
    }
    for (int c = 0; c < C; ++c) {
        lo[c] = sums[c].get();
        if constexpr (kHalves) hi[c] = sums_hi[c].get();
    }
#endif
}

// The next blocks are asked for explicitly where the hardware prefetcher falls behind the
// stream: with three or more inputs, whose products are bound by arithmetic rather than memory,
// 4 KiB ahead (a forward of 8 positions 8-10% faster than at 2 KiB on an AMD EPYC, whose loads
// of the weights still stalled it), and at every input count where prefetches_every_product()
// (kernels.h) says so, 2 KiB ahead (as measured there).
constexpr size_t kPrefetchAheadOfArithmetic = 4096;
constexpr size_t kPrefetchAheadOfStream = 2048;
// Bytes of 8-bit inputs that IntegerMatmulRows multiplies with each group of rows in turn.
constexpr int64_t kInputBlockBytes = int64_t(512) << 10;
constexpr size_t kCacheLineBytes = 64;
constexpr int kPrefetchFromInputs = 3;
// kAmx: the integer sums by AmxTileSums (C = kTileInputs, a block's values one a byte), the
// inputs c0 .. c0 + C - 1 also at `tiled` in tile order.
template <GgmlType T, int C, bool kExpanded = false, bool kAmx = false>
SPECULA_INT_KERNEL void GroupTile(const uint8_t* group, const QuantizedInputs& x, int64_t c0,
                                  int rows, float* out, int64_t out_stride, bool accumulate,
                                  bool prefetch, [[maybe_unused]] const int8_t* tiled = nullptr) {
    using P = Packed<T, kExpanded>;
    static_assert(!kAmx || (kHasAmxKernel && C == kTileInputs && P::kChunks == 8));
#if HWY_TARGET == HWY_AVX3_DL
    [[maybe_unused]] HWY_ALIGN AmxSums amx_sums[2];
#endif
    const DF df;
    const DI di;
    const hn::Rebind<hwy::float16_t, DF> dh;
    // kLanes rows' f16 scales at halves[0], as floats
    const auto halves = [&](const uint8_t* p, int h) {
        return hn::PromoteTo(
            df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p) + h * kLanes));
    };
    const int64_t nb = x.cols / 32;
    for (int h = 0; h < kRowVecs && h * kLanes < rows; ++h) {
        VF acc[C];
        for (int c = 0; c < C; ++c)
            acc[c] = hn::Zero(df);
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t* blk = P::block(group, b);
            const uint8_t* unit = P::unit(group, b);
            const int8_t* xq = x.q + c0 * x.cols + b * 32;  // input c0 + c at xq + c * x.cols
            constexpr size_t ahead =
                C >= kPrefetchFromInputs ? kPrefetchAheadOfArithmetic : kPrefetchAheadOfStream;
            if (C >= kPrefetchFromInputs || prefetch)
                for (size_t line = 0; line < P::kBytes; line += kCacheLineBytes)
                    hwy::Prefetch(blk + ahead + line);
            // The integer sums of input c: lo(c), and for Q6_K's second halves hi(c).
            constexpr bool kHalves = T == GgmlType::kQ6_K;
            [[maybe_unused]] VI isum[kAmx ? 1 : C], isum_hi[kAmx || !kHalves ? 1 : C];
            // AMX: block b's sums (Q6_K: of its first half, and of its second at tile_hi)
            [[maybe_unused]] const int32_t *tile = nullptr, *tile_hi = nullptr;
#if HWY_TARGET == HWY_AVX3_DL
            if constexpr (kAmx) {
                // The sums of blocks b .. b + per - 1 are in amx_sums[(b / per) % 2], asked for
                // on the turn of the blocks before them.
                constexpr int64_t per = kHalves ? kAmxSums / 2 : kAmxSums;
                const auto ask = [&](int64_t b0) {
                    const uint8_t* w[kAmxSums];
                    const int8_t* in[kAmxSums];
                    const int count = int(std::min(per, nb - b0) * (kHalves ? 2 : 1));
                    for (int k = 0; k < count; ++k) {
                        const int64_t bk = b0 + (kHalves ? k / 2 : k);
                        const int half = kHalves ? k % 2 : 0;
                        w[k] = P::block(group, bk) + kGroupRows * P::kScaleBytes + half * 4 * 64;
                        in[k] = tiled + bk * kTileBlockBytes + half * 16;
                    }
                    AmxTileSums(w, in, count, amx_sums[(b0 / per) % 2]);
                };
                if (b == 0) ask(0);
                if (b % per == 0 && b + per < nb) ask(b + per);
                const int k = int(b % per) * (kHalves ? 2 : 1);
                tile = amx_sums[(b / per) % 2][k];
                tile_hi = amx_sums[(b / per) % 2][kHalves ? k + 1 : k];
            }
#endif
            if constexpr (!kAmx) BlockSums<T, C, kExpanded>(blk, h, xq, x.cols, isum, isum_hi);
            [[maybe_unused]] const auto lo = [&](int c) {
                if constexpr (kAmx)
                    return hn::Load(di, tile + c * kLanes);
                else
                    return isum[c];
            };
            [[maybe_unused]] const auto hi = [&](int c) {
                if constexpr (kAmx)
                    return hn::Load(di, tile_hi + c * kLanes);
                else
                    return isum_hi[c];
            };
            if constexpr (kHalves) {
                const hn::Rebind<int8_t, DF> d8;
                const auto* s8 = reinterpret_cast<const int8_t*>(blk) + h * kLanes;
                const VI s_lo = hn::PromoteTo(di, hn::LoadU(d8, s8));
                const VI s_hi = hn::PromoteTo(di, hn::LoadU(d8, s8 + kGroupRows));
                const VF dw = halves(unit, h);
                // d * s and -(d * (32 * s)) per half: exact (an f16 times an 8- or 13-bit integer)
                const VF d_lo = hn::Mul(dw, hn::ConvertTo(df, s_lo));
                const VF d_hi = hn::Mul(dw, hn::ConvertTo(df, s_hi));
                const VF off_lo = hn::Mul(d_lo, hn::Set(df, -32.0f));
                const VF off_hi = hn::Mul(d_hi, hn::Set(df, -32.0f));
                for (int c = 0; c < C; ++c) {
                    const int64_t i = (c0 + c) * nb + b;
                    const VF dx = hn::Set(df, x.d[i]);
                    acc[c] = hn::MulAdd(hn::ConvertTo(df, lo(c)), hn::Mul(d_lo, dx), acc[c]);
                    acc[c] = hn::MulAdd(hn::ConvertTo(df, hi(c)), hn::Mul(d_hi, dx), acc[c]);
                    acc[c] = hn::MulAdd(hn::Set(df, x.dsum_lo[i]), off_lo, acc[c]);
                    acc[c] = hn::MulAdd(hn::Set(df, x.dsum_hi[i]), off_hi, acc[c]);
                }
                continue;
            }
            if constexpr (has_block_min(T)) {
                VF d1, m1;
                if constexpr (is_k_quant(T)) {
                    // d * scale and dmin * min: f16 times 6 bits, exact in f32, so the same
                    // floats as dequantize_block32's d1 and m1.
                    const hn::Rebind<uint8_t, DF> du8;
                    const uint8_t* s = blk + h * kLanes;
                    d1 = hn::Mul(halves(unit, h),
                                 hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(du8, s))));
                    m1 = hn::Mul(
                        halves(unit + 2 * kGroupRows, h),
                        hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(du8, s + kGroupRows))));
                } else {
                    d1 = halves(blk, h);
                    m1 = hn::Neg(halves(blk + 2 * kGroupRows, h));
                }
                const VF neg_m1 = hn::Neg(m1);
                for (int c = 0; c < C; ++c) {
                    const int64_t i = (c0 + c) * nb + b;
                    const VF dx = hn::Set(df, x.d[i]);
                    acc[c] = hn::MulAdd(hn::ConvertTo(df, lo(c)), hn::Mul(d1, dx), acc[c]);
#if HWY_NATIVE_FMA
                    acc[c] = hn::MulAdd(hn::Set(df, x.dsum[i]), neg_m1, acc[c]);
#else
                    // Where the product is rounded before the sum, dx * sum qx times m1 made
                    // the NumPy parity test's Q4_K model (SSE4) round an input the other way
                    // where no input near a half explains it; sum qx times m1 * dx does not.
                    acc[c] = hn::MulAdd(hn::Set(df, float(x.sum[i])), hn::Mul(neg_m1, dx), acc[c]);
#endif
                }
            } else {
                const VF dw = halves(blk, h);
                for (int c = 0; c < C; ++c) {
                    const int64_t i = (c0 + c) * nb + b;
                    const VI exact = hn::Sub(lo(c), hn::Set(di, P::kOffset * x.sum[i]));
                    acc[c] = hn::MulAdd(hn::ConvertTo(df, exact), hn::Mul(dw, hn::Set(df, x.d[i])),
                                        acc[c]);
                }
            }
        }
        const int valid = std::min<int>(int(kLanes), rows - h * int(kLanes));
        for (int c = 0; c < C; ++c) {
            float* o = out + c * out_stride + h * kLanes;
            if (valid == kLanes) {
                hn::StoreU(accumulate ? hn::Add(hn::LoadU(df, o), acc[c]) : acc[c], df, o);
            } else {
                HWY_ALIGN float lanes[kLanes];
                hn::Store(acc[c], df, lanes);
                for (int i = 0; i < valid; ++i)
                    o[i] = accumulate ? o[i] + lanes[i] : lanes[i];
            }
        }
    }
}

template <GgmlType T>
using GroupTileFn = void (*)(const uint8_t*, const QuantizedInputs&, int64_t, int, float*, int64_t,
                             bool, bool, const int8_t*);
template <GgmlType T, int... Cs>
constexpr std::array<GroupTileFn<T>, sizeof...(Cs)> GroupTileTable(
    std::integer_sequence<int, Cs...>) {
    return {&GroupTile<T, Cs + 1>...};
}
// kGroupTiles<T>[c - 1]: a group of type T for c inputs.
template <GgmlType T>
constexpr auto kGroupTiles = GroupTileTable<T>(std::make_integer_sequence<int, kIntCols>());

#if HWY_TARGET == HWY_AVX3_DL
// The quantized values of `tiles` tiles of kTileInputs inputs from c0 on, in tile order: tile t's
// inputs of block b are kTileBlockBytes at (t * blocks + b) * kTileBlockBytes, input by input.
void TileOrder(const QuantizedInputs& x, int64_t c0, int64_t tiles, AlignedVector<int8_t>* out) {
    const int64_t nb = x.cols / 32;
    out->resize(size_t(tiles * kTileInputs * x.cols));
    for (int64_t t = 0; t < tiles; ++t)
        for (int64_t c = 0; c < kTileInputs; ++c) {
            const int8_t* src = x.q + (c0 + t * kTileInputs + c) * x.cols;
            int8_t* dst = out->data() + t * nb * kTileBlockBytes + c * 32;
            for (int64_t b = 0; b < nb; ++b)
                std::memcpy(dst + b * kTileBlockBytes, src + b * 32, 32);
        }
}
#endif

// Groups of rows in [row_begin, row_end) (row_begin a multiple of kGroupRows), each for a
// block of inputs, kIntCols (AMX: kTileInputs) at a time: a group's weights are read from L1 or
// L2 for all of them.
template <GgmlType T>
void IntegerMatmulRows(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
    const size_t group_bytes = Packed<T>::group_bytes(a.cols);
    const bool prefetch = prefetches_every_product();
    thread_local AlignedVector<uint8_t> scratch, expanded;
    thread_local AlignedVector<int8_t> tiled;  // AMX: the block's inputs in tile order
#if HWY_TARGET != HWY_SCALAR
    const bool expand = Packed<T>::kNibbles && a.n >= 2 * kIntCols;
    if (expand) expanded.resize(Packed<T, true>::group_bytes(a.cols));
#else
    const bool expand = false;
#endif
#if HWY_TARGET == HWY_AVX3_DL
    const bool amx = a.amx && a.n >= kTileInputs && (expand || !Packed<T>::kNibbles);
    if (amx) AmxConfigure(T == GgmlType::kQ6_K);
#else
    const bool amx = false;
#endif
    // The inputs a block at a time, each block's groups in turn: the block stays in L2 while
    // every group of rows reads it, and a group is read (or packed, or expanded) once per
    // block. Streamed past each group, a Whisper encoder's 1500 inputs came from L3 once per
    // 16 rows.
    const int64_t block =
        std::max<int64_t>(kTileInputs, kInputBlockBytes / a.cols / kTileInputs * kTileInputs);
    for (int64_t cb = 0; cb < a.n; cb += block) {
        const int64_t cb_end = std::min(a.n, cb + block);
#if HWY_TARGET == HWY_AVX3_DL
        if (amx) TileOrder(*a.qx, cb, (cb_end - cb) / kTileInputs, &tiled);
#endif
        for (int64_t r0 = row_begin; r0 < row_end; r0 += kGroupRows) {
            const int64_t g = r0 / kGroupRows;
            const uint8_t* group = nullptr;
            if (a.packed != nullptr) {
                group = a.packed + size_t(g) * group_bytes;
            } else {
                scratch.resize(group_bytes);
                PackRowsOf<T>(a.w, a.row_bytes, row_end, a.cols, g, g + 1, scratch.data());
                group = scratch.data();
            }
            const int rows = int(std::min(kGroupRows, row_end - r0));
#if HWY_TARGET != HWY_SCALAR
            if constexpr (Packed<T>::kNibbles) {
                if (expand) ExpandGroup<T>(group, a.cols / 32, expanded.data());
            }
#endif
            int64_t c0 = cb;
            if constexpr (kHasAmxKernel) {
                // Stored bytes (Q8_0) or the expanded group: AMX reads a block's values as bytes.
                const uint8_t* bytes = Packed<T>::kNibbles ? expanded.data() : group;
                for (; amx && c0 + kTileInputs <= cb_end; c0 += kTileInputs)
                    GroupTile<T, kTileInputs, Packed<T>::kNibbles, true>(
                        bytes, *a.qx, c0, rows, a.out + c0 * a.out_stride + r0, a.out_stride,
                        a.accumulate, prefetch, tiled.data() + (c0 - cb) * a.cols);
            }
            for (; c0 < cb_end; c0 += kIntCols) {
                const int n = int(std::min<int64_t>(kIntCols, cb_end - c0));
                float* out = a.out + c0 * a.out_stride + r0;
                if constexpr (Packed<T>::kNibbles) {
                    if (expand && n == kIntCols) {
                        GroupTile<T, kIntCols, true>(expanded.data(), *a.qx, c0, rows, out,
                                                     a.out_stride, a.accumulate, prefetch);
                        continue;
                    }
                }
                kGroupTiles<T>[size_t(n - 1)](group, *a.qx, c0, rows, out, a.out_stride,
                                              a.accumulate, prefetch, nullptr);
            }
        }
    }
#if HWY_TARGET == HWY_AVX3_DL
    if (amx) AmxRelease();  // the tiles' 8 KB of state no longer saved at each context switch
#endif
}

// Up to kRowCols inputs (a decode step, a verification batch) read each weight once: a row
// at a time is decoded as it is multiplied (one stream through memory: four rows at once
// measured 25-45% slower at n = 1, decoding into floats first 25%). Wider inputs (prompts)
// would decode a row once per kRowCols inputs, so a tile's rows are decoded once into floats
// (the same values) and register tiles of rows x inputs read those.
template <GgmlType T>
void MatmulRowsOf(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
    if constexpr (kInteger<T>) {
        if (a.qx != nullptr) return IntegerMatmulRows<T>(a, row_begin, row_end);
    }
    if (a.n <= kRowCols) {
        kRowByRow<T>[size_t(a.n - 1)](a, row_begin, row_end);
        return;
    }
    // Blocks of up to 64 rows (decoded once) and 8 inputs, so that a tile's rows (12 KB at
    // 768 columns) and a block's inputs (24 KB) are both read from L1: streaming every input
    // from L2 for each tile of rows measured ~25% slower at 64 inputs.
    constexpr int64_t kBlockRows = 16 * kTileRows, kBlockInputs = 4 * kTileCols;
    thread_local AlignedVector<float> decoded;
    if (T != GgmlType::kF32) decoded.resize(std::max(decoded.size(), size_t(kBlockRows * a.cols)));
    for (int64_t rb = row_begin; rb < row_end; rb += kBlockRows) {
        const int64_t rb_end = std::min(row_end, rb + kBlockRows);
        const uint8_t* base = a.w + size_t(rb) * a.row_bytes;  // F32 rows are read in place
        size_t stride = a.row_bytes;
        if constexpr (T != GgmlType::kF32) {
            for (int64_t r = rb; r < rb_end; ++r)
                DecodeRowOf<T>(a.w + size_t(r) * a.row_bytes, a.cols,
                               decoded.data() + (r - rb) * a.cols);
            base = reinterpret_cast<const uint8_t*>(decoded.data());
            stride = size_t(a.cols) * sizeof(float);
        }
        for (int64_t cb = 0; cb < a.n; cb += kBlockInputs) {
            const int64_t cb_end = std::min(a.n, cb + kBlockInputs);
            for (int64_t r0 = rb; r0 < rb_end; r0 += kTileRows) {
                const int n_rows = int(std::min<int64_t>(kTileRows, rb_end - r0));
                const Weights<GgmlType::kF32> rows{base + size_t(r0 - rb) * stride, stride};
                for (int64_t c0 = cb; c0 < cb_end; c0 += kTileCols) {
                    const int n = int(std::min<int64_t>(kTileCols, cb_end - c0));
                    kF32Tiles[size_t(n_rows - 1)][size_t(n - 1)](rows, a.x + c0 * a.cols, a.cols,
                                                                 a.out + c0 * a.out_stride + r0,
                                                                 a.out_stride, a.accumulate);
                }
            }
        }
    }
}

void MatmulRows(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
    WithType(a.type, [&](auto t) { MatmulRowsOf<t()>(a, row_begin, row_end); });
}

float DotF32(const float* a, const float* b, int64_t n) {
    float out = 0.0f;
    Tile<GgmlType::kF32, 1, 1>({reinterpret_cast<const uint8_t*>(a), 0}, b, n, &out, 0, false);
    return out;
}

// out[i] = f(vectors of a[i], b[i]) for i < n. Elements past the last whole vector go through
// one padded vector, so every element is computed by the same instructions wherever it lies:
// a row's values do not depend on how a batch or a thread's share cut it.
template <class F>
void MapPairs(const float* a, const float* b, float* out, int64_t n, const F& f) {
    const DF d;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        hn::StoreU(f(d, hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, out + i);
    if (i == n) return;
    HWY_ALIGN float pa[kLanes] = {}, pb[kLanes] = {}, po[kLanes];
    std::copy(a + i, a + n, pa);
    std::copy(b + i, b + n, pb);
    hn::Store(f(d, hn::Load(d, pa), hn::Load(d, pb)), d, po);
    std::copy(po, po + (n - i), out + i);
}

// act(g) for device_abi.h's activation `act`.
template <uint32_t act>
VF Activated(DF d, VF g) {
    namespace abi = shared;
    const VF one = hn::Set(d, 1.0f);
    // Highway's Exp is defined up to ~88 (it does not overflow to infinity): where e^-x would,
    // e^88 already makes g / (1 + e) zero to within 1e-37.
    const auto exp_neg = [d](VF x) { return hn::Exp(d, hn::Min(hn::Neg(x), hn::Set(d, 88.0f))); };
    if constexpr (act == abi::kActivationGeluTanh) {
        const VF z =
            hn::Mul(hn::Set(d, abi::kGeluTanhScale),
                    hn::MulAdd(hn::Mul(hn::Set(d, abi::kGeluTanhCubic), g), hn::Mul(g, g), g));
        return hn::Div(g, hn::Add(one, exp_neg(hn::Add(z, z))));
    } else if constexpr (act == abi::kActivationGeluErf) {
        const VF z = hn::Mul(g, hn::Set(d, float(M_SQRT1_2)));
        const VF t = hn::Div(one, hn::MulAdd(hn::Set(d, abi::kErfP), hn::Abs(z), one));
        VF poly = hn::Set(d, abi::kErfA5);
        for (const float c : {abi::kErfA4, abi::kErfA3, abi::kErfA2, abi::kErfA1})
            poly = hn::MulAdd(poly, t, hn::Set(d, c));
        poly = hn::Mul(poly, t);
        const VF erf_abs = hn::NegMulAdd(poly, hn::Exp(d, hn::Neg(hn::Mul(z, z))), one);
        const VF erf = hn::CopySignToAbs(erf_abs, z);
        return hn::Mul(hn::Mul(hn::Set(d, 0.5f), g), hn::Add(one, erf));
    } else {
        return hn::Div(g, hn::Add(one, exp_neg(g)));
    }
}

// f(Activated<act>) for the activation `act` chosen at run time: one branch per call, none
// per vector.
template <typename F>
void WithActivation(uint32_t act, const F& f) {
    namespace abi = shared;
    if (act == abi::kActivationGeluTanh)
        return f([](DF d, VF g) { return Activated<abi::kActivationGeluTanh>(d, g); });
    if (act == abi::kActivationGeluErf)
        return f([](DF d, VF g) { return Activated<abi::kActivationGeluErf>(d, g); });
    f([](DF d, VF g) { return Activated<abi::kActivationSilu>(d, g); });
}

void GatedTimes(uint32_t act, const float* gate, const float* up, float* out, int64_t n) {
    WithActivation(act, [&](auto activated) {
        MapPairs(gate, up, out, n, [&](DF d, VF g, VF u) { return hn::Mul(activated(d, g), u); });
    });
}

void Activate(uint32_t act, const float* x, float* out, int64_t n) {
    WithActivation(act, [&](auto activated) {
        MapPairs(x, x, out, n, [&](DF d, VF g, VF) { return activated(d, g); });
    });
}

// Floats from memory that holds floats, or IEEE halves as their bits (the cpu backend's copies
// of keys and values that are exact in F16: Backend::Attention::half_exact).
HWY_INLINE VF LoadAsFloats(DF d, const float* p) {
    return hn::LoadU(d, p);
}
HWY_INLINE VF LoadAsFloats(DF d, const uint16_t* p) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
}
HWY_INLINE float AsFloat(float x) {
    return x;
}
HWY_INLINE float AsFloat(uint16_t h) {
    return half_to_float(h);
}

// Vectors of a value row weighed together: as many as keep a tile's accumulators (Q x J) and
// the value vectors within the register file.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_ARCH_ARM
constexpr int kWeighVecs = 4;
#else
constexpr int kWeighVecs = 2;
#endif

// acc[c][u] += s[c * s_stride] * vecs[u] for a tile of Q scalars by J vectors: the step of the
// attention kernels' register tiles (a dimension's queries times a block's keys; a key's
// weights times its value), each vector loaded once for Q multiply-adds.
template <int Q, int J>
HWY_INLINE void AddOuterProduct(const float* s, int64_t s_stride, const VF* vecs, VF (*acc)[J]) {
    const DF d;
    for (int c = 0; c < Q; ++c) {
        const VF sc = hn::Set(d, s[c * s_stride]);
        for (int u = 0; u < J; ++u)
            acc[c][u] = hn::MulAdd(sc, vecs[u], acc[c][u]);
    }
}

// WeighValues over J vectors of the rows from element j: each value vector is loaded once for
// the Q queries, each query's weight once for the J vectors.
template <int Q, int J, class E>
HWY_INLINE void WeighSpan(const float* p, int64_t p_stride, int t0, int t1, const E* v,
                          int64_t v_stride, int64_t j, int head_dim, float* acc) {
    const DF d;
    VF a[Q][J];
    for (int c = 0; c < Q; ++c)
        for (int u = 0; u < J; ++u)
            a[c][u] = t0 == 0 ? hn::Zero(d) : hn::LoadU(d, acc + c * head_dim + j + u * kLanes);
    for (int t = t0; t < t1; ++t) {
        VF values[J];
        for (int u = 0; u < J; ++u)
            values[u] = LoadAsFloats(d, v + t * v_stride + j + u * kLanes);
        AddOuterProduct<Q, J>(p + t, p_stride, values, a);
    }
    for (int c = 0; c < Q; ++c)
        for (int u = 0; u < J; ++u)
            hn::StoreU(a[c][u], d, acc + c * head_dim + j + u * kLanes);
}

// acc[c] = sum over keys t in [t0, t1) of p[c][t] * v[t] for Q queries, continuing the sums
// acc holds where t0 > 0: each value vector is loaded once for all of them, kWeighVecs vectors
// of a row at a time. Every output element is one chain of fma in key order, whatever Q and
// wherever it is stored between ranges of keys, so a query's result does not depend on the
// others in its block.
template <int Q, class E>
void WeighValues(const float* p, int64_t p_stride, int t0, int t1, const E* v, int64_t v_stride,
                 int head_dim, float* acc) {
    int64_t j = 0;
    for (; j + kWeighVecs * kLanes <= head_dim; j += kWeighVecs * kLanes)
        WeighSpan<Q, kWeighVecs>(p, p_stride, t0, t1, v, v_stride, j, head_dim, acc);
    for (; j + kLanes <= head_dim; j += kLanes)
        WeighSpan<Q, 1>(p, p_stride, t0, t1, v, v_stride, j, head_dim, acc);
    for (; j < head_dim; ++j) {
        for (int c = 0; c < Q; ++c) {
            float sum = t0 == 0 ? 0.0f : acc[c * head_dim + j];
            for (int t = t0; t < t1; ++t)
                sum += p[c * p_stride + t] * AsFloat(v[t * v_stride + j]);
            acc[c * head_dim + j] = sum;
        }
    }
}

// Asks for every cache line that holds one of `bytes` bytes from p, each once. The attention
// kernels compute on a block of keys for several queries between reads, and a core need not
// overlap that with the reads on its own (the values are one head's slice of every key's row, a
// strided walk): they ask for the next keys themselves (docs/DESIGN.md, "Attention reads the keys
// transposed").
HWY_INLINE void PrefetchBytes(const void* p, size_t bytes) {
    const auto start = reinterpret_cast<uintptr_t>(p);
    for (uintptr_t line = start & ~uintptr_t(kCacheLineBytes - 1); line < start + bytes;
         line += kCacheLineBytes)
        hwy::Prefetch(reinterpret_cast<const uint8_t*>(line));
}
// The blocks of transposed keys asked for ahead of the one being scored.
constexpr int kKeyBlocksAhead = 2;

constexpr int kWeighQueries = 4;
template <class E>
using Weigher = void (*)(const float*, int64_t, int, int, const E*, int64_t, int, float*);
template <class E>
constexpr std::array<Weigher<E>, kWeighQueries> kWeighers = {
    &WeighValues<1, E>, &WeighValues<2, E>, &WeighValues<3, E>, &WeighValues<4, E>};
// Keys weighed for every query before the next ones: their values (16 KiB at head_dim 64) are
// read from memory once and from L1 by the other queries, where a verification's 5-8 rows
// would read a decoder's cross-attention values (Whisper's 1500) once per kWeighQueries.
constexpr int kWeighKeys = 64;

// out[c] = sum over keys t of p[c][t] * v[t] / sums[c] for n_queries queries.
template <class E>
void Weigh(const float* p, int64_t p_stride, const float* sums, int n_queries, int n_keys,
           const E* v, int64_t v_stride, int head_dim, float* out) {
    for (int t0 = 0; t0 < n_keys; t0 += kWeighKeys) {
        const int t1 = std::min(n_keys, t0 + kWeighKeys);
        for (int t = t1; t < std::min(n_keys, t1 + kWeighKeys); ++t)
            PrefetchBytes(v + t * v_stride, size_t(head_dim) * sizeof(E));
        for (int c0 = 0; c0 < n_queries; c0 += kWeighQueries) {
            const int queries = std::min(kWeighQueries, n_queries - c0);
            kWeighers<E>[size_t(queries - 1)](p + c0 * p_stride, p_stride, t0, t1, v, v_stride,
                                              head_dim, out + c0 * head_dim);
        }
    }
    const DF d;
    for (int c = 0; c < n_queries; ++c) {
        float* o = out + c * head_dim;
        int64_t j = 0;
        for (; j + kLanes <= head_dim; j += kLanes)
            hn::StoreU(hn::Div(hn::LoadU(d, o + j), hn::Set(d, sums[c])), d, o + j);
        for (; j < head_dim; ++j)
            o[j] /= sums[c];
    }
}

// s[t] = exp(scale * s[t] - max) over a query's scores; returns their sum: vectors of keys, the
// last one padded (its padding not summed), the lanes' sums added in a fixed tree. The same
// floats for a query whatever the other queries are.
// x capped smoothly at ±cap as llama.cpp caps it: x / cap, tanh, times cap.
HWY_INLINE VF Capped(DF d, VF x, float cap) {
    return hn::Mul(hn::Tanh(d, hn::Mul(x, hn::Set(d, 1.0f / cap))), hn::Set(d, cap));
}

void SoftCap(float* x, int64_t n, float cap) {
    MapPairs(x, x, x, n, [cap](DF d, VF a, VF) { return Capped(d, a, cap); });
}

float SoftmaxNumerators(float* s, int n_keys, float scale, float soft_cap) {
    const DF d;
    const VF vscale = hn::Set(d, scale);
    // The score of a product: scaled, then capped where the attention has a soft cap.
    const auto score = [&](VF x) {
        x = hn::Mul(x, vscale);
        return soft_cap > 0.0f ? Capped(d, x, soft_cap) : x;
    };
    const int whole = n_keys - n_keys % int(kLanes);
    VF vmax = hn::Set(d, -INFINITY);
    for (int t = 0; t < whole; t += int(kLanes)) {
        const VF x = score(hn::LoadU(d, s + t));
        hn::StoreU(x, d, s + t);
        vmax = hn::Max(vmax, x);
    }
    float max = hn::GetLane(hn::MaxOfLanes(d, vmax));
    if (whole < n_keys) {  // the tail through one padded vector, as every other score
        HWY_ALIGN float tail[kLanes] = {};
        std::copy(s + whole, s + n_keys, tail);
        hn::Store(score(hn::Load(d, tail)), d, tail);
        std::copy(tail, tail + (n_keys - whole), s + whole);
        for (int t = whole; t < n_keys; ++t)
            max = std::max(max, s[t]);
    }
    const VF vm = hn::Set(d, max);
    VF sum = hn::Zero(d);
    for (int t = 0; t < whole; t += int(kLanes)) {
        const VF e = hn::Exp(d, hn::Sub(hn::LoadU(d, s + t), vm));
        hn::StoreU(e, d, s + t);
        sum = hn::Add(sum, e);
    }
    if (whole < n_keys) {
        HWY_ALIGN float tail[kLanes] = {};
        std::copy(s + whole, s + n_keys, tail);
        const VF e = hn::IfThenElseZero(hn::FirstN(d, size_t(n_keys - whole)),
                                        hn::Exp(d, hn::Sub(hn::Load(d, tail), vm)));
        hn::Store(e, d, tail);
        std::copy(tail, tail + (n_keys - whole), s + whole);
        sum = hn::Add(sum, e);
    }
    return hn::GetLane(hn::SumOfLanes(d, sum));
}

void Attend(const float* q, int n_queries, const float* k, int64_t k_stride, const float* v,
            int64_t v_stride, int n_keys, int head_dim, float scale, float soft_cap, float* scores,
            float* out) {
    // Scores in tiles of keys x queries: every score is the same dot product whatever the
    // tile (Tile's promise), so a query's result does not depend on the others.
    for (int c0 = 0; c0 < n_queries; c0 += kTileCols) {
        const int queries = std::min(kTileCols, n_queries - c0);
        for (int t0 = 0; t0 < n_keys; t0 += kTileRows) {
            const int keys = std::min(kTileRows, n_keys - t0);
            kF32Tiles[size_t(keys - 1)][size_t(queries - 1)](
                {reinterpret_cast<const uint8_t*>(k + t0 * k_stride), size_t(k_stride) * 4},
                q + c0 * head_dim, head_dim, scores + c0 * n_keys + t0, n_keys, false);
        }
    }
    thread_local std::vector<float> sums;
    sums.resize(size_t(n_queries));
    for (int c = 0; c < n_queries; ++c)
        sums[size_t(c)] = SoftmaxNumerators(scores + c * n_keys, n_keys, scale, soft_cap);
    Weigh(scores, n_keys, sums.data(), n_queries, n_keys, v, v_stride, head_dim, out);
}

// The scores of Q queries over one block of kKeyBlock transposed keys: key j's score is one
// lane's sums over the head's dimensions, dimension i into chain i % kScoreChains (short
// chains: targets without FMA round each product), the chains added by a fixed tree. The same
// floats in any block of queries.
constexpr int kScoreChains = 8;
constexpr int kScoreVecs = int(kKeyBlock / kLanes);
// As many queries at once as keep the accumulators within half the register file.
constexpr int kScoreQueries =
    std::max(1, (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_ARCH_ARM ? 32 : 16) /
                    (2 * kScoreChains * kScoreVecs));
template <int Q, class E>
void ScoresOfABlock(const float* q, int head_dim, const E* kt, float* scores,
                    int64_t scores_stride) {
    const DF d;
    VF acc[Q][kScoreChains][kScoreVecs];
    for (int c = 0; c < Q; ++c)
        for (int k = 0; k < kScoreChains; ++k)
            for (int j = 0; j < kScoreVecs; ++j)
                acc[c][k][j] = hn::Zero(d);
    // Dimension i into chain i % kScoreChains, the chain a constant of the unrolled loop (as an
    // index computed at run time the accumulators would live in memory).
    const auto step = [&](int i, int k) {
        for (int j = 0; j < kScoreVecs; ++j) {
            const VF keys = LoadAsFloats(d, kt + i * kKeyBlock + j * kLanes);
            for (int c = 0; c < Q; ++c)
                acc[c][k][j] = hn::MulAdd(hn::Set(d, q[c * head_dim + i]), keys, acc[c][k][j]);
        }
    };
    int i = 0;
    for (; i + kScoreChains <= head_dim; i += kScoreChains)
        for (int k = 0; k < kScoreChains; ++k)
            step(i + k, k);
    for (int k = 0; k < kScoreChains; ++k)  // the heads whose width is no multiple of 8
        if (i + k < head_dim) step(i + k, k);
    for (int c = 0; c < Q; ++c) {
        for (int j = 0; j < kScoreVecs; ++j) {
            for (int stride = kScoreChains / 2; stride > 0; stride /= 2)
                for (int k = 0; k < stride; ++k)
                    acc[c][k][j] = hn::Add(acc[c][k][j], acc[c][k + stride][j]);
            hn::StoreU(acc[c][0][j], d, scores + c * scores_stride + j * kLanes);
        }
    }
}

template <class E, int... Qs>
constexpr auto ScoresTable(std::integer_sequence<int, Qs...>) {
    return std::array<void (*)(const float*, int, const E*, float*, int64_t), sizeof...(Qs)>{
        &ScoresOfABlock<Qs + 1, E>...};
}
template <class E>
constexpr auto kScoresOfABlock = ScoresTable<E>(std::make_integer_sequence<int, kScoreQueries>());

// ScoresOfABlock's scores of Q queries over kWideScoreBlocks blocks, a chain at a time: chain
// k's multiply-adds (dimensions k, k + kScoreChains, ... in order) for the whole tile, kept in
// `chains`, then ScoresOfABlock's tree over the chains. The same floats, with each key vector
// loaded once for Q queries rather than for kScoreQueries: a prompt's or an encoder's many
// queries are bound by arithmetic, not loads.
constexpr int kWideScoreQueries = 4;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_ARCH_ARM
constexpr int kWideScoreVecs = 4;
#else
constexpr int kWideScoreVecs = 2;
#endif
constexpr int kWideScoreBlocks = std::max(1, kWideScoreVecs / kScoreVecs);
template <int Q, class E>
void ScoresOfBlocks(const float* q, int head_dim, const E* kt, size_t block_floats, float* scores,
                    int64_t scores_stride) {
    constexpr int kVecs = kWideScoreBlocks * kScoreVecs;
    const DF d;
    HWY_ALIGN float chains[kScoreChains][Q][kVecs][kLanes];
    for (int k = 0; k < kScoreChains; ++k) {
        VF acc[Q][kVecs];
        for (int c = 0; c < Q; ++c)
            for (int u = 0; u < kVecs; ++u)
                acc[c][u] = hn::Zero(d);
        for (int i = k; i < head_dim; i += kScoreChains) {
            VF keys[kVecs];
            for (int u = 0; u < kVecs; ++u)
                keys[u] = LoadAsFloats(d, kt + size_t(u / kScoreVecs) * block_floats +
                                              size_t(i) * kKeyBlock + (u % kScoreVecs) * kLanes);
            AddOuterProduct<Q, kVecs>(q + i, head_dim, keys, acc);
        }
        for (int c = 0; c < Q; ++c)
            for (int u = 0; u < kVecs; ++u)
                hn::Store(acc[c][u], d, chains[k][c][u]);
    }
    for (int c = 0; c < Q; ++c) {
        for (int u = 0; u < kVecs; ++u) {
            VF sum[kScoreChains];
            for (int k = 0; k < kScoreChains; ++k)
                sum[k] = hn::Load(d, chains[k][c][u]);
            for (int stride = kScoreChains / 2; stride > 0; stride /= 2)
                for (int k = 0; k < stride; ++k)
                    sum[k] = hn::Add(sum[k], sum[k + stride]);
            hn::StoreU(sum[0], d, scores + c * scores_stride + u * kLanes);
        }
    }
}

template <class E>
void AttendTransposedOf(const float* q, int n_queries, const int* first, const int* keys,
                        const E* kt, const E* v, int64_t v_stride, int head_dim, float scale,
                        float soft_cap, float* scores, float* out) {
    // Blocks from the first that any query sees (a sliding window skips those before it).
    const int b0 = *std::min_element(first, first + n_queries) / int(kKeyBlock);
    const int key0 = b0 * int(kKeyBlock);
    const int n_keys = *std::max_element(keys, keys + n_queries);
    const int blocks = (n_keys + int(kKeyBlock) - 1) / int(kKeyBlock) - b0;
    const int64_t stride = int64_t(blocks) * kKeyBlock;  // a query's scores, whole blocks
    kt += int64_t(b0) * head_dim * kKeyBlock;
    // A block of keys (4 KiB at head_dim 64) is read from memory once and from L1 by the other
    // queries: with the queries outside, a verification's 5-8 rows read a decoder's
    // cross-attention keys (Whisper's 1500) from memory once per kScoreQueries.
    const size_t block_floats = size_t(head_dim) * kKeyBlock;
    // Many queries: tiles of kWideScoreQueries queries by kWideScoreBlocks blocks.
    int wide_queries = 0, b = 0;
    if (n_queries >= kWideScoreQueries) {
        wide_queries = n_queries - n_queries % kWideScoreQueries;
        for (; b + kWideScoreBlocks <= blocks; b += kWideScoreBlocks) {
            if (b + kWideScoreBlocks < blocks)
                PrefetchBytes(kt + size_t(b + kWideScoreBlocks) * block_floats,
                              kWideScoreBlocks * block_floats * sizeof(E));
            for (int c0 = 0; c0 < wide_queries; c0 += kWideScoreQueries)
                ScoresOfBlocks<kWideScoreQueries, E>(q + c0 * head_dim, head_dim,
                                                     kt + size_t(b) * block_floats, block_floats,
                                                     scores + c0 * stride + b * kKeyBlock, stride);
        }
    }
    // The rest: the queries after the wide tiles' over their blocks, every query over the
    // blocks after them.
    for (int b1 = 0; b1 < blocks; ++b1) {
        const int first_query = b1 < b ? wide_queries : 0;
        if (first_query == n_queries) continue;
        if (b1 >= b && b1 + kKeyBlocksAhead < blocks)
            PrefetchBytes(kt + size_t(b1 + kKeyBlocksAhead) * block_floats,
                          block_floats * sizeof(E));
        for (int c0 = first_query; c0 < n_queries; c0 += kScoreQueries) {
            const int queries = std::min(kScoreQueries, n_queries - c0);
            kScoresOfABlock<E>[size_t(queries - 1)](q + c0 * head_dim, head_dim,
                                                    kt + size_t(b1) * block_floats,
                                                    scores + c0 * stride + b1 * kKeyBlock, stride);
        }
    }
    // A query that sees fewer keys than the most weighs the rest by 0: each output element's
    // chain adds +0 * v to a partial sum that is never -0, which leaves it as it is: the same
    // floats as its own keys alone.
    thread_local std::vector<float> sums;
    sums.resize(size_t(n_queries));
    for (int c = 0; c < n_queries; ++c) {
        float* p = scores + c * stride;
        const int from = first[c] - key0, to = keys[c] - key0;
        sums[size_t(c)] = SoftmaxNumerators(p + from, to - from, scale, soft_cap);
        std::fill(p, p + from, 0.0f);
        std::fill(p + to, p + (n_keys - key0), 0.0f);
    }
    Weigh(scores, stride, sums.data(), n_queries, n_keys - key0, v + int64_t(key0) * v_stride,
          v_stride, head_dim, out);
}

void AttendTransposed(const float* q, int n_queries, const int* first, const int* keys,
                      const float* kt, const float* v, int64_t v_stride, int head_dim, float scale,
                      float soft_cap, float* scores, float* out) {
    AttendTransposedOf(q, n_queries, first, keys, kt, v, v_stride, head_dim, scale, soft_cap,
                       scores, out);
}
void AttendTransposedHalves(const float* q, int n_queries, const int* first, const int* keys,
                            const uint16_t* kt, const uint16_t* v, int64_t v_stride, int head_dim,
                            float scale, float soft_cap, float* scores, float* out) {
    AttendTransposedOf(q, n_queries, first, keys, kt, v, v_stride, head_dim, scale, soft_cap,
                       scores, out);
}

// Floats exact in F16 as halves: the conversion of any target is exact on them (Highway's
// without F16C truncates, which leaves an exact value as it is).
void FloatsToHalves(const float* x, int64_t n, uint16_t* out) {
    const DF d;
    const hn::Rebind<hwy::float16_t, DF> dh;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        hn::StoreU(hn::DemoteTo(dh, hn::LoadU(d, x + i)), dh,
                   reinterpret_cast<hwy::float16_t*>(out + i));
    // The tail through a vector too: a loop of scalar stores here is the one GCC's aarch64
    // loop analysis rejects (-Waggressive-loop-optimizations).
    if (i < n) {
        float tail[kLanes] = {};
        std::copy(x + i, x + n, tail);
        hwy::float16_t halves[kLanes];
        hn::StoreU(hn::DemoteTo(dh, hn::LoadU(d, tail)), dh, halves);
        std::memcpy(out + i, halves, size_t(n - i) * sizeof(uint16_t));
    }
}

// x[i] = the half nearest x[i] (ties to even; from 65520 on, infinity), as a float: the bits
// of a normal half's range rounded in place, those below it as multiples of 2^-24.
void RoundToHalf(float* x, int64_t n) {
    const DF d;
    const DI di;
    const auto bits = [&](int32_t b) { return hn::Set(di, b); };
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        const VF v = hn::LoadU(d, x + i);
        const VI u = hn::BitCast(di, v);
        const VI abs = hn::And(u, bits(0x7fffffff));
        const VI sign = hn::AndNot(bits(0x7fffffff), u);
        const VI odd = hn::And(hn::ShiftRight<13>(u), bits(1));
        const VI normal =
            hn::And(hn::Add(hn::Add(u, bits(0xfff)), odd), bits(int32_t(0xffffe000u)));
        const VF subnormal =
            hn::Mul(hn::Round(hn::Mul(v, hn::Set(d, 16777216.0f))), hn::Set(d, 1.0f / 16777216.0f));
        // (the sign again: SSSE3's Round loses it where the product rounds to zero)
        VI r = hn::IfThenElse(hn::Lt(abs, bits(0x38800000)),
                              hn::Or(hn::BitCast(di, subnormal), sign), normal);
        r = hn::IfThenElse(hn::Lt(abs, bits(0x477ff000)), r, hn::Or(sign, bits(0x7f800000)));
        r = hn::IfThenElse(hn::Gt(abs, bits(0x7f800000)), hn::Or(sign, bits(0x7fc00000)), r);
        hn::StoreU(hn::BitCast(d, r), d, x + i);
    }
    for (; i < n; ++i)
        x[i] = half_to_float(float_to_half(x[i]));
}

const char* TargetName() {
    return hwy::TargetName(HWY_TARGET);
}

}  // namespace HWY_NAMESPACE
}  // namespace specula::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/fp16.h"

namespace specula::cpu {

HWY_EXPORT(MatmulRows);
HWY_EXPORT(DecodeRow);
HWY_EXPORT(DotF32);
HWY_EXPORT(Attend);
HWY_EXPORT(AttendTransposed);
HWY_EXPORT(AttendTransposedHalves);
HWY_EXPORT(FloatsToHalves);
HWY_EXPORT(RoundToHalf);
HWY_EXPORT(GatedTimes);
HWY_EXPORT(Activate);
HWY_EXPORT(SoftCap);
HWY_EXPORT(TargetName);
HWY_EXPORT(PackRows);
HWY_EXPORT(QuantizeInputs);

bool prefetches_every_product() {
#if defined(__x86_64__) || defined(__i386__)
    static const bool amd = __builtin_cpu_is("amd");
    return !amd;
#else
    return false;
#endif
}

bool amx_available() {
#if defined(__x86_64__) && defined(__linux__)
    static const bool available = [] {
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
        constexpr unsigned kAmxTile = 1u << 24, kAmxInt8 = 1u << 25;  // CPUID.(7, 0):EDX
        if ((edx & kAmxTile) == 0 || (edx & kAmxInt8) == 0) return false;
        // The tiles' state is off until the process asks for it (Linux 5.16 on).
        constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
        constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
        return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
    }();
    return available;
#else
    return false;
#endif
}

bool has_integer_kernel(GgmlType type) {
    return is_runnable_weight_type(type) && type != GgmlType::kF32 && type != GgmlType::kF16;
}
size_t packed_bytes(GgmlType type, int64_t rows, int64_t cols) {
    const size_t groups = size_t((rows + kGroupRows - 1) / kGroupRows);
    return groups * size_t(cols / 32 / packed_unit_blocks(type)) * packed_unit_bytes(type);
}
void pack_rows(GgmlType type, const uint8_t* src, size_t row_bytes, int64_t rows, int64_t cols,
               int64_t group_begin, int64_t group_end, uint8_t* dst) {
    HWY_DYNAMIC_DISPATCH(PackRows)(type, src, row_bytes, rows, cols, group_begin, group_end, dst);
}
void QuantizedInputArrays::resize(int64_t n, int64_t cols) {
    const size_t blocks = size_t(n * cols / 32);
    q_.resize(blocks * 32);
    for (auto* v : {&d_, &dsum_, &dsum_lo_, &dsum_hi_})
        v->resize(blocks);
    sum_.resize(blocks);
    view_ = {q_.data(),    d_.data(),       sum_.data(),    cols,
             dsum_.data(), dsum_lo_.data(), dsum_hi_.data()};
}
void QuantizedInputArrays::quantize(const float* x, int64_t b0, int64_t b1) {
    const size_t b = size_t(b0);
    HWY_DYNAMIC_DISPATCH(QuantizeInputs)
    (x + b * 32, b1 - b0,
     {q_.data() + b * 32, d_.data() + b, sum_.data() + b, dsum_.data() + b, dsum_lo_.data() + b,
      dsum_hi_.data() + b});
}

void matmul_rows(const MatmulArgs& args, int64_t row_begin, int64_t row_end) {
    HWY_DYNAMIC_DISPATCH(MatmulRows)(args, row_begin, row_end);
}
void decode_row(GgmlType type, const uint8_t* src, int64_t cols, float* dst) {
    HWY_DYNAMIC_DISPATCH(DecodeRow)(type, src, cols, dst);
}
float dot_f32(const float* a, const float* b, int64_t n) {
    return HWY_DYNAMIC_DISPATCH(DotF32)(a, b, n);
}
void attend(const float* q, int n_queries, const float* k, int64_t k_stride, const float* v,
            int64_t v_stride, int n_keys, int head_dim, float scale, float soft_cap, float* scores,
            float* out) {
    HWY_DYNAMIC_DISPATCH(Attend)
    (q, n_queries, k, k_stride, v, v_stride, n_keys, head_dim, scale, soft_cap, scores, out);
}
void gated_times(uint32_t act, const float* gate, const float* up, float* out, int64_t n) {
    HWY_DYNAMIC_DISPATCH(GatedTimes)(act, gate, up, out, n);
}
void activate(uint32_t act, const float* x, float* out, int64_t n) {
    HWY_DYNAMIC_DISPATCH(Activate)(act, x, out, n);
}
void soft_cap(float* x, int64_t n, float cap) {
    HWY_DYNAMIC_DISPATCH(SoftCap)(x, n, cap);
}
void attend_transposed(const float* q, int n_queries, const int* first, const int* keys,
                       const float* kt, const float* v, int64_t v_stride, int head_dim, float scale,
                       float soft_cap, float* scores, float* out) {
    HWY_DYNAMIC_DISPATCH(AttendTransposed)
    (q, n_queries, first, keys, kt, v, v_stride, head_dim, scale, soft_cap, scores, out);
}

void attend_transposed(const float* q, int n_queries, const int* first, const int* keys,
                       const uint16_t* kt, const uint16_t* v, int64_t v_stride, int head_dim,
                       float scale, float soft_cap, float* scores, float* out) {
    HWY_DYNAMIC_DISPATCH(AttendTransposedHalves)
    (q, n_queries, first, keys, kt, v, v_stride, head_dim, scale, soft_cap, scores, out);
}
void round_to_half(float* x, int64_t n) {
    HWY_DYNAMIC_DISPATCH(RoundToHalf)(x, n);
}

namespace {
// n floats from `row` to `out`, as they are or as halves.
void store_row(const float* row, int64_t n, float* out) {
    std::memcpy(out, row, size_t(n) * sizeof(float));
}
void store_row(const float* row, int64_t n, uint16_t* out) {
    HWY_DYNAMIC_DISPATCH(FloatsToHalves)(row, n, out);
}

template <class E>
void transpose_keys_as(const float* k, int64_t k_stride, int n_head_kv, int head_dim,
                       int64_t capacity, int64_t begin, int64_t end, E* kt) {
    const int64_t head_floats = transposed_key_blocks(capacity) * head_dim * kKeyBlock;
    for (int h = 0; h < n_head_kv; ++h) {
        E* head = kt + h * head_floats;
        for (int64_t t = begin; t < end;) {
            const int64_t first = t % kKeyBlock, n = std::min(end - t, kKeyBlock - first);
            const float* keys = k + t * k_stride + int64_t(h) * head_dim;
            E* block = head + (t / kKeyBlock) * head_dim * kKeyBlock;
            if (n == kKeyBlock) {
                // A whole block: each dimension's 16 keys gathered into a row written at once.
                // Written a float at a time, 64 bytes apart, a large-v2 window's
                // cross-attention keys took 0.44 s on 2 vCPUs (0.1 s so).
                for (int i = 0; i < head_dim; ++i) {
                    alignas(64) float row[kKeyBlock];
                    for (int64_t j = 0; j < kKeyBlock; ++j)
                        row[j] = keys[j * k_stride + i];
                    store_row(row, kKeyBlock, block + i * kKeyBlock);
                }
            } else {
                for (int64_t j = 0; j < n; ++j)
                    for (int i = 0; i < head_dim; ++i)
                        store_row(&keys[j * k_stride + i], 1, &block[i * kKeyBlock + first + j]);
            }
            t += n;
        }
    }
}
}  // namespace

void transpose_keys(const float* k, int64_t k_stride, int n_head_kv, int head_dim, int64_t capacity,
                    int64_t begin, int64_t end, float* kt) {
    transpose_keys_as(k, k_stride, n_head_kv, head_dim, capacity, begin, end, kt);
}
void transpose_keys(const float* k, int64_t k_stride, int n_head_kv, int head_dim, int64_t capacity,
                    int64_t begin, int64_t end, uint16_t* kt) {
    transpose_keys_as(k, k_stride, n_head_kv, head_dim, capacity, begin, end, kt);
}
void values_to_halves(const float* v, int64_t v_stride, int n_head_kv, int head_dim,
                      int64_t capacity, int64_t begin, int64_t end, uint16_t* vh) {
    for (int h = 0; h < n_head_kv; ++h)
        for (int64_t t = begin; t < end; ++t)
            store_row(v + t * v_stride + int64_t(h) * head_dim, head_dim,
                      vh + (int64_t(h) * capacity + t) * head_dim);
}

const char* simd_target() {
    return HWY_DYNAMIC_DISPATCH(TargetName)();
}

SimdChoice use_simd_target(std::string_view name) {
    hwy::SetSupportedTargetsForTest(0);  // what the CPU has, not an earlier choice
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
        if (name != hwy::TargetName(target)) continue;
        hwy::SetSupportedTargetsForTest(target);
        hwy::GetChosenTarget().Update(hwy::SupportedTargets());
        return SimdChoice::kChosen;
    }
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    for (int bit = 0; bit < 63; ++bit) {
        const std::string_view known = hwy::TargetName(int64_t(1) << bit);
        if (name == known && known != "Unknown") return SimdChoice::kNotRunnableHere;
    }
    return SimdChoice::kUnknown;
}

std::string runnable_simd_targets() {
    std::string names;
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
        if (!names.empty()) names += ' ';
        names += hwy::TargetName(target);
    }
    return names;
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
