// Speech input (lib/audio): WAV decoding of every sample format against values written here,
// chunk walking and malformed files as status values; FLAC, Ogg and MP3 files that libsndfile
// writes here, decoded; resampling against tones, whole and streamed; voice detection.
#include <gtest/gtest.h>
#include <sndfile.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "audio/mel.h"
#include "audio/resample.h"
#include "audio/sound_file.h"
#include "audio/vad.h"
#include "audio/wav.h"
#include "core/thread_pool.h"

using namespace specula;
using specula::audio::decode_wav;
using specula::audio::Wav;

namespace {

void put(std::vector<uint8_t>& v, uint64_t x, int bytes) {
    for (int i = 0; i < bytes; ++i)
        v.push_back(uint8_t(x >> (8 * i)));
}
void put_tag(std::vector<uint8_t>& v, const char* tag) {
    v.insert(v.end(), tag, tag + 4);
}

struct Spec {
    uint16_t tag = 1;  // PCM; 3 float
    int channels = 1, rate = 16000, bits = 16;
    bool extensible = false, list_first = false, list_after = false;
};

// A WAV file holding `raw` (the samples' bytes, frames interleaved) after a LIST chunk of odd
// size where asked (chunks are padded to even sizes).
std::vector<uint8_t> make_wav(const Spec& s, const std::vector<uint8_t>& raw) {
    std::vector<uint8_t> v;
    put_tag(v, "RIFF");
    put(v, 0, 4);  // patched below
    put_tag(v, "WAVE");
    auto list = [&] {
        put_tag(v, "LIST");
        put(v, 5, 4);
        v.insert(v.end(), {'I', 'N', 'F', 'O', '!', 0});  // 5 bytes + pad
    };
    if (s.list_first) list();
    put_tag(v, "fmt ");
    put(v, s.extensible ? 40 : 16, 4);
    put(v, s.extensible ? 0xFFFE : s.tag, 2);
    put(v, uint64_t(s.channels), 2);
    put(v, uint64_t(s.rate), 4);
    put(v, uint64_t(s.rate * s.channels * s.bits / 8), 4);
    put(v, uint64_t(s.channels * s.bits / 8), 2);
    put(v, uint64_t(s.bits), 2);
    if (s.extensible) {
        put(v, 22, 2);
        put(v, uint64_t(s.bits), 2);
        put(v, 0, 4);
        put(v, s.tag, 2);  // sub-format GUID: the tag, then KSDATAFORMAT's fixed 14 bytes
        const uint8_t rest[14] = {0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80,
                                  0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71};
        v.insert(v.end(), rest, rest + 14);
    }
    put_tag(v, "data");
    put(v, raw.size(), 4);
    v.insert(v.end(), raw.begin(), raw.end());
    if (raw.size() & 1) v.push_back(0);
    if (s.list_after) list();
    const uint32_t riff = uint32_t(v.size() - 8);
    std::memcpy(v.data() + 4, &riff, 4);
    return v;
}

Wav decode_ok(const std::vector<uint8_t>& bytes) {
    Wav w;
    const Status s = decode_wav(bytes, &w);
    EXPECT_TRUE(s.ok()) << s.message();
    return w;
}

TEST(Wav, EveryIntegerWidthDecodesToItsValueOverFullScale) {
    const std::vector<int64_t> values = {0, 1, -1, 1000, -1000, 12345, -12345};
    for (int bits : {16, 24, 32}) {
        for (bool extensible : {false, true}) {
            std::vector<uint8_t> raw;
            for (int64_t x : values)
                put(raw, uint64_t(x), bits / 8);
            const std::vector<int64_t> edges = {(int64_t(1) << (bits - 1)) - 1,
                                                -(int64_t(1) << (bits - 1))};
            for (int64_t x : edges)
                put(raw, uint64_t(x), bits / 8);
            const Wav w = decode_ok(make_wav({.bits = bits, .extensible = extensible}, raw));
            ASSERT_EQ(w.mono.size(), values.size() + 2);
            EXPECT_EQ(w.bits, bits);
            EXPECT_FALSE(w.is_float);
            const double full = std::ldexp(1.0, bits - 1);
            for (size_t i = 0; i < values.size(); ++i)
                EXPECT_FLOAT_EQ(w.mono[i], float(double(values[i]) / full)) << bits << " " << i;
            EXPECT_EQ(w.mono[values.size()], float(double(edges[0]) / full));  // 1.0f at 32 bits
            EXPECT_EQ(w.mono[values.size() + 1], -1.0f);
        }
    }
    // 8-bit PCM is unsigned around 128.
    const Wav w8 = decode_ok(make_wav({.bits = 8}, {128, 0, 255, 192}));
    EXPECT_EQ(w8.mono, (std::vector<float>{0.0f, -1.0f, 127.0f / 128.0f, 0.5f}));
}

TEST(Wav, FloatSamplesAndStereoMixdown) {
    const std::vector<float> left = {0.5f, -0.25f, 1.0f}, right = {0.25f, 0.25f, -1.0f};
    std::vector<uint8_t> raw;
    for (size_t i = 0; i < left.size(); ++i)
        for (float x : {left[i], right[i]}) {
            uint32_t u;
            std::memcpy(&u, &x, 4);
            put(raw, u, 4);
        }
    for (bool extensible : {false, true}) {
        const Wav w = decode_ok(make_wav(
            {.tag = 3, .channels = 2, .rate = 44100, .bits = 32, .extensible = extensible}, raw));
        EXPECT_TRUE(w.is_float);
        EXPECT_EQ(w.channels, 2);
        EXPECT_EQ(w.sample_rate, 44100);
        EXPECT_EQ(w.mono, (std::vector<float>{0.375f, 0.0f, 0.0f}));
    }
}

TEST(Wav, ChunksBeforeAndAfterTheDataAreSkipped) {
    const std::vector<uint8_t> raw = {0x00, 0x40, 0x00, 0xC0, 0x01, 0x00};  // 0.5, -0.5, 1/32768
    for (bool first : {false, true})
        for (bool after : {false, true}) {
            const Wav w = decode_ok(make_wav({.list_first = first, .list_after = after}, raw));
            EXPECT_EQ(w.mono, (std::vector<float>{0.5f, -0.5f, 1.0f / 32768.0f}));
        }
}

// Every prefix of a file decodes to a status, never a crash (ASan watches the reads): cut
// inside the samples it is the whole frames before the cut, cut earlier it is FORMAT.
TEST(Wav, EveryTruncationIsAStatusOrTheWholeFramesBeforeIt) {
    std::vector<uint8_t> raw;
    for (int i = 0; i < 50; ++i)
        put(raw, uint64_t(i * 37), 3);  // 24-bit stereo: 6-byte frames
    const std::vector<uint8_t> full =
        make_wav({.channels = 2, .bits = 24, .list_first = true}, raw);
    const size_t data_start = full.size() - raw.size();
    for (size_t n = 0; n < full.size(); ++n) {
        Wav w;
        const std::vector<uint8_t> prefix(full.begin(), full.begin() + std::ptrdiff_t(n));
        const Status s = decode_wav(prefix, &w);
        if (n >= data_start) {
            ASSERT_TRUE(s.ok()) << n << ": " << s.message();
            EXPECT_EQ(w.mono.size(), (n - data_start) / 6) << n;
        } else {
            EXPECT_EQ(s.code(), SPECULA_ERR_FORMAT) << n;
            EXPECT_NE(s.message().find("WAV file at byte"), std::string::npos) << s.message();
        }
    }
}

TEST(Wav, MalformedAndUnsupportedFilesAreStatuses) {
    const std::vector<uint8_t> raw = {1, 0, 2, 0};
    const std::vector<uint8_t> good = make_wav({}, raw);
    auto code_of = [](const std::vector<uint8_t>& bytes) {
        Wav w;
        return decode_wav(bytes, &w).code();
    };
    auto patched = [&](size_t at, std::vector<uint8_t> with) {
        std::vector<uint8_t> v = good;
        std::copy(with.begin(), with.end(), v.begin() + std::ptrdiff_t(at));
        return v;
    };
    EXPECT_EQ(code_of(good), SPECULA_OK);
    EXPECT_EQ(code_of(patched(0, {'R', 'I', 'F', 'X'})), SPECULA_ERR_FORMAT);
    EXPECT_EQ(code_of(patched(8, {'A', 'V', 'I', ' '})), SPECULA_ERR_FORMAT);
    EXPECT_EQ(code_of(patched(20, {2, 0})), SPECULA_ERR_UNSUPPORTED);               // MS ADPCM
    EXPECT_EQ(code_of(patched(34, {12, 0})), SPECULA_ERR_UNSUPPORTED);              // 12-bit PCM
    EXPECT_EQ(code_of(patched(22, {0, 0})), SPECULA_ERR_FORMAT);                    // no channels
    EXPECT_EQ(code_of(patched(24, {0, 0, 0, 0})), SPECULA_ERR_FORMAT);              // 0 Hz
    EXPECT_EQ(code_of(patched(32, {3, 0})), SPECULA_ERR_FORMAT);                    // block align
    EXPECT_EQ(code_of(patched(16, {0xFF, 0xFF, 0xFF, 0x7F})), SPECULA_ERR_FORMAT);  // fmt size
    EXPECT_EQ(code_of(patched(12, {'d', 'a', 't', 'a'})), SPECULA_ERR_FORMAT);  // data before fmt
    EXPECT_EQ(code_of(patched(36, {'j', 'u', 'n', 'k'})), SPECULA_ERR_FORMAT);  // no data chunk
    // A data chunk of unknown size (streaming writers) is read to the end of the file.
    const Wav w = decode_ok(patched(40, {0xFF, 0xFF, 0xFF, 0xFF}));
    EXPECT_EQ(w.mono.size(), 2u);
}

// whisper.cpp's sample clip where the shared data is present: 16 kHz mono 16-bit PCM with a
// LIST chunk before its data.
TEST(Wav, TheJfkClip) {
    const std::filesystem::path path = SPECULA_SHARED_DATA_DIR "/audio/jfk.wav";
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not here";
    std::ifstream f(path, std::ios::binary);
    const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(f), {}};
    const Wav w = decode_ok(bytes);
    EXPECT_EQ(w.sample_rate, 16000);
    EXPECT_EQ(w.channels, 1);
    EXPECT_EQ(w.bits, 16);
    EXPECT_EQ(w.mono.size(), 176000u);  // 11 s
    float peak = 0.0f;
    for (float x : w.mono)
        peak = std::max(peak, std::fabs(x));
    EXPECT_GT(peak, 0.1f);
    EXPECT_LE(peak, 1.0f);
}

