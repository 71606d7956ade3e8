// A fixed set of worker threads for data-parallel loops. The calling thread
// takes a share too, so a pool of one thread runs everything inline.
//
// A decode step runs a few hundred short loops, so waking workers must cost far less than
// a loop: after a loop the workers spin for a while (the next loop usually follows within
// microseconds) and only then sleep on an atomic wait. The spins are short (50 µs for an idle
// worker, tens of microseconds for the caller waiting on the workers) because a thread that
// spins while another lost its core keeps that one from running: beside another busy program
// on as many cores, longer spins made a stream transcription 12x slower than alone (these:
// 5x), and no faster alone.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace specula {

class ThreadPool {
  public:
    // Starts n_threads - 1 workers; throws std::system_error (with none left running) when
    // the system cannot start one.
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return int(workers_.size()) + 1; }
    // Calls fn on contiguous chunks that cover [0, n), about chunks_per_thread of them per
    // thread, on every thread, and waits for all: a thread takes the next chunk when it is done
    // with one, so a thread that starts late or runs slow takes fewer. Items of equal cost
    // want one chunk per thread (each chunk taken is a cache line passed between cores);
    // items of unequal cost a few. Loops called from several threads at once run one after
    // the other.
    void parallel_for(size_t n, const std::function<void(size_t begin, size_t end)>& fn,
                      size_t chunks_per_thread = 1);

  private:
    void worker_loop();
    void run_chunks();
    void stop();

    std::vector<std::thread> workers_;
    std::mutex call_mutex_;  // one loop at a time
    const std::function<void(size_t, size_t)>* task_ = nullptr;
    size_t task_size_ = 0, chunk_ = 1;
    std::atomic<size_t> next_{0};          // the first item no thread has taken
    std::atomic<uint32_t> generation_{0};  // bumped to start a loop (or to stop)
    std::atomic<int> pending_{0};          // workers still running the current loop
    std::atomic<bool> stop_{false};
};

}  // namespace specula
