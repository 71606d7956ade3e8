// Whisper's transcription loop over audio of any length (host side), as OpenAI's
// transcribe.py runs it: 30 s windows (2 * n_audio_ctx mel frames) moved by the last timestamp
// the model emits (seek), the decoder prompted with the previous window's text, temperature
// fallback (0, 0.2, ... 1.0) while a window's text looks repetitive or unlikely, and windows
// the model hears as silence skipped. One difference, from whisper.cpp: repetition is measured
// by the entropy of the last 32 tokens (whisper.cpp's entropy_thold) rather than by zlib's
// compression ratio, so the runtime needs no compressor.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "decode/generator.h"
#include "models/whisper.h"

namespace specula::asr {

struct Segment {
    int64_t t0_ms = 0, t1_ms = 0;  // from the start of the audio
    std::string text;
    std::vector<int32_t> tokens;  // text tokens (timestamps left out)
};

struct TranscribeParams {
    int language = 0;  // index in kWhisperLanguages; -1: detected from the first window
    bool translate = false;
    bool timestamps = true;
    bool condition_on_previous_text = true;
    float temperature = 0.0f;            // the first; fallbacks add temperature_increment
    float temperature_increment = 0.2f;  // <= 0: no fallback
    float entropy_threshold = 2.4f;      // below: repetitive, fall back
    float logprob_threshold = -1.0f;     // mean log-probability below: fall back
    float no_speech_threshold = 0.6f;    // P(<|nospeech|>) above (and logprob low): silence
    uint64_t seed = 0;
    // Speculative decoding: a draft Whisper with the target's vocabulary, mel bins and window
    // (it encodes each window itself), and how many drafts a step takes.
    WhisperContext* draft = nullptr;
    // The analytic policy's measurements of this target and draft, kept by the caller from
    // one transcription to the next (null: each transcription measures afresh).
    PairMeasurements* measurements = nullptr;
    GammaPolicy gamma_policy = GammaPolicy::kAnalytic;
    int gamma = 4, gamma_max = 8;
    // The first window's transcript begins with these tokens, timestamps included (a live
    // stream's words that consecutive hypotheses agreed on); the model continues after them.
    std::span<const int32_t> forced;
    bool one_window = false;  // the first window only (a stream's utterance fits in one)
    std::function<void(const Segment&)> on_segment;
    // Each window's tokens as sampled (timestamps included, <|endoftext|> not), with its start.
    std::function<void(int seek, std::span<const int32_t> tokens)> on_window;
    std::function<bool(float)> progress;  // fraction done; false aborts
};

struct TranscribeStats {
    double mel_seconds = 0, encode_seconds = 0, decode_seconds = 0;
    int windows = 0, fallbacks = 0, tokens = 0;
    int language = -1;        // the language used (detected or given)
    GeneratorStats decoding;  // every attempt's steps, summed (speculative or not)
};

// Transcribes 16 kHz mono samples. A model without a language it was asked for, or a
// multilingual task on an English-only model, is SPECULA_ERR_INVALID_ARGUMENT; a draft of
// another vocabulary SPECULA_ERR_VOCAB_MISMATCH, of other mel bins or windows
// SPECULA_ERR_INVALID_ARGUMENT. The tokens are sampled by the speculative Generator with the
// rules on the device (plain decoding: no draft), so a draft changes no greedy transcript and
// no sampled transcript (the coupled acceptance: the target alone's for the seed).
Status transcribe(WhisperContext& ctx, std::span<const float> samples, const TranscribeParams& p,
                  std::vector<Segment>* segments, TranscribeStats* stats);

// OpenAI's segments of one window's sampled tokens (text and timestamps, no prompt): cut
// between consecutive timestamps, times counted from the window's first frame `seek`. Returns
// the frames the next window starts after this one's: up to its last closed timestamp, or all
// `count` when the tokens end in a single timestamp or hold no pair of them.
int split_segments(const WhisperModel& model, std::span<const int32_t> tokens, int seek, int count,
                   std::vector<Segment>* out);

// Sums of a transcription's (or a decoding's) figures, for callers that run several.
void add_decoding(const GeneratorStats& from, GeneratorStats* to);
void add_stats(const TranscribeStats& from, TranscribeStats* to);

// The probability of each language at the first window of mel (multilingual models).
Status detect_language(WhisperContext& ctx, std::vector<float>* probs);

}  // namespace specula::asr
