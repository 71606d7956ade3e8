// specula-eval-asr: word error rate and speculative speed of a Whisper pair on a list of clips
// (lines of "wav-path<TAB>reference text"), through the C API as an app calls it. Each
// repetition transcribes every clip with the target alone and with the pair, in alternating
// order; times are summed over the clips and the medians over repetitions compared. The
// draft alone (it is a whole Whisper) is transcribed once for its word error rate. Words are
// compared in lower case, with everything but letters and apostrophes as spaces.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "specula.h"
#include "token_list.h"
#include "word_error.h"

namespace {

struct Clip {
    std::string wav, reference;
};

struct Run {
    std::vector<std::string> texts;
    double seconds = 0, decode_seconds = 0, audio_seconds = 0;
    specula_asr_timings sum{};
};

bool check(specula_status s, const char* what) {
    if (s == SPECULA_OK) return true;
    std::fprintf(stderr, "specula-eval-asr: %s: %s (%s)\n", what, specula_status_name(s),
                 specula_last_error());
    return false;
}

bool transcribe_all(specula_asr_context* ctx, const std::vector<Clip>& clips,
                    const specula_asr_params& p, Run* run) {
    *run = Run{};
    for (const Clip& c : clips) {
        if (!check(specula_asr_transcribe_file(ctx, c.wav.c_str(), &p), c.wav.c_str()))
            return false;
        std::string text;
        for (size_t i = 0; i < specula_asr_segment_count(ctx); ++i) {
            specula_asr_segment seg;
            if (!check(specula_asr_get_segment(ctx, i, &seg), "segment")) return false;
            text += seg.text;
        }
        run->texts.push_back(text);
        specula_asr_timings t;
        if (!check(specula_asr_get_timings(ctx, &t), "timings")) return false;
        run->audio_seconds += t.audio_seconds;
        run->seconds += t.mel_seconds + t.encode_seconds + t.decode_seconds;
        run->decode_seconds += t.decode_seconds;
        for (auto [sum, v] : {std::pair{&run->sum.n_steps, t.n_steps},
                              {&run->sum.n_emitted, t.n_emitted},
                              {&run->sum.n_drafted, t.n_drafted},
                              {&run->sum.n_evaluated, t.n_evaluated},
                              {&run->sum.n_accepted, t.n_accepted}})
            *sum += v;
        run->sum.mel_seconds += t.mel_seconds;
        run->sum.encode_seconds += t.encode_seconds;
        run->sum.draft_seconds += t.draft_seconds;
        run->sum.target_seconds += t.target_seconds;
        run->sum.verify_seconds += t.verify_seconds;
    }
    return true;
}

double wer(const std::vector<Clip>& clips, const Run& run) {
    size_t e = 0, n = 0;
    for (size_t i = 0; i < clips.size(); ++i) {
        const auto ref = specula::transcript_words(clips[i].reference);
        e += specula::word_edits(ref, specula::transcript_words(run.texts[i]));
        n += ref.size();
    }
    return n ? double(e) / double(n) : 0.0;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    std::string target_path, draft_path, tokens_path, list_path, backend_name = "cpu";
    int reps = 3, threads = 0, gamma = 4, gamma_max = 8;
    std::string policy = "auto";
    bool timestamps = false, fallback = false;
    CLI::App app{"Word error rate and speculative speed of a Whisper pair on a list of clips"};
    app.add_option("-m,--model", target_path, "target whisper.cpp model")->required();
    app.add_option("--md,--model-draft", draft_path, "draft whisper.cpp model")->required();
    app.add_option("--draft-tokens", tokens_path,
                   "ids the draft proposes (whitespace-separated; specula_asr_draft_load)");
    app.add_option("-l,--list", list_path, "lines of: wav path <TAB> reference text")->required();
    app.add_option("--backend", backend_name, "cpu, vulkan, cuda or auto");
    app.add_option("--threads", threads, "cpu threads (0 = all)");
    app.add_option("-r,--reps", reps, "repetitions (medians)");
    app.add_option("--gamma-policy", policy,
                   "fixed, heuristic, analytic or auto (the analytic one)");
    app.add_option("--gamma", gamma, "drafts per step (fixed), or the start");
    app.add_option("--draft-max", gamma_max, "most drafts per step (adaptive policies)");
    app.add_flag("--timestamps", timestamps, "decode with timestamp tokens");
    app.add_flag("--fallback", fallback,
                 "greedy, then the temperature fallback's sampled attempts (default: greedy only)");
    CLI11_PARSE(app, argc, argv);

    std::vector<Clip> clips;
    std::ifstream list(list_path);
    for (std::string line; std::getline(list, line);) {
        const size_t tab = line.find('\t');
        if (tab == std::string::npos) continue;
        std::string wav = line.substr(0, tab);
        if (!wav.empty() && wav[0] != '/' && list_path.find('/') != std::string::npos)
            wav = list_path.substr(0, list_path.find_last_of('/') + 1) + wav;
        clips.push_back({wav, line.substr(tab + 1)});
    }
    if (clips.empty()) {
        std::fprintf(stderr, "specula-eval-asr: no clips in %s\n", list_path.c_str());
        return 1;
    }
    specula_backend_params bp = specula_backend_default_params();
    bp.n_threads = threads;
    specula_backend* backend = nullptr;
    std::vector<int32_t> tokens;
    if (!tokens_path.empty()) {
        if (!read_token_list(tokens_path, &tokens)) {
            std::fprintf(stderr, "specula-eval-asr: %s: no list of token ids\n",
                         tokens_path.c_str());
            return 1;
        }
    }
    // The draft alone is transcribed with its whole vocabulary; the pair's proposer is the
    // draft restricted to the tokens given, if any.
    specula_asr_model *target = nullptr, *draft = nullptr, *proposer = nullptr;
    specula_asr_context *ctx = nullptr, *draft_ctx = nullptr;
    bool ok = check(specula_backend_kind_from_name(backend_name.c_str(), &bp.kind), "--backend") &&
              check(specula_backend_create(&bp, &backend), "backend") &&
              check(specula_asr_model_load(backend, target_path.c_str(), nullptr, &target),
                    target_path.c_str()) &&
              check(specula_asr_model_load(backend, draft_path.c_str(), nullptr, &draft),
                    draft_path.c_str()) &&
              check(specula_asr_draft_load(backend, draft_path.c_str(), nullptr, tokens.data(),
                                           tokens.size(), &proposer),
                    draft_path.c_str()) &&
              check(specula_asr_context_create(target, &ctx), "context") &&
              check(specula_asr_context_create(draft, &draft_ctx), "draft context");
    specula_asr_params alone = specula_asr_default_params();
    alone.timestamps = timestamps;
    // Greedy or sampled (the coupled acceptance), the pair's transcripts must be the target's.
    if (!fallback) alone.temperature_increment = 0.0f;
    specula_asr_params pair = alone;
    pair.draft = proposer;
    ok = ok && check(specula_gamma_policy_from_name(policy.c_str(), &pair.gamma_policy),
                     "--gamma-policy");
    pair.gamma = gamma;
    pair.gamma_max = gamma_max;
    Run a, s, d;
    std::vector<double> alone_s, pair_s, alone_dec, pair_dec;
    for (int r = 0; ok && r < std::max(1, reps); ++r) {
        // Alternate which goes first: neither always runs on a warmer machine.
        for (int k = 0; ok && k < 2; ++k) {
            const bool first_alone = (r + k) % 2 == 0;
            ok = transcribe_all(ctx, clips, first_alone ? alone : pair, first_alone ? &a : &s);
            (first_alone ? alone_s : pair_s).push_back((first_alone ? a : s).seconds);
            (first_alone ? alone_dec : pair_dec).push_back((first_alone ? a : s).decode_seconds);
        }
    }
    ok = ok && transcribe_all(draft_ctx, clips, alone, &d);
    if (ok) {
        size_t same = 0;
        for (size_t i = 0; i < clips.size(); ++i)
            same += a.texts[i] == s.texts[i];
        const double audio = a.audio_seconds;
        std::printf("%zu clips, %.1f s of audio, backend %s, medians of %d repetitions\n",
                    clips.size(), audio, backend_name.c_str(), std::max(1, reps));
        std::printf("WER: target %.2f%%, draft alone %.2f%%\n", 100 * wer(clips, a),
                    100 * wer(clips, d));
        if (!tokens.empty()) {
            specula_asr_model_info info{};
            specula_asr_model_get_info(proposer, &info);
            std::printf("the pair's draft proposes %d of %d tokens (%s)\n", info.n_output_tokens,
                        info.n_vocab, tokens_path.c_str());
        }
        std::printf(
            "pair: acceptance rate %.3f (%llu of %llu judged drafts; %llu drafted), %.2f "
            "tokens per target call; transcripts identical to the target's: %zu of %zu\n",
            s.sum.n_evaluated ? double(s.sum.n_accepted) / double(s.sum.n_evaluated) : 0.0,
            (unsigned long long)s.sum.n_accepted, (unsigned long long)s.sum.n_evaluated,
            (unsigned long long)s.sum.n_drafted,
            s.sum.n_steps ? double(s.sum.n_emitted) / double(s.sum.n_steps) : 0.0, same,
            clips.size());
        const double ta = median(alone_s), tp = median(pair_s);
        std::printf(
            "real-time factor: target alone %.4f, pair %.4f (draft alone %.4f); speedup "
            "%.2fx overall, %.2fx in the decoder\n",
            ta / audio, tp / audio, d.seconds / audio, ta / tp,
            median(alone_dec) / median(pair_dec));
        std::printf("decoder seconds: target alone %.3f, pair %.3f, draft alone %.3f\n",
                    median(alone_dec), median(pair_dec), d.decode_seconds);
        // The parts both run alike (the pair's encoder: the shared one, or the draft's too).
        std::printf(
            "seconds (the last repetition): target alone mel %.3f, encoder %.3f, decoder %.3f; "
            "pair mel %.3f, encoder %.3f, decoder %.3f\n",
            a.sum.mel_seconds, a.sum.encode_seconds, a.decode_seconds, s.sum.mel_seconds,
            s.sum.encode_seconds, s.decode_seconds);
        // Where a step's time goes (the last repetition): the rest of the decoder's time is
        // the host's (rules state, the transcription loop) and the step's wait.
        for (const auto& [name, r] : {std::pair{"target alone", &a}, {"pair", &s}}) {
            const double steps = double(std::max<uint64_t>(r->sum.n_steps, 1));
            const double timed =
                r->sum.draft_seconds + r->sum.target_seconds + r->sum.verify_seconds;
            std::printf(
                "per step, ms (%s, %llu steps): draft %.3f, target %.3f, rules and verification "
                "%.3f, the rest %.3f\n",
                name, (unsigned long long)r->sum.n_steps, 1e3 * r->sum.draft_seconds / steps,
                1e3 * r->sum.target_seconds / steps, 1e3 * r->sum.verify_seconds / steps,
                1e3 * (r->decode_seconds - timed) / steps);
        }
    }
    specula_asr_context_free(draft_ctx);
    specula_asr_context_free(ctx);
    specula_asr_model_free(proposer);
    specula_asr_model_free(draft);
    specula_asr_model_free(target);
    specula_backend_free(backend);
    return ok ? 0 : 1;
}
