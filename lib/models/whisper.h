// Whisper (encoder-decoder speech recognition), written once against the backend interface.
// The encoder: two convolutions of kernel 3 (the second of stride 2) with GELU, sinusoidal
// positions, pre-LN transformer blocks, a final LayerNorm. The decoder: learned positions,
// causal self-attention over a KV cache, cross-attention over keys and values computed once
// per audio window, a tied output head. Weights come from whisper.cpp's model files.
#pragma once

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "audio/mel.h"
#include "backend/backend.h"
#include "decode/decoder.h"
#include "format/whisper_ggml.h"
#include "platform/mapped_file.h"

namespace specula {

// The languages of the multilingual models, in token order (whisper.cpp's g_lang, OpenAI's
// tokenizer.LANGUAGES): language i is token WhisperTokens::sot + 1 + i.
extern const std::array<std::string_view, 100> kWhisperLanguages;
int whisper_language_index(std::string_view code);  // -1 when unknown

// The special tokens past the text tokens, whose ids depend on the vocabulary's size as
// whisper.cpp derives them: 51864 tokens (.en models), 51865 (multilingual, 99 languages),
// 51866 (large-v3, 100 languages).
struct WhisperTokens {
    int32_t eot = 0, sot = 0, translate = 0, transcribe = 0, solm = 0, prev = 0, nosp = 0,
            no_timestamps = 0, timestamp_begin = 0;
    int n_languages = 0;
    bool multilingual = false;
    int32_t language(int index) const { return sot + 1 + index; }
    bool is_timestamp(int32_t t) const { return t >= timestamp_begin; }
    static WhisperTokens of(int n_vocab);
};

class WhisperModel {
  public:
    using Progress = std::function<bool(float)>;  // false cancels
    // Weights of a type the backends cannot run are SPECULA_ERR_UNSUPPORTED naming the tensor; a
    // file without weights (a header-only test file) is SPECULA_ERR_FORMAT.
    static Status load(Backend& backend, std::unique_ptr<MappedFile> file, const Progress& progress,
                       std::unique_ptr<WhisperModel>* out);

    const WhisperHparams& hparams() const { return hparams_; }
    const WhisperTokens& tokens() const { return tokens_; }
    const audio::MelFilters& mel_filters() const { return filters_; }
    // A token's text (bytes; empty for the special tokens).
    std::string_view token_text(int32_t id) const;
    Backend& backend() const { return backend_; }
    GgmlType weight_type() const { return weight_type_; }
    uint64_t n_params() const { return n_params_; }
    // Whether the other model's encoder is this one's (a Distil-Whisper draft's): tensor for
    // tensor, 16 rows spread over each matrix (all of a vector), byte for byte where both store
    // it in the same type, and otherwise the same weights up to their rounding (a draft
    // quantized more coarsely than its target). Then one encoder run serves both decoders; the
    // draft decodes from the target's encoding. Reads a few pages of each file, not the
    // encoder's whole (which the backend no longer reads once it holds its own copy).
    bool same_encoder(const WhisperModel& other) const;

    // Makes this model a draft that proposes only `tokens` and the tokens from <|endoftext|> on
    // (the special tokens and timestamps), as FR-Spec does with the tokens a corpus uses most:
    // its output projection reads those rows of the token embedding instead of all n_vocab, and
    // its logits of every other token are -infinity. Verification keeps the target's
    // distribution whatever the subset; a smaller one only costs acceptance. Ids out of range
    // or no text token are SPECULA_ERR_INVALID_ARGUMENT; only once, before any context of the
    // model exists. Such a model is no target: its distribution is not the file's.
    Status restrict_output(std::span<const int32_t> tokens);
    // The rows of the output projection: n_vocab, or fewer after restrict_output().
    int32_t output_rows() const { return head_rows_ > 0 ? head_rows_ : hparams_.n_vocab; }
    bool output_restricted() const { return head_rows_ > 0; }
    // The encoder's weights are uploaded by the model's first context made to transcribe
    // (specula_asr_context_create) or its first own encoding, not by load(): a draft that
    // decodes from its target's encoding (same_encoder()) never holds them, ~0.7 GB of a
    // Distil-Whisper large draft's 0.8 GB in Q8_0. Out of memory here leaves the model as it
    // was; the next call tries again.
    Status load_encoder() const;
    bool encoder_loaded() const { return encoder_.loaded; }
    // SPECULA_ERR_INVALID_ARGUMENT for a restricted model, which only proposes: its
    // distribution is not the file's, so it transcribes nothing as a target.
    Status check_target() const {
        return output_restricted() ? InvalidArgument(
                                         "a draft whose output is restricted to some "
                                         "tokens transcribes nothing alone")
                                   : Status::Ok();
    }

