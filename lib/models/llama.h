// Llama-family decoder (RMSNorm, RoPE, grouped-query attention, a gated FFN, tied or separate
// output head), written once against the backend interface: Llama, Qwen2/3, Phi-3, Gemma 2/3
// and Granite are this one forward with their options.
#pragma once

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "decode/decoder.h"
#include "format/gguf.h"
#include "platform/mapped_file.h"
#include "tokenizer/tokenizer.h"

namespace specula {

struct LlamaConfig {
    int n_vocab = 0;
    int n_ctx_train = 0;
    int n_embd = 0;
    int n_layer = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int n_ff = 0;
    int head_dim = 0;
    int n_rot = 0;
    float rms_eps = 1e-5f;
    float rope_base = 10000.0f;
    float rope_freq_scale = 1.0f;          // 1 / rope.scaling.factor (linear scaling)
    std::vector<float> rope_freq_factors;  // rope_freqs.weight (Llama 3.1+), else empty
    // LongRoPE (Phi-3.5, Phi-3 128k): factors for contexts up to n_ctx_orig and beyond it, and
    // the magnitude of the rotations (rope.scaling.attn_factor); empty and 1 otherwise.
    std::vector<float> rope_short_factors, rope_long_factors;
    int n_ctx_orig = 0;
    float rope_magnitude = 1.0f;
    // Keys a position attends to (itself and the sliding_window - 1 before it; 0: all), in
    // every layer, or with global_every > 0 in all but every global_every-th (Gemma 3: 5 local
    // layers, then a global one; Gemma 2: one of each), whose rotations take rope_base_local,
    // unscaled, where it is > 0 (Gemma 3's; 0: the global layers' table).
    int sliding_window = 0;
    int global_every = 0;
    float rope_base_local = 0.0f;
    std::string architecture;  // general.architecture (LlamaModel::kArchitectures)
    bool qkv_bias = false;     // qwen2: biases on the q, k and v projections
    bool qk_norm = false;      // qwen3, gemma3: an RMS norm of each head of q and k
    // gemma2, gemma3: an RMS norm of the attention's and the feed-forward's outputs before each
    // residual add (post_attention_norm, post_ffw_norm).
    bool post_norms = false;
    // The embeddings times this (gemma2, gemma3: sqrt(n_embd); granite: embedding_scale); the
    // attention's and the feed-forward's outputs times residual_scale before each residual add
    // (granite; 0: not scaled), and the logits divided by logit_scale (granite; 0: not).
    float embedding_scale = 1.0f, residual_scale = 0.0f, logit_scale = 0.0f;
    Backend::Activation activation = Backend::Activation::kSilu;  // the feed-forward's gate
    float attention_scale = 0.0f;                                 // of q . k
    // gemma2: attention scores and the logits capped smoothly at ± these (0: not capped).
    float attn_soft_cap = 0.0f, final_soft_cap = 0.0f;
    // Whether a layer's outputs go through scratch before the residual add (post-norms or a
    // residual scale); else each add is folded into its product.
    bool residual_through_scratch() const { return post_norms || residual_scale > 0; }
    int q_dim() const { return n_head * head_dim; }
    int kv_dim() const { return n_head_kv * head_dim; }
    // Layer l's sliding window (0: it sees every key before it).
    int window_of(int l) const {
        return global_every > 0 && (l + 1) % global_every == 0 ? 0 : sliding_window;
    }
    // Whether layer l rotates by the local rope table (rope_base_local).
    bool local_rope(int l) const { return rope_base_local > 0.0f && window_of(l) > 0; }
};

class LlamaModel {
  public:
    // general.architecture of the GGUF files this model reads: Llama's, Qwen2's (biases on q, k,
    // v; q and k rotated as GPT-NeoX does, which the loader turns into Llama's pairs by
    // reordering their rows), Qwen3's (q and k head norms), Phi-3's (q, k and v in one tensor,
    // gate and up in one, read as separate matrices; NeoX's rotation; LongRoPE; a sliding
    // window) and Gemma 3's (GeGLU, scaled embeddings, q/k head norms and post-norms, local
    // sliding-window layers between global ones), Gemma 2's (no head norms; soft-capped
    // attention scores and logits; local and global layers in turn) and Granite's (Llama's
    // forward with its embeddings, residual updates, attention scores and logits scaled).
    static constexpr std::array<const char*, 7> kArchitectures = {
        "llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "granite"};

    static bool is_architecture(std::string_view arch) {
        return std::find(kArchitectures.begin(), kArchitectures.end(), arch) !=
               kArchitectures.end();
    }
    static std::string architecture_names();  // "llama, qwen2, ..."

    using Progress = std::function<bool(float)>;  // false cancels
    static Status load(Backend& backend, std::unique_ptr<MappedFile> file, const Progress& progress,
                       std::unique_ptr<LlamaModel>* out);

    const LlamaConfig& config() const { return config_; }
    const Tokenizer& tokenizer() const { return *tokenizer_; }
    Backend& backend() const { return backend_; }
    const std::string& name() const { return name_; }
    uint64_t n_params() const { return n_params_; }
    uint64_t weight_bytes() const { return weight_bytes_; }
    GgmlType dominant_weight_type() const { return dominant_type_; }

  private:
    friend class LlamaContext;
    friend class LlamaBatch;
    struct Layer {
        Tensor attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
        Tensor bq, bk, bv;                     // qwen2 only (no buffer otherwise)
        Tensor q_norm, k_norm;                 // qwen3, gemma3: head_dim weights
        Tensor post_attn_norm, post_ffn_norm;  // gemma2, gemma3
    };
    explicit LlamaModel(Backend& backend) : backend_(backend) {}

    Backend& backend_;
    std::unique_ptr<MappedFile> file_;
    std::vector<std::vector<uint8_t>> reordered_;  // NeoX's q and k rows (neox_rows_as_pairs)
    std::vector<std::unique_ptr<Buffer>> buffers_;
    LlamaConfig config_;
    std::unique_ptr<Tokenizer> tokenizer_;
    std::string name_;
    Tensor token_embd_, output_norm_, output_;
    std::vector<Layer> layers_;
    uint64_t n_params_ = 0, weight_bytes_ = 0;
    GgmlType dominant_type_ = GgmlType::kF32;
};

// The activations of a forward of up to `rows` positions: a context's own, or a LlamaBatch's
// shared by the contexts it steps together.
struct LlamaActivations {
    Tensor ids, positions, x, norm, q, attn, gate, up, logits, post;
    // Several sequences' keys and values, before each goes to its own cache (a context computes
    // its own straight into its cache rows and has none).
    Tensor k, v;
    int rows = 0;
};

// One sequence's state on the backend: the KV cache and the activations of a
// batch of up to max_batch positions.
class LlamaContext final : public Decoder {
  public:
    // Refuses with OUT_OF_MEMORY what the backend cannot hold before allocating any of it, and
    // logs a warning when n_ctx exceeds the model's training context.
    static Status create(const LlamaModel& model, int64_t n_ctx, int max_batch,
                         std::unique_ptr<LlamaContext>* out);

