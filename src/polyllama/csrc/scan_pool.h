// Threads that share the scans of logits after a GPU step: one job per sequence when many
// sequences wait for their token, ranges of one sequence's logits when few do.
//
// Why not a plain condition-variable pool: waking a sleeping thread takes longer (tens of
// µs, and a system call of the stepping thread) than the scan it would share (a few µs per
// 64 KB of logits), so a lone sequence gained nothing. Steps of a running generation come
// at a steady pace, so each run() foretells the next one (now + the time since the last):
// after their share of a job the helpers nap until shortly before the next is due, then
// spin for it over a short window. Neither side makes a system call while the pace holds,
// and the cores are free for the rest of the step. A job that comes outside the window is
// started by the calling thread at once, which does whatever the helpers do not take, so
// a missed window is slower, never wrong; helpers whose window passed without a job sleep
// until the next run() wakes them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace polyllama {

class scan_pool {
  public:
    using clock = std::chrono::steady_clock;

    explicit scan_pool(int helpers);
    ~scan_pool();
    scan_pool(const scan_pool &) = delete;
    scan_pool & operator=(const scan_pool &) = delete;

    int threads() const { return static_cast<int>(helpers_.size()) + 1; }   // with the caller

    // f(0) .. f(n-1), each once, on the helpers and the calling thread; returns when all
    // have returned. One caller at a time. paced: the next job should come about as long
    // after this one as this one after the last (a device computes in between), so the
    // helpers wait for it in a window; false where the caller's own cores compute the next
    // step (the CPU backend), which spinning helpers would slow down. big: worth waking
    // helpers that are not waiting for it (whole sequences' picks, tens of µs or more each).
    void run(int n, const std::function<void(int)> & f, bool paced, bool big);

  private:
    // The job's state in one word, so a helper claims an item and checks that the job is
    // still the one it read in one compare-and-swap: generation (high 40 bits) and the next
    // unclaimed item (low 24 bits; kClosed between jobs).
    static constexpr uint64_t kIndexBits = 24;
    static constexpr uint64_t kClosed    = (uint64_t{1} << kIndexBits) - 1;

    bool work();          // claims and runs items of the open job; whether it ran any
    void helper_loop();

    std::atomic<uint64_t> ticket_{kClosed};
    std::atomic<const std::function<void(int)> *> job_{nullptr};
    std::atomic<int> n_{0};
    std::atomic<int> finished_{0};
    uint64_t generation_ = 0;            // the caller's
    clock::time_point last_run_{};       // the caller's

    std::mutex m_;
    std::condition_variable cv_;
    uint64_t wakes_ = 0;                 // under m_: run() woke the helpers
    uint64_t windows_ = 0;               // under m_: run() foretold the next job
    clock::time_point window_from_{}, window_until_{};   // under m_
    int      sleeping_ = 0;              // under m_: helpers with no window, until a wake
    int      napping_ = 0;               // under m_: helpers waiting for their window
    bool     quit_ = false;              // under m_

    std::vector<std::thread> helpers_;
};

}  // namespace polyllama
