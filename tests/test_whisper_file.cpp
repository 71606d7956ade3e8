// whisper.cpp's model files: the for-tests files whisper.cpp ships (header, filters and
// vocabulary), files written by the random-weight writer, and corrupted copies of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "format/whisper_ggml.h"
#include "test_util.h"

using namespace specula;

namespace {

const std::string kShared = SPECULA_SHARED_DATA_DIR;
using test::read_file_bytes;

using Bytes = std::vector<char>;

// A file's bytes as the reader takes them.
std::span<const uint8_t> u8(const Bytes& b) {
    return {reinterpret_cast<const uint8_t*>(b.data()), b.size()};
}

// A model small enough to write per test: every tensor of the real layout, 64 wide.
WhisperHparams small_shape() {
    return WhisperHparams{300, 16, 64, 2, 1, 8, 64, 2, 1, 80, 0};
}

Bytes written(GgmlType type, WhisperHparams h = small_shape()) {
    // Named after the test too: ctest runs tests in parallel processes.
    const std::string path = (test::temp_dir() / "whisper-").string() +
                             testing::UnitTest::GetInstance()->current_test_info()->name() + "-" +
                             ggml_type_name(type) + ".bin";
    RandomWhisperSpec spec;
    spec.hparams = h;
    spec.weight_type = type;
    EXPECT_TRUE(write_random_whisper(spec, path).ok());
    return read_file_bytes(path);
}

TEST(WhisperFile, WhisperCppTestFilesHaveTheirHeaderFiltersAndVocabulary) {
    struct Expected {
        const char* name;
        int32_t n_vocab, width, heads, layers;
        const char* last_token;
    };
    for (const Expected& e : {Expected{"tiny", 51865, 384, 6, 4, ""},
                              Expected{"tiny.en", 51864, 384, 6, 4, "<|endoftext|>"},
                              Expected{"base.en", 51864, 512, 8, 6, "<|endoftext|>"}}) {
        const std::string path = kShared + "/whisper/for-tests-ggml-" + e.name + ".bin";
        if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not here";
        const Bytes bytes = read_file_bytes(path);
        WhisperGgmlFile f;
        const Status s = WhisperGgmlFile::parse(u8(bytes), &f);
        ASSERT_TRUE(s.ok()) << e.name << ": " << s.message();
        const WhisperHparams& h = f.hparams();
        EXPECT_EQ(h.n_vocab, e.n_vocab);
        EXPECT_EQ(h.n_audio_ctx, 1500);
        EXPECT_EQ(h.n_audio_state, e.width);
        EXPECT_EQ(h.n_audio_head, e.heads);
        EXPECT_EQ(h.n_audio_layer, e.layers);
        EXPECT_EQ(h.n_text_ctx, 448);
        EXPECT_EQ(h.n_text_layer, e.layers);
        EXPECT_EQ(h.n_mels, 80);
        EXPECT_EQ(f.weight_type(), GgmlType::kF16);
        ASSERT_EQ(f.n_mel_filters(), 80);
        ASSERT_EQ(f.mel_filters().size(), 80u * 201u);
        EXPECT_FLOAT_EQ(f.mel_filters()[1], 0.024862595f);  // band 0's peak, at bin 1
        ASSERT_EQ(f.vocab().size(), 50257u);  // byte-level BPE; specials are named by id
        EXPECT_EQ(f.vocab()[0], "!");
        EXPECT_EQ(f.vocab()[50256], e.last_token);
        EXPECT_FALSE(f.has_weights());
    }
}

TEST(WhisperFile, WrittenModelsHaveEveryTensorInItsShapeAndType) {
    for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0,
                          GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1}) {
        const Bytes bytes = written(type);
        WhisperGgmlFile f;
        const Status s = WhisperGgmlFile::parse(u8(bytes), &f);
        ASSERT_TRUE(s.ok()) << s.message();
        EXPECT_EQ(f.weight_type(), type);
        const bool quantized = type != GgmlType::kF32 && type != GgmlType::kF16;
        EXPECT_EQ(f.quantization_version(), quantized ? 2 : 0);
        const auto specs = whisper_tensor_specs(f.hparams());
        ASSERT_EQ(f.tensors().size(), specs.size());
        // 7 encoder-wide, 15 per encoder block, 4 decoder-wide, 24 per decoder block.
        EXPECT_EQ(specs.size(), size_t(7 + 15 * 1 + 4 + 24 * 1));
        const GgufTensorInfo* conv = f.find_tensor("encoder.conv2.weight");
        ASSERT_NE(conv, nullptr);
        EXPECT_EQ(conv->shape, (std::vector<int64_t>{3, 64, 64}));
        EXPECT_EQ(conv->type, type == GgmlType::kF32 ? GgmlType::kF32 : GgmlType::kF16);
        const GgufTensorInfo* embed = f.find_tensor("decoder.token_embedding.weight");
        ASSERT_NE(embed, nullptr);
        EXPECT_EQ(embed->shape, (std::vector<int64_t>{64, 300}));
        EXPECT_EQ(embed->type, type);
        const GgufTensorInfo* bias = f.find_tensor("decoder.blocks.0.cross_attn.value.bias");
        ASSERT_NE(bias, nullptr);
        EXPECT_EQ(bias->type, GgmlType::kF32);
        EXPECT_EQ(bias->data.data(), u8(bytes).data() + bias->offset);
        EXPECT_EQ(bias->data.size(), 64u * 4u);
        // The encoder's positions are Whisper's sinusoids: position 0 is sin 0 = 0, cos 0 = 1.
        const GgufTensorInfo* pe = f.find_tensor("encoder.positional_embedding");
        ASSERT_NE(pe, nullptr);
        float first[64];
        std::memcpy(first, pe->data.data(), sizeof first);
        EXPECT_EQ(first[0], 0.0f);
        EXPECT_EQ(first[32], 1.0f);
    }
}

