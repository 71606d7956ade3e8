// Live transcription (host side): audio pushed as it arrives, cut into utterances by voice
// activity detection, each re-decoded as it grows and finished when its speaker pauses.
//
// Whisper hears 30 s windows, so a stream is not a sliding window but a policy over whole
// decodings (whisper_streaming's LocalAgreement-2, Macháček et al. 2023): every `step_ms` of new
// speech the utterance so far is transcribed again; the tokens on which this hypothesis and the
// one before agree are committed, and every later decoding of the utterance is forced to begin
// with them, so the committed text never changes. When the voice detector hears `end_silence_ms`
// of silence the utterance is transcribed a last time (with the temperature fallback, as a batch
// transcription) and its segments become final. An utterance longer than `max_utterance_ms`
// makes its finished segments final and goes on from the start of its last one, so no window
// overflows and memory stays bounded however long the stream.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "asr/transcribe.h"
#include "audio/resample.h"
#include "audio/vad.h"

namespace specula::asr {

struct StreamEvent {
    bool final = false;  // a final segment (never changes) or the utterance's partial text
    int64_t t0_ms = 0, t1_ms = 0;  // from the start of the stream
    std::string text;
    // Partial: the first bytes of `text` that are committed (later partials and the finals
    // begin with them). Final: text.size().
    size_t stable_bytes = 0;
};

struct StreamParams {
    // Language, task, thresholds, draft and γ as for a batch transcription (its callbacks and
    // `forced` are the stream's own).
    TranscribeParams transcribe;
    int vad_aggressiveness = 2;    // 0..3, audio::VoiceDetector's
    int step_ms = 1000;            // new speech between partial hypotheses (0: no partials)
    int end_silence_ms = 600;      // silence that ends an utterance
    int pre_roll_ms = 30;          // audio before the first voiced frame an utterance keeps
    int max_utterance_ms = 20000;  // longer: its finished segments become final
    std::function<void(const StreamEvent&)> on_event;
};

struct StreamStats {
    double audio_seconds = 0, voiced_seconds = 0;
    int utterances = 0, partial_decodes = 0, final_decodes = 0, cuts = 0;
    TranscribeStats transcription;  // every decoding's, summed
};

class Stream {
  public:
    // Checks the parameters (SPECULA_ERR_INVALID_ARGUMENT naming the one out of range).
    static Status create(WhisperContext& ctx, const StreamParams& p, std::unique_ptr<Stream>* out);

    // Samples at `sample_rate` Hz (every push of a stream at the same rate, else
    // SPECULA_ERR_INVALID_ARGUMENT and nothing is consumed; at most kMaxPushSeconds of audio at
    // once). Decodes what became due in the caller's thread; events come through on_event.
    Status push(std::span<const float> samples, int sample_rate);
    // The end of the audio: the utterance under way is finished. Later pushes are
    // SPECULA_ERR_INVALID_ARGUMENT.
    Status finish();

    const StreamStats& stats() const { return stats_; }
    static constexpr int kMaxPushSeconds = 600;

  private:
    Stream(WhisperContext& ctx, const StreamParams& p) : ctx_(ctx), p_(p) {}
    Status frame(std::span<const float, audio::VoiceDetector::kFrameSamples> x);
    // One decoding of the utterance; `last`: with the temperature fallback, its segments kept.
    Status decode(bool last, std::vector<int32_t>* tokens, std::vector<Segment>* segments);
    Status partial();
    Status end_utterance();
    Status cut();
    void emit_final(const Segment& s);
    std::string text_of(std::span<const int32_t> tokens) const;

    WhisperContext& ctx_;
    StreamParams p_;
    StreamStats stats_;
    std::unique_ptr<audio::VoiceDetector> vad_;
    std::unique_ptr<audio::StreamResampler> resampler_;
    bool finished_ = false;
    std::vector<float> pending_;           // 16 kHz samples short of a whole frame
    int64_t frames_ = 0;                   // 10 ms frames judged since the start
    std::deque<std::vector<float>> roll_;  // the last frames before an utterance
    bool in_utterance_ = false;
    std::vector<float> utterance_;               // its samples from `utterance_start_`
    int64_t utterance_start_ = 0;                // in samples from the stream's start
    int silent_frames_ = 0;                      // since the utterance's last voiced frame
    int since_partial_ = 0;                      // samples since the last partial hypothesis
    std::vector<int32_t> committed_, previous_;  // agreed tokens; the last hypothesis
};

}  // namespace specula::asr
