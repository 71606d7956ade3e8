#include "openai.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>

namespace specula::server {

Json ApiError::body() const {
    Json e = {{"message", message}, {"type", type}, {"code", nullptr}};
    e["param"] = param.empty() ? Json(nullptr) : Json(param);
    return Json{{"error", e}};
}

namespace {

// Reads optional fields of an object, each checked for its type and range; the first problem
// is kept (later reads do nothing) so that a request's first error is the one reported.
class Fields {
  public:
    Fields(const Json& object, ApiError* error) : object_(object), error_(error) {}
    bool ok() const { return ok_; }
    const Json* get(const char* name) const {
        const auto it = object_.find(name);
        return it == object_.end() || it->is_null() ? nullptr : &*it;
    }
    void fail(const char* name, const std::string& message) {
        if (!ok_) return;
        ok_ = false;
        *error_ = ApiError{400, message, "invalid_request_error", name};
    }
    void boolean(const char* name, bool* out) {
        const Json* v = get(name);
        if (v == nullptr || !ok_) return;
        if (!v->is_boolean()) return fail(name, std::string("'") + name + "' must be a boolean");
        *out = v->get<bool>();
    }
    void number(const char* name, double lo, double hi, float* out) {
        const Json* v = get(name);
        if (v == nullptr || !ok_) return;
        if (!v->is_number()) return fail(name, std::string("'") + name + "' must be a number");
        const double x = v->get<double>();
        if (!(x >= lo && x <= hi))
            return fail(
                name, std::string("'") + name + "' must lie in [" + fmt(lo) + ", " + fmt(hi) + "]");
        *out = float(x);
    }
    void integer(const char* name, int64_t lo, int64_t hi, int64_t* out) {
        const Json* v = get(name);
        if (v == nullptr || !ok_) return;
        if (!v->is_number_integer())
            return fail(name, std::string("'") + name + "' must be an integer");
        // Unsigned values beyond int64 are read as such, never wrapped.
        if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))
            return fail(name, std::string("'") + name + "' is out of range");
        const int64_t x = v->get<int64_t>();
        if (x < lo || x > hi)
            return fail(name, std::string("'") + name + "' must lie in [" + std::to_string(lo) +
                                  ", " + std::to_string(hi) + "]");
        *out = x;
    }

  private:
    static std::string fmt(double x) {
        char b[32];
        std::snprintf(b, sizeof b, "%g", x);
        return b;
    }
    const Json& object_;
    ApiError* error_;
    bool ok_ = true;
};

// A message's content: a string, or OpenAI's array of parts of which only text is read.
bool message_content(const Json& content, std::string* out) {
    if (content.is_string()) {
        *out = content.get<std::string>();
        return true;
    }
    if (!content.is_array()) return false;
    out->clear();
    for (const Json& part : content) {
        if (!part.is_object()) return false;
        const auto type = part.find("type");
        const auto text = part.find("text");
        if (type == part.end() || *type != "text" || text == part.end() || !text->is_string())
            return false;
        *out += text->get<std::string>();
    }
    return true;
}

}  // namespace

