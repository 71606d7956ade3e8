#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "format/gguf.h"
#include "format/quant.h"
#include "platform/mapped_file.h"
#include "test_util.h"

using namespace specula;

namespace {

std::vector<uint8_t> small_file() {
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_u32("general.alignment", 64);
    w.set({"k.u8"}, {GgufType::kUint8, GgufType::kUint8, uint64_t(200)});
    w.set({"k.i8"}, {GgufType::kInt8, GgufType::kUint8, int64_t(-100)});
    w.set({"k.u16"}, {GgufType::kUint16, GgufType::kUint8, uint64_t(60000)});
    w.set({"k.i16"}, {GgufType::kInt16, GgufType::kUint8, int64_t(-30000)});
    w.set_i32("k.i32", -2000000000);
    w.set({"k.u64"}, {GgufType::kUint64, GgufType::kUint8, uint64_t(1) << 60});
    w.set({"k.i64"}, {GgufType::kInt64, GgufType::kUint8, int64_t(-(int64_t(1) << 60))});
    w.set_f32("k.f32", 0.5f);
    w.set({"k.f64"}, {GgufType::kFloat64, GgufType::kUint8, 0.1});
    w.set_bool("k.bool", true);
    w.set({"k.strings"},
          {GgufType::kArray, GgufType::kString, GgufArray(std::vector<std::string>{"a", "", "ü"})});
    w.set({"k.floats"},
          {GgufType::kArray, GgufType::kFloat32, GgufArray(std::vector<double>{1.0, -2.5})});
    w.set({"k.ints"},
          {GgufType::kArray, GgufType::kInt32, GgufArray(std::vector<int64_t>{1, -2, 3})});
    w.set({"k.bools"},
          {GgufType::kArray, GgufType::kBool, GgufArray(std::vector<bool>{true, false})});
    GgufValue inner{GgufType::kArray, GgufType::kUint16, GgufArray(std::vector<uint64_t>{7, 8})};
    w.set({"k.nested"},
          {GgufType::kArray, GgufType::kArray, GgufArray(std::vector<GgufValue>{inner, inner})});
    std::vector<float> f(64);
    for (size_t i = 0; i < f.size(); ++i)
        f[i] = float(i) - 30.0f;
    std::vector<uint8_t> q8(2 * sizeof(BlockQ8_0));
    quantize_row(GgmlType::kQ8_0, f.data(), q8.data(), 64);
    std::vector<uint8_t> f32(8 * 4);
    std::memcpy(f32.data(), f.data(), f32.size());
    EXPECT_TRUE(w.add_tensor("tensor_a", GgmlType::kF32, {4, 2}, f32).ok());
    EXPECT_TRUE(w.add_tensor("tensor_b", GgmlType::kQ8_0, {64}, q8).ok());
    return w.serialize();
}

Status parse(const std::vector<uint8_t>& bytes) {
    GgufFile f;
    return GgufFile::parse(bytes, &f);
}

// Byte offset of the first occurrence of `needle` (for patching crafted files).
size_t find(const std::vector<uint8_t>& bytes, const std::string& needle) {
    auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
    return size_t(it - bytes.begin());
}

TEST(Gguf, RoundTripsEveryMetadataType) {
    const auto bytes = small_file();
    GgufFile f;
    {
        const Status s = GgufFile::parse(bytes, &f);
        ASSERT_TRUE(s.ok()) << s.message();
    }
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.alignment(), 64u);
    int64_t i = 0;
    double d = 0;
    bool b = false;
    std::string s;
    ASSERT_TRUE(f.get_int("k.u8", &i).ok());
    EXPECT_EQ(i, 200);
    ASSERT_TRUE(f.get_int("k.i8", &i).ok());
    EXPECT_EQ(i, -100);
    ASSERT_TRUE(f.get_int("k.u16", &i).ok());
    EXPECT_EQ(i, 60000);
    ASSERT_TRUE(f.get_int("k.i16", &i).ok());
    EXPECT_EQ(i, -30000);
    ASSERT_TRUE(f.get_int("k.i32", &i).ok());
    EXPECT_EQ(i, -2000000000);
    ASSERT_TRUE(f.get_int("k.u64", &i).ok());
    EXPECT_EQ(i, int64_t(1) << 60);
    ASSERT_TRUE(f.get_int("k.i64", &i).ok());
    EXPECT_EQ(i, -(int64_t(1) << 60));
    ASSERT_TRUE(f.get_float("k.f32", &d).ok());
    EXPECT_EQ(d, 0.5);
    ASSERT_TRUE(f.get_float("k.f64", &d).ok());
    EXPECT_EQ(d, 0.1);
    ASSERT_TRUE(f.get_bool("k.bool", &b).ok());
    EXPECT_TRUE(b);
    ASSERT_TRUE(f.get_string("general.architecture", &s).ok());
    EXPECT_EQ(s, "llama");
    const std::vector<std::string>* strings = nullptr;
    ASSERT_TRUE(f.get_string_array("k.strings", &strings).ok());
    EXPECT_EQ(*strings, (std::vector<std::string>{"a", "", "ü"}));
    const std::vector<double>* floats = nullptr;
    ASSERT_TRUE(f.get_float_array("k.floats", &floats).ok());
    EXPECT_EQ(*floats, (std::vector<double>{1.0, -2.5}));
    std::vector<int64_t> ints;
    ASSERT_TRUE(f.get_int_array("k.ints", &ints).ok());
    EXPECT_EQ(ints, (std::vector<int64_t>{1, -2, 3}));
    const auto& nested =
        std::get<std::vector<GgufValue>>(std::get<GgufArray>(f.find("k.nested")->value));
    ASSERT_EQ(nested.size(), 2u);
    EXPECT_EQ(std::get<std::vector<uint64_t>>(std::get<GgufArray>(nested[1].value)),
              (std::vector<uint64_t>{7, 8}));
    EXPECT_EQ(std::get<std::vector<bool>>(std::get<GgufArray>(f.find("k.bools")->value)),
              (std::vector<bool>{true, false}));

