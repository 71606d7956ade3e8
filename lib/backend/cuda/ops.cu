// The forward-pass kernels. Every row is reduced in one fixed order whatever
// the batch size (see matmul_kernel), so results are batch invariant like the
// other backends'.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>

#include "block_reduce.cuh"
#include "core/device_abi.h"
#include "format/quant.h"
#include "kernels.h"

namespace specula::cuda {

namespace {

__device__ float half_at(const uint8_t* p) {
    return __half2float(*reinterpret_cast<const __half*>(p));
}

// The bytes of one block of 32 weights, or of one super-block of 256 for the K-quants
// (core/device_abi.h).
template <GgmlType T>
constexpr int64_t kBlockBytes = T == GgmlType::kF32    ? shared::kF32BlockBytes
                                : T == GgmlType::kF16  ? shared::kF16BlockBytes
                                : T == GgmlType::kQ8_0 ? shared::kQ8_0BlockBytes
                                : T == GgmlType::kQ4_0 ? shared::kQ4_0BlockBytes
                                : T == GgmlType::kQ4_1 ? shared::kQ4_1BlockBytes
                                : T == GgmlType::kQ5_0 ? shared::kQ5_0BlockBytes
                                : T == GgmlType::kQ5_1 ? shared::kQ5_1BlockBytes
                                : T == GgmlType::kQ4_K ? shared::kQ4_KBlockBytes
                                : T == GgmlType::kQ5_K ? shared::kQ5_KBlockBytes
                                                       : shared::kQ6_KBlockBytes;
template <GgmlType T>
constexpr bool kSuperBlocks = T == GgmlType::kQ4_K || T == GgmlType::kQ5_K || T == GgmlType::kQ6_K;
template <GgmlType T>
constexpr int64_t kBlockWeightsOf =
    kSuperBlocks<T> ? shared::kSuperBlockWeights : shared::kBlockWeights;
constexpr int64_t kBlock = shared::kBlockWeights, kScale = shared::kBlockScaleBytes;

template <GgmlType T>
__host__ __device__ constexpr int64_t row_bytes(int64_t cols) {
    return cols / kBlockWeightsOf<T> * kBlockBytes<T>;
}

// The first byte of block `block` (of 32 weights): for the K-quants, of its super-block.
template <GgmlType T>
__device__ const uint8_t* block_at(const uint8_t* row, int64_t block) {
    return kSuperBlocks<T> ? row + block / 8 * kBlockBytes<T> : row + block * kBlockBytes<T>;
}

// Every block size is even and every quant run starts at an even offset: 16-bit loads.
__device__ uint32_t word_at(const uint8_t* p) {
    const auto* h = reinterpret_cast<const uint16_t*>(p);
    return uint32_t(h[0]) | uint32_t(h[1]) << 16;
}

// Eight 4-bit values from the eight bytes at p, at bit `shift` (0 or 4) of each.
__device__ void nibbles8(const uint8_t* p, int shift, uint32_t v[8]) {
    for (int i = 0; i < 2; ++i) {
        const uint32_t word = word_at(p + 4 * i);
        for (int k = 0; k < 4; ++k)
            v[4 * i + k] = (word >> (8 * k + shift)) & 0xFu;
    }
}

// Types whose matmul can multiply 8-bit inputs (QuantizedInputs) by integer dot products: their
// quarter block is eight small integers times one scale.
template <GgmlType T>
constexpr bool kIntInputs = T == GgmlType::kQ8_0 || T == GgmlType::kQ4_0;

// Quarter q of block `block` as eight signed bytes (two words, weight 8 q + j in byte j % 4 of
// word j / 4) and the block's scale: the weights are *d times the bytes.
template <GgmlType T>
__device__ void int_quarter(const uint8_t* row, int64_t block, int q, int32_t v[2], float* d) {
    static_assert(kIntInputs<T>, "no integer reader for this weight type");
    const uint8_t* b = row + block * kBlockBytes<T>;
    *d = half_at(b);
    if constexpr (T == GgmlType::kQ8_0) {
        v[0] = int32_t(word_at(b + kScale + q * 8));
        v[1] = int32_t(word_at(b + kScale + q * 8 + 4));
    } else {
        // Low nibbles for weights 0..15, high ones for 16..31, each minus 8.
        const int shift = q < 2 ? 0 : 4;
        for (int i = 0; i < 2; ++i) {
            const uint32_t nibbles =
                (word_at(b + kScale + (q % 2) * 8 + 4 * i) >> shift) & 0x0F0F0F0Fu;
            v[i] = int32_t(__vsub4(nibbles, 0x08080808u));
        }
    }
}

// Eight consecutive weights of a row: quarter q (0..3) of 32-weight block `block`, decoded
// as format/quant.h's dequantize_row() defines them (products and sums rounded apart).
template <GgmlType T>
__device__ void load_quarter(const uint8_t* row, int64_t block, int q, float w[8]);

template <>
__device__ void load_quarter<GgmlType::kF32>(const uint8_t* row, int64_t block, int q, float w[8]) {
    const float* p =
        reinterpret_cast<const float*>(row + block * kBlockBytes<GgmlType::kF32>) + q * 8;
    for (int j = 0; j < 8; ++j)
        w[j] = p[j];
}
template <>
__device__ void load_quarter<GgmlType::kF16>(const uint8_t* row, int64_t block, int q, float w[8]) {
    const auto* p =
        reinterpret_cast<const __half2*>(row + block * kBlockBytes<GgmlType::kF16> + q * 16);
    for (int j = 0; j < 4; ++j) {
        const float2 f = __half22float2(p[j]);
        w[2 * j] = f.x;
        w[2 * j + 1] = f.y;
    }
}
template <>
__device__ void load_quarter<GgmlType::kQ4_1>(const uint8_t* row, int64_t block, int q,
                                              float w[8]) {
    const uint8_t* b = block_at<GgmlType::kQ4_1>(row, block);
    const float d = half_at(b), m = half_at(b + 2);
    uint32_t v[8];
    nibbles8(b + 4 + (q % 2) * 8, q < 2 ? 0 : 4, v);
    for (int j = 0; j < 8; ++j)
        w[j] = __fadd_rn(__fmul_rn(float(v[j]), d), m);
}
// Element i: the nibble of byte i % 16 (low for i < 16), and bit i of the 32-bit mask.
template <GgmlType T>
__device__ void load_quarter_q5(const uint8_t* row, int64_t block, int q, float w[8]) {
    constexpr bool kMin = T == GgmlType::kQ5_1;
    const uint8_t* b = block_at<T>(row, block);
    const float d = half_at(b), m = kMin ? half_at(b + 2) : 0.0f, offset = kMin ? 0.0f : 16.0f;
    const uint8_t* mask_at = b + (kMin ? 4 : 2);
    const uint32_t mask = word_at(mask_at);
    uint32_t v[8];
    nibbles8(mask_at + 4 + (q % 2) * 8, q < 2 ? 0 : 4, v);
    for (int j = 0; j < 8; ++j) {
        const float x = float(v[j] | ((mask >> (8 * q + j)) & 1u) << 4) - offset;
        w[j] = kMin ? __fadd_rn(__fmul_rn(x, d), m) : x * d;
    }
}
// Elements 8 q .. 8 q + 7 of block s = block % 8 of the super-block: 4-bit quants (and for
// Q5_K a fifth bit from the 32 high bytes) with a 6-bit scale and min per block.
template <GgmlType T>
__device__ void load_quarter_k(const uint8_t* row, int64_t block, int q, float w[8]) {
    constexpr bool kFifthBit = T == GgmlType::kQ5_K;
    const uint8_t* b = block_at<T>(row, block);
    const int s = int(block % 8);
    uint8_t scale = 0, min = 0;
    k_scale_min(s, b + 4, &scale, &min);
    const float d1 = __fmul_rn(half_at(b), float(scale)),
                m1 = __fmul_rn(half_at(b + 2), float(min));
    const uint8_t* high = b + 4 + shared::kKScaleBytes;
    const uint8_t* quants = kFifthBit ? high + 32 : high;
    uint32_t v[8];
    nibbles8(quants + 32 * (s / 2) + 8 * q, 4 * (s % 2), v);
    if (kFifthBit) {
        for (int i = 0; i < 2; ++i) {
            const uint32_t bits = word_at(high + 8 * q + 4 * i);
            for (int k = 0; k < 4; ++k)
                v[4 * i + k] |= ((bits >> (8 * k + s)) & 1u) << 4;
        }
    }
    for (int j = 0; j < 8; ++j)
        w[j] = __fsub_rn(__fmul_rn(d1, float(v[j])), m1);
}
// The types that share a reader with another.
template <GgmlType T>
__device__ void load_quarter(const uint8_t* row, int64_t block, int q, float w[8]) {
    static_assert(kIntInputs<T> || T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1 ||
                      T == GgmlType::kQ4_K || T == GgmlType::kQ5_K,
                  "no reader for this weight type");
    if constexpr (kIntInputs<T>) {
        // Q8_0 and Q4_0: the integers the 8-bit-input products read, times the scale.
        int32_t v[2];
        float d = 0.0f;
        int_quarter<T>(row, block, q, v, &d);
        for (int j = 0; j < 8; ++j)
            w[j] = d * float(int8_t(uint32_t(v[j / 4]) >> (8 * (j % 4))));
    } else if constexpr (T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1)
        load_quarter_q5<T>(row, block, q, w);
    else
        load_quarter_k<T>(row, block, q, w);
}
template <>
__device__ void load_quarter<GgmlType::kQ6_K>(const uint8_t* row, int64_t block, int q,
                                              float w[8]) {
    // Block block % 8 is part p of half h: low nibbles at 64 h + 32 (p % 2), top bits 2 p of
    // the high bytes at 128 + 32 h, a scale per 16 elements at 192 + 8 h + 2 p (format/quant.h).
    const uint8_t* b = block_at<GgmlType::kQ6_K>(row, block);
    const int h = int(block % 8) / 4, p = int(block % 4);
    uint32_t v[8];
    nibbles8(b + 64 * h + 32 * (p % 2) + 8 * q, 4 * (p / 2), v);
    const float d = __fmul_rn(half_at(b + 208), float(int8_t(b[192 + 8 * h + 2 * p + q / 2])));
    for (int i = 0; i < 2; ++i) {
        const uint32_t bits = word_at(b + 128 + 32 * h + 8 * q + 4 * i);
        for (int k = 0; k < 4; ++k)
            w[4 * i + k] =
                d * float(int(v[4 * i + k] | ((bits >> (8 * k + 2 * p)) & 3u) << 4) - 32);
    }
}

// One row of the table per block, eight weights per thread and step.
template <GgmlType T>
__global__ void get_rows_kernel(const uint8_t* table, int64_t cols, const int32_t* ids,
                                float* out) {
    const int64_t i = blockIdx.x;
    const uint8_t* row = table + int64_t(ids[i]) * row_bytes<T>(cols);
    for (int64_t g = threadIdx.x; g < cols / 8; g += blockDim.x) {
        float w[8];
        load_quarter<T>(row, g / 4, int(g % 4), w);
        for (int j = 0; j < 8; ++j)
            out[i * cols + g * 8 + j] = w[j];
    }
}

// One rotation of rope(): the pair (a, b) by the angle of cosine c and sine s, each product
// and difference rounded on its own (never contracted), as the cpu and the shaders round it.
__device__ void rotate_pair(float a, float b, float c, float s, float* out0, float* out1) {
    *out0 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    *out1 = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

// act(g) for device_abi.h's activation `act`.
__device__ float activated(uint32_t act, float g) {
    if (act == shared::kActivationGeluTanh) {
        const float z = shared::kGeluTanhScale * fmaf(shared::kGeluTanhCubic * g, g * g, g);
        return g / (1.0f + expf(-2.0f * z));
    }
    if (act == shared::kActivationGeluErf)
        return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f));
    return g / (1.0f + expf(-g));
}

// act(g) * u: the feed-forward's gate.
__device__ float gated_times(uint32_t act, float g, float u) {
    return activated(act, g) * u;
}

// A block of kMatmulThreads threads computes R rows for N columns. Thread t takes quarter t % 4
// of blocks t / 4, t / 4 + 32, ... of each of its rows: a warp reads 8 consecutive weight
// blocks and 256 consecutive floats of x per step (coalesced), and each x value it loads serves
// all R rows. A row's sum is reduced in one fixed order (per thread in block order, a butterfly's
// pairs per warp, then the warps in order), which depends neither on n nor on R: batch invariant.
// With 8-bit inputs (Q8_0, Q4_0) a thread's quarter block times a column is an exact integer
// dot product, scaled once; the order is the same.
// Gated: the block also computes the same R rows of `up` and writes act(w x) * (up x), the
// sums as matmul's and the product as gated_mul's. With `positions` set, adjacent pairs of rows are
// rotated as rope() rotates them before they are written (R is even, so a pair is one block's).
constexpr int kMatmulThreads = 128;

struct MatmulEpilogue {
    const uint8_t* up = nullptr;         // gated: the up matrix, w's type and shape
    uint32_t activation = 0;             // gated: device_abi.h's kActivation*
    const int32_t* positions = nullptr;  // rope: one position per column
    const float* table = nullptr;
    int head_dim = 0, n_rot = 0;
};

// The end of a matmul block of R rows (twice R for a gated one: w's, then up's) and N columns,
// each row's sum over the block's warps in `partial`: the rows in pairs (a pair's rotation needs
// both), each row's warps summed in order, gated and rotated as the epilogue says, written or
// added to out.
template <int R, int N, bool Gated, int kWarps>
__device__ void write_rows(const float (&partial)[kWarps][Gated ? 2 * R : R][N], int t, int threads,
                           int64_t r0, int64_t rows, int n, float* __restrict__ out,
                           int64_t out_stride, bool accumulate, const MatmulEpilogue& e) {
    auto row_sum = [&](int r, int c) {
        float v = partial[0][r][c];
        for (int k = 1; k < kWarps; ++k)
            v += partial[k][r][c];
        return v;
    };
    for (int i = t; i < R / 2 * N; i += threads) {
        const int r = 2 * (i / N), c = i % N;
        if (c >= n) continue;
        float v[2];
        for (int k = 0; k < 2; ++k) {
            v[k] = row_sum(r + k, c);
            if (Gated) v[k] = gated_times(e.activation, v[k], row_sum(R + r + k, c));
        }
        if (e.positions != nullptr) {
            const int64_t d = (r0 + r) % e.head_dim;
            if (d < e.n_rot) {
                const float* cs = e.table + int64_t(e.positions[c]) * e.n_rot + d;
                rotate_pair(v[0], v[1], cs[0], cs[1], &v[0], &v[1]);
            }
        }
        for (int k = 0; k < 2; ++k) {
            if (r0 + r + k >= rows) continue;
            float& o = out[c * out_stride + r0 + r + k];
            o = accumulate ? o + v[k] : v[k];
        }
    }
}

// Staged: a warp's 8 blocks of a row (one super-block for the K-quants) are contiguous bytes
// that it reads in 16-byte loads into shared memory, one per lane, the next step's loads in
// flight while the current step is multiplied; each thread then decodes its quarter block
// from there. The direct reads are 2-byte loads, each touching every 32-byte sector of the
// warp's span. Same products in the same order either way. Types whose 8 blocks are a whole
// number of 16-byte vectors (not F32, F16, whose blocks are wide already, nor Q6_K's 210-byte
// super-blocks), rows of whole 256-weight groups.
template <GgmlType T>
constexpr bool kStageable =
    T == GgmlType::kQ8_0 || T == GgmlType::kQ4_0 || T == GgmlType::kQ4_1 || T == GgmlType::kQ5_0 ||
    T == GgmlType::kQ5_1 || T == GgmlType::kQ4_K || T == GgmlType::kQ5_K;
template <GgmlType T>
constexpr int kChunkBytes = int(kSuperBlocks<T> ? kBlockBytes<T> : 8 * kBlockBytes<T>);
template <GgmlType T>
constexpr int kChunkVectors = kStageable<T> ? kChunkBytes<T> / 16 : 1;
// Int: x is read as ix, its 8-bit quantization: each thread's quarter block of a row times a
// column is two integer dot products of four bytes, scaled once (as the cpu's integer kernels
// scale a block's exact sum; here a quarter's).
template <GgmlType T, int N, int R, bool Gated, bool Staged, bool Int>
__global__ void __launch_bounds__(kMatmulThreads)
    matmul_kernel(const uint8_t* __restrict__ w, int64_t in, int64_t rows,
                  const float* __restrict__ x, QuantizedInputs ix, int n, float* __restrict__ out,
                  int64_t out_stride, bool accumulate, MatmulEpilogue e) {
    constexpr int kWarps = kMatmulThreads / kWarp, kRows = Gated ? 2 * R : R;
    constexpr int kStageWarps = Staged ? kWarps : 1, kStageRows = Staged ? kRows : 1;
    static_assert(!Staged || (kChunkBytes<T> % 16 == 0 && kChunkVectors<T> <= kWarp),
                  "a staged chunk is at most one 16-byte vector per lane");
    __shared__ float partial[kWarps][kRows][N];
    __shared__ uint4 stage[kStageWarps][kStageRows][kChunkVectors<T>];
    const int64_t r0 = int64_t(blockIdx.x) * R, blocks = in / kBlock, stride = row_bytes<T>(in);
    const int t = threadIdx.x, q = t % 4, warp = t / kWarp, lane = t % kWarp;
    // Row k of the block: row r0 + k of w, or for a gated product's second half of up.
    auto row_of = [&](int k) {
        return Gated && k >= R ? e.up + (r0 + k - R) * stride : w + (r0 + k) * stride;
    };
    float acc[kRows][N];
    for (int r = 0; r < kRows; ++r)
        for (int c = 0; c < N; ++c)
            acc[r][c] = 0.0f;
    // multiply(b, row_at, block): acc[r][c] += the products of this thread's quarter of block b
    // of row r with column c, the quarter read as block `block` of row_at(r) (the row itself, or
    // the warp's staged chunk); rows past the matrix count as zeros. multiply_floats is the
    // float one: x's floats times the weights as dequantize_row() gives them.
    auto multiply_floats = [&](int64_t b, auto row_at, int64_t block) {
        float wq[kRows][8];
        for (int r = 0; r < kRows; ++r) {
            if (r0 + r % R < rows) {
                load_quarter<T>(row_at(r), block, q, wq[r]);
            } else {
                for (int j = 0; j < 8; ++j)
                    wq[r][j] = 0.0f;
            }
        }
        for (int c = 0; c < N; ++c) {
            if (c >= n) break;
            const auto* xp = reinterpret_cast<const float4*>(x + c * in + b * kBlock + q * 8);
            const float4 lo = xp[0], hi = xp[1];
            for (int r = 0; r < kRows; ++r) {
                float s = wq[r][0] * lo.x;
                s = fmaf(wq[r][1], lo.y, s);
                s = fmaf(wq[r][2], lo.z, s);
                s = fmaf(wq[r][3], lo.w, s);
                s = fmaf(wq[r][4], hi.x, s);
                s = fmaf(wq[r][5], hi.y, s);
                s = fmaf(wq[r][6], hi.z, s);
                s = fmaf(wq[r][7], hi.w, s);
                acc[r][c] += s;
            }
        }
    };
    auto multiply = [&](int64_t b, auto row_at, int64_t block) {
        if constexpr (Int) {
            int32_t wi[kRows][2];
            float dw[kRows];
            for (int r = 0; r < kRows; ++r) {
                if (r0 + r % R < rows) {
                    int_quarter<T>(row_at(r), block, q, wi[r], &dw[r]);
                } else {
                    wi[r][0] = wi[r][1] = 0;
                    dw[r] = 0.0f;
                }
            }
            for (int c = 0; c < N; ++c) {
                if (c >= n) break;
                const int2 xq = *reinterpret_cast<const int2*>(ix.q + c * in + b * kBlock + q * 8);
                const float dx = ix.d[c * blocks + b];
                for (int r = 0; r < kRows; ++r) {
                    const int s = __dp4a(wi[r][1], xq.y, __dp4a(wi[r][0], xq.x, 0));
                    acc[r][c] = fmaf(float(s), dw[r] * dx, acc[r][c]);
                }
            }
        } else {
            multiply_floats(b, row_at, block);
        }
    };
    if constexpr (Staged) {
        // The warp's chunk of a step starts at block b0 (a multiple of 8).
        uint4 next[kRows];
        auto fetch = [&](int64_t b0) {
            for (int r = 0; r < kRows; ++r)
                if (lane < kChunkVectors<T> && r0 + r % R < rows)
                    next[r] =
                        reinterpret_cast<const uint4*>(row_of(r) + b0 / 8 * kChunkBytes<T>)[lane];
        };
        const auto staged_row = [&](int r) {
            return reinterpret_cast<const uint8_t*>(stage[warp][r]);
        };
        int64_t b0 = 8 * warp;
        if (b0 < blocks) fetch(b0);
        for (; b0 < blocks; b0 += kMatmulThreads / 4) {
            for (int r = 0; r < kRows; ++r)
                if (lane < kChunkVectors<T>) stage[warp][r][lane] = next[r];
            __syncwarp();
            if (b0 + kMatmulThreads / 4 < blocks) fetch(b0 + kMatmulThreads / 4);
            multiply(b0 + lane / 4, staged_row, lane / 4);
            __syncwarp();  // the stage is rewritten next step
        }
    } else {
        // With few accumulators the step loop is unrolled so that the loads of two steps are in
        // flight together (with 8 x 16 accumulators the registers run out instead).
#pragma unroll(kRows* N <= 16 ? 2 : 1)
        for (int64_t b = t / 4; b < blocks; b += kMatmulThreads / 4)
            multiply(b, row_of, b);
    }
    // Each sum over the warp's lanes, as warp_sum would sum it, but all of them in kRows * N - 1
    // shuffles and a few more rather than 5 each: with 8 columns the butterflies had taken
    // longer than the products of a row of 2048 weights.
    {
        constexpr int K = kRows * N, held = kScatterHeld<K>, shift = kScatterShift<K>;
        warp_sum_scatter<K>(&acc[0][0]);
        if (lane % (1 << shift) == 0)
            for (int i = 0; i < held; ++i)
                (&partial[warp][0][0])[(lane >> shift) * held + i] = (&acc[0][0])[i];
    }
    __syncthreads();
    write_rows<R, N, Gated, kWarps>(partial, t, kMatmulThreads, r0, rows, n, out, out_stride,
                                    accumulate, e);
}

// The verification batch on tensor cores (sm_80 and later; SPECULA_CUDA_TENSOR_CORES=1): Q8_0
// and Q4_0 weights times 8-bit inputs, up to 16 columns, each weight read once. A warp's
// mma.sync m16n8k32 multiplies one 32-weight block of 16 rows by the block's 32 quantized inputs
// of 8 columns into exact 32-bit sums, which each lane scales and adds to its float sums: one fma
// per row, column and block, blocks in order. A column's sums depend on no other column (nor on
// how many there are: columns past n are zeros), so n = 1 and n = 16 give the same floats: batch
// invariant like matmul_kernel, whose order (quarter blocks) differs. A block of kMmaWarps warps
// takes 16 rows (and up's 16 for a gated product), warp k the chunks k, k + kMmaWarps, ... of
// kMmaChunk blocks; the warps' sums are added in order (write_rows).
// Staged: each chunk's weights, inputs and input scales are copied into the warp's shared
// memory in 16-byte cp.async copies, kMmaStages - 1 chunks ahead of the one multiplied (rows of
// whole chunks, 16-byte aligned); else each lane reads its own from memory. Same floats.
// Not the default: on an H200, at 8B widths, a forward of 16 columns took 0.65x the time it
// takes with matmul_kernel and one of 8 0.86x, but decoding ran at 0.66-0.76x (docs/DESIGN.md
// "Tensor cores for the verification batch").
constexpr int kMmaRows = 16, kMmaWarps = 4, kMmaThreads = kMmaWarps * kWarp, kMmaStages = 2;
constexpr int kMmaChunk = 8;  // blocks: a whole number of 16-byte vectors for Q8_0 and Q4_0
// A column's staged inputs, padded by 16 bytes so that the 8 columns' reads fall in other banks.
constexpr int kMmaXStride = kMmaChunk * int(kBlock) + 16;

template <GgmlType T>
constexpr bool kMmaWeights = T == GgmlType::kQ8_0 || T == GgmlType::kQ4_0;

// One warp's stage for n columns: its rows' chunks, then the inputs' chunks and their scales.
template <GgmlType T, bool Gated>
__host__ __device__ constexpr int mma_stage_bytes(int n) {
    return (Gated ? 2 : 1) * kMmaRows * kChunkBytes<T> + n * (kMmaXStride + kMmaChunk * 4);
}
template <GgmlType T, bool Gated>
constexpr int mma_shared_bytes(int n) {
    return kMmaWarps * kMmaStages * mma_stage_bytes<T, Gated>(n);
}
// The kernel's static shared memory: its warps' partial sums.
template <int Tiles, bool Gated>
__host__ __device__ constexpr int mma_partial_bytes() {
    return int(sizeof(float)) * kMmaWarps * (Gated ? 2 : 1) * kMmaRows * 8 * Tiles;
}

// D = A B for A 16 x 32 signed bytes (four words a lane: rows g, g + 8 of k = 4 q .. 4 q + 3,
// then of 16 + 4 q ..), B 32 x 8 (two words: column g, k = 4 q .., then 16 + 4 q ..); D's words:
// (g, 2 q), (g, 2 q + 1), (g + 8, 2 q), (g + 8, 2 q + 1), for lane 4 g + q.
__device__ void mma_s8(const uint32_t a[4], const uint32_t b[2], int32_t d[4]) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %10, %10, %10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
#else
    __trap();  // the backend takes matmul_kernel on such devices
#endif
}

