// specula-eval-stream: live transcription measured as an app meets it. The audio of a file is
// pushed into a stream in 20 ms pieces (paced by the wall clock with --realtime, else as fast as
// the stream takes it), beside a truth list (lines "start_ms<TAB>end_ms<TAB>text", as
// tests/stream/make_stream.py writes). It reports
//   - the final text's word error rate, beside the batch transcription's of the same file and
//     of each truth utterance transcribed alone (cut with the stream's margins: its pre-roll
//     before the utterance's start, its ending silence after its end);
//   - whether any committed text (a partial's stable bytes, after the finals before it) is not
//     where the stream's final text has it: a committed word that changed;
//   - with --realtime, the latency from each utterance's end to its last final segment;
//   - the work per second of audio (the real-time factor) and, with --repeat, the resident memory
//     after each pass over the audio.
// --check fails (exit 1) on a changed commitment, a word error rate more than --max-wer-gap
// points above the better batch one, or memory that grew more than --max-rss-growth-mb after the
// first pass.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "specula.h"
#include "token_list.h"
#include "word_error.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Truth {
    int64_t t0 = 0, t1 = 0;
    std::string text;
};

struct Final {
    int64_t t0 = 0, t1 = 0;
    std::string text;
    double wall = 0;  // seconds since the first push
};

struct Listener {
    Clock::time_point start;
    double offset_ms = 0;  // the pass's start in the audio pushed so far (--repeat)
    std::vector<Final> finals;
    std::string final_text;  // every final so far, in order
    // Commitments not yet overtaken by the final text: where in it each begins (the final text's
    // length at the partial) and its stable bytes. Checked and dropped as the finals reach past.
    std::vector<std::pair<size_t, std::string>> pending;
    size_t partials = 0, committed = 0, changed = 0;

    void settle(bool at_end) {
        std::erase_if(pending, [&](const auto& c) {
            if (!at_end && final_text.size() < c.first + c.second.size()) return false;
            changed += final_text.compare(c.first, c.second.size(), c.second) != 0;
            return true;
        });
    }
};

void on_event(const specula_asr_stream_event* e, void* user) {
    auto* l = static_cast<Listener*>(user);
    if (!e->is_final) {
        ++l->partials;
        if (e->stable_bytes > 0) {
            ++l->committed;
            l->pending.emplace_back(l->final_text.size(), std::string(e->text, e->stable_bytes));
        }
        return;
    }
    const double wall = std::chrono::duration<double>(Clock::now() - l->start).count();
    l->finals.push_back({e->t0_ms, e->t1_ms, e->text, wall});
    l->final_text += e->text;
    l->settle(false);
}

bool check(specula_status s, const char* what) {
    if (s == SPECULA_OK) return true;
    std::fprintf(stderr, "specula-eval-stream: %s: %s (%s)\n", what, specula_status_name(s),
                 specula_last_error());
    return false;
}

double word_error_rate(const std::string& reference, const std::string& hypothesis) {
    const auto ref = specula::transcript_words(reference);
    return ref.empty()
               ? 0.0
               : 100.0 * double(specula::word_edits(ref, specula::transcript_words(hypothesis))) /
                     double(ref.size());
}

// A mono 16-bit WAV file of `x` in memory (the batch transcription of a cut).
std::vector<uint8_t> wav_bytes(const float* x, size_t n, int rate) {
    std::vector<uint8_t> b(44 + 2 * n);
    const auto put32 = [&](size_t at, uint32_t v) { std::memcpy(&b[at], &v, 4); };
    const auto put16 = [&](size_t at, uint16_t v) { std::memcpy(&b[at], &v, 2); };
    std::memcpy(&b[0], "RIFF", 4);
    put32(4, uint32_t(36 + 2 * n));
    std::memcpy(&b[8], "WAVEfmt ", 8);
    put32(16, 16);
    put16(20, 1);
    put16(22, 1);
    put32(24, uint32_t(rate));
    put32(28, uint32_t(rate * 2));
    put16(32, 2);
    put16(34, 16);
    std::memcpy(&b[36], "data", 4);
    put32(40, uint32_t(2 * n));
    for (size_t i = 0; i < n; ++i)
        put16(44 + 2 * i, uint16_t(int16_t(std::clamp(x[i], -1.0f, 1.0f) * 32767.0f)));
    return b;
}

std::string segments_text(specula_asr_context* ctx) {
    std::string text;
    for (size_t i = 0; i < specula_asr_segment_count(ctx); ++i) {
        specula_asr_segment s;
        if (specula_asr_get_segment(ctx, i, &s) == SPECULA_OK) text += s.text;
    }
    return text;
}

