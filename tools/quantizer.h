// Rewrites a GGUF model with its weight matrices in another type: one type for every matrix
// (q8_0, q4_k, ...) or the mixes llama.cpp's users know (q4_k_m, q5_k_m). Everything else
// (metadata, tokenizer, norms) is copied as it is.
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include "core/status.h"
#include "format/gguf.h"

namespace specula {

struct QuantizeOptions {
    std::string scheme;             // f32, f16, q4_0 ... q6_k, q4_k_m, q5_k_m
    bool allow_requantize = false;  // matrices already quantized are decoded and requantized
    // One type for output.weight instead of the scheme's (llama-quantize's --output-tensor-type):
    // a draft's head is as large as its target's and a fifth to half of what a draft call reads.
    std::string output_type;  // "" = the scheme's; else a one-type scheme (q4_k, q8_0, ...)
};

struct QuantizeReport {
    std::map<std::string, GgmlType> types;  // tensor name -> the type written
    size_t bytes_in = 0, bytes_out = 0;     // the tensors' data
};

// The schemes quantize_gguf() takes, for messages: "f32, f16, q4_0, ..."
std::string quantize_scheme_names();

// The type `scheme` gives tensor `name` of a model with `n_layer` blocks whose rows are `cols`
// weights long. The K-quant mixes follow llama.cpp's: output.weight Q6_K; attn_v and ffn_down
// Q6_K in the first and last eighth of the blocks and every third one between, the base type
// (Q4_K, Q5_K) elsewhere. Rows that are not whole super-blocks take llama.cpp's fallbacks
// (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0).
// `output_type`, when not empty, names the type of output.weight (a one-type scheme).
Status quantized_type(const std::string& scheme, const std::string& name, int n_layer, int64_t cols,
                      GgmlType* out, const std::string& output_type = "");

Status quantize_gguf(const std::string& in_path, const std::string& out_path,
                     const QuantizeOptions& options, QuantizeReport* report);

}  // namespace specula