std::optional<TextRequest> parse_text_request(std::string_view body, bool chat,
                                              const Limits& limits, ApiError* error) {
    const Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
        *error = ApiError{400, "the body must be a JSON object"};
        return std::nullopt;
    }
    TextRequest r;
    r.chat = chat;
    Fields f(j, error);
    if (const Json* model = f.get("model"); model != nullptr && !model->is_string())
        f.fail("model", "'model' must be a string");
    if (chat) {
        const Json* messages = f.get("messages");
        if (messages == nullptr || !messages->is_array() || messages->empty()) {
            f.fail("messages", "'messages' must be a non-empty array");
        } else {
            for (const Json& m : *messages) {
                ChatMessage message;
                const auto role = m.is_object() ? m.find("role") : m.end();
                if (!m.is_object() || role == m.end() || !role->is_string()) {
                    f.fail("messages", "each message needs a 'role' string");
                    break;
                }
                message.role = role->get<std::string>();
                if (message.role == "developer") message.role = "system";  // OpenAI's new name
                if (message.role != "system" && message.role != "user" &&
                    message.role != "assistant") {
                    f.fail("messages", "unsupported role '" + message.role + "'");
                    break;
                }
                const auto content = m.find("content");
                if (content != m.end() && !content->is_null() &&
                    !message_content(*content, &message.content)) {
                    f.fail("messages", "a message's 'content' must be a string or text parts");
                    break;
                }
                r.messages.push_back(std::move(message));
            }
        }
    } else {
        const Json* prompt = f.get("prompt");
        if (prompt != nullptr && prompt->is_array() && prompt->size() == 1 &&
            (*prompt)[0].is_string())
            prompt = &(*prompt)[0];
        if (prompt == nullptr || !prompt->is_string())
            f.fail("prompt", "'prompt' must be a string (or an array of one string)");
        else
            r.prompt = prompt->get<std::string>();
        f.boolean("echo", &r.echo);
    }
    f.boolean("stream", &r.stream);
    if (const Json* options = f.get("stream_options"); options != nullptr && f.ok()) {
        if (!options->is_object()) {
            f.fail("stream_options", "'stream_options' must be an object");
        } else {
            Fields o(*options, error);
            o.boolean("include_usage", &r.include_usage);
            if (!o.ok()) return std::nullopt;
        }
    }
    int64_t max_tokens = -1;
    f.integer("max_tokens", 1, limits.max_tokens, &max_tokens);
    f.integer("max_completion_tokens", 1, limits.max_tokens, &max_tokens);
    r.max_tokens = int32_t(max_tokens);
    f.number("temperature", 0.0, 2.0, &r.temperature);
    f.number("top_p", 0.0, 1.0, &r.top_p);
    if (f.ok() && r.top_p <= 0.0f) f.fail("top_p", "'top_p' must be above 0");
    int64_t top_k = 0, n = 1, seed = 0;
    f.integer("top_k", 0, INT32_MAX, &top_k);
    r.top_k = int32_t(top_k);
    f.integer("n", 1, 1, &n);
    if (f.get("seed") != nullptr) {
        f.integer("seed", INT64_MIN, INT64_MAX, &seed);
        r.seed = uint64_t(seed);
        r.seeded = true;
    }
    if (const Json* stop = f.get("stop"); stop != nullptr && f.ok()) {
        if (stop->is_string()) {
            r.stop.push_back(stop->get<std::string>());
        } else if (stop->is_array() && stop->size() <= limits.max_stop &&
                   std::all_of(stop->begin(), stop->end(),
                               [](const Json& s) { return s.is_string(); })) {
            for (const Json& s : *stop)
                r.stop.push_back(s.get<std::string>());
        } else {
            f.fail("stop", "'stop' must be a string or an array of at most " +
                               std::to_string(limits.max_stop) + " strings");
        }
        r.stop.erase(std::remove(r.stop.begin(), r.stop.end(), std::string()), r.stop.end());
    }
    // What specula does not compute is refused rather than silently ignored.
    for (const char* name : {"presence_penalty", "frequency_penalty"}) {
        float penalty = 0.0f;
        f.number(name, -2.0, 2.0, &penalty);
        if (f.ok() && penalty != 0.0f) f.fail(name, std::string("'") + name + "' is not supported");
    }
    for (const char* name : {"logprobs", "top_logprobs", "logit_bias", "tools", "functions"}) {
        const Json* v = f.get(name);
        const bool off = v == nullptr || (v->is_boolean() && !v->get<bool>());
        if (!off) f.fail(name, std::string("'") + name + "' is not supported");
    }
    if (!f.ok()) return std::nullopt;
    return r;
}

