#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>

#include "platform/mapped_file.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_importer.h"
#include "vocab_file.h"

using namespace specula;

namespace {

struct VocabCase {
    std::string text;
    std::vector<int32_t> expected;
};

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// llama.cpp's format: inputs separated by "\n__ggml_vocab_test__\n"; one output line per input.
std::vector<VocabCase> load_cases(const std::string& prefix) {
    const std::string inp = read_file(prefix + ".inp");
    const std::string out = read_file(prefix + ".out");
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<VocabCase> cases;
    for (size_t pos = 0; pos < inp.size();) {
        size_t next = inp.find(sep, pos);
        if (next == std::string::npos) next = inp.size();
        cases.push_back({inp.substr(pos, next - pos), {}});
        pos = next + sep.size();
    }
    std::istringstream lines(out);
    std::string line;
    for (auto& c : cases) {
        std::getline(lines, line);
        std::istringstream ids(line);
        for (int32_t id; ids >> id;)
            c.expected.push_back(id);
    }
    return cases;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path,
                                          std::unique_ptr<MappedFile>* file) {
    EXPECT_TRUE(MappedFile::open(path, file).ok()) << path;
    GgufFile gguf;
    EXPECT_TRUE(GgufFile::parse((*file)->bytes(), &gguf).ok());
    std::unique_ptr<Tokenizer> tok;
    const Status s = Tokenizer::from_gguf(gguf, &tok);
    EXPECT_TRUE(s.ok()) << s.message();
    return tok;
}

struct Vocab {
    const char* name;
    std::string gguf, vectors;  // the vocabulary, and the prefix of its .inp/.out test vectors
};

class VocabTest : public ::testing::TestWithParam<Vocab> {};

TEST_P(VocabTest, MatchesReferenceVectors) {
    std::unique_ptr<MappedFile> file;
    auto tok = load_tokenizer(GetParam().gguf, &file);
    ASSERT_TRUE(tok);
    const auto cases = load_cases(GetParam().vectors);
    ASSERT_GE(cases.size(), 46u);
    for (const auto& c : cases)
        EXPECT_EQ(tok->encode(c.text, false), c.expected) << "input: [" << c.text << "]";
}

TEST_P(VocabTest, DecodeInvertsEncode) {
    std::unique_ptr<MappedFile> file;
    auto tok = load_tokenizer(GetParam().gguf, &file);
    ASSERT_TRUE(tok);
    for (const auto& c : load_cases(GetParam().vectors))
        EXPECT_EQ(tok->decode(tok->encode(c.text, false)), c.text);
}

// Long runs of one class (a regex engine's stack and backtracking limits) split as short
// ones do: a run of n spaces before a word is n - 1 spaces and " word", digits stay digits.
TEST(Tokenizer, LongRunsRoundTrip) {
    std::unique_ptr<MappedFile> file;
    auto tok = load_tokenizer(test::data_path("ggml-vocab-gpt-2.gguf"), &file);
    ASSERT_TRUE(tok);
    const std::string text = std::string(200000, ' ') + "word" + std::string(100000, '7') +
                             std::string(50000, '\n') + std::string(100000, 'x') + " \xff\xfe end";
    EXPECT_EQ(tok->decode(tok->encode(text, false)), text);
    const std::vector<int32_t> spaced = tok->encode(std::string(1000, ' ') + "word", false);
    const std::vector<int32_t> word = tok->encode(" word", false);
    ASSERT_FALSE(spaced.empty());
    EXPECT_EQ(spaced.back(), word.back());
}

// llama.cpp's vectors (models/ggml-vocab-*.gguf.inp/.out: Hugging Face's ids) for its Llama,
// GPT-2, StarCoder, Falcon and DeepSeek vocabularies (the last four split by sequences of
// regexes), and the vectors that the demo models' own trainer (tools/train/bpe.py) wrote for
// their vocabulary.
INSTANTIATE_TEST_SUITE_P(
    Vocabularies, VocabTest,
    ::testing::Values(Vocab{"llama_spm", test::data_path("ggml-vocab-llama-spm.gguf"),
                            test::data_path("ggml-vocab-llama-spm.gguf")},
                      Vocab{"gpt2", test::data_path("ggml-vocab-gpt-2.gguf"),
                            test::data_path("ggml-vocab-gpt-2.gguf")},
                      Vocab{"starcoder", test::data_path("ggml-vocab-starcoder.gguf"),
                            test::data_path("ggml-vocab-starcoder.gguf")},
                      Vocab{"falcon", test::data_path("ggml-vocab-falcon.gguf"),
                            test::data_path("ggml-vocab-falcon.gguf")},
                      Vocab{"deepseek_coder", test::data_path("ggml-vocab-deepseek-coder.gguf"),
                            test::data_path("ggml-vocab-deepseek-coder.gguf")},
                      Vocab{"deepseek_llm", test::data_path("ggml-vocab-deepseek-llm.gguf"),
                            test::data_path("ggml-vocab-deepseek-llm.gguf")},
                      Vocab{"specula_demo",
                            std::string(SPECULA_MODELS_DIR) + "/specula-demo-target.gguf",
                            test::data_path("specula-demo-vocab")}),
    [](const auto& info) { return std::string(info.param.name); });

// A chat template's text holds control tokens: they are those tokens only when asked, and the
// ones that end a turn end generation.
TEST(Tokenizer, SpecialTokensAreParsedOnlyWhenAskedAndEndReplies) {
    std::unique_ptr<MappedFile> file;
    auto tok = load_tokenizer(test::data_path("ggml-vocab-gpt-2.gguf"), &file);
    ASSERT_TRUE(tok);
    const int32_t end = tok->eos();
    ASSERT_GE(end, 0);
    EXPECT_EQ(tok->text_of(end), "<|endoftext|>");
    EXPECT_EQ(tok->piece(end), "");
    const auto hi = tok->encode("Hi", false), there = tok->encode(" there", false);
    std::vector<int32_t> expected = hi;
    expected.push_back(end);
    expected.insert(expected.end(), there.begin(), there.end());
    EXPECT_EQ(tok->encode("Hi<|endoftext|> there", false, true), expected);
    const auto as_text = tok->encode("Hi<|endoftext|> there", false, false);
    EXPECT_EQ(std::ranges::count(as_text, end), 0);
    EXPECT_GT(as_text.size(), expected.size());
    EXPECT_TRUE(tok->ends_generation(end));
    EXPECT_FALSE(tok->ends_generation(hi.front()));
}

TEST(Tokenizer, SentencePieceAddsBosAndFallsBackToBytes) {
    std::unique_ptr<MappedFile> file;
    auto tok = load_tokenizer(test::data_path("ggml-vocab-llama-spm.gguf"), &file);
    ASSERT_TRUE(tok);
    EXPECT_EQ(tok->kind(), Tokenizer::Kind::kSentencePiece);
    const auto ids = tok->encode("\x01", true);
    ASSERT_GE(ids.size(), 2u);
    EXPECT_EQ(ids[0], tok->bos());
    EXPECT_EQ(tok->piece(ids.back()), "\x01");  // <0x01> byte token
    EXPECT_EQ(tok->piece(tok->bos()), "");      // control tokens print nothing
}

TEST(Tokenizer, InvalidUtf8SurvivesRoundTrip) {
    for (const char* vocab : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"}) {
        std::unique_ptr<MappedFile> file;
        auto tok = load_tokenizer(test::data_path(vocab), &file);
        ASSERT_TRUE(tok);
        const std::string bad = "ok \xff\xfe truncated \xe2\x82";
        EXPECT_EQ(tok->decode(tok->encode(bad, false)), bad) << vocab;
    }
}

// A tokenizer from a GGUF file's bytes (patched copies of the test vocabularies).
Status tokenizer_from_bytes(const std::string& bytes) {
    GgufFile gguf;
    const Status parsed = GgufFile::parse(
        std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), &gguf);
    EXPECT_TRUE(parsed.ok()) << parsed.message();  // the patch keeps the file well-formed
    if (!parsed.ok()) return parsed;
    std::unique_ptr<Tokenizer> tok;
    return Tokenizer::from_gguf(gguf, &tok);
}

