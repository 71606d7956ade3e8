#include "format/gguf.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/device_abi.h"

namespace specula {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kMaxDims = 4;
constexpr uint32_t kMaxArrayDepth = 8;

}  // namespace

const GgmlTypeTraits* ggml_type_traits(GgmlType type) {
    static const std::map<GgmlType, GgmlTypeTraits> table = {
        {GgmlType::kF32, {"F32", 1, 4}},
        {GgmlType::kF16, {"F16", 1, 2}},
        {GgmlType::kQ4_0, {"Q4_0", shared::kBlockWeights, shared::kQ4_0BlockBytes}},
        {GgmlType::kQ4_1, {"Q4_1", shared::kBlockWeights, shared::kQ4_1BlockBytes}},
        {GgmlType::kQ5_0, {"Q5_0", shared::kBlockWeights, shared::kQ5_0BlockBytes}},
        {GgmlType::kQ5_1, {"Q5_1", shared::kBlockWeights, shared::kQ5_1BlockBytes}},
        {GgmlType::kQ8_0, {"Q8_0", shared::kBlockWeights, shared::kQ8_0BlockBytes}},
        {GgmlType::kQ8_1, {"Q8_1", 32, 36}},
        {GgmlType::kQ2_K, {"Q2_K", 256, 84}},
        {GgmlType::kQ3_K, {"Q3_K", 256, 110}},
        {GgmlType::kQ4_K, {"Q4_K", shared::kSuperBlockWeights, shared::kQ4_KBlockBytes}},
        {GgmlType::kQ5_K, {"Q5_K", shared::kSuperBlockWeights, shared::kQ5_KBlockBytes}},
        {GgmlType::kQ6_K, {"Q6_K", shared::kSuperBlockWeights, shared::kQ6_KBlockBytes}},
        {GgmlType::kQ8_K, {"Q8_K", 256, 292}},
        {GgmlType::kI8, {"I8", 1, 1}},
        {GgmlType::kI16, {"I16", 1, 2}},
        {GgmlType::kI32, {"I32", 1, 4}},
        {GgmlType::kI64, {"I64", 1, 8}},
        {GgmlType::kF64, {"F64", 1, 8}},
        {GgmlType::kBF16, {"BF16", 1, 2}},
    };
    auto it = table.find(type);
    return it == table.end() ? nullptr : &it->second;
}

const char* ggml_type_name(GgmlType type) {
    const GgmlTypeTraits* t = ggml_type_traits(type);
    return t ? t->name : "unknown";
}

bool ggml_tensor_bytes(GgmlType type, std::span<const int64_t> shape, uint64_t* n_elements,
                       uint64_t* n_bytes) {
    const GgmlTypeTraits* t = ggml_type_traits(type);
    if (t == nullptr || shape.empty()) return false;
    uint64_t n = 1;
    for (int64_t d : shape) {
        if (d <= 0) return false;
        if (n > uint64_t(std::numeric_limits<int64_t>::max()) / uint64_t(d)) return false;
        n *= uint64_t(d);
    }
    if (uint64_t(shape[0]) % t->block_size != 0) return false;
    const uint64_t blocks = n / t->block_size;
    if (blocks > std::numeric_limits<uint64_t>::max() / t->block_bytes) return false;
    *n_elements = n;
    *n_bytes = blocks * t->block_bytes;
    return true;
}

// ----------------------------------------------------------------- reading

namespace {

class Reader {
  public:
    explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

    size_t position() const { return pos_; }
    size_t remaining() const { return bytes_.size() - pos_; }

    template <typename T>
    Status read(T* out, const char* what) {
        if (remaining() < sizeof(T)) return truncated(what);
        std::memcpy(out, bytes_.data() + pos_, sizeof(T));
        pos_ += sizeof(T);
        return Status::Ok();
    }

    Status read_string(std::string* out, const char* what) {
        uint64_t len = 0;
        SPECULA_TRY(read(&len, what));
        if (len > remaining()) return truncated(what);
        out->assign(reinterpret_cast<const char*>(bytes_.data() + pos_), size_t(len));
        pos_ += size_t(len);
        return Status::Ok();
    }

    Status truncated(const char* what) const {
        return FormatError(std::string("GGUF file is truncated: reading ") + what + " at byte " +
                           std::to_string(pos_) + " of " + std::to_string(bytes_.size()));
    }

