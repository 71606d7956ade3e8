// A read-only memory mapping of a whole file (POSIX mmap). Weights are read
// in place from the mapping: loading a model costs no copy on the cpu backend.
// A mapped file that shrinks on disk while mapped faults the process (SIGBUS)
// when the lost pages are read; `copy` reads the file into memory instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace specula {

class MappedFile {
  public:
    static Status open(const std::string& path, std::unique_ptr<MappedFile>* out,
                       bool copy = false);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    // A copy of bytes held in memory (a model loaded from a buffer).
    static std::unique_ptr<MappedFile> copy_of(std::span<const uint8_t> bytes) {
        return std::unique_ptr<MappedFile>(
            new MappedFile(std::vector<uint8_t>(bytes.begin(), bytes.end())));
    }

    std::span<const uint8_t> bytes() const { return {data_, size_}; }
    // Gives back the pages that lie wholly inside `range` (bytes of this file) where the file
    // is mapped: touched again, they are read from the file again. A model's weights once the
    // backend holds its own copy, which would otherwise stay resident as long as the model.
    void release(std::span<const uint8_t> range) const;

  private:
    MappedFile(const uint8_t* data, size_t size) : data_(data), size_(size) {}
    explicit MappedFile(std::vector<uint8_t> copy)
        : data_(copy.data()), size_(copy.size()), copy_(std::move(copy)) {}
    const uint8_t* data_;
    size_t size_;
    std::vector<uint8_t> copy_;  // the file's bytes when read instead of mapped
};

}  // namespace specula
