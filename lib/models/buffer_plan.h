// A context's buffers, listed once: their sum is checked against what the backend can give
// before any is allocated (an overcommitting host grants each buffer and kills the process when
// the pages are touched), then each is allocated.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace specula {

class BufferPlan {
  public:
    void add(Tensor* t, GgmlType type, int64_t cols, int64_t rows) {
        items_.push_back({t, type, cols, rows});
    }
    uint64_t bytes() const;
    // SPECULA_ERR_OUT_OF_MEMORY: "<what> needs N MiB; the <kind> backend can give M MiB".
    Status check_fits(const Backend& backend, const std::string& what) const;
    // Points every listed tensor at a new buffer of its own, kept in `owner`.
    Status allocate(Backend& backend, std::vector<std::unique_ptr<Buffer>>* owner) const;

  private:
    struct Item {
        Tensor* t;
        GgmlType type;
        int64_t cols, rows;
    };
    std::vector<Item> items_;
};

}  // namespace specula
