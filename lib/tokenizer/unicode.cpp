#include "tokenizer/unicode.h"

namespace specula {

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

}  // namespace specula