  private:
    std::span<const uint8_t> bytes_;
    size_t pos_ = 0;
};

// The fewest bytes one element of a type can occupy: bounds claimed counts
// against the bytes left before anything is allocated.
size_t min_encoded_size(GgufType t) {
    switch (t) {
        case GgufType::kUint8:
        case GgufType::kInt8:
        case GgufType::kBool:
            return 1;
        case GgufType::kUint16:
        case GgufType::kInt16:
            return 2;
        case GgufType::kUint32:
        case GgufType::kInt32:
        case GgufType::kFloat32:
            return 4;
        case GgufType::kUint64:
        case GgufType::kInt64:
        case GgufType::kFloat64:
        case GgufType::kString:  // the length prefix
            return 8;
        case GgufType::kArray:  // element type + count
            return 12;
    }
    return 1;
}

bool valid_type(uint32_t t) {
    return t <= uint32_t(GgufType::kFloat64);
}

template <typename T>
Status read_scalar(Reader& r, GgufType t,
                   std::variant<int64_t, uint64_t, double, bool, std::string, GgufArray>* out) {
    T v{};
    SPECULA_TRY(r.read(&v, "a metadata value"));
    (void)t;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        *out = double(v);
    } else if constexpr (std::is_signed_v<T>) {
        *out = int64_t(v);
    } else {
        *out = uint64_t(v);
    }
    return Status::Ok();
}

Status read_value(Reader& r, GgufType type, GgufValue* out, uint32_t depth);

template <typename Elem, typename Raw>
Status read_numeric_array(Reader& r, uint64_t count, GgufArray* out) {
    std::vector<Elem> v(static_cast<size_t>(count));
    for (auto& x : v) {
        Raw raw{};
        SPECULA_TRY(r.read(&raw, "an array element"));
        x = Elem(raw);
    }
    *out = std::move(v);
    return Status::Ok();
}

Status read_array(Reader& r, GgufValue* out, uint32_t depth) {
    if (depth >= kMaxArrayDepth) return FormatError("GGUF arrays nested too deeply");
    uint32_t et = 0;
    uint64_t count = 0;
    SPECULA_TRY(r.read(&et, "an array type"));
    SPECULA_TRY(r.read(&count, "an array length"));
    if (!valid_type(et))
        return FormatError("GGUF array has invalid element type " + std::to_string(et));
    const GgufType elem = GgufType(et);
    if (count > r.remaining() / min_encoded_size(elem))
        return FormatError("GGUF array claims " + std::to_string(count) +
                           " elements, more than the file can hold");
    out->element_type = elem;
    GgufArray arr;
    switch (elem) {
        case GgufType::kUint8:
            SPECULA_TRY((read_numeric_array<uint64_t, uint8_t>(r, count, &arr)));
            break;
        case GgufType::kUint16:
            SPECULA_TRY((read_numeric_array<uint64_t, uint16_t>(r, count, &arr)));
            break;
        case GgufType::kUint32:
            SPECULA_TRY((read_numeric_array<uint64_t, uint32_t>(r, count, &arr)));
            break;
        case GgufType::kUint64:
            SPECULA_TRY((read_numeric_array<uint64_t, uint64_t>(r, count, &arr)));
            break;
        case GgufType::kInt8:
            SPECULA_TRY((read_numeric_array<int64_t, int8_t>(r, count, &arr)));
            break;
        case GgufType::kInt16:
            SPECULA_TRY((read_numeric_array<int64_t, int16_t>(r, count, &arr)));
            break;
        case GgufType::kInt32:
            SPECULA_TRY((read_numeric_array<int64_t, int32_t>(r, count, &arr)));
            break;
        case GgufType::kInt64:
            SPECULA_TRY((read_numeric_array<int64_t, int64_t>(r, count, &arr)));
            break;
        case GgufType::kFloat32:
            SPECULA_TRY((read_numeric_array<double, float>(r, count, &arr)));
            break;
        case GgufType::kFloat64:
            SPECULA_TRY((read_numeric_array<double, double>(r, count, &arr)));
            break;
        case GgufType::kBool: {
            std::vector<bool> v(static_cast<size_t>(count));
            for (size_t i = 0; i < v.size(); ++i) {
                uint8_t b = 0;
                SPECULA_TRY(r.read(&b, "an array element"));
                if (b > 1) return FormatError("GGUF bool is neither 0 nor 1");
                v[i] = b != 0;
            }
            arr = std::move(v);
            break;
        }
        case GgufType::kString: {
            std::vector<std::string> v(static_cast<size_t>(count));
            for (auto& s : v)
                SPECULA_TRY(r.read_string(&s, "an array string"));
            arr = std::move(v);
            break;
        }
        case GgufType::kArray: {
            std::vector<GgufValue> v(static_cast<size_t>(count));
            for (auto& x : v)
                SPECULA_TRY(read_value(r, GgufType::kArray, &x, depth + 1));
            arr = std::move(v);
            break;
        }
    }
    out->value = std::move(arr);
    return Status::Ok();
}

