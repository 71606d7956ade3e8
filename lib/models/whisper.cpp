#include "models/whisper.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "format/quant.h"
#include "models/buffer_plan.h"

namespace specula {

const std::array<std::string_view, 100> kWhisperLanguages = {
    "en", "zh", "de", "es",  "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv",
    "it", "id", "hi", "fi",  "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no",
    "th", "ur", "hr", "bg",  "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr",
    "az", "sl", "kn", "et",  "mk", "br", "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw",
    "gl", "mr", "pa", "si",  "km", "sn", "yo", "so", "af", "oc", "ka", "be", "tg", "sd", "gu",
    "am", "yi", "lo", "uz",  "fo", "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl",
    "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su", "yue"};

int whisper_language_index(std::string_view code) {
    for (size_t i = 0; i < kWhisperLanguages.size(); ++i)
        if (kWhisperLanguages[i] == code) return int(i);
    return -1;
}

WhisperTokens WhisperTokens::of(int n_vocab) {
    // The English-only layout, shifted as whisper.cpp shifts it (whisper_model_load).
    WhisperTokens t{50256, 50257, 50357, 50358, 50359, 50360, 50361, 50362, 50363, 0, false};
    t.multilingual = n_vocab >= 51865;
    t.n_languages = n_vocab - 51765 - (t.multilingual ? 1 : 0);
    if (t.multilingual) {
        ++t.eot;
        ++t.sot;
        const int shift = t.n_languages - 98;
        for (int32_t* id : {&t.translate, &t.transcribe, &t.solm, &t.prev, &t.nosp,
                            &t.no_timestamps, &t.timestamp_begin})
            *id += shift;
    }
    return t;
}

namespace {

// Two roundings of the same weights differ by their rounding: 0.04-0.1 of the weights' RMS
// for Gaussian rows (Q5_0 against Q8_0 to Q4_0 against Q5_0; Q4_0 is the coarsest type a
// Whisper file holds). Different weights differ by about their RMS (√2 of it for independent
// draws).
constexpr double kSameWeightsRelativeRms = 0.25;
// Rows compared: spread over the matrix, and cheap next to loading it (a model's encoder is
// most of its file, which the backend no longer reads once it holds its own copy).
constexpr int64_t kSameWeightsRows = 16;

// Whether two stored tensors hold the same weights: rows spread over the matrix (all of a
// vector's), byte for byte at the same type, and at two types differing by no more than their
// rounding.
bool same_weights(const GgufTensorInfo& t, const GgufTensorInfo& u) {
    if (u.shape != t.shape) return false;
    if (t.shape.empty() || t.shape[0] <= 0) return false;
    const int64_t cols = t.shape[0], rows = int64_t(t.n_elements) / cols;
    uint64_t n = 0, t_row = 0, u_row = 0;
    const std::array<int64_t, 1> row_shape{cols};
    if (!ggml_tensor_bytes(t.type, row_shape, &n, &t_row) ||
        !ggml_tensor_bytes(u.type, row_shape, &n, &u_row) ||
        t_row * uint64_t(rows) > t.data.size() || u_row * uint64_t(rows) > u.data.size())
        return false;
    const int64_t samples = std::min(rows, kSameWeightsRows);
    const auto sampled = [&](int64_t s) {
        return samples == 1 ? 0 : s * (rows - 1) / (samples - 1);
    };
    if (u.type == t.type) {
        for (int64_t s = 0; s < samples; ++s) {
            const auto at = size_t(uint64_t(sampled(s)) * t_row);
            if (std::memcmp(&t.data[at], &u.data[at], size_t(t_row)) != 0) return false;
        }
        return true;
    }
    std::vector<float> a(static_cast<size_t>(cols)), b(a.size());
    // A row copied before it is read: whisper.cpp's files do not align their tensors.
    std::vector<uint8_t> row(std::max(t_row, u_row));
    const auto decode = [&](const GgufTensorInfo& x, uint64_t row_bytes, int64_t r, float* out) {
        std::memcpy(row.data(), &x.data[size_t(uint64_t(r) * row_bytes)], size_t(row_bytes));
        dequantize_row(x.type, row.data(), out, size_t(cols));
    };
    double diff = 0.0, norm = 0.0;
    for (int64_t s = 0; s < samples; ++s) {
        const int64_t r = sampled(s);
        decode(t, t_row, r, a.data());
        decode(u, u_row, r, b.data());
        for (size_t i = 0; i < a.size(); ++i) {
            diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
            norm += double(a[i]) * a[i];
        }
    }
    return diff <= kSameWeightsRelativeRms * kSameWeightsRelativeRms * norm;
}

// A tensor's shape as the model reads it: rows are the last dimension (a convolution's output
// channels), except for the convolutions' biases (1 x width), which are one row. conv1's rows
// (3 x n_mels) are copied with zero columns added up to whole 32-wide blocks (`padded`), which
// every backend's matmul takes, and im2col writes zeros there.
struct TensorLayout {
    int64_t rows = 0, cols = 0, padded = 0;
};
TensorLayout layout_of(const std::string& name, const GgufTensorInfo& info) {
    const auto n = int64_t(info.n_elements);
    const int64_t rows = info.shape.size() == 1 || info.shape[0] == 1 ? 1 : info.shape.back();
    const int64_t cols = n / rows;
    const int64_t padded =
        name == "encoder.conv1.weight" && cols % 32 != 0 ? (cols + 31) / 32 * 32 : cols;
    return {rows, cols, padded};
}

}  // namespace

bool WhisperModel::same_encoder(const WhisperModel& other) const {
    const WhisperHparams &a = hparams_, &b = other.hparams_;
    if (a.n_mels != b.n_mels || a.n_audio_ctx != b.n_audio_ctx ||
        a.n_audio_state != b.n_audio_state || a.n_audio_head != b.n_audio_head ||
        a.n_audio_layer != b.n_audio_layer)
        return false;
    if (this == &other) return true;
    for (const GgufTensorInfo& t : ggml_.tensors()) {
        if (!t.name.starts_with("encoder.")) continue;
        const GgufTensorInfo* u = other.ggml_.find_tensor(t.name);
        if (u == nullptr) return false;
        const bool same = same_weights(t, *u);
        // The pages read around the compared rows (the backends hold their own copies).
        file_->release(t.data);
        other.file_->release(u->data);
        if (!same) return false;
    }
    return true;
}

std::string_view WhisperModel::token_text(int32_t id) const {
    const auto& vocab = ggml_.vocab();
    if (id < 0 || id >= tokens_.eot || size_t(id) >= vocab.size()) return {};
    return vocab[size_t(id)];
}

Status WhisperModel::load(Backend& backend, std::unique_ptr<MappedFile> file,
                          const Progress& progress, std::unique_ptr<WhisperModel>* out) {
    std::unique_ptr<WhisperModel> m(new WhisperModel(backend));
    SPECULA_TRY(WhisperGgmlFile::parse(file->bytes(), &m->ggml_));
    const WhisperGgmlFile& g = m->ggml_;
    if (!g.has_weights())
        return FormatError("the whisper model file has no tensors (a header-only test file)");
    m->hparams_ = g.hparams();
    const WhisperHparams& h = m->hparams_;
    if (h.n_vocab < 51864)
        return Unsupported("a Whisper vocabulary of " + std::to_string(h.n_vocab) +
                           " tokens (the special tokens need at least 51864)");
    m->tokens_ = WhisperTokens::of(h.n_vocab);
    m->weight_type_ = g.weight_type();
    m->filters_ = {g.n_mel_filters(), g.mel_filters()};

    // The encoder's tensors are checked now and uploaded by load_encoder(); the callback
    // counts the others.
    const auto n_expected =
        size_t(std::count_if(g.tensors().begin(), g.tensors().end(), [](const GgufTensorInfo& t) {
            return !t.name.starts_with("encoder.");
        }));
    size_t n_loaded = 0;
    m->file_ = std::move(file);
    auto load = [&](const std::string& name, Tensor* t, WeightUse use = WeightUse::kAny) -> Status {
        const GgufTensorInfo* info = g.find_tensor(name);
        if (info == nullptr) return FormatError("the whisper model lacks tensor '" + name + "'");
        SPECULA_TRY(check_weight_type(backend, name, info->type));
        // The decoder's tables are read by rows too.
        if (name == "decoder.token_embedding.weight" || name == "decoder.positional_embedding")
            SPECULA_TRY(check_weight_type(backend, name, info->type, Backend::Op::kGetRows));
        m->n_params_ += info->n_elements;
        if (name.starts_with("encoder.")) {
            const TensorLayout l = layout_of(name, *info);
            *t = Tensor{nullptr, 0, info->type, l.padded, l.rows};
            m->encoder_.uploads.push_back({name, t, use});
            return Status::Ok();
        }
        SPECULA_TRY(m->upload(name, use, t, &m->buffers_));
        if (progress && !progress(float(++n_loaded) / float(n_expected)))
            return {SPECULA_ERR_ABORTED, "model loading was cancelled by the progress callback"};
        return Status::Ok();
    };
    // Only conv1 can have rows that are not whole blocks (3 x n_mels); conv2's are 3 x width.
    if ((3 * int64_t(h.n_audio_state)) % 32 != 0)
        return Unsupported("a Whisper width of " + std::to_string(h.n_audio_state) +
                           " (3 x width must be a multiple of 32)");
    auto linear = [&](const std::string& p, bool bias, WhisperModel::Linear* l) -> Status {
        SPECULA_TRY(load(p + ".weight", &l->w, WeightUse::kMatmul));
        return bias ? load(p + ".bias", &l->b) : Status::Ok();
    };
    auto block = [&](const std::string& p, bool decoder, Block* b) -> Status {
        // Self-attention ("attn") and, in the decoder, cross-attention ("cross_attn"): a
        // LayerNorm and four projections, the key's without a bias.
        auto attention = [&](const std::string& a, Tensor* ln_w, Tensor* ln_b, Linear* q, Linear* k,
                             Linear* v, Linear* o) -> Status {
            SPECULA_TRY(load(p + a + "_ln.weight", ln_w));
            SPECULA_TRY(load(p + a + "_ln.bias", ln_b));
            SPECULA_TRY(linear(p + a + ".query", true, q));
            SPECULA_TRY(linear(p + a + ".key", false, k));
            SPECULA_TRY(linear(p + a + ".value", true, v));
            return linear(p + a + ".out", true, o);
        };
        SPECULA_TRY(attention("attn", &b->attn_ln_w, &b->attn_ln_b, &b->q, &b->k, &b->v, &b->o));
        if (decoder)
            SPECULA_TRY(attention("cross_attn", &b->cross_ln_w, &b->cross_ln_b, &b->cq, &b->ck,
                                  &b->cv, &b->co));
        SPECULA_TRY(load(p + "mlp_ln.weight", &b->mlp_ln_w));
        SPECULA_TRY(load(p + "mlp_ln.bias", &b->mlp_ln_b));
        SPECULA_TRY(linear(p + "mlp.0", true, &b->mlp0));
        return linear(p + "mlp.2", true, &b->mlp2);
    };
    Encoder& e = m->encoder_;
    SPECULA_TRY(load("encoder.positional_embedding", &e.pos));
    SPECULA_TRY(linear("encoder.conv1", true, &e.conv1));
    SPECULA_TRY(linear("encoder.conv2", true, &e.conv2));
    SPECULA_TRY(load("encoder.ln_post.weight", &e.ln_w));
    SPECULA_TRY(load("encoder.ln_post.bias", &e.ln_b));
    e.blocks.resize(size_t(h.n_audio_layer));
    for (int l = 0; l < h.n_audio_layer; ++l)
        SPECULA_TRY(
            block("encoder.blocks." + std::to_string(l) + ".", false, &e.blocks[size_t(l)]));
    SPECULA_TRY(load("decoder.positional_embedding", &m->dec_pos_));
    SPECULA_TRY(load("decoder.token_embedding.weight", &m->token_embd_));
    SPECULA_TRY(load("decoder.ln.weight", &m->dec_ln_w_));
    SPECULA_TRY(load("decoder.ln.bias", &m->dec_ln_b_));
    m->dec_.resize(size_t(h.n_text_layer));
    for (int l = 0; l < h.n_text_layer; ++l)
        SPECULA_TRY(block("decoder.blocks." + std::to_string(l) + ".", true, &m->dec_[size_t(l)]));
    *out = std::move(m);
    return Status::Ok();
}

Status WhisperModel::upload(const std::string& name, WeightUse use, Tensor* t,
                            std::vector<std::unique_ptr<Buffer>>* buffers) const {
    const GgufTensorInfo& info = *ggml_.find_tensor(name);
    const TensorLayout l = layout_of(name, info);
    std::span<const uint8_t> data = info.data;
    if (l.padded != l.cols) {
        // The reader allows F32 and F16 only for the convolutions.
        const size_t elem = info.type == GgmlType::kF32 ? 4 : 2;
        conv1_padded_.assign(size_t(l.padded * l.rows) * elem, 0);
        for (int64_t r = 0; r < l.rows; ++r)
            std::memcpy(&conv1_padded_[size_t(r * l.padded) * elem],
                        &data[size_t(r * l.cols) * elem], size_t(l.cols) * elem);
        data = conv1_padded_;
    }
    std::unique_ptr<Buffer> buffer;
    SPECULA_TRY(backend_.load_weights(data, info.type, l.padded, l.rows, use, &buffer));
    if (!buffer->reads_host()) file_->release(info.data);
    *t = Tensor{buffer.get(), 0, info.type, l.padded, l.rows};
    buffers->push_back(std::move(buffer));
    return Status::Ok();
}

Status WhisperModel::load_encoder() const {
    if (encoder_.loaded) return Status::Ok();
    std::vector<std::unique_ptr<Buffer>> buffers;
    std::vector<Tensor> tensors(encoder_.uploads.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
        const Encoder::Upload& u = encoder_.uploads[i];
        SPECULA_TRY(upload(u.name, u.use, &tensors[i], &buffers));
    }
    for (size_t i = 0; i < tensors.size(); ++i)
        *encoder_.uploads[i].tensor = tensors[i];
    encoder_.buffers = std::move(buffers);
    encoder_.loaded = true;
    return Status::Ok();
}

Status WhisperModel::restrict_output(std::span<const int32_t> tokens) {
    if (head_rows_ > 0) return InvalidArgument("the model's output is already restricted");
    if (has_contexts_)
        return InvalidArgument("a model's output is restricted before any context of it exists");
    const int32_t n_vocab = hparams_.n_vocab;
    std::vector<bool> kept(size_t(n_vocab), false);
    for (int32_t id : tokens) {
        if (id < 0 || id >= n_vocab)
            return InvalidArgument("token " + std::to_string(id) + " is not in the vocabulary of " +
                                   std::to_string(n_vocab));
        kept[size_t(id)] = true;
    }
    if (std::find(kept.begin(), kept.begin() + tokens_.eot, true) == kept.begin() + tokens_.eot)
        return InvalidArgument("a draft's output needs at least one text token");
    std::fill(kept.begin() + tokens_.eot, kept.end(), true);
    std::vector<int32_t> ids;  // ascending: the head's rows
    for (size_t id = 0; id < kept.size(); ++id)
        if (kept[id]) ids.push_back(int32_t(id));
    const auto rows = int32_t(ids.size());
    const GgufTensorInfo* info = ggml_.find_tensor("decoder.token_embedding.weight");
    const size_t row_bytes = token_embd_.row_bytes();
    std::vector<uint8_t> bytes(size_t(rows) * row_bytes);
    for (size_t j = 0; j < ids.size(); ++j)
        std::memcpy(&bytes[j * row_bytes], &info->data[size_t(ids[j]) * row_bytes], row_bytes);
    std::unique_ptr<Buffer> head, head_ids;
    SPECULA_TRY(backend_.load_weights(bytes, token_embd_.type, token_embd_.cols, rows,
                                      WeightUse::kMatmul, &head));
    SPECULA_TRY(backend_.allocate(ids.size() * sizeof(int32_t), &head_ids));
    const Tensor ids_tensor{head_ids.get(), 0, GgmlType::kI32, rows, 1};
    backend_.upload(ids_tensor, ids.data());
    SPECULA_TRY(backend_.flush());
    head_ = Tensor{head.get(), 0, token_embd_.type, token_embd_.cols, rows};
    head_ids_ = ids_tensor;
    if (head->reads_host()) head_bytes_ = std::move(bytes);
    buffers_.push_back(std::move(head));
    buffers_.push_back(std::move(head_ids));
    head_rows_ = rows;
    return Status::Ok();
}

Status WhisperContext::create(const WhisperModel& model, int max_logit_rows,
                              std::unique_ptr<WhisperContext>* out) {
    const WhisperHparams& h = model.hparams();
    if (max_logit_rows <= 0 || max_logit_rows > h.n_text_ctx)
        return InvalidArgument("logit rows out of range");
    std::unique_ptr<WhisperContext> c(new WhisperContext(model));
    model.has_contexts_ = true;
    c->max_logit_rows_ = max_logit_rows;
    const int64_t w = h.n_audio_state, frames = 2 * int64_t(h.n_audio_ctx);
    const int64_t audio = h.n_audio_ctx, text = h.n_text_ctx;
    BufferPlan plan;
    const auto f32 = [&](Tensor* t, int64_t cols, int64_t rows) {
        plan.add(t, GgmlType::kF32, cols, rows);
    };
    f32(&c->mel_, h.n_mels, frames);
    f32(&c->cols1_, model.encoder_.conv1.w.cols, frames);
    f32(&c->conv1_out_, w, frames);
    f32(&c->cols2_, model.encoder_.conv2.w.cols, audio);
    for (Tensor* t :
         {&c->enc_x_, &c->enc_h_, &c->enc_q_, &c->enc_k_, &c->enc_v_, &c->enc_a_, &c->enc_out_})
        f32(t, w, audio);
    f32(&c->enc_f_, 4 * w, audio);
    plan.add(&c->ids_, GgmlType::kI32, text, 1);
    plan.add(&c->positions_, GgmlType::kI32, text, 1);
    for (Tensor* t : {&c->x_, &c->pos_rows_, &c->h_, &c->q_, &c->a_})
        f32(t, w, text);
    f32(&c->f_, 4 * w, text);
    f32(&c->logits_, h.n_vocab, max_logit_rows);
    if (model.output_restricted()) f32(&c->head_logits_, model.output_rows(), max_logit_rows);
    const auto layers = size_t(h.n_text_layer);
    for (auto* v : {&c->cross_k_, &c->cross_v_, &c->k_cache_, &c->v_cache_})
        v->resize(layers);
    for (size_t l = 0; l < layers; ++l) {
        f32(&c->cross_k_[l], w, audio);
        f32(&c->cross_v_[l], w, audio);
        f32(&c->k_cache_[l], w, text);
        f32(&c->v_cache_[l], w, text);
    }
    SPECULA_TRY(plan.check_fits(model.backend_, "a Whisper context"));
    SPECULA_TRY(plan.allocate(model.backend_, &c->buffers_));
    *out = std::move(c);
    return Status::Ok();
}

// One pre-LN block over the n rows of x: self-attention (non-causal over the n rows in the
// encoder; causal over the cache in the decoder), the decoder's cross-attention, the MLP.
void WhisperContext::block(const WhisperModel::Block& b, const Tensor& x, int n, bool decoder,
                           int layer) {
    const WhisperHparams& hp = model_.hparams();
    Backend& be = model_.backend_;
    using A = Backend::Accumulate;
    const int heads = decoder ? hp.n_text_head : hp.n_audio_head;
    const int head_dim = int(x.cols) / heads;
    const float scale = 1.0f / std::sqrt(float(head_dim));
    const Tensor h = (decoder ? h_ : enc_h_).row_range(0, n);
    const Tensor q = (decoder ? q_ : enc_q_).row_range(0, n);
    const Tensor a = (decoder ? a_ : enc_a_).row_range(0, n);
    const Tensor f = (decoder ? f_ : enc_f_).row_range(0, n);
    const auto linear = [&](const WhisperModel::Linear& l, const Tensor& in, const Tensor& out,
                            A acc) {
        be.matmul(l.w, in, out, acc);
        if (l.b.buffer != nullptr) be.add_bias(out, l.b);
    };

    be.layer_norm(x, b.attn_ln_w, b.attn_ln_b, 1e-5f, h);
    linear(b.q, h, q, A::kNo);
    Backend::Attention att;
    att.q = q;
    att.out = a;
    att.n_head = att.n_head_kv = heads;
    att.head_dim = head_dim;
    att.scale = scale;
    if (decoder) {
        const auto l = size_t(layer);
        linear(b.k, h, k_cache_[l].row_range(n_past_, n), A::kNo);
        linear(b.v, h, v_cache_[l].row_range(n_past_, n), A::kNo);
        att.k = k_cache_[l];
        att.v = v_cache_[l];
        att.pos0 = n_past_;
    } else {
        linear(b.k, h, enc_k_, A::kNo);
        linear(b.v, h, enc_v_, A::kNo);
        att.k = enc_k_;
        att.v = enc_v_;
        att.n_keys = n;
    }
    be.attention(att);
    linear(b.o, a, x, A::kYes);
    if (decoder) {
        const auto l = size_t(layer);
        be.layer_norm(x, b.cross_ln_w, b.cross_ln_b, 1e-5f, h);
        linear(b.cq, h, q, A::kNo);
        att.k = cross_k_[l];
        att.v = cross_v_[l];
        att.pos0 = 0;
        att.n_keys = hp.n_audio_ctx;
        att.half_exact = true;
        be.attention(att);
        linear(b.co, a, x, A::kYes);
    }
    be.layer_norm(x, b.mlp_ln_w, b.mlp_ln_b, 1e-5f, h);
    linear(b.mlp0, h, f, A::kNo);
    be.activate(Backend::Activation::kGeluErf, f, f);
    linear(b.mlp2, f, x, A::kYes);
}

Status WhisperContext::encode(const audio::LogMel& mel, int first) {
    const WhisperHparams& hp = model_.hparams();
    if (mel.n_mel != hp.n_mels)
        return InvalidArgument("a mel of " + std::to_string(mel.n_mel) + " bands for a model of " +
                               std::to_string(hp.n_mels));
    const int frames = window_frames();
    if (first < 0 || first > mel.n_frames ||
        int64_t(mel.data.size()) != int64_t(mel.n_mel) * mel.n_frames)
        return InvalidArgument("mel frames out of range");
    SPECULA_TRY(model_.load_encoder());
    const int count = std::min(frames, mel.n_frames - first);
    shared_source_ = nullptr;  // this window is its own
    later_mel_ = nullptr;
    ++windows_encoded_;
    Backend& be = model_.backend_;
    using A = Backend::Accumulate;
    // The window as rows of time (the convolutions run over rows).
    std::vector<float> rows(size_t(frames) * size_t(hp.n_mels), 0.0f);
    for (int m = 0; m < hp.n_mels; ++m)
        for (int t = 0; t < count; ++t)
            rows[size_t(t) * size_t(hp.n_mels) + size_t(m)] =
                mel.data[size_t(m) * size_t(mel.n_frames) + size_t(first + t)];
    be.upload(mel_, rows.data());

    const WhisperModel::Encoder& m = model_.encoder_;
    // Whisper's stem: two convolutions of kernel 3, padding 1, the second of stride 2, each
    // followed by GELU (the exact form, as it was trained).
    constexpr auto kGelu = Backend::Activation::kGeluErf;
    be.im2col(mel_, {.kernel = 3, .stride = 1, .padding = 1}, cols1_);
    be.matmul(m.conv1.w, cols1_, conv1_out_, A::kNo);
    be.add_bias(conv1_out_, m.conv1.b);
    be.activate(kGelu, conv1_out_, conv1_out_);
    be.im2col(conv1_out_, {.kernel = 3, .stride = 2, .padding = 1}, cols2_);
    be.matmul(m.conv2.w, cols2_, enc_x_, A::kNo);
    be.add_bias(enc_x_, m.conv2.b);
    be.activate(kGelu, enc_x_, enc_x_);
    be.add_bias(enc_x_, m.pos);
    const int n = hp.n_audio_ctx;
    for (const WhisperModel::Block& b : m.blocks)
        block(b, enc_x_, n, false, 0);
    be.layer_norm(enc_x_, m.ln_w, m.ln_b, 1e-5f, enc_out_);
    return cross_keys_values(enc_out_);
}

bool WhisperContext::shares_encoder_with(const WhisperModel& target) const {
    if (encoder_compared_with_ != &target) {
        shares_encoder_ = model_.same_encoder(target);
        encoder_compared_with_ = &target;
    }
    return shares_encoder_;
}

Status WhisperContext::encode_shared(const WhisperContext& source) {
    SPECULA_TRY(encode_shared_later(source));
    return prepare();
}

Status WhisperContext::encode_later(const audio::LogMel& mel, int first) {
    if (mel.n_mel != model_.hparams().n_mels || first < 0 || first > mel.n_frames)
        return encode(mel, first);  // its checks, now
    shared_source_ = nullptr;
    later_mel_ = &mel;
    later_first_ = first;
    n_past_ = 0;
    encoded_ = false;
    return Status::Ok();
}

Status WhisperContext::encode_shared_later(const WhisperContext& source) {
    if (&source.backend() != &backend() || !source.encoded_ || !shares_encoder_with(source.model_))
        return InvalidArgument(
            "a shared encoding needs an encoded window of the same encoder on the same backend");
    later_mel_ = nullptr;
    shared_source_ = &source;
    shared_window_ = source.windows_encoded_;
    n_past_ = 0;
    encoded_ = false;
    return Status::Ok();
}

Status WhisperContext::prepare() {
    if (later_mel_ != nullptr) {
        const audio::LogMel& mel = *later_mel_;
        return encode(mel, later_first_);  // which forgets later_mel_
    }
    if (shared_source_ == nullptr) return Status::Ok();
    const WhisperContext& source = *shared_source_;
    shared_source_ = nullptr;
    if (source.windows_encoded_ != shared_window_ || !source.encoded_)
        return InvalidArgument("the window this decoder was to share has been replaced");
    return cross_keys_values(source.enc_out_);
}

Status WhisperContext::cross_keys_values(const Tensor& enc_out) {
    Backend& be = model_.backend_;
    const WhisperModel& m = model_;
    for (size_t l = 0; l < m.dec_.size(); ++l) {
        be.matmul(m.dec_[l].ck.w, enc_out, cross_k_[l], Backend::Accumulate::kNo);
        be.matmul(m.dec_[l].cv.w, enc_out, cross_v_[l], Backend::Accumulate::kNo);
        be.add_bias(cross_v_[l], m.dec_[l].cv.b);
        // F16, as whisper.cpp keeps them: every token reads them all (0.49 GB a token in floats
        // for large), and a backend may then read a copy in halves (Attention::half_exact).
        be.round_to_half(cross_k_[l]);
        be.round_to_half(cross_v_[l]);
    }
    n_past_ = 0;
    encoded_ = false;
    SPECULA_TRY(be.flush());
    encoded_ = true;
    return Status::Ok();
}

Status WhisperContext::record(const Tensor& ids, bool all_rows) {
    const WhisperHparams& hp = model_.hparams();
    const int n = int(ids.cols);
    SPECULA_TRY(prepare());
    if (!encoded_) return InvalidArgument("forward before any audio was encoded");
    if (n == 0) return InvalidArgument("forward needs at least one token");
    if (n_past_ + n > hp.n_text_ctx)
        return {SPECULA_ERR_CONTEXT_FULL,
                "the decoder's context of " + std::to_string(hp.n_text_ctx) + " tokens is full"};
    const int rows = all_rows ? n : 1;
    if (rows > max_logit_rows_)
        return InvalidArgument("logits of " + std::to_string(rows) + " rows (at most " +
                               std::to_string(max_logit_rows_) + ")");

    Backend& be = model_.backend_;
    const WhisperModel& m = model_;
    Tensor pos = positions_;
    pos.cols = n;
    std::vector<int32_t> positions(static_cast<size_t>(n));
    std::iota(positions.begin(), positions.end(), n_past_);
    be.upload(pos, positions.data());
    const Tensor x = x_.row_range(0, n), p = pos_rows_.row_range(0, n);
    be.get_rows(m.token_embd_, ids, x);
    be.get_rows(m.dec_pos_, pos, p);
    be.add_bias(x, p);
    for (size_t l = 0; l < m.dec_.size(); ++l)
        block(m.dec_[l], x, n, true, int(l));
    const Tensor last = x.row_range(n - rows, rows), h = h_.row_range(0, rows);
    be.layer_norm(last, m.dec_ln_w_, m.dec_ln_b_, 1e-5f, h);
    if (m.output_restricted()) {
        const Tensor head_logits = head_logits_.row_range(0, rows);
        be.matmul(m.head_, h, head_logits, Backend::Accumulate::kNo);
        be.expand_columns(head_logits, m.head_ids_, -std::numeric_limits<float>::infinity(),
                          logits(rows));
    } else {
        be.matmul(m.token_embd_, h, logits(rows), Backend::Accumulate::kNo);
    }
    n_past_ += n;
    ++forward_calls_;
    return Status::Ok();
}

}  // namespace specula
