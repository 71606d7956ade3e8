// Live transcription (lib/asr/stream.h through the C API) with the bundled speech pair, and the
// audio formats people have (FLAC, Ogg Vorbis and Opus, MP3) transcribed from files: the
// bundled clip between silences is one utterance whose final text is the clip's own batch
// transcript (but for a word or two), no committed text ever changes, a draft changes no event,
// silence costs no decoding, and every bad push or parameter is a status. A forced transcript
// prefix (what the stream forces with its committed tokens) begins the window's tokens.
#include <gtest/gtest.h>
#include <sndfile.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "asr/transcribe.h"
#include "backend_util.h"
#include "platform/mapped_file.h"
#include "specula.h"
#include "word_error.h"

using namespace specula;

namespace {

const std::string kModels = SPECULA_MODELS_DIR;
const std::string kTarget = kModels + "/specula-whisper-target.bin";
const std::string kDraft = kModels + "/specula-whisper-draft.bin";
const std::string kClip = kModels + "/../audio/held-out-sentence.wav";

std::vector<float> clip() {
    float* x = nullptr;
    size_t n = 0;
    int32_t rate = 0;
    EXPECT_EQ(specula_audio_load(kClip.c_str(), &x, &n, &rate), SPECULA_OK);
    EXPECT_EQ(rate, 16000);
    std::vector<float> out(x, x + n);
    specula_audio_free(x);
    return out;
}

// seconds of silence, the clip, and so on: {2.0, -1, 1.5, -1, 1.0} (-1 is the clip).
std::vector<float> scene(std::initializer_list<double> parts) {
    const std::vector<float> c = clip();
    std::vector<float> out;
    for (double p : parts)
        if (p < 0)
            out.insert(out.end(), c.begin(), c.end());
        else
            out.resize(out.size() + size_t(p * 16000), 0.0f);
    return out;
}

struct Event {
    bool final;
    int64_t t0, t1;
    std::string text;
    size_t stable;
    bool operator==(const Event&) const = default;
};

void collect(const specula_asr_stream_event* e, void* user) {
    static_cast<std::vector<Event>*>(user)->push_back(
        {e->is_final, e->t0_ms, e->t1_ms, e->text, e->stable_bytes});
}

struct Pair {
    specula_backend* backend = nullptr;
    specula_asr_model *target = nullptr, *draft = nullptr;
    specula_asr_context* ctx = nullptr;
    Pair() {
        specula_backend_params bp = specula_backend_default_params();
        bp.kind = SPECULA_BACKEND_CPU;
        EXPECT_EQ(specula_backend_create(&bp, &backend), SPECULA_OK);
        EXPECT_EQ(specula_asr_model_load(backend, kTarget.c_str(), nullptr, &target), SPECULA_OK);
        EXPECT_EQ(specula_asr_model_load(backend, kDraft.c_str(), nullptr, &draft), SPECULA_OK);
        EXPECT_EQ(specula_asr_context_create(target, &ctx), SPECULA_OK);
    }
    ~Pair() {
        specula_asr_context_free(ctx);
        specula_asr_model_free(draft);
        specula_asr_model_free(target);
        specula_backend_free(backend);
    }
    // The events of `audio` pushed in `piece`-sample pushes at `rate` Hz.
    std::vector<Event> stream(const std::vector<float>& audio, specula_asr_model* with,
                              size_t piece = 320, int rate = 16000, int max_utterance_ms = 0) {
        std::vector<Event> events;
        specula_asr_stream_params p = specula_asr_stream_default_params();
        if (max_utterance_ms > 0) p.max_utterance_ms = max_utterance_ms;
        p.asr.draft = with;
        p.on_event = collect;
        p.event_user_data = &events;
        specula_asr_stream* s = nullptr;
        EXPECT_EQ(specula_asr_stream_create(ctx, &p, &s), SPECULA_OK) << specula_last_error();
        for (size_t at = 0; at < audio.size(); at += piece)
            EXPECT_EQ(specula_asr_stream_push(s, audio.data() + at,
                                              std::min(piece, audio.size() - at), rate),
                      SPECULA_OK)
                << specula_last_error();
        EXPECT_EQ(specula_asr_stream_finish(s), SPECULA_OK) << specula_last_error();
        specula_asr_stream_free(s);
        return events;
    }
    std::string batch(const std::vector<float>& audio) {
        specula_asr_params p = specula_asr_default_params();
        EXPECT_EQ(specula_asr_transcribe(ctx, audio.data(), audio.size(), &p), SPECULA_OK);
        std::string text;
        for (size_t i = 0; i < specula_asr_segment_count(ctx); ++i) {
            specula_asr_segment seg;
            EXPECT_EQ(specula_asr_get_segment(ctx, i, &seg), SPECULA_OK);
            text += seg.text;
        }
        return text;
    }
};

std::string finals(const std::vector<Event>& events) {
    std::string text;
    for (const Event& e : events)
        if (e.final) text += e.text;
    return text;
}

// Every committed text (the finals before a partial, then its stable bytes) begins the finals.
void expect_commitments_kept(const std::vector<Event>& events) {
    const std::string all = finals(events);
    std::string before;
    for (const Event& e : events) {
        if (e.final) {
            before += e.text;
            continue;
        }
        ASSERT_LE(e.stable, e.text.size());
        const std::string committed = before + e.text.substr(0, e.stable);
        EXPECT_EQ(all.compare(0, committed.size(), committed), 0)
            << "committed \"" << committed << "\", final \"" << all << "\"";
    }
}

}  // namespace