std::optional<TranscriptionRequest> parse_transcription_fields(
    const std::vector<std::pair<std::string, std::string>>& fields, ApiError* error) {
    TranscriptionRequest r;
    for (const auto& [name, value] : fields) {
        if (name == "response_format") {
            if (value != "json" && value != "text" && value != "srt" && value != "vtt" &&
                value != "verbose_json") {
                *error = ApiError{400,
                                  "'response_format' must be json, text, srt, vtt or "
                                  "verbose_json",
                                  "invalid_request_error", name};
                return std::nullopt;
            }
            r.response_format = value;
        } else if (name == "language") {
            const bool letters = !value.empty() && value.size() <= 7 &&
                                 std::all_of(value.begin(), value.end(),
                                             [](char c) { return c >= 'a' && c <= 'z'; });
            if (!letters) {
                *error = ApiError{400, "'language' must be a language code such as \"en\"",
                                  "invalid_request_error", name};
                return std::nullopt;
            }
            r.language = value;
        } else if (name == "temperature") {
            char* end = nullptr;
            const double t = std::strtod(value.c_str(), &end);
            if (value.empty() || end != value.c_str() + value.size() || !(t >= 0.0 && t <= 1.0)) {
                *error = ApiError{400, "'temperature' must be a number in [0, 1]",
                                  "invalid_request_error", name};
                return std::nullopt;
            }
            r.temperature = float(t);
        }
    }
    return r;
}

namespace {

std::string joined_text(const std::vector<Segment>& segments) {
    std::string text;
    for (const Segment& s : segments)
        text += s.text;
    const size_t begin = text.find_first_not_of(" \t\n");
    if (begin == std::string::npos) return "";
    return text.substr(begin, text.find_last_not_of(" \t\n") - begin + 1);
}

std::string timestamp(int64_t ms, char separator) {
    char b[32];
    ms = std::max<int64_t>(ms, 0);
    std::snprintf(b, sizeof b, "%02" PRId64 ":%02" PRId64 ":%02" PRId64 "%c%03" PRId64,
                  ms / 3600000, ms / 60000 % 60, ms / 1000 % 60, separator, ms % 1000);
    return b;
}

std::string trimmed(const std::string& s) {
    const size_t begin = s.find_first_not_of(' ');
    return begin == std::string::npos ? "" : s.substr(begin);
}

}  // namespace

std::string format_transcript(const std::vector<Segment>& segments, const std::string& format,
                              const std::string& language, double duration_seconds,
                              std::string* content_type) {
    *content_type = "application/json";
    if (format == "text") {
        *content_type = "text/plain; charset=utf-8";
        return valid_utf8(joined_text(segments)) + "\n";
    }
    if (format == "srt" || format == "vtt") {
        *content_type = format == "srt" ? "application/x-subrip" : "text/vtt";
        std::string out = format == "vtt" ? "WEBVTT\n\n" : "";
        const char separator = format == "srt" ? ',' : '.';
        for (size_t i = 0; i < segments.size(); ++i) {
            if (format == "srt") out += std::to_string(i + 1) + "\n";
            out += timestamp(segments[i].t0_ms, separator) + " --> " +
                   timestamp(segments[i].t1_ms, separator) + "\n" +
                   valid_utf8(trimmed(segments[i].text)) + "\n\n";
        }
        return out;
    }
    Json j = {{"text", valid_utf8(joined_text(segments))}};
    if (format == "verbose_json") {
        j["task"] = "transcribe";
        j["language"] = language;
        j["duration"] = duration_seconds;
        Json list = Json::array();
        for (size_t i = 0; i < segments.size(); ++i)
            list.push_back({{"id", i},
                            {"start", double(segments[i].t0_ms) / 1000.0},
                            {"end", double(segments[i].t1_ms) / 1000.0},
                            {"text", valid_utf8(segments[i].text)}});
        j["segments"] = list;
    }
    return j.dump();
}

size_t unfinished_utf8(std::string_view s) {
    for (size_t back = 1; back <= std::min<size_t>(4, s.size()); ++back) {
        const auto c = static_cast<unsigned char>(s[s.size() - back]);
        if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

std::string valid_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = n > 0 && i + n <= s.size();
        for (size_t k = 1; ok && k < n; ++k)
            ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
        if (ok && n > 1) {  // no overlong forms, surrogates or values past U+10FFFF
            uint32_t cp = c & (0xFF >> (n + 1));
            for (size_t k = 1; k < n; ++k)
                cp = cp << 6 | (static_cast<unsigned char>(s[i + k]) & 0x3F);
            const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
            ok = cp >= least[n] && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
        }
        if (ok) {
            out.append(s.substr(i, n));
            i += n;
        } else {
            out += "\xEF\xBF\xBD";
            ++i;
        }
    }
    return out;
}

