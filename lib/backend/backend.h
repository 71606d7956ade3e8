// The one interface every backend implements (docs/DESIGN.md "Backends"). Model code records a
// forward pass as a sequence of ops on tensors and calls flush() once; the cpu
// backend runs each op as it is recorded, a GPU backend appends it to one
// command buffer and submits on flush().
//
// Ops are void: a GPU backend records now and fails later, so the first error
// is kept and returned by flush(). Shapes are the caller's contract; each op
// documents its own.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/device_abi.h"
#include "core/status.h"
#include "format/gguf.h"
#include "sampling/mask_program.h"
#include "sampling/sampling.h"
#include "specula.h"

namespace specula {

// The widest batch whose every column must be bit for bit the column alone (batch invariance):
// a verification forward, the last committed token and up to SPECULA_MAX_GAMMA drafts. A
// backend may multiply wider batches (prompts, Whisper's encoder) in another order.
constexpr int64_t kVerificationColumns = SPECULA_MAX_GAMMA + 1;

class Buffer {
  public:
    virtual ~Buffer() = default;
    virtual size_t size() const = 0;
    // Whether the buffer reads the host memory it was loaded from (the cpu's weights read in
    // place). Where it does not, the model may give that memory's pages back once it is loaded.
    virtual bool reads_host() const { return false; }
};

// How a model reads a weight matrix once it is loaded. kMatmul: only as the whole matrix of
// products (matmul and its fused forms; never by rows, a view at an offset or a download), so
// a backend may keep only the form its kernels multiply by.
enum class WeightUse { kAny, kMatmul };

// A non-owning view of `rows` rows of `cols` elements, row-major, at a byte
// offset in a buffer. Quantized rows hold cols / block_size blocks.
struct Tensor {
    Buffer* buffer = nullptr;
    size_t offset = 0;
    GgmlType type = GgmlType::kF32;
    int64_t cols = 0;
    int64_t rows = 0;

    size_t row_bytes() const;
    size_t bytes() const { return row_bytes() * size_t(rows); }
    Tensor row_range(int64_t first, int64_t count) const;
};

// Speculative verification of `batch` sequences on the device (docs/DESIGN.md "Sampling and random
// numbers"), the arithmetic of sampling/verify.h's verify() bit for bit. With gamma = 0 it samples
// one token per sequence from its single target row, which is how drafts are
// drawn on the device without a host round trip.
struct VerifyArgs {
    Tensor target;  // batch * (gamma + 1) rows of n_vocab F32 logits
    Tensor draft;   // batch * gamma rows (unused when gamma == 0 or greedy)
    Tensor drafts;  // batch * gamma I32 drafted tokens
    int batch = 1;
    int gamma = 0;
    SamplingParams sampling;
    uint32_t step = 0;
    RandomStream stream = RandomStream::kResidual;
    uint32_t row_offset = 0;  // sequence b draws at rows row_offset + b * 256 + c
    // Outputs, each optional (buffer == nullptr): result holds batch * (gamma + 2) I32,
    // per sequence n and then the n + 1 emitted tokens; token holds the last token of each.
    Tensor result;
    Tensor token;
};

// A mask program (sampling/mask_program.h) on the rows of a speculative step, in place: row r
// sees the tokens sampled before the step (state), then drafts[0, first_row + r).
struct MaskArgs {
    Tensor logits;  // rows of n_vocab F32 logits
    Tensor drafts;  // I32: at least first_row + logits.rows - 1 tokens (unused when that is 0)
    int first_row = 0;
    MaskProgram program;
    MaskState state;
    Tensor log_sum_exp;  // optional (buffer == nullptr): F32, one column per row, of the masked row
};

class Backend {
  public:
    virtual ~Backend() = default;

