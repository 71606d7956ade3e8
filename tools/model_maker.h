// Writes Llama-architecture GGUF files and whisper.cpp model files with random weights of
// chosen shapes and a real tokenizer (and mel filters) copied from another file: the models
// tests and benchmarks run on when no trained weights are at hand.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "format/gguf.h"
#include "format/whisper_ggml.h"

namespace specula {

struct RandomLlamaSpec {
    std::string vocab_path;  // a GGUF with tokenizer.ggml.* metadata
    // "llama", or "qwen2": biases on the q, k and v projections, and q and k rotated as
    // GPT-NeoX does (each head's first half paired with its second), as Qwen2's GGUF files are.
    // "qwen3": per-head RMS norms of q and k before the rotation (NeoX's, as Qwen2), no biases.
    // "phi3": q, k and v in one tensor (attn_qkv), the gate and up products in one (ffn_up,
    // the gate's rows first), NeoX's rotation, and the sliding window key.
    // "gemma3": q and k head norms (as qwen3), post_attention_norm and post_ffw_norm, the
    // sliding window key (the local layers'), rope base 10^6 (the global layers'), eps 1e-6.
    // "gemma2": post_attention_norm and post_ffw_norm, the sliding window key and the soft caps.
    std::string arch = "llama";
    int head_dim = 0;  // 0: n_embd / n_head; else written as attention.key_length/value_length
    int n_embd = 256;
    int n_layer = 2;
    int n_head = 4;
    int n_head_kv = 2;
    int n_ff = 512;
    int n_ctx = 512;
    int n_vocab = 0;  // 0: the vocabulary's size; smaller truncates it (tests only)
    GgmlType weight_type = GgmlType::kQ8_0;
    bool tied_output = false;
    float rope_scale = 0.0f;   // > 0: rope.scaling.type linear with this factor
    bool llama3_rope = false;  // a rope_freqs tensor as Llama 3.2's conversion writes it
    // phi3 only: LongRoPE as Phi-3.5's conversion writes it: rope_factors_short/long tensors,
    // the original context n_ctx / 4 (contexts beyond it take the long factors) and the
    // attention factor sqrt(1 + ln 4 / ln(n_ctx / 4)).
    bool longrope = false;
    int n_rot = 0;           // rotated dimensions of a head (0: all; Phi-4-mini rotates 3/4)
    int sliding_window = 0;  // phi3: the sliding_window key (0: n_ctx); gemma3 (0: 512), gemma2
                             // (0: 4096)
    float attn_soft_cap = 50.0f, final_soft_cap = 30.0f;  // gemma2's keys
    // granite's keys (Granite 3.1 2B's values)
    float embedding_scale = 12.0f, residual_scale = 0.22f, attention_scale = 0.015625f,
          logit_scale = 8.0f;
    // > 0: the output head's weights are drawn with head_scale / sqrt(n_embd), logits with a
    // standard deviation of about head_scale (how peaked the model's distributions are), a tied
    // head's (the embedding's) too. 0: 4 for a separate head; a tied one keeps the embedding's
    // unit weights.
    float head_scale = 0.0f;
    // The output head's row π(x) is the embedding's row x, for one random cycle π through the
    // vocabulary's ordinary tokens (the head written apart from the embedding, a tied shape's
    // too): where the residual stream leans towards its token's embedding, as a random model's
    // does, greedy text steps x -> π(x) instead of repeating x, so it reads new tokens for
    // thousands of steps instead of falling into a loop of one token (a benchmark device's text:
    // a loop is predicted by any draft, or by none, over a whole run).
    bool successor_head = false;
    uint64_t seed = 1;
    int threads = 1;  // drawing large matrices: the same weights on any number
    std::string name = "random-llama";
    // A draft written beside the target (draft_path not empty), a benchmark device whose
    // acceptance rate is dialled, not a model: the target's first draft_layers layers with its
    // embedding, final norm and head. The target's later layers add their attention and
    // feed-forward outputs scaled by late_scale, so 0 makes the two the same function and
    // larger values make them agree less (docs/benchmarks.md has the scales of some rates).
    std::string draft_path;
    int draft_layers = 0;
    float late_scale = 1.0f;
};

// Released models' shapes (no weights): "llama3.2-1b", "llama3.2-3b", "qwen2.5-0.5b",
// "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "llama3.1-8b", "phi3.5-mini", "gemma3-270m",
// "gemma3-1b", "gemma2-2b" set the
// architecture, widths, layers, heads and head width, the tied head and Llama 3's rope factors
// or Phi-3.5's LongRoPE of `spec`.
Status apply_released_shape(const std::string& name, RandomLlamaSpec* spec);

Status write_random_llama(const RandomLlamaSpec& spec, const std::string& path);

struct WhisperFileSpec {
    // A whisper.cpp model file (whisper.cpp's for-tests-ggml-*.bin: header, filters and
    // vocabulary only) whose mel filters and vocabulary are copied; its n_vocab and n_mels must
    // be the shape's. Empty: stand-in filters and tokens named by their ids (loader tests).
    std::string header_path;
    WhisperHparams hparams;                 // the shape (whisper_shape()); ftype from weight_type
    GgmlType weight_type = GgmlType::kF16;  // the matrices' (F32, F16, Q8_0, Q4_0, ...)
};
struct RandomWhisperSpec : WhisperFileSpec {
    uint64_t seed = 1;
    int threads = 1;  // as RandomLlamaSpec's
    // A Distil-Whisper-shaped draft written beside the target (draft_path not empty), a
    // benchmark device whose agreement is dialled, not a model: the target's encoder byte for
    // byte, its embeddings and final norm, and draft_decoder_layers decoder blocks, the
    // target's first ones and its last. The target's other decoder blocks add their attention,
    // cross-attention and MLP outputs scaled by late_scale, so 0 makes the two the same
    // function and larger values make them agree less.
    std::string draft_path;
    int draft_decoder_layers = 2;
    // The draft's matrix type, when not the target's (a draft quantized more coarsely: its
    // encoder is then the target's up to rounding, which WhisperModel::same_encoder accepts).
    std::optional<GgmlType> draft_weight_type;
    float late_scale = 1.0f;
    // > 0: the token embedding (also the output projection) drawn S times wider, so that the
    // logits are about S wide, as a trained model's are peaked; 0: 1 wide (over 51,864 tokens,
    // any change of the decoder moves the argmax).
    float head_scale = 0.0f;
    // > 0: the decoder's positional embedding rows drawn position_scale * sqrt(n_text_state)
    // long, position_scale times a decoder block's output: the residual stream, and so the
    // argmax, follows the position, and the greedy text does not fall into the loops that a
    // random decoder's self-attention makes (a benchmark device's text, not speech).
    float position_scale = 0.0f;
};
// The data of one tensor in the type the file gives it (whisper_tensor_specs' order).
using WhisperTensorSource =
    std::function<Status(const WhisperTensorSpec&, GgmlType, std::vector<uint8_t>*)>;
// Writes the file as whisper.cpp's converter and quantizer do (quantized types: ftype + 2000,
// the quantization version; convolutions F16 unless the weights are F32).
Status write_whisper(const WhisperFileSpec& spec, const WhisperTensorSource& source,
                     const std::string& path);
// Whisper's released shapes: tiny, base, small, medium (multilingual: 51865 tokens; english:
// the .en models' 51864), large (large-v2's: 1280 wide, 32 + 32 blocks) and large-v3 (128 mel
// bands, 51866 tokens).
Status whisper_shape(const std::string& name, bool english, WhisperHparams* out);
// Random weights (the encoder's positions the sinusoids Whisper computes).
Status write_random_whisper(const RandomWhisperSpec& spec, const std::string& path);
Status parse_weight_type(const std::string& name, GgmlType* out);

}  // namespace specula