// A byte token that is not <0xHH> is a malformed file, refused at load (detokenizing it used
// to throw from inside the library).
TEST(Tokenizer, MalformedByteTokensAreRefusedAtLoad) {
    std::string bytes = read_file(test::data_path("ggml-vocab-llama-spm.gguf"));
    for (const char* bad : {"<0xZZ>", "<0x1G>", "<0x01)"}) {
        std::string patched = bytes;
        const size_t at = patched.find("<0x01>");
        ASSERT_NE(at, std::string::npos);
        patched.replace(at, 6, bad);
        const Status s = tokenizer_from_bytes(patched);
        EXPECT_EQ(s.code(), SPECULA_ERR_FORMAT) << bad;
        EXPECT_NE(s.message().find(bad), std::string::npos) << s.message();
    }
}

// A BPE vocabulary whose pre-tokenizer is not implemented is refused, naming it: splitting it
// another way would give other ids without a word.
TEST(Tokenizer, UnknownPreTokenizersAreUnsupported) {
    const std::string bytes = read_file(test::data_path("ggml-vocab-gpt-2.gguf"));
    const std::string key = "tokenizer.ggml.pre";
    const size_t at = bytes.find(key);
    ASSERT_NE(at, std::string::npos);
    const size_t value = at + key.size() + 4;  // after the value's type (u32)
    uint64_t length = 0;
    std::memcpy(&length, bytes.data() + value, 8);
    ASSERT_EQ(bytes.substr(value + 8, length), "gpt-2");
    const std::vector<std::string> known = {
        "gpt-2",  "phi-2",     "llama-bpe", "qwen2",  "deepseek-llm",     "deepseek-coder",
        "falcon", "starcoder", "command-r", "smollm", "deepseek-r1-qwen", "default",
        "tekken"};
    for (const std::string pre :
         {"gpt-2", "phi-2", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "falcon",
          "starcoder", "command-r", "smollm", "deepseek-r1-qwen", "default", "tekken", "bloom",
          "chameleon", ""}) {
        std::string patched = bytes;
        const uint64_t n = pre.size();
        patched.replace(value, 8 + length, std::string(reinterpret_cast<const char*>(&n), 8) + pre);
        const Status s = tokenizer_from_bytes(patched);
        if (std::find(known.begin(), known.end(), pre) != known.end()) {
            EXPECT_TRUE(s.ok()) << pre << ": " << s.message();
        } else {
            EXPECT_EQ(s.code(), SPECULA_ERR_UNSUPPORTED) << pre;
            EXPECT_NE(s.message().find("'" + pre + "'"), std::string::npos) << s.message();
        }
    }
}