    ASSERT_EQ(f.tensors().size(), 2u);
    const GgufTensorInfo* a = f.find_tensor("tensor_a");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->shape, (std::vector<int64_t>{4, 2}));
    EXPECT_EQ(a->n_bytes, 32u);
    float first = 0;
    std::memcpy(&first, a->data.data(), 4);
    EXPECT_EQ(first, -30.0f);
    const GgufTensorInfo* q = f.find_tensor("tensor_b");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->type, GgmlType::kQ8_0);
    EXPECT_EQ(q->n_bytes, 68u);
    EXPECT_EQ((q->data.data() - bytes.data()) % 64, 0);
}

TEST(Gguf, WrongTypeLookupIsAnError) {
    GgufFile f;
    ASSERT_TRUE(GgufFile::parse(small_file(), &f).ok());
    std::string s;
    int64_t i = 0;
    EXPECT_EQ(f.get_string("k.i32", &s).code(), SPECULA_ERR_FORMAT);
    EXPECT_EQ(f.get_int("general.architecture", &i).code(), SPECULA_ERR_FORMAT);
    bool found = true;
    EXPECT_TRUE(f.get_int("absent", &i, &found).ok());
    EXPECT_FALSE(found);
}

TEST(Gguf, EveryTruncationIsRejectedCleanly) {
    const auto bytes = small_file();
    // The last tensor holds 68 bytes padded to 128: only that padding may be cut.
    const size_t data_end = bytes.size() - (128 - 68);
    for (size_t n = 0; n < bytes.size(); ++n) {
        std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + std::ptrdiff_t(n));
        const Status s = parse(cut);
        if (n < data_end) {
            EXPECT_EQ(s.code(), SPECULA_ERR_FORMAT) << "length " << n;
            EXPECT_FALSE(s.message().empty());
        }
    }
}

