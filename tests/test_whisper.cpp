// Whisper's decoding rules on hand-made logit rows, the transcription loop over audio longer
// than a window on a random model (cpu and vulkan give the same segments), and the speech C API
// on good and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <numeric>

#include "asr/rules.h"
#include "asr/transcribe.h"
#include "backend_util.h"
#include "decode/generator.h"
#include "sampling/sampling.h"
#include "specula.h"
#include "test_util.h"
#include "word_error.h"

using namespace specula;

namespace {

constexpr int kVocabEn = 51864;
const WhisperTokens kEn = WhisperTokens::of(kVocabEn);

std::vector<float> flat_row(float value = 0.0f) {
    return std::vector<float>(size_t(kVocabEn), value);
}

bool masked(const std::vector<float>& row, int32_t id) {
    return std::isinf(row[size_t(id)]) && row[size_t(id)] < 0;
}

int32_t ts(int i) {
    return kEn.timestamp_begin + i;
}

asr::Rules rules(bool timestamps = true) {
    asr::Rules r;
    r.tokens = kEn;
    r.space = 220;
    r.timestamps = timestamps;
    return r;
}

}  // namespace

TEST(WhisperTokens, SpecialTokenIdsOfEachVocabularyLayout) {
    EXPECT_EQ(kEn.eot, 50256);
    EXPECT_EQ(kEn.sot, 50257);
    EXPECT_EQ(kEn.no_timestamps, 50362);
    EXPECT_EQ(kEn.timestamp_begin, 50363);
    EXPECT_FALSE(kEn.multilingual);
    const WhisperTokens m = WhisperTokens::of(51865);  // tiny ... large-v2: 99 languages
    EXPECT_TRUE(m.multilingual);
    EXPECT_EQ(m.eot, 50257);
    EXPECT_EQ(m.sot, 50258);
    EXPECT_EQ(m.language(0), 50259);  // <|en|>
    EXPECT_EQ(m.n_languages, 99);
    EXPECT_EQ(m.translate, 50358);
    EXPECT_EQ(m.transcribe, 50359);
    EXPECT_EQ(m.nosp, 50362);
    EXPECT_EQ(m.no_timestamps, 50363);
    EXPECT_EQ(m.timestamp_begin, 50364);
    const WhisperTokens v3 = WhisperTokens::of(51866);  // large-v3: 100 languages (+ <|yue|>)
    EXPECT_EQ(v3.n_languages, 100);
    EXPECT_EQ(v3.translate, 50359);
    EXPECT_EQ(v3.timestamp_begin, 50365);
    EXPECT_EQ(whisper_language_index("en"), 0);
    EXPECT_EQ(whisper_language_index("yue"), 99);
    EXPECT_EQ(whisper_language_index("xx"), -1);
}

TEST(WhisperRules, TheFirstTokenIsAnEarlyTimestamp) {
    std::vector<float> row = flat_row();
    asr::apply_rules(rules(), {}, row);
    for (int32_t id : {0, 220, 1000, kEn.eot, kEn.sot, kEn.no_timestamps, ts(51), ts(1500)})
        EXPECT_TRUE(masked(row, id)) << id;
    for (int32_t id : {ts(0), ts(25), ts(50)})
        EXPECT_FALSE(masked(row, id)) << id;
}

TEST(WhisperRules, WithoutTimestampsTheFirstTokenIsTextButNotBlank) {
    std::vector<float> row = flat_row();
    asr::apply_rules(rules(false), {}, row);
    for (int32_t id :
         {220, kEn.eot, kEn.sot, kEn.prev, kEn.solm, kEn.nosp, kEn.no_timestamps, ts(0), ts(10)})
        EXPECT_TRUE(masked(row, id)) << id;
    EXPECT_FALSE(masked(row, 1000));
    // Later, the end may come.
    row = flat_row();
    const int32_t sampled[] = {1000};
    asr::apply_rules(rules(false), sampled, row);
    EXPECT_FALSE(masked(row, kEn.eot));
    EXPECT_FALSE(masked(row, 220));
}

// Text likelier than the timestamps together (which would otherwise mask it).
std::vector<float> text_row() {
    std::vector<float> row = flat_row();
    for (int32_t id = kEn.timestamp_begin; id < kVocabEn; ++id)
        row[size_t(id)] = -10.0f;
    return row;
}

TEST(WhisperRules, TimestampsComeInPairsAndNeverGoBack) {
    // <|0.20|> text: a timestamp from <|0.22|> on, or more text.
    std::vector<float> row = text_row();
    const int32_t open[] = {ts(10), 1000};
    asr::apply_rules(rules(), open, row);
    EXPECT_TRUE(masked(row, ts(10)));
    EXPECT_FALSE(masked(row, ts(11)));
    EXPECT_FALSE(masked(row, 1001));
    // <|0.20|> text <|0.60|>: the pair is open, so text may not follow; the end or a timestamp
    // (<|0.60|> again included) may.
    row = text_row();
    const int32_t closing[] = {ts(10), 1000, ts(30)};
    asr::apply_rules(rules(), closing, row);
    EXPECT_TRUE(masked(row, 1001));
    EXPECT_TRUE(masked(row, ts(29)));
    EXPECT_FALSE(masked(row, ts(30)));
    EXPECT_FALSE(masked(row, kEn.eot));
    // ... <|0.60|><|0.60|>: closed, so text (no timestamp) follows.
    row = text_row();
    const int32_t closed[] = {ts(10), 1000, ts(30), ts(30)};
    asr::apply_rules(rules(), closed, row);
    EXPECT_TRUE(masked(row, ts(30)));
    EXPECT_TRUE(masked(row, ts(40)));
    EXPECT_FALSE(masked(row, 1001));
}

TEST(WhisperRules, NoTimestampPastTheWindow) {
    asr::Rules r = rules();
    r.max_timestamp = 64;  // a model of 1.28 s windows
    std::vector<float> row = text_row();
    const int32_t sampled[] = {ts(0), 1000};
    asr::apply_rules(r, sampled, row);
    EXPECT_FALSE(masked(row, ts(64)));
    EXPECT_TRUE(masked(row, ts(65)));
}

TEST(WhisperRules, LikelyTimestampsTogetherBeatTheBestTextToken) {
    // Each timestamp alone is less likely than text token 5, all of them together more.
    std::vector<float> row = flat_row(-30.0f);
    row[5] = 0.0f;
    for (int i = 0; i <= 1500; ++i)
        row[size_t(ts(i))] = -3.0f;  // 1501 * e^-3 = 74.7 > e^0
    const int32_t sampled[] = {ts(0), 1000};
    asr::apply_rules(rules(), sampled, row);
    EXPECT_TRUE(masked(row, 5));
    EXPECT_FALSE(masked(row, ts(100)));
    // Fewer of them: text stays.
    row = flat_row(-30.0f);
    row[5] = 0.0f;
    for (int i = 0; i <= 10; ++i)
        row[size_t(ts(i))] = -3.0f;
    asr::apply_rules(rules(), sampled, row);
    EXPECT_FALSE(masked(row, 5));
}

TEST(WhisperRules, SamplingNeverDrawsAMaskedToken) {
    std::vector<float> row = flat_row(1.0f);
    const int32_t sampled[] = {ts(0), 1000, ts(20)};
    asr::apply_rules(rules(), sampled, row);
    SamplingParams p;
    p.temperature = 1.0f;
    for (uint32_t step = 0; step < 500; ++step) {
        const int32_t t = sample_token(row, p, step);
        ASSERT_FALSE(masked(row, t)) << t;
    }
}

