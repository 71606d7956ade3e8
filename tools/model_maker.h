// Writes Llama-architecture GGUF files with random weights of chosen shapes
// and a real tokenizer copied from another GGUF: the models tests and
// benchmarks run on when no trained weights are at hand.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "format/gguf.h"

namespace specula {

struct RandomLlamaSpec {
    std::string vocab_path;  // a GGUF with tokenizer.ggml.* metadata
    int n_embd = 256;
    int n_layer = 2;
    int n_head = 4;
    int n_head_kv = 2;
    int n_ff = 512;
    int n_ctx = 512;
    int n_vocab = 0;  // 0: the vocabulary's size; smaller truncates it (tests only)
    GgmlType weight_type = GgmlType::kQ8_0;
    bool tied_output = false;
    uint64_t seed = 1;
    std::string name = "random-llama";
};

Status write_random_llama(const RandomLlamaSpec& spec, const std::string& path);
Status parse_weight_type(const std::string& name, GgmlType* out);

}  // namespace specula