std::vector<float> tone(double hz, int rate, double seconds, double amplitude = 0.5) {
    std::vector<float> v(size_t(seconds * rate));
    for (size_t i = 0; i < v.size(); ++i)
        v[i] = float(amplitude * std::sin(2.0 * M_PI * hz * double(i) / rate));
    return v;
}

// The largest difference from a reference over the middle of a signal (a sinc filter's edges
// see the silence around the signal).
double middle_error(const std::vector<float>& got, const std::vector<float>& want) {
    double worst = 0;
    const size_t n = std::min(got.size(), want.size());
    for (size_t i = n / 10; i < n - n / 10; ++i)
        worst = std::max(worst, std::abs(double(got[i]) - double(want[i])));
    return worst;
}

TEST(Resample, ToneKeepsItsShapeAtTheNewRate) {
    for (int from : {44100, 48000, 22050, 8000, 11025}) {
        std::vector<float> out;
        ASSERT_TRUE(audio::resample(tone(440.0, from, 1.0), from, 16000, &out).ok());
        EXPECT_NEAR(double(out.size()), 16000.0, 1.0) << from << " Hz";
        EXPECT_LT(middle_error(out, tone(440.0, 16000, 1.0)), 2e-3) << from << " Hz";
    }
}

TEST(Resample, FrequenciesAboveTheNewNyquistAreRemovedNotFolded) {
    // 12 kHz at 48 kHz is above 16 kHz's Nyquist frequency (8 kHz): without the anti-aliasing
    // filter it would fold to a 4 kHz tone of the same amplitude.
    std::vector<float> out;
    ASSERT_TRUE(audio::resample(tone(12000.0, 48000, 1.0), 48000, 16000, &out).ok());
    const std::vector<float> silence(out.size(), 0.0f);
    EXPECT_LT(middle_error(out, silence), 1e-3);
}