namespace {

// The whisper.cpp file at path, mapped and loaded on backend.
Status load_whisper(Backend& backend, const std::string& path, std::unique_ptr<WhisperModel>* out) {
    std::unique_ptr<MappedFile> file;
    SPECULA_TRY(MappedFile::open(path, &file));
    return WhisperModel::load(backend, std::move(file), nullptr, out);
}

// A random English-only model with 1.28 s windows (n_audio_ctx 64). Each test writes its own:
// ctest runs tests as parallel processes, and rewriting a file another has mapped kills it.
// The shape of small_whisper's files: tiny's vocabulary, 64 wide, one block each side.
RandomWhisperSpec small_whisper_spec(uint64_t seed, bool english, GgmlType type) {
    RandomWhisperSpec spec;
    EXPECT_TRUE(whisper_shape("tiny", english, &spec.hparams).ok());
    spec.hparams.n_audio_ctx = 64;
    spec.hparams.n_text_ctx = 64;
    spec.hparams.n_audio_state = spec.hparams.n_text_state = 64;
    spec.hparams.n_audio_head = spec.hparams.n_text_head = 2;
    spec.hparams.n_audio_layer = spec.hparams.n_text_layer = 1;
    spec.weight_type = type;
    spec.seed = seed;
    return spec;
}

std::string small_whisper(uint64_t seed = 9, bool english = true, GgmlType type = GgmlType::kF16) {
    // The test's name, a parameterized test's "Name/param" as "Name-param".
    std::string test_name = testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(test_name.begin(), test_name.end(), '/', '-');
    const std::string path =
        (test::temp_dir() / (english ? "asr-small-en-" : "asr-small-")).string() + test_name + "-" +
        std::to_string(seed) + "-" + ggml_type_name(type) + ".bin";
    if (std::filesystem::exists(path)) return path;
    const RandomWhisperSpec spec = small_whisper_spec(seed, english, type);
    // Written under another name and renamed: a run stopped while writing leaves no file that
    // the next run would take for a whole one.
    const std::string partial = path + ".partial";
    EXPECT_TRUE(write_random_whisper(spec, partial).ok());
    std::error_code renamed;
    std::filesystem::rename(partial, path, renamed);
    EXPECT_FALSE(renamed) << renamed.message();
    return path;
}

// A whisper file at `path` with `base`'s hyperparameters and tensors, but those that
// `from_donor` names, which are `donor`'s (of the same shapes and types).
std::string spliced_whisper(const std::string& base, const std::string& donor,
                            const std::function<bool(const std::string&)>& from_donor,
                            const std::string& path) {
    std::unique_ptr<MappedFile> base_file, donor_file;
    WhisperGgmlFile b, d;
    EXPECT_TRUE(MappedFile::open(base, &base_file).ok());
    EXPECT_TRUE(MappedFile::open(donor, &donor_file).ok());
    EXPECT_TRUE(WhisperGgmlFile::parse(base_file->bytes(), &b).ok());
    EXPECT_TRUE(WhisperGgmlFile::parse(donor_file->bytes(), &d).ok());
    WhisperFileSpec spec;
    spec.header_path = base;
    spec.hparams = b.hparams();
    spec.weight_type = b.weight_type();
    const Status s = write_whisper(
        spec,
        [&](const WhisperTensorSpec& want, GgmlType, std::vector<uint8_t>* data) {
            const GgufTensorInfo* t = (from_donor(want.name) ? d : b).find_tensor(want.name);
            if (t == nullptr) return FormatError("no " + want.name);
            data->assign(t->data.begin(), t->data.end());
            return Status::Ok();
        },
        path);
    EXPECT_TRUE(s.ok()) << s.message();
    return path;
}

// A Distil-Whisper-shaped draft: the encoder of one file, the decoder of another (same shape).
std::string distil_whisper(const std::string& encoder_from, const std::string& decoder_from) {
    return spliced_whisper(
        decoder_from, encoder_from,
        [](const std::string& name) { return name.starts_with("encoder."); },
        encoder_from + ".distil.bin");
}

std::vector<float> chirp(double seconds) {
    std::vector<float> s(size_t(seconds * 16000));
    for (size_t i = 0; i < s.size(); ++i) {
        const double t = double(i) / 16000.0;
        s[i] = float(0.3 * std::sin(2 * M_PI * (200 + 300 * t) * t));
    }
    return s;
}

struct Transcript {
    std::vector<asr::Segment> segments;
    asr::TranscribeStats stats;
    std::vector<float> progress;
};

// fallback: the temperature fallback, which a random model always takes (six decodings of every
// window: the sanitizer build's slowest tests); off where the test is about windows.
Status run(specula_backend_kind kind, const std::vector<float>& audio, Transcript* out,
           bool fallback, std::function<bool(float)> progress = {}) {
    std::string why;
    auto backend = test::try_backend(kind, &why);
    if (!backend) return {SPECULA_ERR_NO_DEVICE, why};
    std::unique_ptr<WhisperModel> model;
    SPECULA_TRY(load_whisper(*backend, small_whisper(), &model));
    std::unique_ptr<WhisperContext> ctx;
    SPECULA_TRY(WhisperContext::create(*model, 1, &ctx));
    asr::TranscribeParams p;
    if (!fallback) p.temperature_increment = 0.0f;
    p.progress = [&](float f) {
        out->progress.push_back(f);
        return progress ? progress(f) : true;
    };
    return asr::transcribe(*ctx, audio, p, &out->segments, &out->stats);
}

}  // namespace

TEST(WhisperTranscribe, LongAudioCrossesWindowsInOrder) {
    const std::vector<float> audio = chirp(5.0);  // about four 1.28 s windows
    Transcript t;
    ASSERT_TRUE(run(SPECULA_BACKEND_CPU, audio, &t, false).ok());
    EXPECT_GE(t.stats.windows, 4);
    ASSERT_FALSE(t.progress.empty());
    EXPECT_TRUE(std::is_sorted(t.progress.begin(), t.progress.end()));
    EXPECT_FLOAT_EQ(t.progress.back(), 1.0f);
    int64_t last = 0;
    for (const asr::Segment& s : t.segments) {
        EXPECT_LE(s.t0_ms, s.t1_ms);
        EXPECT_GE(s.t0_ms, last - 1280) << "segments go back by more than a window";
        EXPECT_LE(s.t1_ms, 5000);
        EXPECT_FALSE(s.text.empty());
        last = s.t1_ms;
    }
}

TEST(WhisperTranscribe, TheProgressCallbackCanStopIt) {
    Transcript t;
    const Status s = run(SPECULA_BACKEND_CPU, chirp(5.0), &t, false, [](float) { return false; });
    EXPECT_EQ(s.code(), SPECULA_ERR_ABORTED);
    EXPECT_EQ(t.stats.windows, 1);
}

TEST(WhisperTranscribe, VulkanGivesTheCpusSegments) {
    // Windows that a random model decodes at every temperature: the sampled fallbacks must draw
    // alike too.
    const std::vector<float> audio = chirp(2.0);
    Transcript cpu, vulkan;
    ASSERT_TRUE(run(SPECULA_BACKEND_CPU, audio, &cpu, true).ok());
    const Status s = run(SPECULA_BACKEND_VULKAN, audio, &vulkan, true);
    if (s.code() == SPECULA_ERR_NO_DEVICE) GTEST_SKIP() << s.message();
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_GE(cpu.stats.windows, 2);
    EXPECT_GT(cpu.stats.fallbacks, 0);
    ASSERT_EQ(cpu.segments.size(), vulkan.segments.size());
    for (size_t i = 0; i < cpu.segments.size(); ++i) {
        EXPECT_EQ(cpu.segments[i].tokens, vulkan.segments[i].tokens);
        EXPECT_EQ(cpu.segments[i].t0_ms, vulkan.segments[i].t0_ms);
        EXPECT_EQ(cpu.segments[i].t1_ms, vulkan.segments[i].t1_ms);
    }
    EXPECT_EQ(cpu.stats.tokens, vulkan.stats.tokens);
}

// Where the next window starts, and the segments' times, from hand-made token sequences (a
// timestamp is 2 mel frames = 20 ms; the window starts at frame 300 = 3 s and holds 1000 frames).
TEST(WhisperTranscribe, SegmentsAndTheSeekFollowTheTimestamps) {
    std::string why;
    auto backend = test::try_backend(SPECULA_BACKEND_CPU, &why);
    ASSERT_TRUE(backend) << why;
    std::unique_ptr<WhisperModel> model;
    ASSERT_TRUE(load_whisper(*backend, small_whisper(), &model).ok());
    const int32_t a = 100, b = 200, c = 300;  // text tokens
    struct Case {
        const char* what;
        std::vector<int32_t> tokens;
        int advance;
        std::vector<std::pair<int64_t, int64_t>> times;  // of each segment, in ms
    };
    const std::vector<Case> cases = {
        {"ends in a closed pair: up to its timestamp",
         {ts(0), a, b, ts(50), ts(50), c, ts(80), ts(80)},
         160,
         {{3000, 4000}, {4000, 4600}}},
        {"ends in a single timestamp: the whole window",
         {ts(0), a, b, ts(50), ts(50), c, ts(80)},
         1000,
         {{3000, 4000}, {4000, 4600}}},
        {"no pair: one segment to the last timestamp, the whole window",
         {ts(0), a, b, ts(40)},
         1000,
         {{3000, 3800}}},
        {"no timestamps: one segment over the window", {a, b, c}, 1000, {{3000, 13000}}},
    };
    for (const Case& k : cases) {
        SCOPED_TRACE(k.what);
        std::vector<asr::Segment> segments;
        EXPECT_EQ(asr::split_segments(*model, k.tokens, 300, 1000, &segments), k.advance);
        ASSERT_EQ(segments.size(), k.times.size());
        for (size_t i = 0; i < segments.size(); ++i) {
            EXPECT_EQ(segments[i].t0_ms, k.times[i].first) << i;
            EXPECT_EQ(segments[i].t1_ms, k.times[i].second) << i;
            EXPECT_FALSE(segments[i].tokens.empty());
        }
    }
}

