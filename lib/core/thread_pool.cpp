#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace specula {

namespace {

// How long an idle worker polls before it sleeps, and how many pauses the caller polls for
// the workers before it sleeps (tens of microseconds).
constexpr auto kSpinTime = std::chrono::microseconds(50);
constexpr uint32_t kWaitSpins = 1u << 12;

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
    // The workers finish within microseconds of this thread unless one lost its core (another
    // process, or more threads than cores): then this one sleeps, giving it the core, where
    // spinning on kept the worker waiting for a time slice of the scheduler (a stream
    // transcription beside another 2-thread program on two cores ran 11x slower than alone).
    for (uint32_t spins = 0;; ++spins) {
        const int pending = pending_.load(std::memory_order_acquire);
        if (pending == 0) break;
        if (spins < kWaitSpins) {
            cpu_relax();
        } else {
            pending_.wait(pending, std::memory_order_acquire);
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
        // The last one wakes the caller if it sleeps (no system call when it does not).
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
}

}  // namespace specula
