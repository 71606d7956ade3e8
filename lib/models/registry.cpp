#include "models/registry.h"

#include <array>
#include <cstring>

#include "format/gguf.h"
#include "format/whisper_ggml.h"
#include "models/llama.h"

namespace specula {
namespace {

struct Architecture {
    std::string_view container, name;
    ModelKind kind;
};

// Every architecture a model class reads: LlamaModel's in GGUF, and Whisper in ggml.
constexpr auto kArchitectures = [] {
    std::array<Architecture, LlamaModel::kArchitectures.size() + 1> all{};
    for (size_t i = 0; i < LlamaModel::kArchitectures.size(); ++i)
        all[i] = {"GGUF", LlamaModel::kArchitectures[i], ModelKind::kText};
    all.back() = {"ggml", "whisper", ModelKind::kSpeech};
    return all;
}();

std::string known_architectures() {
    std::string s;
    for (const Architecture& a : kArchitectures)
        s += (s.empty() ? "" : ", ") + std::string(a.name) + " in " + std::string(a.container);
    return s;
}

const char* loader_of(ModelKind kind) {
    return kind == ModelKind::kText ? "specula_model_load" : "specula_asr_model_load";
}

const char* noun_of(ModelKind kind) {
    return kind == ModelKind::kText ? "a text model" : "a speech model";
}

}  // namespace

Status identify_model(std::span<const uint8_t> bytes, ModelIdentity* out) {
    ModelIdentity id;
    uint32_t magic = 0;
    if (bytes.size() >= sizeof magic) std::memcpy(&magic, bytes.data(), sizeof magic);
    if (bytes.size() >= 4 && std::memcmp(bytes.data(), "GGUF", 4) == 0) {
        GgufFile gguf;
        SPECULA_TRY(GgufFile::parse(bytes, &gguf));
        id.container = "GGUF";
        SPECULA_TRY(gguf.get_string("general.architecture", &id.architecture));
    } else if (magic == kWhisperGgmlMagic) {
        id.container = "ggml";
        id.architecture = "whisper";
    } else {
        return FormatError("at offset 0: neither a GGUF file nor a whisper.cpp ggml file (magic)");
    }
    for (const Architecture& a : kArchitectures) {
        if (a.container == id.container && a.name == id.architecture) {
            id.kind = a.kind;
            *out = std::move(id);
            return Status::Ok();
        }
    }
    return Unsupported("model architecture '" + id.architecture + "' in " +
                       std::string(id.container) + " (known: " + known_architectures() + ")");
}

Status expect_model(std::span<const uint8_t> bytes, ModelKind kind, ModelIdentity* out) {
    SPECULA_TRY(identify_model(bytes, out));
    if (out->kind != kind)
        return Unsupported("'" + out->architecture + "' is " + noun_of(out->kind) + ", not " +
                           noun_of(kind) + ": " + loader_of(out->kind) + " loads it");
    return Status::Ok();
}

}  // namespace specula