// A SentencePiece-style tokenizer.json (BPE with byte fallback) with this normalizer and
// pre-tokenizer, imported; the tokenizer read back from the GGUF file when that succeeds.
Status import_sentencepiece(const std::string& name, const std::string& normalizer,
                            const std::string& pre, std::unique_ptr<Tokenizer>* out) {
    // "\u2581" is U+2581, SentencePiece's visible space, in JSON.
    const std::string json = R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {
        "<unk>": 0, "\u2581": 1, "a": 2, "b": 3, "\u2581a": 4, "ab": 5, "\u2581ab": 6},
        "merges": ["\u2581 a", "a b", "\u2581a b"]}, "normalizer": )" +
                             normalizer + R"(, "pre_tokenizer": )" + pre + "}";
    const std::filesystem::path dir = test::temp_dir();
    const std::string json_path = (dir / (name + ".json")).string(),
                      gguf_path = (dir / (name + ".gguf")).string();
    std::ofstream(json_path) << json;
    SPECULA_TRY(import_tokenizer(json_path, "", 0, gguf_path));
    return test::load_vocabulary(gguf_path, out);
}

// Llama 2's normalizer prepends "\u2581" and Gemma's does not: the ids of "ab" differ, and
// each decodes back to the text. Planted: a space prefix for every SentencePiece file gave
// Gemma 3's real tokenizer other ids for 258,435 of 264,993 strings (tokenizer_oracle_gemma3).
// Normalizations and splits specula does not have are refused by name.
TEST(TokenizerImport, SentencePiecePrefixesSpacesAsItsNormalizerSays) {
    const std::string replace =
        R"({"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"})";
    const std::string prepend = R"({"type": "Prepend", "prepend": "\u2581"})";
    std::unique_ptr<Tokenizer> llama2, gemma;
    Status s = import_sentencepiece(
        "spm-llama2", R"({"type": "Sequence", "normalizers": [)" + prepend + "," + replace + "]}",
        "null", &llama2);
    ASSERT_TRUE(s.ok()) << s.message();
    s = import_sentencepiece("spm-gemma", replace,
                             R"({"type": "Split", "pattern": {"String": " "},
                                 "behavior": "MergedWithPrevious", "invert": false})",
                             &gemma);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(llama2->encode("ab", false), std::vector<int32_t>({6}));
    EXPECT_EQ(gemma->encode("ab", false), std::vector<int32_t>({5}));
    EXPECT_EQ(gemma->encode(" ab", false), std::vector<int32_t>({6}));
    for (const std::string text : {"ab", " ab", "ab ab", "  a"}) {
        EXPECT_EQ(llama2->decode(llama2->encode(text, false)), text);
        EXPECT_EQ(gemma->decode(gemma->encode(text, false)), text);
    }
    const std::pair<std::string, std::string> refused[] = {
        {R"({"type": "NFKC"})", "null"},
        {"null", "null"},  // spaces left as spaces
        {replace, R"({"type": "Metaspace", "replacement": "\u2581", "split": true})"},
    };
    for (const auto& [normalizer, pre] : refused) {
        std::unique_ptr<Tokenizer> t;
        s = import_sentencepiece("spm-refused", normalizer, pre, &t);
        EXPECT_EQ(s.code(), SPECULA_ERR_UNSUPPORTED) << normalizer << " " << pre;
        EXPECT_TRUE(s.message().find("normalizer") != std::string::npos ||
                    s.message().find("pre-tokenizer") != std::string::npos)
            << s.message();
    }
}

