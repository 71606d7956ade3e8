// Text split by a regular expression with Unicode properties (PCRE2): the pre-tokenizers of
// byte-level BPE vocabularies.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace specula {

class RegexSplitter {
  public:
    // `pattern` in PCRE2's syntax with UTF-8 and Unicode properties (\p{L}, \s as White_Space).
    static Status compile(std::string_view pattern, std::unique_ptr<RegexSplitter>* out);
    ~RegexSplitter();

    // The matches and the text between them, in order; together they are `text`. Bytes that
    // are not valid UTF-8 never match, so they end up between matches.
    std::vector<std::string_view> split(std::string_view text) const;

  private:
    struct Code;
    explicit RegexSplitter(std::unique_ptr<Code> code);
    std::unique_ptr<Code> code_;
};

}  // namespace specula