// 16 bytes from global to shared memory without passing through registers (sm_80 and later).
__device__ void copy16_async(void* shared, const void* global) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    const auto to = static_cast<unsigned>(__cvta_generic_to_shared(shared));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(global) : "memory");
#else
    __trap();
#endif
}
__device__ void copies_commit() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most `pending` of this lane's committed groups are in flight.
template <int pending>
__device__ void copies_wait() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(pending) : "memory");
#endif
}

template <GgmlType T, int Tiles, bool Gated, bool Staged>
__global__ void __launch_bounds__(kMmaThreads)
    matmul_mma_kernel(const uint8_t* __restrict__ w, int64_t in, int64_t rows, QuantizedInputs ix,
                      int n, float* __restrict__ out, int64_t out_stride, bool accumulate,
                      MatmulEpilogue e) {
    static_assert(kMmaWeights<T>, "tensor-core products for Q8_0 and Q4_0 only");
    constexpr int R = kMmaRows, kMats = Gated ? 2 : 1, N = 8 * Tiles;
    __shared__ float partial[kMmaWarps][kMats * R][N];
    static_assert(sizeof(partial) == mma_partial_bytes<Tiles, Gated>());
    extern __shared__ uint4 stages[];  // Staged: kMmaStages of mma_stage_bytes(n) a warp
    const int t = threadIdx.x, warp = t / kWarp, lane = t % kWarp, g = lane / 4, q = lane % 4;
    const int64_t r0 = int64_t(blockIdx.x) * R, blocks = in / kBlock, stride = row_bytes<T>(in);
    // Row k of the block (w's 16 rows, then up's): null past the matrix, whose rows count as zeros.
    auto row_of = [&](int k) -> const uint8_t* {
        if (r0 + k % R >= rows) return nullptr;
        return (Gated && k >= R ? e.up : w) + (r0 + k % R) * stride;
    };
    // acc[m][j][i]: matrix m, tile j of 8 columns, D's word i.
    float acc[kMats][Tiles][4];
    for (int m = 0; m < kMats; ++m)
        for (int j = 0; j < Tiles; ++j)
            for (int i = 0; i < 4; ++i)
                acc[m][j][i] = 0.0f;
    // Block u of a chunk: w_at(k), row k's chunk (null: zeros); x_at(c), column c's inputs of
    // the chunk; d_at(c), their scales. A lane's eight weights of a row and eight inputs of a
    // column are its quarter of the block (int_quarter: weights 8 q .. 8 q + 7), the k of the
    // product permuted alike for both, which leaves every sum of the block as it is.
    auto multiply = [&](int u, auto w_at, auto x_at, auto d_at) {
        uint32_t a[kMats][4];
        float dw[kMats][2];
        for (int m = 0; m < kMats; ++m) {
            for (int h = 0; h < 2; ++h) {
                if (const uint8_t* row = w_at(m * R + g + 8 * h)) {
                    int32_t v[2];
                    int_quarter<T>(row, u, q, v, &dw[m][h]);
                    a[m][h] = uint32_t(v[0]);
                    a[m][2 + h] = uint32_t(v[1]);
                } else {
                    a[m][h] = a[m][2 + h] = 0;
                    dw[m][h] = 0.0f;
                }
            }
        }
        for (int j = 0; j < Tiles; ++j) {
            uint32_t bx[2] = {0, 0};
            if (8 * j + g < n) {
                const int2 xq =
                    *reinterpret_cast<const int2*>(x_at(8 * j + g) + u * kBlock + 8 * q);
                bx[0] = uint32_t(xq.x);
                bx[1] = uint32_t(xq.y);
            }
            float dx[2];
            for (int k = 0; k < 2; ++k) {
                const int c = 8 * j + 2 * q + k;
                dx[k] = c < n ? d_at(c)[u] : 0.0f;
            }
            for (int m = 0; m < kMats; ++m) {
                int32_t d[4];
                mma_s8(a[m], bx, d);
                for (int i = 0; i < 4; ++i)
                    acc[m][j][i] = fmaf(float(d[i]), dw[m][i / 2] * dx[i % 2], acc[m][j][i]);
            }
        }
    };
    if constexpr (Staged) {
        constexpr int kRowBytes = kChunkBytes<T>, kVectors = kChunkVectors<T>;
        const int stage_bytes = mma_stage_bytes<T, Gated>(n);
        uint8_t* mine = reinterpret_cast<uint8_t*>(stages) + warp * kMmaStages * stage_bytes;
        const int64_t chunks = blocks / kMmaChunk;
        // Copies chunk `chunk` (if there is one) into stage `st`; one group per call either way.
        auto fetch = [&](int64_t chunk, int st) {
            uint8_t* to = mine + st * stage_bytes;
            if (chunk < chunks) {
                for (int i = lane; i < kMats * R * kVectors; i += kWarp) {
                    const int k = i / kVectors, v = i % kVectors;
                    if (const uint8_t* row = row_of(k))
                        copy16_async(to + k * kRowBytes + 16 * v, row + chunk * kRowBytes + 16 * v);
                }
                uint8_t* xs = to + kMats * R * kRowBytes;
                for (int i = lane; i < n * 16; i += kWarp) {
                    const int c = i / 16, v = i % 16;
                    copy16_async(xs + c * kMmaXStride + 16 * v,
                                 ix.q + c * in + chunk * kMmaChunk * kBlock + 16 * v);
                }
                uint8_t* ds = xs + n * kMmaXStride;
                for (int i = lane; i < n * 2; i += kWarp) {
                    const int c = i / 2, v = i % 2;
                    copy16_async(ds + c * kMmaChunk * 4 + 16 * v,
                                 ix.d + c * blocks + chunk * kMmaChunk + 4 * v);
                }
            }
            copies_commit();
        };
        for (int st = 0; st < kMmaStages - 1; ++st)
            fetch(warp + int64_t(st) * kMmaWarps, st);
        int st = 0;
        for (int64_t chunk = warp; chunk < chunks; chunk += kMmaWarps) {
            fetch(chunk + int64_t(kMmaStages - 1) * kMmaWarps, (st + kMmaStages - 1) % kMmaStages);
            copies_wait<kMmaStages - 1>();
            __syncwarp();
            const uint8_t* from = mine + st * stage_bytes;
            const uint8_t* xs = from + kMats * R * kRowBytes;
            const auto* ds = reinterpret_cast<const float*>(xs + n * kMmaXStride);
            for (int u = 0; u < kMmaChunk; ++u) {
                multiply(
                    u, [&](int k) { return r0 + k % R < rows ? from + k * kRowBytes : nullptr; },
                    [&](int c) { return xs + c * kMmaXStride; },
                    [&](int c) { return ds + c * kMmaChunk; });
            }
            __syncwarp();  // the stage is written again kMmaStages - 1 chunks on
            st = (st + 1) % kMmaStages;
        }
        copies_wait<0>();
    } else {
        for (int64_t chunk = warp; chunk * kMmaChunk < blocks; chunk += kMmaWarps) {
            const int64_t b0 = chunk * kMmaChunk;
            for (int u = 0; u < kMmaChunk && b0 + u < blocks; ++u) {
                multiply(
                    u,
                    [&](int k) {
                        const uint8_t* row = row_of(k);
                        return row != nullptr ? row + b0 * kBlockBytes<T> : nullptr;
                    },
                    [&](int c) {
                        return reinterpret_cast<const uint8_t*>(ix.q + c * in + b0 * kBlock);
                    },
                    [&](int c) { return ix.d + c * blocks + b0; });
            }
        }
    }
    for (int m = 0; m < kMats; ++m)
        for (int j = 0; j < Tiles; ++j)
            for (int i = 0; i < 4; ++i)
                partial[warp][m * R + g + 8 * (i / 2)][8 * j + 2 * q + i % 2] = acc[m][j][i];
    __syncthreads();
    write_rows<R, N, Gated, kMmaWarps>(partial, t, kMmaThreads, r0, rows, n, out, out_stride,
                                       accumulate, e);
}