// The GPT-2 test vocabulary with tokenizer.ggml.pre set to `pre`, or without that key.
std::string gpt2_vocabulary_with_pre(const std::optional<std::string>& pre) {
    std::string bytes = read_file(test::data_path("ggml-vocab-gpt-2.gguf"));
    const std::string key = "tokenizer.ggml.pre";
    const size_t at = bytes.find(key);
    EXPECT_NE(at, std::string::npos);
    const size_t value = at + key.size() + 4;  // after the value's type (u32)
    uint64_t length = 0;
    std::memcpy(&length, bytes.data() + value, 8);
    if (pre) {
        const uint64_t n = pre->size();
        bytes.replace(value, 8 + length, std::string(reinterpret_cast<const char*>(&n), 8) + *pre);
    } else {  // the whole pair, from its key's length, and one pair fewer in the header
        bytes.erase(at - 8, 8 + key.size() + 4 + 8 + length);
        uint64_t n_kv = 0;
        std::memcpy(&n_kv, bytes.data() + 16, 8);
        --n_kv;
        std::memcpy(bytes.data() + 16, &n_kv, 8);
    }
    return bytes;
}

// llama.cpp's "default" split (punctuation runs, GPT-2's, digit runs, digits in threes), which
// llama.cpp also takes for a file that names no pre-tokenizer. The ids are llama.cpp's
// (c392e50's llama-tokenize on this vocabulary with "default"); GPT-2's split gives other ids
// for each of these strings.
TEST(Tokenizer, TheDefaultPreTokenizerSplitsAsLlamaCppDoes) {
    const std::vector<VocabCase> cases = {
        {"ied 4 \u00bd months", {798, 220, 19, 220, 23141, 1933}},
        {"w048 7tuijk dsdfhu", {86, 47202, 220, 22, 28047, 45961, 288, 82, 7568, 13415}},
        {"3333333 33 333333333", {20370, 20370, 18, 220, 2091, 220, 20370, 20370, 20370}},
        {"a  1,234,567.89!!! ~~|| <=> $$$ ^^^",
         {64,  220,  220,   16,  11, 24409, 11,  20,    3134, 13,  4531,  10185,
          220, 4907, 15886, 220, 27, 14804, 220, 13702, 3,    220, 18237, 61}},
        {"def f(x):\n    return x**2 # ok?!",
         {4299, 277, 7, 87, 2599, 198, 220, 220, 220, 1441, 2124, 1174, 17, 220, 2, 12876, 12248}},
        {"Hello---world...,,, ;; 2024-11-25T12:00",
         {15496, 6329, 6894, 986, 9832, 11, 220, 7665, 220, 19004, 19, 12, 1157, 12, 1495, 51, 1065,
          25, 405}},
    };
    for (const auto& pre : {std::optional<std::string>("default"), std::optional<std::string>()}) {
        SCOPED_TRACE(pre ? "tokenizer.ggml.pre = " + *pre : "no tokenizer.ggml.pre");
        const std::string bytes = gpt2_vocabulary_with_pre(pre);
        GgufFile gguf;
        ASSERT_TRUE(
            GgufFile::parse(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                            &gguf)
                .ok());
        std::unique_ptr<Tokenizer> tok;
        const Status s = Tokenizer::from_gguf(gguf, &tok);
        ASSERT_TRUE(s.ok()) << s.message();
        for (const auto& c : cases)
            EXPECT_EQ(tok->encode(c.text, false), c.expected) << "input: [" << c.text << "]";
    }
}