// Where the tensor records start (the header, filters and vocabulary before them).
size_t records_start(const WhisperHparams& h, size_t n_tokens_bytes) {
    return 4 + 11 * 4 + 8 + size_t(h.n_mels) * 201 * 4 + 4 + n_tokens_bytes;
}

TEST(WhisperFile, EveryTruncationIsAFormatErrorOrTheHeaderAlone) {
    const Bytes bytes = written(GgmlType::kQ4_0);
    size_t tokens_bytes = 0;
    for (int i = 0; i < 300; ++i)
        tokens_bytes += 4 + std::to_string(i).size();
    const size_t header_end = records_start(small_shape(), tokens_bytes);
    for (size_t cut = 0; cut < bytes.size(); cut += (cut < header_end + 4096 ? 1 : 997)) {
        WhisperGgmlFile f;
        const Status s = WhisperGgmlFile::parse(u8(bytes).first(cut), &f);
        if (cut == header_end) {
            EXPECT_TRUE(s.ok() && !f.has_weights()) << s.message();
        } else {
            ASSERT_EQ(s.code(), SPECULA_ERR_FORMAT) << "cut at " << cut;
        }
    }
}

void expect_error(const Bytes& bytes, specula_status code, const std::string& words,
                  const std::string& what) {
    WhisperGgmlFile f;
    const Status s = WhisperGgmlFile::parse(u8(bytes), &f);
    EXPECT_EQ(s.code(), code) << what << ": " << s.message();
    EXPECT_NE(s.message().find(words), std::string::npos) << what << ": " << s.message();
}

void put_i32(Bytes& b, size_t at, int32_t v) {
    std::memcpy(b.data() + at, &v, 4);
}

size_t find(const Bytes& b, const std::string& text) {
    const auto it = std::search(b.begin(), b.end(), text.begin(), text.end());
    return size_t(it - b.begin());
}

