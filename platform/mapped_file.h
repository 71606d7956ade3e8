// A read-only memory mapping of a whole file (POSIX mmap). Weights are read
// in place from the mapping: loading a model costs no copy on the cpu backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"

namespace specula {

class MappedFile {
  public:
    static Status open(const std::string& path, std::unique_ptr<MappedFile>* out);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    std::span<const uint8_t> bytes() const { return {data_, size_}; }

  private:
    MappedFile(const uint8_t* data, size_t size) : data_(data), size_(size) {}
    const uint8_t* data_;
    size_t size_;
};

}  // namespace specula