TEST(Tokenizer, SameVocabularyDistinguishesVocabularies) {
    std::unique_ptr<MappedFile> f1, f2, f3;
    auto spm = load_tokenizer(test::data_path("ggml-vocab-llama-spm.gguf"), &f1);
    auto spm2 = load_tokenizer(test::data_path("ggml-vocab-llama-spm.gguf"), &f2);
    auto bpe = load_tokenizer(test::data_path("ggml-vocab-gpt-2.gguf"), &f3);
    EXPECT_TRUE(spm->same_vocabulary(*spm2));
    EXPECT_FALSE(spm->same_vocabulary(*bpe));
}

// The llama-spm test vocabulary written again with its tokenizer metadata changed by `edit`.
std::unique_ptr<Tokenizer> edited_spm(
    const std::string& name,
    const std::function<void(std::vector<std::pair<std::string, GgufValue>>*)>& edit,
    std::unique_ptr<MappedFile>* file) {
    const std::string path = (test::temp_dir() / ("vocab-" + name + ".gguf")).string();
    const Status s = test::write_edited_gguf(test::data_path("ggml-vocab-llama-spm.gguf"),
                                             {.metadata = edit, .tensor = {}}, path);
    EXPECT_TRUE(s.ok()) << s.message();
    return load_tokenizer(path, file);
}

// `count` more ids, as llama.cpp's converter pads a SentencePiece vocabulary ("[PAD<n>]",
// score -1000, unused), the last of type `last_type`.
void pad(std::vector<std::pair<std::string, GgufValue>>* m, int count,
         int64_t last_type = Tokenizer::kUnused) {
    auto& tokens = std::get<std::vector<std::string>>(
        std::get<GgufArray>(test::find_value(m, "tokenizer.ggml.tokens")->value));
    auto& scores = std::get<std::vector<double>>(
        std::get<GgufArray>(test::find_value(m, "tokenizer.ggml.scores")->value));
    auto& types = std::get<std::vector<int64_t>>(
        std::get<GgufArray>(test::find_value(m, "tokenizer.ggml.token_type")->value));
    for (int i = 1; i <= count; ++i) {
        tokens.push_back("[PAD" + std::to_string(i) + "]");
        scores.push_back(-1000.0);
        types.push_back(i == count ? last_type : int64_t(Tokenizer::kUnused));
    }
}