// out[c][r] = dot(w[r], x[c]) for batches wider than a verification forward (the Whisper
// encoder's 1500 columns, a prompt), backend/vulkan/shaders/matmul_tiled.comp's tiles: a block of
// kMatmulTileThreads threads computes kMatmulTile rows x kMatmulTile columns, a block of 32
// weights at a time through shared memory (dequantized once, a quarter block per thread), each
// thread 4 rows x 4 columns (rows tr + 16 i, columns tc + 16 j). A weight is read from memory
// once per 64 columns, where the sliced kernel reads it once per 16. Each sum is one fma per
// weight in row order, not matmul_kernel's order: such a column may differ from the same
// column in a narrower batch by rounding (batch invariance is promised up to the verification
// batch, as on Vulkan).
constexpr int kTile = shared::kMatmulTile, kTileStep = shared::kMatmulTileStep,
              kTilePer = kTile / kTileStep, kTileThreads = shared::kMatmulTileThreads;
static_assert(kTileThreads == 4 * kTile && kTileThreads == kTileStep * kTileStep);

template <GgmlType T>
__global__ void __launch_bounds__(kTileThreads)
    matmul_tiled_kernel(const uint8_t* __restrict__ w, int64_t in, int64_t rows,
                        const float* __restrict__ x, int64_t n, float* __restrict__ out,
                        int64_t out_stride, bool accumulate) {
    // [k][row or column], padded: the stores of a warp's quarter blocks fall in distinct banks.
    __shared__ float ws[kBlock][kTile + 1];
    __shared__ float xs[kBlock][kTile + 1];
    const int t = threadIdx.x, tr = t % kTileStep, tc = t / kTileStep, lr = t / 4, q = t % 4;
    const int64_t r0 = int64_t(blockIdx.x) * kTile, c0 = int64_t(blockIdx.y) * kTile;
    const int64_t blocks = in / kBlock;
    const uint8_t* w_row = r0 + lr < rows ? w + (r0 + lr) * row_bytes<T>(in) : nullptr;
    const float* x_row = c0 + lr < n ? x + (c0 + lr) * in : nullptr;
    float acc[kTilePer][kTilePer];
    for (int i = 0; i < kTilePer; ++i)
        for (int j = 0; j < kTilePer; ++j)
            acc[i][j] = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
        float w8[8] = {};
        if (w_row != nullptr) load_quarter<T>(w_row, b, q, w8);
        float4 lo = {0.0f, 0.0f, 0.0f, 0.0f}, hi = lo;
        if (x_row != nullptr) {
            const auto* xp = reinterpret_cast<const float4*>(x_row + b * kBlock + q * 8);
            lo = xp[0];
            hi = xp[1];
        }
        for (int k = 0; k < 8; ++k)
            ws[q * 8 + k][lr] = w8[k];
        xs[q * 8 + 0][lr] = lo.x;
        xs[q * 8 + 1][lr] = lo.y;
        xs[q * 8 + 2][lr] = lo.z;
        xs[q * 8 + 3][lr] = lo.w;
        xs[q * 8 + 4][lr] = hi.x;
        xs[q * 8 + 5][lr] = hi.y;
        xs[q * 8 + 6][lr] = hi.z;
        xs[q * 8 + 7][lr] = hi.w;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < kBlock; ++k) {
            float a[kTilePer], v[kTilePer];
            for (int i = 0; i < kTilePer; ++i)
                a[i] = ws[k][tr + kTileStep * i];
            for (int j = 0; j < kTilePer; ++j)
                v[j] = xs[k][tc + kTileStep * j];
            for (int i = 0; i < kTilePer; ++i)
                for (int j = 0; j < kTilePer; ++j)
                    acc[i][j] = fmaf(a[i], v[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int j = 0; j < kTilePer; ++j) {
        const int64_t c = c0 + tc + kTileStep * j;
        if (c >= n) continue;
        for (int i = 0; i < kTilePer; ++i) {
            const int64_t r = r0 + tr + kTileStep * i;
            if (r >= rows) continue;
            float& o = out[c * out_stride + r];
            o = accumulate ? o + acc[i][j] : acc[i][j];
        }
    }
}

// Element i (= v) of a block of 32 held by one warp, quantized as the cpu's integer kernels
// quantize their inputs (backend/cpu/kernels.cpp, QuantizeInputs): d = max |v| / 127, the value
// v / d rounded to the nearest integer, ties to even (v times 1 / d, both correctly rounded).
__device__ void quantize_in_warp(float v, int64_t i, QuantizedInputs q) {
    float a = fabsf(v);
    for (int o = kWarp / 2; o > 0; o /= 2)
        a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
    const float d = __fdiv_rn(a, 127.0f), inv = d != 0.0f ? __frcp_rn(d) : 0.0f;
    q.q[i] = int8_t(__float2int_rn(__fmul_rn(v, inv)));
    if (i % kBlock == 0) q.d[i / kBlock] = d;
}

// count is whole blocks of 32, so whole warps return together.
__global__ void quantize_kernel(const float* x, int64_t count, QuantizedInputs q) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < count) quantize_in_warp(x[i], i, q);
}