    const LlamaModel& model() const { return model_; }
    Backend& backend() const override { return model_.backend(); }
    int n_vocab() const override { return model_.config().n_vocab; }
    int n_ctx() const override { return n_ctx_; }
    int max_batch() const override { return max_batch_; }
    int n_past() const override { return n_past_; }
    uint64_t forward_calls() const { return forward_calls_; }
    // Bytes of backend memory the context's caches and activations hold.
    uint64_t memory_bytes() const { return memory_bytes_; }
    uint64_t positions_evaluated() const { return positions_evaluated_; }
    void truncate(int n) override { n_past_ = std::min(n_past_, std::max(0, n)); }

    Status record(const Tensor& ids, bool all_rows) override;
    Tensor input_ids(int first, int count) const override {
        return id_columns(acts_.ids, first, count);
    }
    Tensor logits(int rows) const override { return acts_.logits.row_range(0, rows); }

  private:
    friend class LlamaBatch;
    explicit LlamaContext(const LlamaModel& model) : model_(model) {}

    // `rows` positions of one context, from its n_past on.
    struct Segment {
        LlamaContext* ctx;
        int rows;
    };
    // The forward of every segment's positions, the ids.cols tokens of `ids` in segment order,
    // through the activations `a` (one matmul per weight for all of them): each context's cache
    // gets its positions and its logits() the rows (every row of its segment when all_rows,
    // else the last). The segments' contexts share the first one's rotation tables (one n_ctx).
    static Status record_segments(const LlamaModel& model, const LlamaActivations& a,
                                  const Tensor& ids, std::span<const Segment> segments,
                                  bool all_rows);

    const LlamaModel& model_;
    int n_ctx_ = 0, max_batch_ = 0, n_past_ = 0;
    uint64_t forward_calls_ = 0, positions_evaluated_ = 0;
    uint64_t memory_bytes_ = 0;
    std::vector<std::unique_ptr<Buffer>> buffers_;
    std::vector<Tensor> k_cache_, v_cache_;
    Tensor rope_table_, rope_table_local_;  // rope_table_local_: Gemma's local layers' rotations
    LlamaActivations acts_;
};

// Forwards of several sequences of one model in one pass (concurrent sessions stepped together):
// each weight is read once for all of them, which on a memory-bound device costs little more
// than one sequence's forward.
class LlamaBatch {
  public:
    // Activations for up to max_rows positions; OUT_OF_MEMORY before allocating any of them.
    static Status create(const LlamaModel& model, int max_rows, std::unique_ptr<LlamaBatch>* out);
    int max_rows() const { return acts_.rows; }
    // Evaluates tokens[i] at contexts[i]'s next position for every i, each context at most once,
    // all of this batch's model and of one n_ctx: each context's cache and logits(1) are then
    // what its own record() of the token leaves, bit for bit where the backend's matmul is batch
    // invariant up to max_rows() columns (every backend up to kVerificationColumns).
    Status record(std::span<LlamaContext* const> contexts, std::span<const int32_t> tokens);

  private:
    explicit LlamaBatch(const LlamaModel& model) : model_(model) {}
    const LlamaModel& model_;
    std::vector<std::unique_ptr<Buffer>> buffers_;
    LlamaActivations acts_;
};

}  // namespace specula
