// Compares specula's tokenizer with an oracle's ids: reads a GGUF vocabulary and JSON lines
// {"text", "ids"} (tests/reference/tokenizer_oracle.mjs), requires the same ids for every text
// and that decoding them gives the text back. Prints the first mismatches; exit 1 on any.
// Usage: specula-tokenizer-check vocab.gguf cases.jsonl
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "vocab_file.h"

using namespace specula;

namespace {

std::string ids_text(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) {
        if (!s.empty()) s += ' ';
        s += std::to_string(id);
    }
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s vocab.gguf cases.jsonl\n", argv[0]);
        return 2;
    }
    std::unique_ptr<Tokenizer> tokenizer;
    const Status s = test::load_vocabulary(argv[1], &tokenizer);
    if (!s.ok()) {
        std::fprintf(stderr, "%s: %s\n", argv[1], s.message().c_str());
        return 1;
    }
    std::ifstream cases(argv[2]);
    size_t n = 0, id_mismatches = 0, round_trip_mismatches = 0;
    for (std::string line; std::getline(cases, line);) {
        if (line.empty()) continue;
        const nlohmann::json c = nlohmann::json::parse(line);
        const std::string text = c.at("text");
        const std::vector<int32_t> expected = c.at("ids");
        const std::vector<int32_t> ours = tokenizer->encode(text, false);
        ++n;
        if (ours != expected && ++id_mismatches <= 10)
            std::printf("ids differ for %s\n  oracle: %s\n  specula: %s\n",
                        nlohmann::json(text).dump().c_str(), ids_text(expected).c_str(),
                        ids_text(ours).c_str());
        if (tokenizer->decode(ours) != text && ++round_trip_mismatches <= 10)
            std::printf("decoding does not give back %s\n", nlohmann::json(text).dump().c_str());
    }
    std::printf("%zu strings: %zu with other ids than the oracle's, %zu not round-tripping\n", n,
                id_mismatches, round_trip_mismatches);
    return n > 0 && id_mismatches == 0 && round_trip_mismatches == 0 ? 0 : 1;
}
