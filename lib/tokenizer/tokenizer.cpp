#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <queue>
#include <string_view>

#include "core/log.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/unicode.h"

namespace specula {

namespace {

// GPT-2 maps every byte to a printable code point so that BPE works on text:
// printable Latin-1 bytes map to themselves, the rest to U+0100 onwards.
struct ByteMapping {
    std::array<std::string, 256> byte_to_text;
    std::unordered_map<uint32_t, uint8_t> codepoint_to_byte;
    ByteMapping() {
        uint32_t next = 256;
        for (uint32_t b = 0; b < 256; ++b) {
            const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
            const uint32_t cp = printable ? b : next++;
            utf8_append(&byte_to_text[b], cp);
            codepoint_to_byte[cp] = uint8_t(b);
        }
    }
};

const ByteMapping& byte_mapping() {
    static const ByteMapping m;
    return m;
}

// A byte-level BPE vocabulary's pre-tokenizer: the regexes its tokenizer.json splits text with,
// in sequence (each splits every piece the one before left, "Isolated": matches and the text
// between them are pieces), and whether a word that is itself a token skips the merges
// (tokenizer.json's ignore_merges). The names and splits are llama.cpp's (llama-vocab.cpp).
struct PreTokenizer {
    std::vector<std::string_view> names;  // tokenizer.ggml.pre values
    std::vector<std::string_view> patterns;
    bool ignore_merges;
};

// Llama 3's tokenizer.json: digits in threes, one symbol may lead a word.
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2/2.5/3's: single digits.
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// GPT-4o's (o200k): a word is an upper-case run and then a lower-case one, or the reverse, with
// marks in both and an English contraction after it; digits in threes; a symbol run may end in
// newlines or slashes.
constexpr std::string_view kGpt4oRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Mistral's Tekken (Mistral Nemo): GPT-4o's without the contractions, digits one by one.
constexpr std::string_view kTekkenRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek's splits (code points as escapes: editors and tools normalize some of these
// letters to others, which would change the classes).
constexpr std::string_view kDeepSeekCjk =
    R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
constexpr std::string_view kDeepSeekLetters =
    R"(\s?[)"
    R"(A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF})"
    R"(\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D})"
    R"(\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5})"
    R"(\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})"
    R"(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B})"
    R"(\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})"
    R"(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D})"
    R"(\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4})"
    R"(\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC})"
    R"(\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115})"
    R"(\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})"
    R"(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184})"
    R"(\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3})"
    R"(\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})"
    R"(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17})"
    R"(\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3})"
    R"(\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})"
    R"(\x{1E900}-\x{1E943})"
    R"(]+)";

const std::vector<PreTokenizer>& pre_tokenizers() {
    static const std::vector<PreTokenizer> all = {
        // GPT-2's encoder.py.
        {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es",
          "jina-v2-de", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais"},
         {Tokenizer::kGpt2Regex},
         false},
        {{"llama-bpe", "llama3", "llama-v3", "falcon3"}, {kLlama3Regex}, true},
        {{"dbrx", "smaug-bpe", "chatglm-bpe"}, {kLlama3Regex}, false},
        {{"qwen2", "deepseek-r1-qwen", "stablelm2"}, {kQwen2Regex}, false},
        {{"gpt-4o"}, {kGpt4oRegex}, false},
        {{"tekken"}, {kTekkenRegex}, true},
        // Digits one by one, then GPT-2's split.
        {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
         {R"(\p{N})", Tokenizer::kGpt2Regex},
         false},
        // llama.cpp's split for "default": punctuation runs, GPT-2's split, digit runs, then
        // digits in threes.
        {{"default"},
         {R"([\p{P}\$\+<=>\^~\|]+)", Tokenizer::kGpt2Regex, R"(\p{N}+)", "[0-9][0-9][0-9]"},
         false},
        // Punctuation runs, GPT-2's split, then digits in threes.
        {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", Tokenizer::kGpt2Regex, "[0-9][0-9][0-9]"}, false},
        {{"deepseek-coder"},
         {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepSeekCjk, R"(\p{N})"},
         false},
        {{"deepseek-llm"},
         {R"([\r\n])", kDeepSeekLetters,
          R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)",
          R"(\s+$)", kDeepSeekCjk, R"(\p{N}+)"},
         false},
    };
    return all;
}

// The byte of a SentencePiece byte token "<0xHH>", or -1 when the text is not one.
int byte_value(std::string_view text) {
    auto hex = [](char c) {
        return c >= '0' && c <= '9'   ? c - '0'
               : c >= 'A' && c <= 'F' ? c - 'A' + 10
               : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                      : -1;
    };
    if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return -1;
    const int hi = hex(text[3]), lo = hex(text[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// The pre-tokenizer tokenizer.ggml.pre names. A name without a regex above is refused: another
// split would give other token ids without a word.
Status find_pre_tokenizer(const GgufFile& gguf, const PreTokenizer** out) {
    std::string pre;
    bool found = false;
    SPECULA_TRY(gguf.get_string("tokenizer.ggml.pre", &pre, &found));
    if (!found) {
        // As llama.cpp reads such a file, so both give the same ids.
        log(SPECULA_LOG_WARN,
            "the GGUF file names no pre-tokenizer (tokenizer.ggml.pre): llama.cpp's 'default' "
            "split is used, which may not be the one the model was trained with");
        pre = "default";
    }
    for (const PreTokenizer& p : pre_tokenizers())
        for (std::string_view name : p.names)
            if (pre == name) {
                *out = &p;
                return Status::Ok();
            }
    std::string names;
    for (const PreTokenizer& p : pre_tokenizers())
        for (std::string_view name : p.names) {
            if (!names.empty()) names += ", ";
            names += name;
        }
    return Unsupported("pre-tokenizer '" + pre.substr(0, 64) +
                       "' (tokenizer.ggml.pre): specula has no split for it, and another would "
                       "give other token ids (supported: " +
                       names + ")");
}

}  // namespace

Status Tokenizer::from_gguf(const GgufFile& gguf, std::unique_ptr<Tokenizer>* out) {
    auto t = std::make_unique<Tokenizer>();
    std::string model;
    bool found = false;
    SPECULA_TRY(gguf.get_string("tokenizer.ggml.model", &model, &found));
    if (!found) return FormatError("the GGUF file has no tokenizer (tokenizer.ggml.model)");
    if (model == "llama") {
        t->kind_ = Kind::kSentencePiece;
    } else if (model == "gpt2") {
        t->kind_ = Kind::kBytePairGpt2;
        const PreTokenizer* pre = nullptr;  // SentencePiece has none
        SPECULA_TRY(find_pre_tokenizer(gguf, &pre));
        for (std::string_view pattern : pre->patterns) {
            std::unique_ptr<RegexSplitter> split;
            SPECULA_TRY(RegexSplitter::compile(pattern, &split));
            t->pre_split_.push_back(std::move(split));
        }
        t->ignore_merges_ = pre->ignore_merges;
    } else {
        return Unsupported("tokenizer model '" + model + "' (supported: llama, gpt2)");
    }

    const std::vector<std::string>* tokens = nullptr;
    SPECULA_TRY(gguf.get_string_array("tokenizer.ggml.tokens", &tokens));
    if (tokens == nullptr || tokens->empty())
        return FormatError("the GGUF file has no tokenizer.ggml.tokens");
    if (tokens->size() > (1u << 24)) return FormatError("tokenizer vocabulary is absurdly large");
    t->tokens_ = *tokens;
    const size_t n = tokens->size();

    const std::vector<double>* scores = nullptr;
    SPECULA_TRY(gguf.get_float_array("tokenizer.ggml.scores", &scores));
    if (scores != nullptr && scores->size() != n)
        return FormatError("tokenizer.ggml.scores has the wrong length");
    t->scores_.assign(n, 0.0f);
    if (scores != nullptr)
        for (size_t i = 0; i < n; ++i)
            t->scores_[i] = float((*scores)[i]);

    std::vector<int64_t> types;
    SPECULA_TRY(gguf.get_int_array("tokenizer.ggml.token_type", &types));
    if (!types.empty() && types.size() != n)
        return FormatError("tokenizer.ggml.token_type has the wrong length");
    t->types_.assign(n, kNormal);
    for (size_t i = 0; i < types.size(); ++i)
        t->types_[i] = int32_t(types[i]);
    if (t->kind_ == Kind::kSentencePiece)
        for (size_t i = 0; i < n; ++i)
            if (t->types_[i] == kByte && byte_value(t->tokens_[i]) < 0)
                return FormatError("byte token " + std::to_string(i) + " is '" +
                                   t->tokens_[i].substr(0, 32) + "', not <0xHH>");

    for (size_t i = 0; i < n; ++i)
        if (t->types_[i] == kUserDefined && !t->tokens_[i].empty())
            t->user_defined_.push_back(int32_t(i));
    t->user_defined_and_control_ = t->user_defined_;
    for (size_t i = 0; i < n; ++i)
        if (t->types_[i] == kControl && !t->tokens_[i].empty())
            t->user_defined_and_control_.push_back(int32_t(i));

    t->token_ids_.reserve(n);
    for (size_t i = 0; i < n; ++i)
        t->token_ids_.emplace(t->tokens_[i], int32_t(i));

    if (t->kind_ == Kind::kBytePairGpt2) {
        const std::vector<std::string>* merges = nullptr;
        SPECULA_TRY(gguf.get_string_array("tokenizer.ggml.merges", &merges));
        if (merges == nullptr) return FormatError("a gpt2 tokenizer needs tokenizer.ggml.merges");
        t->merge_ranks_.reserve(merges->size());
        for (size_t i = 0; i < merges->size(); ++i)
            t->merge_ranks_.emplace((*merges)[i], int32_t(i));
    }

    auto token_id = [&](const char* key, int32_t* dst) -> Status {
        int64_t v = -1;
        bool has = false;
        SPECULA_TRY(gguf.get_int(key, &v, &has));
        if (has) {
            if (v < 0 || v >= int64_t(n))
                return FormatError(std::string(key) + " is outside the vocabulary");
            *dst = int32_t(v);
        }
        return Status::Ok();
    };
    const bool spm = t->kind_ == Kind::kSentencePiece;
    if (spm) t->bos_ = 1, t->eos_ = 2, t->unk_ = 0;
    SPECULA_TRY(token_id("tokenizer.ggml.bos_token_id", &t->bos_));
    SPECULA_TRY(token_id("tokenizer.ggml.eos_token_id", &t->eos_));
    SPECULA_TRY(token_id("tokenizer.ggml.unknown_token_id", &t->unk_));
    if (t->bos_ >= int32_t(n)) t->bos_ = -1;
    if (t->eos_ >= int32_t(n)) t->eos_ = -1;
    if (t->unk_ >= int32_t(n)) t->unk_ = -1;
    t->add_bos_ = spm;
    t->add_space_prefix_ = spm;
    SPECULA_TRY(gguf.get_bool("tokenizer.ggml.add_bos_token", &t->add_bos_));
    SPECULA_TRY(gguf.get_bool("tokenizer.ggml.add_space_prefix", &t->add_space_prefix_));
    if (t->bos_ < 0) t->add_bos_ = false;

    // Ends of a reply: EOS, the end-of-turn ids the file names, and the control tokens that end
    // a turn in the chat formats (a Llama 3 or Qwen file often names only one of them).
    int32_t eot = -1, eom = -1;
    SPECULA_TRY(token_id("tokenizer.ggml.eot_token_id", &eot));
    SPECULA_TRY(token_id("tokenizer.ggml.eom_token_id", &eom));
    for (int32_t id : {t->eos_, eot, eom})
        if (id >= 0) t->end_of_generation_.push_back(id);
    for (std::string_view end :
         {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"})
        if (const int32_t id = t->find(end); id >= 0 && t->types_[size_t(id)] == kControl)
            t->end_of_generation_.push_back(id);
    // (std::unique: clang 14 cannot compile libstdc++ 12's std::ranges::unique)
    std::ranges::sort(t->end_of_generation_);
    t->end_of_generation_.erase(
        std::unique(t->end_of_generation_.begin(), t->end_of_generation_.end()),
        t->end_of_generation_.end());
    SPECULA_TRY(gguf.get_string("tokenizer.chat_template", &t->chat_template_));
    *out = std::move(t);
    return Status::Ok();
}

std::string_view Tokenizer::pre_tokenizer_for_regex(std::string_view regex) {
    for (const PreTokenizer& p : pre_tokenizers())
        if (p.patterns.size() == 1 && p.patterns.front() == regex) return p.names.front();
    return {};
}

int32_t Tokenizer::find(std::string_view text) const {
    auto it = token_ids_.find(std::string(text));
    return it == token_ids_.end() ? -1 : it->second;
}

int32_t Tokenizer::byte_token(uint8_t byte) const {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", byte);
    int32_t id = find(hex);
    if (id < 0) id = find(std::string_view(reinterpret_cast<const char*>(&byte), 1));
    return id >= 0 ? id : unk_;
}

bool Tokenizer::ends_generation(int32_t token) const {
    return std::ranges::binary_search(end_of_generation_, token);
}

std::string Tokenizer::text_of(int32_t token) const {
    if (token < 0 || token >= n_vocab()) return {};
    const int32_t type = types_[size_t(token)];
    return type == kControl || type == kUnused ? tokens_[size_t(token)] : piece(token);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
    std::vector<int32_t> out;
    if (add_bos && bos_ >= 0) out.push_back(bos_);
    // User-defined tokens (a tokenizer.json's added tokens that are not special), and control
    // tokens when asked, are found in the text first, as Hugging Face's tokenizers and
    // llama.cpp do (the earliest, then the longest); the text around them is encoded as usual.
    const std::vector<int32_t>& matched = parse_special ? user_defined_and_control_ : user_defined_;
    std::vector<size_t> next(matched.size());
    for (size_t i = 0; i < next.size(); ++i)
        next[i] = text.find(tokens_[size_t(matched[i])]);
    size_t pos = 0;
    while (pos < text.size()) {
        size_t at = std::string_view::npos, length = 0;
        int32_t id = -1;
        for (size_t i = 0; i < next.size(); ++i) {
            const std::string& t = tokens_[size_t(matched[i])];
            if (next[i] != std::string_view::npos && next[i] < pos) next[i] = text.find(t, pos);
            if (next[i] < at ||
                (next[i] == at && at != std::string_view::npos && t.size() > length)) {
                at = next[i];
                length = t.size();
                id = matched[i];
            }
        }
        encode_fragment(text.substr(pos, at == std::string_view::npos ? at : at - pos), pos == 0,
                        &out);
        if (id < 0) break;
        out.push_back(id);
        pos = at + length;
    }
    return out;
}

void Tokenizer::encode_fragment(std::string_view text, bool at_start,
                                std::vector<int32_t>* out) const {
    if (text.empty()) return;
    if (kind_ == Kind::kSentencePiece) {
        std::string escaped;
        if (add_space_prefix_ && at_start) escaped += kSpaceMarker;
        for (char c : text) {
            if (c == ' ')
                escaped += kSpaceMarker;
            else
                escaped += c;
        }
        encode_sentencepiece(escaped, out);
        return;
    }
    std::vector<std::string_view> words = {text};
    for (const auto& split : pre_split_) {
        std::vector<std::string_view> pieces;
        for (std::string_view w : words)
            for (std::string_view piece : split->split(w))
                pieces.push_back(piece);
        words = std::move(pieces);
    }
    for (std::string_view word : words) {
        std::string mapped;
        for (char c : word)
            mapped += byte_mapping().byte_to_text[uint8_t(c)];
        if (const int32_t whole = ignore_merges_ ? find(mapped) : -1; whole >= 0)
            out->push_back(whole);
        else
            encode_bpe_word(mapped, out);
    }
}

namespace {

// A run of bytes in a linked list of symbols that merges shrink.
struct Symbol {
    size_t offset, length;
    int prev, next;
};

struct Candidate {
    int left, right;
    float priority;  // higher merges first; ties go to the leftmost pair
    size_t length;
    bool operator<(const Candidate& o) const {
        return priority < o.priority || (priority == o.priority && left > o.left);
    }
};

std::vector<Symbol> split_chars(std::string_view text) {
    std::vector<Symbol> symbols;
    for (size_t off = 0; off < text.size();) {
        const size_t len = utf8_char_length(text.substr(off));
        const int i = int(symbols.size());
        symbols.push_back({off, len, i - 1, off + len < text.size() ? i + 1 : -1});
        off += len;
    }
    return symbols;
}

// Merges the best adjacent pair until none is mergeable; `score` gives a pair's
// priority or nothing when the pair does not merge.
template <typename Score>
void merge_symbols(std::string_view text, std::vector<Symbol>& symbols, Score score) {
    std::priority_queue<Candidate> queue;
    auto consider = [&](int left, int right) {
        if (left < 0 || right < 0) return;
        const auto& l = symbols[size_t(left)];
        const auto& r = symbols[size_t(right)];
        float priority = 0;
        if (score(text.substr(l.offset, l.length), text.substr(r.offset, r.length), &priority))
            queue.push({left, right, priority, l.length + r.length});
    };
    for (size_t i = 1; i < symbols.size(); ++i)
        consider(int(i) - 1, int(i));
    while (!queue.empty()) {
        const Candidate c = queue.top();
        queue.pop();
        Symbol& l = symbols[size_t(c.left)];
        Symbol& r = symbols[size_t(c.right)];
        if (l.length == 0 || r.length == 0 || l.next != c.right || l.length + r.length != c.length)
            continue;  // stale: one side was merged since this pair was queued
        l.length += r.length;
        r.length = 0;
        l.next = r.next;
        if (r.next >= 0) symbols[size_t(r.next)].prev = c.left;
        consider(l.prev, c.left);
        consider(c.left, l.next);
    }
}

}  // namespace

void Tokenizer::encode_sentencepiece(std::string_view text, std::vector<int32_t>* out) const {
    std::vector<Symbol> symbols = split_chars(text);
    std::string joined;
    merge_symbols(text, symbols, [&](std::string_view a, std::string_view b, float* priority) {
        joined.assign(a);
        joined.append(b);
        const int32_t id = find(joined);
        if (id < 0) return false;
        *priority = scores_[size_t(id)];
        return true;
    });
    for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[size_t(i)].next) {
        const std::string_view s =
            text.substr(symbols[size_t(i)].offset, symbols[size_t(i)].length);
        const int32_t id = find(s);
        if (id >= 0) {
            out->push_back(id);
        } else {
            for (char c : s)
                out->push_back(byte_token(uint8_t(c)));
        }
    }
}

void Tokenizer::encode_bpe_word(std::string_view word, std::vector<int32_t>* out) const {
    std::vector<Symbol> symbols = split_chars(word);
    std::string key;
    merge_symbols(word, symbols, [&](std::string_view a, std::string_view b, float* priority) {
        key.assign(a);
        key += ' ';
        key.append(b);
        auto it = merge_ranks_.find(key);
        if (it == merge_ranks_.end()) return false;
        *priority = -float(it->second);  // lower rank merges first
        return true;
    });
    for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[size_t(i)].next) {
        const std::string_view s =
            word.substr(symbols[size_t(i)].offset, symbols[size_t(i)].length);
        const int32_t id = find(s);
        if (id >= 0) {
            out->push_back(id);
            continue;
        }
        for (size_t off = 0; off < s.size();) {  // unknown symbol: one token per mapped byte
            const size_t len = utf8_char_length(s.substr(off));
            const int32_t b = find(s.substr(off, len));
            if (b >= 0) out->push_back(b);
            off += len;
        }
    }
}

std::string Tokenizer::piece(int32_t token) const {
    if (token < 0 || token >= n_vocab()) return {};
    const int32_t type = types_[size_t(token)];
    const std::string& text = tokens_[size_t(token)];
    if (type == kControl || type == kUnused) return {};
    // A user-defined token is its text as written (matched so in text by encode()); in a
    // SentencePiece vocabulary its U+2581 are spaces too (Gemma's runs of spaces are such tokens).
    if (type == kUserDefined && kind_ != Kind::kSentencePiece) return text;
    if (kind_ == Kind::kSentencePiece) {
        if (type == kByte) return std::string(1, char(byte_value(text)));  // checked at load
        std::string s;
        for (size_t i = 0; i < text.size();) {
            if (std::string_view(text).substr(i).starts_with(kSpaceMarker)) {
                s += ' ';
                i += kSpaceMarker.size();
            } else {
                s += text[i++];
            }
        }
        return s;
    }
    std::string s;
    for (size_t off = 0; off < text.size();) {
        size_t len = 0;
        const uint32_t cp = utf8_decode(std::string_view(text).substr(off), &len);
        auto it = byte_mapping().codepoint_to_byte.find(cp);
        if (it != byte_mapping().codepoint_to_byte.end())
            s += char(it->second);
        else
            s.append(text, off, len);
        off += len;
    }
    return s;
}

std::string Tokenizer::decode(std::span<const int32_t> tokens) const {
    std::string s;
    for (int32_t t : tokens)
        s += piece(t);
    if (add_space_prefix_ && !s.empty() && s[0] == ' ') s.erase(0, 1);
    return s;
}

bool Tokenizer::same_vocabulary(const Tokenizer& o) const {
    return kind_ == o.kind_ && tokens_ == o.tokens_ && types_ == o.types_ && scores_ == o.scores_ &&
           merge_ranks_ == o.merge_ranks_ && bos_ == o.bos_ && eos_ == o.eos_ &&
           add_space_prefix_ == o.add_space_prefix_;
}

Status Tokenizer::check_draft(const Tokenizer& d) const {
    const auto mismatch = [](const std::string& why) {
        return Status(SPECULA_ERR_VOCAB_MISMATCH,
                      "the draft's vocabulary is not the target's: " + why);
    };
    if (kind_ != d.kind_)
        return mismatch(std::string("the draft's tokenizer is ") + d.kind_name() +
                        ", the target's " + kind_name());
    const auto special = [](const char* what, int32_t target, int32_t draft) {
        return std::string(what) + " is id " + std::to_string(target) + " in the target and " +
               std::to_string(draft) + " in the draft";
    };
    if (bos_ != d.bos_) return mismatch(special("BOS", bos_, d.bos_));
    if (eos_ != d.eos_) return mismatch(special("EOS", eos_, d.eos_));
    if (add_bos_ != d.add_bos_)
        return mismatch(std::string("the target ") + (add_bos_ ? "adds" : "does not add") +
                        " a BOS to a text and the draft " + (d.add_bos_ ? "does" : "does not"));
    const int32_t shared = std::min(n_vocab(), d.n_vocab());
    if (std::abs(n_vocab() - d.n_vocab()) > kMaxVocabPadding)
        return mismatch("the target has " + std::to_string(n_vocab()) + " ids and the draft " +
                        std::to_string(d.n_vocab()) + ", more than " +
                        std::to_string(kMaxVocabPadding) + " apart");
    const auto quoted = [](const std::string& text) {
        std::string q(1, '\'');
        q.append(text, 0, 40);
        q += '\'';
        return q;
    };
    for (int32_t id = 0; id < shared; ++id) {
        const auto i = size_t(id);
        if (tokens_[i] != d.tokens_[i] || types_[i] != d.types_[i])
            return mismatch("id " + std::to_string(id) + " is " + quoted(tokens_[i]) +
                            " in the target and " + quoted(d.tokens_[i]) + " in the draft");
    }
    const Tokenizer& longer = n_vocab() > d.n_vocab() ? *this : d;
    for (int32_t id = shared; id < longer.n_vocab(); ++id)
        if (longer.types_[size_t(id)] != kUnused)
            return mismatch("id " + std::to_string(id) + " " + quoted(longer.tokens_[size_t(id)]) +
                            " of the " + (&longer == this ? "target" : "draft") +
                            " is not in the " + (&longer == this ? "draft" : "target") +
                            " and is not an unused (padding) token");
    return Status::Ok();
}

}  // namespace specula
