// A fixed set of worker threads for data-parallel loops. The calling thread
// takes a share too, so a pool of one thread runs everything inline.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace specula {

class ThreadPool {
  public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return int(workers_.size()) + 1; }
    // Splits [0, n) into contiguous chunks, one per thread, and waits for all.
    void parallel_for(size_t n, const std::function<void(size_t begin, size_t end)>& fn);

  private:
    void worker_loop(int index);

    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable start_, done_;
    const std::function<void(size_t, size_t)>* task_ = nullptr;
    size_t task_size_ = 0;
    uint64_t generation_ = 0;
    int pending_ = 0;
    bool stop_ = false;
};

}  // namespace specula