TEST(WhisperFile, MalformedFilesNameTheOffsetAndTheReason) {
    const Bytes good = written(GgmlType::kF16);
    auto b = good;
    put_i32(b, 0, 0x46554747);  // "GGUF"
    expect_error(b, SPECULA_ERR_FORMAT, "magic", "a GGUF magic");
    b = good;
    put_i32(b, 4 + 3 * 4, 5);  // n_audio_head: 64 is no multiple of 5
    expect_error(b, SPECULA_ERR_FORMAT, "heads", "heads that do not divide the width");
    b = good;
    put_i32(b, 4, 0);
    expect_error(b, SPECULA_ERR_FORMAT, "n_vocab = 0", "no vocabulary");
    b = good;
    put_i32(b, 44, 5);
    expect_error(b, SPECULA_ERR_FORMAT, "unknown file type 5", "file type 5");
    b = good;
    put_i32(b, 44, 12);
    expect_error(b, SPECULA_ERR_UNSUPPORTED, "K-quant", "a K-quant file type");
    b = good;
    put_i32(b, 52, 200);
    expect_error(b, SPECULA_ERR_FORMAT, "byte 52: mel filters of 200", "200 frequency bins");
    b = good;
    put_i32(b, 48, 128);
    expect_error(b, SPECULA_ERR_FORMAT, "128 mel filters", "filters for another band count");

    const size_t name_at = find(good, "encoder.ln_post.bias");
    ASSERT_LT(name_at, good.size());
    const size_t record_at = name_at - 4 - 12;  // one dimension, then the name
    b = good;
    b[name_at + 8] = 'X';
    expect_error(b, SPECULA_ERR_FORMAT, "byte " + std::to_string(record_at) + ": unknown tensor",
                 "a renamed tensor");
    b = good;
    put_i32(b, record_at + 12, 63);
    expect_error(b, SPECULA_ERR_FORMAT, "is 63, this model's is 64", "a wrong shape");
    b = good;
    put_i32(b, record_at + 8, int32_t(GgmlType::kF16));
    expect_error(b, SPECULA_ERR_FORMAT, "has type 1 (F16)", "a half-precision bias");
    b = good;
    put_i32(b, record_at, 7);
    expect_error(b, SPECULA_ERR_FORMAT, "7 dimensions", "seven dimensions");
    b = good;
    put_i32(b, record_at + 4, 100000);
    expect_error(b, SPECULA_ERR_FORMAT, "name of 100000 bytes", "a huge name");
    // The bias's record again at the end: a duplicate.
    b = good;
    b.insert(b.end(), good.begin() + long(record_at), good.begin() + long(name_at + 20 + 64 * 4));
    expect_error(b, SPECULA_ERR_FORMAT, "appears twice", "a duplicated tensor");
    b = good;
    b.insert(b.end(), {1, 2, 3, 4, 5});
    expect_error(b, SPECULA_ERR_FORMAT, "truncated", "bytes after the last tensor");
    // A missing tensor: the file without its last record (the last block's cross_attn.out.bias).
    const size_t last_at = find(good, "decoder.blocks.0.cross_attn.out.bias") - 4 - 12;
    b.assign(good.begin(), good.begin() + long(last_at));
    expect_error(b, SPECULA_ERR_FORMAT, "no tensor 'decoder.blocks.0.cross_attn.out.bias'",
                 "a missing tensor");
}

TEST(WhisperFile, TheWriterCopiesTheRealFiltersAndVocabulary) {
    const std::string header = kShared + "/whisper/for-tests-ggml-tiny.en.bin";
    if (!std::filesystem::exists(header)) GTEST_SKIP() << header << " is not here";
    RandomWhisperSpec spec;
    spec.header_path = header;
    ASSERT_TRUE(whisper_shape("tiny", true, &spec.hparams).ok());
    spec.hparams.n_audio_ctx = 64;  // files with shorter audio contexts exist; keeps this small
    spec.weight_type = GgmlType::kQ8_0;
    const std::string path = (test::temp_dir() / "tiny-en-random.bin").string();
    ASSERT_TRUE(write_random_whisper(spec, path).ok());
    const Bytes ours = read_file_bytes(path), theirs = read_file_bytes(header);
    WhisperGgmlFile a, b;
    ASSERT_TRUE(WhisperGgmlFile::parse(u8(ours), &a).ok());
    ASSERT_TRUE(WhisperGgmlFile::parse(u8(theirs), &b).ok());
    EXPECT_EQ(a.mel_filters(), b.mel_filters());
    EXPECT_EQ(a.vocab(), b.vocab());
    EXPECT_EQ(a.hparams().n_audio_ctx, 64);
    EXPECT_EQ(a.find_tensor("encoder.positional_embedding")->shape,
              (std::vector<int64_t>{384, 64}));
    // A header of another vocabulary is refused.
    spec.hparams.n_vocab = 51865;
    EXPECT_EQ(write_random_whisper(spec, path).code(), SPECULA_ERR_INVALID_ARGUMENT);
}

}  // namespace