Status read_value(Reader& r, GgufType type, GgufValue* out, uint32_t depth) {
    out->type = type;
    switch (type) {
        case GgufType::kUint8:
            return read_scalar<uint8_t>(r, type, &out->value);
        case GgufType::kInt8:
            return read_scalar<int8_t>(r, type, &out->value);
        case GgufType::kUint16:
            return read_scalar<uint16_t>(r, type, &out->value);
        case GgufType::kInt16:
            return read_scalar<int16_t>(r, type, &out->value);
        case GgufType::kUint32:
            return read_scalar<uint32_t>(r, type, &out->value);
        case GgufType::kInt32:
            return read_scalar<int32_t>(r, type, &out->value);
        case GgufType::kUint64:
            return read_scalar<uint64_t>(r, type, &out->value);
        case GgufType::kInt64:
            return read_scalar<int64_t>(r, type, &out->value);
        case GgufType::kFloat32:
            return read_scalar<float>(r, type, &out->value);
        case GgufType::kFloat64:
            return read_scalar<double>(r, type, &out->value);
        case GgufType::kBool: {
            uint8_t b = 0;
            SPECULA_TRY(r.read(&b, "a bool"));
            if (b > 1) return FormatError("GGUF bool is neither 0 nor 1");
            out->value = b != 0;
            return Status::Ok();
        }
        case GgufType::kString: {
            std::string s;
            SPECULA_TRY(r.read_string(&s, "a string value"));
            out->value = std::move(s);
            return Status::Ok();
        }
        case GgufType::kArray:
            return read_array(r, out, depth);
    }
    return FormatError("GGUF value has invalid type");
}

}  // namespace

