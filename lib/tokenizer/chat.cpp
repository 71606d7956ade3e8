#include "tokenizer/chat.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <optional>

namespace specula {

namespace {

bool has(std::string_view text, std::string_view part) {
    return text.find(part) != std::string_view::npos;
}

// Jinja's trim (Python's str.strip) for ASCII white space.
std::string_view trim(std::string_view s, std::string_view chars = " \t\n\r\f\v") {
    const size_t first = s.find_first_not_of(chars);
    if (first == std::string_view::npos) return {};
    return s.substr(first, s.find_last_not_of(chars) - first + 1);
}
std::string_view ltrim(std::string_view s, std::string_view chars) {
    const size_t first = s.find_first_not_of(chars);
    return first == std::string_view::npos ? std::string_view{} : s.substr(first);
}
std::string_view rtrim(std::string_view s, std::string_view chars) {
    const size_t last = s.find_last_not_of(chars);
    return last == std::string_view::npos ? std::string_view{} : s.substr(0, last + 1);
}

// Jinja's tojson of a string, as Hugging Face sets it up (Python's json.dumps, non-ASCII kept).
std::string json_string(std::string_view s) {
    std::string out = "\"";
    for (const char c : s) {
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\b':
                out += "\\b";
                break;
            case '\f':
                out += "\\f";
                break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char hex[8];
                    std::snprintf(hex, sizeof hex, "\\u%04x", unsigned(c));
                    out += hex;
                } else {
                    out += c;
                }
        }
    }
    return out + "\"";
}

// The string literal assigned by `set <name> = "..."` in a template, if any.
std::optional<std::string> assigned_literal(std::string_view tmpl, std::string_view name) {
    const std::string key = "set " + std::string(name) + " = \"";
    const size_t at = tmpl.find(key);
    if (at == std::string_view::npos) return std::nullopt;
    const size_t begin = at + key.size(), end = tmpl.find('"', begin);
    if (end == std::string_view::npos) return std::nullopt;
    return std::string(tmpl.substr(begin, end - begin));
}

std::string today() {  // strftime("%d %b %Y") in local time, as Hugging Face's strftime_now
    const std::time_t now = std::time(nullptr);
    std::tm local{};
#ifdef _WIN32
    localtime_s(&local, &now);
#else
    localtime_r(&now, &local);
#endif
    char text[32];
    std::strftime(text, sizeof text, "%d %b %Y", &local);
    return text;
}

// Gemma's and Mistral's templates require user, other, user, other, ...
Status check_alternation(std::span<const ChatMessage> messages) {
    for (size_t i = 0; i < messages.size(); ++i)
        if ((messages[i].role == "user") != (i % 2 == 0))
            return InvalidArgument(
                "the template requires the roles to alternate user, assistant, "
                "user, ... after an optional system message (message " +
                std::to_string(i) + " is " + std::string(messages[i].role) + ")");
    return Status::Ok();
}

}  // namespace

Status ChatTemplate::from(std::string_view source, ChatTemplate* out) {
    static constexpr std::pair<std::string_view, Family> kNames[] = {
        {"llama3", Family::kLlama3},
        {"chatml", Family::kChatml},
        {"gemma", Family::kGemma},
        {"mistral-v3-tekken", Family::kMistralTekken},
        {"phi3", Family::kPhi3}};
    static constexpr std::string_view kQwenSystem =
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    ChatTemplate t;
    const auto named =
        std::ranges::find(kNames, source, &std::pair<std::string_view, Family>::first);
    if (named != std::end(kNames)) {
        t.family_ = named->second;
    } else if (has(source, "<|start_header_id|>")) {
        t.family_ = Family::kLlama3;
    } else if (has(source, "<|im_start|>")) {
        t.family_ = Family::kChatml;
    } else if (has(source, "<start_of_turn>")) {
        t.family_ = Family::kGemma;
    } else if (has(source, "[INST]") && !has(source, "[INST] ") && !has(source, "<<SYS>>") &&
               !has(source, "[SYSTEM_PROMPT]")) {
        t.family_ = Family::kMistralTekken;
    } else if (has(source, "<|assistant|>") && has(source, "<|end|>")) {
        t.family_ = Family::kPhi3;
    } else {
        std::string names;
        for (const auto& [name, family] : kNames)
            names += (names.empty() ? "" : ", ") + std::string(name);
        return Status(SPECULA_ERR_UNSUPPORTED, "the chat template is of no family specula knows (" +
                                                   names + "): '" +
                                                   std::string(source.substr(0, 80)) + "'");
    }
    // What a family's templates differ in, read from the template (a name has none of it).
    t.date_header_ = has(source, "Cutting Knowledge Date");
    t.date_today_ = has(source, "strftime_now");
    t.date_ = assigned_literal(source, "date_string").value_or("26 Jul 2024");
    t.always_generation_prompt_ = named == std::end(kNames) && t.family_ == Family::kLlama3 &&
                                  !has(source, "add_generation_prompt");
    if (has(source, kQwenSystem)) t.default_system_ = kQwenSystem;
    t.qwen_roles_ = has(source, "<tool_response>");
    t.reasoning_ = has(source, "</think>") && has(source, "last_query_index");
    *out = std::move(t);
    return Status::Ok();
}

