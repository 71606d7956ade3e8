#include "asr/transcribe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "asr/rules.h"
#include "audio/mel.h"
#include "sampling/sampling.h"

namespace specula::asr {

namespace {

constexpr int kFramesPerTimestamp = 2;  // an encoder position: two 10 ms mel frames
constexpr int kMsPerFrame = 1000 * audio::kWhisperHop / 16000;
constexpr int kEntropyTokens = 32;  // the window of whisper.cpp's entropy test

double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// One decoding of one window at one temperature.
struct Attempt {
    std::vector<int32_t> tokens;  // up to (not including) <|endoftext|>
    double avg_logprob = 0, no_speech_prob = 0, entropy = 0;
    float temperature = 0;
};

class Transcriber {
  public:
    Transcriber(WhisperContext& ctx, const TranscribeParams& p, TranscribeStats* stats)
        : ctx_(ctx),
          m_(ctx.model()),
          t_(m_.tokens()),
          p_(p),
          stats_(*stats),
          generator_(ctx, p.draft, generator_config(p, ctx.model().tokens().eot), p.measurements) {
        rules_.tokens = t_;
        rules_.timestamps = p.timestamps;
        rules_.max_timestamp = m_.hparams().n_audio_ctx;
        for (int32_t id = 0; id < t_.eot; ++id)
            if (m_.token_text(id) == " ") rules_.space = id;
    }

    Status detect(std::vector<float>* probs) {
        const int32_t sot = t_.sot;
        std::vector<float> logits;
        ctx_.truncate(0);
        SPECULA_TRY(ctx_.forward(std::span(&sot, 1), false, &logits));
        // The language tokens are consecutive: their softmax among themselves.
        const auto languages =
            std::span(logits).subspan(size_t(t_.language(0)), size_t(t_.n_languages));
        std::vector<double> lp(languages.size());
        log_softmax(languages, lp);
        probs->resize(lp.size());
        for (size_t i = 0; i < lp.size(); ++i)
            (*probs)[i] = float(std::exp(lp[i]));
        return Status::Ok();
    }

    static Generator::Config generator_config(const TranscribeParams& p, int32_t eot) {
        Generator::Config c;
        // A transcript ends at <|endoftext|>: drafts past it are not judged (α) nor emitted.
        c.end_token = eot;
        c.policy = p.gamma_policy;
        c.gamma = p.gamma;
        c.gamma_max = p.gamma_max;
        // A sampled attempt (the temperature fallback) draws each draft with the noise the
        // target draws with at its position: the pair's transcript is the target alone's for the
        // seed, fallbacks and all, and no γ changes it (docs/DESIGN.md "Speculative decoding").
        c.coupled = true;
        return c;
    }

    Status check_draft() const {
        if (p_.draft == nullptr) return Status::Ok();
        const WhisperModel& d = p_.draft->model();
        bool same_vocab = d.hparams().n_vocab == m_.hparams().n_vocab;
        for (int32_t id = 0; same_vocab && id < m_.hparams().n_vocab; ++id)
            same_vocab = d.token_text(id) == m_.token_text(id);
        if (!same_vocab)
            return {SPECULA_ERR_VOCAB_MISMATCH, "the draft's vocabulary is not the target's"};
        if (d.hparams().n_mels != m_.hparams().n_mels ||
            d.hparams().n_audio_ctx != m_.hparams().n_audio_ctx)
            return InvalidArgument("the draft hears other mel bins or windows than the target (" +
                                   std::to_string(d.hparams().n_mels) + " bins, " +
                                   std::to_string(d.hparams().n_audio_ctx) + " positions)");
        if (&p_.draft->backend() != &ctx_.backend())
            return InvalidArgument("the draft is on another backend than the target");
        return Status::Ok();
    }