    virtual const specula_device_info& info() const = 0;
    // What a model may ask before it relies on an op: which weight types an op reads, and which
    // composite ops the backend computes in one pass (for the batches it fuses) rather than by
    // the base class's composed default, which every backend has.
    enum class Op : uint8_t {
        kMatmul,        // matmul (and matmul_gated, matmul_rope) of weights of the type
        kGetRows,       // get_rows of a table of the type
        kMatmulGated,   // matmul_gated in one pass
        kMatmulRope,    // matmul_rope in one pass
        kNormedMatmul,  // normed(): the norm applied inside the matmuls that read it
        kMaskLogits,    // mask_logits on the device, adding no host wait (any type)
    };
    // Whether the backend runs `op` on weights of `type` (one of kWeightTypes); a model loader
    // refuses a tensor of another type before anything of it is loaded.
    virtual bool supports(Op op, GgmlType type) const = 0;
    // Whether matmul() multiplies weights of `type` by its inputs quantized to 8 bits per block
    // of 32 (as llama.cpp does, with integer dot products) rather than by the floats, in a
    // batch of `columns` columns: tests compare such products with the cpu's integer kernels.
    virtual bool quantizes_inputs(GgmlType /*type*/, int64_t /*columns*/) const { return false; }
    // Bytes this backend can still allocate, as far as it can tell (0: unknown). What a large
    // allocation made of many buffers (a context's caches) needs is checked against it first,
    // since on a host that overcommits, each buffer succeeds and touching them kills the process.
    virtual uint64_t available_memory() const = 0;
    // fn(begin, end) over chunks that cover [0, n), for the host's own work beside the
    // device's (a spectrogram): the cpu backend shares them among its threads, which are the
    // machine's cores it was given; the others call fn(0, n).
    virtual void parallel_for_host(size_t n, const std::function<void(size_t, size_t)>& fn);

    // Device memory for activations and caches, zero-filled.
    virtual Status allocate(size_t bytes, std::unique_ptr<Buffer>* out) = 0;
    // A weight matrix (rows x cols of `type`) from host memory that outlives the buffer (a
    // model's mapping): a GPU backend copies it; the cpu backend keeps a copy repacked for its
    // integer kernels where it has them and, unless that is all `use` needs, reads the matrix
    // in place too (copies it when it is not 8-byte aligned).
    virtual Status load_weights(std::span<const uint8_t> host, GgmlType type, int64_t cols,
                                int64_t rows, WeightUse use, std::unique_ptr<Buffer>* out) = 0;

    // Host <-> device copies; both happen in order with recorded ops.
    virtual void upload(const Tensor& dst, const void* src) = 0;
    virtual Status download(const Tensor& src, void* dst) = 0;  // waits for recorded work

    // Submits everything recorded and waits for it.
    virtual Status flush() = 0;
    // How many times the host has waited for the device (flush or download).
    virtual uint64_t host_waits() const = 0;

    // Timestamps inside recorded work, to split the time of one submission: mark_time(slot)
    // records when the device reaches this point; seconds_between(a, b) is valid once the
    // device has been waited for. Slots 0..kTimeSlots-1.
    static constexpr int kTimeSlots = 8;
    virtual void mark_time(int slot) = 0;
    virtual double seconds_between(int from, int to) const = 0;

    // ---- ops; F32 activations unless stated