  private:
    friend class WhisperContext;
    struct Linear {
        Tensor w, b;  // b: none for the attention keys
    };
    struct Block {
        Tensor attn_ln_w, attn_ln_b;
        Linear q, k, v, o;
        Tensor cross_ln_w, cross_ln_b;  // decoder blocks only
        Linear cq, ck, cv, co;
        Tensor mlp_ln_w, mlp_ln_b;
        Linear mlp0, mlp2;
    };
    // The encoder's tensors: their shapes from load(), their buffers from load_encoder().
    struct Encoder {
        Linear conv1, conv2;
        Tensor pos, ln_w, ln_b;
        std::vector<Block> blocks;
        // What load_encoder() uploads, and into which tensor.
        struct Upload {
            std::string name;
            Tensor* tensor;
            WeightUse use;
        };
        std::vector<Upload> uploads;
        std::vector<std::unique_ptr<Buffer>> buffers;
        bool loaded = false;
    };
    explicit WhisperModel(Backend& backend) : backend_(backend) {}
    // Uploads tensor `name` (checked by load()) as *t, its buffer into `buffers`.
    Status upload(const std::string& name, WeightUse use, Tensor* t,
                  std::vector<std::unique_ptr<Buffer>>* buffers) const;

    Backend& backend_;
    std::unique_ptr<MappedFile> file_;
    WhisperGgmlFile ggml_;
    std::vector<std::unique_ptr<Buffer>> buffers_;
    // conv1's rows padded to whole blocks, when they are not (host memory its buffer may read)
    mutable std::vector<uint8_t> conv1_padded_;
    WhisperHparams hparams_;
    WhisperTokens tokens_;
    audio::MelFilters filters_;
    GgmlType weight_type_ = GgmlType::kF32;
    uint64_t n_params_ = 0;
    mutable Encoder encoder_;
    std::vector<Block> dec_;
    Tensor dec_pos_, token_embd_, dec_ln_w_, dec_ln_b_;
    // restrict_output(): the kept rows of token_embd_ (a host copy, where the backend reads it),
    // their matrix, and their ids (I32, ascending).
    int32_t head_rows_ = 0;
    std::vector<uint8_t> head_bytes_;
    Tensor head_, head_ids_;
    mutable bool has_contexts_ = false;
};

// One transcription's state on the backend: the encoder's activations, every decoder layer's
// cross-attention keys and values of the current window, and the decoder's self-attention
// cache (n_text_ctx positions). Its decoder is a Decoder once a window is encoded.
class WhisperContext final : public Decoder {
  public:
    // max_logit_rows: how many rows a forward can return logits for (the cache's length of
    // tokens can always be fed; logits of more rows than this are refused).
    static Status create(const WhisperModel& model, int max_logit_rows,
                         std::unique_ptr<WhisperContext>* out);

    const WhisperModel& model() const { return model_; }
    // The mel frames one window holds: 2 * n_audio_ctx (3000 for 30 s).
    int window_frames() const { return 2 * model_.hparams().n_audio_ctx; }

