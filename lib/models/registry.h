// Which model a file holds, read from its first bytes: the container (GGUF, or whisper.cpp's
// ggml .bin) and the architecture, and so which model class loads it. The C API asks here before
// it loads anything, so a file of another kind or an unknown architecture is refused by name.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "core/status.h"

namespace specula {

enum class ModelKind {
    kText,    // a causal LLM: LlamaModel (specula_model_load)
    kSpeech,  // speech recognition: WhisperModel (specula_asr_model_load)
};

struct ModelIdentity {
    std::string_view container;  // "GGUF" or "ggml"
    std::string architecture;    // general.architecture, or "whisper" for a ggml .bin
    ModelKind kind = ModelKind::kText;
};

// SPECULA_ERR_FORMAT for bytes of neither container (or a GGUF without general.architecture),
// SPECULA_ERR_UNSUPPORTED naming an architecture no model reads, with the ones known.
Status identify_model(std::span<const uint8_t> bytes, ModelIdentity* out);

// identify_model, and SPECULA_ERR_UNSUPPORTED when the file holds a model of another kind
// (naming it, and the call that loads it).
Status expect_model(std::span<const uint8_t> bytes, ModelKind kind, ModelIdentity* out);

}  // namespace specula