TEST(Resample, SameRateCopiesAndBadRatesAreStatuses) {
    const std::vector<float> in = tone(300.0, 16000, 0.1);
    std::vector<float> out;
    ASSERT_TRUE(audio::resample(in, 16000, 16000, &out).ok());
    EXPECT_EQ(out, in);
    ASSERT_TRUE(audio::resample({}, 44100, 16000, &out).ok());
    EXPECT_TRUE(out.empty());
    for (auto [from, to] :
         {std::pair{0, 16000}, {-8000, 16000}, {16000, 0}, {16000 * 300, 16000}}) {
        const Status s = audio::resample(in, from, to, &out);
        EXPECT_EQ(s.code(), SPECULA_ERR_INVALID_ARGUMENT) << from << " -> " << to;
    }
}

TEST(Resample, AStreamInPiecesGivesTheWholeConversion) {
    const std::vector<float> in = tone(440.0, 44100, 1.0);
    std::vector<float> whole;
    ASSERT_TRUE(audio::resample(in, 44100, 16000, &whole).ok());
    std::unique_ptr<audio::StreamResampler> r;
    ASSERT_TRUE(audio::StreamResampler::create(44100, 16000, &r).ok());
    std::vector<float> streamed;
    // Pieces of awkward sizes, one of them empty.
    for (size_t at = 0, piece = 1; at < in.size(); at += piece, piece = piece * 7 % 1013)
        ASSERT_TRUE(
            r->push(std::span(in).subspan(at, std::min(piece, in.size() - at)), false, &streamed)
                .ok());
    ASSERT_TRUE(r->push({}, true, &streamed).ok());
    EXPECT_NEAR(double(streamed.size()), double(whole.size()), 2.0);
    EXPECT_LT(middle_error(streamed, whole), 1e-4);
    std::unique_ptr<audio::StreamResampler> bad;
    EXPECT_EQ(audio::StreamResampler::create(0, 16000, &bad).code(), SPECULA_ERR_INVALID_ARGUMENT);
}

