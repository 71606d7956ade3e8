// libFuzzer target: arbitrary bytes as specula-server's request bodies and transcription fields,
// and as generated text through the stop strings. Any crash, sanitizer report or exception is
// a bug; an accepted request is within the limits, and the text released while streaming is
// exactly the text kept, valid UTF-8, never holding a stop string.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "openai.h"

using namespace specula::server;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string bytes(reinterpret_cast<const char*>(data), size);
    Limits limits;
    limits.max_tokens = 100;
    for (bool chat : {true, false}) {
        ApiError error;
        const auto r = parse_text_request(bytes, chat, limits, &error);
        if (!r) {
            if (error.status != 400 || error.message.empty()) std::abort();
            (void)error.body().dump();
            continue;
        }
        if (r->max_tokens > limits.max_tokens || r->stop.size() > limits.max_stop) std::abort();
        if (chat == r->messages.empty()) std::abort();
    }
    // The bytes as a stop string (their first 3) and generated text (the rest, in pieces of
    // varied length).
    const size_t k = std::min<size_t>(3, size);
    StopText stop({bytes.substr(0, k)});
    std::string sent;
    for (size_t i = k, n = 1; i < size; i += n, n = n % 5 + 1) {
        const bool stopped = stop.add(bytes.substr(i, n));
        sent += stop.release();
        if (stopped) break;
    }
    sent += stop.finish();
    if (sent != valid_utf8(stop.text())) std::abort();
    if (sent != valid_utf8(sent)) std::abort();
    if (k > 0 && stop.text().find(bytes.substr(0, k)) != std::string::npos) std::abort();
    ApiError error;
    (void)parse_transcription_fields({{"response_format", bytes}, {"temperature", bytes}}, &error);
    std::string content_type;
    (void)format_transcript({{0, 1000, bytes}}, "verbose_json", "en", 1.0, &content_type);
    return 0;
}