// With q.q set, out is quantized too (cols is whole blocks of 32: each warp holds whole ones).
__global__ void rms_norm_kernel(const float* x, const float* w, float eps, int64_t cols, float* out,
                                QuantizedInputs q) {
    __shared__ float shared[32];
    const float* xr = x + int64_t(blockIdx.x) * cols;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        s = fmaf(xr[c], xr[c], s);
    const float scale = 1.0f / sqrtf(block_sum(s, shared) / float(cols) + eps);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const int64_t i = int64_t(blockIdx.x) * cols + c;
        const float v = xr[c] * scale * w[c];
        out[i] = v;
        if (q.q != nullptr) quantize_in_warp(v, i, q);
    }
}

__global__ void rope_kernel(float* x, int64_t cols, int64_t rows, const int32_t* positions,
                            const float* table, int head_dim, int n_rot) {
    const int64_t pairs_per_row = cols / head_dim * (n_rot / 2);
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * pairs_per_row) return;
    const int64_t r = i / pairs_per_row, k = i % pairs_per_row;
    const int64_t h = k / (n_rot / 2), j = k % (n_rot / 2);
    const float* cs = table + int64_t(positions[r]) * n_rot;
    float* p = x + r * cols + h * head_dim + 2 * j;
    rotate_pair(p[0], p[1], cs[2 * j], cs[2 * j + 1], &p[0], &p[1]);
}