TEST(Tokenizer, ADraftMayDifferInPaddingOnly) {
    std::unique_ptr<MappedFile> files[10];
    const auto base = edited_spm(
        "same", [](auto*) {}, &files[0]);
    const auto padded = edited_spm(
        "padded-64", [](auto* m) { pad(m, 64); }, &files[1]);
    const auto padded_more = edited_spm(
        "padded-128", [](auto* m) { pad(m, 128); }, &files[2]);
    ASSERT_EQ(padded->n_vocab(), base->n_vocab() + 64);
    // Padding on either side, up to 128 ids apart (Qwen2.5-0.5B's 151,936 and 7B's 152,064).
    EXPECT_TRUE(base->check_draft(*padded).ok());
    EXPECT_TRUE(padded->check_draft(*base).ok());
    EXPECT_TRUE(padded->check_draft(*padded_more).ok());
    EXPECT_TRUE(base->check_draft(*padded_more).ok());
    EXPECT_FALSE(base->same_vocabulary(*padded));

    const auto refused = [&](const Tokenizer& target, const Tokenizer& draft,
                             const std::string& named) {
        const Status s = target.check_draft(draft);
        EXPECT_EQ(s.code(), SPECULA_ERR_VOCAB_MISMATCH) << named;
        EXPECT_NE(s.message().find(named), std::string::npos) << s.message();
    };
    const auto too_many = edited_spm(
        "padded-129", [](auto* m) { pad(m, 129); }, &files[3]);
    refused(*base, *too_many, "more than 128 apart");
    refused(*too_many, *base, "more than 128 apart");
    // An id past the other's vocabulary that is a real token, not padding.
    const int32_t last = base->n_vocab() + 63;
    const auto real_tail = edited_spm(
        "padded-normal", [](auto* m) { pad(m, 64, Tokenizer::kNormal); }, &files[4]);
    refused(*base, *real_tail, "id " + std::to_string(last) + " '[PAD64]' of the draft");
    refused(*real_tail, *base, "id " + std::to_string(last) + " '[PAD64]' of the target");
    const auto set_id = [](const char* key, uint64_t id) {
        return [=](std::vector<std::pair<std::string, GgufValue>>* m) {
            pad(m, 8);
            GgufValue* v = test::find_value(m, key);
            if (v == nullptr) v = &m->emplace_back(key, GgufValue{}).second;
            v->type = GgufType::kUint32;
            v->value.emplace<uint64_t>(id);
        };
    };
    refused(*base, *edited_spm("bos", set_id("tokenizer.ggml.bos_token_id", 2), &files[5]),
            "BOS is id 1 in the target and 2 in the draft");
    refused(*base, *edited_spm("eos", set_id("tokenizer.ggml.eos_token_id", 1), &files[6]),
            "EOS is id 2 in the target and 1 in the draft");
    refused(*base,
            *edited_spm(
                "add-bos",
                [](auto* m) {
                    pad(m, 8);
                    GgufValue& v =
                        m->emplace_back("tokenizer.ggml.add_bos_token", GgufValue{}).second;
                    v.type = GgufType::kBool;
                    v.value.emplace<bool>(false);
                },
                &files[7]),
            "does not");
    refused(*base,
            *edited_spm(
                "text",
                [](auto* m) {
                    std::get<std::vector<std::string>>(
                        std::get<GgufArray>(test::find_value(m, "tokenizer.ggml.tokens")->value))
                        .at(1234) = "other";
                },
                &files[8]),
            "id 1234 is '\xE2\x96\x81"
            "answer' in the target and 'other' in the draft");
    std::unique_ptr<MappedFile> gpt2_file;
    refused(*base, *load_tokenizer(test::data_path("ggml-vocab-gpt-2.gguf"), &gpt2_file),
            "the draft's tokenizer is gpt2, the target's llama");
}

}  // namespace
