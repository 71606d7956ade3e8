#include "tokenizer/unicode.h"

#include <algorithm>
#include <iterator>

namespace specula {

namespace {
struct CodepointRange {
    uint32_t first, last;
};
#include "tokenizer/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodepointRange (&ranges)[N], uint32_t cp) {
    auto it = std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                               [](uint32_t c, const CodepointRange& r) { return c < r.first; });
    return it != std::begin(ranges) && cp <= std::prev(it)->last;
}
}  // namespace

size_t utf8_char_length(std::string_view text) {
    size_t len = 0;
    utf8_decode(text, &len);
    return len;
}

uint32_t utf8_decode(std::string_view text, size_t* length) {
    *length = text.empty() ? 0 : 1;
    if (text.empty()) return 0xFFFD;
    const auto b0 = uint8_t(text[0]);
    if (b0 < 0x80) return b0;
    size_t n = 0;
    uint32_t cp = 0;
    if ((b0 & 0xE0) == 0xC0) {
        n = 2;
        cp = b0 & 0x1F;
    } else if ((b0 & 0xF0) == 0xE0) {
        n = 3;
        cp = b0 & 0x0F;
    } else if ((b0 & 0xF8) == 0xF0) {
        n = 4;
        cp = b0 & 0x07;
    } else {
        return 0xFFFD;
    }
    if (text.size() < n) return 0xFFFD;
    for (size_t i = 1; i < n; ++i) {
        const auto b = uint8_t(text[i]);
        if ((b & 0xC0) != 0x80) return 0xFFFD;
        cp = (cp << 6) | (b & 0x3F);
    }
    *length = n;
    return cp;
}

void utf8_append(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
        out->push_back(char(cp));
    } else if (cp < 0x800) {
        out->push_back(char(0xC0 | (cp >> 6)));
        out->push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out->push_back(char(0xE0 | (cp >> 12)));
        out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back(char(0x80 | (cp & 0x3F)));
    } else {
        out->push_back(char(0xF0 | (cp >> 18)));
        out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
        out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back(char(0x80 | (cp & 0x3F)));
    }
}

bool is_unicode_letter(uint32_t cp) {
    return in_ranges(kLetterRanges, cp);
}
bool is_unicode_number(uint32_t cp) {
    return in_ranges(kNumberRanges, cp);
}

bool is_unicode_whitespace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

}  // namespace specula