// Attention for one (query row, head) per block, its keys in chunks of kAttnThreads. A chunk's
// softmax state (its max m, its sum l of exp(s - m), and the sum of exp(s - m) v, two head
// dimensions per thread) is computed alone, then the states are merged in chunk order. A
// block either walks all its chunks and merges as it goes, or (few rows, long contexts: split-K)
// computes one chunk and a second kernel merges them; both merge the same states in the same
// order with the same arithmetic, so a row's output depends on neither the path nor the batch.
constexpr int kAttnThreads = kAttentionChunkKeys;

struct SoftmaxState {
    float m, l, acc0, acc1;
};

// b merged into a (a holds the earlier chunks). Rounded as written: never contracted.
__device__ SoftmaxState merge(const SoftmaxState& a, const SoftmaxState& b) {
    const float m = fmaxf(a.m, b.m), fa = expf(a.m - m), fb = expf(b.m - m);
    return {m, __fadd_rn(__fmul_rn(a.l, fa), __fmul_rn(b.l, fb)),
            __fadd_rn(__fmul_rn(a.acc0, fa), __fmul_rn(b.acc0, fb)),
            __fadd_rn(__fmul_rn(a.acc1, fa), __fmul_rn(b.acc1, fb))};
}

struct AttnShared {
    float q[2 * kAttnThreads], p[kAttnThreads], reduce[32];
};