Status ChatTemplate::apply(std::span<const ChatMessage> messages, bool add_generation_prompt,
                           std::string_view bos, std::string_view eos, std::string* out) const {
    out->clear();
    switch (family_) {
        case Family::kLlama3:
            return apply_llama3(messages, add_generation_prompt, bos, out);
        case Family::kChatml:
            return apply_chatml(messages, add_generation_prompt, out);
        case Family::kGemma: {
            // A system message opens the first user turn; the assistant is the "model".
            std::string prefix;
            if (!messages.empty() && messages.front().role == "system") {
                prefix = std::string(messages.front().content) + "\n\n";
                messages = messages.subspan(1);
            }
            SPECULA_TRY(check_alternation(messages));
            *out += bos;
            for (size_t i = 0; i < messages.size(); ++i) {
                const ChatMessage& m = messages[i];
                *out += "<start_of_turn>";
                *out += m.role == "assistant" ? std::string_view("model") : m.role;
                *out += '\n';
                if (i == 0) *out += prefix;
                *out += trim(m.content);
                *out += "<end_of_turn>\n";
            }
            if (add_generation_prompt) *out += "<start_of_turn>model\n";
            return Status::Ok();
        }
        case Family::kMistralTekken: {
            // The system message goes into the last message when that is the user's (and is
            // lost otherwise, as in the template); no generation prompt exists.
            std::optional<std::string_view> system;
            if (!messages.empty() && messages.front().role == "system") {
                system = messages.front().content;
                messages = messages.subspan(1);
            }
            SPECULA_TRY(check_alternation(messages));
            *out += bos;
            for (size_t i = 0; i < messages.size(); ++i) {
                const ChatMessage& m = messages[i];
                if (m.role == "user") {
                    *out += "[INST]";
                    if (system && i + 1 == messages.size()) *out += std::string(*system) + "\n\n";
                    *out += m.content;
                    *out += "[/INST]";
                } else if (m.role == "assistant") {
                    *out += m.content;
                    *out += eos;
                } else {
                    return InvalidArgument(
                        "the template knows the roles user and assistant after "
                        "an optional system message, not " +
                        std::string(m.role));
                }
            }
            return Status::Ok();
        }
        case Family::kPhi3: {
            for (const ChatMessage& m : messages)
                if (m.role == "system" || m.role == "user" || m.role == "assistant")
                    *out +=
                        "<|" + std::string(m.role) + "|>\n" + std::string(m.content) + "<|end|>\n";
            if (add_generation_prompt)
                *out += "<|assistant|>\n";
            else
                *out += eos;
            return Status::Ok();
        }
    }
    return Status::Ok();
}

Status ChatTemplate::apply_llama3(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                  std::string_view bos, std::string* out) const {
    auto header = [&](std::string_view role) {
        *out += "<|start_header_id|>";
        *out += role;
        *out += "<|end_header_id|>\n\n";
    };
    // Llama 3.1/3.2 write the BOS first; Llama 3 before the first message.
    if (date_header_ || !messages.empty()) *out += bos;
    if (date_header_) {
        std::string_view system;
        if (!messages.empty() && messages.front().role == "system") {
            system = trim(messages.front().content);
            messages = messages.subspan(1);
        }
        header("system");
        *out += "Cutting Knowledge Date: December 2023\nToday Date: ";
        *out += date_today_ ? today() : date_;
        *out += "\n\n";
        *out += system;
        *out += "<|eot_id|>";
    }
    for (const ChatMessage& m : messages) {
        if (date_header_ && (m.role == "ipython" || m.role == "tool")) {
            header("ipython");  // a string is iterable to Jinja: the template writes it as JSON
            *out += json_string(m.content);
        } else {
            header(m.role);
            *out += trim(m.content);
        }
        *out += "<|eot_id|>";
    }
    if (add_generation_prompt || always_generation_prompt_) header("assistant");
    return Status::Ok();
}

Status ChatTemplate::apply_chatml(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                  std::string* out) const {
    auto turn = [&](std::string_view role, std::string_view content) {
        *out += "<|im_start|>";
        *out += role;
        *out += '\n';
        *out += content;
        *out += "<|im_end|>\n";
    };
    const bool first_is_system = !messages.empty() && messages.front().role == "system";
    if (!first_is_system && !default_system_.empty()) turn("system", default_system_);
    // Qwen3 keeps the reasoning of the replies after the last query only.
    size_t last_query = messages.empty() ? 0 : messages.size() - 1;
    for (size_t i = messages.size(); i-- > 0;) {
        const std::string_view c = messages[i].content;
        if (messages[i].role == "user" &&
            !(c.starts_with("<tool_response>") && c.ends_with("</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (!qwen_roles_ || m.role == "user" || m.role == "system") {
            turn(m.role, m.content);
        } else if (m.role == "assistant") {
            std::string_view content = m.content, reasoning;
            if (reasoning_ && has(content, "</think>")) {
                const std::string_view before = content.substr(0, content.find("</think>"));
                content = ltrim(content.substr(content.rfind("</think>") + 8), "\n");
                reasoning = rtrim(before, "\n");
                if (const size_t open = reasoning.rfind("<think>"); open != std::string_view::npos)
                    reasoning = reasoning.substr(open + 7);
                reasoning = ltrim(reasoning, "\n");
            }
            *out += "<|im_start|>assistant\n";
            if (reasoning_ && i > last_query && (i + 1 == messages.size() || !reasoning.empty())) {
                *out += "<think>\n";
                *out += trim(reasoning, "\n");
                *out += "\n</think>\n\n";
                *out += ltrim(content, "\n");
            } else {
                *out += content;
            }
            *out += "<|im_end|>\n";
        } else if (m.role == "tool") {
            // Consecutive tool results share one user turn.
            if (i == 0 || messages[i - 1].role != "tool") *out += "<|im_start|>user";
            *out += "\n<tool_response>\n";
            *out += m.content;
            *out += "\n</tool_response>";
            if (i + 1 == messages.size() || messages[i + 1].role != "tool") *out += "<|im_end|>\n";
        }
    }
    if (add_generation_prompt) *out += "<|im_start|>assistant\n";
    return Status::Ok();
}

}  // namespace specula