    // out[i] = table[ids[i]] (table of any weight type, ids I32, out F32 with table.cols columns).
    virtual void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out) = 0;
    // out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * weight.
    virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) = 0;
    // A matmul's input: x, or where `norm` is set rms_norm(x, norm, eps), a norm still to be
    // applied. Only a backend's own normed() makes the second kind: one whose matmuls apply
    // the norm as they read x, so it needs no op (nor barrier) of its own; `scratch` (x's
    // shape) is where the norm goes if it is computed on its own after all (apply_norm()).
    struct MatmulInput {
        MatmulInput(const Tensor& input) : x(input) {}  // NOLINT(google-explicit-constructor)
        Tensor x;
        Tensor norm;
        float eps = 0.0f;
        Tensor scratch;
        bool has_norm() const { return norm.buffer != nullptr; }
    };
    // The input rms_norm(x, weight, eps) for the matmuls that follow. By default the norm is
    // computed into out now and they read out; a backend that fuses the norm into its matmuls
    // returns x with the norm pending (out is then its scratch).
    virtual MatmulInput normed(const Tensor& x, const Tensor& weight, float eps, const Tensor& out);
    // out[i][r] = dot(w[r], x[i]), or with Accumulate::kYes out[i][r] += dot(w[r], x[i]) (the
    // same single rounded addition per element, so a residual add needs no op of its own): w is
    // (out_features rows x in_features cols) of any weight type, x is (n x in_features), out
    // (n x out_features). The result of a row does not depend on n (batch invariance,
    // docs/DESIGN.md, "Batch invariance").
    enum class Accumulate : bool { kNo, kYes };
    virtual void matmul(const Tensor& w, const MatmulInput& x, const Tensor& out,
                        Accumulate accumulate) = 0;
    // An activation, alone (activate) or gating a product (device_abi.h's kActivation*).
    enum class Activation : uint32_t {
        kSilu = shared::kActivationSilu,          // SwiGLU (Llama, Qwen, Phi-3)
        kGeluTanh = shared::kActivationGeluTanh,  // GeGLU with GELU's tanh form (Gemma)
        kGeluErf = shared::kActivationGeluErf,    // GELU's exact form (Whisper)
    };
    // out = act(x·w_gateᵀ) * (x·w_upᵀ), the feed-forward's gated product: what matmul(w_gate,
    // x, out), matmul(w_up, x, up) and gated_mul(act, out, up, out) compute, which is the
    // default (up: scratch of out's shape). A backend may compute it in one pass without up;
    // the products are then still summed as matmul() sums them.
    virtual void matmul_gated(Activation act, const Tensor& w_gate, const Tensor& w_up,
                              const MatmulInput& x, const Tensor& out, const Tensor& up);
    // Rotates adjacent pairs (x[2j], x[2j+1]) of the first n_rot dims of every head of row
    // i, in place (GGUF's Q/K layout), by the angle whose cosine and sine are
    // table[positions[i]][2j] and [2j+1]. The table (see rope_table()) is computed once on the
    // host in double precision, so every backend rotates by the same float values.
    virtual void rope(const Tensor& x, const Tensor& positions, const Tensor& table, int head_dim,
                      int n_rot) = 0;
    // The arguments of rope() besides x.
    struct Rope {
        Tensor positions, table;
        int head_dim = 0, n_rot = 0;
    };
    // matmul(w, x, out) and then rope(out, ...): the default is the two ops; a backend may
    // rotate the products before it writes them (the same floats: rope() rounds each
    // rotation alike).
    virtual void matmul_rope(const Tensor& w, const MatmulInput& x, const Tensor& out,
                             const Rope& rope);
    // dst = src (F32), same shape.
    virtual void copy(const Tensor& src, const Tensor& dst) = 0;
    // Grouped-query attention: out[i] = softmax(s(q[i], k[t])) . v over the keys t row i sees,
    // per head (query head h uses key/value head h / (n_head / n_head_kv)), where the score
    // s = scale * q . k, or with a soft cap c > 0, c * tanh(scale * q . k / c).
    struct Attention {
        Tensor q;     // n rows of n_head * head_dim
        Tensor k, v;  // rows of n_head_kv * head_dim (F32): a cache, or keys computed apart
        Tensor out;   // like q
        int n_head = 0, n_head_kv = 0, head_dim = 0;
        float scale = 0.0f;
        // n_keys == 0: causal; query row i sits at position pos0 + i and sees keys 0 .. pos0 + i
        // (a decoder's self-attention over its cache). n_keys > 0: every row sees keys
        // 0 .. n_keys - 1 (an encoder's attention, a decoder's cross-attention).
        int pos0 = 0;
        int n_keys = 0;
        // Causal rows only, > 0: row i sees its last `window` keys, from pos0 + i - window + 1
        // (sliding-window attention, as llama.cpp masks it: Phi-3, Gemma's local layers).
        int window = 0;
        // > 0: scores are capped smoothly at ±soft_cap (Gemma 2's attention logit soft-capping).
        float soft_cap = 0.0f;
        // Every key and value is exact in F16 (round_to_half): a backend may read them from a
        // copy in F16, which gives the same floats at half the bytes (a decoder's
        // cross-attention, read by every token).
        bool half_exact = false;
        int keys_seen(int64_t row) const { return n_keys > 0 ? n_keys : pos0 + int(row) + 1; }
        // The first key row i sees; it sees keys first_key(i) .. keys_seen(i) - 1.
        int first_key(int64_t row) const {
            return n_keys == 0 && window > 0 ? std::max(0, keys_seen(row) - window) : 0;
        }
    };
    virtual void attention(const Attention& a) = 0;
    // out = act(gate) * up, element-wise (out may be gate).
    virtual void gated_mul(Activation act, const Tensor& gate, const Tensor& up,
                           const Tensor& out) = 0;
    // The ops of pre-LN transformers with biases (Whisper's encoder and decoder):
    // out[i] = (x[i] - mean(x[i])) / sqrt(var(x[i]) + eps) * weight + bias, the variance the
    // population's (torch.nn.LayerNorm).
    virtual void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                            const Tensor& out) = 0;
    // out = act(x), element-wise (out may be x): Whisper's GELU is the exact form
    // (torch.nn.GELU's, which it was trained with; whisper.cpp uses the tanh approximation).
    virtual void activate(Activation act, const Tensor& x, const Tensor& out) = 0;
    // x[i] += bias for every row i, in place, where bias is one row of x.cols floats; or
    // x[i] += bias[i] where bias has x's shape (positional embeddings added to a batch).
    virtual void add_bias(const Tensor& x, const Tensor& bias) = 0;
    // x *= factor, element-wise, in place (Gemma's embeddings scaled by sqrt(n_embd)).
    virtual void scale(const Tensor& x, float factor) = 0;
    // x = the IEEE half nearest x (ties to even; from 65520 on, infinity), element-wise, in place,
    // as floats (Whisper's cross-attention keys and values, which whisper.cpp keeps in F16).
    virtual void round_to_half(const Tensor& x) = 0;
    // x = cap * tanh(x / cap), element-wise, in place (Gemma 2's final logit soft-capping).
    virtual void soft_cap(const Tensor& x, float cap) = 0;
    // A 1-D convolution's shape: kernel taps, stride and zero padding on each side.
    struct Convolution {
        int kernel = 3;
        int stride = 1;
        int padding = 1;
        // Output rows of a convolution over `rows` input rows.
        int64_t out_rows(int64_t rows) const { return (rows + 2 * padding - kernel) / stride + 1; }
    };
    // The inputs of a convolution over the rows of x (T rows of C channels) as rows, so that the
    // convolution is a matmul with its weights: out row t holds x[stride * t + k - padding][c]
    // at column kernel * c + k (0 outside x), the layout of PyTorch's and whisper.cpp's conv1d
    // weights (out_channels x C x kernel); columns from kernel * C to out.cols are 0 (a matmul
    // may want whole blocks). out: conv.out_rows(T) rows.
    virtual void im2col(const Tensor& x, const Convolution& conv, const Tensor& out) = 0;
    // out[r][ids[j]] = src[r][j], and fill in the other columns: a draft's logits over a subset
    // of the vocabulary (src, ids.cols columns) as rows of the whole vocabulary (out). ids: I32,
    // ascending, each < out.cols.
    virtual void expand_columns(const Tensor& src, const Tensor& ids, float fill,
                                const Tensor& out) = 0;
    // See VerifyArgs. The vocabulary size is target.cols (at most det::kMaxVocab).
    virtual void verify(const VerifyArgs& args) = 0;
    // See MaskArgs. This default runs the program on the host: it waits for the device, reads
    // the rows and writes them back.
    virtual void mask_logits(const MaskArgs& args);

  protected:
    // x as a plain tensor: a pending norm is computed into its scratch.
    Tensor apply_norm(const MatmulInput& x);
};

// n_ctx rows of n_rot floats: cos and sin of pos * freq_scale * base^(-2j / n_rot) /
// freq_factors[j] for every position and pair j (freq_factors empty: all 1), times magnitude:
// linear scaling is freq_scale = 1 / factor, Llama 3's frequency-dependent scaling the factors a
// GGUF file's rope_freqs tensor holds, LongRoPE (Phi-3) its short or long factors and its
// attention factor as the magnitude, as llama.cpp reads them.
std::vector<float> rope_table(int n_ctx, int n_rot, float base, float freq_scale = 1.0f,
                              std::span<const float> freq_factors = {}, float magnitude = 1.0f);

// The device that params asks for (device_index, else a device_name substring, else the
// first) among a backend's devices, best first.
Status choose_device(std::span<const specula_device_info> devices,
                     const specula_backend_params& params, const char* api, size_t* index);

// Ok where `backend` computes with `type`; else SPECULA_ERR_UNSUPPORTED naming the tensor,
// its type and the types the backend runs.
Status check_weight_type(const Backend& backend, const std::string& tensor, GgmlType type,
                         Backend::Op op = Backend::Op::kMatmul);

}  // namespace specula