// Which row and head a block serves, and the keys first .. n_keys - 1 the row sees.
struct AttnRow {
    int row, head, kv_head, first, n_keys;
};
__device__ AttnRow attn_row(int index, const AttentionShape& a) {
    const int row = index / a.n_head, head = index % a.n_head;
    const int n_keys = a.fixed_keys > 0 ? a.fixed_keys : a.pos0 + row + 1;
    const int first = a.fixed_keys == 0 && a.window > 0 ? max(0, n_keys - a.window) : 0;
    return {row, head, head / (a.n_head / a.n_head_kv), first, n_keys};
}
__device__ int attn_chunks(const AttnRow& r) {
    return (r.n_keys - r.first + kAttnThreads - 1) / kAttnThreads;
}

__device__ void load_query(const float* q, const AttnRow& r, int n_head, int hd, AttnShared& sh) {
    const float* qh = q + (int64_t(r.row) * n_head + r.head) * hd;
    for (int d = threadIdx.x; d < hd; d += kAttnThreads)
        sh.q[d] = qh[d];
    __syncthreads();
}

// The state of chunk c of the row's keys (those below n_keys): each thread scores one key.
__device__ SoftmaxState attn_chunk(const float* k, const float* v, const AttnRow& r,
                                   const AttentionShape& a, int c, AttnShared& sh) {
    const int hd = a.head_dim, t0 = r.first + c * kAttnThreads;
    const int tid = threadIdx.x, t = t0 + tid, kv_cols = a.n_head_kv * hd;
    const bool k_vectors = hd % 4 == 0 && reinterpret_cast<uintptr_t>(k) % 16 == 0;
    float s = -INFINITY;
    if (t < r.n_keys) {
        const float* kt = k + int64_t(t) * kv_cols + r.kv_head * hd;
        float dot = 0.0f;
        if (k_vectors) {  // the same products in the same order, in 16-byte loads
            const auto* k4 = reinterpret_cast<const float4*>(kt);
            for (int d = 0; d < hd / 4; ++d) {
                const float4 kv = k4[d];
                dot = fmaf(sh.q[4 * d], kv.x, dot);
                dot = fmaf(sh.q[4 * d + 1], kv.y, dot);
                dot = fmaf(sh.q[4 * d + 2], kv.z, dot);
                dot = fmaf(sh.q[4 * d + 3], kv.w, dot);
            }
        } else {
            for (int d = 0; d < hd; ++d)
                dot = fmaf(sh.q[d], kt[d], dot);
        }
        s = dot * a.scale;
        if (a.soft_cap > 0.0f) s = __fmul_rn(tanhf(__fmul_rn(s, 1.0f / a.soft_cap)), a.soft_cap);
    }
    SoftmaxState st{block_max(s, sh.reduce), 0.0f, 0.0f, 0.0f};
    const float p = t < r.n_keys ? expf(s - st.m) : 0.0f;
    sh.p[tid] = p;
    st.l = block_sum(p, sh.reduce);  // its barriers also publish sh.p
    const int count = min(kAttnThreads, r.n_keys - t0);
    for (int j = 0; j < count; ++j) {
        const float* vt = v + int64_t(t0 + j) * kv_cols + r.kv_head * hd;
        if (tid < hd) st.acc0 = fmaf(sh.p[j], vt[tid], st.acc0);
        if (tid + kAttnThreads < hd) st.acc1 = fmaf(sh.p[j], vt[tid + kAttnThreads], st.acc1);
    }
    __syncthreads();  // sh.p is rewritten by the next chunk
    return st;
}

__device__ void attn_write(float* out, const AttnRow& r, int n_head, int hd,
                           const SoftmaxState& st) {
    float* o = out + (int64_t(r.row) * n_head + r.head) * hd;
    const int tid = threadIdx.x;
    if (tid < hd) o[tid] = st.acc0 / st.l;
    if (tid + kAttnThreads < hd) o[tid + kAttnThreads] = st.acc1 / st.l;
}

__global__ void attention_kernel(const float* q, const float* k, const float* v, float* out,
                                 AttentionShape a) {
    __shared__ AttnShared sh;
    const AttnRow r = attn_row(int(blockIdx.x), a);
    load_query(q, r, a.n_head, a.head_dim, sh);
    SoftmaxState st = attn_chunk(k, v, r, a, 0, sh);
    for (int c = 1; c < attn_chunks(r); ++c)
        st = merge(st, attn_chunk(k, v, r, a, c, sh));
    attn_write(out, r, a.n_head, a.head_dim, st);
}

// Split-K: block (i, c) writes chunk c's state of row-head i to partial[(i * max_chunks + c)],
// each a record of m, l and hd sums.
__global__ void attention_chunk_kernel(const float* q, const float* k, const float* v,
                                       float* partial, int max_chunks, AttentionShape a) {
    __shared__ AttnShared sh;
    const AttnRow r = attn_row(int(blockIdx.x), a);
    const int c = int(blockIdx.y), hd = a.head_dim;
    if (c >= attn_chunks(r)) return;
    load_query(q, r, a.n_head, hd, sh);
    const SoftmaxState st = attn_chunk(k, v, r, a, c, sh);
    float* rec = partial + (int64_t(blockIdx.x) * max_chunks + c) * (hd + 2);
    const int tid = threadIdx.x;
    if (tid == 0) {
        rec[0] = st.m;
        rec[1] = st.l;
    }
    if (tid < hd) rec[2 + tid] = st.acc0;
    if (tid + kAttnThreads < hd) rec[2 + tid + kAttnThreads] = st.acc1;
}

