#include "format/whisper_ggml.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <new>
#include <string_view>

namespace specula {

namespace {

constexpr int kFftBins = 201;  // 400-point transform: bins 0 .. Nyquist
constexpr int32_t kQuantVersionFactor = 1000;
constexpr int32_t kMaxNameBytes = 256;

// Reads little-endian fields in order; errors name the field and its byte offset.
class Reader {
  public:
    explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
    size_t pos() const { return pos_; }
    size_t left() const { return bytes_.size() - pos_; }
    Status truncated(std::string_view what) const {
        return FormatError("whisper model file is truncated: " + std::string(what) + " at byte " +
                           std::to_string(pos_) + " needs more than the " + std::to_string(left()) +
                           " bytes left");
    }
    template <typename T>
    Status read(std::string_view what, T* out) {
        if (left() < sizeof(T)) return truncated(what);
        std::memcpy(out, bytes_.data() + pos_, sizeof(T));
        pos_ += sizeof(T);
        return Status::Ok();
    }
    Status take(std::string_view what, size_t n, std::span<const uint8_t>* out) {
        if (left() < n) return truncated(what);
        *out = bytes_.subspan(pos_, n);
        pos_ += n;
        return Status::Ok();
    }

  private:
    std::span<const uint8_t> bytes_;
    size_t pos_ = 0;
};

Status at(size_t pos, const std::string& what) {
    return FormatError("whisper model file, byte " + std::to_string(pos) + ": " + what);
}

Status check_hparams(const WhisperHparams& h) {
    // Bounds far above every released model (large: 1280 wide, 32 layers, 51866 tokens), so
    // that a corrupt field cannot ask for absurd sizes.
    struct Field {
        const char* name;
        int32_t value, most;
    };
    for (const Field& f :
         {Field{"n_vocab", h.n_vocab, 1 << 20}, Field{"n_audio_ctx", h.n_audio_ctx, 1 << 16},
          Field{"n_audio_state", h.n_audio_state, 1 << 14},
          Field{"n_audio_head", h.n_audio_head, 1024},
          Field{"n_audio_layer", h.n_audio_layer, 1024}, Field{"n_text_ctx", h.n_text_ctx, 1 << 16},
          Field{"n_text_state", h.n_text_state, 1 << 14}, Field{"n_text_head", h.n_text_head, 1024},
          Field{"n_text_layer", h.n_text_layer, 1024}, Field{"n_mels", h.n_mels, 1024}})
        if (f.value <= 0 || f.value > f.most)
            return at(4, std::string("hyperparameter ") + f.name + " = " + std::to_string(f.value) +
                             " is outside 1 .. " + std::to_string(f.most));
    if (h.n_audio_state % h.n_audio_head != 0 || h.n_text_state % h.n_text_head != 0)
        return at(4, "the model width is not a multiple of the attention heads");
    if (h.n_text_state != h.n_audio_state)
        return at(4, "n_text_state " + std::to_string(h.n_text_state) +
                         " differs from n_audio_state " + std::to_string(h.n_audio_state) +
                         " (whisper.cpp requires them equal)");
    return Status::Ok();
}

// The types whisper.cpp's converter and quantizer give matrices: every file type's.
bool is_whisper_matrix_type(GgmlType type) {
    for (int32_t ftype : {0, 1, 2, 3, 7, 8, 9}) {
        GgmlType t = GgmlType::kF32;
        if (whisper_ftype_weight_type(ftype, &t) && t == type) return true;
    }
    return false;
}

}  // namespace

bool whisper_ftype_weight_type(int32_t ftype, GgmlType* out) {
    switch (ftype) {
        case 0:
            *out = GgmlType::kF32;
            return true;
        case 1:
            *out = GgmlType::kF16;
            return true;
        case 2:
            *out = GgmlType::kQ4_0;
            return true;
        case 3:
            *out = GgmlType::kQ4_1;
            return true;
        case 7:
            *out = GgmlType::kQ8_0;
            return true;
        case 8:
            *out = GgmlType::kQ5_0;
            return true;
        case 9:
            *out = GgmlType::kQ5_1;
            return true;
        default:
            return false;
    }
}

std::vector<WhisperTensorSpec> whisper_tensor_specs(const WhisperHparams& h) {
    using K = WhisperTensorSpec::Kind;
    const int64_t audio = h.n_audio_state, text = h.n_text_state;
    std::vector<WhisperTensorSpec> s = {
        {"encoder.positional_embedding", {audio, h.n_audio_ctx}, K::kF32Only},
        {"encoder.conv1.weight", {3, h.n_mels, audio}, K::kConvolution},
        {"encoder.conv1.bias", {1, audio}, K::kF32Only},
        {"encoder.conv2.weight", {3, audio, audio}, K::kConvolution},
        {"encoder.conv2.bias", {1, audio}, K::kF32Only},
        {"encoder.ln_post.weight", {audio}, K::kF32Only},
        {"encoder.ln_post.bias", {audio}, K::kF32Only},
    };
    const auto block = [&](const std::string& p, int64_t w, bool cross) {
        s.push_back({p + "mlp_ln.weight", {w}, K::kF32Only});
        s.push_back({p + "mlp_ln.bias", {w}, K::kF32Only});
        s.push_back({p + "mlp.0.weight", {w, 4 * w}, K::kMatrix});
        s.push_back({p + "mlp.0.bias", {4 * w}, K::kF32Only});
        s.push_back({p + "mlp.2.weight", {4 * w, w}, K::kMatrix});
        s.push_back({p + "mlp.2.bias", {w}, K::kF32Only});
        const std::vector<std::string> attentions =
            cross ? std::vector<std::string>{"attn", "cross_attn"}
                  : std::vector<std::string>{"attn"};
        for (const std::string& attn : attentions) {
            s.push_back({p + attn + "_ln.weight", {w}, K::kF32Only});
            s.push_back({p + attn + "_ln.bias", {w}, K::kF32Only});
            s.push_back({p + attn + ".query.weight", {w, w}, K::kMatrix});
            s.push_back({p + attn + ".query.bias", {w}, K::kF32Only});
            s.push_back({p + attn + ".key.weight", {w, w}, K::kMatrix});
            s.push_back({p + attn + ".value.weight", {w, w}, K::kMatrix});
            s.push_back({p + attn + ".value.bias", {w}, K::kF32Only});
            s.push_back({p + attn + ".out.weight", {w, w}, K::kMatrix});
            s.push_back({p + attn + ".out.bias", {w}, K::kF32Only});
        }
    };
    for (int i = 0; i < h.n_audio_layer; ++i)
        block("encoder.blocks." + std::to_string(i) + ".", audio, false);
    s.push_back({"decoder.positional_embedding", {text, h.n_text_ctx}, K::kF32Only});
    s.push_back({"decoder.token_embedding.weight", {text, h.n_vocab}, K::kMatrix});
    s.push_back({"decoder.ln.weight", {text}, K::kF32Only});
    s.push_back({"decoder.ln.bias", {text}, K::kF32Only});
    for (int i = 0; i < h.n_text_layer; ++i)
        block("decoder.blocks." + std::to_string(i) + ".", text, true);
    return s;
}

const GgufTensorInfo* WhisperGgmlFile::find_tensor(const std::string& name) const {
    for (const auto& t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

Status WhisperGgmlFile::parse(std::span<const uint8_t> bytes, WhisperGgmlFile* out) try {
    WhisperGgmlFile f;
    Reader r(bytes);
    uint32_t magic = 0;
    if (bytes.size() < 4)
        return FormatError("not a whisper.cpp model file: shorter than its magic");
    SPECULA_TRY(r.read("magic", &magic));
    if (magic != kWhisperGgmlMagic) {
        char hex[16];
        std::snprintf(hex, sizeof hex, "0x%08x", magic);
        return FormatError(std::string("not a whisper.cpp model file: magic ") + hex +
                           " (expected 0x67676d6c)");
    }
    WhisperHparams& h = f.hparams_;
    for (int32_t* field :
         {&h.n_vocab, &h.n_audio_ctx, &h.n_audio_state, &h.n_audio_head, &h.n_audio_layer,
          &h.n_text_ctx, &h.n_text_state, &h.n_text_head, &h.n_text_layer, &h.n_mels, &h.ftype})
        SPECULA_TRY(r.read("hyperparameters", field));
    SPECULA_TRY(check_hparams(h));
    if (h.ftype < 0) return at(44, "negative file type " + std::to_string(h.ftype));
    f.quantization_version_ = h.ftype / kQuantVersionFactor;
    h.ftype %= kQuantVersionFactor;
    if (!whisper_ftype_weight_type(h.ftype, &f.weight_type_)) {
        if (h.ftype == 4 || (h.ftype >= 10 && h.ftype <= 14))
            return Unsupported("whisper model file type " + std::to_string(h.ftype) +
                               " (Q4_1 with F16 or a K-quant) is not supported; F32, F16, Q4_0, "
                               "Q4_1, Q5_0, Q5_1 and Q8_0 are");
        return at(44, "unknown file type " + std::to_string(h.ftype));
    }

    int32_t n_mel = 0, n_fft = 0;
    const size_t filters_at = r.pos();
    SPECULA_TRY(r.read("the mel filters' band count", &n_mel));
    SPECULA_TRY(r.read("the mel filters' bin count", &n_fft));
    if (n_mel != h.n_mels)
        return at(filters_at, std::to_string(n_mel) + " mel filters for a model of " +
                                  std::to_string(h.n_mels) + " mel bands");
    if (n_fft != kFftBins)
        return at(filters_at + 4, "mel filters of " + std::to_string(n_fft) +
                                      " frequency bins (Whisper's 400-point transform has 201)");
    std::span<const uint8_t> filters;
    SPECULA_TRY(r.take("the mel filters", size_t(n_mel) * kFftBins * sizeof(float), &filters));
    f.n_mel_filters_ = n_mel;
    f.mel_filters_.resize(size_t(n_mel) * kFftBins);
    std::memcpy(f.mel_filters_.data(), filters.data(), filters.size());

    int32_t n_tokens = 0;
    const size_t vocab_at = r.pos();
    SPECULA_TRY(r.read("the vocabulary size", &n_tokens));
    if (n_tokens < 0 || n_tokens > h.n_vocab)
        return at(vocab_at, "a vocabulary of " + std::to_string(n_tokens) +
                                " tokens for a model of " + std::to_string(h.n_vocab));
    f.vocab_.reserve(size_t(n_tokens));
    for (int32_t i = 0; i < n_tokens; ++i) {
        uint32_t len = 0;
        SPECULA_TRY(r.read("a token's length", &len));
        std::span<const uint8_t> text;
        SPECULA_TRY(r.take("token " + std::to_string(i), len, &text));
        f.vocab_.emplace_back(reinterpret_cast<const char*>(text.data()), text.size());
    }

    const std::vector<WhisperTensorSpec> specs = whisper_tensor_specs(h);
    std::map<std::string_view, size_t> spec_of;
    for (size_t i = 0; i < specs.size(); ++i)
        spec_of[specs[i].name] = i;
    std::vector<bool> seen(specs.size(), false);
    while (r.left() > 0) {
        const size_t record_at = r.pos();
        int32_t n_dims = 0, name_len = 0, type_id = 0;
        SPECULA_TRY(r.read("a tensor's dimension count", &n_dims));
        SPECULA_TRY(r.read("a tensor's name length", &name_len));
        SPECULA_TRY(r.read("a tensor's type", &type_id));
        if (n_dims < 1 || n_dims > 4)
            return at(record_at, "a tensor of " + std::to_string(n_dims) + " dimensions");
        if (name_len < 1 || name_len > kMaxNameBytes)
            return at(record_at + 4, "a tensor name of " + std::to_string(name_len) + " bytes");
        GgufTensorInfo t;
        t.type = GgmlType(uint32_t(type_id));
        for (int32_t d = 0; d < n_dims; ++d) {
            int32_t ne = 0;
            SPECULA_TRY(r.read("a tensor's dimensions", &ne));
            t.shape.push_back(ne);
        }
        std::span<const uint8_t> name;
        SPECULA_TRY(r.take("a tensor's name", size_t(name_len), &name));
        t.name.assign(reinterpret_cast<const char*>(name.data()), name.size());
        const auto found = spec_of.find(t.name);
        if (found == spec_of.end())
            return at(record_at, "unknown tensor '" + t.name + "' (not a Whisper model's)");
        const WhisperTensorSpec& spec = specs[found->second];
        if (seen[found->second]) return at(record_at, "tensor '" + t.name + "' appears twice");
        seen[found->second] = true;
        if (t.shape != spec.shape) {
            std::string got, want;
            for (int64_t d : t.shape)
                got += (got.empty() ? "" : " x ") + std::to_string(d);
            for (int64_t d : spec.shape)
                want += (want.empty() ? "" : " x ") + std::to_string(d);
            return at(record_at, "tensor '" + t.name + "' is " + got + ", this model's is " + want);
        }
        const GgmlTypeTraits* traits = ggml_type_traits(t.type);
        const bool allowed =
            traits != nullptr &&
            (t.type == GgmlType::kF32 ||
             (spec.kind == WhisperTensorSpec::Kind::kConvolution && t.type == GgmlType::kF16) ||
             (spec.kind == WhisperTensorSpec::Kind::kMatrix && is_whisper_matrix_type(t.type)));
        if (!allowed)
            return at(record_at + 8, "tensor '" + t.name + "' has type " + std::to_string(type_id) +
                                         " (" + ggml_type_name(t.type) +
                                         "), which Whisper's files do not use there");
        if (t.shape[0] % int64_t(traits->block_size) != 0)
            return at(record_at, "tensor '" + t.name + "' rows of " + std::to_string(t.shape[0]) +
                                     " are not whole " + ggml_type_name(t.type) + " blocks");
        if (!ggml_tensor_bytes(t.type, t.shape, &t.n_elements, &t.n_bytes))
            return at(record_at, "tensor '" + t.name + "' has an impossible size");
        t.offset = r.pos();
        SPECULA_TRY(r.take("the data of tensor '" + t.name + "'", size_t(t.n_bytes), &t.data));
        f.tensors_.push_back(std::move(t));
    }
    if (!f.tensors_.empty())
        for (size_t i = 0; i < specs.size(); ++i)
            if (!seen[i])
                return FormatError("whisper model file has no tensor '" + specs[i].name + "' (" +
                                   std::to_string(f.tensors_.size()) + " of " +
                                   std::to_string(specs.size()) + " present)");
    *out = std::move(f);
    return Status::Ok();
} catch (const std::bad_alloc&) {
    return OutOfMemory("cannot allocate the tables of a whisper model file");
}

}  // namespace specula
