#include "tokenizer/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace specula {

struct RegexSplitter::Code {
    pcre2_code* code = nullptr;
    ~Code() { pcre2_code_free(code); }
};

RegexSplitter::RegexSplitter(std::unique_ptr<Code> code) : code_(std::move(code)) {}
RegexSplitter::~RegexSplitter() = default;

Status RegexSplitter::compile(std::string_view pattern, std::unique_ptr<RegexSplitter>* out) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    auto code = std::make_unique<Code>();
    code->code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
    if (code->code == nullptr) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(error, message, sizeof message);
        return InvalidArgument("regex at offset " + std::to_string(offset) + ": " +
                               reinterpret_cast<const char*>(message));
    }
    pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);  // where PCRE2 has a JIT; else interpreted
    out->reset(new RegexSplitter(std::move(code)));
    return Status::Ok();
}

std::vector<std::string_view> RegexSplitter::split(std::string_view text) const {
    std::vector<std::string_view> words;
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
        pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t gap = 0, at = 0;
    while (at < text.size()) {
        int rc = pcre2_match(code_->code, subject, text.size(), at, 0, match.get(), nullptr);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)  // the JIT's stack: the interpreter uses the heap
            rc = pcre2_match(code_->code, subject, text.size(), at, PCRE2_NO_JIT, match.get(),
                             nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {  // past PCRE2's heap limit: a character the pattern was not tried on
            at += 1;
            continue;
        }
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
        const size_t begin = ovector[0], end = ovector[1];
        if (end == begin) {  // an empty match: the patterns used here have none; step over it
            at = begin + 1;
            continue;
        }
        if (begin > gap) words.push_back(text.substr(gap, begin - gap));
        words.push_back(text.substr(begin, end - begin));
        gap = at = end;
    }
    if (gap < text.size()) words.push_back(text.substr(gap));
    return words;
}

}  // namespace specula
