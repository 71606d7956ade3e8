#include "core/thread_pool.h"

#include <algorithm>

namespace specula {

ThreadPool::ThreadPool(int n_threads) {
    for (int i = 1; i < std::max(1, n_threads); ++i)
        workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    start_.notify_all();
    for (auto& t : workers_)
        t.join();
}

namespace {
void run_chunk(const std::function<void(size_t, size_t)>& fn, size_t n, int index, int parts) {
    const size_t begin = n * size_t(index) / size_t(parts);
    const size_t end = n * size_t(index + 1) / size_t(parts);
    if (begin < end) fn(begin, end);
}
}  // namespace

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn) {
    if (workers_.empty() || n < 2) {
        if (n > 0) fn(0, n);
        return;
    }
    {
        std::lock_guard lock(mutex_);
        task_ = &fn;
        task_size_ = n;
        pending_ = int(workers_.size());
        ++generation_;
    }
    start_.notify_all();
    run_chunk(fn, n, 0, size());
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    task_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
        const std::function<void(size_t, size_t)>* task = nullptr;
        size_t n = 0;
        {
            std::unique_lock lock(mutex_);
            start_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            task = task_;
            n = task_size_;
        }
        run_chunk(*task, n, index, size());
        {
            std::lock_guard lock(mutex_);
            if (--pending_ == 0) done_.notify_one();
        }
    }
}

}  // namespace specula