double rss_mb() {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);)
        if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
    return 0;
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
    std::string model_path, draft_path, tokens_path, audio_path, truth_path, backend_name = "cpu";
    bool realtime = false, do_check = false, no_batch = false;
    int repeat = 1, threads = 0, step_ms = 1000, end_silence_ms = 600, pre_roll_ms = 30;
    double max_wer_gap = 1.0, max_rss_growth_mb = 8.0;
    CLI::App app{"specula-eval-stream: live transcription's text, latency and memory"};
    app.add_option("-m,--model", model_path, "whisper.cpp model")->required();
    auto* draft_option = app.add_option("--md,--model-draft", draft_path, "draft Whisper");
    app.add_option("--draft-tokens", tokens_path, "the token ids the draft may propose")
        ->needs(draft_option);
    app.add_option("-f,--file", audio_path, "audio file")->required();
    app.add_option("--truth", truth_path, "start_ms<TAB>end_ms<TAB>text per utterance")->required();
    app.add_flag("--realtime", realtime, "push at the audio's own pace (latency)");
    app.add_option("--repeat", repeat, "passes over the audio in one stream (memory)");
    app.add_option("--step-ms", step_ms, "new speech between partials");
    app.add_option("--end-silence-ms", end_silence_ms, "silence that ends an utterance");
    app.add_option("--pre-roll-ms", pre_roll_ms, "audio kept before an utterance's first voice");
    app.add_flag("--no-batch", no_batch, "skip the batch transcriptions");
    app.add_flag("--check", do_check, "exit 1 when a check fails");
    app.add_option("--max-wer-gap", max_wer_gap, "points above the better batch WER");
    app.add_option("--max-rss-growth-mb", max_rss_growth_mb, "after the first pass");
    app.add_option("--backend", backend_name, "cpu, vulkan, cuda or auto");
    app.add_option("-t,--threads", threads, "cpu threads (0 = all)");
    CLI11_PARSE(app, argc, argv);

    std::vector<Truth> truth;
    std::string reference;
    {
        std::ifstream in(truth_path);
        for (std::string line; std::getline(in, line);) {
            const size_t a = line.find('\t'), b = line.find('\t', a + 1);
            if (a == std::string::npos || b == std::string::npos) continue;
            truth.push_back({std::stoll(line.substr(0, a)),
                             std::stoll(line.substr(a + 1, b - a - 1)), line.substr(b + 1)});
            reference += " " + truth.back().text;
        }
    }
    if (truth.empty()) {
        std::fprintf(stderr, "specula-eval-stream: %s: no utterances\n", truth_path.c_str());
        return 1;
    }
    specula_backend_params bp = specula_backend_default_params();
    bp.n_threads = threads;
    specula_backend* backend = nullptr;
    specula_asr_model *model = nullptr, *draft = nullptr;
    specula_asr_context* ctx = nullptr;
    std::vector<int32_t> tokens;
    if (!tokens_path.empty() && !read_token_list(tokens_path, &tokens)) {
        std::fprintf(stderr, "specula-eval-stream: %s: no token list\n", tokens_path.c_str());
        return 1;
    }
    float* samples = nullptr;
    size_t n = 0;
    int32_t rate = 0;
    if (!check(specula_backend_kind_from_name(backend_name.c_str(), &bp.kind), "--backend") ||
        !check(specula_backend_create(&bp, &backend), "backend") ||
        !check(specula_asr_model_load(backend, model_path.c_str(), nullptr, &model), "model") ||
        (!draft_path.empty() && !check(specula_asr_draft_load(backend, draft_path.c_str(), nullptr,
                                                              tokens.data(), tokens.size(), &draft),
                                       "draft")) ||
        !check(specula_asr_context_create(model, &ctx), "context") ||
        !check(specula_audio_load(audio_path.c_str(), &samples, &n, &rate), "audio"))
        return 1;
    specula_asr_params asr = specula_asr_default_params();
    asr.draft = draft;

    int rc = 0;
    const double audio_s = double(n) / rate;
    // The stream, pass after pass.
    Listener l;
    specula_asr_stream_params sp = specula_asr_stream_default_params();
    sp.asr = asr;
    sp.step_ms = step_ms;
    sp.end_silence_ms = end_silence_ms;
    sp.pre_roll_ms = pre_roll_ms;
    sp.on_event = on_event;
    sp.event_user_data = &l;
    specula_asr_stream* stream = nullptr;
    if (!check(specula_asr_stream_create(ctx, &sp, &stream), "stream")) return 1;
    std::vector<double> rss;
    l.start = Clock::now();
    const size_t piece = size_t(rate / 50);
    double pushed_s = 0;
    for (int pass = 0; pass < repeat; ++pass) {
        for (size_t at = 0; at < n; at += piece) {
            const size_t k = std::min(piece, n - at);
            if (!check(specula_asr_stream_push(stream, samples + at, k, rate), "push")) return 1;
            pushed_s += double(k) / rate;
            if (realtime)
                std::this_thread::sleep_until(l.start + std::chrono::duration<double>(pushed_s));
        }
        rss.push_back(rss_mb());
    }
    if (!check(specula_asr_stream_finish(stream), "finish")) return 1;
    const double wall = std::chrono::duration<double>(Clock::now() - l.start).count();
    specula_asr_timings t{};
    specula_asr_stream_get_timings(stream, &t);
    specula_asr_stream_free(stream);
    const double work = t.mel_seconds + t.encode_seconds + t.decode_seconds;

    // Commitments: every committed text is where the final text has it.
    l.settle(true);
    const size_t changed = l.changed;
    // The first pass's final text against the truth.
    std::string first_pass;
    for (const Final& f : l.finals)  // the next pass's first words may begin before its start
        if (f.t0 < truth.back().t1 + 500) first_pass += f.text;
    const double stream_wer = word_error_rate(reference, first_pass);
    std::printf(
        "stream: %.1f s of audio x %d in %.2f s; %zu finals, %zu partials, %d decodings, "
        "%d tokens; work %.2f s = %.4f of the audio (real-time factor)\n",
        audio_s, repeat, wall, l.finals.size(), l.partials, t.windows, t.tokens, work,
        work / t.audio_seconds);
    if (draft != nullptr)
        std::printf("stream: speculative: acceptance %.3f, %.2f tokens per target call\n",
                    t.n_evaluated ? double(t.n_accepted) / double(t.n_evaluated) : 0.0,
                    t.n_steps ? double(t.n_emitted) / double(t.n_steps) : 0.0);
    std::printf("stream: committed texts %zu, changed later %zu\n", l.committed, changed);
    std::printf("stream: WER %.2f%% (%zu utterances)\n", stream_wer, truth.size());
    if (changed > 0) rc = 1;
    if (realtime) {
        // An utterance's final text: its last overlapping final segment, after its end was pushed.
        std::vector<double> latency;
        for (const Truth& u : truth) {
            double last = -1;
            for (const Final& f : l.finals)
                if (f.t0 < u.t1 + 300 && f.t1 > u.t0 - 300) last = std::max(last, f.wall);
            if (last >= 0) latency.push_back(1000.0 * last - double(u.t1));
        }
        std::printf(
            "stream: latency from an utterance's end to its final text: median %.0f ms, "
            "p95 %.0f ms (%zu of %zu utterances)\n",
            percentile(latency, 0.5), percentile(latency, 0.95), latency.size(), truth.size());
    }
    if (repeat > 1) {
        double most = 0;
        for (size_t i = 1; i < rss.size(); ++i)
            most = std::max(most, rss[i] - rss[0]);
        std::printf(
            "stream: resident memory after pass 1 %.1f MB, after pass %d %.1f MB, most "
            "growth past pass 1 %.1f MB\n",
            rss.front(), repeat, rss.back(), most);
        if (most > max_rss_growth_mb) rc = 1;
    }
    if (!no_batch) {
        double batch_wer = 0, cut_wer = 0;
        if (!check(specula_asr_transcribe_file(ctx, audio_path.c_str(), &asr), "batch")) return 1;
        batch_wer = word_error_rate(reference, segments_text(ctx));
        std::string cuts;
        for (const Truth& u : truth) {
            // The stream's own margins: its pre-roll before, the silence that ends it after.
            const auto from = size_t(std::max<int64_t>(0, (u.t0 - pre_roll_ms) * rate / 1000));
            const auto to = std::min(n, size_t((u.t1 + end_silence_ms) * rate / 1000));
            const auto bytes = wav_bytes(samples + from, to - from, rate);
            if (!check(specula_asr_transcribe_memory(ctx, bytes.data(), bytes.size(), &asr),
                       "batch of an utterance"))
                return 1;
            cuts += segments_text(ctx);
        }
        cut_wer = word_error_rate(reference, cuts);
        std::printf("batch: WER %.2f%% for the whole file, %.2f%% for each utterance alone\n",
                    batch_wer, cut_wer);
        if (stream_wer > std::min(batch_wer, cut_wer) + max_wer_gap) rc = 1;
    }
    specula_audio_free(samples);
    specula_asr_context_free(ctx);
    specula_asr_model_free(draft);
    specula_asr_model_free(model);
    specula_backend_free(backend);
    std::printf("%s\n", rc == 0 ? "checks passed" : "CHECK FAILED");
    return do_check ? rc : 0;
}
