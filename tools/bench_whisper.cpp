// specula-bench-whisper: the cost of Whisper's parts on a model file, as whisper.cpp's
// whisper-bench measures them, so the two compare on the same file: one encoder pass over a
// window (the decoder layers' cross K/V included), 256 one-token decoder forwards at positions
// 0..255, 64 forwards of 5 positions, 16 forwards of a 256-token prompt. The content does not
// change the cost: the mel is silence and the tokens are fixed. Medians of --reps repetitions
// after one warm-up; several backends given together are measured in one run. With
// --output-tokens the decoder's output is restricted to the ids of that file, as a draft's
// (specula_asr_draft_load). Below the table: the log-mel spectrogram of a 5 s clip on the host
// (whisper-bench does not time it), most of whose frames are the 30 s of silence appended; with
// --verify, target calls of those widths after 16 positions (a speculative step's γ + 1).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/factory.h"
#include "models/whisper.h"
#include "specula.h"
#include "token_list.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace specula;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Times {
    std::vector<double> encode, decode, batch5, prompt;  // ms per run, one entry per repetition
    std::vector<double> mel;                             // of a 5 s clip
    std::vector<std::vector<double>> widths;             // per --verify width, ms per forward
};

// One repetition: each part's ms per run.
Status repetition(WhisperContext& ctx, const audio::LogMel& mel, int decode_tokens,
                  std::span<const int> widths, std::vector<double>* out) {
    std::vector<float> logits;
    // whisper-bench's 256 positions, or the decoder's whole context where it is shorter.
    const std::vector<int32_t> tokens(size_t(std::min(256, ctx.n_ctx())), ctx.model().tokens().sot);
    auto t0 = Clock::now();
    SPECULA_TRY(ctx.encode(mel, 0));
    out->push_back(ms_since(t0));
    if (decode_tokens == 0) return Status::Ok();  // the encoder only
    t0 = Clock::now();
    for (int i = 0; i < decode_tokens; ++i)
        SPECULA_TRY(ctx.forward(std::span(tokens).first(1), false, &logits));
    out->push_back(ms_since(t0) / decode_tokens);
    t0 = Clock::now();
    for (int i = 0; i < 64; ++i) {
        ctx.truncate(0);
        SPECULA_TRY(ctx.forward(std::span(tokens).first(5), true, &logits));
    }
    out->push_back(ms_since(t0) / 64);
    t0 = Clock::now();
    for (int i = 0; i < 16; ++i) {
        ctx.truncate(0);
        SPECULA_TRY(ctx.forward(tokens, false, &logits));
    }
    out->push_back(ms_since(t0) / 16);
    // A speculative step's target call: n positions after 16 committed ones, every row's
    // logits, as a transcription verifies γ = n - 1 drafts.
    for (const int n : widths) {
        ctx.truncate(0);
        SPECULA_TRY(ctx.forward(std::span(tokens).first(16), false, &logits));
        t0 = Clock::now();
        for (int i = 0; i < 64; ++i) {
            ctx.truncate(16);
            SPECULA_TRY(ctx.forward(std::span(tokens).first(size_t(n)), true, &logits));
        }
        out->push_back(ms_since(t0) / 64);
    }
    return Status::Ok();
}

