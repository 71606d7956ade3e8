// specula-asr: transcribes an audio file with a whisper.cpp model file, printing segments as
// they are decoded, and writes .txt / .srt / .vtt / .json beside the audio when asked. With
// --stream it transcribes live: audio from a file (paced in real time with --realtime) or raw
// 16-bit PCM from standard input (-f -), partial text rewritten in place, final segments printed.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "specula.h"
#include "token_list.h"

namespace {

struct Segment {
    int64_t t0, t1;
    std::string text;
};

std::string clock(int64_t ms, char sep) {  // HH:MM:SS,mmm (SRT) or HH:MM:SS.mmm (VTT)
    char b[32];
    std::snprintf(b, sizeof b, "%02lld:%02lld:%02lld%c%03lld", static_cast<long long>(ms / 3600000),
                  static_cast<long long>(ms / 60000 % 60), static_cast<long long>(ms / 1000 % 60),
                  sep, static_cast<long long>(ms % 1000));
    return b;
}

std::string json_escaped(const std::string& s) {
    std::string out;
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += char(c);
        } else if (c < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            out += b;
        } else {
            out += char(c);
        }
    }
    return out;
}

void print_segment(const specula_asr_segment* s, void* user) {
    auto* st = static_cast<std::pair<bool, std::vector<Segment>*>*>(user);
    if (st->first) std::fprintf(stderr, "\r\033[K");  // clear the progress bar
    std::printf("[%s --> %s]  %s\n", clock(s->t0_ms, '.').c_str(), clock(s->t1_ms, '.').c_str(),
                s->text);
    std::fflush(stdout);
    st->second->push_back({s->t0_ms, s->t1_ms, s->text});
}

bool progress_bar(float f, void*) {
    const int width = 40, done = int(f * float(width) + 0.5f);
    std::fprintf(stderr, "\r[%s%s] %3d%%", std::string(size_t(done), '#').c_str(),
                 std::string(size_t(width - done), ' ').c_str(), int(f * 100.0f + 0.5f));
    return true;
}

int fail(const char* what) {
    std::fprintf(stderr, "specula-asr: %s: %s\n", what, specula_last_error());
    return 1;
}

struct StreamOptions {
    bool realtime = false;
    int rate = 16000;  // of raw PCM on standard input
    int step_ms = 1000, end_silence_ms = 600, vad = 2;
};

struct StreamOutput {
    bool tty = false;
    std::vector<Segment>* finals = nullptr;
    size_t partial_shown = 0;  // bytes of the partial line on screen
};

void on_stream_event(const specula_asr_stream_event* e, void* user) {
    auto* out = static_cast<StreamOutput*>(user);
    if (!e->is_final) {
        if (!out->tty) return;
        // The committed words plain, the rest dim: the rest may still change.
        const std::string text(e->text);
        std::printf("\r\033[K%s\033[2m%s\033[0m", text.substr(0, e->stable_bytes).c_str(),
                    text.substr(e->stable_bytes).c_str());
        std::fflush(stdout);
        out->partial_shown = text.size();
        return;
    }
    if (out->tty) std::printf("\r\033[K");
    std::printf("[%s --> %s]  %s\n", clock(e->t0_ms, '.').c_str(), clock(e->t1_ms, '.').c_str(),
                e->text);
    std::fflush(stdout);
    out->partial_shown = 0;
    out->finals->push_back({e->t0_ms, e->t1_ms, e->text});
}

