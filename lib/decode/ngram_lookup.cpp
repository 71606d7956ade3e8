#include "decode/ngram_lookup.h"

#include <algorithm>

namespace specula {

namespace {

// The hash of an n-gram grown by one token at its front.
uint64_t extended(uint64_t hash, int32_t token) {
    uint64_t z = (hash ^ uint32_t(token)) * 0x9E3779B97F4A7C15ull;
    return z ^ (z >> 29);
}

}  // namespace

NgramLookup::NgramLookup(int max_ngram) : max_ngram_(std::clamp(max_ngram, 1, kMaxLookupNgram)) {}

void NgramLookup::truncate(size_t n) {
    if (n + 1 >= indexed_) return;
    for (auto& m : latest_)  // a shorter sequence: indexed again as it grows (rare)
        m.clear();
    indexed_ = 1;
}

NgramLookup::Match NgramLookup::find(std::span<const int32_t> tokens, int count) {
    Match m;
    const size_t L = tokens.size();
    if (L < 2 || count <= 0) return m;
    if (L < indexed_) truncate(0);
    for (; indexed_ < L; ++indexed_) {  // the n-grams that end at indexed_
        uint64_t hash = 0;
        for (int n = 1; n <= max_ngram_ && size_t(n) <= indexed_; ++n) {
            hash = extended(hash, tokens[indexed_ - size_t(n)]);
            latest_[size_t(n)][hash] = uint32_t(indexed_);
        }
    }
    uint64_t hash = 0;
    size_t found = 0;
    for (int n = 1; n <= max_ngram_ && size_t(n) < L; ++n) {
        hash = extended(hash, tokens[L - size_t(n)]);
        const auto it = latest_[size_t(n)].find(hash);
        if (it == latest_[size_t(n)].end()) break;  // no longer suffix can have occurred
        const size_t p = it->second;
        if (!std::equal(tokens.begin() + std::ptrdiff_t(p - size_t(n)),
                        tokens.begin() + std::ptrdiff_t(p), tokens.end() - n))
            break;  // a hash collision
        m.ngram = n;
        found = p;
    }
    if (m.ngram == 0) return m;
    // What followed, repeating the period from the occurrence to the end where it runs out.
    const size_t period = L - found;
    for (int j = 0; j < count; ++j)
        m.drafts.push_back(tokens[found + size_t(j) % period]);
    return m;
}

}  // namespace specula
