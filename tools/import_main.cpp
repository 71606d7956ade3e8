// specula-import: turns a manifest (JSON metadata + tensor list) and a raw
// float32 tensor file, as tools/train/train.py exports them, into a GGUF file
// written by specula's own GGUF writer, quantizing the weight matrices.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "format/gguf.h"
#include "format/quant.h"
#include "model_maker.h"

using namespace specula;

namespace {

// A manifest tensor's float32 data (at its offset in `data`) as rows of `type`.
Status read_tensor(std::ifstream& data, const nlohmann::json& t, GgmlType type,
                   const std::vector<int64_t>& shape, std::vector<uint8_t>* out) {
    const std::string name = t.at("name");
    uint64_t count = 0, bytes = 0;
    if (!ggml_tensor_bytes(type, shape, &count, &bytes))
        return InvalidArgument(name + ": its rows do not fit type " + ggml_type_name(type));
    std::vector<float> values(count);
    data.seekg(std::streamoff(t.at("offset").get<uint64_t>() * sizeof(float)));
    data.read(reinterpret_cast<char*>(values.data()), std::streamsize(count * sizeof(float)));
    if (!data) return FormatError("tensor data ends early at " + name);
    out->resize(bytes);
    const size_t cols = size_t(shape[0]), rows = count / cols;
    for (size_t r = 0; r < rows; ++r)
        quantize_row(type, values.data() + r * cols, out->data() + r * (bytes / rows), cols);
    return Status::Ok();
}

Status set_metadata(GgufWriter& w, const std::string& key, const nlohmann::json& entry) {
    const std::string type = entry.at(0);
    const nlohmann::json& v = entry.at(1);
    if (type == "str") {
        w.set_string(key, v.get<std::string>());
    } else if (type == "u32") {
        w.set_u32(key, v.get<uint32_t>());
    } else if (type == "f32") {
        w.set_f32(key, v.get<float>());
    } else if (type == "bool") {
        w.set_bool(key, v.get<bool>());
    } else if (type == "str_array") {
        w.set(key,
              {GgufType::kArray, GgufType::kString, GgufArray(v.get<std::vector<std::string>>())});
    } else if (type == "i32_array") {
        w.set(key, {GgufType::kArray, GgufType::kInt32, GgufArray(v.get<std::vector<int64_t>>())});
    } else {
        return InvalidArgument("metadata '" + key + "' has unknown type '" + type + "'");
    }
    return Status::Ok();
}

// A Whisper manifest (tools/train/train_asr.py): the hyperparameters and tensors by
// whisper.cpp's names; the file gets the header's mel filters and vocabulary.
Status write_whisper_file(const nlohmann::json& manifest, std::ifstream& data,
                          const std::string& header, const std::string& out, GgmlType type) {
    if (header.empty())
        return InvalidArgument(
            "a Whisper manifest needs --whisper-header (mel filters, vocabulary)");
    WhisperFileSpec spec;
    spec.header_path = header;
    spec.weight_type = type;
    const nlohmann::json& hp = manifest.at("hparams");
    WhisperHparams& h = spec.hparams;
    for (auto [key, field] : {std::pair{"n_vocab", &h.n_vocab},
                              {"n_audio_ctx", &h.n_audio_ctx},
                              {"n_audio_state", &h.n_audio_state},
                              {"n_audio_head", &h.n_audio_head},
                              {"n_audio_layer", &h.n_audio_layer},
                              {"n_text_ctx", &h.n_text_ctx},
                              {"n_text_state", &h.n_text_state},
                              {"n_text_head", &h.n_text_head},
                              {"n_text_layer", &h.n_text_layer},
                              {"n_mels", &h.n_mels}})
        *field = hp.at(key).get<int32_t>();
    std::map<std::string, const nlohmann::json*> by_name;
    for (const auto& t : manifest.at("tensors"))
        by_name[t.at("name").get<std::string>()] = &t;
    return write_whisper(
        spec,
        [&](const WhisperTensorSpec& want, GgmlType tt, std::vector<uint8_t>* bytes_out) {
            const auto it = by_name.find(want.name);
            if (it == by_name.end()) return FormatError("the manifest has no " + want.name);
            const nlohmann::json& t = *it->second;
            if (t.at("shape").get<std::vector<int64_t>>() != want.shape)
                return FormatError(want.name + " has another shape than the hyperparameters give");
            return read_tensor(data, t, tt, want.shape, bytes_out);
        },
        out);
}

Status run(const std::string& manifest_path, const std::string& out, GgmlType type,
           const std::string& whisper_header) {
    std::ifstream mf(manifest_path);
    if (!mf) return IoError("cannot open " + manifest_path);
    const nlohmann::json manifest = nlohmann::json::parse(mf);
    const std::string dir = manifest_path.substr(0, manifest_path.find_last_of('/') + 1);
    std::ifstream data(dir + manifest.at("data").get<std::string>(), std::ios::binary);
    if (!data) return IoError("cannot open the tensor data beside " + manifest_path);
    if (manifest.value("format", "gguf") == "whisper")
        return write_whisper_file(manifest, data, whisper_header, out, type);
    GgufWriter w;
    for (const auto& [key, entry] : manifest.at("metadata").items())
        SPECULA_TRY(set_metadata(w, key, entry));
    for (const auto& t : manifest.at("tensors")) {
        const std::vector<int64_t> shape = t.at("shape");
        const GgmlType tt = t.at("quantize").get<bool>() ? type : GgmlType::kF32;
        std::vector<uint8_t> bytes;
        SPECULA_TRY(read_tensor(data, t, tt, shape, &bytes));
        SPECULA_TRY(w.add_tensor(t.at("name"), tt, shape, std::move(bytes)));
    }
    return w.write(out);
}

}  // namespace

int main(int argc, char** argv) {
    std::string manifest, out, type = "q8_0", whisper_header;
    CLI::App app{
        "Write a GGUF model (or a whisper.cpp model file) from a manifest and raw "
        "float32 tensors"};
    app.add_option("manifest", manifest,
                   "the .manifest.json written by tools/train/train.py or train_asr.py")
        ->required();
    app.add_option("-o,--output", out, "output GGUF path")->required();
    app.add_option(
        "--type", type,
        "type of the weight matrices: f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k");
    app.add_option("--whisper-header", whisper_header,
                   "for a Whisper manifest: the whisper.cpp file whose mel filters and vocabulary "
                   "the model gets (e.g. for-tests-ggml-tiny.en.bin)");
    CLI11_PARSE(app, argc, argv);
    GgmlType t{};
    Status s = parse_weight_type(type, &t);
    if (s.ok()) {
        try {
            s = run(manifest, out, t, whisper_header);
        } catch (const std::exception& e) {
            s = FormatError(std::string("malformed manifest: ") + e.what());
        }
    }
    if (!s.ok()) {
        std::fprintf(stderr, "specula-import: %s\n", s.message().c_str());
        return 1;
    }
    return 0;
}
