// specula-import-tokenizer: a Hugging Face tokenizer.json (+ tokenizer_config.json) as a
// vocabulary-only GGUF file (tokenizer_importer.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "tokenizer_importer.h"

using namespace specula;

int main(int argc, char** argv) {
    CLI::App app{"Writes a Hugging Face tokenizer.json as GGUF tokenizer metadata"};
    std::string tokenizer, config, out;
    app.add_option("--tokenizer", tokenizer, "tokenizer.json")->required();
    app.add_option("--config", config, "tokenizer_config.json (special tokens, add_bos_token)");
    app.add_option("-o,--output", out, "the GGUF file to write")->required();
    int64_t vocab_size = 0;
    app.add_option("--vocab-size", vocab_size,
                   "pad the vocabulary with unused tokens to this many ids, as GGUF conversions "
                   "pad it to the embedding's rows (0: the tokenizer's own)");
    CLI11_PARSE(app, argc, argv);
    const Status s = import_tokenizer(tokenizer, config, vocab_size, out);
    if (!s.ok()) {
        std::fprintf(stderr, "specula-import-tokenizer: %s\n", s.message().c_str());
        return 1;
    }
    return 0;
}
