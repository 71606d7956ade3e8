// Tokenizers read from GGUF metadata (tokenizer.ggml.*): SentencePiece-style
// ("llama": score-driven merges with byte fallback) and byte-level BPE ("gpt2": the
// pre-tokenizer's regex split that tokenizer.ggml.pre names — GPT-2's, Llama 3's, Qwen2's —,
// byte-to-unicode mapping, ranked merges). Both match llama.cpp's tokenization of the same
// vocabulary and Hugging Face's of the tokenizer.json it came from.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "format/gguf.h"
#include "tokenizer/regex_split.h"

namespace specula {

class Tokenizer {
  public:
    enum class Kind { kSentencePiece, kBytePairGpt2 };
    // tokenizer.ggml.token_type values.
    enum TokenType : int32_t {
        kNormal = 1,
        kUnknown = 2,
        kControl = 3,
        kUserDefined = 4,
        kUnused = 5,
        kByte = 6
    };

    static Status from_gguf(const GgufFile& gguf, std::unique_ptr<Tokenizer>* out);
    // The tokenizer.ggml.pre name of the pre-tokenizer that splits by `regex` (a
    // tokenizer.json's Split pattern, or GPT-2's), "" for one specula has no split for.
    static std::string_view pre_tokenizer_for_regex(std::string_view regex);
    static constexpr std::string_view kSpaceMarker =
        "\xE2\x96\x81";  // U+2581: SentencePiece's space
    static constexpr std::string_view kGpt2Regex =
        R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

    Kind kind() const { return kind_; }
    const char* kind_name() const { return kind_ == Kind::kSentencePiece ? "llama" : "gpt2"; }
    int32_t n_vocab() const { return int32_t(tokens_.size()); }
    int32_t bos() const { return bos_; }
    int32_t eos() const { return eos_; }
    bool adds_bos_by_default() const { return add_bos_; }

    // parse_special: control tokens written in the text (<|im_start|>, <|eot_id|>) are those
    // tokens, as a chat template's output needs; otherwise they are text like any other.
    std::vector<int32_t> encode(std::string_view text, bool add_bos,
                                bool parse_special = false) const;
    // The bytes a token stands for in generated text; "" for control tokens.
    std::string piece(int32_t token) const;
    // The token's text in the vocabulary as a chat template writes it ("<|im_end|>"): the
    // piece, or a control token's own text.
    std::string text_of(int32_t token) const;
    // A token that ends a reply: EOS, tokenizer.ggml.eot_token_id / eom_token_id, and the
    // control tokens that end a turn in the chat formats of docs/DESIGN.md "Chat".
    bool ends_generation(int32_t token) const;
    // tokenizer.ggml.chat_template, "" when the file has none.
    const std::string& chat_template() const { return chat_template_; }
    // Concatenated pieces, without the space the tokenizer put in front of the text.
    std::string decode(std::span<const int32_t> tokens) const;

    // Two tokenizers that map every text to the same ids.
    bool same_vocabulary(const Tokenizer& other) const;
    // Whether a draft model with the tokenizer `draft` may propose ids to a target with this
    // one: the same kind, BOS, EOS and add-BOS, the same text and type for every id both have,
    // and at most kMaxVocabPadding ids more on either side, each an unused token (GGUF
    // conversions pad a vocabulary to the embedding's rows: Qwen2.5-0.5B has 151,936 ids,
    // Qwen2.5-7B 152,064). Otherwise SPECULA_ERR_VOCAB_MISMATCH naming the first difference.
    // Scores and merges may differ: the draft never tokenizes text, it only reads and proposes
    // ids (docs/DESIGN.md "Tokenizers").
    Status check_draft(const Tokenizer& draft) const;
    static constexpr int32_t kMaxVocabPadding = 128;

  private:
    // Text without user-defined tokens; at_start: the beginning of the text (SentencePiece's
    // space prefix goes there only).
    void encode_fragment(std::string_view text, bool at_start, std::vector<int32_t>* out) const;
    void encode_sentencepiece(std::string_view text, std::vector<int32_t>* out) const;
    void encode_bpe_word(std::string_view word, std::vector<int32_t>* out) const;
    int32_t find(std::string_view text) const;
    int32_t byte_token(uint8_t byte) const;

    Kind kind_ = Kind::kSentencePiece;
    std::vector<std::string> tokens_;
    std::vector<float> scores_;
    std::vector<int32_t> types_;
    std::unordered_map<std::string, int32_t> token_ids_;
    std::vector<int32_t> user_defined_;  // ids of the tokens matched in text before splitting
    std::vector<int32_t> user_defined_and_control_;  // those matched when parsing special tokens
    std::vector<int32_t> end_of_generation_;         // sorted
    std::string chat_template_;
    std::unordered_map<std::string, int32_t> merge_ranks_;   // "left right" -> rank
    std::vector<std::unique_ptr<RegexSplitter>> pre_split_;  // byte-level BPE: in sequence
    bool ignore_merges_ = false;  // a word that is a token is that token (Llama 3)
    int32_t bos_ = -1, eos_ = -1, unk_ = -1;
    bool add_bos_ = false;
    bool add_space_prefix_ = false;
};

}  // namespace specula
