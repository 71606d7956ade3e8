// whisper.cpp's model files (`ggml-*.bin`), read in place: the magic 0x67676d6c, 11 int32
// hyperparameters, the mel filters, the vocabulary, then tensor records to the end of the
// file (int32 n_dims, name length, ggml type; the dims, contiguous one first; the name; the
// data, unpadded). Tensor names and shapes are whisper.cpp's (src/whisper.cpp,
// whisper_model_load); every record is checked against them. A file with no tensor records
// at all is valid (whisper.cpp's `for-tests-*` files: header, filters and vocabulary only).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "format/gguf.h"

namespace specula {

constexpr uint32_t kWhisperGgmlMagic = 0x67676d6c;  // "ggml", little-endian

struct WhisperHparams {
    int32_t n_vocab = 0;
    int32_t n_audio_ctx = 0;  // encoder positions (1500 for 30 s; some files have fewer)
    int32_t n_audio_state = 0;
    int32_t n_audio_head = 0;
    int32_t n_audio_layer = 0;
    int32_t n_text_ctx = 0;  // decoder positions (448)
    int32_t n_text_state = 0;
    int32_t n_text_head = 0;
    int32_t n_text_layer = 0;
    int32_t n_mels = 0;
    int32_t ftype = 0;  // ggml file type, without the quantization version (ftype % 1000)
};

class WhisperGgmlFile {
  public:
    // Malformed files are SPECULA_ERR_FORMAT naming the byte offset and the reason; a ggml file
    // type this reader knows but specula does not (K-quants, Q4_1 with some F16) is
    // SPECULA_ERR_UNSUPPORTED. Tensor data spans point into `bytes`, which must outlive this.
    static Status parse(std::span<const uint8_t> bytes, WhisperGgmlFile* out);

    const WhisperHparams& hparams() const { return hparams_; }
    int32_t quantization_version() const { return quantization_version_; }
    GgmlType weight_type() const { return weight_type_; }  // the matrices' type by ftype
    int n_mel_filters() const { return n_mel_filters_; }
    // n_mel_filters() rows of 201 weights (frequency bins of a 400-point transform).
    const std::vector<float>& mel_filters() const { return mel_filters_; }
    // The tokens as stored (text bytes); whisper.cpp names the ids past them (special tokens).
    const std::vector<std::string>& vocab() const { return vocab_; }
    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
    bool has_weights() const { return !tensors_.empty(); }
    const GgufTensorInfo* find_tensor(const std::string& name) const;

  private:
    WhisperHparams hparams_;
    int32_t quantization_version_ = 0;
    GgmlType weight_type_ = GgmlType::kF32;
    int n_mel_filters_ = 0;
    std::vector<float> mel_filters_;
    std::vector<std::string> vocab_;
    std::vector<GgufTensorInfo> tensors_;
};

// The tensors a Whisper model of these hyperparameters has, in whisper.cpp's order, with
// their shapes (ggml order) and the types allowed for each: biases, norms and positional
// embeddings F32; the convolutions F32 or F16; the matrices any weight type (the writer
// gives them weight_type, the convolutions F16 unless weight_type is F32).
struct WhisperTensorSpec {
    std::string name;
    std::vector<int64_t> shape;
    enum class Kind { kF32Only, kConvolution, kMatrix } kind;
};
std::vector<WhisperTensorSpec> whisper_tensor_specs(const WhisperHparams& h);

// The ggml type of a whisper.cpp file type (0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 7 Q8_0, 8 Q5_0,
// 9 Q5_1); false for others.
bool whisper_ftype_weight_type(int32_t ftype, GgmlType* out);

}  // namespace specula
