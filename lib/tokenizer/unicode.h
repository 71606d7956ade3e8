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

}  // namespace specula
