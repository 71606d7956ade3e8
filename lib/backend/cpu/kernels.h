// The cpu backend's SIMD kernels (Google Highway, dispatched at run time to the best
// instruction set the machine has: AVX-512, AVX2, SSE4 on x86; NEON on ARM).
//
// A weight row is decoded to floats (each weight exactly as dequantize_row() gives it) and
// multiplied with the f32 inputs by fused multiply-adds in one order: lanes of the vector
// width take elements j, j + lanes, ..., their sum is reduced by a fixed tree and the
// elements past the last whole vector are added one by one. Tiles of rows and inputs share
// loads, never arithmetic, so a product does not depend on how many rows or inputs are
// computed with it: the backend stays batch invariant.
//
// Q8_0 and Q4_0 weights are multiplied with 8-bit inputs instead (as llama.cpp's cpu backend
// does), by integer dot products: each input row is quantized per block of 32 like Q8_0 (dx =
// max |x| / 127, qx = x / dx rounded to nearest even, computed as x * (1 / dx)), and the
// product of weight row r and an input is, over the blocks b in order,
//     acc = fma(float(sum_j qw[j] * qx[j]), dw_b * dx_b, acc)
// The integer sums are exact, so every instruction set and tile computes the same ones, and
// the float chain has one order: batch invariance holds again. The weights are repacked once
// (pack_rows) into groups of kGroupRows rows whose 4-byte column chunks are interleaved, so
// that a vector holds one chunk of each row of a group and no sum crosses lanes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "format/gguf.h"

namespace specula::cpu {

// n rows of cols inputs quantized per block of 32: q (n * cols), and per block (n * cols / 32
// each) its scale dx, the sum of its qx, and dx times the sums of its qx, of its first 16 and
// of its last 16 (the min and offset terms below take one multiply-add per block and input).
struct QuantizedInputs {
    const int8_t* q = nullptr;
    const float* d = nullptr;
    const int32_t* sum = nullptr;
    int64_t cols = 0;
    const float* dsum = nullptr;
    const float* dsum_lo = nullptr;
    const float* dsum_hi = nullptr;
};
// The arrays a QuantizedInputs views, and what fills them.
class QuantizedInputArrays {
  public:
    // Room for n rows of cols inputs (cols a multiple of 32); view() points at it.
    void resize(int64_t n, int64_t cols);
    // Quantizes blocks [b0, b1) of the n * cols / 32 blocks of x (the whole input): a block
    // at a time, so any split of the blocks gives the same values.
    void quantize(const float* x, int64_t b0, int64_t b1);
    const QuantizedInputs& view() const { return view_; }

    // The kernels' writable view of blocks from b0 on.
    struct Out {
        int8_t* q;
        float* d;
        int32_t* sum;
        float *dsum, *dsum_lo, *dsum_hi;
    };