__global__ void attention_merge_kernel(const float* partial, float* out, int max_chunks,
                                       AttentionShape a) {
    const AttnRow r = attn_row(int(blockIdx.x), a);
    const int tid = threadIdx.x, hd = a.head_dim;
    auto state = [&](int c) {
        const float* rec = partial + (int64_t(blockIdx.x) * max_chunks + c) * (hd + 2);
        return SoftmaxState{rec[0], rec[1], tid < hd ? rec[2 + tid] : 0.0f,
                            tid + kAttnThreads < hd ? rec[2 + tid + kAttnThreads] : 0.0f};
    };
    SoftmaxState st = state(0);
    for (int c = 1; c < attn_chunks(r); ++c)
        st = merge(st, state(c));
    attn_write(out, r, a.n_head, hd, st);
}

__global__ void gated_mul_kernel(uint32_t act, const float* g, const float* u, int64_t n,
                                 float* out) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gated_times(act, g[i], u[i]);
}

__global__ void layer_norm_kernel(const float* x, const float* w, const float* b, float eps,
                                  int64_t cols, float* out) {
    __shared__ float shared[32];
    const float* xr = x + int64_t(blockIdx.x) * cols;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        s += xr[c];
    const float mean = block_sum(s, shared) / float(cols);
    s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        s = fmaf(xr[c] - mean, xr[c] - mean, s);
    const float scale = 1.0f / sqrtf(block_sum(s, shared) / float(cols) + eps);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        out[int64_t(blockIdx.x) * cols + c] = (xr[c] - mean) * scale * w[c] + b[c];
}

__global__ void activate_kernel(uint32_t act, const float* x, int64_t n, float* out) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = activated(act, x[i]);
}

__global__ void im2col_kernel(const float* x, int64_t C, int64_t T, Im2col conv, int64_t out_cols,
                              int64_t n, float* out) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t t = i / out_cols, j = i % out_cols;
    float v = 0.0f;
    if (j < conv.kernel * C) {
        const int64_t src = conv.stride * t + j % conv.kernel - conv.padding;
        if (src >= 0 && src < T) v = x[src * C + j / conv.kernel];
    }
    out[i] = v;
}

__global__ void scale_kernel(float* x, float factor, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(x[i], factor);
}

__global__ void soft_cap_kernel(float* x, float cap, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(tanhf(__fmul_rn(x[i], 1.0f / cap)), cap);
}

__global__ void round_to_half_kernel(float* x, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __half2float(__float2half_rn(x[i]));
}

__global__ void add_bias_kernel(float* x, const float* bias, int64_t period, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] += bias[i % period];
}
unsigned blocks(int64_t n, int per) {
    return unsigned((n + per - 1) / per);
}

template <GgmlType T, int N, int R, bool Gated, bool Int>
void launch_matmul(cudaStream_t s, const uint8_t* w, int64_t in, int64_t rows, const float* x,
                   QuantizedInputs ix, int n, float* out, int64_t out_stride, bool accumulate,
                   const MatmulEpilogue& e, bool staged) {
    const unsigned grid = blocks(rows, R);
    if constexpr (kStageable<T>) {
        if (staged) {
            matmul_kernel<T, N, R, Gated, true, Int><<<grid, kMatmulThreads, 0, s>>>(
                w, in, rows, x, ix, n, out, out_stride, accumulate, e);
            return;
        }
    }
    matmul_kernel<T, N, R, Gated, false, Int>
        <<<grid, kMatmulThreads, 0, s>>>(w, in, rows, x, ix, n, out, out_stride, accumulate, e);
}

bool aligned16(const void* p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Rows per block for N columns: more rows make each x value loaded serve more of them, fewer
// make more blocks. On an H100 (a 1.1B model, docs/benchmarks.md) a verification forward of 8
// took 1.8x one of 1 with 8 rows per block and 1.6x with 4; one of 16 took 3.9x with 8 and 4.1x
// with 4. A gated block holds twice its rows' accumulators: half the rows.
template <int N, bool Gated>
constexpr int kRowsPerBlock = std::max(2, (N <= 2   ? 2
                                           : N <= 8 ? 4
                                                    : 8) /
                                              (Gated ? 2 : 1));

template <GgmlType T, bool Gated>
void matmul_typed(cudaStream_t s, const void* w, int64_t in, int64_t rows, const float* x,
                  const QuantizedInputs* qx, int64_t n, float* out, int64_t out_stride,
                  bool accumulate, const MatmulEpilogue& e, MatmulReads reads) {
    const auto* wb = static_cast<const uint8_t*>(w);
    const bool staged = reads.staged && in % (8 * kBlock) == 0 && aligned16(w) &&
                        (e.up == nullptr || aligned16(e.up));
    // Column counts round up to 1, 2, 4, 8 or 16 accumulators; wider batches in slices.
    for (int64_t c0 = 0; c0 < n; c0 += 16) {
        const int m = int(n - c0 < 16 ? n - c0 : 16);
        const float* xs = x + c0 * in;
        QuantizedInputs ix;
        if (qx != nullptr) ix = {qx->q + c0 * in, qx->d + c0 * (in / kBlock)};
        float* os = out + c0 * out_stride;
        MatmulEpilogue slice = e;
        if (slice.positions != nullptr) slice.positions += c0;
        if constexpr (kMmaWeights<T>) {
            if (reads.tensor_cores && qx != nullptr) {
                const auto go = [&]<int Tiles, bool Staged>() {
                    const auto kernel = matmul_mma_kernel<T, Tiles, Gated, Staged>;
                    const int shared = Staged ? mma_shared_bytes<T, Gated>(m) : 0;
                    // Static and dynamic bytes past the default 48 KiB need the limit raised.
                    if (shared + mma_partial_bytes<Tiles, Gated>() > 48 * 1024)
                        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             shared);
                    kernel<<<blocks(rows, kMmaRows), kMmaThreads, shared, s>>>(
                        wb, in, rows, ix, m, os, out_stride, accumulate, slice);
                };
                if (m <= 8)
                    staged ? go.template operator()<1, true>() : go.template operator()<1, false>();
                else
                    staged ? go.template operator()<2, true>() : go.template operator()<2, false>();
                continue;
            }
        }
        const auto launch = [&]<int N>() {
            constexpr int R = kRowsPerBlock<N, Gated>;
            if constexpr (kIntInputs<T>) {
                if (qx != nullptr)
                    return launch_matmul<T, N, R, Gated, true>(
                        s, wb, in, rows, xs, ix, m, os, out_stride, accumulate, slice, staged);
            }
            launch_matmul<T, N, R, Gated, false>(s, wb, in, rows, xs, ix, m, os, out_stride,
                                                 accumulate, slice, staged);
        };
        if (m == 1)
            launch.template operator()<1>();
        else if (m == 2)
            launch.template operator()<2>();
        else if (m <= 4)
            launch.template operator()<4>();
        else if (m <= 8)
            launch.template operator()<8>();
        else
            launch.template operator()<16>();
    }
}

// Calls f.template operator()<T>() for the weight type T == type and says whether one of Ts
// matched (a type without kernels: the caller reports it).
template <GgmlType... Ts, typename F>
bool with_one_of(GgmlType type, F&& f) {
    return ((type == Ts && (f.template operator()<Ts>(), true)) || ...);
}
// Every type of kWeightTypes has kernels.
template <typename F>
bool with_weight_type(GgmlType type, F&& f) {
    return [&]<size_t... I>(std::index_sequence<I...>) {
        return with_one_of<kWeightTypes[I]...>(type, f);
    }
    (std::make_index_sequence<std::size(kWeightTypes)>{});
}

}  // namespace

