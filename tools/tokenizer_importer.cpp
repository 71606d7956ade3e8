#include "tokenizer_importer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

namespace specula {

using nlohmann::json;

namespace {

Status read_json(const std::string& path, json* out) {
    std::ifstream f(path);
    if (!f) return IoError("cannot open " + path);
    *out = json::parse(f, nullptr, false);
    if (out->is_discarded()) return FormatError(path + " is not JSON");
    return Status::Ok();
}

// A special token of tokenizer_config.json: a string, or an object with "content".
std::string token_text(const json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content")) return v.at("content").get<std::string>();
    return {};
}

// The pre-tokenizer of a byte-level BPE tokenizer.json, as a tokenizer.ggml.pre name.
Status byte_level_pre(const json& pre, std::string* name) {
    if (pre.is_object() && pre.value("type", "") == "ByteLevel" && pre.value("use_regex", true)) {
        *name = std::string(Tokenizer::pre_tokenizer_for_regex(Tokenizer::kGpt2Regex));
        return Status::Ok();
    }
    // Sequence [Split(regex, Isolated), ByteLevel(use_regex false)]. GPT-4o's file says "keep
    // the matches, remove the rest" (Removed, inverted): the same pieces where, as in every
    // split specula knows, the regex matches each character somewhere.
    const json& seq = pre.is_object() ? pre.value("pretokenizers", json::array()) : json::array();
    auto isolated = [](const json& split) {
        const std::string behavior = split.value("behavior", "");
        const bool invert = split.value("invert", false);
        return (behavior == "Isolated" && !invert) || (behavior == "Removed" && invert);
    };
    if (seq.size() == 2 && seq[0].value("type", "") == "Split" && isolated(seq[0]) &&
        seq[1].value("type", "") == "ByteLevel" && !seq[1].value("use_regex", true) &&
        seq[0].contains("pattern") && seq[0]["pattern"].contains("Regex")) {
        const std::string regex = seq[0]["pattern"]["Regex"];
        *name = std::string(Tokenizer::pre_tokenizer_for_regex(regex));
        if (!name->empty()) return Status::Ok();
        return Unsupported("pre-tokenizer regex " + regex + ": specula has no split for it");
    }
    return Unsupported("pre-tokenizer " + pre.dump().substr(0, 200) +
                       ": specula has no split for it");
}

// Whether a SentencePiece-style tokenizer.json (BPE with byte fallback) puts "▁" before the text:
// its normalizer must escape spaces as "▁" (Replace), optionally after prepending one (Prepend:
// Llama 2's; Gemma's does not), and its pre-tokenizer must leave the text whole (none, or a
// split at " ", which the escaped text no longer holds). Anything else is refused by name, not
// tokenized some other way.
Status sentencepiece_prefix(const json& normalizer, const json& pre, bool* prefix) {
    json steps = json::array();
    if (normalizer.is_object())
        steps = normalizer.value("type", "") == "Sequence"
                    ? normalizer.value("normalizers", json::array())
                    : json::array({normalizer});
    bool escapes = false;
    *prefix = false;
    for (const json& n : steps) {
        const std::string type = n.value("type", "");
        if (type == "Prepend" && n.value("prepend", "") == Tokenizer::kSpaceMarker && !escapes) {
            *prefix = true;
        } else if (type == "Replace" && n.value("content", "") == Tokenizer::kSpaceMarker &&
                   n.value("pattern", json::object()).value("String", "") == " ") {
            escapes = true;
        } else {
            return Unsupported("normalizer " + normalizer.dump().substr(0, 200) +
                               ": specula has no such normalization");
        }
    }
    if (!escapes)
        return Unsupported("normalizer " + normalizer.dump().substr(0, 200) +
                           ": spaces are not written as U+2581");
    const bool splits_at_spaces = pre.is_object() && pre.value("type", "") == "Split" &&
                                  pre.value("pattern", json::object()).value("String", "") == " ";
    if (!pre.is_null() && !splits_at_spaces)
        return Unsupported("pre-tokenizer " + pre.dump().substr(0, 200) +
                           ": specula has no split for it");
    return Status::Ok();
}

}  // namespace

Status import_tokenizer(const std::string& tokenizer_path, const std::string& config_path,
                        int64_t vocab_size, const std::string& out) {
    json tj, cj = json::object();
    SPECULA_TRY(read_json(tokenizer_path, &tj));
    if (!config_path.empty()) SPECULA_TRY(read_json(config_path, &cj));
    const json& model = tj.at("model");
    if (model.value("type", "") != "BPE")
        return Unsupported("tokenizer model type " + model.value("type", "?"));
    const bool sentencepiece = model.value("byte_fallback", false);

    std::vector<std::string> tokens;
    std::vector<int64_t> types;
    auto place = [&](int64_t id, const std::string& text, int64_t type) -> Status {
        if (id < 0 || id > (1 << 24)) return FormatError("token id " + std::to_string(id));
        if (size_t(id) >= tokens.size())
            tokens.resize(size_t(id) + 1), types.resize(size_t(id) + 1, 0);
        tokens[size_t(id)] = text;
        types[size_t(id)] = type;
        return Status::Ok();
    };
    for (const auto& [text, id] : model.at("vocab").items()) {
        int64_t type = Tokenizer::kNormal;
        if (sentencepiece && text.size() == 6 && text.starts_with("<0x")) type = Tokenizer::kByte;
        SPECULA_TRY(place(id.get<int64_t>(), text, type));
    }
    for (const json& added : tj.value("added_tokens", json::array()))
        SPECULA_TRY(
            place(added.at("id").get<int64_t>(), added.at("content").get<std::string>(),
                  added.value("special", false) ? Tokenizer::kControl : Tokenizer::kUserDefined));
    if (vocab_size > 0) {
        if (size_t(vocab_size) < tokens.size())
            return InvalidArgument("the tokenizer has " + std::to_string(tokens.size()) +
                                   " ids, more than --vocab-size " + std::to_string(vocab_size));
        // As llama.cpp's converter pads a vocabulary to the embedding's rows: "[PAD<id>]".
        const size_t named = tokens.size();
        tokens.resize(size_t(vocab_size)), types.resize(size_t(vocab_size), 0);
        for (size_t i = named; i < tokens.size(); ++i)
            tokens[i] = "[PAD" + std::to_string(i) + "]", types[i] = Tokenizer::kUnused;
    }
    for (size_t i = 0; i < tokens.size(); ++i)
        if (types[i] == 0) {  // an id nothing names
            tokens[i] = "[UNUSED_" + std::to_string(i) + "]";
            types[i] = Tokenizer::kUnused;
        }

    std::vector<std::string> merges;
    for (const json& m : model.value("merges", json::array()))
        merges.push_back(m.is_string()
                             ? m.get<std::string>()
                             : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());

    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_string("general.name", "tokenizer imported from " + tokenizer_path);
    std::unordered_map<std::string, int64_t> ids;
    for (size_t i = 0; i < tokens.size(); ++i)
        ids.emplace(tokens[i], int64_t(i));
    auto id_of = [&](const std::string& text) -> int64_t {
        const auto it = ids.find(text);
        return it == ids.end() ? -1 : it->second;
    };
    const int64_t bos = id_of(token_text(cj.value("bos_token", json()))),
                  eos = id_of(token_text(cj.value("eos_token", json())));
    if (bos >= 0) w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(bos));
    if (eos >= 0) w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(eos));
    if (sentencepiece) {
        // SentencePiece merges the pair whose result scores highest: earlier merges (and, for
        // tokens no merge makes, lower ids) score higher.
        std::vector<double> scores(tokens.size(), 0.0);
        for (size_t i = 0; i < tokens.size(); ++i)
            scores[i] = -double(i);
        for (size_t r = 0; r < merges.size(); ++r) {
            const size_t space = merges[r].find(' ');
            const int64_t id = id_of(merges[r].substr(0, space) + merges[r].substr(space + 1));
            if (id >= 0) scores[size_t(id)] = -double(r);
        }
        w.set_string("tokenizer.ggml.model", "llama");
        w.set("tokenizer.ggml.scores", {GgufType::kArray, GgufType::kFloat32, GgufArray(scores)});
        bool prefix = false;
        SPECULA_TRY(sentencepiece_prefix(tj.value("normalizer", json()),
                                         tj.value("pre_tokenizer", json()), &prefix));
        w.set_bool("tokenizer.ggml.add_space_prefix", prefix);
        if (model.contains("unk_token")) {
            const int64_t unk = id_of(token_text(model.at("unk_token")));
            if (unk >= 0) w.set_u32("tokenizer.ggml.unknown_token_id", uint32_t(unk));
        }
    } else {
        std::string pre;
        SPECULA_TRY(byte_level_pre(tj.value("pre_tokenizer", json()), &pre));
        if (!tj.value("normalizer", json()).is_null() &&
            tj["normalizer"].value("type", "") != "NFC")
            return Unsupported("normalizer " + tj["normalizer"].dump().substr(0, 200));
        w.set_string("tokenizer.ggml.model", "gpt2");
        w.set_string("tokenizer.ggml.pre", pre);
        w.set("tokenizer.ggml.merges", {GgufType::kArray, GgufType::kString, GgufArray(merges)});
    }
    w.set("tokenizer.ggml.tokens", {GgufType::kArray, GgufType::kString, GgufArray(tokens)});
    w.set("tokenizer.ggml.token_type", {GgufType::kArray, GgufType::kInt32, GgufArray(types)});
    // add_bos_token where the config says it; else whether tokenizer.json's post-processor
    // (alone or in a Sequence) puts the BOS before a single text, as Llama 3's does.
    bool add_bos = false;
    if (cj.contains("add_bos_token") && cj["add_bos_token"].is_boolean()) {
        add_bos = cj["add_bos_token"].get<bool>();
    } else if (bos >= 0) {
        const json post = tj.value("post_processor", json());
        json processors = json::array();
        if (post.is_object())
            processors = post.value("type", "") == "Sequence"
                             ? post.value("processors", json::array())
                             : json::array({post});
        for (const json& p : processors) {
            if (p.value("type", "") != "TemplateProcessing") continue;
            const json single = p.value("single", json::array());
            add_bos = !single.empty() && single[0].contains("SpecialToken") &&
                      id_of(single[0]["SpecialToken"].value("id", "")) == bos;
        }
    }
    w.set_bool("tokenizer.ggml.add_bos_token", add_bos);
    if (cj.contains("chat_template") && cj["chat_template"].is_string())
        w.set_string("tokenizer.chat_template", cj["chat_template"].get<std::string>());
    return w.write(out);
}

}  // namespace specula
