#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace specula {

// Byte length of the UTF-8 sequence starting at text[0] (at least 1, at most
// text.size()). Invalid lead bytes count as a one-byte "character", so every
// byte of the input is kept.
size_t utf8_char_length(std::string_view text);
// Decodes the character at text[0]; returns U+FFFD for an invalid sequence.
uint32_t utf8_decode(std::string_view text, size_t* length);
void utf8_append(std::string* out, uint32_t codepoint);

bool is_unicode_letter(uint32_t cp);      // \p{L}
bool is_unicode_number(uint32_t cp);      // \p{N}
bool is_unicode_whitespace(uint32_t cp);  // \s (the White_Space property)

}  // namespace specula