TEST(Stream, EachUtteranceBetweenSilencesHearsTheClipsWords) {
    Pair pair;
    const std::string alone = pair.batch(clip());
    ASSERT_FALSE(alone.empty());
    const std::vector<Event> events = pair.stream(scene({2.0, -1, 1.5, -1, 1.0}), nullptr);
    std::vector<Event> final_events;
    size_t partials = 0, committed = 0;
    for (const Event& e : events) {
        if (e.final) final_events.push_back(e);
        partials += !e.final;
        committed += !e.final && e.stable > 0;
    }
    // Two utterances of 3.7 s: partials every second, some of them with committed words.
    EXPECT_GE(partials, 4u);
    EXPECT_GE(committed, 1u);
    ASSERT_GE(final_events.size(), 2u);
    // The first utterance's finals lie in the first clip, the last one's in the second.
    const int64_t clip_ms = int64_t(clip().size()) / 16;
    EXPECT_GE(final_events.front().t0, 2000 - 400);
    EXPECT_LE(final_events.front().t1, 2000 + clip_ms + 700);
    EXPECT_GE(final_events.back().t0, 3500 + clip_ms - 400);
    std::string first, second;
    for (const Event& e : final_events)
        (e.t0 < 3500 + clip_ms - 400 ? first : second) += e.text;
    // The bundled model is small and hears a cut a few milliseconds earlier or later a little
    // differently ("Then instances of the bytes are immutable just as strings are."): a few
    // words of ten may differ from the clip transcribed alone.
    EXPECT_LE(word_edits(transcript_words(alone), transcript_words(first)), 3u) << first;
    EXPECT_LE(word_edits(transcript_words(alone), transcript_words(second)), 3u) << second;
    expect_commitments_kept(events);
}

TEST(Stream, CommittedTextIsKeptThroughALongUtterance) {
    Pair pair;
    // The clip three times without a pause: one 11 s utterance, committed as it grows.
    const std::vector<Event> events = pair.stream(scene({0.5, -1, -1, -1, 1.0}), nullptr);
    size_t committed = 0;
    for (const Event& e : events)
        committed += !e.final && e.stable > 0;
    EXPECT_GE(committed, 5u);
    expect_commitments_kept(events);
}

TEST(Stream, AnUtteranceTooLongIsCutAtASegmentsEnd) {
    Pair pair;
    // 11 s without a pause, at most 5 s an utterance: finished segments become final as it goes
    // (at least two cuts), the unfinished one goes on with its committed words.
    const std::vector<Event> events =
        pair.stream(scene({0.5, -1, -1, -1, 1.0}), nullptr, 320, 16000, 5000);
    std::vector<Event> final_events;
    size_t first_final = events.size(), last_partial = 0;
    for (size_t i = 0; i < events.size(); ++i) {
        if (events[i].final) final_events.push_back(events[i]);
        if (events[i].final) first_final = std::min(first_final, i);
        if (!events[i].final) last_partial = i;
    }
    ASSERT_GE(final_events.size(), 3u);
    EXPECT_LT(first_final, last_partial) << "no segment became final before the utterance ended";
    for (size_t i = 1; i < final_events.size(); ++i) {
        EXPECT_GE(final_events[i].t0, final_events[i - 1].t0);
        EXPECT_LE(final_events[i].t0, final_events[i].t1);
    }
    EXPECT_GE(final_events.back().t1, 9000);  // the text reaches the last clip
    expect_commitments_kept(events);
}