Status GgufFile::parse(std::span<const uint8_t> bytes, GgufFile* out) {
    GgufFile f;
    Reader r(bytes);
    uint32_t magic = 0;
    if (bytes.size() < 4) return FormatError("not a GGUF file: shorter than its magic");
    SPECULA_TRY(r.read(&magic, "the magic"));
    if (magic != kMagic) return FormatError("not a GGUF file: wrong magic");
    SPECULA_TRY(r.read(&f.version_, "the version"));
    if (f.version_ != 2 && f.version_ != 3)
        return Unsupported("GGUF version " + std::to_string(f.version_) +
                           " (2 and 3 are supported)");
    uint64_t n_tensors = 0, n_kv = 0;
    SPECULA_TRY(r.read(&n_tensors, "the tensor count"));
    SPECULA_TRY(r.read(&n_kv, "the metadata count"));
    // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info 8+4+8+4+8.
    if (n_kv > r.remaining() / 13)
        return FormatError("GGUF metadata count " + std::to_string(n_kv) +
                           " is absurd for the file size");
    if (n_tensors > r.remaining() / 32)
        return FormatError("GGUF tensor count " + std::to_string(n_tensors) +
                           " is absurd for the file size");

    f.metadata_.reserve(size_t(n_kv));
    for (uint64_t i = 0; i < n_kv; ++i) {
        std::string key;
        uint32_t type = 0;
        SPECULA_TRY(r.read_string(&key, "a metadata key"));
        SPECULA_TRY(r.read(&type, "a metadata type"));
        if (!valid_type(type))
            return FormatError("GGUF key '" + key + "' has invalid type " + std::to_string(type));
        GgufValue v;
        SPECULA_TRY(read_value(r, GgufType(type), &v, 0));
        if (!f.metadata_index_.emplace(key, f.metadata_.size()).second)
            return FormatError("GGUF key '" + key + "' appears twice");
        f.metadata_.emplace_back(std::move(key), std::move(v));
    }

    bool has_alignment = false;
    int64_t alignment = 32;
    SPECULA_TRY(f.get_int("general.alignment", &alignment, &has_alignment));
    // A multiple of 8 (GGUF's rule), so every block's scale and every float is aligned.
    if (alignment < 8 || alignment > (1 << 20) || (alignment & (alignment - 1)) != 0)
        return FormatError("GGUF alignment " + std::to_string(alignment) +
                           " is not a power of two of at least 8");
    f.alignment_ = uint32_t(alignment);

    f.tensors_.reserve(size_t(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
        GgufTensorInfo t;
        uint32_t n_dims = 0, type = 0;
        SPECULA_TRY(r.read_string(&t.name, "a tensor name"));
        SPECULA_TRY(r.read(&n_dims, "a tensor rank"));
        if (n_dims == 0 || n_dims > kMaxDims)
            return FormatError("tensor '" + t.name + "' has rank " + std::to_string(n_dims));
        t.shape.resize(n_dims);
        for (auto& d : t.shape) {
            uint64_t dim = 0;
            SPECULA_TRY(r.read(&dim, "a tensor dimension"));
            if (dim == 0 || dim > uint64_t(std::numeric_limits<int64_t>::max()))
                return FormatError("tensor '" + t.name + "' has dimension " + std::to_string(dim));
            d = int64_t(dim);
        }
        SPECULA_TRY(r.read(&type, "a tensor type"));
        SPECULA_TRY(r.read(&t.offset, "a tensor offset"));
        t.type = GgmlType(type);
        if (ggml_type_traits(t.type) == nullptr)
            return Unsupported("tensor '" + t.name + "' has unknown type id " +
                               std::to_string(type));
        if (!ggml_tensor_bytes(t.type, t.shape, &t.n_elements, &t.n_bytes))
            return FormatError("tensor '" + t.name + "' has a shape that is invalid for type " +
                               ggml_type_name(t.type) + " or overflows");
        if (t.offset % f.alignment_ != 0)
            return FormatError("tensor '" + t.name + "' offset is not aligned to " +
                               std::to_string(f.alignment_));
        if (!f.tensor_index_.emplace(t.name, f.tensors_.size()).second)
            return FormatError("tensor '" + t.name + "' appears twice");
        f.tensors_.push_back(std::move(t));
    }

    const uint64_t header_end = r.position();
    const uint64_t data_start = (header_end + f.alignment_ - 1) / f.alignment_ * f.alignment_;
    if (data_start > bytes.size() && !f.tensors_.empty())
        return FormatError("GGUF file is truncated before its data section");
    const uint64_t data_size = data_start <= bytes.size() ? bytes.size() - data_start : 0;
    for (auto& t : f.tensors_) {
        if (t.offset > data_size || t.n_bytes > data_size - t.offset)
            return FormatError("tensor '" + t.name + "' data lies outside the file (truncated?)");
        t.data = bytes.subspan(size_t(data_start + t.offset), size_t(t.n_bytes));
    }
    *out = std::move(f);
    return Status::Ok();
}

const GgufValue* GgufFile::find(const std::string& key) const {
    auto it = metadata_index_.find(key);
    return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
Status wrong_type(const std::string& key, const char* expected) {
    return FormatError("GGUF key '" + key + "' is not " + expected);
}
}  // namespace

Status GgufFile::get_int(const std::string& key, int64_t* out, bool* found) const {
    const GgufValue* v = find(key);
    if (found) *found = v != nullptr;
    if (v == nullptr) return Status::Ok();
    if (auto* i = std::get_if<int64_t>(&v->value)) {
        *out = *i;
    } else if (auto* u = std::get_if<uint64_t>(&v->value)) {
        if (*u > uint64_t(std::numeric_limits<int64_t>::max()))
            return wrong_type(key, "a representable integer");
        *out = int64_t(*u);
    } else {
        return wrong_type(key, "an integer");
    }
    return Status::Ok();
}

Status GgufFile::get_float(const std::string& key, double* out, bool* found) const {
    const GgufValue* v = find(key);
    if (found) *found = v != nullptr;
    if (v == nullptr) return Status::Ok();
    if (auto* d = std::get_if<double>(&v->value)) {
        *out = *d;
    } else if (auto* i = std::get_if<int64_t>(&v->value)) {
        *out = double(*i);
    } else if (auto* u = std::get_if<uint64_t>(&v->value)) {
        *out = double(*u);
    } else {
        return wrong_type(key, "a number");
    }
    return Status::Ok();
}

Status GgufFile::get_bool(const std::string& key, bool* out, bool* found) const {
    const GgufValue* v = find(key);
    if (found) *found = v != nullptr;
    if (v == nullptr) return Status::Ok();
    auto* b = std::get_if<bool>(&v->value);
    if (b == nullptr) return wrong_type(key, "a bool");
    *out = *b;
    return Status::Ok();
}

Status GgufFile::get_string(const std::string& key, std::string* out, bool* found) const {
    const GgufValue* v = find(key);
    if (found) *found = v != nullptr;
    if (v == nullptr) return Status::Ok();
    auto* s = std::get_if<std::string>(&v->value);
    if (s == nullptr) return wrong_type(key, "a string");
    *out = *s;
    return Status::Ok();
}

Status GgufFile::get_string_array(const std::string& key,
                                  const std::vector<std::string>** out) const {
    *out = nullptr;
    const GgufValue* v = find(key);
    if (v == nullptr) return Status::Ok();
    auto* a = std::get_if<GgufArray>(&v->value);
    auto* s = a ? std::get_if<std::vector<std::string>>(a) : nullptr;
    if (s == nullptr) return wrong_type(key, "an array of strings");
    *out = s;
    return Status::Ok();
}

Status GgufFile::get_float_array(const std::string& key, const std::vector<double>** out) const {
    *out = nullptr;
    const GgufValue* v = find(key);
    if (v == nullptr) return Status::Ok();
    auto* a = std::get_if<GgufArray>(&v->value);
    auto* d = a ? std::get_if<std::vector<double>>(a) : nullptr;
    if (d == nullptr) return wrong_type(key, "an array of floats");
    *out = d;
    return Status::Ok();
}

Status GgufFile::get_int_array(const std::string& key, std::vector<int64_t>* out) const {
    out->clear();
    const GgufValue* v = find(key);
    if (v == nullptr) return Status::Ok();
    auto* a = std::get_if<GgufArray>(&v->value);
    if (a == nullptr) return wrong_type(key, "an array of integers");
    if (auto* i = std::get_if<std::vector<int64_t>>(a)) {
        *out = *i;
    } else if (auto* u = std::get_if<std::vector<uint64_t>>(a)) {
        out->reserve(u->size());
        for (uint64_t x : *u) {
            if (x > uint64_t(std::numeric_limits<int64_t>::max()))
                return wrong_type(key, "representable integers");
            out->push_back(int64_t(x));
        }
    } else {
        return wrong_type(key, "an array of integers");
    }
    return Status::Ok();
}

// ----------------------------------------------------------------- writing

void GgufWriter::set(const std::string& key, GgufValue value) {
    if (key == "general.alignment") {
        if (auto* u = std::get_if<uint64_t>(&value.value);
            u != nullptr && *u > 0 && *u <= (1u << 20))
            alignment_ = uint32_t(*u);  // the data layout follows the declared alignment
    }
    for (auto& [k, v] : metadata_) {
        if (k == key) {
            v = std::move(value);
            return;
        }
    }
    metadata_.emplace_back(key, std::move(value));
}

void GgufWriter::set_u32(const std::string& key, uint32_t v) {
    set(key, {GgufType::kUint32, GgufType::kUint8, uint64_t(v)});
}
void GgufWriter::set_i32(const std::string& key, int32_t v) {
    set(key, {GgufType::kInt32, GgufType::kUint8, int64_t(v)});
}
void GgufWriter::set_f32(const std::string& key, float v) {
    set(key, {GgufType::kFloat32, GgufType::kUint8, double(v)});
}
void GgufWriter::set_bool(const std::string& key, bool v) {
    set(key, {GgufType::kBool, GgufType::kUint8, v});
}
void GgufWriter::set_string(const std::string& key, std::string v) {
    set(key, {GgufType::kString, GgufType::kUint8, std::move(v)});
}

Status GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> shape,
                              std::vector<uint8_t> data) {
    uint64_t n = 0, bytes = 0;
    if (!ggml_tensor_bytes(type, shape, &n, &bytes))
        return InvalidArgument("tensor '" + name + "': invalid shape for its type");
    if (bytes != data.size())
        return InvalidArgument("tensor '" + name + "': data size does not match its shape");
    tensors_.push_back({name, type, std::move(shape), std::move(data)});
    return Status::Ok();
}

