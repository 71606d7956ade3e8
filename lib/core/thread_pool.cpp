#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace specula {

namespace {

// How long an idle worker polls before it sleeps.
constexpr auto kSpinTime = std::chrono::microseconds(500);

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
    try {
        for (int i = 1; i < std::max(1, n_threads); ++i)
            workers_.emplace_back([this] { worker_loop(); });
    } catch (...) {
        stop();
        throw;
    }
}

ThreadPool::~ThreadPool() {
    stop();
}

void ThreadPool::stop() {
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (auto& t : workers_)
        t.join();
    workers_.clear();
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn,
                              size_t chunks_per_thread) {
    if (workers_.empty() || n < 2) {
        if (n > 0) fn(0, n);
        return;
    }
    std::lock_guard call(call_mutex_);
    task_ = &fn;
    task_size_ = n;
    const size_t chunks = std::max<size_t>(1, chunks_per_thread) * size_t(size());
    chunk_ = (n + chunks - 1) / chunks;
    next_.store(0, std::memory_order_relaxed);
    pending_.store(int(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();  // a system call only when a worker sleeps
    run_chunks();
    for (uint32_t spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
        if (spins < (1u << 16)) {
            cpu_relax();
        } else {
            std::this_thread::yield();  // a worker lost its core
        }
    }
    task_ = nullptr;
}

void ThreadPool::run_chunks() {
    for (;;) {
        const size_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
        if (begin >= task_size_) return;
        (*task_)(begin, std::min(task_size_, begin + chunk_));
    }
}

void ThreadPool::worker_loop() {
    uint32_t seen = 0;
    for (;;) {
        uint32_t now = generation_.load(std::memory_order_acquire);
        const auto sleep_at = std::chrono::steady_clock::now() + kSpinTime;
        for (uint32_t spins = 1; now == seen; ++spins) {
            if (spins % 64 == 0 && std::chrono::steady_clock::now() > sleep_at) {
                generation_.wait(seen, std::memory_order_acquire);
            } else {
                cpu_relax();
            }
            now = generation_.load(std::memory_order_acquire);
        }
        seen = now;
        if (stop_.load(std::memory_order_acquire)) return;
        run_chunks();
        pending_.fetch_sub(1, std::memory_order_release);
    }
}

}  // namespace specula
