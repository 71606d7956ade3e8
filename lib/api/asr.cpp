// The C ABI of speech recognition: Whisper models, transcription contexts, segments.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "api/internal.h"
#include "asr/stream.h"
#include "asr/transcribe.h"
#include "audio/resample.h"
#include "audio/sound_file.h"
#include "format/gguf.h"
#include "models/registry.h"
#include "models/whisper.h"

using namespace specula;
using namespace specula::api;

struct specula_asr_model {
    std::unique_ptr<WhisperModel> impl;
    specula_backend* backend = nullptr;
};

struct specula_asr_context {
    specula_asr_model* model = nullptr;
    std::unique_ptr<WhisperContext> impl;
    specula_asr_model* draft = nullptr;  // the model of draft_impl
    std::unique_ptr<WhisperContext> draft_impl;
    PairMeasurements measured;  // of the target and draft_impl
    std::vector<asr::Segment> segments;
    specula_asr_timings timings{};
    int streams = 0;  // open over it (they decode with impl: no batch transcription meanwhile)
};

struct specula_asr_stream {
    specula_asr_context* ctx = nullptr;
    std::unique_ptr<asr::Stream> impl;
};

namespace {

// The batch parameters as the transcription loop takes them (callbacks aside), checked.
Status transcribe_params(const specula_asr_context* ctx, const specula_asr_params& p,
                         asr::TranscribeParams* out) {
    asr::TranscribeParams t;
    const std::string language = p.language ? p.language : "en";
    const WhisperTokens& tokens = ctx->model->impl->tokens();
    if (language == "auto") {
        if (!tokens.multilingual)
            return InvalidArgument("an English-only model cannot detect the language");
        t.language = -1;
    } else {
        t.language = whisper_language_index(language);
        if (t.language < 0) return InvalidArgument("unknown language '" + language + "'");
    }
    for (float v : {p.temperature, p.temperature_increment, p.entropy_threshold,
                    p.logprob_threshold, p.no_speech_threshold})
        if (!std::isfinite(v)) return InvalidArgument("a threshold or temperature is not finite");
    if (p.temperature < 0 || p.temperature > 1)
        return InvalidArgument("temperature must be within 0 .. 1");
    if (p.draft != nullptr) {
        Generator::Config g;
        // Greedy or sampled with the coupled acceptance, the transcript is the same at every γ.
        SPECULA_TRY(gamma_settings(p.gamma_policy, p.gamma, p.gamma_max, true, &g));
        if (p.draft->backend != ctx->model->backend)
            return InvalidArgument("the draft is loaded on another backend than the target");
        t.gamma_policy = g.policy;
        t.gamma = g.gamma;
        t.gamma_max = g.gamma_max;
    }
    t.translate = p.translate;
    t.timestamps = p.timestamps;
    t.condition_on_previous_text = p.condition_on_previous_text;
    t.temperature = p.temperature;
    t.temperature_increment = p.temperature_increment;
    t.entropy_threshold = p.entropy_threshold;
    t.logprob_threshold = p.logprob_threshold;
    t.no_speech_threshold = p.no_speech_threshold;
    t.seed = p.seed;
    *out = std::move(t);
    return Status::Ok();
}

// The draft's context and measurements for `draft` (made once per draft, kept between
// transcriptions), set in `t`. Called with the backend's turn held.
Status use_draft(specula_asr_context* ctx, specula_asr_model* draft, asr::TranscribeParams* t) {
    if (draft != nullptr && draft != ctx->draft) {
        ctx->draft_impl.reset();
        ctx->draft = nullptr;
        ctx->measured = {};
        SPECULA_TRY(WhisperContext::create(*draft->impl, 1, &ctx->draft_impl));
        ctx->draft = draft;
    }
    t->draft = draft != nullptr ? ctx->draft_impl.get() : nullptr;
    t->measurements = draft != nullptr ? &ctx->measured : nullptr;
    return Status::Ok();
}

void copy_timings(const asr::TranscribeStats& stats, double audio_seconds, double read_seconds,
                  specula_asr_timings* out) {
    specula_asr_timings tm{};
    tm.audio_seconds = audio_seconds;
    tm.mel_seconds = read_seconds + stats.mel_seconds;
    tm.encode_seconds = stats.encode_seconds;
    tm.decode_seconds = stats.decode_seconds;
    tm.windows = stats.windows;
    tm.fallbacks = stats.fallbacks;
    tm.tokens = stats.tokens;
    const GeneratorStats& g = stats.decoding;
    tm.n_steps = g.steps;
    tm.n_emitted = g.emitted;
    tm.n_drafted = g.drafted;
    tm.n_evaluated = g.evaluated;
    tm.n_accepted = g.accepted;
    tm.draft_seconds = g.draft_seconds;
    tm.target_seconds = g.target_seconds;
    tm.verify_seconds = g.verify_seconds;
    if (stats.language >= 0)
        copy_string(tm.language, std::string(kWhisperLanguages[size_t(stats.language)]));
    *out = tm;
}

Status transcribe(specula_asr_context* ctx, std::span<const float> samples,
                  const specula_asr_params& p, double read_seconds) {
    if (ctx->streams > 0)
        return InvalidArgument("a stream is open over this context: transcribe after freeing it");
    asr::TranscribeParams t;
    SPECULA_TRY(transcribe_params(ctx, p, &t));
    if (p.on_segment != nullptr)
        t.on_segment = [&p](const asr::Segment& s) {
            const specula_asr_segment out{s.t0_ms, s.t1_ms, s.text.c_str()};
            p.on_segment(&out, p.segment_user_data);
        };
    if (p.progress != nullptr)
        t.progress = [&p](float f) { return p.progress(f, p.progress_user_data); };

    ctx->segments.clear();
    ctx->timings = {};
    asr::TranscribeStats stats;
    std::lock_guard turn(ctx->model->backend->turn);
    SPECULA_TRY(use_draft(ctx, p.draft, &t));
    const Status s = asr::transcribe(*ctx->impl, samples, t, &ctx->segments, &stats);
    copy_timings(stats, double(samples.size()) / audio::kWhisperSampleRate, read_seconds,
                 &ctx->timings);
    return s;
}

// An audio file's bytes (`name` for the messages), decoded, resampled and transcribed.
Status transcribe_bytes(specula_asr_context* ctx, std::span<const uint8_t> bytes,
                        const std::string& name, const specula_asr_params& p,
                        Clock::time_point t0) {
    audio::Wav wav;
    Status s = audio::decode_audio(bytes, &wav);
    if (!s.ok()) return Status(s.code(), name + ": " + s.message());
    std::vector<float> samples;
    SPECULA_TRY(audio::resample(wav.mono, wav.sample_rate, audio::kWhisperSampleRate, &samples));
    return transcribe(ctx, samples, p, seconds_since(t0));
}

}  // namespace