// A multilingual model asked to detect the language takes the language token the model finds
// most likely after <|startoftranscript|> on the first window, computed here from the logits.
TEST(WhisperTranscribe, TheDetectedLanguageIsTheMostLikelyLanguageToken) {
    std::string why;
    auto backend = test::try_backend(SPECULA_BACKEND_CPU, &why);
    ASSERT_TRUE(backend) << why;
    std::unique_ptr<WhisperModel> model;
    ASSERT_TRUE(load_whisper(*backend, small_whisper(9, false), &model).ok());
    const WhisperTokens& t = model->tokens();
    ASSERT_TRUE(t.multilingual);
    std::unique_ptr<WhisperContext> ctx;
    ASSERT_TRUE(WhisperContext::create(*model, 1, &ctx).ok());
    const std::vector<float> audio = chirp(1.0);  // shorter than a window

    audio::LogMel mel;
    ASSERT_TRUE(audio::log_mel(audio, model->mel_filters(), &mel).ok());
    ASSERT_TRUE(ctx->encode(mel, 0).ok());
    std::vector<float> logits, probs;
    ASSERT_TRUE(ctx->forward(std::span(&t.sot, 1), false, &logits).ok());
    const auto first = logits.begin() + t.language(0);
    const int expected = int(std::max_element(first, first + t.n_languages) - first);
    ASSERT_TRUE(asr::detect_language(*ctx, &probs).ok());
    ASSERT_EQ(int(probs.size()), t.n_languages);
    EXPECT_NEAR(std::accumulate(probs.begin(), probs.end(), 0.0), 1.0, 1e-5);
    EXPECT_EQ(int(std::max_element(probs.begin(), probs.end()) - probs.begin()), expected);

    asr::TranscribeParams p;
    p.language = -1;
    p.temperature_increment = 0.0f;
    std::vector<asr::Segment> segments;
    asr::TranscribeStats stats;
    ASSERT_TRUE(asr::transcribe(*ctx, audio, p, &segments, &stats).ok());
    EXPECT_EQ(stats.language, expected) << kWhisperLanguages[size_t(expected)];
}

// A window longer than the audio holds the log-mel of silence past it, as whisper.cpp's: the
// encoding of a clip is the encoding of the same clip followed by 20 s of silence.
TEST(WhisperContext, TheWindowPastTheAudioIsSilence) {
    std::string why;
    auto backend = test::try_backend(SPECULA_BACKEND_CPU, &why);
    ASSERT_TRUE(backend) << why;
    std::unique_ptr<WhisperModel> model;
    ASSERT_TRUE(load_whisper(*backend, small_whisper(9), &model).ok());
    std::unique_ptr<WhisperContext> ctx;
    ASSERT_TRUE(WhisperContext::create(*model, 1, &ctx).ok());
    std::vector<float> audio = chirp(0.5);
    std::vector<std::vector<float>> encodings;
    for (int pass = 0; pass < 2; ++pass) {
        audio::LogMel mel;
        ASSERT_TRUE(audio::log_mel(audio, model->mel_filters(), &mel).ok());
        ASSERT_TRUE(ctx->encode(mel, 0).ok());
        encodings.emplace_back(ctx->encoder_output().bytes() / sizeof(float));
        ASSERT_TRUE(ctx->backend().download(ctx->encoder_output(), encodings.back().data()).ok());
        audio.resize(audio.size() + 20 * 16000, 0.0f);
    }
    EXPECT_EQ(encodings[0], encodings[1]);
}

// A draft restricted to some tokens (WhisperModel::restrict_output) has the whole model's logits
// for them and for every token from <|endoftext|> on, and -infinity for the rest, on every
// backend; bad subsets and a restriction after a context exists are refused.
TEST(WhisperModel, ARestrictedOutputIsTheWholeOutputOnItsTokens) {
    for (specula_backend_kind kind : {SPECULA_BACKEND_CPU, SPECULA_BACKEND_VULKAN}) {
        std::string why;
        auto backend = test::try_backend(kind, &why);
        if (!backend) {
            std::cout << "skipped " << test::backend_name(kind) << ": " << why << "\n";
            continue;
        }
        std::vector<std::unique_ptr<WhisperModel>> models(3);
        for (auto& m : models)
            ASSERT_TRUE(load_whisper(*backend, small_whisper(9), &m).ok());
        WhisperModel &whole = *models[0], &restricted = *models[1], &late = *models[2];
        const int32_t eot = whole.tokens().eot, n_vocab = whole.hparams().n_vocab;
        EXPECT_EQ(restricted.restrict_output(std::vector<int32_t>{5, n_vocab}).code(),
                  SPECULA_ERR_INVALID_ARGUMENT);
        EXPECT_EQ(restricted.restrict_output(std::vector<int32_t>{eot, eot + 7}).code(),
                  SPECULA_ERR_INVALID_ARGUMENT);  // no text token
        const std::vector<int32_t> kept = {50000, 5, 17, 300, 5, eot + 3};
        ASSERT_TRUE(restricted.restrict_output(kept).ok());
        EXPECT_EQ(restricted.output_rows(), 4 + (n_vocab - eot));
        EXPECT_EQ(restricted.restrict_output(kept).code(), SPECULA_ERR_INVALID_ARGUMENT);

        audio::LogMel mel;
        ASSERT_TRUE(audio::log_mel(chirp(1.0), whole.mel_filters(), &mel).ok());
        const std::vector<int32_t> prompt = {kEn.sot, kEn.no_timestamps, 300};
        std::vector<std::vector<float>> logits(2);
        for (size_t i = 0; i < 2; ++i) {
            std::unique_ptr<WhisperContext> ctx;
            ASSERT_TRUE(WhisperContext::create(i == 0 ? whole : restricted, 3, &ctx).ok());
            ASSERT_TRUE(ctx->encode(mel, 0).ok());
            ASSERT_TRUE(ctx->forward(prompt, true, &logits[i]).ok());
        }
        ASSERT_EQ(logits[0].size(), logits[1].size());
        for (size_t r = 0; r < prompt.size(); ++r)
            for (int32_t id = 0; id < n_vocab; ++id) {
                const size_t at = r * size_t(n_vocab) + size_t(id);
                const bool is_kept = id >= eot || id == 5 || id == 17 || id == 300 || id == 50000;
                if (is_kept)
                    ASSERT_NEAR(logits[1][at], logits[0][at], 1e-5 * std::abs(logits[0][at]) + 1e-6)
                        << test::backend_name(kind) << " row " << r << " token " << id;
                else
                    ASSERT_EQ(logits[1][at], -std::numeric_limits<float>::infinity()) << id;
            }
        std::unique_ptr<WhisperContext> ctx;
        ASSERT_TRUE(WhisperContext::create(late, 1, &ctx).ok());
        EXPECT_EQ(late.restrict_output(kept).code(), SPECULA_ERR_INVALID_ARGUMENT);
    }
}

// The Generator drives any Decoder: a Whisper decoder drafted by another (after both encoded
// the same window) gives greedy tokens identical to the target's alone, whether the draft is
// the target itself (every draft accepted) or an unrelated model (most rejected).
TEST(WhisperDecoder, SpeculativeGreedyIsTheTargetsGreedy) {
    std::string why;
    auto backend = test::try_backend(SPECULA_BACKEND_CPU, &why);
    ASSERT_TRUE(backend) << why;
    std::vector<std::unique_ptr<WhisperModel>> models(2);
    std::vector<std::unique_ptr<WhisperContext>> contexts(3);
    for (size_t i = 0; i < models.size(); ++i)
        ASSERT_TRUE(load_whisper(*backend, small_whisper(9 + i), &models[i]).ok());
    audio::LogMel mel;
    ASSERT_TRUE(audio::log_mel(chirp(1.0), models[0]->mel_filters(), &mel).ok());
    for (size_t i = 0; i < contexts.size(); ++i) {
        ASSERT_TRUE(
            WhisperContext::create(*models[i == 2 ? 1 : 0], kMaxGamma + 1, &contexts[i]).ok());
        ASSERT_TRUE(contexts[i]->encode(mel, 0).ok());
    }
    const std::vector<int32_t> prompt = {kEn.sot, kEn.no_timestamps};
    auto generate = [&](Decoder* draft, GeneratorStats* stats) {
        Generator::Config config;
        config.policy = GammaPolicy::kFixed;
        config.gamma = 4;
        Generator g(*contexts[0], draft, config);
        EXPECT_TRUE(g.append(prompt).ok());
        std::vector<int32_t> out;
        while (out.size() < 40)
            EXPECT_TRUE(g.step(int(40 - out.size()), &out).ok());
        *stats = g.stats();
        return out;
    };
    GeneratorStats alone, self, other;
    const std::vector<int32_t> expected = generate(nullptr, &alone);
    EXPECT_EQ(generate(contexts[1].get(), &self), expected);
    EXPECT_EQ(self.accepted, self.drafted);
    EXPECT_GT(self.drafted, 20u);
    EXPECT_EQ(generate(contexts[2].get(), &other), expected);
    EXPECT_LT(other.accepted, other.drafted);
}

