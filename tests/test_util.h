// Shared helpers for the tests: where test data lives and small random models.
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model_maker.h"
#include "models/llama.h"
#include "platform/mapped_file.h"

namespace specula::test {

inline std::string data_path(const std::string& name) {
    return std::string(SPECULA_TEST_DATA_DIR) + "/" + name;
}

// A whole file's bytes (empty when it cannot be read).
inline std::vector<char> read_file_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), {}};
}

// The build tree's folder for files the tests write (ctest runs each test as its own process,
// so names that tests share must be written whole before they are read: see small_whisper()).
inline std::filesystem::path temp_dir() {
    const std::filesystem::path dir = SPECULA_TEST_TMP_DIR;
    std::filesystem::create_directories(dir);
    return dir;
}

// The shape most tests use: 2 layers of 128 wide, 4 heads over 2 KV heads, FFN 256
// (grouped-query attention and real tensor layouts at a size that runs fast).
inline RandomLlamaSpec small_spec(GgmlType type, uint64_t seed) {
    RandomLlamaSpec spec;
    spec.n_embd = 128;
    spec.n_layer = 2;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.n_ff = 256;
    spec.n_ctx = 256;
    if (ggml_type_traits(type)->block_size > 128) {  // K-quant rows: super-blocks of 256
        spec.n_embd = 256;
        spec.n_ff = 512;
    }
    spec.weight_type = type;
    spec.seed = seed;
    return spec;
}

// A small random Llama model with the SentencePiece vocabulary, written once per spec.
// The Llama-family model of a GGUF file on `backend` (a failed test and null when it does not
// load).
inline std::unique_ptr<LlamaModel> load_llama(Backend& backend, const std::string& path) {
    std::unique_ptr<MappedFile> file;
    EXPECT_TRUE(MappedFile::open(path, &file).ok());
    std::unique_ptr<LlamaModel> m;
    const Status s = LlamaModel::load(backend, std::move(file), nullptr, &m);
    EXPECT_TRUE(s.ok()) << s.message();
    return m;
}

inline std::string make_model(const std::string& name, RandomLlamaSpec spec) {
    if (spec.vocab_path.empty()) spec.vocab_path = data_path("ggml-vocab-llama-spm.gguf");
    const std::string path = (temp_dir() / (name + ".gguf")).string();
    const Status s = write_random_llama(spec, path);
    if (!s.ok()) throw std::runtime_error(s.message());
    return path;
}

// A GGUF file written again with changes: `metadata` edits the key/value pairs in place, and
// `tensor`, where it returns true, gives a tensor a new shape and bytes, or leaves it out with an
// empty shape (files that differ from another in one respect).
struct GgufEdit {
    std::function<void(std::vector<std::pair<std::string, GgufValue>>*)> metadata;
    std::function<bool(const GgufTensorInfo&, std::vector<int64_t>*, std::vector<uint8_t>*)> tensor;
};
inline Status write_edited_gguf(const std::string& src, const GgufEdit& edit,
                                const std::string& dst) {
    std::unique_ptr<MappedFile> file;
    SPECULA_TRY(MappedFile::open(src, &file));
    GgufFile gguf;
    SPECULA_TRY(GgufFile::parse(file->bytes(), &gguf));
    std::vector<std::pair<std::string, GgufValue>> metadata = gguf.metadata();
    if (edit.metadata) edit.metadata(&metadata);
    GgufWriter w;
    for (auto& [key, value] : metadata)
        w.set(key, std::move(value));
    for (const GgufTensorInfo& t : gguf.tensors()) {
        std::vector<int64_t> shape = t.shape;
        std::vector<uint8_t> data;
        if (!edit.tensor || !edit.tensor(t, &shape, &data))
            data.assign(t.data.begin(), t.data.end());
        else if (shape.empty())
            continue;  // left out
        SPECULA_TRY(w.add_tensor(t.name, t.type, std::move(shape), std::move(data)));
    }
    return w.write(dst);
}

// The value of `key` among GGUF metadata (nullptr when absent).
inline GgufValue* find_value(std::vector<std::pair<std::string, GgufValue>>* metadata,
                             const std::string& key) {
    for (auto& [k, v] : *metadata)
        if (k == key) return &v;
    return nullptr;
}

}  // namespace specula::test