TEST(Stream, ADraftChangesNoEvent) {
    Pair pair;
    const std::vector<float> audio = scene({1.0, -1, 0.8, -1, 0.5});
    const std::vector<Event> alone = pair.stream(audio, nullptr);
    const std::vector<Event> paired = pair.stream(audio, pair.draft);
    ASSERT_FALSE(alone.empty());
    EXPECT_EQ(paired, alone);
}

TEST(Stream, AnyRateAndPieceSizeHearsTheSameWords) {
    Pair pair;
    const std::vector<float> audio = scene({1.0, -1, 1.0});
    const std::string at16k = finals(pair.stream(audio, nullptr, 320));
    // Odd pieces at 16 kHz are the same stream: frames are cut from the samples, not the pushes.
    EXPECT_EQ(finals(pair.stream(audio, nullptr, 97)), at16k);
    // 44.1 kHz, resampled as it comes.
    std::vector<float> at44k;
    const size_t n = size_t(double(audio.size()) * 44100.0 / 16000.0);
    at44k.resize(n);
    for (size_t i = 0; i < n; ++i) {  // linear interpolation is enough to carry the words
        const double x = double(i) * 16000.0 / 44100.0;
        const size_t j = std::min(size_t(x), audio.size() - 2);
        const double f = x - double(j);
        at44k[i] = float((1 - f) * audio[j] + f * audio[j + 1]);
    }
    EXPECT_LE(word_edits(transcript_words(at16k),
                         transcript_words(finals(pair.stream(at44k, nullptr, 441, 44100)))),
              2u);
}

TEST(Stream, Pcm16BytesAreTheirFloats) {
    Pair pair;
    const std::vector<float> audio = scene({0.5, -1, 0.7});
    std::vector<uint8_t> bytes;
    std::vector<float> quantized;
    for (float x : audio) {
        const auto v = int16_t(std::lround(std::clamp(x, -1.0f, 32767.0f / 32768) * 32768));
        bytes.push_back(uint8_t(uint16_t(v) & 0xFF));
        bytes.push_back(uint8_t(uint16_t(v) >> 8));
        quantized.push_back(float(v) / 32768.0f);
    }
    std::vector<Event> from_bytes;
    specula_asr_stream_params p = specula_asr_stream_default_params();
    p.on_event = collect;
    p.event_user_data = &from_bytes;
    specula_asr_stream* s = nullptr;
    ASSERT_EQ(specula_asr_stream_create(pair.ctx, &p, &s), SPECULA_OK);
    for (size_t at = 0; at < bytes.size(); at += 640)
        ASSERT_EQ(specula_asr_stream_push_pcm16(s, bytes.data() + at,
                                                std::min<size_t>(640, bytes.size() - at), 16000),
                  SPECULA_OK);
    ASSERT_EQ(specula_asr_stream_finish(s), SPECULA_OK);
    specula_asr_stream_free(s);
    EXPECT_EQ(from_bytes, pair.stream(quantized, nullptr));
    EXPECT_FALSE(finals(from_bytes).empty());
}

TEST(Stream, AnHourOfSilenceDecodesNothing) {
    Pair pair;
    std::vector<Event> events;
    specula_asr_stream_params p = specula_asr_stream_default_params();
    p.on_event = collect;
    p.event_user_data = &events;
    specula_asr_stream* s = nullptr;
    ASSERT_EQ(specula_asr_stream_create(pair.ctx, &p, &s), SPECULA_OK);
    const std::vector<float> minute(60 * 16000, 0.0f);
    for (int i = 0; i < 60; ++i)
        ASSERT_EQ(specula_asr_stream_push(s, minute.data(), minute.size(), 16000), SPECULA_OK);
    ASSERT_EQ(specula_asr_stream_finish(s), SPECULA_OK);
    specula_asr_timings t{};
    ASSERT_EQ(specula_asr_stream_get_timings(s, &t), SPECULA_OK);
    EXPECT_DOUBLE_EQ(t.audio_seconds, 3600.0);
    EXPECT_EQ(t.windows, 0);
    EXPECT_TRUE(events.empty());
    specula_asr_stream_free(s);
}