    Status run(std::span<const float> samples, std::vector<Segment>* segments) {
        SPECULA_TRY(m_.check_target());
        SPECULA_TRY(check_draft());
        shared_encoder_ = p_.draft != nullptr && p_.draft->shares_encoder_with(m_);
        if (!t_.multilingual && (p_.translate || p_.language > 0))
            return InvalidArgument("an English-only model can only transcribe English");
        if (p_.language < -1 || p_.language >= t_.n_languages)
            return InvalidArgument("language index " + std::to_string(p_.language) +
                                   " is out of range");
        audio::LogMel mel;
        // The draft encodes a window from `mel` only when it first drafts there: never after
        // this loop.
        struct ForgetLater {
            WhisperContext* draft;
            ~ForgetLater() {
                if (draft != nullptr) draft->forget_later();
            }
        } forget_later{p_.draft};
        const auto mel_start = std::chrono::steady_clock::now();
        Backend& be = ctx_.backend();
        SPECULA_TRY(
            audio::log_mel(samples, m_.mel_filters(), &mel,
                           [&be](size_t n, const auto& fn) { be.parallel_for_host(n, fn); }));
        stats_.mel_seconds = seconds_since(mel_start);
        const int content = mel.n_frames - audio::kWhisperChunkFrames;
        const int window = ctx_.window_frames();
        const int64_t content_ms = int64_t(content) * kMsPerFrame;
        language_ = t_.multilingual ? p_.language : 0;
        std::vector<int32_t> history;  // the tokens of the segments so far, since a reset
        int seek = 0;
        while (seek < content) {
            const int count = std::min(window, content - seek);
            auto t0 = std::chrono::steady_clock::now();
            SPECULA_TRY(ctx_.encode(mel, seek));
            if (p_.draft != nullptr)
                SPECULA_TRY(shared_encoder_ ? p_.draft->encode_shared_later(ctx_)
                                            : p_.draft->encode_later(mel, seek));
            stats_.encode_seconds += seconds_since(t0);
            ++stats_.windows;
            t0 = std::chrono::steady_clock::now();
            if (language_ < 0) {
                std::vector<float> probs;
                SPECULA_TRY(detect(&probs));
                language_ = int(std::max_element(probs.begin(), probs.end()) - probs.begin());
            }
            Attempt a;
            forced_ = seek == 0 ? p_.forced : std::span<const int32_t>();
            SPECULA_TRY(decode_with_fallback(history, &a));
            if (p_.on_window) p_.on_window(seek, a.tokens);
            stats_.decode_seconds += seconds_since(t0);
            const bool silent =
                a.no_speech_prob > p_.no_speech_threshold && a.avg_logprob < p_.logprob_threshold;
            int advance = count;
            if (!silent) {
                std::vector<Segment> found;
                advance = split_segments(m_, a.tokens, seek, count, &found);
                for (Segment& s : found) {
                    // A timestamp past the audio's end (the window's padding) ends at its end.
                    s.t0_ms = std::min(s.t0_ms, content_ms);
                    s.t1_ms = std::min(s.t1_ms, content_ms);
                    if (p_.on_segment) p_.on_segment(s);
                    segments->push_back(std::move(s));
                }
                if (!p_.condition_on_previous_text || a.temperature > 0.5f) history.clear();
                history.insert(history.end(), a.tokens.begin(), a.tokens.end());
            }
            // A window that ends on a timestamp at its start would not move: it moves whole.
            seek += advance > 0 ? std::min(advance, count) : count;
            if (p_.one_window) break;
            if (p_.progress && !p_.progress(float(std::min(seek, content)) / float(content)))
                return {SPECULA_ERR_ABORTED,
                        "transcription was cancelled by the progress callback"};
        }
        stats_.language = language_;
        return Status::Ok();
    }

  private:
    Status decode_with_fallback(const std::vector<int32_t>& history, Attempt* best) {
        for (float temperature = p_.temperature;; temperature += p_.temperature_increment) {
            SPECULA_TRY(decode(history, temperature, best));
            bool fallback = best->avg_logprob < p_.logprob_threshold ||
                            (best->tokens.size() > size_t(kEntropyTokens) &&
                             best->entropy < p_.entropy_threshold);
            if (best->no_speech_prob > p_.no_speech_threshold &&
                best->avg_logprob < p_.logprob_threshold)
                fallback = false;  // silence: no temperature makes it speech
            if (!fallback || !can_fall_back(temperature)) return Status::Ok();
            ++stats_.fallbacks;
        }
    }

    // Whether an attempt at `temperature` may be followed by one at a higher temperature.
    bool can_fall_back(float temperature) const {
        return p_.temperature_increment > 0.0f &&
               temperature + p_.temperature_increment <= 1.0f + 1e-6f;
    }