std::vector<float> bundled_clip() {
    std::ifstream f(SPECULA_MODELS_DIR "/../audio/held-out-sentence.wav", std::ios::binary);
    const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(f), {}};
    Wav w;
    EXPECT_TRUE(decode_wav(bytes, &w).ok());
    return w.mono;
}

TEST(VoiceDetector, HearsTheSentenceAndNotSilenceOrHum) {
    const std::vector<float> clip = bundled_clip();
    ASSERT_GT(clip.size(), 16000u);
    const auto voiced_share = [](const std::vector<float>& x, int aggressiveness) {
        std::unique_ptr<audio::VoiceDetector> v;
        EXPECT_TRUE(audio::VoiceDetector::create(aggressiveness, &v).ok());
        int voiced = 0, frames = 0;
        for (size_t at = 0; at + 160 <= x.size(); at += 160, ++frames) {
            bool b = false;
            EXPECT_TRUE(v->voiced(std::span<const float, 160>(x.data() + at, 160), &b).ok());
            voiced += b;
        }
        return double(voiced) / frames;
    };
    for (int a = 0; a <= 3; ++a) {
        EXPECT_GT(voiced_share(clip, a), 0.6) << a;
        EXPECT_EQ(voiced_share(std::vector<float>(32000, 0.0f), a), 0.0) << a;
        // A steady 50 Hz hum is not a voice.
        EXPECT_LT(voiced_share(tone(50.0, 16000, 2.0, 0.05), a), 0.1) << a;
    }
    std::unique_ptr<audio::VoiceDetector> v;
    EXPECT_EQ(audio::VoiceDetector::create(4, &v).code(), SPECULA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(audio::VoiceDetector::create(-1, &v).code(), SPECULA_ERR_INVALID_ARGUMENT);
}

// The bundled clip written by libsndfile in `format` (a temporary file's bytes).
std::vector<uint8_t> encoded_clip(int format, const std::string& name) {
    const std::vector<float> clip = bundled_clip();
    std::filesystem::create_directories(SPECULA_TEST_TMP_DIR);
    const std::string path = std::string(SPECULA_TEST_TMP_DIR) + "/" + name;
    SF_INFO info{};
    info.samplerate = 16000;
    info.channels = 1;
    info.format = format;
    SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
    if (f == nullptr) {
        ADD_FAILURE() << name << ": " << sf_strerror(nullptr);
        return {};
    }
    EXPECT_EQ(sf_writef_float(f, clip.data(), sf_count_t(clip.size())), sf_count_t(clip.size()));
    sf_close(f);
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

// Correlation of two signals over their common length (1: the same shape).
double correlation(const std::vector<float>& a, const std::vector<float>& b, size_t shift) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i + shift < b.size() && i < a.size(); ++i) {
        ab += double(a[i]) * b[i + shift];
        aa += double(a[i]) * a[i];
        bb += double(b[i + shift]) * b[i + shift];
    }
    return ab / std::sqrt(aa * bb + 1e-30);
}

