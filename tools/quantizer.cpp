#include "quantizer.h"

#include <cctype>
#include <vector>

#include "format/quant.h"
#include "platform/mapped_file.h"

namespace specula {

namespace {

struct Scheme {
    const char* name;
    GgmlType base;
    bool k_mix;     // llama.cpp's _M rules on top of the base type
    int file_type;  // llama.cpp's general.file_type, or -1 where none names it exactly
};

constexpr Scheme kSchemes[] = {
    {"f32", GgmlType::kF32, false, 0},     {"f16", GgmlType::kF16, false, 1},
    {"q4_0", GgmlType::kQ4_0, false, 2},   {"q4_1", GgmlType::kQ4_1, false, 3},
    {"q5_0", GgmlType::kQ5_0, false, 8},   {"q5_1", GgmlType::kQ5_1, false, 9},
    {"q8_0", GgmlType::kQ8_0, false, 7},   {"q4_k", GgmlType::kQ4_K, false, -1},
    {"q5_k", GgmlType::kQ5_K, false, -1},  {"q6_k", GgmlType::kQ6_K, false, 18},
    {"q4_k_m", GgmlType::kQ4_K, true, 15}, {"q5_k_m", GgmlType::kQ5_K, true, 17},
};

const Scheme* find_scheme(const std::string& name) {
    for (const Scheme& s : kSchemes)
        if (name == s.name) return &s;
    return nullptr;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between.
bool more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// The block index of "blk.N.*", or -1.
int layer_of(const std::string& name) {
    if (!name.starts_with("blk.")) return -1;
    int n = 0;
    size_t i = 4;
    if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
    for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i)
        n = n * 10 + (name[i] - '0');
    return n;
}

bool is_quantized(GgmlType t) {
    return t != GgmlType::kF32 && t != GgmlType::kF16;
}

}  // namespace

std::string quantize_scheme_names() {
    std::string names;
    for (const Scheme& s : kSchemes)
        names += (names.empty() ? "" : ", ") + std::string(s.name);
    return names;
}

Status quantized_type(const std::string& scheme, const std::string& name, int n_layer, int64_t cols,
                      GgmlType* out, const std::string& output_type) {
    const Scheme* s = find_scheme(scheme);
    if (s == nullptr)
        return InvalidArgument("unknown scheme '" + scheme + "' (" + quantize_scheme_names() + ")");
    const Scheme* output = output_type.empty() ? nullptr : find_scheme(output_type);
    if (!output_type.empty() && (output == nullptr || output->k_mix))
        return InvalidArgument("unknown output tensor type '" + output_type + "' (" +
                               quantize_scheme_names() + ", less the mixes)");
    GgmlType t = s->base;
    if (output != nullptr && name == "output.weight") {
        t = output->base;
    } else if (s->k_mix) {
        const int layer = layer_of(name);
        if (name == "output.weight") {
            t = GgmlType::kQ6_K;
        } else if ((name.ends_with(".attn_v.weight") || name.ends_with(".ffn_down.weight")) &&
                   layer >= 0 && more_bits(layer, n_layer)) {
            t = GgmlType::kQ6_K;
        }
    }
    if (cols % int64_t(ggml_type_traits(t)->block_size) != 0) {
        switch (t) {
            case GgmlType::kQ4_K:
                t = GgmlType::kQ5_0;
                break;
            case GgmlType::kQ5_K:
                t = GgmlType::kQ5_1;
                break;
            case GgmlType::kQ6_K:
                t = GgmlType::kQ8_0;
                break;
            default:
                break;
        }
        if (cols % int64_t(ggml_type_traits(t)->block_size) != 0) t = GgmlType::kF16;
    }
    *out = t;
    return Status::Ok();
}

Status quantize_gguf(const std::string& in_path, const std::string& out_path,
                     const QuantizeOptions& options, QuantizeReport* report) {
    const Scheme* scheme = find_scheme(options.scheme);
    if (scheme == nullptr)
        return InvalidArgument("unknown scheme '" + options.scheme + "' (" +
                               quantize_scheme_names() + ")");
    GgmlType output_type{};  // checked before any work
    SPECULA_TRY(
        quantized_type(options.scheme, "output.weight", 1, 0, &output_type, options.output_type));
    std::unique_ptr<MappedFile> file;
    SPECULA_TRY(MappedFile::open(in_path, &file));
    GgufFile in;
    SPECULA_TRY(GgufFile::parse(file->bytes(), &in));
    std::string arch;
    SPECULA_TRY(in.get_string("general.architecture", &arch));
    int64_t n_layer = 0;
    SPECULA_TRY(in.get_int(arch + ".block_count", &n_layer));

    GgufWriter w;
    for (const auto& [key, value] : in.metadata())
        if (key != "general.file_type" && key != "general.quantization_version" &&
            key != "general.alignment")
            w.set(key, value);
    if (scheme->file_type >= 0) w.set_u32("general.file_type", uint32_t(scheme->file_type));

    QuantizeReport r;
    bool any_quantized = false;
    for (const GgufTensorInfo& t : in.tensors()) {
        r.bytes_in += t.n_bytes;
        GgmlType type = t.type;
        // Matrices (two or more dimensions) take the scheme's type; vectors (norms, biases)
        // are copied.
        if (t.shape.size() >= 2 && t.name.ends_with(".weight"))
            SPECULA_TRY(quantized_type(options.scheme, t.name, int(n_layer), t.shape[0], &type,
                                       options.output_type));
        std::vector<uint8_t> data;
        if (type == t.type) {
            data.assign(t.data.begin(), t.data.end());
        } else {
            if (!is_runnable_weight_type(t.type))
                return Unsupported("tensor '" + t.name + "' has type " + ggml_type_name(t.type) +
                                   ", which cannot be decoded here");
            if (is_quantized(t.type) && !options.allow_requantize)
                return InvalidArgument("tensor '" + t.name + "' is already " +
                                       ggml_type_name(t.type) +
                                       ": requantizing loses more than quantizing the original "
                                       "F32/F16 weights (allow it with --allow-requantize)");
            uint64_t n = 0, bytes = 0;
            if (!ggml_tensor_bytes(type, t.shape, &n, &bytes))
                return InvalidArgument("tensor '" + t.name + "' cannot be stored as " +
                                       ggml_type_name(type));
            const auto cols = size_t(t.shape[0]);
            const size_t rows = n / cols;
            const size_t in_row = t.n_bytes / rows, out_row = size_t(bytes) / rows;
            data.resize(size_t(bytes));
            std::vector<float> row(cols);
            for (size_t i = 0; i < rows; ++i) {
                dequantize_row(t.type, t.data.data() + i * in_row, row.data(), cols);
                quantize_row(type, row.data(), data.data() + i * out_row, cols);
            }
        }
        any_quantized |= is_quantized(type);
        r.types[t.name] = type;
        r.bytes_out += data.size();
        SPECULA_TRY(w.add_tensor(t.name, type, t.shape, std::move(data)));
    }
    if (any_quantized) w.set_u32("general.quantization_version", 2);
    SPECULA_TRY(w.write(out_path));
    if (report != nullptr) *report = std::move(r);
    return Status::Ok();
}

}  // namespace specula