bool get_rows(cudaStream_t s, GgmlType type, const void* table, int64_t cols, const int32_t* ids,
              int64_t n, float* out) {
    return with_weight_type(type, [&]<GgmlType T>() {
        get_rows_kernel<T>
            <<<unsigned(n), 256, 0, s>>>(static_cast<const uint8_t*>(table), cols, ids, out);
    });
}

void rms_norm(cudaStream_t s, const float* x, const float* w, float eps, int64_t cols, int64_t rows,
              float* out, QuantizedInputs q) {
    // A wide block: each thread reads few elements, so the two passes are short.
    rms_norm_kernel<<<unsigned(rows), 1024, 0, s>>>(x, w, eps, cols, out, q);
}

bool has_int_kernel(GgmlType type) {
    bool has = false;
    with_weight_type(type, [&]<GgmlType T>() { has = kIntInputs<T>; });
    return has;
}

void quantize_inputs(cudaStream_t s, const float* x, int64_t count, QuantizedInputs q) {
    quantize_kernel<<<blocks(count, 256), 256, 0, s>>>(x, count, q);
}

void layer_norm(cudaStream_t s, const float* x, const float* w, const float* b, float eps,
                int64_t cols, int64_t rows, float* out) {
    layer_norm_kernel<<<unsigned(rows), 1024, 0, s>>>(x, w, b, eps, cols, out);
}

void activate(cudaStream_t s, uint32_t act, const float* x, int64_t n, float* out) {
    activate_kernel<<<blocks(n, 256), 256, 0, s>>>(act, x, n, out);
}

void im2col(cudaStream_t s, const float* x, int64_t C, int64_t T, const Im2col& conv,
            int64_t out_cols, int64_t out_rows, float* out) {
    im2col_kernel<<<blocks(out_cols * out_rows, 256), 256, 0, s>>>(x, C, T, conv, out_cols,
                                                                   out_cols * out_rows, out);
}

__global__ void expand_columns_kernel(const float* src, int64_t src_cols, const int32_t* ids,
                                      float fill, int64_t cols, int64_t n, float* out) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t c = i % cols;
    int64_t lo = 0, hi = src_cols;  // the first j with ids[j] >= c lies in [lo, hi]
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (ids[mid] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    out[i] = lo < src_cols && ids[lo] == c ? src[(i / cols) * src_cols + lo] : fill;
}

void expand_columns(cudaStream_t s, const float* src, int64_t src_cols, const int32_t* ids,
                    float fill, int64_t cols, int64_t rows, float* out) {
    expand_columns_kernel<<<blocks(cols * rows, 256), 256, 0, s>>>(src, src_cols, ids, fill, cols,
                                                                   cols * rows, out);
}

void scale(cudaStream_t s, float* x, float factor, int64_t n) {
    scale_kernel<<<blocks(n, 256), 256, 0, s>>>(x, factor, n);
}

void soft_cap(cudaStream_t s, float* x, float cap, int64_t n) {
    soft_cap_kernel<<<blocks(n, 256), 256, 0, s>>>(x, cap, n);
}

void round_to_half(cudaStream_t s, float* x, int64_t n) {
    round_to_half_kernel<<<blocks(n, 256), 256, 0, s>>>(x, n);
}

void add_bias(cudaStream_t s, float* x, const float* bias, int64_t period, int64_t n) {
    add_bias_kernel<<<blocks(n, 256), 256, 0, s>>>(x, bias, period, n);
}

bool matmul(cudaStream_t s, GgmlType type, const void* w, int64_t in, int64_t out_features,
            const float* x, const QuantizedInputs* qx, int64_t n, float* out, int64_t out_stride,
            bool accumulate, MatmulReads reads) {
    return with_weight_type(type, [&]<GgmlType T>() {
        matmul_typed<T, false>(s, w, in, out_features, x, qx, n, out, out_stride, accumulate, {},
                               reads);
    });
}

bool matmul_gated(cudaStream_t s, GgmlType type, uint32_t act, const void* w_gate, const void* w_up,
                  int64_t in, int64_t out_features, const float* x, const QuantizedInputs* qx,
                  int64_t n, float* out, MatmulReads reads) {
    MatmulEpilogue e;
    e.up = static_cast<const uint8_t*>(w_up);
    e.activation = act;
    return with_weight_type(type, [&]<GgmlType T>() {
        matmul_typed<T, true>(s, w_gate, in, out_features, x, qx, n, out, out_features, false, e,
                              reads);
    });
}

bool matmul_rope(cudaStream_t s, GgmlType type, const void* w, int64_t in, int64_t out_features,
                 const float* x, const QuantizedInputs* qx, int64_t n, float* out,
                 const int32_t* positions, const float* table, int head_dim, int n_rot,
                 MatmulReads reads) {
    MatmulEpilogue e;
    e.positions = positions;
    e.table = table;
    e.head_dim = head_dim;
    e.n_rot = n_rot;
    return with_weight_type(type, [&]<GgmlType T>() {
        matmul_typed<T, false>(s, w, in, out_features, x, qx, n, out, out_features, false, e,
                               reads);
    });
}

bool matmul_tiled(cudaStream_t s, GgmlType type, const void* w, int64_t in, int64_t out_features,
                  const float* x, int64_t n, float* out, int64_t out_stride, bool accumulate) {
    const dim3 grid(blocks(out_features, kTile), blocks(n, kTile));
    return with_weight_type(type, [&]<GgmlType T>() {
        matmul_tiled_kernel<T><<<grid, kTileThreads, 0, s>>>(
            static_cast<const uint8_t*>(w), in, out_features, x, n, out, out_stride, accumulate);
    });
}

void rope(cudaStream_t s, float* x, int64_t cols, int64_t rows, const int32_t* positions,
          const float* table, int head_dim, int n_rot) {
    const int64_t pairs = rows * (cols / head_dim) * (n_rot / 2);
    rope_kernel<<<blocks(pairs, 256), 256, 0, s>>>(x, cols, rows, positions, table, head_dim,
                                                   n_rot);
}

void copy_f32(cudaStream_t s, const float* src, int64_t n, float* dst) {
    cudaMemcpyAsync(dst, src, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, s);
}

int64_t attention_partial_floats(int rows, int n_head, int head_dim, int max_keys) {
    return int64_t(rows) * n_head * ((max_keys + kAttnThreads - 1) / kAttnThreads) * (head_dim + 2);
}

void attention(cudaStream_t s, const float* q, const float* k, const float* v, float* out, int rows,
               const AttentionShape& shape, float* partial) {
    const unsigned blocks_needed = unsigned(rows * shape.n_head);
    if (partial == nullptr) {
        attention_kernel<<<blocks_needed, kAttnThreads, 0, s>>>(q, k, v, out, shape);
        return;
    }
    // The most keys a row sees (within a window, chunks count from the row's first key).
    const int last = shape.fixed_keys > 0 ? shape.fixed_keys : shape.pos0 + rows;
    const int max_keys =
        shape.fixed_keys == 0 && shape.window > 0 ? std::min(last, shape.window) : last;
    const int max_chunks = (max_keys + kAttnThreads - 1) / kAttnThreads;
    attention_chunk_kernel<<<dim3(blocks_needed, unsigned(max_chunks)), kAttnThreads, 0, s>>>(
        q, k, v, partial, max_chunks, shape);
    attention_merge_kernel<<<blocks_needed, kAttnThreads, 0, s>>>(partial, out, max_chunks, shape);
}

void gated_mul(cudaStream_t s, uint32_t act, const float* gate, const float* up, int64_t n,
               float* out) {
    gated_mul_kernel<<<blocks(n, 256), 256, 0, s>>>(act, gate, up, n, out);
}
}  // namespace specula::cuda