// A draft quantized more coarsely than its target (distil-large-v2 in Q4_0 beside large-v2 in
// Q8_0) has the target's encoder up to rounding: it shares the target's encoding instead of
// encoding each window itself. Another model's encoder, at the same type or another, is not the
// target's. Fails if two types are taken as the same weights whatever they hold, or if the
// rounding of Q4_0 against F16 is taken for other weights.
TEST(WhisperModel, AnEncoderQuantizedAgainIsTheSameEncoder) {
    std::string why;
    auto backend = test::try_backend(SPECULA_BACKEND_CPU, &why);
    ASSERT_TRUE(backend) << why;
    std::vector<std::unique_ptr<WhisperModel>> same, other;
    for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ5_1}) {
        SCOPED_TRACE(ggml_type_name(type));
        same.emplace_back();
        ASSERT_TRUE(load_whisper(*backend, small_whisper(9, true, type), &same.back()).ok());
        other.emplace_back();
        ASSERT_TRUE(load_whisper(*backend, small_whisper(10, true, type), &other.back()).ok());
    }
    for (size_t i = 0; i < same.size(); ++i)
        for (size_t j = 0; j < same.size(); ++j) {
            EXPECT_TRUE(same[i]->same_encoder(*same[j])) << i << " " << j;
            EXPECT_FALSE(same[i]->same_encoder(*other[j])) << i << " " << j;
        }
    // The target's encoder in Q4_0 but for one matrix, another model's: its norms and biases
    // (F32, byte for byte the target's) leave the matrices to tell.
    const std::string q4 = small_whisper(9, true, GgmlType::kQ4_0);
    std::unique_ptr<WhisperModel> one_other;
    ASSERT_TRUE(load_whisper(*backend,
                             spliced_whisper(
                                 q4, small_whisper(10, true, GgmlType::kQ4_0),
                                 [](const std::string& name) {
                                     return name == "encoder.blocks.0.mlp.0.weight";
                                 },
                                 q4 + ".one-other.bin"),
                             &one_other)
                    .ok());
    EXPECT_FALSE(same[0]->same_encoder(*one_other));
    EXPECT_FALSE(one_other->same_encoder(*same[1]));
}