TEST(Stream, BadPushesAndParametersAreStatuses) {
    Pair pair;
    specula_asr_stream* s = nullptr;
    EXPECT_EQ(specula_asr_stream_create(nullptr, nullptr, &s), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(specula_asr_stream_create(pair.ctx, nullptr, nullptr), SPECULA_ERR_INVALID_ARGUMENT);
    struct Bad {
        int32_t specula_asr_stream_params::*field;
        int32_t value;
        const char* name;
    };
    for (const Bad& b :
         {Bad{&specula_asr_stream_params::vad_aggressiveness, 4, "aggressiveness"},
          Bad{&specula_asr_stream_params::step_ms, -1, "step_ms"},
          Bad{&specula_asr_stream_params::end_silence_ms, 50, "end_silence_ms"},
          Bad{&specula_asr_stream_params::pre_roll_ms, 5000, "pre_roll_ms"},
          Bad{&specula_asr_stream_params::max_utterance_ms, 29000, "max_utterance_ms"}}) {
        specula_asr_stream_params p = specula_asr_stream_default_params();
        p.*b.field = b.value;
        EXPECT_EQ(specula_asr_stream_create(pair.ctx, &p, &s), SPECULA_ERR_INVALID_ARGUMENT)
            << b.name;
        EXPECT_NE(std::string(specula_last_error()).find(b.name), std::string::npos)
            << specula_last_error();
        EXPECT_EQ(s, nullptr);
    }
    specula_asr_stream_params p = specula_asr_stream_default_params();
    p.asr.language = "xx";
    EXPECT_EQ(specula_asr_stream_create(pair.ctx, &p, &s), SPECULA_ERR_INVALID_ARGUMENT);

    ASSERT_EQ(specula_asr_stream_create(pair.ctx, nullptr, &s), SPECULA_OK);
    // While the stream is open its context transcribes nothing else, nor opens another.
    specula_asr_stream* second = nullptr;
    EXPECT_EQ(specula_asr_stream_create(pair.ctx, nullptr, &second), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(second, nullptr);
    const std::vector<float> c = clip();
    specula_asr_params batch = specula_asr_default_params();
    EXPECT_EQ(specula_asr_transcribe(pair.ctx, c.data(), c.size(), &batch),
              SPECULA_ERR_INVALID_ARGUMENT);
    const uint8_t bytes[3] = {1, 2, 3};
    EXPECT_EQ(specula_asr_stream_push_pcm16(s, bytes, 3, 16000), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(specula_last_error()).find("odd"), std::string::npos);
    EXPECT_EQ(specula_asr_stream_push(s, c.data(), 100, 0), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(specula_asr_stream_push(s, nullptr, 100, 16000), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(specula_asr_stream_push(s, c.data(), 1000, 16000), SPECULA_OK);
    EXPECT_EQ(specula_asr_stream_push(s, c.data(), 1000, 44100), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(specula_last_error()).find("16000 Hz"), std::string::npos);
    // More than ten minutes at once: refused before anything is read.
    EXPECT_EQ(specula_asr_stream_push(s, c.data(), size_t(601) * 16000, 16000),
              SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(specula_asr_stream_push(s, c.data(), c.size(), 16000), SPECULA_OK);
    EXPECT_EQ(specula_asr_stream_finish(s), SPECULA_OK);
    EXPECT_EQ(specula_asr_stream_finish(s), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(specula_asr_stream_push(s, c.data(), 160, 16000), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(specula_last_error()).find("finished"), std::string::npos);
    specula_asr_stream_free(s);
    // Freed, the context transcribes again.
    EXPECT_EQ(specula_asr_transcribe(pair.ctx, c.data(), c.size(), &batch), SPECULA_OK);
    specula_asr_stream_free(nullptr);
    EXPECT_EQ(specula_audio_load(kClip.c_str(), nullptr, nullptr, nullptr),
              SPECULA_ERR_INVALID_ARGUMENT);
}

TEST(AsrFormats, EveryFormatOfTheClipIsTranscribedAsItsWav) {
    Pair pair;
    specula_asr_params p = specula_asr_default_params();
    ASSERT_EQ(specula_asr_transcribe_file(pair.ctx, kClip.c_str(), &p), SPECULA_OK);
    const auto text = [&] {
        std::string t;
        for (size_t i = 0; i < specula_asr_segment_count(pair.ctx); ++i) {
            specula_asr_segment seg;
            EXPECT_EQ(specula_asr_get_segment(pair.ctx, i, &seg), SPECULA_OK);
            t += seg.text;
        }
        return t;
    };
    const std::string wav = text();
    ASSERT_FALSE(wav.empty());
    const std::vector<float> c = clip();
    std::filesystem::create_directories(SPECULA_TEST_TMP_DIR);
    for (auto [format, name] : {std::pair{SF_FORMAT_FLAC | SF_FORMAT_PCM_16, "asr.flac"},
                                {SF_FORMAT_OGG | SF_FORMAT_VORBIS, "asr.ogg"},
                                {SF_FORMAT_OGG | SF_FORMAT_OPUS, "asr.opus"},
                                {SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III, "asr.mp3"}}) {
        const std::string path = std::string(SPECULA_TEST_TMP_DIR) + "/" + name;
        SF_INFO info{};
        info.samplerate = 16000;
        info.channels = 1;
        info.format = format;
        SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
        ASSERT_NE(f, nullptr) << name << ": " << sf_strerror(nullptr);
        sf_writef_float(f, c.data(), sf_count_t(c.size()));
        sf_close(f);
        ASSERT_EQ(specula_asr_transcribe_file(pair.ctx, path.c_str(), &p), SPECULA_OK)
            << name << ": " << specula_last_error();
        EXPECT_EQ(text(), wav) << name;
    }
    // The bundled MP3 beside the WAV (the server test uploads it).
    ASSERT_EQ(specula_asr_transcribe_file(
                  pair.ctx, (kModels + "/../audio/held-out-sentence.mp3").c_str(), &p),
              SPECULA_OK);
    EXPECT_EQ(text(), wav);
    // Bytes that are no audio: a status naming the reason, the context still usable.
    const std::string junk = "not audio at all, just some text";
    EXPECT_EQ(specula_asr_transcribe_memory(pair.ctx, junk.data(), junk.size(), &p),
              SPECULA_ERR_FORMAT);
    EXPECT_NE(std::string(specula_last_error()).find("libsndfile"), std::string::npos);
    EXPECT_EQ(specula_asr_transcribe_file(pair.ctx, kClip.c_str(), &p), SPECULA_OK);
}

// The stream's commitments rest on this: tokens forced after the task begin the window's tokens
// and the model continues after them under Whisper's rules.
TEST(WhisperTranscribe, AForcedPrefixBeginsTheWindowsTokens) {
    std::string why;
    auto backend = test::try_backend(SPECULA_BACKEND_CPU, &why);
    ASSERT_TRUE(backend) << why;
    std::unique_ptr<MappedFile> file;
    ASSERT_TRUE(MappedFile::open(kTarget, &file).ok());
    std::unique_ptr<WhisperModel> model;
    ASSERT_TRUE(WhisperModel::load(*backend, std::move(file), nullptr, &model).ok());
    std::unique_ptr<WhisperContext> ctx;
    ASSERT_TRUE(WhisperContext::create(*model, 1, &ctx).ok());
    const std::vector<float> audio = clip();
    const auto window = [&](std::span<const int32_t> forced) {
        asr::TranscribeParams p;
        p.temperature_increment = 0;
        p.forced = forced;
        std::vector<int32_t> tokens;
        p.on_window = [&](int seek, std::span<const int32_t> t) {
            if (seek == 0) tokens.assign(t.begin(), t.end());
        };
        std::vector<asr::Segment> segments;
        asr::TranscribeStats stats;
        EXPECT_TRUE(asr::transcribe(*ctx, audio, p, &segments, &stats).ok());
        return tokens;
    };
    const std::vector<int32_t> free_run = window({});
    ASSERT_GT(free_run.size(), 4u);
    const WhisperTokens& t = model->tokens();
    ASSERT_TRUE(t.is_timestamp(free_run[0]));
    // Its own first tokens forced: the same tokens.
    EXPECT_EQ(window(std::span(free_run).first(3)), free_run);
    // A word it would not say forced: the window begins with it, then goes on.
    int32_t other = 0;
    for (int32_t id = 0; id < t.eot && other == 0; ++id)
        if (model->token_text(id) == " Python" && id != free_run[1]) other = id;
    ASSERT_NE(other, 0);
    const std::vector<int32_t> forced = {free_run[0], other};
    const std::vector<int32_t> steered = window(forced);
    ASSERT_GT(steered.size(), forced.size());
    EXPECT_TRUE(std::equal(forced.begin(), forced.end(), steered.begin()));
    EXPECT_NE(steered, free_run);
    // Timestamps after the prefix still never go back.
    int32_t last = -1;
    for (int32_t id : steered)
        if (t.is_timestamp(id)) {
            EXPECT_GE(id, last);
            last = id;
        }
    // A forced id that is neither text nor a timestamp is refused.
    asr::TranscribeParams p;
    const int32_t sot[] = {t.sot};
    p.forced = sot;
    std::vector<asr::Segment> segments;
    asr::TranscribeStats stats;
    EXPECT_EQ(asr::transcribe(*ctx, audio, p, &segments, &stats).code(),
              SPECULA_ERR_INVALID_ARGUMENT);
}