extern "C" {

namespace {

// specula_asr_model_load, and with output tokens given, specula_asr_draft_load.
specula_status load_asr_model(specula_backend* backend, const char* path,
                              const specula_model_params* params, const int32_t* tokens,
                              size_t n_tokens, specula_asr_model** out) {
    return guarded([&] {
        SPECULA_TRY(need(out, "out"));
        *out = nullptr;
        SPECULA_TRY(need(backend, "backend"));
        SPECULA_TRY(need(path, "path"));
        if (n_tokens > 0) SPECULA_TRY(need(tokens, "tokens"));
        const specula_model_params p = params ? *params : specula_model_params{};
        std::unique_ptr<MappedFile> file;
        SPECULA_TRY(MappedFile::open(path, &file, p.read_into_memory));
        ModelIdentity identity;
        const Status kind = expect_model(file->bytes(), ModelKind::kSpeech, &identity);
        if (!kind.ok()) return Status(kind.code(), std::string(path) + ": " + kind.message());
        WhisperModel::Progress progress;
        if (p.progress != nullptr)
            progress = [&p](float f) { return p.progress(f, p.progress_user_data); };
        auto m = std::make_unique<specula_asr_model>();
        m->backend = backend;
        std::lock_guard turn(backend->turn);
        Status s = WhisperModel::load(*backend->impl, std::move(file), progress, &m->impl);
        if (s.ok() && n_tokens > 0) s = m->impl->restrict_output(std::span(tokens, n_tokens));
        if (!s.ok()) return Status(s.code(), std::string(path) + ": " + s.message());
        *out = m.release();
        return Status::Ok();
    });
}

}  // namespace

specula_status specula_asr_model_load(specula_backend* backend, const char* path,
                                      const specula_model_params* params, specula_asr_model** out) {
    return load_asr_model(backend, path, params, nullptr, 0, out);
}

specula_status specula_asr_draft_load(specula_backend* backend, const char* path,
                                      const specula_model_params* params, const int32_t* tokens,
                                      size_t n_tokens, specula_asr_model** out) {
    return load_asr_model(backend, path, params, tokens, n_tokens, out);
}

void specula_asr_model_free(specula_asr_model* model) {
    if (model == nullptr) return;
    std::lock_guard turn(model->backend->turn);
    delete model;
}

specula_status specula_asr_model_get_info(const specula_asr_model* model,
                                          specula_asr_model_info* info) {
    return guarded([&] {
        SPECULA_TRY(need(model, "model"));
        SPECULA_TRY(need(info, "info"));
        const WhisperHparams& h = model->impl->hparams();
        *info = specula_asr_model_info{h.n_vocab,
                                       h.n_audio_ctx,
                                       h.n_audio_layer,
                                       h.n_text_ctx,
                                       h.n_text_layer,
                                       h.n_audio_state,
                                       h.n_mels,
                                       model->impl->tokens().multilingual,
                                       model->impl->n_params(),
                                       specula_weight_type(model->impl->weight_type()),
                                       model->impl->output_rows()};
        return Status::Ok();
    });
}

specula_asr_params specula_asr_default_params(void) {
    specula_asr_params p{};
    p.language = "en";
    p.timestamps = true;
    p.condition_on_previous_text = true;
    p.temperature_increment = 0.2f;
    p.entropy_threshold = 2.4f;
    p.logprob_threshold = -1.0f;
    p.no_speech_threshold = 0.6f;
    p.gamma_policy = SPECULA_GAMMA_AUTO;
    p.gamma = 4;
    p.gamma_max = 8;
    return p;
}

void specula_asr_default_params_by_ref(specula_asr_params* params) {
    if (params != nullptr) *params = specula_asr_default_params();
}

specula_status specula_asr_context_create(specula_asr_model* model, specula_asr_context** out) {
    return guarded([&] {
        SPECULA_TRY(need(out, "out"));
        *out = nullptr;
        SPECULA_TRY(need(model, "model"));
        SPECULA_TRY(model->impl->check_target());
        auto c = std::make_unique<specula_asr_context>();
        c->model = model;
        std::lock_guard turn(model->backend->turn);
        // Logits for a verification's rows: a draft may come with any transcription.
        SPECULA_TRY(WhisperContext::create(*model->impl, kMaxGamma + 1, &c->impl));
        // A target's encoder, uploaded now rather than by the first transcription.
        SPECULA_TRY(model->impl->load_encoder());
        *out = c.release();
        return Status::Ok();
    });
}

void specula_asr_context_free(specula_asr_context* ctx) {
    if (ctx == nullptr) return;
    std::lock_guard turn(ctx->model->backend->turn);
    delete ctx;
}

specula_status specula_asr_transcribe(specula_asr_context* ctx, const float* samples,
                                      size_t n_samples, const specula_asr_params* params) {
    return guarded([&] {
        SPECULA_TRY(need(ctx, "ctx"));
        if (n_samples > 0) SPECULA_TRY(need(samples, "samples"));
        const specula_asr_params p = params ? *params : specula_asr_default_params();
        return transcribe(ctx, std::span(samples, n_samples), p, 0.0);
    });
}

specula_status specula_asr_transcribe_file(specula_asr_context* ctx, const char* path,
                                           const specula_asr_params* params) {
    return guarded([&] {
        SPECULA_TRY(need(ctx, "ctx"));
        SPECULA_TRY(need(path, "path"));
        const specula_asr_params p = params ? *params : specula_asr_default_params();
        const auto t0 = Clock::now();
        std::unique_ptr<MappedFile> file;
        SPECULA_TRY(MappedFile::open(path, &file, true));
        return transcribe_bytes(ctx, file->bytes(), path, p, t0);
    });
}

specula_status specula_asr_transcribe_memory(specula_asr_context* ctx, const void* data,
                                             size_t size, const specula_asr_params* params) {
    return guarded([&] {
        SPECULA_TRY(need(ctx, "ctx"));
        if (data == nullptr && size > 0) return InvalidArgument("data is NULL");
        const specula_asr_params p = params ? *params : specula_asr_default_params();
        const auto t0 = Clock::now();
        return transcribe_bytes(ctx, {static_cast<const uint8_t*>(data), size}, "the audio data", p,
                                t0);
    });
}

size_t specula_asr_segment_count(const specula_asr_context* ctx) {
    return ctx ? ctx->segments.size() : 0;
}

specula_status specula_asr_get_segment(const specula_asr_context* ctx, size_t i,
                                       specula_asr_segment* segment) {
    return guarded([&] {
        SPECULA_TRY(need(ctx, "ctx"));
        SPECULA_TRY(need(segment, "segment"));
        if (i >= ctx->segments.size())
            return InvalidArgument("segment " + std::to_string(i) + " of " +
                                   std::to_string(ctx->segments.size()));
        const asr::Segment& s = ctx->segments[i];
        *segment = {s.t0_ms, s.t1_ms, s.text.c_str()};
        return Status::Ok();
    });
}

specula_status specula_asr_get_timings(const specula_asr_context* ctx,
                                       specula_asr_timings* timings) {
    return guarded([&] {
        SPECULA_TRY(need(ctx, "ctx"));
        SPECULA_TRY(need(timings, "timings"));
        *timings = ctx->timings;
        return Status::Ok();
    });
}

specula_status specula_audio_load(const char* path, float** samples, size_t* n_samples,
                                  int32_t* sample_rate) {
    return guarded([&] {
        SPECULA_TRY(need(samples, "samples"));
        *samples = nullptr;
        SPECULA_TRY(need(n_samples, "n_samples"));
        SPECULA_TRY(need(sample_rate, "sample_rate"));
        SPECULA_TRY(need(path, "path"));
        std::unique_ptr<MappedFile> file;
        SPECULA_TRY(MappedFile::open(path, &file, true));
        audio::Wav wav;
        const Status s = audio::decode_audio(file->bytes(), &wav);
        if (!s.ok()) return Status(s.code(), std::string(path) + ": " + s.message());
        auto* out = static_cast<float*>(std::malloc(std::max<size_t>(1, wav.mono.size()) * 4));
        if (out == nullptr) return OutOfMemory("the samples of " + std::string(path));
        std::copy(wav.mono.begin(), wav.mono.end(), out);
        *samples = out;
        *n_samples = wav.mono.size();
        *sample_rate = wav.sample_rate;
        return Status::Ok();
    });
}

void specula_audio_free(float* samples) {
    std::free(samples);
}

specula_asr_stream_params specula_asr_stream_default_params(void) {
    specula_asr_stream_params p{};
    p.asr = specula_asr_default_params();
    const asr::StreamParams d;
    p.vad_aggressiveness = d.vad_aggressiveness;
    p.step_ms = d.step_ms;
    p.end_silence_ms = d.end_silence_ms;
    p.pre_roll_ms = d.pre_roll_ms;
    p.max_utterance_ms = d.max_utterance_ms;
    return p;
}

void specula_asr_stream_default_params_by_ref(specula_asr_stream_params* params) {
    if (params != nullptr) *params = specula_asr_stream_default_params();
}

specula_status specula_asr_stream_create(specula_asr_context* ctx,
                                         const specula_asr_stream_params* params,
                                         specula_asr_stream** out) {
    return guarded([&] {
        SPECULA_TRY(need(out, "out"));
        *out = nullptr;
        SPECULA_TRY(need(ctx, "ctx"));
        // Its decodings and its draft's caches are the context's: one stream at a time.
        if (ctx->streams > 0) return InvalidArgument("a stream is already open over this context");
        const specula_asr_stream_params p = params ? *params : specula_asr_stream_default_params();
        asr::StreamParams sp;
        SPECULA_TRY(transcribe_params(ctx, p.asr, &sp.transcribe));
        sp.vad_aggressiveness = p.vad_aggressiveness;
        sp.step_ms = p.step_ms;
        sp.end_silence_ms = p.end_silence_ms;
        sp.pre_roll_ms = p.pre_roll_ms;
        sp.max_utterance_ms = p.max_utterance_ms;
        if (p.on_event != nullptr)
            sp.on_event = [fn = p.on_event, user = p.event_user_data](const asr::StreamEvent& e) {
                const specula_asr_stream_event out{e.final, e.t0_ms, e.t1_ms, e.text.c_str(),
                                                   e.stable_bytes};
                fn(&out, user);
            };
        auto s = std::make_unique<specula_asr_stream>();
        s->ctx = ctx;
        std::lock_guard turn(ctx->model->backend->turn);
        SPECULA_TRY(use_draft(ctx, p.asr.draft, &sp.transcribe));
        SPECULA_TRY(asr::Stream::create(*ctx->impl, sp, &s->impl));
        ++ctx->streams;
        *out = s.release();
        return Status::Ok();
    });
}

specula_status specula_asr_stream_push(specula_asr_stream* stream, const float* samples,
                                       size_t n_samples, int32_t sample_rate) {
    return guarded([&] {
        SPECULA_TRY(need(stream, "stream"));
        if (n_samples > 0) SPECULA_TRY(need(samples, "samples"));
        std::lock_guard turn(stream->ctx->model->backend->turn);
        return stream->impl->push(std::span(samples, n_samples), sample_rate);
    });
}

specula_status specula_asr_stream_push_pcm16(specula_asr_stream* stream, const void* data,
                                             size_t n_bytes, int32_t sample_rate) {
    return guarded([&] {
        SPECULA_TRY(need(stream, "stream"));
        if (n_bytes > 0) SPECULA_TRY(need(data, "data"));
        if (n_bytes % 2 != 0)
            return InvalidArgument("an odd byte count (" + std::to_string(n_bytes) +
                                   ") is not whole 16-bit samples: keep the last byte for the "
                                   "next push");
        const auto* bytes = static_cast<const uint8_t*>(data);
        std::vector<float> samples(n_bytes / 2);
        for (size_t i = 0; i < samples.size(); ++i)
            samples[i] =
                float(int16_t(uint16_t(bytes[2 * i] | (bytes[2 * i + 1] << 8)))) / 32768.0f;
        std::lock_guard turn(stream->ctx->model->backend->turn);
        return stream->impl->push(samples, sample_rate);
    });
}

specula_status specula_asr_stream_finish(specula_asr_stream* stream) {
    return guarded([&] {
        SPECULA_TRY(need(stream, "stream"));
        std::lock_guard turn(stream->ctx->model->backend->turn);
        return stream->impl->finish();
    });
}

specula_status specula_asr_stream_get_timings(const specula_asr_stream* stream,
                                              specula_asr_timings* timings) {
    return guarded([&] {
        SPECULA_TRY(need(stream, "stream"));
        SPECULA_TRY(need(timings, "timings"));
        const asr::StreamStats& s = stream->impl->stats();
        copy_timings(s.transcription, s.audio_seconds, 0.0, timings);
        return Status::Ok();
    });
}

void specula_asr_stream_free(specula_asr_stream* stream) {
    if (stream == nullptr) return;
    std::lock_guard turn(stream->ctx->model->backend->turn);
    --stream->ctx->streams;
    delete stream;
}

}  // extern "C"