    // Runs the encoder over the window_frames() frames of mel from `first` and computes every
    // decoder layer's cross K/V. Past the audio the window holds what the mel holds there, the
    // log-mel of the silence audio::log_mel appends, as whisper.cpp and OpenAI's
    // log_mel_spectrogram(pad_or_trim(audio)) give a model (OpenAI's transcribe.py pads the
    // mel with 0 instead); frames past the mel's end are 0. Forgets the decoder's cache.
    // detect_language() needs an encoded window.
    Status encode(const audio::LogMel& mel, int first);
    // The same, run only when this decoder is first used (prepare() or record()) on that
    // window: a draft that the γ policy leaves idle in a window costs nothing there. `mel`
    // must outlive that use, or this context's next encode.
    Status encode_later(const audio::LogMel& mel, int first);
    // Drops a window encode_later() left pending (its mel is about to go).
    void forget_later() { later_mel_ = nullptr; }
    // Whether `target`'s encoder is this model's (WhisperModel::same_encoder), compared once per
    // target model (its encoder's bytes, up to gigabytes for large models) and then remembered.
    bool shares_encoder_with(const WhisperModel& target) const;
    // Takes the window `source` encoded last (a context of a model with the same encoder, on
    // the same backend: shares_encoder_with) and computes this decoder's cross K/V from it,
    // without running the encoder again. Forgets the decoder's cache.
    Status encode_shared(const WhisperContext& source);
    // The same, computed only when this decoder is first used (prepare() or record()) on that
    // window: a draft that the γ policy leaves idle in a window costs nothing there. Using it
    // after `source` has encoded another window is SPECULA_ERR_INVALID_ARGUMENT; `source` must
    // outlive that use, or this context's next encode (the C API owns both in one context).
    Status encode_shared_later(const WhisperContext& source);
    Status prepare() override;
    // The encoder's output of the last encode(): n_audio_ctx rows of n_audio_state (tests).
    Tensor encoder_output() const { return enc_out_; }

    Backend& backend() const override { return model_.backend(); }
    int n_vocab() const override { return model_.hparams().n_vocab; }
    int n_ctx() const override { return model_.hparams().n_text_ctx; }
    int max_batch() const override { return n_ctx(); }  // logits of max_logit_rows at most
    int n_past() const override { return n_past_; }
    void truncate(int n) override { n_past_ = std::min(n_past_, std::max(0, n)); }
    Status record(const Tensor& ids, bool all_rows) override;
    Tensor input_ids(int first, int count) const override { return id_columns(ids_, first, count); }
    Tensor logits(int rows) const override { return logits_.row_range(0, rows); }
    uint64_t forward_calls() const { return forward_calls_; }

  private:
    explicit WhisperContext(const WhisperModel& model) : model_(model) {}
    void block(const WhisperModel::Block& b, const Tensor& x, int n, bool decoder, int layer);
    Status cross_keys_values(const Tensor& enc_out);

    const WhisperModel& model_;
    std::vector<std::unique_ptr<Buffer>> buffers_;
    int max_logit_rows_ = 0, n_past_ = 0;
    bool encoded_ = false;
    uint64_t windows_encoded_ = 0;  // encode() calls: which window enc_out_ holds
    // encode_shared_later(): the context whose window this one decodes next, and that window
    const WhisperContext* shared_source_ = nullptr;
    uint64_t shared_window_ = 0;
    // encode_later(): the mel and first frame of the window to encode when first used
    const audio::LogMel* later_mel_ = nullptr;
    int later_first_ = 0;
    uint64_t forward_calls_ = 0;
    mutable const WhisperModel* encoder_compared_with_ = nullptr;
    mutable bool shares_encoder_ = false;
    // Encoder: the mel as rows of time, the convolutions' inputs and outputs, a block's work.
    Tensor mel_, cols1_, conv1_out_, cols2_, enc_x_, enc_h_, enc_q_, enc_k_, enc_v_, enc_a_, enc_f_,
        enc_out_;
    std::vector<Tensor> cross_k_, cross_v_, k_cache_, v_cache_;
    // Decoder: ids and positions, then activations of up to n_text_ctx rows.
    Tensor ids_, positions_, x_, pos_rows_, h_, q_, a_, f_, logits_;
    Tensor head_logits_;  // a restricted output's rows (WhisperModel::restrict_output)
};

}  // namespace specula
