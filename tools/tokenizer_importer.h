// A Hugging Face tokenizer.json (+ tokenizer_config.json) as GGUF tokenizer metadata
// (tokenizer.ggml.*), written to a vocabulary-only GGUF file. Byte-level BPE tokenizers (GPT-2,
// Llama 3, Qwen2/3) become "gpt2" with the pre-tokenizer their Split regex names;
// SentencePiece-style BPE with byte fallback (Llama 2, Gemma) becomes "llama" with each token's
// merge priority as its score, a space prefix where its normalizer prepends one. What specula
// cannot tokenize exactly is refused.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace specula {

// config_path may be empty. vocab_size > 0 pads the vocabulary with unused tokens "[PAD<id>]"
// to that many ids, as llama.cpp's converter pads it to a model's embedding rows.
Status import_tokenizer(const std::string& tokenizer_path, const std::string& config_path,
                        int64_t vocab_size, const std::string& out);

}  // namespace specula
