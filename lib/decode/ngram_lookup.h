// Model-free drafts (prompt lookup decoding, as llama.cpp's llama-lookup and Saxena's prompt
// lookup): where the last n tokens of the sequence occurred before, in the prompt or in what was
// generated, the tokens that followed them are proposed as drafts. Code being edited, a document
// being quoted or summarised, a list being continued repeat long runs of the context; the
// target judges every proposal, so the output is the target's whatever is proposed.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "specula.h"

namespace specula {

constexpr int kMaxLookupNgram = SPECULA_MAX_LOOKUP_NGRAM;

class NgramLookup {
  public:
    struct Match {
        int ngram = 0;                // the length of the suffix matched (0: none)
        std::vector<int32_t> drafts;  // what followed its latest earlier occurrence
    };
    // max_ngram in 1..kMaxLookupNgram: the longest suffix tried first, down to one token.
    explicit NgramLookup(int max_ngram);

    // The proposal after `tokens`, which extends the sequence of the last call (truncate()
    // where it does not): up to `count` tokens that followed the latest earlier occurrence of
    // its longest suffix of at most max_ngram tokens that occurred before. A continuation that
    // reaches the end of the sequence repeats the period it found (after "a b c a b" the suffix
    // "a b" is followed by "c a b c ...").
    Match find(std::span<const int32_t> tokens, int count);
    // The sequence keeps only its first n tokens.
    void truncate(size_t n);
    int max_ngram() const { return max_ngram_; }

  private:
    int max_ngram_;
    // Per length n: the hash of an n-gram -> the position after its latest occurrence.
    std::array<std::unordered_map<uint64_t, uint32_t>, kMaxLookupNgram + 1> latest_;
    // The n-grams that end before this position are indexed (not the suffix itself, which must
    // find its earlier occurrences).
    size_t indexed_ = 1;
};

}  // namespace specula