TEST(SoundFile, FlacOggAndMp3DecodeToTheClip) {
    const std::vector<float> clip = bundled_clip();
    struct Case {
        int format;
        const char* name;
        bool lossless;
    };
    for (const Case& c : {Case{SF_FORMAT_FLAC | SF_FORMAT_PCM_16, "clip.flac", true},
                          Case{SF_FORMAT_OGG | SF_FORMAT_VORBIS, "clip.ogg", false},
                          Case{SF_FORMAT_OGG | SF_FORMAT_OPUS, "clip.opus", false},
                          Case{SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III, "clip.mp3", false}}) {
        const std::vector<uint8_t> bytes = encoded_clip(c.format, c.name);
        ASSERT_FALSE(bytes.empty()) << c.name;
        Wav w;
        const Status s = audio::decode_audio(bytes, &w);
        ASSERT_TRUE(s.ok()) << c.name << ": " << s.message();
        EXPECT_EQ(w.channels, 1) << c.name;
        std::vector<float> at16k;
        ASSERT_TRUE(audio::resample(w.mono, w.sample_rate, 16000, &at16k).ok());
        if (c.lossless) {
            ASSERT_EQ(at16k.size(), clip.size());
            for (size_t i = 0; i < clip.size(); ++i)
                ASSERT_NEAR(at16k[i], clip[i], 1.0f / 32768) << i;
            continue;
        }
        // A lossy decoder delays the signal by its frame overlap (MP3 ~1105 samples, Opus 312):
        // the best alignment within 100 ms keeps the waveform's shape.
        double best = 0;
        for (size_t shift = 0; shift < 1600; ++shift)
            best = std::max(best, correlation(clip, at16k, shift));
        EXPECT_GT(best, 0.9) << c.name;
        EXPECT_NEAR(double(at16k.size()), double(clip.size()), 4000.0) << c.name;
    }
}

TEST(SoundFile, TruncatedAndForeignBytesAreStatuses) {
    const std::vector<uint8_t> flac = encoded_clip(SF_FORMAT_FLAC | SF_FORMAT_PCM_16, "cut.flac");
    ASSERT_GT(flac.size(), 1000u);
    // Every cut is a status or the frames before it, never a crash (the sanitizer build).
    for (size_t n : {size_t(0), size_t(3), size_t(4), size_t(40), size_t(200), flac.size() / 2,
                     flac.size() - 1}) {
        Wav w;
        const Status s = audio::decode_audio(std::span(flac).first(n), &w);
        if (s.ok())
            EXPECT_LT(w.mono.size(), bundled_clip().size()) << n;
        else
            EXPECT_EQ(s.code(), SPECULA_ERR_FORMAT) << n << ": " << s.message();
    }
    const std::string text = "this is a text file, not a sound";
    Wav w;
    const Status s = audio::decode_audio(
        std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()), &w);
    EXPECT_EQ(s.code(), SPECULA_ERR_FORMAT);
    EXPECT_NE(s.message().find("libsndfile"), std::string::npos) << s.message();
}

// Filters that pass one frequency bin each: band m of the log-mel is bin m's power.
audio::MelFilters one_bin_per_band() {
    audio::MelFilters f;
    f.n_mel = audio::kWhisperFftBins;
    f.weights.assign(size_t(f.n_mel) * audio::kWhisperFftBins, 0.0f);
    for (int m = 0; m < f.n_mel; ++m)
        f.weights[size_t(m) * audio::kWhisperFftBins + size_t(m)] = 1.0f;
    return f;
}

