// A file of token ids, whitespace-separated (examples/models/specula-whisper-draft.tokens): the
// tokens a draft proposes (specula_asr_draft_load). False for a file that cannot be read, holds
// no id, or holds anything else.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

inline bool read_token_list(const std::string& path, std::vector<int32_t>* ids) {
    std::ifstream in(path);
    ids->clear();
    for (int32_t id = 0; in >> id;)
        ids->push_back(id);
    return !ids->empty() && in.eof();
}