namespace {

class Out {
  public:
    template <typename T>
    void put(T v) {
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        buf.insert(buf.end(), p, p + sizeof(T));
    }
    void put_string(const std::string& s) {
        put(uint64_t(s.size()));
        buf.insert(buf.end(), s.begin(), s.end());
    }
    void pad_to(size_t alignment) {
        while (buf.size() % alignment != 0)
            buf.push_back(0);
    }
    std::vector<uint8_t> buf;
};

void put_scalar(Out& o, GgufType type, const GgufValue& v);

void put_array(Out& o, const GgufValue& v) {
    const auto& arr = std::get<GgufArray>(v.value);
    o.put(uint32_t(v.element_type));
    std::visit(
        [&](const auto& elems) {
            o.put(uint64_t(elems.size()));
            for (const auto& e : elems) {
                using E = std::decay_t<decltype(e)>;
                if constexpr (std::is_same_v<E, GgufValue>) {
                    put_array(o, e);
                } else {
                    GgufValue scalar{v.element_type, GgufType::kUint8, {}};
                    if constexpr (std::is_same_v<E, std::string>)
                        scalar.value = e;
                    else if constexpr (std::is_same_v<E, double>)
                        scalar.value = e;
                    else if constexpr (std::is_same_v<E, int64_t>)
                        scalar.value = e;
                    else if constexpr (std::is_same_v<E, uint64_t>)
                        scalar.value = e;
                    else
                        scalar.value = bool(e);
                    put_scalar(o, v.element_type, scalar);
                }
            }
        },
        arr);
}

template <typename T>
T as(const GgufValue& v) {
    if (auto* i = std::get_if<int64_t>(&v.value)) return T(*i);
    if (auto* u = std::get_if<uint64_t>(&v.value)) return T(*u);
    if (auto* d = std::get_if<double>(&v.value)) return T(*d);
    if (auto* b = std::get_if<bool>(&v.value)) return T(*b);
    return T{};
}

void put_scalar(Out& o, GgufType type, const GgufValue& v) {
    switch (type) {
        case GgufType::kUint8:
            o.put(as<uint8_t>(v));
            break;
        case GgufType::kInt8:
            o.put(as<int8_t>(v));
            break;
        case GgufType::kUint16:
            o.put(as<uint16_t>(v));
            break;
        case GgufType::kInt16:
            o.put(as<int16_t>(v));
            break;
        case GgufType::kUint32:
            o.put(as<uint32_t>(v));
            break;
        case GgufType::kInt32:
            o.put(as<int32_t>(v));
            break;
        case GgufType::kUint64:
            o.put(as<uint64_t>(v));
            break;
        case GgufType::kInt64:
            o.put(as<int64_t>(v));
            break;
        case GgufType::kFloat32:
            o.put(as<float>(v));
            break;
        case GgufType::kFloat64:
            o.put(as<double>(v));
            break;
        case GgufType::kBool:
            o.put(uint8_t(as<bool>(v) ? 1 : 0));
            break;
        case GgufType::kString:
            o.put_string(std::get<std::string>(v.value));
            break;
        case GgufType::kArray:
            put_array(o, v);
            break;
    }
}

}  // namespace