TEST(LogMel, AToneOnABinHasItsPowerThereAndSilenceTheFloor) {
    // 2000 Hz is bin 50 of a 400-point transform at 16 kHz. A Hann-windowed sinusoid of
    // amplitude A on a bin has |X| = A * sum(window) / 2 = 100 A there.
    // A phase of 0.7 rad puts power in both the real and the imaginary part.
    const double amplitude = 0.5;
    std::vector<float> x(16000);
    for (size_t i = 0; i < x.size(); ++i)
        x[i] = float(amplitude * std::sin(2.0 * M_PI * 2000.0 * double(i) / 16000 + 0.7));
    audio::LogMel mel;
    ASSERT_TRUE(audio::log_mel(x, one_bin_per_band(), &mel).ok());
    ASSERT_EQ(mel.n_mel, audio::kWhisperFftBins);
    ASSERT_EQ(mel.n_frames, (16000 + audio::kWhisperChunkSamples) / audio::kWhisperHop);
    const auto at = [&](int band, int frame) {
        return mel.data[size_t(band) * size_t(mel.n_frames) + size_t(frame)];
    };
    const double top = std::log10(100.0 * amplitude * 100.0 * amplitude);
    for (int frame : {10, 50, 90}) {
        int loudest = 0;
        for (int m = 1; m < mel.n_mel; ++m)
            if (at(m, frame) > at(loudest, frame)) loudest = m;
        EXPECT_EQ(loudest, 50) << "frame " << frame;
        EXPECT_NEAR(at(50, frame), (top + 4.0) / 4.0, 1e-4) << "frame " << frame;
        EXPECT_LT(at(150, frame), at(50, frame) - 1.0);  // far bins: the window's side lobes
    }
    // Frames of the appended silence sit at the clamp, (max - 8 + 4) / 4.
    for (int m : {0, 50, 200})
        EXPECT_NEAR(at(m, mel.n_frames - 1), (top - 8.0 + 4.0) / 4.0, 1e-4);
}

TEST(LogMel, ThreadsShareTheFramesAndGiveTheSameValues) {
    // Noise that grows louder to the end: the loudest frame, which sets the clamp of every
    // value, is in the last chunk.
    std::vector<float> x(7 * 16000 + 4321);
    uint32_t state = 12345;
    for (size_t i = 0; i < x.size(); ++i) {
        state = state * 1664525u + 1013904223u;
        x[i] = float(double(i) / double(x.size())) * (float(state >> 8) / float(1 << 24) - 0.5f);
    }
    audio::LogMel one, many;
    ASSERT_TRUE(audio::log_mel(x, one_bin_per_band(), &one).ok());
    for (int threads : {2, 3, 8}) {
        ThreadPool pool(threads);
        size_t calls = 0;
        const audio::ParallelFor parallel_for = [&](size_t n, const auto& fn) {
            calls += n;
            pool.parallel_for(n, fn);
        };
        ASSERT_TRUE(audio::log_mel(x, one_bin_per_band(), &many, parallel_for).ok());
        EXPECT_GT(calls, 1u);
        ASSERT_EQ(many.n_frames, one.n_frames);
        ASSERT_EQ(many.data, one.data) << threads << " threads";
    }
}

TEST(LogMel, BadFiltersAndSamplesAreStatuses) {
    std::vector<float> x = tone(440.0, 16000, 0.1);
    audio::LogMel mel;
    audio::MelFilters filters = one_bin_per_band();
    filters.weights.pop_back();
    EXPECT_EQ(audio::log_mel(x, filters, &mel).code(), SPECULA_ERR_INVALID_ARGUMENT);
    filters = one_bin_per_band();
    filters.n_mel = 0;
    EXPECT_EQ(audio::log_mel(x, filters, &mel).code(), SPECULA_ERR_INVALID_ARGUMENT);
    x[17] = std::nanf("");
    EXPECT_EQ(audio::log_mel(x, one_bin_per_band(), &mel).code(), SPECULA_ERR_INVALID_ARGUMENT);
    x[17] = INFINITY;
    EXPECT_EQ(audio::log_mel(x, one_bin_per_band(), &mel).code(), SPECULA_ERR_INVALID_ARGUMENT);
    // No audio at all is 30 s of silence: every value at the floor's clamp.
    ASSERT_TRUE(audio::log_mel({}, one_bin_per_band(), &mel).ok());
    EXPECT_EQ(mel.n_frames, audio::kWhisperChunkFrames);
    for (float v : mel.data)
        ASSERT_EQ(v, mel.data[0]);
}

}  // namespace
