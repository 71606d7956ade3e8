#include "model_maker.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <numbers>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "format/quant.h"
#include "models/llama.h"
#include "platform/mapped_file.h"

namespace specula {

namespace {

// SplitMix64 + Box-Muller: the same weights from the same seed on every platform
// (std::normal_distribution is implementation-defined). Each value takes two draws of a
// counter-based stream, so the generator can start anywhere in it: rows of a matrix are
// drawn on many threads with the values one thread would draw.
class Gaussian {
  public:
    explicit Gaussian(uint64_t seed, int threads = 1) : state_(seed), threads_(threads) {}
    float next() {
        const double u1 = (double(next_u64() >> 11) + 0.5) * 0x1.0p-53;
        const double u2 = double(next_u64() >> 11) * 0x1.0p-53;
        return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
    }
    // The generator `values` values further on (this one unchanged).
    Gaussian ahead(uint64_t values) const { return Gaussian(state_ + 2 * values * kStep); }
    int threads() const { return threads_; }
    void skip(uint64_t values) { state_ = ahead(values).state_; }
    // The stream's next 64 bits (splitmix64).
    uint64_t next_u64() {
        uint64_t z = (state_ += kStep);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }

  private:
    static constexpr uint64_t kStep = 0x9E3779B97F4A7C15ull;
    uint64_t state_;
    int threads_;  // for the rows of a large matrix
};

// An F32 tensor's bytes.
std::vector<uint8_t> float_bytes(const std::vector<float>& values) {
    std::vector<uint8_t> bytes(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
}

std::vector<uint8_t> random_matrix(Gaussian& g, GgmlType type, int64_t cols, int64_t rows,
                                   float stddev, float mean = 0.0f) {
    uint64_t n = 0, bytes = 0;
    const std::vector<int64_t> shape = {cols, rows};
    ggml_tensor_bytes(type, shape, &n, &bytes);
    std::vector<uint8_t> out(bytes);
    const size_t row_bytes = bytes / size_t(rows);
    const auto draw = [&](int64_t begin, int64_t end) {
        std::vector<float> row(static_cast<size_t>(cols));
        Gaussian local = g.ahead(uint64_t(begin) * uint64_t(cols));
        for (int64_t r = begin; r < end; ++r) {
            for (float& x : row)
                x = mean + stddev * local.next();
            quantize_row(type, row.data(), out.data() + size_t(r) * row_bytes, size_t(cols));
        }
    };
    // Large matrices on several threads (an 8B-shaped file took minutes on one).
    const int64_t parts = std::clamp<int64_t>(rows * cols >> 20, 1, std::max(1, g.threads()));
    std::vector<std::jthread> threads;
    int64_t started = 1;
    try {
        for (; started < parts; ++started)
            threads.emplace_back(draw, rows * started / parts, rows * (started + 1) / parts);
    } catch (const std::system_error&) {  // no thread to be had: the rest on this one
    }
    for (int64_t p = started; p < parts; ++p)
        draw(rows * p / parts, rows * (p + 1) / parts);
    draw(0, rows / parts);
    threads.clear();  // joins
    g.skip(uint64_t(rows) * uint64_t(cols));
    return out;
}

// The type whisper.cpp's converter and quantizer give a tensor in a file whose matrices are of
// `matrix_type`: the convolutions F16 (F32 in an F32 file), the rest F32.
GgmlType whisper_tensor_type(WhisperTensorSpec::Kind kind, GgmlType matrix_type) {
    using K = WhisperTensorSpec::Kind;
    if (kind == K::kMatrix) return matrix_type;
    if (kind == K::kConvolution)
        return matrix_type == GgmlType::kF32 ? GgmlType::kF32 : GgmlType::kF16;
    return GgmlType::kF32;
}

// One random cycle through the ids whose token type is ordinary (1), or every id where the
// types are not given: next[x] follows x (the ids shuffled from the seed alone, so the same on
// every platform, each followed by the next). Other ids (control, unknown, unused) follow
// themselves, so that the text never steps onto an end token.
std::vector<int32_t> successor_cycle(int64_t n, const std::vector<int64_t>& types, uint64_t seed) {
    std::vector<int32_t> next(static_cast<size_t>(n)), ids;
    for (int32_t x = 0; x < int32_t(n); ++x) {
        next[size_t(x)] = x;
        if (types.size() != size_t(n) || types[size_t(x)] == 1) ids.push_back(x);
    }
    Gaussian bits(seed ^ 0x5ACC355088D1C3E5ull);
    for (size_t i = ids.size(); i > 1; --i)
        std::swap(ids[i - 1], ids[size_t(bits.next_u64() % i)]);
    for (size_t i = 0; i < ids.size(); ++i)
        next[size_t(ids[i])] = ids[(i + 1) % ids.size()];
    return next;
}

}  // namespace

Status parse_weight_type(const std::string& name, GgmlType* out) {
    std::string names;
    for (GgmlType t : kWeightTypes) {
        std::string n = ggml_type_name(t);
        for (char& c : n)
            c = char(std::tolower(c));
        if (n == name) {
            *out = t;
            return Status::Ok();
        }
        names += (names.empty() ? "" : ", ") + n;
    }
    return InvalidArgument("unknown weight type '" + name + "' (" + names + ")");
}

Status write_random_llama(const RandomLlamaSpec& s, const std::string& path) {
    std::unique_ptr<MappedFile> vocab_file;
    SPECULA_TRY(MappedFile::open(s.vocab_path, &vocab_file));
    GgufFile vocab;
    SPECULA_TRY(GgufFile::parse(vocab_file->bytes(), &vocab));
    const std::vector<std::string>* tokens = nullptr;
    SPECULA_TRY(vocab.get_string_array("tokenizer.ggml.tokens", &tokens));
    if (tokens == nullptr) return FormatError(s.vocab_path + " has no tokenizer");
    if (s.n_embd % s.n_head != 0 || s.n_head % s.n_head_kv != 0 || s.n_embd % 32 != 0 ||
        s.n_ff % 32 != 0)
        return InvalidArgument("n_embd and n_ff must be multiples of 32 and of the head counts");
    const uint32_t block = ggml_type_traits(s.weight_type)->block_size;
    if (s.n_embd % block != 0 || s.n_ff % block != 0)
        return InvalidArgument(std::string(ggml_type_name(s.weight_type)) + " rows are blocks of " +
                               std::to_string(block) + ": n_embd and n_ff must be multiples");

    if (!LlamaModel::is_architecture(s.arch))
        return InvalidArgument("architecture '" + s.arch + "' (" +
                               LlamaModel::architecture_names() + ")");
    const bool phi3 = s.arch == "phi3", gemma2 = s.arch == "gemma2", gemma3 = s.arch == "gemma3";
    const bool gemma = gemma2 || gemma3;
    if (s.longrope && (!phi3 || s.n_ctx < 8))
        return InvalidArgument("LongRoPE factors are Phi-3's, for contexts of 8 or more");
    const bool with_draft = !s.draft_path.empty();
    if (with_draft && !(s.draft_layers >= 1 && s.draft_layers < s.n_layer && s.late_scale >= 0))
        return InvalidArgument(
            "a draft takes 1 .. n_layer - 1 of the target's layers, and "
            "late_scale >= 0");
    const int head_dim = s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head;
    const int n_rot = s.n_rot > 0 ? s.n_rot : head_dim;
    if (n_rot > head_dim || n_rot % 2 != 0)
        return InvalidArgument("the rotated dimensions must be even and at most a head's");
    GgufWriter w;
    const std::string a = s.arch + ".";
    w.set_string("general.architecture", s.arch);
    w.set_string("general.name", s.name);
    w.set_u32(a + "context_length", uint32_t(s.n_ctx));
    w.set_u32(a + "embedding_length", uint32_t(s.n_embd));
    w.set_u32(a + "block_count", uint32_t(s.n_layer));
    w.set_u32(a + "feed_forward_length", uint32_t(s.n_ff));
    w.set_u32(a + "attention.head_count", uint32_t(s.n_head));
    w.set_u32(a + "attention.head_count_kv", uint32_t(s.n_head_kv));
    w.set_u32(a + "rope.dimension_count", uint32_t(n_rot));
    if (s.head_dim > 0) {
        w.set_u32(a + "attention.key_length", uint32_t(head_dim));
        w.set_u32(a + "attention.value_length", uint32_t(head_dim));
    }
    w.set_f32(a + "attention.layer_norm_rms_epsilon", gemma ? 1e-6f : 1e-5f);
    w.set_f32(a + "rope.freq_base", gemma3 ? 1e6f : 10000.0f);
    if (s.rope_scale > 0.0f) {
        w.set_string(a + "rope.scaling.type", "linear");
        w.set_f32(a + "rope.scaling.factor", s.rope_scale);
    }
    if (phi3 || gemma)
        w.set_u32(a + "attention.sliding_window", uint32_t(s.sliding_window > 0 ? s.sliding_window
                                                           : phi3               ? s.n_ctx
                                                           : gemma3             ? 512
                                                                                : 4096));
    if (gemma2) {
        w.set_f32(a + "attn_logit_softcapping", s.attn_soft_cap);
        w.set_f32(a + "final_logit_softcapping", s.final_soft_cap);
    }
    if (s.arch == "granite") {  // Granite 3.x's scales (2B's by default)
        w.set_f32(a + "embedding_scale", s.embedding_scale);
        w.set_f32(a + "residual_scale", s.residual_scale);
        w.set_f32(a + "attention.scale", s.attention_scale);
        w.set_f32(a + "logit_scale", s.logit_scale);
    }
    if (s.longrope) {
        const int original = s.n_ctx / 4;
        w.set_u32(a + "rope.scaling.original_context_length", uint32_t(original));
        w.set_f32(a + "rope.scaling.attn_factor",
                  float(std::sqrt(1.0 + std::log(4.0) / std::log(double(original)))));
    }

    size_t n_vocab = tokens->size();
    for (const auto& [key, value] : vocab.metadata()) {
        if (!key.starts_with("tokenizer.")) continue;
        GgufValue v = value;
        if (s.n_vocab > 0 && size_t(s.n_vocab) < n_vocab) {
            // Special token ids past a truncated vocabulary are left out (the loader's defaults).
            if (key.ends_with("_token_id")) {
                const auto* id = std::get_if<uint64_t>(&v.value);
                const auto* sid = std::get_if<int64_t>(&v.value);
                if ((id && *id >= uint64_t(s.n_vocab)) || (sid && *sid >= int64_t(s.n_vocab)))
                    continue;
            }
            // Truncate per-token arrays; a truncated vocabulary is for tests that need a small one.
            if (auto* arr = std::get_if<GgufArray>(&v.value)) {
                std::visit(
                    [&](auto& a) {
                        if (a.size() == tokens->size()) a.resize(size_t(s.n_vocab));
                    },
                    *arr);
            }
        }
        w.set(key, std::move(v));
    }
    if (s.n_vocab > 0 && size_t(s.n_vocab) < n_vocab) n_vocab = size_t(s.n_vocab);

    // The draft's file: the same metadata but its layer count and name, and the tensors that
    // add() gives it.
    GgufWriter d = w;
    d.set_u32(a + "block_count", uint32_t(s.draft_layers));
    d.set_string("general.name", s.name + "-draft");
    const auto add = [&](const std::string& name, GgmlType type, std::vector<int64_t> shape,
                         std::vector<uint8_t> data, bool in_draft) {
        if (with_draft && in_draft) SPECULA_TRY(d.add_tensor(name, type, shape, data));
        return w.add_tensor(name, type, std::move(shape), std::move(data));
    };

    Gaussian g(s.seed, s.threads);
    const int64_t e = s.n_embd, qd = int64_t(head_dim) * s.n_head,
                  kv = int64_t(head_dim) * s.n_head_kv, ff = s.n_ff, V = int64_t(n_vocab);
    const float se = 1.0f / std::sqrt(float(e)), sf = 1.0f / std::sqrt(float(ff));
    const GgmlType t = s.weight_type;
    // A tied head is the embedding: its scale is the head's.
    const float head_std = (s.head_scale > 0 ? s.head_scale : 4.0f) * se;
    const bool tied = s.tied_output && !s.successor_head;
    const float embd_std = s.successor_head || (tied && s.head_scale > 0) ? head_std : 1.0f;
    std::vector<uint8_t> embedding = random_matrix(g, t, e, V, embd_std);
    std::vector<uint8_t> successor_head;  // successor_head: the embedding's rows in π's order
    if (s.successor_head) {
        std::vector<int64_t> types;
        if (!vocab.get_int_array("tokenizer.ggml.token_type", &types).ok()) types.clear();
        if (types.size() > size_t(V)) types.resize(size_t(V));  // a truncated vocabulary
        const std::vector<int32_t> next = successor_cycle(V, types, s.seed);
        const size_t row_bytes = embedding.size() / size_t(V);
        successor_head.resize(embedding.size());
        for (int64_t x = 0; x < V; ++x)
            std::memcpy(successor_head.data() + size_t(next[size_t(x)]) * row_bytes,
                        embedding.data() + size_t(x) * row_bytes, row_bytes);
    }
    SPECULA_TRY(add("token_embd.weight", t, {e, V}, std::move(embedding), true));
    if (s.longrope) {
        // Phi-3.5-mini's shape of factors: 1 for the fastest pairs rising to tens for the
        // slowest (the long ones), closer to 1 (the short ones).
        for (auto [name, top] :
             {std::pair{"rope_factors_long.weight", 40.0}, {"rope_factors_short.weight", 3.0}}) {
            std::vector<float> factors(size_t(n_rot / 2));
            for (int j = 0; j < n_rot / 2; ++j)
                factors[size_t(j)] = float(std::pow(top, double(j) / double(n_rot / 2)));
            SPECULA_TRY(add(name, GgmlType::kF32, {n_rot / 2}, float_bytes(factors), true));
        }
    }
    if (s.llama3_rope) {
        // Llama 3.2's rope_scaling (factor 32, low/high frequency factors 1 and 4, original
        // context 8192), turned into per-pair factors as the GGUF conversion does: wavelengths
        // under 8192 / 4 keep theirs, over 8192 / 1 are stretched 32 times, between blended.
        const double factor = 32, low = 1, high = 4, original = 8192;
        std::vector<float> factors(size_t(n_rot / 2));
        for (int j = 0; j < n_rot / 2; ++j) {
            const double wavelen = 2 * std::numbers::pi / std::pow(10000.0, -2.0 * j / n_rot);
            const double smooth = (original / wavelen - low) / (high - low);
            factors[size_t(j)] =
                float(wavelen < original / high  ? 1.0
                      : wavelen > original / low ? factor
                                                 : 1 / ((1 - smooth) / factor + smooth));
        }
        SPECULA_TRY(
            add("rope_freqs.weight", GgmlType::kF32, {n_rot / 2}, float_bytes(factors), true));
    }
    for (int l = 0; l < s.n_layer; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        const bool in_draft = l < s.draft_layers;
        // The residual updates of the layers a draft does not have, scaled (late_scale): the
        // output products, or Gemma's norms after them (which would undo a product's scale).
        const float late = with_draft && !in_draft ? s.late_scale : 1.0f;
        const float update = gemma ? 1.0f : late;
        const auto norm = [&](int64_t n) {
            return random_matrix(g, GgmlType::kF32, n, 1, 0.1f, 1.0f);
        };
        SPECULA_TRY(add(p + "attn_norm.weight", GgmlType::kF32, {e}, norm(e), in_draft));
        if (phi3) {  // q, k and v rows in one tensor: the same draws as three
            SPECULA_TRY(add(p + "attn_qkv.weight", t, {e, qd + 2 * kv},
                            random_matrix(g, t, e, qd + 2 * kv, se), in_draft));
        } else {
            SPECULA_TRY(
                add(p + "attn_q.weight", t, {e, qd}, random_matrix(g, t, e, qd, se), in_draft));
            SPECULA_TRY(
                add(p + "attn_k.weight", t, {e, kv}, random_matrix(g, t, e, kv, se), in_draft));
            SPECULA_TRY(
                add(p + "attn_v.weight", t, {e, kv}, random_matrix(g, t, e, kv, se), in_draft));
        }
        if (s.arch == "qwen2")
            for (auto [name, n] :
                 {std::pair{"attn_q.bias", qd}, {"attn_k.bias", kv}, {"attn_v.bias", kv}})
                SPECULA_TRY(add(p + name, GgmlType::kF32, {n},
                                random_matrix(g, GgmlType::kF32, n, 1, 0.5f), in_draft));
        if (s.arch == "qwen3" || gemma3)
            for (const char* name : {"attn_q_norm.weight", "attn_k_norm.weight"})
                SPECULA_TRY(add(p + name, GgmlType::kF32, {head_dim}, norm(head_dim), in_draft));
        SPECULA_TRY(add(p + "attn_output.weight", t, {qd, e},
                        random_matrix(g, t, qd, e, update / std::sqrt(float(qd))), in_draft));
        if (gemma)
            for (const char* name : {"post_attention_norm.weight", "post_ffw_norm.weight"})
                SPECULA_TRY(add(p + name, GgmlType::kF32, {e},
                                random_matrix(g, GgmlType::kF32, e, 1, 0.1f * late, late),
                                in_draft));
        SPECULA_TRY(add(p + "ffn_norm.weight", GgmlType::kF32, {e}, norm(e), in_draft));
        if (phi3) {  // the gate's rows, then up's
            SPECULA_TRY(add(p + "ffn_up.weight", t, {e, 2 * ff}, random_matrix(g, t, e, 2 * ff, se),
                            in_draft));
        } else {
            SPECULA_TRY(
                add(p + "ffn_gate.weight", t, {e, ff}, random_matrix(g, t, e, ff, se), in_draft));
            SPECULA_TRY(
                add(p + "ffn_up.weight", t, {e, ff}, random_matrix(g, t, e, ff, se), in_draft));
        }
        SPECULA_TRY(add(p + "ffn_down.weight", t, {ff, e}, random_matrix(g, t, ff, e, update * sf),
                        in_draft));
    }
    SPECULA_TRY(add("output_norm.weight", GgmlType::kF32, {e},
                    random_matrix(g, GgmlType::kF32, e, 1, 0.1f, 1.0f), true));
    if (s.successor_head)
        SPECULA_TRY(add("output.weight", t, {e, V}, std::move(successor_head), true));
    else if (!tied)
        SPECULA_TRY(add("output.weight", t, {e, V}, random_matrix(g, t, e, V, head_std), true));
    if (with_draft) SPECULA_TRY(d.write(s.draft_path));
    return w.write(path);
}

Status apply_released_shape(const std::string& name, RandomLlamaSpec* spec) {
    struct Shape {
        const char* name;
        const char* arch;
        int n_embd, n_layer, n_head, n_head_kv, n_ff, head_dim;
        bool tied, llama3_rope;
    };
    static constexpr Shape kShapes[] = {
        {"llama3.2-1b", "llama", 2048, 16, 32, 8, 8192, 64, true, true},
        {"llama3.2-3b", "llama", 3072, 28, 24, 8, 8192, 128, true, true},
        {"llama3.1-8b", "llama", 4096, 32, 32, 8, 14336, 128, false, true},
        {"qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 4864, 64, true, false},
        {"qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 8960, 128, true, false},
        {"qwen2.5-3b", "qwen2", 2048, 36, 16, 2, 11008, 128, true, false},
        {"qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 18944, 128, false, false},
        {"phi3.5-mini", "phi3", 3072, 32, 32, 32, 8192, 96, false, false},
        {"gemma3-270m", "gemma3", 640, 18, 4, 1, 2048, 256, true, false},
        {"gemma3-1b", "gemma3", 1152, 26, 4, 1, 6912, 256, true, false},
        {"gemma2-2b", "gemma2", 2304, 26, 8, 4, 9216, 256, true, false},
        {"granite3.1-2b", "granite", 2048, 40, 32, 8, 8192, 64, true, false},
    };
    std::string names;
    for (const Shape& sh : kShapes) {
        names += (names.empty() ? "" : ", ") + std::string(sh.name);
        if (name != sh.name) continue;
        spec->arch = sh.arch;
        spec->n_embd = sh.n_embd;
        spec->n_layer = sh.n_layer;
        spec->n_head = sh.n_head;
        spec->n_head_kv = sh.n_head_kv;
        spec->n_ff = sh.n_ff;
        spec->head_dim = sh.head_dim == sh.n_embd / sh.n_head ? 0 : sh.head_dim;
        spec->tied_output = sh.tied;
        spec->llama3_rope = sh.llama3_rope;
        spec->longrope = name == "phi3.5-mini";
        return Status::Ok();
    }
    return InvalidArgument("unknown shape '" + name + "' (" + names + ")");
}

Status whisper_shape(const std::string& name, bool english, WhisperHparams* out) {
    struct Shape {
        const char* name;
        int32_t width, heads, layers;
    };
    if (english && name.starts_with("large"))
        return InvalidArgument("the large shapes have no English-only vocabulary");
    for (const Shape& sh : {Shape{"tiny", 384, 6, 4}, Shape{"base", 512, 8, 6},
                            Shape{"small", 768, 12, 12}, Shape{"medium", 1024, 16, 24},
                            Shape{"large", 1280, 20, 32}, Shape{"large-v3", 1280, 20, 32}}) {
        if (name != sh.name) continue;
        const bool v3 = name == "large-v3";
        *out = WhisperHparams{english ? 51864
                              : v3    ? 51866
                                      : 51865,
                              1500,
                              sh.width,
                              sh.heads,
                              sh.layers,
                              448,
                              sh.width,
                              sh.heads,
                              sh.layers,
                              v3 ? 128 : 80,
                              0};
        return Status::Ok();
    }
    return InvalidArgument("unknown Whisper shape '" + name +
                           "' (tiny, base, small, medium, large, large-v3)");
}

Status write_whisper(const WhisperFileSpec& s, const WhisperTensorSource& source,
                     const std::string& path) {
    WhisperHparams h = s.hparams;
    int32_t ftype = -1;
    for (int32_t f : {0, 1, 2, 3, 7, 8, 9}) {
        GgmlType t = GgmlType::kF32;
        if (whisper_ftype_weight_type(f, &t) && t == s.weight_type) ftype = f;
    }
    if (ftype < 0)
        return InvalidArgument(std::string("cannot write Whisper weights of type ") +
                               ggml_type_name(s.weight_type) +
                               " (F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)");
    h.ftype = ftype;
    std::vector<float> filters;
    std::vector<std::string> vocab;
    if (!s.header_path.empty()) {
        std::unique_ptr<MappedFile> file;
        SPECULA_TRY(MappedFile::open(s.header_path, &file));
        WhisperGgmlFile header;
        SPECULA_TRY(WhisperGgmlFile::parse(file->bytes(), &header));
        if (header.hparams().n_vocab != h.n_vocab || header.hparams().n_mels != h.n_mels)
            return InvalidArgument(s.header_path + " has " +
                                   std::to_string(header.hparams().n_vocab) + " tokens and " +
                                   std::to_string(header.hparams().n_mels) +
                                   " mel bands, the shape " + std::to_string(h.n_vocab) + " and " +
                                   std::to_string(h.n_mels));
        filters = header.mel_filters();
        vocab = header.vocab();
    } else {
        // Band m covers bins m .. m + 2 (a stand-in: tests of the loader, not of hearing).
        filters.assign(size_t(h.n_mels) * 201, 0.0f);
        for (int m = 0; m < h.n_mels; ++m)
            for (int k = m; k < std::min(m + 3, 201); ++k)
                filters[size_t(m) * 201 + size_t(k)] = k == m + 1 ? 0.02f : 0.01f;
        for (int i = 0; i < std::min(h.n_vocab, 50257); ++i)
            vocab.push_back(std::to_string(i));
    }

    std::ofstream out(path, std::ios::binary);
    if (!out) return IoError("cannot create " + path);
    const auto put = [&](const void* p, size_t n) {
        out.write(static_cast<const char*>(p), std::streamsize(n));
    };
    const auto put_i32 = [&](int32_t v) { put(&v, 4); };
    put_i32(int32_t(kWhisperGgmlMagic));
    const bool quantized = s.weight_type != GgmlType::kF32 && s.weight_type != GgmlType::kF16;
    for (int32_t v : {h.n_vocab, h.n_audio_ctx, h.n_audio_state, h.n_audio_head, h.n_audio_layer,
                      h.n_text_ctx, h.n_text_state, h.n_text_head, h.n_text_layer, h.n_mels,
                      h.ftype + (quantized ? 2000 : 0)})
        put_i32(v);
    put_i32(h.n_mels);
    put_i32(201);
    put(filters.data(), filters.size() * sizeof(float));
    put_i32(int32_t(vocab.size()));
    for (const std::string& t : vocab) {
        put_i32(int32_t(t.size()));
        put(t.data(), t.size());
    }

    for (const WhisperTensorSpec& spec : whisper_tensor_specs(h)) {
        const GgmlType type = whisper_tensor_type(spec.kind, s.weight_type);
        std::vector<uint8_t> data;
        SPECULA_TRY(source(spec, type, &data));
        uint64_t count = 0, bytes = 0;
        if (!ggml_tensor_bytes(type, spec.shape, &count, &bytes) || data.size() != bytes)
            return InvalidArgument(spec.name + ": " + std::to_string(data.size()) +
                                   " bytes of data for its shape and type");
        put_i32(int32_t(spec.shape.size()));
        put_i32(int32_t(spec.name.size()));
        put_i32(int32_t(type));
        for (int64_t d : spec.shape)
            put_i32(int32_t(d));
        put(spec.name.data(), spec.name.size());
        put(data.data(), data.size());
    }
    out.close();
    return out ? Status::Ok() : IoError("cannot write " + path);
}

Status write_random_whisper(const RandomWhisperSpec& s, const std::string& path) {
    const bool with_draft = !s.draft_path.empty();
    const int layers = s.hparams.n_text_layer, kept = s.draft_decoder_layers;
    if (with_draft && !(kept >= 1 && kept < layers && s.late_scale >= 0))
        return InvalidArgument(
            "a draft takes 1 .. n_text_layer - 1 of the target's decoder blocks, and "
            "late_scale >= 0");
    // The target's decoder block a draft's block d is: the first kept - 1, then the last.
    const auto target_block = [&](int d) { return d < kept - 1 ? d : layers - 1; };
    const auto decoder_block = [](const std::string& name) {
        constexpr std::string_view prefix = "decoder.blocks.";
        if (!name.starts_with(prefix)) return -1;
        return std::atoi(name.c_str() + prefix.size());
    };
    const auto in_draft = [&](const std::string& name) {
        const int b = decoder_block(name);
        return b < 0 || b < kept - 1 || b == layers - 1;
    };
    // What the draft shares with the target, as written: the same draws in the draft's types
    // (its encoder included: the target's byte for byte at the same type, or the same weights
    // rounded to the draft's).
    std::map<std::string, std::vector<uint8_t>> shared;
    const GgmlType draft_type = s.draft_weight_type.value_or(s.weight_type);
    Gaussian g(s.seed, s.threads);
    SPECULA_TRY(write_whisper(
        s,
        [&](const WhisperTensorSpec& spec, GgmlType type, std::vector<uint8_t>* data) {
            using K = WhisperTensorSpec::Kind;
            const int64_t cols = spec.shape[0];
            int64_t rows = 1;
            for (size_t d = 1; d < spec.shape.size(); ++d)
                rows *= spec.shape[d];
            const bool norm_weight =
                spec.name.ends_with("ln.weight") || spec.name.ends_with("ln_post.weight");
            // The residual updates of the decoder blocks a draft does not have, scaled.
            const bool update =
                spec.name.ends_with(".out.weight") || spec.name.ends_with(".out.bias") ||
                spec.name.ends_with("mlp.2.weight") || spec.name.ends_with("mlp.2.bias");
            const float scale = with_draft && !in_draft(spec.name) && update ? s.late_scale : 1.0f;
            // The tensor's values in `t`, drawn from `from`.
            const auto draw = [&](Gaussian& from, GgmlType t) {
                if (spec.name == "encoder.positional_embedding") {
                    // Whisper's sinusoids: position p, channel c < width/2: sin(p * 10000^(-c /
                    // (width/2 - 1))), then the cosines.
                    std::vector<float> pe(size_t(cols * rows));
                    const int64_t half = cols / 2;
                    for (int64_t p = 0; p < rows; ++p)
                        for (int64_t c = 0; c < half; ++c) {
                            const double inv =
                                std::exp(-std::log(10000.0) * double(c) / double(half - 1));
                            pe[size_t(p * cols + c)] = float(std::sin(double(p) * inv));
                            pe[size_t(p * cols + half + c)] = float(std::cos(double(p) * inv));
                        }
                    return float_bytes(pe);
                }
                if (spec.name == "decoder.positional_embedding" && s.position_scale > 0)
                    return random_matrix(from, t, cols, rows, s.position_scale);
                if (spec.kind == K::kF32Only)
                    return random_matrix(from, t, cols, rows, scale * (norm_weight ? 0.1f : 0.02f),
                                         norm_weight ? 1.0f : 0.0f);
                // Fan-in: the columns (times the kernel width for convolutions).
                const int64_t fan_in = spec.kind == K::kConvolution ? cols * spec.shape[1] : cols;
                const float head = spec.name == "decoder.token_embedding.weight" && s.head_scale > 0
                                       ? s.head_scale
                                       : 1.0f;
                return random_matrix(from, t, cols, rows, head * scale / std::sqrt(float(fan_in)));
            };
            const bool shared_with_draft = with_draft && in_draft(spec.name);
            const GgmlType t = whisper_tensor_type(spec.kind, draft_type);
            if (shared_with_draft && t != type) {
                Gaussian same_draws = g;
                shared[spec.name] = draw(same_draws, t);
            }
            *data = draw(g, type);
            if (shared_with_draft && t == type) shared[spec.name] = *data;
            return Status::Ok();
        },
        path));
    if (!with_draft) return Status::Ok();
    RandomWhisperSpec d = s;
    d.hparams.n_text_layer = kept;
    d.weight_type = draft_type;
    return write_whisper(
        d,
        [&](const WhisperTensorSpec& spec, GgmlType, std::vector<uint8_t>* data) {
            std::string name = spec.name;
            if (const int b = decoder_block(name); b >= 0) {
                const std::string from = "decoder.blocks." + std::to_string(b) + ".";
                name = "decoder.blocks." + std::to_string(target_block(b)) + "." +
                       name.substr(from.size());
            }
            const auto found = shared.find(name);
            if (found == shared.end())
                return Status(SPECULA_ERR_INTERNAL, "no target tensor " + name);
            *data = found->second;
            return Status::Ok();
        },
        s.draft_path);
}

}  // namespace specula
