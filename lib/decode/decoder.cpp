#include "decode/decoder.h"

#include <string>

namespace specula {

Status Decoder::forward(std::span<const int32_t> tokens, bool all_rows,
                        std::vector<float>* logits) {
    const int n = int(tokens.size());
    // Checked before the ids are uploaded; record() checks the context length.
    if (n == 0 || n > max_batch())
        return InvalidArgument("forward needs 1.." + std::to_string(max_batch()) + " tokens");
    for (int32_t t : tokens)
        if (t < 0 || t >= n_vocab())
            return InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary");

    Backend& be = backend();
    const Tensor ids = input_ids(0, n);
    be.upload(ids, tokens.data());
    const int past = n_past();
    SPECULA_TRY(record(ids, all_rows));
    const int rows = all_rows ? n : 1;
    logits->resize(size_t(rows) * size_t(n_vocab()));
    const Status s = be.download(this->logits(rows), logits->data());
    if (!s.ok()) truncate(past);  // the positions were not computed
    return s;
}

}  // namespace specula