  private:
    std::vector<int8_t> q_;
    std::vector<float> d_, dsum_, dsum_lo_, dsum_hi_;
    std::vector<int32_t> sum_;
    QuantizedInputs view_;
};

struct MatmulArgs {
    GgmlType type = GgmlType::kF32;  // one of kWeightTypes (format/quant.h)
    const uint8_t* w = nullptr;      // rows of `cols` weights, row_bytes apart
    size_t row_bytes = 0;
    int64_t cols = 0;
    const float* x = nullptr;  // n rows of cols floats, contiguous
    int64_t n = 0;
    float* out = nullptr;  // out[i * out_stride + r]
    int64_t out_stride = 0;
    bool accumulate = false;  // out += product (one addition) instead of out = product
    // Quantized weights with 8-bit inputs: x quantized by QuantizedInputArrays, and
    // the weights packed by pack_rows() (nullptr: each group is packed as it is used).
    const QuantizedInputs* qx = nullptr;
    const uint8_t* packed = nullptr;
    // Tiles of kTileInputs inputs by AMX's tile multiplies where amx_available() (the rest as
    // without): the same integer sums, so the same floats.
    bool amx = false;
};

// Inputs per AMX tile multiply: a tile of 16 inputs x 32 columns times a packed block's 16 rows.
constexpr int64_t kTileInputs = 16;
// Whether this CPU has AMX's int8 tile multiplies and the operating system lets the process use
// them (Linux asks for the permission once, arch_prctl ARCH_REQ_XCOMP_PERM); the kernels use
// them on the AVX3_DL instruction set only.
bool amx_available();

// Whether the integer kernels prefetch the weights themselves at every input count, not only
// from three inputs on. Where one input streams at the memory's rate unaided (AMD EPYC, Zen 4:
// prefetching only slowed a forward of 1 or 2 positions) no; elsewhere yes: on an Intel Xeon
// (Emerald Rapids) a forward of one position of the 1B Q4_K_M file read its weights at ~14 GB/s
// of a ~20 GB/s copy rate unaided, and took 42-45 ms against 30-33 prefetched. ARM: untried, no.
bool prefetches_every_product();

// Rows of a packed quantized matrix per group; the threads split matrices in whole groups.
constexpr int64_t kGroupRows = 16;
// Q4_1, Q5_1, Q4_K and Q5_K blocks of 32 have a scale and a min: x = d1 * q - m1 with q >= 0
// (Q4_1 / Q5_1: d1 = d, m1 = -m). Their product with an input block is, by the same
// definition with the min's term added,
//     acc = fma(float(sum_j q[j] * qx[j]), d1 * dx, acc)
//     acc = fma(dsum, -m1, acc)
// (instruction sets without fma: acc + float(sum_j qx[j]) * (-m1 * dx), kernels.cpp says why)
constexpr bool has_block_min(GgmlType type) {
    return type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1 || type == GgmlType::kQ4_K ||
           type == GgmlType::kQ5_K;
}
// Q6_K blocks of 32 have a scale per half (int8 s_lo, s_hi) times the super-block's d: with q
// in 0..63 (the weight + 32), the sums over each half of the block and d_lo = d * s_lo (exact),
//     acc = fma(float(sum_lo q * qx), d_lo * dx, acc)
//     acc = fma(float(sum_hi q * qx), d_hi * dx, acc)
//     acc = fma(dsum_lo, -32 * d_lo, acc)
//     acc = fma(dsum_hi, -32 * d_hi, acc)
//
// A packed group takes no more bytes per weight than the file (decode streams the packed
// copy, so it is as fast as the file is small; kernels.cpp has the layout). Per block and row:
// chunks of 4 bytes, Q8_0's bytes or every other type's low 4 bits as nibbles; the bits above
// (one: Q5_0, Q5_1, Q5_K; two: Q6_K) gathered in bytes beside them.
constexpr int packed_chunks(GgmlType type) {
    return type == GgmlType::kQ8_0 ? 8 : 4;
}
constexpr int packed_high_bits(GgmlType type) {
    return type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1 || type == GgmlType::kQ5_K ? 1
           : type == GgmlType::kQ6_K                                                     ? 2
                                                                                         : 0;
}
constexpr bool is_k_quant(GgmlType type) {
    return type == GgmlType::kQ4_K || type == GgmlType::kQ5_K || type == GgmlType::kQ6_K;
}
// K-quants are packed a super-block (8 blocks) at a time, its rows' f16 scales (Q4_K / Q5_K:
// d and dmin; Q6_K: d) first; the other types a block at a time.
constexpr int packed_unit_blocks(GgmlType type) {
    return is_k_quant(type) ? 8 : 1;
}
constexpr size_t packed_unit_scale_bytes(GgmlType type) {
    return type == GgmlType::kQ6_K ? 2 : is_k_quant(type) ? 4 : 0;
}
// Per row and block: an f16 scale (Q8_0, Q4_0, Q5_0); f16 d and m (Q4_1, Q5_1); the 6-bit scale
// and min as bytes (Q4_K, Q5_K); the halves' int8 scales (Q6_K).
constexpr size_t packed_scale_bytes(GgmlType type) {
    return type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1 ? 4 : 2;
}
constexpr size_t packed_block_bytes(GgmlType type) {
    return size_t(kGroupRows) *
           (packed_scale_bytes(type) + 4 * size_t(packed_chunks(type) + packed_high_bits(type)));
}
constexpr size_t packed_unit_bytes(GgmlType type) {
    return size_t(kGroupRows) * packed_unit_scale_bytes(type) +
           size_t(packed_unit_blocks(type)) * packed_block_bytes(type);
}
// Whether `type` is multiplied with 8-bit inputs (every quantized type).
bool has_integer_kernel(GgmlType type);
// Bytes of a packed matrix of `type` (rows padded to whole groups, cols a multiple of its
// unit's columns).
size_t packed_bytes(GgmlType type, int64_t rows, int64_t cols);
// Packs groups [group_begin, group_end) of the rows (row_bytes apart), one after the other,
// into dst (the packed matrix at group group_begin).
void pack_rows(GgmlType type, const uint8_t* src, size_t row_bytes, int64_t rows, int64_t cols,
               int64_t group_begin, int64_t group_end, uint8_t* dst);

// Rows decoded and multiplied together; a thread's share of a matmul is a multiple.
constexpr int64_t kRowTile = kGroupRows;
// Rows [row_begin, row_end) of the product, for all n inputs.
void matmul_rows(const MatmulArgs& args, int64_t row_begin, int64_t row_end);

// A row of `cols` weights of `type` as floats, as dequantize_row() gives them.
void decode_row(GgmlType type, const uint8_t* src, int64_t cols, float* dst);
// The dot product of two f32 rows, in the order described above.
float dot_f32(const float* a, const float* b, int64_t n);
// Attention of n_queries query heads (head_dim floats each, contiguous) that share one key
// and value head: out[c] = softmax(s(q[c], k[t]) for t < n_keys) . v, keys and values k_stride
// and v_stride floats apart, the score s = scale * q . k, or with soft_cap > 0
// soft_cap * tanh(scale * q . k / soft_cap) (Backend::Attention); scores holds
// n_queries * n_keys floats of scratch.
void attend(const float* q, int n_queries, const float* k, int64_t k_stride, const float* v,
            int64_t v_stride, int n_keys, int head_dim, float scale, float soft_cap, float* scores,
            float* out);

// Causal attention reads its keys transposed (the cpu backend keeps a cache's transpose beside
// it): a query's scores over kKeyBlock keys are then lanes of one vector, each a chain of
// multiply-adds down the head's dimensions, with no sum across lanes. Per key/value head,
// blocks of kKeyBlock keys, each head_dim rows of kKeyBlock floats (key j of a block in column j).
constexpr int64_t kKeyBlock = 16;
constexpr int64_t transposed_key_blocks(int64_t keys) {
    return (keys + kKeyBlock - 1) / kKeyBlock;
}
// Floats of the transpose of `capacity` keys of n_head_kv heads of head_dim.
constexpr int64_t transposed_key_floats(int n_head_kv, int head_dim, int64_t capacity) {
    return int64_t(n_head_kv) * transposed_key_blocks(capacity) * head_dim * kKeyBlock;
}
// Keys [begin, end) of k (rows of n_head_kv * head_dim floats, k_stride apart) into the
// transpose kt of `capacity` keys; or, where every key is exact in F16 (round_to_half), into
// a transpose of halves (IEEE half bits) of the same layout.
void transpose_keys(const float* k, int64_t k_stride, int n_head_kv, int head_dim, int64_t capacity,
                    int64_t begin, int64_t end, float* kt);
void transpose_keys(const float* k, int64_t k_stride, int n_head_kv, int head_dim, int64_t capacity,
                    int64_t begin, int64_t end, uint16_t* kt);
// Values [begin, end) of v (rows of n_head_kv * head_dim floats exact in F16, v_stride apart)
// as halves, head by head: value t of head h at vh + (h * capacity + t) * head_dim.
void values_to_halves(const float* v, int64_t v_stride, int n_head_kv, int head_dim,
                      int64_t capacity, int64_t begin, int64_t end, uint16_t* vh);
// x[i] = the IEEE half nearest x[i] (ties to even; from 65520 on, infinity), as a float: values
// a copy in F16 holds without loss.
void round_to_half(float* x, int64_t n);
// attend() with one head's keys transposed (kt: its first block; 64-byte aligned), query c
// seeing keys first[c] .. keys[c] - 1 (rows of a batch, each its own); scores holds
// n_queries * kKeyBlock * transposed_key_blocks(max keys) floats of scratch. A query's result
// is the same floats in any set of queries.
void attend_transposed(const float* q, int n_queries, const int* first, const int* keys,
                       const float* kt, const float* v, int64_t v_stride, int head_dim, float scale,
                       float soft_cap, float* scores, float* out);
// The same over halves (keys transposed as halves, values_to_halves's values): the same floats
// as over the floats they hold, at half the bytes read.
void attend_transposed(const float* q, int n_queries, const int* first, const int* keys,
                       const uint16_t* kt, const uint16_t* v, int64_t v_stride, int head_dim,
                       float scale, float soft_cap, float* scores, float* out);

// out[i] = act(gate[i]) * up[i] for device_abi.h's activation `act` (kActivationSilu: gate[i] /
// (1 + e^-gate[i]); kActivationGeluTanh: gate[i] / (1 + e^(-2z)); kActivationGeluErf:
// gate[i] / 2 (1 + erf(gate[i] / sqrt 2)), erf as the kErf* approximation) (out may be gate).
void gated_times(uint32_t act, const float* gate, const float* up, float* out, int64_t n);

// out[i] = act(x[i]), the activations of gated_times (out may be x).
void activate(uint32_t act, const float* x, float* out, int64_t n);

// x[i] = cap * tanh(x[i] / cap), in place: the attention's soft cap of its scores, on any floats
// (Gemma 2's logits).
void soft_cap(float* x, int64_t n, float cap);

// Which instruction set the kernels run on ("AVX3", "AVX2", "NEON", ...).
const char* simd_target();

enum class SimdChoice { kChosen, kNotRunnableHere, kUnknown };
// Runs the kernels on the instruction set `name` (as simd_target() spells it) from now on, in
// the whole process: tests and benchmarks take each compiled one in turn. Otherwise the best
// one runs; kNotRunnableHere: a target this build or this CPU lacks.
SimdChoice use_simd_target(std::string_view name);
// The instruction sets this build has kernels for and this CPU runs, best first.
std::string runnable_simd_targets();

// Every IEEE half as a float.
const float* half_table();

}  // namespace specula::cpu