Status run(const std::string& path, const std::vector<int32_t>& output_tokens,
           specula_backend_kind kind, int threads, int reps, bool encoder_only, bool time_mel,
           std::span<const int> widths, Times* times) {
    specula_backend_params bp = specula_backend_default_params();
    bp.kind = kind;
    bp.n_threads = threads;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<MappedFile> file;
    std::unique_ptr<WhisperModel> model;
    std::unique_ptr<WhisperContext> ctx;
    SPECULA_TRY(create_backend(bp, &backend));
    SPECULA_TRY(MappedFile::open(path, &file));
    SPECULA_TRY(WhisperModel::load(*backend, std::move(file), nullptr, &model));
    if (!output_tokens.empty()) SPECULA_TRY(model->restrict_output(output_tokens));
    const int rows =
        widths.empty() ? 5 : std::max(5, *std::max_element(widths.begin(), widths.end()));
    SPECULA_TRY(WhisperContext::create(*model, rows, &ctx));
    const int decode_tokens = encoder_only ? 0 : std::min(256, ctx->n_ctx());
    audio::LogMel mel;
    mel.n_mel = model->hparams().n_mels;
    mel.n_frames = ctx->window_frames();
    mel.data.assign(size_t(mel.n_mel) * size_t(mel.n_frames), -1.5f);  // silence, normalised
    if (time_mel) {                          // on the host: once, whatever the backends
        std::vector<float> clip(5 * 16000);  // a tone: the content does not change the cost
        for (size_t i = 0; i < clip.size(); ++i)
            clip[i] = 0.3f * float(std::sin(0.05 * double(i)));
        audio::LogMel clip_mel;
        // As a transcription on this backend computes it.
        const audio::ParallelFor threads = [&](size_t n, const auto& fn) {
            backend->parallel_for_host(n, fn);
        };
        SPECULA_TRY(audio::log_mel(clip, model->mel_filters(), &clip_mel, threads));
        for (int r = 0; r < reps; ++r) {
            const auto t0 = Clock::now();
            SPECULA_TRY(audio::log_mel(clip, model->mel_filters(), &clip_mel, threads));
            times->mel.push_back(ms_since(t0));
        }
    }
    std::vector<double> ms;
    if (encoder_only) widths = {};
    SPECULA_TRY(repetition(*ctx, mel, decode_tokens, widths, &ms));  // warm-up
    times->widths.resize(widths.size());
    for (int r = 0; r < reps; ++r) {
        ms.clear();
        SPECULA_TRY(repetition(*ctx, mel, decode_tokens, widths, &ms));
        times->encode.push_back(ms[0]);
        if (encoder_only) continue;
        times->decode.push_back(ms[1]);
        times->batch5.push_back(ms[2]);
        times->prompt.push_back(ms[3]);
        for (size_t w = 0; w < widths.size(); ++w)
            times->widths[w].push_back(ms[4 + w]);
    }
    return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Whisper encoder and decoder costs on a model file (whisper-bench's workload)"};
    std::string model, tokens_path;
    std::vector<std::string> backends = {"cpu"};
    int threads = 0, reps = 3;
    bool encoder_only = false;
    std::vector<int> widths;
    app.add_option("-m,--model", model, "whisper.cpp model file (ggml-*.bin)")->required();
    app.add_option("--backend", backends, "backends to measure (cpu, vulkan, cuda)")
        ->delimiter(',');
    app.add_option("-t,--threads", threads, "cpu threads (0: all cores)");
    app.add_option("--reps", reps, "repetitions after a warm-up")->check(CLI::PositiveNumber);
    app.add_flag("--encoder-only", encoder_only, "measure the encoder alone (slow devices)");
    app.add_option(
        "--output-tokens", tokens_path,
        "restrict the decoder's output to these ids (whitespace-separated), as a draft's");
    app.add_option("--verify", widths,
                   "also time target calls of these widths (γ + 1 positions, every row's logits)")
        ->delimiter(',')
        ->check(CLI::Range(1, 64));
    CLI11_PARSE(app, argc, argv);
    std::vector<int32_t> output_tokens;
    if (!tokens_path.empty()) {
        if (!read_token_list(tokens_path, &output_tokens)) {
            std::fprintf(stderr, "%s: no list of token ids\n", tokens_path.c_str());
            return 2;
        }
    }

    std::printf("| backend | encode ms | decode ms/token | batch of 5 ms | prompt of 256 ms |\n");
    std::printf("|---|---|---|---|---|\n");
    int failures = 0;
    std::vector<double> mel_ms;
    std::string mel_backend;
    std::vector<std::string> width_rows;
    for (const std::string& name : backends) {
        specula_backend_kind kind;
        if (specula_backend_kind_from_name(name.c_str(), &kind) != SPECULA_OK) {
            std::fprintf(stderr, "unknown backend '%s'\n", name.c_str());
            return 2;
        }
        Times t;
        const Status s = run(model, output_tokens, kind, threads, reps, encoder_only,
                             mel_ms.empty(), widths, &t);
        if (!s.ok()) {
            std::fprintf(stderr, "%s: %s\n", name.c_str(), s.message().c_str());
            ++failures;
            continue;
        }
        std::printf("| %s | %.1f | %.2f | %.2f | %.1f |\n", name.c_str(), median(t.encode),
                    median(t.decode), median(t.batch5), median(t.prompt));
        if (mel_ms.empty() && !t.mel.empty()) mel_backend = name;
        mel_ms.insert(mel_ms.end(), t.mel.begin(), t.mel.end());
        std::string row = "| " + name;
        for (const std::vector<double>& w : t.widths) {
            char cell[64];
            std::snprintf(cell, sizeof cell, " | %.3f (%.2fx)", median(w),
                          median(w) / median(t.widths.front()));
            row += cell;
        }
        if (!t.widths.empty()) width_rows.push_back(row + " |");
    }
    if (!width_rows.empty()) {
        std::printf("\ntarget calls after 16 positions, ms (over the first width's):\n| backend |");
        for (const int n : widths)
            std::printf(" %d |", n);
        std::printf("\n|---|");
        for (size_t i = 0; i < widths.size(); ++i)
            std::printf("---|");
        std::printf("\n");
        for (const std::string& row : width_rows)
            std::printf("%s\n", row.c_str());
    }
    if (!mel_ms.empty())
        std::printf("\nlog-mel spectrogram of a 5 s clip (host, as on the %s backend): %.2f ms\n",
                    mel_backend.c_str(), median(mel_ms));
    return failures == 0 ? 0 : 1;
}
