// A tokenizer read from a GGUF file (a vocabulary-only one, or a model's), for the test programs.
#pragma once

#include <memory>
#include <string>

#include "format/gguf.h"
#include "platform/mapped_file.h"
#include "tokenizer/tokenizer.h"

namespace specula::test {

// The tokenizer keeps copies of what it reads, so the file is closed again.
inline Status load_vocabulary(const std::string& path, std::unique_ptr<Tokenizer>* out) {
    std::unique_ptr<MappedFile> file;
    GgufFile gguf;
    SPECULA_TRY(MappedFile::open(path, &file));
    SPECULA_TRY(GgufFile::parse(file->bytes(), &gguf));
    return Tokenizer::from_gguf(gguf, out);
}

}  // namespace specula::test
