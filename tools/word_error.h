// Words of a transcript as word error rates count them, and the edit distance between two word
// lists: shared by specula-eval-asr and the tests of the bundled speech pair.
#pragma once

#include <algorithm>
#include <cctype>
#include <sstream>
#include <string>
#include <vector>

namespace specula {

// Lower case, everything but letters and apostrophes a space.
inline std::vector<std::string> transcript_words(const std::string& text) {
    std::string s;
    for (unsigned char c : text)
        s += std::isalpha(c) || c == '\'' ? char(std::tolower(c)) : ' ';
    std::istringstream in(s);
    std::vector<std::string> out;
    for (std::string w; in >> w;)
        out.push_back(w);
    return out;
}

// Word-level edit distance.
inline size_t word_edits(const std::vector<std::string>& ref, const std::vector<std::string>& hyp) {
    std::vector<size_t> d(hyp.size() + 1);
    for (size_t j = 0; j <= hyp.size(); ++j)
        d[j] = j;
    for (size_t i = 1; i <= ref.size(); ++i) {
        size_t diag = d[0];
        d[0] = i;
        for (size_t j = 1; j <= hyp.size(); ++j) {
            const size_t up = d[j];
            d[j] = std::min({d[j] + 1, d[j - 1] + 1, diag + (ref[i - 1] != hyp[j - 1])});
            diag = up;
        }
    }
    return d[hyp.size()];
}

}  // namespace specula
