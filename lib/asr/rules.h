// Whisper's rules on the logits of the next token, as OpenAI's decoding.py applies
// them (SuppressBlank, SuppressTokens, ApplyTimestampRules) with whisper.cpp's choice of
// suppressed special tokens (whisper_process_logits): every special token but <|endoftext|> and
// the timestamps, never the non-speech symbols. Where the two differ, OpenAI's is followed: a
// timestamp may not go back nor repeat the last one (whisper.cpp allows repeating it), and
// with timestamps the first token must be one (whisper.cpp does not force it). Whether the
// timestamps together outweigh the text is decided in det:: float arithmetic (OpenAI: float32
// log-softmax), so that every backend decides alike. They are written as a mask program
// (sampling/mask_program.h), which the backends apply to each row of a speculative step.
#pragma once

#include <cstdint>
#include <span>

#include "models/whisper.h"
#include "sampling/mask_program.h"

namespace specula::asr {

struct Rules {
    WhisperTokens tokens;
    int32_t space = -1;  // the token " " (suppressed first, with <|endoftext|>); -1: none
    bool timestamps = true;
    bool suppress_blank = true;
    // The first timestamp is at most <|max_initial_timestamp * 0.02|> (OpenAI's default 1.0 s).
    int max_initial_timestamp = 50;
    // The last timestamp a window has: <|n_audio_ctx * 0.02|> (all 1501 of them at 30 s; models
    // with shorter windows cannot place text past their end).
    int max_timestamp = 1500;
};

// The ids and settings the rules read, as plain integers (a test writes them for a toy
// vocabulary).
struct TokenRules {
    int32_t eot = 0, sot = 0, translate = 0, transcribe = 0, solm = 0, prev = 0, nosp = 0,
            no_timestamps = 0;
    int32_t language_begin = 0, language_end = 0;  // [begin, end): the language tokens
    int32_t timestamp_begin = 0;                   // every id from here is a timestamp
    int32_t space = -1;  // the token " " (suppressed first, with <|endoftext|>); -1: none
    bool timestamps = true;
    bool suppress_blank = true;
    // The first timestamp is at most <|max_initial_timestamp * 0.02|>; < 0: no limit.
    int32_t max_initial_timestamp = 50;
    // The last timestamp a window has: <|max_timestamp * 0.02|>.
    int32_t max_timestamp = 1500;
};
TokenRules token_rules(const Rules& rules);

// The rules as a mask program, the timestamps its marked tokens (what the backends run).
MaskProgram mask_program(const TokenRules& rules);

// Masks (sets to -infinity) the logits of the tokens that may not follow `sampled` (the tokens
// decoded after the prompt), in place. logits: one row of n_vocab.
void apply_rules(const Rules& rules, std::span<const int32_t> sampled, std::span<float> logits);

// log_softmax of a row (masked entries stay -infinity), in double precision.
void log_softmax(std::span<const float> logits, std::span<double> out);

}  // namespace specula::asr
