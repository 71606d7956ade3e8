// Compares specula's chat templates with an oracle's renderings: reads JSON lines
// (tests/reference/chat_oracle.py) and requires, for every conversation, the text the Jinja
// template wrote, or a refusal where the template raised. With a GGUF vocabulary
// (specula-import-tokenizer of the same tokenizer_config.json), the template is the file's
// tokenizer.chat_template and the text's ids, special tokens parsed and nothing added, must be
// the oracle's. Prints the first mismatches; exit 1 on any.
// Usage: specula-chat-check cases.jsonl [vocab.gguf]
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/chat.h"
#include "vocab_file.h"

using namespace specula;
using nlohmann::json;

int main(int argc, char** argv) {
    if (argc != 2 && argc != 3) {
        std::fprintf(stderr, "usage: %s cases.jsonl [vocab.gguf]\n", argv[0]);
        return 2;
    }
    std::unique_ptr<Tokenizer> tokenizer;
    if (argc == 3) {
        const Status s = test::load_vocabulary(argv[2], &tokenizer);
        if (!s.ok()) {
            std::fprintf(stderr, "%s: %s\n", argv[2], s.message().c_str());
            return 2;
        }
    }
    std::ifstream in(argv[1]);
    std::string line;
    int cases = 0, refusals = 0, id_checks = 0, failures = 0;
    auto fail = [&](const json& c, const std::string& what) {
        if (++failures <= 8)
            std::printf("MISMATCH %s\n  messages %s (generation prompt %d)\n", what.c_str(),
                        c["messages"].dump().c_str(), c["add_generation_prompt"].get<int>());
    };
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        const json c = json::parse(line);
        ++cases;
        const std::string source =
            tokenizer ? tokenizer->chat_template() : c["template"].get<std::string>();
        ChatTemplate chat;
        Status s = ChatTemplate::from(source, &chat);
        if (!s.ok()) {
            std::printf("%s\n", s.message().c_str());
            return 1;
        }
        std::vector<ChatMessage> messages;
        for (const json& m : c["messages"])
            messages.push_back({m["role"].get_ref<const std::string&>(),
                                m["content"].get_ref<const std::string&>()});
        std::string text;
        s = chat.apply(messages, c["add_generation_prompt"], c["bos"].get<std::string>(),
                       c["eos"].get<std::string>(), &text);
        if (c["expected"].is_null()) {
            ++refusals;
            if (s.ok()) fail(c, "the template raises, specula wrote '" + text + "'");
            continue;
        }
        const std::string expected = c["expected"];
        if (!s.ok()) {
            fail(c, "specula refused (" + s.message() + "), expected\n  " + json(expected).dump());
            continue;
        }
        if (text != expected) {
            fail(c, "\n  specula  " + json(text).dump() + "\n  expected " + json(expected).dump());
            continue;
        }
        if (tokenizer && c.contains("ids")) {
            ++id_checks;
            const auto ids = tokenizer->encode(text, false, true);
            if (ids != c["ids"].get<std::vector<int32_t>>())
                fail(c, "token ids of " + json(text).dump() + "\n  specula  " + json(ids).dump() +
                            "\n  expected " + c["ids"].dump());
        }
    }
    std::printf(
        "%d conversations (%d refused by the template), %d token id checks, %d mismatches\n", cases,
        refusals, id_checks, failures);
    return failures == 0 && cases > 0 ? 0 : 1;
}
