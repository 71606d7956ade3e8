// specula-server's OpenAI layer alone (examples/specula-server/openai.h): requests read and
// refused as OpenAI's API does, stop strings and UTF-8 held back while streaming, transcripts
// in each response format. The server itself is driven by OpenAI's client in
// tests/server/openai_client.mjs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "openai.h"

namespace specula::server {
namespace {

std::optional<TextRequest> parse(const std::string& body, bool chat = true,
                                 ApiError* error = nullptr) {
    ApiError ignored;
    Limits limits;
    limits.max_tokens = 100;
    return parse_text_request(body, chat, limits, error ? error : &ignored);
}

TEST(ServerRequests, ReadsWhatOpenAIsClientsSend) {
    const auto r = parse(R"({"model":"x","messages":[{"role":"system","content":"Be brief."},
        {"role":"user","content":[{"type":"text","text":"Hi "},{"type":"text","text":"there"}]},
        {"role":"assistant","content":null}],"stream":true,"stream_options":{"include_usage":true},
        "max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":4,"seed":-3,"stop":["\n\n","END"],
        "presence_penalty":0,"logprobs":false,"user":"someone","n":1})");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->messages.size(), 3u);
    EXPECT_EQ(r->messages[1].content, "Hi there");
    EXPECT_EQ(r->messages[2].content, "");
    EXPECT_TRUE(r->stream && r->include_usage);
    EXPECT_EQ(r->max_tokens, 7);
    EXPECT_FLOAT_EQ(r->temperature, 0.5f);
    EXPECT_FLOAT_EQ(r->top_p, 0.9f);
    EXPECT_EQ(r->top_k, 4);
    EXPECT_TRUE(r->seeded);
    EXPECT_EQ(r->seed, uint64_t(-3));
    EXPECT_EQ(r->stop, (std::vector<std::string>{"\n\n", "END"}));
    const auto c =
        parse(R"({"prompt":["Once"],"echo":true,"stop":"x","max_completion_tokens":3})", false);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->prompt, "Once");
    EXPECT_TRUE(c->echo);
    EXPECT_EQ(c->stop, std::vector<std::string>{"x"});
    EXPECT_EQ(c->max_tokens, 3);
    const auto defaults = parse(R"({"prompt":"a"})", false);
    ASSERT_TRUE(defaults);
    EXPECT_EQ(defaults->max_tokens, -1);
    EXPECT_FLOAT_EQ(defaults->temperature, 1.0f);  // OpenAI's default
    EXPECT_FALSE(defaults->seeded);
}

TEST(ServerRequests, RefusesWhatIsMalformedNamingTheField) {
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"", ""},
        {"[1,2]", ""},
        {R"({"messages":[]})", "messages"},
        {R"({"messages":[{"content":"x"}]})", "messages"},
        {R"({"messages":[{"role":"tool","content":"x"}]})", "messages"},
        {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages"},
        {R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "temperature"},
        {R"({"messages":[{"role":"user","content":"x"}],"temperature":2.5})", "temperature"},
        {R"({"messages":[{"role":"user","content":"x"}],"top_p":0})", "top_p"},
        {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":101})", "max_tokens"},
        {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1.5})", "max_tokens"},
        {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", "max_tokens"},
        {R"({"messages":[{"role":"user","content":"x"}],"n":2})", "n"},
        {R"({"messages":[{"role":"user","content":"x"}],"seed":18446744073709551615})", "seed"},
        {R"({"messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]})", "stop"},
        {R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})", "stop"},
        {R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})", "stream"},
        {R"({"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":1}})",
         "include_usage"},
        {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})", "logprobs"},
        {R"({"messages":[{"role":"user","content":"x"}],"frequency_penalty":1})",
         "frequency_penalty"},
        {R"({"messages":[{"role":"user","content":"x"}],"model":3})", "model"},
    };
    for (const auto& [body, field] : bad) {
        ApiError error;
        EXPECT_FALSE(parse(body, true, &error)) << body;
        EXPECT_EQ(error.status, 400) << body;
        EXPECT_EQ(error.param, field) << body;
        const Json j = error.body();
        EXPECT_EQ(j["error"]["message"], error.message);
        EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    }
    ApiError error;
    EXPECT_FALSE(parse(R"({"prompt":[1,2,3]})", false, &error));
    EXPECT_EQ(error.param, "prompt");
}

// Streams `pieces` through a StopText: what the client receives, chunk by chunk.
std::vector<std::string> stream(const std::vector<std::string>& stop,
                                const std::vector<std::string>& pieces, std::string* all) {
    StopText text(stop);
    std::vector<std::string> sent;
    for (const std::string& p : pieces) {
        const bool stopped = text.add(p);
        sent.push_back(text.release());
        if (stopped) break;
    }
    sent.push_back(text.finish());
    *all = "";
    for (const auto& s : sent)
        *all += s;
    EXPECT_EQ(*all, valid_utf8(text.text()));
    return sent;
}

