// Memory that starts on a cache line. A vector load that straddles two lines costs about two
// loads: with 16-byte aligned buffers (what malloc gives) every 64-byte load of the cpu kernels
// did, and their products ran ~20% slower (docs/DESIGN.md "The cpu backend").
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

namespace specula {

inline constexpr std::size_t kCacheLine = 64;

// For std::vector: its elements start on a cache line.
template <class T>
struct CacheAlignedAllocator {
    using value_type = T;
    CacheAlignedAllocator() = default;
    template <class U>
    CacheAlignedAllocator(const CacheAlignedAllocator<U>&) noexcept {}
    T* allocate(std::size_t n) {
        return static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t(kCacheLine)));
    }
    void deallocate(T* p, std::size_t) noexcept {
        ::operator delete[](p, std::align_val_t(kCacheLine));
    }
    template <class U>
    bool operator==(const CacheAlignedAllocator<U>&) const noexcept {
        return true;
    }
};

template <class T>
using AlignedVector = std::vector<T, CacheAlignedAllocator<T>>;

struct CacheAlignedDelete {
    void operator()(void* p) const noexcept {
        ::operator delete[](p, std::align_val_t(kCacheLine));
    }
};
template <class T>
using AlignedArray = std::unique_ptr<T[], CacheAlignedDelete>;

// n elements (zero-filled when `zero`), or nullptr when the memory cannot be had.
template <class T>
AlignedArray<T> allocate_aligned(std::size_t n, bool zero) {
    void* p = ::operator new[](n * sizeof(T), std::align_val_t(kCacheLine), std::nothrow);
    if (p != nullptr && zero) std::memset(p, 0, n * sizeof(T));
    return AlignedArray<T>(static_cast<T*>(p));
}

}  // namespace specula
