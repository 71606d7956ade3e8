// What the speculative Generator drives: a causal decoder over one sequence that evaluates
// tokens after what its cache holds, leaves their logits on the backend, and rolls back by
// forgetting positions. LlamaContext is one; WhisperContext is one once a window is encoded.
#pragma once

#include <span>
#include <vector>

#include "backend/backend.h"

namespace specula {

class Decoder {
  public:
    virtual ~Decoder() = default;

    virtual Backend& backend() const = 0;
    virtual int n_vocab() const = 0;
    virtual int n_ctx() const = 0;      // positions the cache holds
    virtual int max_batch() const = 0;  // tokens one forward evaluates
    virtual int n_past() const = 0;
    // Forgets positions >= n (a length counter: no data moves).
    virtual void truncate(int n) = 0;
    // Does work the decoder deferred until it is used (a Whisper draft's cross-attention keys
    // and values of the window), so that it is not timed as a forward; record() does it too.
    virtual Status prepare() { return Status::Ok(); }

    // Records a forward of the ids.cols token ids already on the device (e.g. written by
    // Backend::verify) at positions n_past.. and leaves their logits in logits(rows): every row
    // when all_rows, else the last. Nothing waits for the device.
    virtual Status record(const Tensor& ids, bool all_rows) = 0;
    // Columns [first, first + count) of the decoder's token-id input buffer.
    virtual Tensor input_ids(int first, int count) const = 0;
    virtual Tensor logits(int rows) const = 0;

    // The same with host traffic: uploads the tokens, records, and downloads rows * n_vocab
    // logits. Nothing is appended when it fails.
    Status forward(std::span<const int32_t> tokens, bool all_rows, std::vector<float>* logits);

  protected:
    // Columns [first, first + count) of a one-row I32 tensor of token ids (input_ids()).
    static Tensor id_columns(const Tensor& ids, int first, int count) {
        Tensor t = ids;
        t.offset += size_t(first) * sizeof(int32_t);
        t.cols = count;
        return t;
    }
};

}  // namespace specula