    // OpenAI's DecodingTask for one sequence: <|startofprev|> and the previous text, the
    // start-of-transcript sequence, then tokens until <|endoftext|> or half the context.
    Status decode(const std::vector<int32_t>& history, float temperature, Attempt* out) {
        const int n_ctx = ctx_.n_ctx();
        Attempt a;
        a.temperature = temperature;
        std::vector<int32_t> prefix;
        if (!history.empty()) {
            const size_t keep = std::min(history.size(), size_t(n_ctx / 2 - 1));
            prefix.push_back(t_.prev);
            prefix.insert(prefix.end(), history.end() - ptrdiff_t(keep), history.end());
        }
        prefix.push_back(t_.sot);
        std::vector<int32_t> task;
        if (t_.multilingual) {
            task.push_back(t_.language(language_));
            task.push_back(p_.translate ? t_.translate : t_.transcribe);
        }
        if (!p_.timestamps) task.push_back(t_.no_timestamps);

        // The no-speech probability is read at <|startoftranscript|>.
        generator_.reset();
        SPECULA_TRY(generator_.append(prefix));
        std::vector<float> row;
        SPECULA_TRY(generator_.last_logits(&row));
        // One entry of the softmax, by log_sum_exp()'s det:: arithmetic (a log_softmax of the
        // whole row in double precision took ~0.6 ms a window).
        a.no_speech_prob = std::exp(double(row[size_t(t_.nosp)]) - double(log_sum_exp(row)));
        if (!task.empty()) SPECULA_TRY(generator_.append(task));

        SamplingParams sp;
        sp.temperature = temperature;
        // Each attempt draws its own noise (the Generator counts steps from 0 each time).
        sp.seed = p_.seed + 0x9E3779B97F4A7C15ull * ++attempts_;
        generator_.set_sampling(sp);
        generator_.begin_masks(mask_program(token_rules(rules_)));
        if (!forced_.empty()) {
            for (int32_t id : forced_)
                if (id < 0 || id >= m_.hparams().n_vocab || (id >= t_.eot && !t_.is_timestamp(id)))
                    return InvalidArgument("a forced token is neither text nor a timestamp");
            SPECULA_TRY(generator_.append(forced_));
            a.tokens.assign(forced_.begin(), forced_.end());
        }
        // The mean log-probability decides a fallback, and whether a window whose no-speech
        // probability is high is silence; without either question it is not computed (a
        // log-sum-exp over the vocabulary for every verified row).
        const bool need_logprobs =
            can_fall_back(temperature) || a.no_speech_prob > p_.no_speech_threshold;
        double sum = 0;
        const int most = std::min(n_ctx / 2, n_ctx - int(generator_.committed().size()));
        std::vector<int32_t> emitted;
        std::vector<float> logprobs;
        for (bool done = false; !done;) {
            emitted.clear();
            logprobs.clear();
            SPECULA_TRY(generator_.step(most - int(a.tokens.size()), &emitted,
                                        need_logprobs ? &logprobs : nullptr));
            for (size_t i = 0; i < emitted.size() && !done; ++i) {
                if (need_logprobs) sum += logprobs[i];
                done = emitted[i] == t_.eot;
                if (done) break;
                a.tokens.push_back(emitted[i]);
                ++stats_.tokens;
                done = int(a.tokens.size()) >= most;
            }
        }
        add(generator_.stats());
        a.avg_logprob = sum / double(a.tokens.size() + 1);
        std::map<int32_t, int> counts;
        const size_t from =
            a.tokens.size() > size_t(kEntropyTokens) ? a.tokens.size() - size_t(kEntropyTokens) : 0;
        for (size_t i = from; i < a.tokens.size(); ++i)
            ++counts[a.tokens[i]];
        for (const auto& [token, n] : counts) {
            const double q = double(n) / double(a.tokens.size() - from);
            a.entropy -= q * std::log(q);
        }
        *out = std::move(a);
        return Status::Ok();
    }

    WhisperContext& ctx_;
    const WhisperModel& m_;
    const WhisperTokens& t_;
    const TranscribeParams& p_;
    TranscribeStats& stats_;
    void add(const GeneratorStats& g) { add_decoding(g, &stats_.decoding); }