// Pushes the audio into `stream` in 20 ms pieces, paced by the wall clock with `realtime`.
int run_stream(specula_asr_stream* stream, const std::string& path, const StreamOptions& o) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    double pushed_s = 0;
    const auto pace = [&](double seconds) {
        pushed_s += seconds;
        if (o.realtime)
            std::this_thread::sleep_until(start + std::chrono::duration<double>(pushed_s));
    };
    if (path == "-") {
        std::vector<char> bytes(size_t(o.rate / 50) * 2);
        size_t held = 0;  // a read may end within a sample: its byte waits for the next
        for (;;) {
            const size_t n = std::fread(bytes.data() + held, 1, bytes.size() - held, stdin);
            if (n == 0) break;
            const size_t whole = (held + n) & ~size_t(1);
            if (specula_asr_stream_push_pcm16(stream, bytes.data(), whole, o.rate) != SPECULA_OK)
                return fail("stream");
            held = held + n - whole;
            if (held) bytes[0] = bytes[whole];
            pace(double(whole / 2) / o.rate);
        }
    } else {
        float* samples = nullptr;
        size_t n = 0;
        int32_t rate = 0;
        if (specula_audio_load(path.c_str(), &samples, &n, &rate) != SPECULA_OK)
            return fail("audio");
        const size_t piece = size_t(std::max(1, rate / 50));
        for (size_t at = 0; at < n; at += piece) {
            const size_t k = std::min(piece, n - at);
            if (specula_asr_stream_push(stream, samples + at, k, rate) != SPECULA_OK) {
                specula_audio_free(samples);
                return fail("stream");
            }
            pace(double(k) / rate);
        }
        specula_audio_free(samples);
    }
    if (specula_asr_stream_finish(stream) != SPECULA_OK) return fail("stream");
    const double wall = std::chrono::duration<double>(Clock::now() - start).count();
    specula_asr_timings t{};
    specula_asr_stream_get_timings(stream, &t);
    const double work = t.mel_seconds + t.encode_seconds + t.decode_seconds;
    std::fprintf(stderr,
                 "specula-asr: streamed %.2f s of audio in %.2f s; %d decodings (%d tokens): "
                 "%.2f s of work, %.3f of the audio's duration\n",
                 t.audio_seconds, wall, t.windows, t.tokens, work,
                 t.audio_seconds > 0 ? work / t.audio_seconds : 0.0);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string model_path, draft_path, tokens_path, audio_path, output_path,
        language = "en", backend_name = "auto", policy = "auto";
    bool translate = false, no_timestamps = false, otxt = false, osrt = false, ovtt = false,
         ojson = false, no_fallback = false, no_context = false, compare = false, stream = false;
    StreamOptions so;
    int threads = 0, gamma = 4, gamma_max = 8;
    float temperature = 0.0f;
    CLI::App app{"specula-asr: speech to text with a whisper.cpp model file"};
    app.add_option("-m,--model", model_path, "whisper.cpp model (ggml-*.bin)")->required();
    app.add_option("-f,--file", audio_path,
                   "audio file: WAV, FLAC, MP3, Ogg (any rate and channels); with --stream, - "
                   "reads raw 16-bit little-endian mono PCM from standard input")
        ->required();
    app.add_flag("--stream", stream,
                 "live: partial text as the audio arrives, final segments at each pause");
    app.add_flag("--realtime", so.realtime, "--stream: push the file's audio at its own pace");
    app.add_option("--rate", so.rate, "--stream: the sample rate of standard input (16000)");
    app.add_option("--step-ms", so.step_ms,
                   "--stream: new speech between partials (1000; 0: none)");
    app.add_option("--end-silence-ms", so.end_silence_ms,
                   "--stream: silence that ends an utterance (600)");
    app.add_option("--vad", so.vad, "--stream: voice detection aggressiveness 0..3 (2)");
    auto* draft_option = app.add_option("--md,--model-draft", draft_path,
                                        "draft Whisper (same vocabulary): speculative decoding");
    app.add_option("--draft-tokens", tokens_path,
                   "a file of the token ids the draft may propose (whitespace-separated)")
        ->needs(draft_option);
    app.add_option("--gamma-policy", policy,
                   "fixed, heuristic, analytic or auto (the analytic one)")
        ->check(CLI::IsMember({"fixed", "heuristic", "analytic", "auto"}));
    app.add_option("--gamma", gamma, "drafts per step (fixed), or the start");
    app.add_option("--draft-max", gamma_max, "most drafts per step (adaptive policies)");
    app.add_flag("--compare", compare,
                 "with a draft: also transcribe with the target alone, and print the speedup");
    app.add_option("-l,--language", language, "spoken language, or auto");
    app.add_flag("--translate", translate, "translate to English");
    app.add_flag("--no-timestamps", no_timestamps, "no timestamp tokens");
    app.add_flag("--no-context", no_context,
                 "each window decoded without the text of the windows before it");
    app.add_option("--temp", temperature, "first temperature (0 = greedy)");
    app.add_flag("--no-fallback", no_fallback, "no temperature fallback");
    app.add_flag("--otxt", otxt, "write OUT.txt");
    app.add_flag("--osrt", osrt, "write OUT.srt");
    app.add_flag("--ovtt", ovtt, "write OUT.vtt");
    app.add_flag("--ojson", ojson, "write OUT.json");
    app.add_option("--of,--output-file", output_path,
                   "OUT: the output path without extension "
                   "(default: the audio file's path)");
    app.add_option("--backend", backend_name, "auto, cpu, vulkan or cuda");
    app.add_option("--threads", threads, "cpu threads (0 = all)");
    // whisper.cpp's single-dash spellings of the output flags are taken too.
    std::vector<std::string> args(argv + 1, argv + argc);
    for (std::string& a : args)
        if (a == "-otxt" || a == "-osrt" || a == "-ovtt" || a == "-ojson" || a == "-of" ||
            a == "-md")
            a = "-" + a;
    std::reverse(args.begin(), args.end());
    try {
        app.parse(args);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }

    specula_backend_params bp = specula_backend_default_params();
    bp.n_threads = threads;
    if (specula_backend_kind_from_name(backend_name.c_str(), &bp.kind) != SPECULA_OK)
        return fail("--backend");
    specula_backend* backend = nullptr;
    specula_asr_model* model = nullptr;
    specula_asr_context* ctx = nullptr;
    if (specula_backend_create(&bp, &backend) != SPECULA_OK) return fail("backend");
    specula_device_info device{};
    specula_backend_get_info(backend, &device);
    if (specula_asr_model_load(backend, model_path.c_str(), nullptr, &model) != SPECULA_OK) {
        specula_backend_free(backend);
        return fail("model");
    }
    std::vector<int32_t> tokens;
    if (!tokens_path.empty()) {
        if (!read_token_list(tokens_path, &tokens)) {
            std::fprintf(stderr, "specula-asr: %s: no list of token ids\n", tokens_path.c_str());
            specula_asr_model_free(model);
            specula_backend_free(backend);
            return 1;
        }
    }
    specula_asr_model* draft = nullptr;
    if (!draft_path.empty() &&
        specula_asr_draft_load(backend, draft_path.c_str(), nullptr, tokens.data(), tokens.size(),
                               &draft) != SPECULA_OK) {
        specula_asr_model_free(model);
        specula_backend_free(backend);
        return fail("draft model");
    }
    specula_asr_model_info info{};
    specula_asr_model_get_info(model, &info);
    std::fprintf(stderr, "specula-asr: %s on %s (%s): %d layers + %d, width %d, %s\n",
                 model_path.c_str(), device.name, specula_backend_kind_name(device.kind),
                 info.n_audio_layer, info.n_text_layer, info.n_state,
                 info.multilingual ? "multilingual" : "English-only");
    if (!tokens.empty()) {
        specula_asr_model_info d{};
        specula_asr_model_get_info(draft, &d);
        std::fprintf(stderr, "specula-asr: the draft proposes %d of the %d tokens (%s)\n",
                     d.n_output_tokens, d.n_vocab, tokens_path.c_str());
    }
    int rc = 0;
    std::vector<Segment> segments;
    const bool tty = isatty(fileno(stderr)) != 0;
    std::pair<bool, std::vector<Segment>*> state{tty, &segments};
    specula_asr_params p = specula_asr_default_params();
    p.language = language.c_str();
    p.translate = translate;
    p.timestamps = !no_timestamps;
    p.condition_on_previous_text = !no_context;
    p.temperature = temperature;
    if (no_fallback) p.temperature_increment = 0.0f;
    p.on_segment = print_segment;
    p.segment_user_data = &state;
    if (tty) p.progress = progress_bar;
    p.draft = draft;
    if (specula_gamma_policy_from_name(policy.c_str(), &p.gamma_policy) != SPECULA_OK)
        return fail("--gamma-policy");
    p.gamma = gamma;
    p.gamma_max = gamma_max;
    // --compare: the pair once quietly (its first run makes the draft's caches and touches its
    // weights: cold costs the target alone has not paid either), then the target alone
    // (quietly) and the pair, in the same run and context.
    specula_asr_timings alone{};
    std::vector<Segment> alone_segments, warm_up_segments;
    std::pair<bool, std::vector<Segment>*> quiet{false, &alone_segments},
        warm_up{false, &warm_up_segments};
    const auto collect = [](const specula_asr_segment* s, void* user) {
        static_cast<std::pair<bool, std::vector<Segment>*>*>(user)->second->push_back(
            {s->t0_ms, s->t1_ms, s->text});
    };
    const auto quietly = [&](specula_asr_model* with, void* user) {
        specula_asr_params a = p;
        a.draft = with;
        a.on_segment = collect;
        a.segment_user_data = user;
        a.progress = nullptr;
        return specula_asr_transcribe_file(ctx, audio_path.c_str(), &a) == SPECULA_OK;
    };
    if (specula_asr_context_create(model, &ctx) != SPECULA_OK) {
        rc = fail("context");
    } else if (stream) {
        StreamOutput out{isatty(fileno(stdout)) != 0, &segments};
        specula_asr_stream_params sp = specula_asr_stream_default_params();
        sp.asr = p;
        sp.step_ms = so.step_ms;
        sp.end_silence_ms = so.end_silence_ms;
        sp.vad_aggressiveness = so.vad;
        sp.on_event = on_stream_event;
        sp.event_user_data = &out;
        specula_asr_stream* live = nullptr;
        rc = specula_asr_stream_create(ctx, &sp, &live) != SPECULA_OK
                 ? fail("stream")
                 : run_stream(live, audio_path, so);
        specula_asr_stream_free(live);
    } else if (compare && draft != nullptr &&
               (!quietly(draft, &warm_up) || !quietly(nullptr, &quiet) ||
                specula_asr_get_timings(ctx, &alone) != SPECULA_OK)) {
        rc = fail("transcription with the target alone");
    } else if (specula_asr_transcribe_file(ctx, audio_path.c_str(), &p) != SPECULA_OK) {
        if (tty) std::fprintf(stderr, "\n");
        rc = fail("transcription");
    } else {
        if (tty) std::fprintf(stderr, "\r\033[K");
        specula_asr_timings t{};
        specula_asr_get_timings(ctx, &t);
        const double total = t.mel_seconds + t.encode_seconds + t.decode_seconds;
        std::fprintf(stderr,
                     "specula-asr: %.2f s of audio (%s), %d windows, %d tokens, %d fallbacks\n"
                     "specula-asr: mel %.3f s, encoder %.3f s (%.3f s per window), decoder %.3f s "
                     "(%.2f ms per token)\n"
                     "specula-asr: real-time factor %.4f (%.1fx real-time speed)\n",
                     t.audio_seconds, t.language, t.windows, t.tokens, t.fallbacks, t.mel_seconds,
                     t.encode_seconds, t.windows ? t.encode_seconds / t.windows : 0.0,
                     t.decode_seconds, t.tokens ? 1000.0 * t.decode_seconds / t.tokens : 0.0,
                     total / t.audio_seconds, t.audio_seconds / total);
        if (draft != nullptr) {
            const double calls = t.n_steps ? double(t.n_emitted) / double(t.n_steps) : 0.0;
            std::fprintf(stderr,
                         "specula-asr: speculative: %llu steps, acceptance rate %.3f (%llu of "
                         "%llu judged drafts), %.2f tokens per target call\n"
                         "specula-asr: decoder time: draft %.3f s, target %.3f s, verify %.3f s\n",
                         static_cast<unsigned long long>(t.n_steps),
                         t.n_evaluated ? double(t.n_accepted) / double(t.n_evaluated) : 0.0,
                         static_cast<unsigned long long>(t.n_accepted),
                         static_cast<unsigned long long>(t.n_evaluated), calls, t.draft_seconds,
                         t.target_seconds, t.verify_seconds);
        }
        if (compare && draft != nullptr) {
            const double alone_total =
                alone.mel_seconds + alone.encode_seconds + alone.decode_seconds;
            bool same = alone_segments.size() == segments.size();
            for (size_t i = 0; same && i < segments.size(); ++i)
                same = alone_segments[i].text == segments[i].text &&
                       alone_segments[i].t0 == segments[i].t0 &&
                       alone_segments[i].t1 == segments[i].t1;
            std::fprintf(stderr,
                         "specula-asr: target alone: real-time factor %.4f, decoder %.3f s; "
                         "speculative speedup %.2fx overall, %.2fx in the decoder (measured in "
                         "this run); transcripts %s\n",
                         alone_total / alone.audio_seconds, alone.decode_seconds,
                         alone_total / total, alone.decode_seconds / t.decode_seconds,
                         same ? "identical" : "DIFFER");
            // Greedy or sampled (the coupled acceptance), the pair's transcript is the target's.
            if (!same) rc = 1;
        }
        const auto write = [&](const char* ext, auto&& body) {
            const std::string path = (output_path.empty() ? audio_path : output_path) + ext;
            std::ofstream o(path);
            body(o);
            if (!o) {
                std::fprintf(stderr, "specula-asr: cannot write %s\n", path.c_str());
                rc = 1;
            } else {
                std::fprintf(stderr, "specula-asr: wrote %s\n", path.c_str());
            }
        };
        if (otxt)
            write(".txt", [&](std::ofstream& o) {
                for (const Segment& s : segments)
                    o << s.text << "\n";
            });
        if (osrt)
            write(".srt", [&](std::ofstream& o) {
                for (size_t i = 0; i < segments.size(); ++i)
                    o << i + 1 << "\n"
                      << clock(segments[i].t0, ',') << " --> " << clock(segments[i].t1, ',') << "\n"
                      << segments[i].text << "\n\n";
            });
        if (ovtt)
            write(".vtt", [&](std::ofstream& o) {
                o << "WEBVTT\n\n";
                for (const Segment& s : segments)
                    o << clock(s.t0, '.') << " --> " << clock(s.t1, '.') << "\n"
                      << s.text << "\n\n";
            });
        if (ojson)
            write(".json", [&](std::ofstream& o) {
                o << "{\"language\": \"" << t.language << "\", \"segments\": [";
                for (size_t i = 0; i < segments.size(); ++i)
                    o << (i ? ", " : "") << "{\"start_ms\": " << segments[i].t0
                      << ", \"end_ms\": " << segments[i].t1 << ", \"text\": \""
                      << json_escaped(segments[i].text) << "\"}";
                o << "]}\n";
            });
    }
    specula_asr_context_free(ctx);
    specula_asr_model_free(draft);
    specula_asr_model_free(model);
    specula_backend_free(backend);
    return rc;
}
