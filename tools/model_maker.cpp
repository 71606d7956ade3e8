#include "model_maker.h"

#include <cmath>
#include <vector>

#include "format/quant.h"
#include "platform/mapped_file.h"

namespace specula {

namespace {

// SplitMix64 + Box-Muller: the same weights from the same seed on every platform
// (std::normal_distribution is implementation-defined).
class Gaussian {
  public:
    explicit Gaussian(uint64_t seed) : state_(seed) {}
    float next() {
        const double u1 = (double(next_u64() >> 11) + 0.5) * 0x1.0p-53;
        const double u2 = double(next_u64() >> 11) * 0x1.0p-53;
        return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
    }

  private:
    uint64_t next_u64() {
        uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    uint64_t state_;
};

std::vector<uint8_t> random_matrix(Gaussian& g, GgmlType type, int64_t cols, int64_t rows,
                                   float stddev, float mean = 0.0f) {
    uint64_t n = 0, bytes = 0;
    const std::vector<int64_t> shape = {cols, rows};
    ggml_tensor_bytes(type, shape, &n, &bytes);
    std::vector<uint8_t> out(bytes);
    std::vector<float> row(static_cast<size_t>(cols));
    const size_t row_bytes = bytes / size_t(rows);
    for (int64_t r = 0; r < rows; ++r) {
        for (float& x : row)
            x = mean + stddev * g.next();
        quantize_row(type, row.data(), out.data() + size_t(r) * row_bytes, size_t(cols));
    }
    return out;
}

}  // namespace

Status parse_weight_type(const std::string& name, GgmlType* out) {
    for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
        std::string n = ggml_type_name(t);
        for (char& c : n)
            c = char(std::tolower(c));
        if (n == name) {
            *out = t;
            return Status::Ok();
        }
    }
    return InvalidArgument("unknown weight type '" + name + "' (f32, f16, q8_0, q4_0)");
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

    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_string("general.name", s.name);
    w.set_u32("llama.context_length", uint32_t(s.n_ctx));
    w.set_u32("llama.embedding_length", uint32_t(s.n_embd));
    w.set_u32("llama.block_count", uint32_t(s.n_layer));
    w.set_u32("llama.feed_forward_length", uint32_t(s.n_ff));
    w.set_u32("llama.attention.head_count", uint32_t(s.n_head));
    w.set_u32("llama.attention.head_count_kv", uint32_t(s.n_head_kv));
    w.set_u32("llama.rope.dimension_count", uint32_t(s.n_embd / s.n_head));
    w.set_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    w.set_f32("llama.rope.freq_base", 10000.0f);

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

    Gaussian g(s.seed);
    const int64_t e = s.n_embd, kv = int64_t(s.n_embd / s.n_head) * s.n_head_kv, ff = s.n_ff,
                  V = int64_t(n_vocab);
    const float se = 1.0f / std::sqrt(float(e)), sf = 1.0f / std::sqrt(float(ff));
    const GgmlType t = s.weight_type;
    SPECULA_TRY(w.add_tensor("token_embd.weight", t, {e, V}, random_matrix(g, t, e, V, 1.0f)));
    for (int l = 0; l < s.n_layer; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        SPECULA_TRY(w.add_tensor(p + "attn_norm.weight", GgmlType::kF32, {e},
                                 random_matrix(g, GgmlType::kF32, e, 1, 0.1f, 1.0f)));
        SPECULA_TRY(w.add_tensor(p + "attn_q.weight", t, {e, e}, random_matrix(g, t, e, e, se)));
        SPECULA_TRY(w.add_tensor(p + "attn_k.weight", t, {e, kv}, random_matrix(g, t, e, kv, se)));
        SPECULA_TRY(w.add_tensor(p + "attn_v.weight", t, {e, kv}, random_matrix(g, t, e, kv, se)));
        SPECULA_TRY(
            w.add_tensor(p + "attn_output.weight", t, {e, e}, random_matrix(g, t, e, e, se)));
        SPECULA_TRY(w.add_tensor(p + "ffn_norm.weight", GgmlType::kF32, {e},
                                 random_matrix(g, GgmlType::kF32, e, 1, 0.1f, 1.0f)));
        SPECULA_TRY(
            w.add_tensor(p + "ffn_gate.weight", t, {e, ff}, random_matrix(g, t, e, ff, se)));
        SPECULA_TRY(w.add_tensor(p + "ffn_up.weight", t, {e, ff}, random_matrix(g, t, e, ff, se)));
        SPECULA_TRY(
            w.add_tensor(p + "ffn_down.weight", t, {ff, e}, random_matrix(g, t, ff, e, sf)));
    }
    SPECULA_TRY(w.add_tensor("output_norm.weight", GgmlType::kF32, {e},
                             random_matrix(g, GgmlType::kF32, e, 1, 0.1f, 1.0f)));
    if (!s.tied_output)
        SPECULA_TRY(w.add_tensor("output.weight", t, {e, V}, random_matrix(g, t, e, V, se * 4.0f)));
    return w.write(path);
}

}  // namespace specula