StopText::StopText(std::vector<std::string> stop) : stop_(std::move(stop)) {
    stop_.erase(std::remove(stop_.begin(), stop_.end(), std::string()), stop_.end());
}

bool StopText::add(std::string_view piece) {
    if (stopped_) return true;
    const size_t old = text_.size();
    text_.append(piece);
    size_t cut = std::string::npos;
    for (const std::string& s : stop_) {
        const size_t from = old >= s.size() ? old - s.size() + 1 : 0;
        const size_t at = text_.find(s, std::max(from, sent_));
        cut = std::min(cut, at);
    }
    if (cut != std::string::npos) {
        text_.resize(cut);
        stopped_ = true;
    }
    return stopped_;
}

std::string StopText::release() {
    size_t hold = unfinished_utf8(text_);
    if (!stopped_) {
        for (const std::string& s : stop_) {
            for (size_t k = std::min(s.size() - 1, text_.size()); k > hold; --k)
                if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
                    hold = k;
                    break;
                }
        }
    }
    size_t end = std::max(sent_, text_.size() - std::min(hold, text_.size()));
    // Never inside a character (a stop string may begin with a continuation byte): a character
    // spans `end` if its lead byte, at most 3 bytes back, declares more bytes than lie before
    // `end`.
    if (end > sent_ && end < text_.size()) {
        size_t lead = end;
        while (lead > sent_ && end - lead < 4 &&
               (static_cast<unsigned char>(text_[lead - 1]) & 0xC0) == 0x80)
            --lead;
        if (lead > sent_ && end - lead < 4) {
            --lead;  // the byte before the continuation bytes
            const size_t have = end - lead;
            if (have < 4 && unfinished_utf8(std::string_view(text_).substr(lead, have)) == have)
                end = lead;
        }
    }
    std::string out = valid_utf8(std::string_view(text_).substr(sent_, end - sent_));
    sent_ = end;
    return out;
}

std::string StopText::finish() {
    std::string out = valid_utf8(std::string_view(text_).substr(sent_));
    sent_ = text_.size();
    return out;
}

Json Usage::json() const {
    Json speculation = {{"drafted", drafted},
                        {"evaluated", evaluated},
                        {"accepted", accepted},
                        {"target_forwards", steps}};
    speculation["acceptance_rate"] =
        evaluated > 0 ? Json(double(accepted) / double(evaluated)) : Json(nullptr);
    speculation["tokens_per_target_forward"] =
        steps > 0 ? Json(double(completion_tokens) / double(steps)) : Json(nullptr);
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens},
            {"speculation", speculation}};
}

Json completion_response(const TextRequest& request, const std::string& id,
                         const std::string& model, int64_t created, const std::string& text,
                         const std::string& finish, const Usage& usage) {
    Json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
    if (request.chat)
        choice["message"] = {{"role", "assistant"}, {"content", text}};
    else
        choice["text"] = text;
    return {{"id", id},
            {"object", request.chat ? "chat.completion" : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", Json::array({choice})},
            {"usage", usage.json()}};
}

Json completion_chunk(const TextRequest& request, const std::string& id, const std::string& model,
                      int64_t created, const std::string& text, const std::string& finish,
                      bool first) {
    Json choice = {{"index", 0}, {"logprobs", nullptr}};
    choice["finish_reason"] = finish.empty() ? Json(nullptr) : Json(finish);
    if (request.chat) {
        Json delta = Json::object();
        if (first) delta["role"] = "assistant";
        if (!text.empty() || first) delta["content"] = text;
        choice["delta"] = delta;
    } else {
        choice["text"] = text;
    }
    return {{"id", id},
            {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", Json::array({choice})}};
}

}  // namespace specula::server
