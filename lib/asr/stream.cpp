#include "asr/stream.h"

#include <algorithm>
#include <new>

namespace specula::asr {

namespace {

constexpr int kFrame = audio::VoiceDetector::kFrameSamples;
constexpr int kSamplesPerMs = audio::kWhisperSampleRate / 1000;
// Hypotheses of a shorter utterance (pre-roll included) are not agreed on (docs/DESIGN.md).
constexpr int kAgreeAfterMs = 2500;

}  // namespace

Status Stream::create(WhisperContext& ctx, const StreamParams& p, std::unique_ptr<Stream>* out) {
    const auto within = [](int v, int lo, int hi, const char* name) {
        return v >= lo && v <= hi
                   ? Status::Ok()
                   : InvalidArgument(std::string(name) + " must be within " + std::to_string(lo) +
                                     " .. " + std::to_string(hi) + " (got " + std::to_string(v) +
                                     ")");
    };
    SPECULA_TRY(within(p.step_ms, 0, 30000, "step_ms"));
    SPECULA_TRY(within(p.end_silence_ms, 100, 10000, "end_silence_ms"));
    SPECULA_TRY(within(p.pre_roll_ms, 0, 2000, "pre_roll_ms"));
    // A window is 30 s; an utterance leaves room for its cut to find a segment's end.
    SPECULA_TRY(within(p.max_utterance_ms, 2000, 28000, "max_utterance_ms"));
    std::unique_ptr<Stream> s(new (std::nothrow) Stream(ctx, p));
    if (s == nullptr) return OutOfMemory("a stream");
    SPECULA_TRY(audio::VoiceDetector::create(p.vad_aggressiveness, &s->vad_));
    *out = std::move(s);
    return Status::Ok();
}

Status Stream::push(std::span<const float> samples, int sample_rate) {
    if (finished_) return InvalidArgument("the stream is finished: audio after its end");
    if (resampler_ != nullptr && sample_rate != resampler_->from_rate())
        return InvalidArgument("the stream's sample rate is " +
                               std::to_string(resampler_->from_rate()) + " Hz, not " +
                               std::to_string(sample_rate) + " Hz");
    if (sample_rate > 0 && samples.size() > size_t(kMaxPushSeconds) * size_t(sample_rate))
        return InvalidArgument("more than " + std::to_string(kMaxPushSeconds) +
                               " s of audio in one push");
    if (resampler_ == nullptr)
        SPECULA_TRY(
            audio::StreamResampler::create(sample_rate, audio::kWhisperSampleRate, &resampler_));
    stats_.audio_seconds += double(samples.size()) / double(sample_rate);
    try {
        SPECULA_TRY(resampler_->push(samples, false, &pending_));
        size_t at = 0;
        Status s = Status::Ok();
        for (; s.ok() && pending_.size() - at >= size_t(kFrame); at += kFrame)
            s = frame(std::span<const float, kFrame>(pending_.data() + at, kFrame));
        pending_.erase(pending_.begin(), pending_.begin() + ptrdiff_t(at));
        return s;
    } catch (const std::bad_alloc&) {
        return OutOfMemory("a stream's audio");
    }
}

Status Stream::finish() {
    if (finished_) return InvalidArgument("the stream is already finished");
    finished_ = true;
    if (resampler_ != nullptr) SPECULA_TRY(resampler_->push({}, true, &pending_));
    size_t at = 0;
    for (; pending_.size() - at >= size_t(kFrame); at += kFrame)
        SPECULA_TRY(frame(std::span<const float, kFrame>(pending_.data() + at, kFrame)));
    if (!in_utterance_) return Status::Ok();
    utterance_.insert(utterance_.end(), pending_.begin() + ptrdiff_t(at), pending_.end());
    pending_.clear();
    return end_utterance();
}

Status Stream::frame(std::span<const float, kFrame> x) {
    ++frames_;
    bool voiced = false;
    SPECULA_TRY(vad_->voiced(x, &voiced));
    if (voiced) stats_.voiced_seconds += double(kFrame) / audio::kWhisperSampleRate;
    if (!in_utterance_) {
        const size_t keep = size_t(p_.pre_roll_ms) * kSamplesPerMs;
        if (!voiced) {
            utterance_.insert(utterance_.end(), x.begin(), x.end());
            if (utterance_.size() > keep)
                utterance_.erase(utterance_.begin(),
                                 utterance_.end() - ptrdiff_t(std::min(keep, utterance_.size())));
            return Status::Ok();
        }
        // The pre-roll (the frames before this one, at most pre_roll_ms) opens the utterance.
        in_utterance_ = true;
        ++stats_.utterances;
        utterance_start_ = (frames_ - 1) * kFrame - int64_t(utterance_.size());
        silent_frames_ = 0;
        since_partial_ = 0;
        committed_.clear();
        previous_.clear();
    }
    utterance_.insert(utterance_.end(), x.begin(), x.end());
    since_partial_ += kFrame;
    silent_frames_ = voiced ? 0 : silent_frames_ + 1;
    if (silent_frames_ * kFrame >= p_.end_silence_ms * kSamplesPerMs) return end_utterance();
    if (utterance_.size() >= size_t(p_.max_utterance_ms) * kSamplesPerMs) return cut();
    if (p_.step_ms > 0 && since_partial_ >= p_.step_ms * kSamplesPerMs) return partial();
    return Status::Ok();
}

Status Stream::decode(bool last, std::vector<int32_t>* tokens, std::vector<Segment>* segments) {
    TranscribeParams t = p_.transcribe;
    t.forced = committed_;
    t.one_window = true;
    t.on_segment = nullptr;
    t.progress = nullptr;
    tokens->clear();
    t.on_window = [tokens](int seek, std::span<const int32_t> window) {
        if (seek == 0) tokens->assign(window.begin(), window.end());
    };
    // A partial hypothesis is a glimpse: one greedy attempt, no fallback.
    if (!last) t.temperature_increment = 0;
    TranscribeStats s;
    const Status st = transcribe(ctx_, utterance_, t, segments, &s);
    add_stats(s, &stats_.transcription);
    return st;
}

std::string Stream::text_of(std::span<const int32_t> tokens) const {
    std::string text;
    for (int32_t id : tokens)
        if (id < ctx_.model().tokens().eot) text += ctx_.model().token_text(id);
    return text;
}

void Stream::emit_final(const Segment& s) {
    if (!p_.on_event) return;
    StreamEvent e;
    e.final = true;
    const int64_t start_ms = utterance_start_ / kSamplesPerMs;
    const int64_t end_ms = start_ms + int64_t(utterance_.size()) / kSamplesPerMs;
    e.t0_ms = std::min(start_ms + s.t0_ms, end_ms);
    e.t1_ms = std::min(start_ms + s.t1_ms, end_ms);
    e.text = s.text;
    e.stable_bytes = e.text.size();
    p_.on_event(e);
}

Status Stream::partial() {
    since_partial_ = 0;
    ++stats_.partial_decodes;
    std::vector<int32_t> hypothesis;
    std::vector<Segment> ignored;
    SPECULA_TRY(decode(false, &hypothesis, &ignored));
    // LocalAgreement-2: what this hypothesis and the one before begin with is committed. Both
    // begin with the committed tokens already (every decoding is forced to).
    size_t n = committed_.size();
    while (n < hypothesis.size() && n < previous_.size() && hypothesis[n] == previous_[n])
        ++n;
    committed_.assign(hypothesis.begin(), hypothesis.begin() + ptrdiff_t(n));
    if (p_.on_event) {
        StreamEvent e;
        e.t0_ms = utterance_start_ / kSamplesPerMs;
        e.t1_ms = e.t0_ms + int64_t(utterance_.size()) / kSamplesPerMs;
        e.text = text_of(hypothesis);
        e.stable_bytes = text_of(committed_).size();
        p_.on_event(e);
    }
    // A hypothesis of the utterance's first moments is shown but takes no part in agreement:
    // two of them agree on guesses (a leading "The") that the whole utterance would not make.
    if (utterance_.size() >= size_t(kAgreeAfterMs) * kSamplesPerMs)
        previous_ = std::move(hypothesis);
    return Status::Ok();
}

Status Stream::end_utterance() {
    ++stats_.final_decodes;
    std::vector<int32_t> tokens;
    std::vector<Segment> segments;
    SPECULA_TRY(decode(true, &tokens, &segments));
    for (const Segment& s : segments)
        emit_final(s);
    in_utterance_ = false;
    utterance_.clear();
    committed_.clear();
    previous_.clear();
    return Status::Ok();
}

Status Stream::cut() {
    ++stats_.cuts;
    ++stats_.final_decodes;
    std::vector<int32_t> tokens;
    std::vector<Segment> ignored;
    SPECULA_TRY(decode(true, &tokens, &ignored));
    const int count = int(utterance_.size()) / kFrame;
    std::vector<Segment> closed;
    const int advance = split_segments(ctx_.model(), tokens, 0, count, &closed);
    for (const Segment& s : closed)
        emit_final(s);
    const WhisperTokens& t = ctx_.model().tokens();
    if (advance <= 0 || advance >= count) {  // nothing left unfinished: a fresh start
        utterance_start_ += int64_t(utterance_.size());
        utterance_.clear();
        committed_.clear();
        previous_.clear();
        return Status::Ok();
    }
    // The unfinished segment begins at the later of the last two consecutive timestamps; the
    // utterance goes on from the earlier (where `advance` points), and the segment's committed
    // text stays committed, its timestamp counted from the new start.
    size_t begin = 0;
    for (size_t i = 1; i < tokens.size(); ++i)
        if (t.is_timestamp(tokens[i - 1]) && t.is_timestamp(tokens[i])) begin = i;
    std::vector<int32_t> carried;
    if (begin > 0 && committed_.size() > begin + 1) {
        carried.push_back(t.timestamp_begin + (tokens[begin] - tokens[begin - 1]));
        carried.insert(carried.end(), committed_.begin() + ptrdiff_t(begin) + 1, committed_.end());
    }
    const size_t drop = size_t(advance) * kFrame;
    utterance_.erase(utterance_.begin(), utterance_.begin() + ptrdiff_t(drop));
    utterance_start_ += int64_t(drop);
    committed_ = std::move(carried);
    previous_.clear();
    since_partial_ = 0;
    return Status::Ok();
}

}  // namespace specula::asr