    Rules rules_;
    int language_ = 0;
    uint64_t attempts_ = 0;
    bool shared_encoder_ = false;      // the draft decodes from the target's encoder output
    std::span<const int32_t> forced_;  // the window's transcript begins with these
    Generator generator_;
};

}  // namespace

namespace {

Segment segment(const WhisperModel& m, std::span<const int32_t> tokens, int64_t t0_ms,
                int64_t t1_ms) {
    Segment s;
    s.t0_ms = t0_ms;
    s.t1_ms = t1_ms;
    for (int32_t id : tokens)
        if (id < m.tokens().eot) {
            s.text += m.token_text(id);
            s.tokens.push_back(id);
        }
    return s;
}

}  // namespace

int split_segments(const WhisperModel& m, std::span<const int32_t> tokens, int seek, int count,
                   std::vector<Segment>* out) {
    const WhisperTokens& t = m.tokens();
    const int64_t offset_ms = int64_t(seek) * kMsPerFrame;
    const auto ms = [&](int32_t ts) {
        return offset_ms + int64_t(ts - t.timestamp_begin) * kFramesPerTimestamp * kMsPerFrame;
    };
    const auto is_ts = [&](size_t i) { return t.is_timestamp(tokens[i]); };
    const size_t n = tokens.size();
    const bool single_ending = n >= 2 && !is_ts(n - 2) && is_ts(n - 1);
    std::vector<size_t> slices;
    for (size_t i = 1; i < n; ++i)
        if (is_ts(i - 1) && is_ts(i)) slices.push_back(i);
    if (slices.empty()) {
        int64_t end = offset_ms + int64_t(count) * kMsPerFrame;
        for (size_t i = n; i-- > 0;)
            if (is_ts(i)) {
                if (tokens[i] != t.timestamp_begin) end = ms(tokens[i]);
                break;
            }
        Segment s = segment(m, tokens, offset_ms, end);
        if (!s.text.empty()) out->push_back(std::move(s));
        return count;
    }
    if (single_ending) slices.push_back(n);
    size_t last = 0;
    for (size_t cut : slices) {
        const std::span<const int32_t> piece = tokens.subspan(last, cut - last);
        Segment s = segment(m, piece, ms(piece.front()), ms(piece.back()));
        if (!s.text.empty()) out->push_back(std::move(s));
        last = cut;
    }
    if (single_ending) return count;
    return (tokens[last - 1] - t.timestamp_begin) * kFramesPerTimestamp;
}

Status transcribe(WhisperContext& ctx, std::span<const float> samples, const TranscribeParams& p,
                  std::vector<Segment>* segments, TranscribeStats* stats) {
    TranscribeStats local;
    Transcriber t(ctx, p, stats ? stats : &local);
    return t.run(samples, segments);
}

void add_decoding(const GeneratorStats& g, GeneratorStats* to) {
    GeneratorStats& s = *to;
    s.steps += g.steps;
    s.drafted += g.drafted;
    s.evaluated += g.evaluated;
    s.accepted += g.accepted;
    s.emitted += g.emitted;
    for (size_t i = 0; i < s.evaluated_at.size(); ++i) {
        s.evaluated_at[i] += g.evaluated_at[i];
        s.accepted_at[i] += g.accepted_at[i];
    }
    s.draft_seconds += g.draft_seconds;
    s.target_seconds += g.target_seconds;
    s.verify_seconds += g.verify_seconds;
    s.last_gamma = g.last_gamma;
}

void add_stats(const TranscribeStats& from, TranscribeStats* to) {
    to->mel_seconds += from.mel_seconds;
    to->encode_seconds += from.encode_seconds;
    to->decode_seconds += from.decode_seconds;
    to->windows += from.windows;
    to->fallbacks += from.fallbacks;
    to->tokens += from.tokens;
    to->language = from.language;
    add_decoding(from.decoding, &to->decoding);
}

Status detect_language(WhisperContext& ctx, std::vector<float>* probs) {
    if (!ctx.model().tokens().multilingual)
        return InvalidArgument("an English-only model has no languages to detect");
    TranscribeParams p;
    TranscribeStats stats;
    Transcriber t(ctx, p, &stats);
    return t.detect(probs);
}

}  // namespace specula::asr