// A draft sharing the target's encoder takes the window lazily (encode_shared_later): its
// cross K/V are computed by its first use, not before (a draft the γ policy leaves idle costs
// nothing), give the logits an eager encode_shared gives, and a window the target has replaced
// since is refused, not decoded from.
TEST(WhisperContext, ASharedWindowTakenLaterIsTheSameAndNotAReplacedOne) {
    std::string why;
    auto backend = test::try_backend(SPECULA_BACKEND_CPU, &why);
    ASSERT_TRUE(backend) << why;
    std::unique_ptr<WhisperModel> model;
    ASSERT_TRUE(load_whisper(*backend, small_whisper(9), &model).ok());
    std::unique_ptr<WhisperContext> target, eager, lazy;
    for (auto* ctx : {&target, &eager, &lazy})
        ASSERT_TRUE(WhisperContext::create(*model, 1, ctx).ok());
    audio::LogMel mel;
    ASSERT_TRUE(audio::log_mel(chirp(1.0), model->mel_filters(), &mel).ok());
    EXPECT_EQ(lazy->encode_shared_later(*target).code(), SPECULA_ERR_INVALID_ARGUMENT);
    ASSERT_TRUE(target->encode(mel, 0).ok());
    ASSERT_TRUE(eager->encode_shared(*target).ok());
    const uint64_t waits = backend->host_waits();
    ASSERT_TRUE(lazy->encode_shared_later(*target).ok());
    EXPECT_EQ(backend->host_waits(), waits);  // nothing computed yet
    const std::vector<int32_t> prompt = {kEn.sot, kEn.no_timestamps, 300};
    std::vector<float> expected, got;
    ASSERT_TRUE(eager->forward(prompt, false, &expected).ok());
    ASSERT_TRUE(lazy->forward(prompt, false, &got).ok());
    EXPECT_EQ(got, expected);
    // Taken later, after the target encoded another window (silence): refused.
    ASSERT_TRUE(lazy->encode_shared_later(*target).ok());
    ASSERT_TRUE(target->encode(mel, mel.n_frames - target->window_frames() / 2).ok());
    EXPECT_EQ(lazy->forward(prompt, false, &got).code(), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(lazy->prepare().code(), SPECULA_OK);  // the refusal is not repeated...
    EXPECT_EQ(lazy->forward(prompt, false, &got).code(),
              SPECULA_ERR_INVALID_ARGUMENT);  // ...nor decoded
    ASSERT_TRUE(lazy->encode_shared_later(*target).ok());
    ASSERT_TRUE(lazy->forward(prompt, false, &got).ok());
    EXPECT_NE(got, expected);  // the second window's
}

// A window encoded later (a draft whose encoder is its own, which the γ policy may leave idle in
// a window) is computed at the first forward and is the window encoded at once.
TEST(WhisperContext, AWindowEncodedLaterIsTheSameAndCostsNothingUnused) {
    std::string why;
    auto backend = test::try_backend(SPECULA_BACKEND_CPU, &why);
    ASSERT_TRUE(backend) << why;
    std::unique_ptr<WhisperModel> model;
    ASSERT_TRUE(load_whisper(*backend, small_whisper(10), &model).ok());
    std::unique_ptr<WhisperContext> eager, lazy;
    for (auto* ctx : {&eager, &lazy})
        ASSERT_TRUE(WhisperContext::create(*model, 1, ctx).ok());
    audio::LogMel mel;
    ASSERT_TRUE(audio::log_mel(chirp(1.0), model->mel_filters(), &mel).ok());
    ASSERT_TRUE(eager->encode(mel, 0).ok());
    const uint64_t waits = backend->host_waits();
    ASSERT_TRUE(lazy->encode_later(mel, 0).ok());
    EXPECT_EQ(backend->host_waits(), waits);  // nothing computed yet
    const std::vector<int32_t> prompt = {kEn.sot, kEn.no_timestamps, 300};
    std::vector<float> expected, got;
    ASSERT_TRUE(eager->forward(prompt, false, &expected).ok());
    ASSERT_TRUE(lazy->forward(prompt, false, &got).ok());
    EXPECT_EQ(got, expected);
    // Dropped before its use (its mel is going): no window to decode.
    ASSERT_TRUE(lazy->encode_later(mel, 0).ok());
    lazy->forget_later();
    EXPECT_EQ(lazy->forward(prompt, false, &got).code(), SPECULA_ERR_INVALID_ARGUMENT);
}

namespace {

// More than 10 drafts in a transcription, every one accepted (a draft that is the target's
// function) or some rejected.
void expect_drafts(const GeneratorStats& g, bool all_accepted) {
    EXPECT_GT(g.drafted, 10u);
    if (all_accepted) {
        EXPECT_EQ(g.accepted, g.drafted);
    } else {
        EXPECT_LT(g.accepted, g.drafted);
    }
}

// The same segments (tokens and times) as `expected`; d names the draft.
void same_segments(const Transcript& t, const Transcript& expected, size_t d) {
    ASSERT_EQ(t.segments.size(), expected.segments.size()) << "draft " << d;
    for (size_t i = 0; i < t.segments.size(); ++i) {
        EXPECT_EQ(t.segments[i].tokens, expected.segments[i].tokens) << "draft " << d;
        EXPECT_EQ(t.segments[i].t0_ms, expected.segments[i].t0_ms);
        EXPECT_EQ(t.segments[i].t1_ms, expected.segments[i].t1_ms);
    }
}

}  // namespace

// Speculative transcription: the rules mask every drafted and verified row on the device, each
// from the tokens before it, so a draft changes nothing of a transcript (segments, times,
// tokens), greedy or through the temperature fallback's sampled attempts, whether it agrees
// always (the target itself), often (its weights in Q4_0, decoding from the target's encoding:
// its encoder is the target's up to rounding) or seldom (an unrelated model, with its own
// encoder, or its decoder reading the target's encoder output: the Distil-Whisper case); and a
// draft equal to the target has every sampled draft accepted, which holds only where both
// sides' rows are masked alike at every position (and, the encoder being shared, only where the
// draft's cross K/V come from the window the target encoded). One test per backend, so that
// they run side by side.
class DraftChangesNoTranscript : public ::testing::TestWithParam<specula_backend_kind> {};

TEST_P(DraftChangesNoTranscript, OnBackend) {
    const specula_backend_kind kind = GetParam();
    std::string why;
    auto backend = test::try_backend(kind, &why);
    if (!backend) GTEST_SKIP() << why;
    std::vector<std::unique_ptr<WhisperModel>> models;
    // The target, itself in Q4_0, an unrelated model, and the target's encoder with the
    // unrelated model's decoder (a Distil-Whisper draft). The encoder runs once for all but the
    // unrelated model.
    const std::string target_path = small_whisper(9), other_path = small_whisper(10);
    for (const std::string& path : {target_path, small_whisper(9, true, GgmlType::kQ4_0),
                                    other_path, distil_whisper(target_path, other_path)}) {
        models.emplace_back();
        ASSERT_TRUE(load_whisper(*backend, path, &models.back()).ok());
    }
    for (size_t d = 0; d < models.size(); ++d)
        EXPECT_EQ(models[d]->same_encoder(*models[0]), d != 2) << "model " << d;
    std::unique_ptr<WhisperContext> target, self;
    ASSERT_TRUE(WhisperContext::create(*models[0], kMaxGamma + 1, &target).ok());
    ASSERT_TRUE(WhisperContext::create(*models[0], 1, &self).ok());
    const std::vector<float> audio = chirp(3.0);
    auto transcribe = [&](WhisperContext* draft, float temperature, Transcript* out,
                          float increment = 0.0f) {
        asr::TranscribeParams p;
        p.temperature = temperature;
        p.temperature_increment = increment;
        p.draft = draft;
        p.gamma_policy = GammaPolicy::kFixed;
        p.gamma = 3;
        p.seed = 77;
        return asr::transcribe(*target, audio, p, &out->segments, &out->stats);
    };
    Transcript alone, alone_sampled;
    ASSERT_TRUE(transcribe(nullptr, 0.0f, &alone).ok());
    ASSERT_FALSE(alone.segments.empty());
    EXPECT_EQ(alone.stats.decoding.drafted, 0u);
    // Sampled at 0.6, then the temperature fallback's attempt at 1.0, which a random model
    // takes.
    ASSERT_TRUE(transcribe(nullptr, 0.6f, &alone_sampled, 0.4f).ok());
    EXPECT_GT(alone_sampled.stats.fallbacks, 0);
    // On Vulkan (llvmpipe: a minute for the runs below) the unrelated draft with its own encoder
    // and the shared encoder's sampled run are left to the cpu's run: the host code they add is
    // the same there, and the device's acceptance and resampling are draft 1's.
    const bool vulkan = kind == SPECULA_BACKEND_VULKAN;
    for (size_t d = 0; d < models.size(); ++d) {
        if (vulkan && d == 2) continue;
        std::unique_ptr<WhisperContext> other;
        if (d > 0) {
            ASSERT_TRUE(WhisperContext::create(*models[d], 1, &other).ok());
        }
        Transcript t;
        ASSERT_TRUE(transcribe(d == 0 ? self.get() : other.get(), 0.0f, &t).ok());
        const GeneratorStats& g = t.stats.decoding;
        expect_drafts(g, d == 0);
        std::cout << "backend " << kind << " draft " << d << ": accepted " << g.accepted << " of "
                  << g.drafted << " drafts, " << g.emitted << " tokens in " << g.steps
                  << " steps\n";
        same_segments(t, alone, d);
        // The sampled attempts draw each draft with the target's noise at its position (the
        // coupled acceptance): the transcript is the target alone's for the seed, fallback
        // included. Drafts 1 (some rejected) and 3 (the shared encoder) only: CI time.
        if (d != 1 && (d != 3 || vulkan)) continue;
        Transcript sampled;
        ASSERT_TRUE(transcribe(other.get(), 0.6f, &sampled, 0.4f).ok());
        EXPECT_EQ(sampled.stats.fallbacks, alone_sampled.stats.fallbacks) << "draft " << d;
        EXPECT_GT(sampled.stats.decoding.drafted, 10u) << "draft " << d;
        same_segments(sampled, alone_sampled, d);
    }
    Transcript sampled;
    ASSERT_TRUE(transcribe(self.get(), 1.0f, &sampled).ok());
    expect_drafts(sampled.stats.decoding, true);
    // Only the models that encoded a window themselves uploaded their encoders: the target and
    // the unrelated draft (where it ran); the drafts that share the target's never did.
    for (size_t d = 0; d < models.size(); ++d)
        EXPECT_EQ(models[d]->encoder_loaded(), d == 0 || (d == 2 && !vulkan)) << "model " << d;
}

INSTANTIATE_TEST_SUITE_P(WhisperTranscribe, DraftChangesNoTranscript,
                         ::testing::Values(SPECULA_BACKEND_CPU, SPECULA_BACKEND_VULKAN),
                         [](const auto& info) {
                             return std::string(test::backend_name(info.param));
                         });

// specula-make-whisper's dialled draft (a benchmark device): the target's encoder byte for byte
// and its first and last decoder blocks, the target's middle blocks' outputs scaled. At scale 0
// the draft is the target's function (every greedy draft accepted), at 1 it is not; the
// transcript is the target alone's either way. Fails if the draft's blocks are not the target's
// (first and last), or if the scale misses an update of the middle blocks.
TEST(WhisperTranscribe, ADialledDraftAtScaleZeroIsTheTarget) {
    std::string why;
    auto backend = test::try_backend(SPECULA_BACKEND_CPU, &why);
    ASSERT_TRUE(backend) << why;
    for (const float scale : {0.0f, 1.0f}) {
        SCOPED_TRACE(scale);
        RandomWhisperSpec spec = small_whisper_spec(5, true, GgmlType::kF16);
        spec.hparams.n_text_layer = 4;
        spec.late_scale = scale;
        const std::string name = "dialled-whisper-" + std::to_string(int(scale));
        const std::string target_path = (test::temp_dir() / (name + ".bin")).string();
        spec.draft_path = (test::temp_dir() / (name + "-draft.bin")).string();
        ASSERT_TRUE(write_random_whisper(spec, target_path).ok());
        std::unique_ptr<WhisperModel> target_model, draft_model;
        ASSERT_TRUE(load_whisper(*backend, target_path, &target_model).ok());
        ASSERT_TRUE(load_whisper(*backend, spec.draft_path, &draft_model).ok());
        EXPECT_TRUE(draft_model->same_encoder(*target_model));
        std::unique_ptr<WhisperContext> target, draft;
        ASSERT_TRUE(WhisperContext::create(*target_model, kMaxGamma + 1, &target).ok());
        ASSERT_TRUE(WhisperContext::create(*draft_model, 1, &draft).ok());
        const std::vector<float> audio = chirp(3.0);
        Transcript alone, paired;
        asr::TranscribeParams p;
        p.temperature_increment = 0.0f;
        p.gamma_policy = GammaPolicy::kFixed;
        p.gamma = 3;
        ASSERT_TRUE(asr::transcribe(*target, audio, p, &alone.segments, &alone.stats).ok());
        p.draft = draft.get();
        ASSERT_TRUE(asr::transcribe(*target, audio, p, &paired.segments, &paired.stats).ok());
        expect_drafts(paired.stats.decoding, scale == 0.0f);
        same_segments(paired, alone, 1);
        if (scale != 0.0f) continue;
        // Sampled at 1.0 (the coupled acceptance): only where the two give the same rows is
        // every draft accepted; greedy agreement alone would miss small differences.
        Transcript sampled;
        p.temperature = 1.0f;
        p.seed = 3;
        ASSERT_TRUE(asr::transcribe(*target, audio, p, &sampled.segments, &sampled.stats).ok());
        expect_drafts(sampled.stats.decoding, true);
    }
}

// --draft-type: the draft's matrices in another type, drawn from the same values as the
// target's, so that its encoder is the target's up to rounding (shared) and its decoder agrees
// with the target's often but not always. Fails if the draft's values are drawn anew.
TEST(WhisperTranscribe, ADraftOfAnotherTypeIsTheTargetRounded) {
    std::string why;
    auto backend = test::try_backend(SPECULA_BACKEND_CPU, &why);
    ASSERT_TRUE(backend) << why;
    RandomWhisperSpec spec = small_whisper_spec(5, true, GgmlType::kQ8_0);
    spec.hparams.n_text_layer = 3;
    spec.late_scale = 0.0f;
    spec.draft_weight_type = GgmlType::kQ4_0;
    const std::string target_path = (test::temp_dir() / "rounded-whisper.bin").string();
    spec.draft_path = (test::temp_dir() / "rounded-whisper-draft.bin").string();
    ASSERT_TRUE(write_random_whisper(spec, target_path).ok());
    std::unique_ptr<WhisperModel> target_model, draft_model;
    ASSERT_TRUE(load_whisper(*backend, target_path, &target_model).ok());
    ASSERT_TRUE(load_whisper(*backend, spec.draft_path, &draft_model).ok());
    EXPECT_EQ(draft_model->weight_type(), GgmlType::kQ4_0);
    EXPECT_TRUE(draft_model->same_encoder(*target_model));
    std::unique_ptr<WhisperContext> target, draft;
    ASSERT_TRUE(WhisperContext::create(*target_model, kMaxGamma + 1, &target).ok());
    ASSERT_TRUE(WhisperContext::create(*draft_model, 1, &draft).ok());
    asr::TranscribeParams p;
    p.temperature_increment = 0.0f;
    p.gamma_policy = GammaPolicy::kFixed;
    p.gamma = 3;
    p.draft = draft.get();
    Transcript paired;
    ASSERT_TRUE(asr::transcribe(*target, chirp(3.0), p, &paired.segments, &paired.stats).ok());
    const GeneratorStats& g = paired.stats.decoding;
    EXPECT_GT(g.accepted, g.drafted / 2);
    EXPECT_LT(g.accepted, g.drafted);
}

// --position-scale: the decoder's positional embedding drawn P wide (P times a block's output),
// nothing else changed. Fails if the scale misses the tensor or reaches another.
TEST(WhisperTranscribe, ThePositionScaleDrawsOnlyThePositionalEmbeddingWider) {
    std::vector<std::vector<char>> files;
    for (const float scale : {0.0f, 5.0f}) {
        RandomWhisperSpec spec = small_whisper_spec(5, true, GgmlType::kF16);
        spec.position_scale = scale;
        const std::string path =
            (test::temp_dir() / ("positions-" + std::to_string(int(scale)) + ".bin")).string();
        ASSERT_TRUE(write_random_whisper(spec, path).ok());
        files.push_back(test::read_file_bytes(path));
    }
    WhisperGgmlFile plain, scaled;
    const auto bytes = [&](size_t i) {
        return std::span(reinterpret_cast<const uint8_t*>(files[i].data()), files[i].size());
    };
    ASSERT_TRUE(WhisperGgmlFile::parse(bytes(0), &plain).ok());
    ASSERT_TRUE(WhisperGgmlFile::parse(bytes(1), &scaled).ok());
    for (const GgufTensorInfo& t : plain.tensors()) {
        const GgufTensorInfo* u = scaled.find_tensor(t.name);
        ASSERT_NE(u, nullptr) << t.name;
        const bool positions = t.name == "decoder.positional_embedding";
        EXPECT_EQ(std::equal(t.data.begin(), t.data.end(), u->data.begin(), u->data.end()),
                  !positions)
            << t.name;
        if (!positions) continue;
        double sum2 = 0.0;
        for (uint64_t i = 0; i < u->n_elements; ++i) {
            float v = 0.0f;  // copied: a whisper.cpp file aligns no tensor
            std::memcpy(&v, u->data.data() + i * sizeof(float), sizeof v);
            sum2 += double(v) * v;
        }
        EXPECT_NEAR(std::sqrt(sum2 / double(u->n_elements)), 5.0, 0.25);
    }
}

// ------------------------------------------------------------------ C API

namespace {

struct Api {
    specula_backend* backend = nullptr;
    Api() {
        specula_backend_params bp = specula_backend_default_params();
        bp.kind = SPECULA_BACKEND_CPU;
        EXPECT_EQ(specula_backend_create(&bp, &backend), SPECULA_OK);
    }
    ~Api() { specula_backend_free(backend); }
};

// The text of every segment of the context's last transcription.
std::string transcript(const specula_asr_context* ctx) {
    std::string text;
    for (size_t i = 0; i < specula_asr_segment_count(ctx); ++i) {
        specula_asr_segment s{};
        EXPECT_EQ(specula_asr_get_segment(ctx, i, &s), SPECULA_OK);
        text += s.text;
    }
    return text;
}

std::string write_bytes(const std::string& name, const std::vector<char>& bytes) {
    const std::string path = (test::temp_dir() / name).string();
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    return path;
}

}  // namespace

TEST(AsrApi, BadFilesAreStatusesNotCrashes) {
    Api api;
    specula_asr_model* model = nullptr;
    EXPECT_EQ(specula_asr_model_load(api.backend, test::data_path("ggml-vocab-gpt-2.gguf").c_str(),
                                     nullptr, &model),
              SPECULA_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(specula_last_error()).find("GGUF"), std::string::npos);
    std::vector<char> good = test::read_file_bytes(small_whisper());
    std::vector<char> cut(good.begin(), good.begin() + ptrdiff_t(good.size() - 100));
    EXPECT_EQ(specula_asr_model_load(api.backend, write_bytes("asr-cut.bin", cut).c_str(), nullptr,
                                     &model),
              SPECULA_ERR_FORMAT);
    EXPECT_NE(std::string(specula_last_error()).find("truncated"), std::string::npos);
    EXPECT_EQ(model, nullptr);
    EXPECT_EQ(specula_asr_model_load(api.backend, "/nonexistent.bin", nullptr, &model),
              SPECULA_ERR_IO);
    EXPECT_EQ(specula_asr_model_load(nullptr, small_whisper().c_str(), nullptr, &model),
              SPECULA_ERR_INVALID_ARGUMENT);
}

// The loaders ask the registry first: each refuses the other's models by name, and an
// architecture nothing reads is named too.
TEST(ModelRegistry, EachLoaderNamesWhatItRefuses) {
    Api api;
    specula_asr_model* asr = nullptr;
    specula_model* text = nullptr;
    const std::string llama =
        test::make_model("asr-registry-llama", test::small_spec(GgmlType::kF32, 3));
    EXPECT_EQ(specula_asr_model_load(api.backend, llama.c_str(), nullptr, &asr),
              SPECULA_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(specula_last_error()).find("'llama' is a text model"), std::string::npos)
        << specula_last_error();
    EXPECT_EQ(specula_model_load(api.backend, small_whisper().c_str(), nullptr, &text),
              SPECULA_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(specula_last_error()).find("specula_asr_model_load"), std::string::npos)
        << specula_last_error();
    for (auto load : {+[](specula_backend*b, const char*p) {
                          specula_model* m = nullptr;
                          return specula_model_load(b, p, nullptr, &m);
                      },
                      +[](specula_backend*b, const char*p) {
                          specula_asr_model* m = nullptr;
                          return specula_asr_model_load(b, p, nullptr, &m);
                      }}) {
        EXPECT_EQ(load(api.backend, test::data_path("ggml-vocab-gpt-2.gguf").c_str()),
                  SPECULA_ERR_UNSUPPORTED);
        EXPECT_NE(std::string(specula_last_error()).find("architecture 'gpt2'"), std::string::npos)
            << specula_last_error();
        EXPECT_EQ(
            load(api.backend, write_bytes("registry-junk.bin", {'j', 'u', 'n', 'k', 0}).c_str()),
            SPECULA_ERR_FORMAT);
    }
    EXPECT_EQ(asr, nullptr);
    EXPECT_EQ(text, nullptr);
    // Nothing loaded before is lost: the right model still loads on the same backend.
    ASSERT_EQ(specula_asr_model_load(api.backend, small_whisper().c_str(), nullptr, &asr),
              SPECULA_OK);
    specula_asr_model_free(asr);
}

TEST(AsrApi, TranscribesAFileAndRefusesBadRequests) {
    Api api;
    specula_asr_model* model = nullptr;
    ASSERT_EQ(specula_asr_model_load(api.backend, small_whisper().c_str(), nullptr, &model),
              SPECULA_OK);
    specula_asr_model_info info{};
    ASSERT_EQ(specula_asr_model_get_info(model, &info), SPECULA_OK);
    EXPECT_EQ(info.n_audio_ctx, 64);
    EXPECT_FALSE(info.multilingual);
    specula_asr_context* ctx = nullptr;
    ASSERT_EQ(specula_asr_context_create(model, &ctx), SPECULA_OK);

    // A 16-bit stereo WAV at 22.05 kHz of the chirp: resampled, mixed down, transcribed.
    const std::vector<float> mono = chirp(1.5);
    std::vector<int16_t> pcm;
    for (size_t i = 0; i < mono.size() * 22050 / 16000; ++i) {
        const auto v = int16_t(mono[i * 16000 / 22050] * 32767.0f);
        pcm.push_back(v);
        pcm.push_back(v);
    }
    std::vector<char> wav;
    const auto put = [&](const void* p, size_t n) {
        wav.insert(wav.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
    };
    const auto u32 = [&](uint32_t v) { put(&v, 4); };
    const auto u16 = [&](uint16_t v) { put(&v, 2); };
    put("RIFF", 4);
    u32(uint32_t(36 + pcm.size() * 2));
    put("WAVEfmt ", 8);
    u32(16);
    u16(1);
    u16(2);
    u32(22050);
    u32(22050 * 4);
    u16(4);
    u16(16);
    put("data", 4);
    u32(uint32_t(pcm.size() * 2));
    put(pcm.data(), pcm.size() * 2);
    const std::string path = write_bytes("asr-chirp.wav", wav);
    int segments_seen = 0;
    specula_asr_params p = specula_asr_default_params();
    p.on_segment = [](const specula_asr_segment*, void* n) { ++*static_cast<int*>(n); };
    p.segment_user_data = &segments_seen;
    ASSERT_EQ(specula_asr_transcribe_file(ctx, path.c_str(), &p), SPECULA_OK)
        << specula_last_error();
    EXPECT_EQ(size_t(segments_seen), specula_asr_segment_count(ctx));
    specula_asr_timings t{};
    ASSERT_EQ(specula_asr_get_timings(ctx, &t), SPECULA_OK);
    EXPECT_NEAR(t.audio_seconds, 1.5, 0.01);
    EXPECT_EQ(t.windows, 2);
    EXPECT_STREQ(t.language, "en");
    specula_asr_segment seg{};
    EXPECT_EQ(specula_asr_get_segment(ctx, 1000, &seg), SPECULA_ERR_INVALID_ARGUMENT);
    // The same bytes from memory (a server's upload): the same segments.
    std::vector<std::string> from_file;
    for (size_t i = 0; i < specula_asr_segment_count(ctx); ++i) {
        ASSERT_EQ(specula_asr_get_segment(ctx, i, &seg), SPECULA_OK);
        from_file.push_back(std::to_string(seg.t0_ms) + seg.text);
    }
    ASSERT_EQ(specula_asr_transcribe_memory(ctx, wav.data(), wav.size(), &p), SPECULA_OK)
        << specula_last_error();
    ASSERT_EQ(specula_asr_segment_count(ctx), from_file.size());
    for (size_t i = 0; i < from_file.size(); ++i) {
        ASSERT_EQ(specula_asr_get_segment(ctx, i, &seg), SPECULA_OK);
        EXPECT_EQ(std::to_string(seg.t0_ms) + seg.text, from_file[i]);
    }
    EXPECT_EQ(specula_asr_transcribe_memory(ctx, wav.data(), 30, &p), SPECULA_ERR_FORMAT);
    EXPECT_EQ(specula_asr_transcribe_memory(ctx, nullptr, 10, &p), SPECULA_ERR_INVALID_ARGUMENT);

    // Requests the model cannot serve, and malformed audio.
    p.language = "de";
    EXPECT_EQ(specula_asr_transcribe(ctx, mono.data(), mono.size(), &p),
              SPECULA_ERR_INVALID_ARGUMENT);
    p.language = "auto";
    EXPECT_EQ(specula_asr_transcribe(ctx, mono.data(), mono.size(), &p),
              SPECULA_ERR_INVALID_ARGUMENT);
    p.language = "xx";
    EXPECT_EQ(specula_asr_transcribe(ctx, mono.data(), mono.size(), &p),
              SPECULA_ERR_INVALID_ARGUMENT);
    p.language = "en";
    p.temperature = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(specula_asr_transcribe(ctx, mono.data(), mono.size(), &p),
              SPECULA_ERR_INVALID_ARGUMENT);
    p.temperature = 0.0f;
    std::vector<char> bad = wav;
    bad[8] = 'X';  // not WAVE
    EXPECT_EQ(specula_asr_transcribe_file(ctx, write_bytes("asr-bad.wav", bad).c_str(), &p),
              SPECULA_ERR_FORMAT);
    std::vector<float> nan_audio(16000, std::numeric_limits<float>::quiet_NaN());
    EXPECT_EQ(specula_asr_transcribe(ctx, nan_audio.data(), nan_audio.size(), &p),
              SPECULA_ERR_INVALID_ARGUMENT);
    // The context still works after the refusals.
    p.temperature_increment = 0.0f;
    EXPECT_EQ(specula_asr_transcribe(ctx, mono.data(), mono.size(), &p), SPECULA_OK);
    specula_asr_context_free(ctx);
    specula_asr_model_free(model);
}

// Without the earlier windows' text (condition_on_previous_text off, specula-asr --no-context)
// a window's decoding depends on its audio alone: the first window is decoded alike either way,
// later ones (a random model, whose text differs with its prompt) otherwise. Fails if the
// parameter does not reach the transcriber or the history is kept regardless.
TEST(AsrApi, WithoutThePreviousTextLaterWindowsDecodeOtherwise) {
    Api api;
    specula_asr_model* model = nullptr;
    ASSERT_EQ(specula_asr_model_load(api.backend, small_whisper().c_str(), nullptr, &model),
              SPECULA_OK);
    specula_asr_context* ctx = nullptr;
    ASSERT_EQ(specula_asr_context_create(model, &ctx), SPECULA_OK);
    const std::vector<float> audio = chirp(5.0);  // about four 1.28 s windows
    std::vector<std::vector<std::string>> texts;
    for (bool condition : {true, false}) {
        specula_asr_params p = specula_asr_default_params();
        p.timestamps = false;  // a segment per window
        p.temperature_increment = 0.0f;
        p.condition_on_previous_text = condition;
        ASSERT_EQ(specula_asr_transcribe(ctx, audio.data(), audio.size(), &p), SPECULA_OK)
            << specula_last_error();
        auto& t = texts.emplace_back();
        for (size_t i = 0; i < specula_asr_segment_count(ctx); ++i) {
            specula_asr_segment seg{};
            ASSERT_EQ(specula_asr_get_segment(ctx, i, &seg), SPECULA_OK);
            t.emplace_back(seg.text);
        }
        ASSERT_GE(t.size(), 3u);
    }
    EXPECT_EQ(texts[0][0], texts[1][0]);
    EXPECT_NE(std::vector(texts[0].begin() + 1, texts[0].end()),
              std::vector(texts[1].begin() + 1, texts[1].end()));
    specula_asr_context_free(ctx);
    specula_asr_model_free(model);
}

// A draft in the params: its transcript is the target's (greedy), its steps are counted, and a
// draft of another vocabulary or backend is refused without harm to the context.
TEST(AsrApi, ADraftInTheParams) {
    Api api;
    specula_asr_model *model = nullptr, *draft = nullptr, *multilingual = nullptr,
                      *elsewhere = nullptr;
    ASSERT_EQ(specula_asr_model_load(api.backend, small_whisper().c_str(), nullptr, &model),
              SPECULA_OK);
    ASSERT_EQ(specula_asr_model_load(api.backend, small_whisper(9, true, GgmlType::kQ4_0).c_str(),
                                     nullptr, &draft),
              SPECULA_OK);
    ASSERT_EQ(specula_asr_model_load(api.backend, small_whisper(9, false).c_str(), nullptr,
                                     &multilingual),
              SPECULA_OK);
    Api other;
    ASSERT_EQ(specula_asr_model_load(other.backend, small_whisper().c_str(), nullptr, &elsewhere),
              SPECULA_OK);
    specula_asr_context* ctx = nullptr;
    ASSERT_EQ(specula_asr_context_create(model, &ctx), SPECULA_OK);
    const std::vector<float> audio = chirp(2.0);
    auto texts = [&] {
        std::vector<std::string> out;
        for (size_t i = 0; i < specula_asr_segment_count(ctx); ++i) {
            specula_asr_segment s{};
            EXPECT_EQ(specula_asr_get_segment(ctx, i, &s), SPECULA_OK);
            out.push_back(std::to_string(s.t0_ms) + " " + std::to_string(s.t1_ms) + " " + s.text);
        }
        return out;
    };
    specula_asr_params p = specula_asr_default_params();
    p.temperature_increment = 0.0f;
    ASSERT_EQ(specula_asr_transcribe(ctx, audio.data(), audio.size(), &p), SPECULA_OK);
    const std::vector<std::string> alone = texts();
    ASSERT_FALSE(alone.empty());
    specula_asr_timings t{};
    ASSERT_EQ(specula_asr_get_timings(ctx, &t), SPECULA_OK);
    EXPECT_EQ(t.n_drafted, 0u);
    EXPECT_GT(t.n_steps, 0u);

    p.draft = draft;
    p.gamma_policy = SPECULA_GAMMA_FIXED;
    p.gamma = 3;
    ASSERT_EQ(specula_asr_transcribe(ctx, audio.data(), audio.size(), &p), SPECULA_OK)
        << specula_last_error();
    EXPECT_EQ(texts(), alone);
    ASSERT_EQ(specula_asr_get_timings(ctx, &t), SPECULA_OK);
    EXPECT_GT(t.n_drafted, 0u);
    EXPECT_GT(t.n_accepted, 0u);
    EXPECT_LE(t.n_accepted, t.n_evaluated);
    EXPECT_LT(t.n_steps, t.n_emitted);

    p.draft = multilingual;
    EXPECT_EQ(specula_asr_transcribe(ctx, audio.data(), audio.size(), &p),
              SPECULA_ERR_VOCAB_MISMATCH);
    p.draft = elsewhere;
    EXPECT_EQ(specula_asr_transcribe(ctx, audio.data(), audio.size(), &p),
              SPECULA_ERR_INVALID_ARGUMENT);
    p.draft = draft;
    p.gamma = 0;
    EXPECT_EQ(specula_asr_transcribe(ctx, audio.data(), audio.size(), &p),
              SPECULA_ERR_INVALID_ARGUMENT);
    p.gamma = 3;
    ASSERT_EQ(specula_asr_transcribe(ctx, audio.data(), audio.size(), &p), SPECULA_OK);
    EXPECT_EQ(texts(), alone);

    // A draft that proposes a few tokens: the same transcript; bad token lists are refused.
    const std::string draft_path = small_whisper(9, true, GgmlType::kQ4_0);
    specula_asr_model* proposer = reinterpret_cast<specula_asr_model*>(&p);  // must be reset
    const std::vector<int32_t> bad = {5, kVocabEn};
    EXPECT_EQ(specula_asr_draft_load(api.backend, draft_path.c_str(), nullptr, bad.data(),
                                     bad.size(), &proposer),
              SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(proposer, nullptr);
    EXPECT_EQ(
        specula_asr_draft_load(api.backend, draft_path.c_str(), nullptr, nullptr, 3, &proposer),
        SPECULA_ERR_INVALID_ARGUMENT);
    std::vector<int32_t> few(300);
    std::iota(few.begin(), few.end(), 0);
    ASSERT_EQ(specula_asr_draft_load(api.backend, draft_path.c_str(), nullptr, few.data(),
                                     few.size(), &proposer),
              SPECULA_OK);
    p.draft = proposer;
    ASSERT_EQ(specula_asr_transcribe(ctx, audio.data(), audio.size(), &p), SPECULA_OK)
        << specula_last_error();
    EXPECT_EQ(texts(), alone);
    specula_asr_model_free(proposer);
    specula_asr_context_free(ctx);
    specula_asr_model_free(elsewhere);
    specula_asr_model_free(multilingual);
    specula_asr_model_free(draft);
    specula_asr_model_free(model);
}

// With a real model (SPECULA_WHISPER_MODEL, e.g. whisper.cpp's ggml-base.en.bin), jfk.wav's words.
TEST(AsrApi, RealModelTranscribesJfk) {
    const char* path = std::getenv("SPECULA_WHISPER_MODEL");
    if (path == nullptr) GTEST_SKIP() << "SPECULA_WHISPER_MODEL names no real model";
    const std::string jfk = std::string(SPECULA_SHARED_DATA_DIR) + "/audio/jfk.wav";
    Api api;
    specula_asr_model* model = nullptr;
    ASSERT_EQ(specula_asr_model_load(api.backend, path, nullptr, &model), SPECULA_OK)
        << specula_last_error();
    specula_asr_context* ctx = nullptr;
    ASSERT_EQ(specula_asr_context_create(model, &ctx), SPECULA_OK);
    ASSERT_EQ(specula_asr_transcribe_file(ctx, jfk.c_str(), nullptr), SPECULA_OK);
    const std::string text = transcript(ctx);
    EXPECT_NE(text.find("ask not what your country can do for you"), std::string::npos) << text;
    specula_asr_context_free(ctx);
    specula_asr_model_free(model);
}

// The bundled pair (examples/models/specula-whisper-*.bin, tools/train/README.md) on the bundled
// clip, a sentence and a voice it never heard in training: on every backend the pair's greedy
// transcript is the target's alone, whether the draft proposes any token or only those of its
// token list (specula_asr_draft_load), most drafts are accepted, and the target hears the
// sentence.
TEST(AsrApi, BundledPairTranscribesItsClipAsTheTargetAlone) {
    const std::string models = SPECULA_MODELS_DIR;
    const std::string target_path = models + "/specula-whisper-target.bin",
                      draft_path = models + "/specula-whisper-draft.bin",
                      clip = models + "/../audio/held-out-sentence.wav";
    std::vector<int32_t> tokens;
    std::ifstream list(models + "/specula-whisper-draft.tokens");
    for (int32_t id = 0; list >> id;)
        tokens.push_back(id);
    ASSERT_EQ(tokens.size(), 2048u);
    const std::vector<std::string> reference =
        transcript_words("Instances of the bytes type are immutable just as strings are.");
    for (specula_backend_kind kind : {SPECULA_BACKEND_CPU, SPECULA_BACKEND_VULKAN}) {
        specula_backend_params bp = specula_backend_default_params();
        bp.kind = kind;
        specula_backend* backend = nullptr;
        if (specula_backend_create(&bp, &backend) != SPECULA_OK) {
            std::cout << "skipped " << test::backend_name(kind) << ": " << specula_last_error()
                      << "\n";
            continue;
        }
        specula_asr_model *target = nullptr, *draft = nullptr;
        ASSERT_EQ(specula_asr_model_load(backend, target_path.c_str(), nullptr, &target),
                  SPECULA_OK)
            << specula_last_error();
        ASSERT_EQ(specula_asr_model_load(backend, draft_path.c_str(), nullptr, &draft), SPECULA_OK)
            << specula_last_error();
        specula_asr_context* ctx = nullptr;
        ASSERT_EQ(specula_asr_context_create(target, &ctx), SPECULA_OK);
        specula_asr_params p = specula_asr_default_params();
        p.temperature_increment = 0.0f;  // greedy only
        ASSERT_EQ(specula_asr_transcribe_file(ctx, clip.c_str(), &p), SPECULA_OK)
            << specula_last_error();
        const std::string alone = transcript(ctx);
        p.gamma_policy = SPECULA_GAMMA_FIXED;  // every step drafts: the most rows verified
        p.gamma = 4;
        // With `with` as the draft: the target's transcript, most drafts accepted.
        auto pair_is_the_target = [&](specula_asr_model* with, specula_asr_timings* t) {
            p.draft = with;
            ASSERT_EQ(specula_asr_transcribe_file(ctx, clip.c_str(), &p), SPECULA_OK)
                << specula_last_error();
            EXPECT_EQ(transcript(ctx), alone);
            ASSERT_EQ(specula_asr_get_timings(ctx, t), SPECULA_OK);
            EXPECT_GE(double(t->n_accepted), 0.6 * double(t->n_evaluated));
        };
        specula_asr_timings t{};
        pair_is_the_target(draft, &t);

        specula_asr_model* proposer = nullptr;
        ASSERT_EQ(specula_asr_draft_load(backend, draft_path.c_str(), nullptr, tokens.data(),
                                         tokens.size(), &proposer),
                  SPECULA_OK)
            << specula_last_error();
        specula_asr_model_info info{};
        ASSERT_EQ(specula_asr_model_get_info(proposer, &info), SPECULA_OK);
        EXPECT_LT(info.n_output_tokens, info.n_vocab / 10);
        specula_asr_timings restricted{};
        pair_is_the_target(proposer, &restricted);
        specula_asr_context* refused = nullptr;  // it proposes; it does not transcribe
        EXPECT_EQ(specula_asr_context_create(proposer, &refused), SPECULA_ERR_INVALID_ARGUMENT);
        EXPECT_EQ(refused, nullptr);
        specula_asr_model_free(proposer);
        const std::vector<std::string> heard = transcript_words(alone);
        size_t found = 0;
        for (const std::string& w : reference)
            found += std::find(heard.begin(), heard.end(), w) != heard.end();
        EXPECT_GE(found, 7u) << alone;
        std::cout << test::backend_name(kind) << ": \"" << alone << "\", accepted " << t.n_accepted
                  << " of " << t.n_evaluated << " judged drafts\n";
        specula_asr_context_free(ctx);
        specula_asr_model_free(draft);
        specula_asr_model_free(target);
        specula_backend_free(backend);
    }
}