TEST(Gguf, WrongMagicAndVersion) {
    auto bytes = small_file();
    bytes[0] = 'X';
    EXPECT_EQ(parse(bytes).code(), SPECULA_ERR_FORMAT);
    bytes = small_file();
    bytes[4] = 99;
    EXPECT_EQ(parse(bytes).code(), SPECULA_ERR_UNSUPPORTED);
    EXPECT_EQ(parse({}).code(), SPECULA_ERR_FORMAT);
}

TEST(Gguf, AbsurdCountsAreRejectedBeforeAllocating) {
    auto bytes = small_file();
    const uint64_t huge = uint64_t(1) << 62;
    std::memcpy(bytes.data() + 8, &huge, 8);  // tensor count
    EXPECT_EQ(parse(bytes).code(), SPECULA_ERR_FORMAT);
    bytes = small_file();
    std::memcpy(bytes.data() + 16, &huge, 8);  // metadata count
    EXPECT_EQ(parse(bytes).code(), SPECULA_ERR_FORMAT);
    bytes = small_file();
    const size_t at =
        find(bytes, "k.strings") + 9 + 4 + 4;  // array length after key, type, element type
    std::memcpy(bytes.data() + at, &huge, 8);
    EXPECT_EQ(parse(bytes).code(), SPECULA_ERR_FORMAT);
}

TEST(Gguf, BadTensorInfosAreRejected) {
    // Layout after a tensor's name: n_dims (4), dims (8 each), type (4), offset (8).
    const auto base = small_file();
    const size_t a = find(base, "tensor_a") + 8;  // 2 dims
    auto patch = [&](size_t off, const void* v, size_t n) {
        auto b = base;
        std::memcpy(b.data() + off, v, n);
        return parse(b).code();
    };
    const uint32_t rank5 = 5, rank0 = 0, bad_type = 77, q4_type = 2;
    const uint64_t zero = 0, huge_dim = uint64_t(1) << 62, misaligned = 3, beyond = 1 << 20;
    EXPECT_EQ(patch(a, &rank5, 4), SPECULA_ERR_FORMAT);
    EXPECT_EQ(patch(a, &rank0, 4), SPECULA_ERR_FORMAT);
    EXPECT_EQ(patch(a + 4, &zero, 8), SPECULA_ERR_FORMAT);
    EXPECT_EQ(patch(a + 4, &huge_dim, 8), SPECULA_ERR_FORMAT);  // overflows with the second dim
    EXPECT_EQ(patch(a + 20, &bad_type, 4), SPECULA_ERR_UNSUPPORTED);
    EXPECT_EQ(patch(a + 20, &q4_type, 4), SPECULA_ERR_FORMAT);  // 4 columns is not a Q4_0 block
    EXPECT_EQ(patch(a + 24, &misaligned, 8), SPECULA_ERR_FORMAT);
    EXPECT_EQ(patch(a + 24, &beyond, 8), SPECULA_ERR_FORMAT);
}

TEST(Gguf, BadAlignmentAndDuplicatesAreRejected) {
    for (uint32_t alignment : {48u, 1u, 2u, 4u, 0u}) {  // 1..4: blocks would be read misaligned
        GgufWriter w;
        w.set_u32("general.alignment", alignment);
        EXPECT_EQ(parse(w.serialize()).code(), SPECULA_ERR_FORMAT) << alignment;
    }
    GgufWriter w8;
    w8.set_u32("general.alignment", 8);
    EXPECT_EQ(parse(w8.serialize()).code(), SPECULA_OK);
    auto bytes = small_file();
    const size_t at = find(bytes, "k.u16");
    std::memcpy(bytes.data() + at, "k.i16", 5);  // two keys named k.i16
    EXPECT_EQ(parse(bytes).code(), SPECULA_ERR_FORMAT);
    bytes = small_file();
    bytes[find(bytes, "tensor_b") + 7] = 'a';  // two tensors named tensor_a
    EXPECT_EQ(parse(bytes).code(), SPECULA_ERR_FORMAT);
}

