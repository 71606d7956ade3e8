// Launchers of the CUDA kernels, on plain device pointers. Shapes and
// semantics are those of the Backend ops (lib/backend/backend.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"
#include "core/device_abi.h"

namespace specula::cuda {

// get_rows and matmul return false for a weight type they have no kernel for (nothing runs).
bool get_rows(cudaStream_t s, GgmlType type, const void* table, int64_t cols, const int32_t* ids,
              int64_t n, float* out);
// Inputs of a matmul quantized to 8 bits per block of 32 as the cpu's integer kernels quantize
// them: q holds the n x in values, d the n x in / 32 scales (x = d q).
struct QuantizedInputs {
    int8_t* q = nullptr;
    float* d = nullptr;
};
// Whether matmul multiplies weights of `type` by QuantizedInputs when it is given them.
bool has_int_kernel(GgmlType type);
// count values of x (whole blocks of 32) into q.
void quantize_inputs(cudaStream_t s, const float* x, int64_t count, QuantizedInputs q);
// With q.q set, out is also quantized into q (cols whole blocks of 32).
void rms_norm(cudaStream_t s, const float* x, const float* w, float eps, int64_t cols, int64_t rows,
              float* out, QuantizedInputs q = {});
// How matmul reads and multiplies its weights. staged: through shared memory in 16-byte loads
// where their type and row length allow it, else each thread reads its own (the same floats
// either way; ops.cu's matmul_kernel). tensor_cores: Q8_0 and Q4_0 times quantized inputs by
// mma.sync (sm_80 and later; matmul_mma_kernel), whose sums run in another order than
// matmul_kernel's: one choice for every batch width keeps a device's results batch invariant.
struct MatmulReads {
    bool staged = true;
    bool tensor_cores = false;
};
// accumulate: out += w x instead of out = w x. qx: x quantized, which weights with an integer
// kernel (has_int_kernel) are multiplied by instead of x; null: x.
bool matmul(cudaStream_t s, GgmlType type, const void* w, int64_t in, int64_t out_features,
            const float* x, const QuantizedInputs* qx, int64_t n, float* out, int64_t out_stride,
            bool accumulate, MatmulReads reads);
// out = act(w_gate x) * (w_up x) in one pass (act: device_abi.h's kActivation*), w_gate and
// w_up of one type: the floats of two matmuls and gated_mul (Backend::matmul_gated).
bool matmul_gated(cudaStream_t s, GgmlType type, uint32_t act, const void* w_gate, const void* w_up,
                  int64_t in, int64_t out_features, const float* x, const QuantizedInputs* qx,
                  int64_t n, float* out, MatmulReads reads);
// matmul and then rope on its output, in one pass: the same floats (Backend::matmul_rope).
bool matmul_rope(cudaStream_t s, GgmlType type, const void* w, int64_t in, int64_t out_features,
                 const float* x, const QuantizedInputs* qx, int64_t n, float* out,
                 const int32_t* positions, const float* table, int head_dim, int n_rot,
                 MatmulReads reads);
// The same product in tiles of kMatmulTile rows x columns (core/device_abi.h), each weight read
// once per tile of columns, for batches wider than a verification forward: its sums run in
// another order than matmul's, so a column may differ from one of a narrow batch by rounding.
bool matmul_tiled(cudaStream_t s, GgmlType type, const void* w, int64_t in, int64_t out_features,
                  const float* x, int64_t n, float* out, int64_t out_stride, bool accumulate);
void rope(cudaStream_t s, float* x, int64_t cols, int64_t rows, const int32_t* positions,
          const float* table, int head_dim, int n_rot);
void copy_f32(cudaStream_t s, const float* src, int64_t n, float* dst);
// Backend::Attention's shape: fixed_keys > 0: every row sees keys 0 .. fixed_keys - 1; 0:
// causal from pos0, within the last `window` keys where window > 0; scores capped at
// ±soft_cap where soft_cap > 0.
struct AttentionShape {
    int n_head = 0, n_head_kv = 0, head_dim = 0;
    int pos0 = 0, fixed_keys = 0, window = 0;
    float scale = 0.0f, soft_cap = 0.0f;
};
// With `partial` (attention_partial_floats() floats), the keys' chunks are spread over blocks
// (split-K): the same results, more blocks for few rows.
constexpr int kAttentionChunkKeys = 128;  // keys per chunk, one per thread of a block
int64_t attention_partial_floats(int rows, int n_head, int head_dim, int max_keys);
void attention(cudaStream_t s, const float* q, const float* k, const float* v, float* out, int rows,
               const AttentionShape& shape, float* partial);
void gated_mul(cudaStream_t s, uint32_t act, const float* gate, const float* up, int64_t n,
               float* out);
void layer_norm(cudaStream_t s, const float* x, const float* w, const float* b, float eps,
                int64_t cols, int64_t rows, float* out);
// out[i] = act(x[i]) (act: device_abi.h's kActivation*).
void activate(cudaStream_t s, uint32_t act, const float* x, int64_t n, float* out);
// x[i] += bias[i % period] for i < n.
void add_bias(cudaStream_t s, float* x, const float* bias, int64_t period, int64_t n);
void scale(cudaStream_t s, float* x, float factor, int64_t n);
void soft_cap(cudaStream_t s, float* x, float cap, int64_t n);
// x = the IEEE half nearest x (ties to even), as floats (Backend::round_to_half).
void round_to_half(cudaStream_t s, float* x, int64_t n);
// Backend::im2col over x (T rows of C).
struct Im2col {
    int kernel, stride, padding;
};
void im2col(cudaStream_t s, const float* x, int64_t C, int64_t T, const Im2col& conv,
            int64_t out_cols, int64_t out_rows, float* out);
// out[r][ids[j]] = src[r][j], fill elsewhere (Backend::expand_columns; ids ascending).
void expand_columns(cudaStream_t s, const float* src, int64_t src_cols, const int32_t* ids,
                    float fill, int64_t cols, int64_t rows, float* out);

// The verify passes of backend/vulkan/shaders/decode.comp. Pointers are null when unused;
// scratch holds decode_scratch_words() 32-bit words.
struct DecodeLaunch {
    const float* target = nullptr;
    const float* draft = nullptr;
    const int32_t* drafts = nullptr;
    int32_t* result = nullptr;
    int32_t* token = nullptr;
    uint32_t* scratch = nullptr;
    uint32_t V = 0, batch = 1, gamma = 0, top_k = 0, stream = 0, step = 0, row_offset = 0;
    uint64_t seed = 0;
    float inv_t = 1.0f, top_p = 1.0f;
    bool greedy = false, filtered = false;
};
size_t decode_scratch_words(const DecodeLaunch& d);
void verify(cudaStream_t s, const DecodeLaunch& d);

// A mask program on the rows of a speculative step, in place
// (backend/vulkan/shaders/mask_logits.comp, Backend::mask_logits): a block per row. The words
// travel by value, so a launch keeps the words it was given whatever the host does next.
struct MaskLaunch {
    float* logits = nullptr;          // rows x V, read and written
    const int32_t* drafts = nullptr;  // first_row + rows - 1 tokens
    float* log_sum_exp = nullptr;     // one per row, or null
    uint32_t V = 0, rows = 0, first_row = 0;
    int32_t words[shared::kMaskProgramWords] = {};  // sampling/mask_program.h: program_words
};
void mask_logits(cudaStream_t s, const MaskLaunch& t);

}  // namespace specula::cuda
