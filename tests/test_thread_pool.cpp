// The thread pool's contract: every item of [0, n) is handed to exactly one call, whatever the
// number of threads, items and chunks per thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace {

TEST(ThreadPool, EveryItemOnceForAnyCountAndChunking) {
    for (int threads : {1, 2, 3, 5}) {
        specula::ThreadPool pool(threads);
        EXPECT_EQ(pool.size(), threads);
        for (size_t n : {0, 1, 2, 3, 7, 16, 17, 100, 1001}) {
            for (size_t chunks_per_thread : {0, 1, 2, 4, 1000}) {
                std::vector<std::atomic<int>> seen(n);
                std::atomic<int> calls{0};
                pool.parallel_for(
                    n,
                    [&](size_t begin, size_t end) {
                        EXPECT_LT(begin, end);
                        EXPECT_LE(end, n);
                        for (size_t i = begin; i < end; ++i)
                            seen[i].fetch_add(1);
                        calls.fetch_add(1);
                    },
                    chunks_per_thread);
                for (size_t i = 0; i < n; ++i)
                    ASSERT_EQ(seen[i].load(), 1) << threads << " threads, n = " << n << ", item "
                                                 << i << ", " << chunks_per_thread << " chunks";
                // Chunks are whole: no more calls than chunks asked for (at least one per thread).
                const size_t most = std::max<size_t>(1, chunks_per_thread) * size_t(threads);
                EXPECT_LE(size_t(calls.load()), std::max<size_t>(1, std::min(n, most)));
            }
        }
    }
}

TEST(ThreadPool, LoopsFromSeveralThreadsRunOneAfterTheOther) {
    specula::ThreadPool pool(2);
    std::atomic<int> inside{0}, most{0}, wrong{0};
    std::vector<std::thread> callers;
    for (int c = 0; c < 4; ++c)
        callers.emplace_back([&] {
            for (int rep = 0; rep < 100; ++rep) {
                std::vector<std::atomic<int>> seen(64);
                pool.parallel_for(64, [&](size_t begin, size_t end) {
                    const int now = inside.fetch_add(1) + 1;
                    int seen_most = most.load();
                    while (now > seen_most && !most.compare_exchange_weak(seen_most, now)) {
                    }
                    for (size_t i = begin; i < end; ++i)
                        seen[i].fetch_add(1);
                    // Long enough for the callers' loops to overlap if the pool let them.
                    const auto until =
                        std::chrono::steady_clock::now() + std::chrono::microseconds(20);
                    while (std::chrono::steady_clock::now() < until) {
                    }
                    inside.fetch_sub(1);
                });
                for (auto& s : seen)
                    wrong.fetch_add(s.load() != 1);
            }
        });
    for (auto& t : callers)
        t.join();
    EXPECT_EQ(wrong.load(), 0) << "items of a loop run zero or several times";
    // Two threads of the pool at most inside one loop's chunks at once.
    EXPECT_LE(most.load(), 2);
}

}  // namespace