TEST(Gguf, InvalidBoolIsRejected) {
    auto bytes = small_file();
    const size_t at = find(bytes, "k.bool") + 6 + 4;
    bytes[at] = 2;
    EXPECT_EQ(parse(bytes).code(), SPECULA_ERR_FORMAT);
}

}  // namespace

// The block layouts the kernels read (core/device_abi.h, shared with GLSL and CUDA) are GGUF's.
TEST(Gguf, KernelBlockLayoutsAreTheFormats) {
    const struct {
        GgmlType type;
        uint32_t bytes_per_32;
    } kinds[] = {{GgmlType::kF32, shared::kF32BlockBytes},
                 {GgmlType::kF16, shared::kF16BlockBytes},
                 {GgmlType::kQ8_0, shared::kQ8_0BlockBytes},
                 {GgmlType::kQ4_0, shared::kQ4_0BlockBytes}};
    for (const auto& k : kinds) {
        const GgmlTypeTraits* t = ggml_type_traits(k.type);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(shared::kBlockWeights % t->block_size, 0u) << ggml_type_name(k.type);
        EXPECT_EQ(shared::kBlockWeights / t->block_size * t->block_bytes, k.bytes_per_32)
            << ggml_type_name(k.type);
    }
}

namespace {

// The random models' weights are one fixed stream of the seed (tools/model_maker.cpp), the
// same on every machine and drawn by any number of threads: the FNV-1a hash of a small F32
// model's tensors, as a single thread drawing them in order gave it.
uint64_t random_model_hash(int threads) {
    RandomLlamaSpec spec = test::small_spec(GgmlType::kF32, 7);
    spec.threads = threads;
    const std::string path = test::make_model("random-stream-f32-" + std::to_string(threads), spec);
    const std::vector<char> bytes = test::read_file_bytes(path);
    GgufFile f;
    const Status s = GgufFile::parse(
        std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), &f);
    EXPECT_TRUE(s.ok()) << s.message();
    uint64_t hash = 0xCBF29CE484222325ull;
    for (const GgufTensorInfo& t : f.tensors())
        for (uint8_t b : t.data)
            hash = (hash ^ b) * 0x100000001B3ull;
    return hash;
}
constexpr uint64_t kRandomModelHash = 0x7CE32A55F1503B3Eull;

}  // namespace

TEST(RandomModels, AreOneStreamOnEveryMachine) {
    EXPECT_EQ(random_model_hash(1), kRandomModelHash);
}

// Host code that no instruction set changes: not run under qemu-user (tools/test.sh), where its
// threads stalled.
TEST(RandomModels, AreOneStreamOnAnyNumberOfThreads) {
    EXPECT_EQ(random_model_hash(3), kRandomModelHash);
}

// A mapped file's pages given back (a model's weights once the backend holds its own copy) are
// read from the file again: its bytes are unchanged. A file read into memory is left as it is
// (the same advice on heap memory would have zeroed it).
TEST(MappedFile, PagesGivenBackAreReadAgain) {
    const std::string path = (test::temp_dir() / "mapped-file-release.bin").string();
    std::vector<uint8_t> bytes(size_t(5) << 20);
    for (size_t i = 0; i < bytes.size(); ++i)
        bytes[i] = uint8_t(i * 2654435761u >> 13);
    {
        std::FILE* f = std::fopen(path.c_str(), "wb");
        ASSERT_NE(f, nullptr);
        ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
        std::fclose(f);
    }
    for (bool copy : {false, true}) {
        SCOPED_TRACE(copy ? "read into memory" : "mapped");
        std::unique_ptr<MappedFile> file;
        ASSERT_TRUE(MappedFile::open(path, &file, copy).ok());
        const std::span<const uint8_t> all = file->bytes();
        ASSERT_TRUE(std::equal(all.begin(), all.end(), bytes.begin(), bytes.end()));
        file->release(all.subspan(1000, all.size() - 2000));
        file->release(all.subspan(0, 100));  // within one page: nothing
        EXPECT_TRUE(std::equal(all.begin(), all.end(), bytes.begin(), bytes.end()));
    }
}