std::vector<uint8_t> GgufWriter::serialize() const {
    Out o;
    o.put(kMagic);
    o.put(uint32_t(3));
    o.put(uint64_t(tensors_.size()));
    o.put(uint64_t(metadata_.size()));
    for (const auto& [key, value] : metadata_) {
        o.put_string(key);
        o.put(uint32_t(value.type));
        put_scalar(o, value.type, value);
    }
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
        o.put_string(t.name);
        o.put(uint32_t(t.shape.size()));
        for (int64_t d : t.shape)
            o.put(uint64_t(d));
        o.put(uint32_t(t.type));
        o.put(offset);
        offset += (t.data.size() + alignment_ - 1) / alignment_ * alignment_;
    }
    o.pad_to(alignment_);
    for (const auto& t : tensors_) {
        o.buf.insert(o.buf.end(), t.data.begin(), t.data.end());
        o.pad_to(alignment_);
    }
    return std::move(o.buf);
}

Status GgufWriter::write(const std::string& path) const {
    // Write beside the target and rename over it: a reader that has the old
    // file mapped keeps its pages instead of faulting on a truncated file.
    const std::vector<uint8_t> bytes = serialize();
    const std::string partial = path + ".partial-" + std::to_string(::getpid());
    {
        std::ofstream f(partial, std::ios::binary | std::ios::trunc);
        if (!f) return IoError("cannot create '" + partial + "'");
        f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
        if (!f) return IoError("cannot write '" + partial + "'");
    }
    std::error_code ec;
    std::filesystem::rename(partial, path, ec);
    if (ec) {
        std::filesystem::remove(partial, ec);
        return IoError("cannot create '" + path + "'");
    }
    return Status::Ok();
}

}  // namespace specula