TEST(ServerStopText, CutsAtTheFirstStopAndNeverSendsPartOfOne) {
    std::string all;
    // A stop string split across tokens: its start is held back, then dropped.
    auto sent = stream({"END"}, {"abc E", "N", "D more"}, &all);
    EXPECT_EQ(all, "abc ");
    EXPECT_EQ(sent[0], "abc ");
    EXPECT_EQ(sent[1], "");
    // A start that turns out not to be one is sent once it is not.
    sent = stream({"END"}, {"x E", "Nx", " y"}, &all);
    EXPECT_EQ(all, "x ENx y");
    EXPECT_EQ(sent[0], "x ");
    EXPECT_EQ(sent[1], "ENx");
    // The earliest of several stops wins; a stop inside one piece.
    stream({"\n\n", "b"}, {"aa\n\nbb"}, &all);
    EXPECT_EQ(all, "aa");
    stream({"\n\n", "b"}, {"ab\n\n"}, &all);
    EXPECT_EQ(all, "a");
    // Held text that never became a stop is sent at the end.
    stream({"END"}, {"x EN"}, &all);
    EXPECT_EQ(all, "x EN");
}

TEST(ServerStopText, HoldsBackAnUnfinishedCharacter) {
    std::string all;
    const std::string euro = "\xE2\x82\xAC";  // U+20AC in three bytes, one per token
    auto sent =
        stream({}, {"a", euro.substr(0, 1), euro.substr(1, 1), euro.substr(2, 1), "b"}, &all);
    EXPECT_EQ(sent[0], "a");
    EXPECT_EQ(sent[1], "");
    EXPECT_EQ(sent[2], "");
    EXPECT_EQ(sent[3], euro);
    EXPECT_EQ(all, "a" + euro + "b");
    // Bytes that never make a character are replaced, not sent as invalid JSON text.
    stream({}, {"a\xFF", "b"}, &all);
    EXPECT_EQ(all,
              "a\xEF\xBF\xBD"
              "b");
    // A stop string that begins with continuation bytes never splits a character of the text
    // (found by the fuzzer).
    sent = stream({"\x98\x98{"}, {"\xF0\x98\x98\x98", "\x98\x98", "{"}, &all);
    EXPECT_EQ(all, "\xF0\x98\x98\x98");
    EXPECT_EQ(sent[0], "");
    EXPECT_EQ(unfinished_utf8("ab\xE2\x82"), 2u);
    EXPECT_EQ(unfinished_utf8("ab" + euro), 0u);
    EXPECT_EQ(valid_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong '/'
    EXPECT_EQ(valid_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
}

TEST(ServerTranscripts, EveryResponseFormat) {
    const std::vector<Segment> segments = {{0, 2500, " Hello there."}, {2500, 3723456, " Bye."}};
    std::string type;
    EXPECT_EQ(format_transcript(segments, "json", "en", 4.0, &type),
              R"({"text":"Hello there. Bye."})");
    EXPECT_EQ(type, "application/json");
    EXPECT_EQ(format_transcript(segments, "text", "en", 4.0, &type), "Hello there. Bye.\n");
    EXPECT_EQ(format_transcript(segments, "srt", "en", 4.0, &type),
              "1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n"
              "2\n00:00:02,500 --> 01:02:03,456\nBye.\n\n");
    EXPECT_EQ(format_transcript(segments, "vtt", "en", 4.0, &type),
              "WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello there.\n\n"
              "00:00:02.500 --> 01:02:03.456\nBye.\n\n");
    const Json verbose = Json::parse(format_transcript(segments, "verbose_json", "en", 4.0, &type));
    EXPECT_EQ(verbose["language"], "en");
    EXPECT_EQ(verbose["segments"][1]["start"], 2.5);
    EXPECT_EQ(verbose["segments"][1]["text"], " Bye.");

    ApiError error;
    EXPECT_TRUE(
        parse_transcription_fields({{"response_format", "srt"}, {"language", "de"}}, &error));
    for (const auto& field :
         std::vector<std::pair<std::string, std::string>>{{"response_format", "xml"},
                                                          {"language", "EN"},
                                                          {"temperature", "2"},
                                                          {"temperature", "0.5x"}}) {
        EXPECT_FALSE(parse_transcription_fields({field}, &error)) << field.first;
        EXPECT_EQ(error.param, field.first);
    }
}

TEST(ServerResponses, OpenAIsShapes) {
    TextRequest chat;
    chat.chat = true;
    Usage usage;
    usage.prompt_tokens = 5;
    usage.completion_tokens = 8;
    usage.evaluated = 8;
    usage.accepted = 6;
    usage.steps = 3;
    const Json r = completion_response(chat, "id", "m", 1, "hi", "stop", usage);
    EXPECT_EQ(r["object"], "chat.completion");
    EXPECT_EQ(r["choices"][0]["message"]["content"], "hi");
    EXPECT_EQ(r["usage"]["total_tokens"], 13);
    EXPECT_DOUBLE_EQ(r["usage"]["speculation"]["acceptance_rate"].get<double>(), 0.75);
    const Json first = completion_chunk(chat, "id", "m", 1, "", "", true);
    EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
    EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
    TextRequest plain;
    const Json last = completion_chunk(plain, "id", "m", 1, "", "length", false);
    EXPECT_EQ(last["object"], "text_completion");
    EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
}

}  // namespace
}  // namespace specula::server
