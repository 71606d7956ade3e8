// GGUF v2/v3: metadata, tensor infos and the data section, parsed from bytes
// (a memory mapping or a fuzzer's buffer) with every length, count, offset and
// size checked before use. A GgufFile refers into those bytes; whoever owns the
// mapping keeps it alive.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "core/status.h"

namespace specula {

enum class GgufType : uint32_t {
    kUint8 = 0,
    kInt8 = 1,
    kUint16 = 2,
    kInt16 = 3,
    kUint32 = 4,
    kInt32 = 5,
    kFloat32 = 6,
    kBool = 7,
    kString = 8,
    kArray = 9,
    kUint64 = 10,
    kInt64 = 11,
    kFloat64 = 12,
};

// Tensor element types, numbered as ggml numbers them.
enum class GgmlType : uint32_t {
    kF32 = 0,
    kF16 = 1,
    kQ4_0 = 2,
    kQ4_1 = 3,
    kQ5_0 = 6,
    kQ5_1 = 7,
    kQ8_0 = 8,
    kQ8_1 = 9,
    kQ2_K = 10,
    kQ3_K = 11,
    kQ4_K = 12,
    kQ5_K = 13,
    kQ6_K = 14,
    kQ8_K = 15,
    kI8 = 24,
    kI16 = 25,
    kI32 = 26,
    kI64 = 27,
    kF64 = 28,
    kBF16 = 30,
};

struct GgmlTypeTraits {
    const char* name;
    uint32_t block_size;  // elements per block
    uint32_t block_bytes;
};
// Null for a type id this table does not know.
const GgmlTypeTraits* ggml_type_traits(GgmlType type);
const char* ggml_type_name(GgmlType type);

struct GgufValue;
using GgufArray = std::variant<std::vector<int64_t>,      // every signed integer type
                               std::vector<uint64_t>,     // every unsigned integer type
                               std::vector<double>,       // float32 and float64
                               std::vector<bool>,         //
                               std::vector<std::string>,  //
                               std::vector<GgufValue>>;   // arrays of arrays

struct GgufValue {
    GgufType type = GgufType::kUint8;
    GgufType element_type = GgufType::kUint8;  // arrays only
    std::variant<int64_t, uint64_t, double, bool, std::string, GgufArray> value;
};

struct GgufTensorInfo {
    std::string name;
    std::vector<int64_t> shape;  // ggml order: shape[0] is the contiguous dimension
    GgmlType type = GgmlType::kF32;
    uint64_t offset = 0;  // from the start of the data section
    uint64_t n_elements = 0;
    uint64_t n_bytes = 0;
    std::span<const uint8_t> data;
};

class GgufFile {
  public:
    static Status parse(std::span<const uint8_t> bytes, GgufFile* out);

    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

    const GgufValue* find(const std::string& key) const;
    const GgufTensorInfo* find_tensor(const std::string& name) const;

    // Typed lookups: NotFound leaves *out untouched and returns false; a present
    // key of the wrong type or out of range is a format error.
    Status get_int(const std::string& key, int64_t* out, bool* found = nullptr) const;
    Status get_float(const std::string& key, double* out, bool* found = nullptr) const;
    Status get_bool(const std::string& key, bool* out, bool* found = nullptr) const;
    Status get_string(const std::string& key, std::string* out, bool* found = nullptr) const;
    Status get_string_array(const std::string& key, const std::vector<std::string>** out) const;
    Status get_float_array(const std::string& key, const std::vector<double>** out) const;
    Status get_int_array(const std::string& key, std::vector<int64_t>* out) const;

  private:
    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    std::vector<std::pair<std::string, GgufValue>> metadata_;
    std::map<std::string, size_t> metadata_index_;
    std::vector<GgufTensorInfo> tensors_;
    std::map<std::string, size_t> tensor_index_;
};

// Writes a GGUF v3 file. Values are kept in insertion order.
class GgufWriter {
  public:
    void set(const std::string& key, GgufValue value);
    void set_u32(const std::string& key, uint32_t v);
    void set_i32(const std::string& key, int32_t v);
    void set_f32(const std::string& key, float v);
    void set_bool(const std::string& key, bool v);
    void set_string(const std::string& key, std::string v);
    // Adds a tensor; `data` must hold exactly the bytes its type and shape need.
    Status add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> shape,
                      std::vector<uint8_t> data);
    Status write(const std::string& path) const;
    std::vector<uint8_t> serialize() const;

  private:
    struct Tensor {
        std::string name;
        GgmlType type;
        std::vector<int64_t> shape;
        std::vector<uint8_t> data;
    };
    std::vector<std::pair<std::string, GgufValue>> metadata_;
    std::vector<Tensor> tensors_;
    uint32_t alignment_ = 32;
};

// Byte count of a row-major tensor of `type` and `shape`; false when the
// shape is invalid for the type or the size overflows.
bool ggml_tensor_bytes(GgmlType type, std::span<const int64_t> shape, uint64_t* n_elements,
                       uint64_t* n_bytes);

}  // namespace specula
