#include "models/llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <tuple>

#include "core/log.h"
#include "format/quant.h"
#include "models/buffer_plan.h"

namespace specula {

namespace {

// Bounds that keep every size computation below far from overflow and
// reject files whose header claims nonsense.
constexpr int64_t kMaxDim = 1 << 20;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxContext = 1 << 24;

Status read_dim(const GgufFile& g, const std::string& key, bool required, int64_t fallback,
                int* out) {
    int64_t v = fallback;
    bool found = false;
    SPECULA_TRY(g.get_int(key, &v, &found));
    if (!found && required) return FormatError("the model lacks '" + key + "'");
    if (v <= 0 || v > kMaxContext)
        return FormatError("'" + key + "' = " + std::to_string(v) + " is out of range");
    *out = int(v);
    return Status::Ok();
}

// GPT-NeoX's rotation pairs element i of a head with element i + n_rot / 2; Llama's pairs 2i
// with 2i + 1. Reordering the rows (output features) of the q and k projections so that row 2i
// is NeoX's row i and row 2i + 1 its row i + n_rot / 2 makes Llama's rotation compute NeoX's;
// queries and keys are reordered alike, so their dot products are unchanged.
std::vector<uint8_t> neox_rows_as_pairs(const uint8_t* rows, size_t row_bytes, int64_t n_rows,
                                        int head_dim, int n_rot) {
    std::vector<uint8_t> out(row_bytes * size_t(n_rows));
    for (int64_t r = 0; r < n_rows; ++r) {
        const int64_t head = r / head_dim, j = r % head_dim;
        const int64_t from = j >= n_rot ? j : j % 2 == 0 ? j / 2 : j / 2 + n_rot / 2;
        std::memcpy(out.data() + size_t(r) * row_bytes,
                    rows + size_t(head * head_dim + from) * row_bytes, row_bytes);
    }
    return out;
}

}  // namespace

std::string LlamaModel::architecture_names() {
    std::string names;
    for (const char* a : kArchitectures)
        names += (names.empty() ? "" : ", ") + std::string(a);
    return names;
}

Status LlamaModel::load(Backend& backend, std::unique_ptr<MappedFile> file,
                        const Progress& progress, std::unique_ptr<LlamaModel>* out) {
    GgufFile gguf;
    SPECULA_TRY(GgufFile::parse(file->bytes(), &gguf));
    std::string arch;
    SPECULA_TRY(gguf.get_string("general.architecture", &arch));
    if (!is_architecture(arch))
        return Unsupported("model architecture '" + arch.substr(0, 64) +
                           "' (supported: " + architecture_names() + ")");

    std::unique_ptr<LlamaModel> m(new LlamaModel(backend));
    SPECULA_TRY(gguf.get_string("general.name", &m->name_));
    LlamaConfig& c = m->config_;
    c.architecture = arch;
    const bool phi3 = arch == "phi3", gemma2 = arch == "gemma2", gemma3 = arch == "gemma3";
    const bool granite = arch == "granite";
    c.qkv_bias = arch == "qwen2";
    c.qk_norm = arch == "qwen3" || gemma3;
    c.post_norms = gemma2 || gemma3;
    if (gemma2 || gemma3) c.activation = Backend::Activation::kGeluTanh;
    const bool neox = arch == "qwen2" || arch == "qwen3" || phi3 || gemma2 || gemma3;
    const std::string a = arch + ".";
    SPECULA_TRY(read_dim(gguf, a + "embedding_length", true, 0, &c.n_embd));
    SPECULA_TRY(read_dim(gguf, a + "block_count", true, 0, &c.n_layer));
    SPECULA_TRY(read_dim(gguf, a + "feed_forward_length", true, 0, &c.n_ff));
    SPECULA_TRY(read_dim(gguf, a + "attention.head_count", true, 0, &c.n_head));
    SPECULA_TRY(read_dim(gguf, a + "attention.head_count_kv", false, c.n_head, &c.n_head_kv));
    SPECULA_TRY(read_dim(gguf, a + "context_length", false, 2048, &c.n_ctx_train));
    if (c.n_embd > kMaxDim || c.n_ff > kMaxDim || c.n_layer > kMaxLayers || c.n_head > c.n_embd)
        return FormatError("model dimensions are out of range");
    if (c.n_head % c.n_head_kv != 0) return FormatError("head counts do not divide each other");
    // Heads are n_embd / n_head wide unless the file says otherwise (Qwen3: 128 at any width).
    const int default_head_dim = c.n_embd % c.n_head == 0 ? c.n_embd / c.n_head : 0;
    int value_dim = 0;
    SPECULA_TRY(read_dim(gguf, a + "attention.key_length", false, default_head_dim, &c.head_dim));
    SPECULA_TRY(read_dim(gguf, a + "attention.value_length", false, c.head_dim, &value_dim));
    if (c.head_dim <= 0 || value_dim != c.head_dim || c.head_dim > 256)
        return FormatError("head width out of range (key and value lengths must be equal)");
    SPECULA_TRY(read_dim(gguf, a + "rope.dimension_count", false, c.head_dim, &c.n_rot));
    if (c.n_rot > c.head_dim || c.n_rot % 2 != 0 || c.head_dim % 2 != 0)
        return FormatError("rope dimension count must be even and at most the head size");
    double eps = c.rms_eps, base = c.rope_base;
    SPECULA_TRY(gguf.get_float(a + "attention.layer_norm_rms_epsilon", &eps));
    SPECULA_TRY(gguf.get_float(a + "rope.freq_base", &base));
    if (!(eps > 0 && eps < 1) || !(base > 1))
        return FormatError("rms epsilon or rope base out of range");
    c.rms_eps = float(eps);
    c.rope_base = float(base);
    // Rope scaling as llama.cpp reads it: a factor of linear scaling, and per-pair frequency
    // factors in a tensor (how Llama 3.1+ files carry their scaling). YaRN and LongRoPE change
    // the attention too: refused rather than run wrongly.
    std::string scaling = "linear";
    SPECULA_TRY(gguf.get_string(a + "rope.scaling.type", &scaling));
    if (scaling != "none" && scaling != "linear")
        return Unsupported("rope scaling '" + scaling.substr(0, 32) +
                           "' (supported: none, linear, and rope_freqs factors)");
    double factor = 0.0;
    bool found = false;
    SPECULA_TRY(gguf.get_float(a + "rope.scaling.factor", &factor, &found));
    if (!found) SPECULA_TRY(gguf.get_float(a + "rope.scale_linear", &factor));
    if (!(factor >= 0.0 && factor < 1e6)) return FormatError("rope scaling factor out of range");
    c.rope_freq_scale = factor == 0.0 ? 1.0f : float(1.0 / factor);
    // A tensor of per-pair frequency factors, where the file has it.
    auto read_factors = [&](const std::string& name, std::vector<float>* out) -> Status {
        const GgufTensorInfo* f = gguf.find_tensor(name);
        if (f == nullptr) return Status::Ok();
        if (f->type != GgmlType::kF32 || f->n_elements != uint64_t(c.n_rot / 2) ||
            f->data.size() != size_t(c.n_rot / 2) * sizeof(float))
            return FormatError("tensor '" + name + "' must hold " + std::to_string(c.n_rot / 2) +
                               " F32 factors");
        out->resize(size_t(c.n_rot / 2));
        std::memcpy(out->data(), f->data.data(), f->data.size());
        for (float x : *out)
            if (!(x > 0.0f && x < 1e6f))
                return FormatError("tensor '" + name + "' holds a factor out of range");
        return Status::Ok();
    };
    SPECULA_TRY(read_factors("rope_freqs.weight", &c.rope_freq_factors));
    SPECULA_TRY(read_factors("rope_factors_short.weight", &c.rope_short_factors));
    SPECULA_TRY(read_factors("rope_factors_long.weight", &c.rope_long_factors));
    if (c.rope_short_factors.empty() != c.rope_long_factors.empty() ||
        (!c.rope_short_factors.empty() && !c.rope_freq_factors.empty()))
        return FormatError(
            "LongRoPE needs both rope_factors_short and rope_factors_long, and no rope_freqs");
    SPECULA_TRY(read_dim(gguf, a + "rope.scaling.original_context_length", false, c.n_ctx_train,
                         &c.n_ctx_orig));
    double magnitude = 1.0;
    SPECULA_TRY(gguf.get_float(a + "rope.scaling.attn_factor", &magnitude));
    if (!(magnitude > 0.0 && magnitude < 16.0))
        return FormatError("rope attention factor out of range");
    c.rope_magnitude = float(magnitude);
    if (phi3) {
        // As llama.cpp reads Phi-3's files: the key, else Phi-3-mini-4k's and -medium-4k's
        // window for files written before it (0 in the key: no window, Phi-4's).
        int64_t window = 0;
        bool has_window = false;
        SPECULA_TRY(gguf.get_int(a + "attention.sliding_window", &window, &has_window));
        if (!has_window && (c.n_layer == 32 || c.n_layer == 40) && c.n_ctx_train == 4096)
            window = 2047;
        if (window < 0 || window > kMaxContext) return FormatError("sliding window out of range");
        c.sliding_window = int(window);
    }
    if (gemma3) {
        // As llama.cpp reads Gemma 3: the window of the local layers, every sixth layer global,
        // the local layers' rotations of base 10000 unscaled.
        int window = 0;
        SPECULA_TRY(read_dim(gguf, a + "attention.sliding_window", true, 0, &window));
        c.sliding_window = window;
        c.global_every = 6;
        c.rope_base_local = 10000.0f;
    }
    if (gemma2) {
        // As llama.cpp reads Gemma 2: a window of 4096 unless the file says, every other layer
        // global, one rope table; soft caps of 50 and 30 unless the file says.
        SPECULA_TRY(read_dim(gguf, a + "attention.sliding_window", false, 4096, &c.sliding_window));
        c.global_every = 2;
        double attn_cap = 50.0, final_cap = 30.0;
        SPECULA_TRY(gguf.get_float(a + "attn_logit_softcapping", &attn_cap));
        SPECULA_TRY(gguf.get_float(a + "final_logit_softcapping", &final_cap));
        if (!(attn_cap > 0 && attn_cap < 1e6 && final_cap > 0 && final_cap < 1e6))
            return FormatError("soft-capping values out of range");
        c.attn_soft_cap = float(attn_cap);
        c.final_soft_cap = float(final_cap);
    }
    // q . k scaled by 1 / sqrt(head_dim); the query_pre_attn_scalar of Gemma 2 27B and Gemma 3
    // 27B is n_embd / n_head (llama.cpp tells them by their 46 and 62 layers).
    const bool gemma_27b = (gemma2 && c.n_layer == 46) || (gemma3 && c.n_layer == 62);
    c.attention_scale = 1.0f / std::sqrt(float(gemma_27b ? c.n_embd / c.n_head : c.head_dim));
    if (gemma2 || gemma3) c.embedding_scale = std::sqrt(float(c.n_embd));  // as llama.cpp
    if (granite) {
        // As llama.cpp reads Granite: the logits' scale is required, the others optional (the
        // attention's scale 0 or absent: 1 / sqrt(head_dim)).
        double embedding = 1.0, residual = 0.0, attention = 0.0, logit = 0.0;
        bool has_logit = false;
        SPECULA_TRY(gguf.get_float(a + "logit_scale", &logit, &has_logit));
        SPECULA_TRY(gguf.get_float(a + "embedding_scale", &embedding));
        SPECULA_TRY(gguf.get_float(a + "residual_scale", &residual));
        SPECULA_TRY(gguf.get_float(a + "attention.scale", &attention));
        if (!has_logit) return FormatError("the granite model lacks " + a + "logit_scale");
        const auto in_range = [](double v) { return v >= 0 && v < 1e6; };
        if (!(logit > 0) || !in_range(logit) || !(embedding > 0) || !in_range(embedding) ||
            !in_range(residual) || !in_range(attention))
            return FormatError("granite scales out of range");
        c.logit_scale = float(logit);
        c.embedding_scale = float(embedding);
        c.residual_scale = float(residual);
        if (attention > 0) c.attention_scale = float(attention);
        // Biases on the attention's output or the feed-forward (Granite's optional ones, which
        // no released dense Granite has) are not applied: refused rather than ignored.
        for (const char* bias : {"attn_output.bias", "ffn_gate.bias", "ffn_up.bias",
                                 "ffn_down.bias", "attn_q.bias", "attn_k.bias", "attn_v.bias"})
            if (gguf.find_tensor("blk.0." + std::string(bias)) != nullptr)
                return Unsupported("granite tensor 'blk.0." + std::string(bias) +
                                   "' (biases are not supported)");
        if (gguf.find_tensor("blk.0.ffn_gate_inp.weight") != nullptr)
            return Unsupported("granite mixture-of-experts models");
    }

    SPECULA_TRY(Tokenizer::from_gguf(gguf, &m->tokenizer_));
    c.n_vocab = m->tokenizer_->n_vocab();

    std::map<GgmlType, uint64_t> bytes_by_type;
    for (const auto& t : gguf.tensors()) {
        m->n_params_ += t.n_elements;
        m->weight_bytes_ += t.n_bytes;
        bytes_by_type[t.type] += t.n_bytes;
    }
    for (const auto& [type, bytes] : bytes_by_type)
        if (bytes > bytes_by_type[m->dominant_type_]) m->dominant_type_ = type;

    const size_t n_expected =
        3 + size_t(c.n_layer) *
                (9 + (c.qkv_bias ? 3 : 0) + (c.qk_norm ? 2 : 0) + (c.post_norms ? 2 : 0));
    size_t n_loaded = 0;
    // Rows [first, first + count) of a tensor of `rows` rows, as a matrix of their own (count
    // -1: all): Phi-3's q, k and v in one tensor, its gate and up in another.
    struct Rows {
        int64_t first = 0, count = -1;
    };
    // norm: an F32 vector; neox_pairs: rows reordered for the rotation (neox_rows_as_pairs).
    auto load = [&](const std::string& name, int64_t cols, int64_t rows, bool norm, Tensor* t,
                    bool optional = false, bool neox_pairs = false, Rows part = {}) -> Status {
        const GgufTensorInfo* info = gguf.find_tensor(name);
        if (info == nullptr) {
            if (optional) return Status::Ok();
            return FormatError("the model lacks tensor '" + name + "'");
        }
        const int64_t info_rows = info->shape.size() > 1 ? info->shape[1] : 1;
        for (size_t d = 2; d < info->shape.size(); ++d)
            if (info->shape[d] != 1)
                return FormatError("tensor '" + name + "' has too many dimensions");
        if (info->shape[0] != cols || info_rows != rows)
            return FormatError("tensor '" + name + "' has shape [" +
                               std::to_string(info->shape[0]) + ", " + std::to_string(info_rows) +
                               "], expected [" + std::to_string(cols) + ", " +
                               std::to_string(rows) + "]");
        if (norm && info->type != GgmlType::kF32)
            return Unsupported("tensor '" + name + "' has type " + ggml_type_name(info->type) +
                               " (norm weights must be F32)");
        SPECULA_TRY(check_weight_type(backend, name, info->type));
        // The token table is read by rows too (and by matmul where the head is tied).
        if (name == "token_embd.weight")
            SPECULA_TRY(check_weight_type(backend, name, info->type, Backend::Op::kGetRows));
        // A matrix's rows are whole rows of bytes in the file (a vector's elements are its rows).
        const int64_t n_rows = rows == 1 ? cols : rows;
        const size_t row_bytes = info->data.size() / size_t(n_rows);
        if (part.count < 0) part.count = n_rows;
        const std::span<const uint8_t> data =
            info->data.subspan(size_t(part.first) * row_bytes, size_t(part.count) * row_bytes);
        const int64_t out_rows = rows == 1 ? 1 : part.count;
        // The token table is read by rows; every other matrix only by products.
        const WeightUse use =
            norm || name == "token_embd.weight" ? WeightUse::kAny : WeightUse::kMatmul;
        std::unique_ptr<Buffer> buffer;
        if (neox_pairs && neox) {
            // Host memory that outlives the buffer, as load_weights() asks, where the buffer
            // reads it (the cpu, unless it keeps only its repacked copy).
            m->reordered_.push_back(
                neox_rows_as_pairs(data.data(), row_bytes, part.count, c.head_dim, c.n_rot));
            SPECULA_TRY(backend.load_weights(m->reordered_.back(), info->type, cols, out_rows, use,
                                             &buffer));
            if (!buffer->reads_host()) m->reordered_.pop_back();
        } else {
            SPECULA_TRY(backend.load_weights(data, info->type, cols, out_rows, use, &buffer));
            if (!buffer->reads_host()) file->release(data);
        }
        *t = Tensor{buffer.get(), 0, info->type, cols, out_rows};
        m->buffers_.push_back(std::move(buffer));
        if (progress && !progress(float(++n_loaded) / float(n_expected)))
            return {SPECULA_ERR_ABORTED, "model loading was cancelled by the progress callback"};
        return Status::Ok();
    };

    SPECULA_TRY(load("token_embd.weight", c.n_embd, c.n_vocab, false, &m->token_embd_));
    m->layers_.resize(size_t(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        Layer& L = m->layers_[size_t(l)];
        SPECULA_TRY(load(p + "attn_norm.weight", c.n_embd, 1, true, &L.attn_norm));
        if (phi3 && gguf.find_tensor(p + "attn_qkv.weight") != nullptr) {
            const std::string qkv = p + "attn_qkv.weight";
            const int64_t rows = c.q_dim() + 2 * int64_t(c.kv_dim());
            SPECULA_TRY(load(qkv, c.n_embd, rows, false, &L.wq, false, true, {0, c.q_dim()}));
            SPECULA_TRY(
                load(qkv, c.n_embd, rows, false, &L.wk, false, true, {c.q_dim(), c.kv_dim()}));
            SPECULA_TRY(load(qkv, c.n_embd, rows, false, &L.wv, false, false,
                             {c.q_dim() + c.kv_dim(), c.kv_dim()}));
        } else {
            SPECULA_TRY(load(p + "attn_q.weight", c.n_embd, c.q_dim(), false, &L.wq, false, true));
            SPECULA_TRY(load(p + "attn_k.weight", c.n_embd, c.kv_dim(), false, &L.wk, false, true));
            SPECULA_TRY(load(p + "attn_v.weight", c.n_embd, c.kv_dim(), false, &L.wv));
        }
        if (c.qkv_bias) {
            SPECULA_TRY(load(p + "attn_q.bias", c.q_dim(), 1, true, &L.bq, false, true));
            SPECULA_TRY(load(p + "attn_k.bias", c.kv_dim(), 1, true, &L.bk, false, true));
            SPECULA_TRY(load(p + "attn_v.bias", c.kv_dim(), 1, true, &L.bv));
        }
        if (c.qk_norm) {  // reordered as the rows of one head are
            SPECULA_TRY(
                load(p + "attn_q_norm.weight", c.head_dim, 1, true, &L.q_norm, false, true));
            SPECULA_TRY(
                load(p + "attn_k_norm.weight", c.head_dim, 1, true, &L.k_norm, false, true));
        }
        SPECULA_TRY(load(p + "attn_output.weight", c.q_dim(), c.n_embd, false, &L.wo));
        if (c.post_norms) {
            SPECULA_TRY(
                load(p + "post_attention_norm.weight", c.n_embd, 1, true, &L.post_attn_norm));
            SPECULA_TRY(load(p + "post_ffw_norm.weight", c.n_embd, 1, true, &L.post_ffn_norm));
        }
        SPECULA_TRY(load(p + "ffn_norm.weight", c.n_embd, 1, true, &L.ffn_norm));
        if (phi3) {  // gate and up in one tensor: the gate's rows, then up's
            const std::string up = p + "ffn_up.weight";
            SPECULA_TRY(
                load(up, c.n_embd, 2 * c.n_ff, false, &L.w_gate, false, false, {0, c.n_ff}));
            SPECULA_TRY(
                load(up, c.n_embd, 2 * c.n_ff, false, &L.w_up, false, false, {c.n_ff, c.n_ff}));
        } else {
            SPECULA_TRY(load(p + "ffn_gate.weight", c.n_embd, c.n_ff, false, &L.w_gate));
            SPECULA_TRY(load(p + "ffn_up.weight", c.n_embd, c.n_ff, false, &L.w_up));
        }
        SPECULA_TRY(load(p + "ffn_down.weight", c.n_ff, c.n_embd, false, &L.w_down));
    }
    SPECULA_TRY(load("output_norm.weight", c.n_embd, 1, true, &m->output_norm_));
    m->output_ = m->token_embd_;  // tied head unless the file has its own
    SPECULA_TRY(load("output.weight", c.n_embd, c.n_vocab, false, &m->output_, true));
    // A tied head loads one tensor fewer than expected: the callback still ends at 1.
    if (progress && n_loaded < n_expected && !progress(1.0f))
        return {SPECULA_ERR_ABORTED, "model loading was cancelled by the progress callback"};
    m->file_ = std::move(file);
    *out = std::move(m);
    return Status::Ok();
}

namespace {

// The buffers of activations for `rows` positions; `kv` adds the keys' and values' of several
// sequences (LlamaActivations::k, v).
void plan_activations(const LlamaConfig& c, int64_t rows, bool kv, BufferPlan* plan,
                      LlamaActivations* a) {
    a->rows = int(rows);
    plan->add(&a->ids, GgmlType::kI32, rows, 1);
    plan->add(&a->positions, GgmlType::kI32, rows, 1);
    for (Tensor* t : {&a->x, &a->norm})
        plan->add(t, GgmlType::kF32, c.n_embd, rows);
    for (Tensor* t : {&a->q, &a->attn})
        plan->add(t, GgmlType::kF32, c.q_dim(), rows);
    plan->add(&a->gate, GgmlType::kF32, c.n_ff, rows);
    plan->add(&a->up, GgmlType::kF32, c.n_ff, rows);
    plan->add(&a->logits, GgmlType::kF32, c.n_vocab, rows);
    if (c.residual_through_scratch()) plan->add(&a->post, GgmlType::kF32, c.n_embd, rows);
    if (kv)
        for (Tensor* t : {&a->k, &a->v})
            plan->add(t, GgmlType::kF32, c.kv_dim(), rows);
}

// A tensor of rows of whole heads seen as one row per head.
Tensor per_head(const Tensor& t, int head_dim) {
    return {t.buffer, t.offset, t.type, head_dim, t.rows * (t.cols / head_dim)};
}

}  // namespace

Status LlamaContext::create(const LlamaModel& model, int64_t n_ctx, int max_batch,
                            std::unique_ptr<LlamaContext>* out) {
    if (n_ctx <= 0) return InvalidArgument("context length out of range");
    if (max_batch <= 0 || max_batch > 4096) return InvalidArgument("batch size out of range");
    const LlamaConfig& c = model.config();
    std::unique_ptr<LlamaContext> ctx(new LlamaContext(model));
    BufferPlan plan;
    ctx->k_cache_.resize(size_t(c.n_layer));
    ctx->v_cache_.resize(size_t(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l) {
        plan.add(&ctx->k_cache_[size_t(l)], GgmlType::kF32, c.kv_dim(), n_ctx);
        plan.add(&ctx->v_cache_[size_t(l)], GgmlType::kF32, c.kv_dim(), n_ctx);
    }
    plan.add(&ctx->rope_table_, GgmlType::kF32, c.n_rot, n_ctx);
    if (c.rope_base_local > 0) plan.add(&ctx->rope_table_local_, GgmlType::kF32, c.n_rot, n_ctx);
    plan_activations(c, max_batch, false, &plan, &ctx->acts_);
    SPECULA_TRY(
        plan.check_fits(model.backend_, "a context of " + std::to_string(n_ctx) + " tokens"));
    if (n_ctx > kMaxContext)
        return InvalidArgument("context length " + std::to_string(n_ctx) + " is above the " +
                               std::to_string(kMaxContext) + " positions supported");
    if (n_ctx > c.n_ctx_train)
        log(SPECULA_LOG_WARN, "a context of " + std::to_string(n_ctx) +
                                  " tokens exceeds the model's training context of " +
                                  std::to_string(c.n_ctx_train) +
                                  ": positions beyond it are untrained");
    ctx->n_ctx_ = int(n_ctx);
    ctx->max_batch_ = max_batch;
    ctx->memory_bytes_ = plan.bytes();
    SPECULA_TRY(plan.allocate(model.backend_, &ctx->buffers_));
    // LongRoPE's long factors for a context longer than the original one, as llama.cpp takes them.
    const std::vector<float>& factors =
        !c.rope_short_factors.empty()
            ? (n_ctx > c.n_ctx_orig ? c.rope_long_factors : c.rope_short_factors)
            : c.rope_freq_factors;
    const std::vector<float> table =
        rope_table(int(n_ctx), c.n_rot, c.rope_base, c.rope_freq_scale, factors, c.rope_magnitude);
    model.backend_.upload(ctx->rope_table_, table.data());
    if (c.rope_base_local > 0)
        model.backend_.upload(ctx->rope_table_local_,
                              rope_table(int(n_ctx), c.n_rot, c.rope_base_local).data());
    *out = std::move(ctx);
    return Status::Ok();
}

Status LlamaContext::record(const Tensor& ids, bool all_rows) {
    const int n = int(ids.cols);
    if (n == 0 || n > max_batch_)
        return InvalidArgument("forward needs 1.." + std::to_string(max_batch_) + " tokens");
    const Segment segment{this, n};
    return record_segments(model_, acts_, ids, std::span(&segment, 1), all_rows);
}

Status LlamaContext::record_segments(const LlamaModel& model, const LlamaActivations& a,
                                     const Tensor& ids, std::span<const Segment> segments,
                                     bool all_rows) {
    const LlamaConfig& c = model.config();
    const int n = int(ids.cols);
    for (const Segment& s : segments)
        if (s.ctx->n_past_ + s.rows > s.ctx->n_ctx_)
            return {SPECULA_ERR_CONTEXT_FULL,
                    "the context of " + std::to_string(s.ctx->n_ctx_) + " tokens is full"};

    Backend& be = model.backend_;
    std::vector<int32_t> positions;
    for (const Segment& s : segments)
        for (int i = 0; i < s.rows; ++i)
            positions.push_back(s.ctx->n_past_ + i);
    Tensor pos_n = a.positions;
    pos_n.cols = n;
    be.upload(pos_n, positions.data());

    const Tensor x = a.x.row_range(0, n), h = a.norm.row_range(0, n), q = a.q.row_range(0, n);
    const Tensor attn = a.attn.row_range(0, n);
    const Tensor gate = a.gate.row_range(0, n), up = a.up.row_range(0, n);
    const Tensor post = c.residual_through_scratch() ? a.post.row_range(0, n) : Tensor{};
    // One sequence computes its keys and values straight into its cache rows; several compute
    // them into a.k and a.v, from where each segment's rows are copied into its cache.
    LlamaContext& first = *segments.front().ctx;
    const bool one = segments.size() == 1;

    be.get_rows(model.token_embd_, ids, x);
    if (c.embedding_scale != 1.0f) be.scale(x, c.embedding_scale);
    for (int l = 0; l < c.n_layer; ++l) {
        const LlamaModel::Layer& L = model.layers_[size_t(l)];
        const Tensor& rope_table = c.local_rope(l) ? first.rope_table_local_ : first.rope_table_;
        // The norms go into h, or stay pending where the backend's matmuls apply them.
        const Backend::MatmulInput attn_in = be.normed(x, L.attn_norm, c.rms_eps, h);
        const Tensor k =
            one ? first.k_cache_[size_t(l)].row_range(first.n_past_, n) : a.k.row_range(0, n);
        const Tensor v =
            one ? first.v_cache_[size_t(l)].row_range(first.n_past_, n) : a.v.row_range(0, n);
        const Backend::Rope rotation{pos_n, rope_table, c.head_dim, c.n_rot};
        if (c.qk_norm) {
            // Each head normed before the rotation: the projection into attn (free until the
            // attention), normed into q or the keys seen as one row per head, then rotated.
            for (auto [w, norm, out] : {std::tuple{&L.wq, &L.q_norm, &q}, {&L.wk, &L.k_norm, &k}}) {
                const Tensor projected{attn.buffer, attn.offset, GgmlType::kF32, out->cols, n};
                be.matmul(*w, attn_in, projected, Backend::Accumulate::kNo);
                be.rms_norm(per_head(projected, c.head_dim), *norm, c.rms_eps,
                            per_head(*out, c.head_dim));
                be.rope(*out, pos_n, rope_table, c.head_dim, c.n_rot);
            }
            be.matmul(L.wv, attn_in, v, Backend::Accumulate::kNo);
        } else if (c.qkv_bias) {  // the bias goes in before the rotation
            for (auto [w, b, out] : {std::tuple{&L.wq, &L.bq, &q}, {&L.wk, &L.bk, &k}}) {
                be.matmul(*w, attn_in, *out, Backend::Accumulate::kNo);
                be.add_bias(*out, *b);
                be.rope(*out, pos_n, rope_table, c.head_dim, c.n_rot);
            }
            be.matmul(L.wv, attn_in, v, Backend::Accumulate::kNo);
            be.add_bias(v, L.bv);
        } else {
            be.matmul_rope(L.wq, attn_in, q, rotation);
            be.matmul_rope(L.wk, attn_in, k, rotation);
            be.matmul(L.wv, attn_in, v, Backend::Accumulate::kNo);
        }
        int row = 0;
        for (const Segment& s : segments) {
            const Tensor& k_cache = s.ctx->k_cache_[size_t(l)];
            const Tensor& v_cache = s.ctx->v_cache_[size_t(l)];
            if (!one) {
                be.copy(k.row_range(row, s.rows), k_cache.row_range(s.ctx->n_past_, s.rows));
                be.copy(v.row_range(row, s.rows), v_cache.row_range(s.ctx->n_past_, s.rows));
            }
            be.attention({.q = q.row_range(row, s.rows),
                          .k = k_cache,
                          .v = v_cache,
                          .out = attn.row_range(row, s.rows),
                          .n_head = c.n_head,
                          .n_head_kv = c.n_head_kv,
                          .head_dim = c.head_dim,
                          .scale = c.attention_scale,
                          .pos0 = s.ctx->n_past_,
                          .window = c.window_of(l),
                          .soft_cap = c.attn_soft_cap});
            row += s.rows;
        }
        // The residual adds: folded into the products, or after the post-norms or the scale.
        const auto add_output = [&](const Tensor& w, const Tensor& in, const Tensor& post_norm) {
            if (c.post_norms) {
                be.matmul(w, in, post, Backend::Accumulate::kNo);
                be.rms_norm(post, post_norm, c.rms_eps, h);
                be.add_bias(x, h);
            } else if (c.residual_scale > 0) {
                be.matmul(w, in, post, Backend::Accumulate::kNo);
                be.scale(post, c.residual_scale);
                be.add_bias(x, post);
            } else {
                be.matmul(w, in, x, Backend::Accumulate::kYes);
            }
        };
        add_output(L.wo, attn, L.post_attn_norm);
        be.matmul_gated(c.activation, L.w_gate, L.w_up, be.normed(x, L.ffn_norm, c.rms_eps, h),
                        gate, up);
        add_output(L.w_down, gate, L.post_ffn_norm);
    }
    // One sequence's logits rows go straight to its logits (the last row only, unless
    // all_rows); several sequences' are computed for every row and each segment's copied out.
    const int head_first = one && !all_rows ? n - 1 : 0;
    const int head_rows = n - head_first;
    const Tensor logits = a.logits.row_range(0, head_rows);
    be.matmul(model.output_,
              be.normed(x.row_range(head_first, head_rows), model.output_norm_, c.rms_eps,
                        h.row_range(0, head_rows)),
              logits, Backend::Accumulate::kNo);
    if (c.final_soft_cap > 0) be.soft_cap(logits, c.final_soft_cap);
    if (c.logit_scale > 0) be.scale(logits, 1.0f / c.logit_scale);
    int row = 0;
    for (const Segment& s : segments) {
        if (!one) {
            const int kept = all_rows ? s.rows : 1;
            be.copy(logits.row_range(row + s.rows - kept, kept), s.ctx->logits(kept));
        }
        row += s.rows;
        s.ctx->n_past_ += s.rows;
        ++s.ctx->forward_calls_;
        s.ctx->positions_evaluated_ += uint64_t(s.rows);
    }
    return Status::Ok();
}

Status LlamaBatch::create(const LlamaModel& model, int max_rows, std::unique_ptr<LlamaBatch>* out) {
    if (max_rows <= 0 || max_rows > 4096) return InvalidArgument("batch size out of range");
    std::unique_ptr<LlamaBatch> batch(new LlamaBatch(model));
    BufferPlan plan;
    plan_activations(model.config(), max_rows, true, &plan, &batch->acts_);
    SPECULA_TRY(
        plan.check_fits(model.backend_, "a batch of " + std::to_string(max_rows) + " sequences"));
    SPECULA_TRY(plan.allocate(model.backend_, &batch->buffers_));
    *out = std::move(batch);
    return Status::Ok();
}

Status LlamaBatch::record(std::span<LlamaContext* const> contexts,
                          std::span<const int32_t> tokens) {
    const size_t n = contexts.size();
    if (n == 0 || n > size_t(acts_.rows) || tokens.size() != n)
        return InvalidArgument("a batch steps 1.." + std::to_string(acts_.rows) +
                               " contexts, one token each");
    std::vector<LlamaContext::Segment> segments;
    for (LlamaContext* ctx : contexts) {
        if (&ctx->model_ != &model_) return InvalidArgument("a batch steps contexts of its model");
        if (ctx->n_ctx_ != contexts.front()->n_ctx_)
            return InvalidArgument("a batch steps contexts of one length");
        for (const LlamaContext::Segment& s : segments)
            if (s.ctx == ctx) return InvalidArgument("a batch steps a context once");
        segments.push_back({ctx, 1});
    }
    for (int32_t t : tokens)
        if (t < 0 || t >= model_.config().n_vocab)
            return InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary");
    Tensor ids = acts_.ids;
    ids.cols = int64_t(n);
    model_.backend_.upload(ids, tokens.data());
    return LlamaContext::record_segments(model_, acts_, ids, segments, true);
}

}  // namespace specula
