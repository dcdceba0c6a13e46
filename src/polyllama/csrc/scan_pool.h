// Threads that share the scans of logits after a GPU step: one job per sequence when many
// sequences wait for their token, ranges of one sequence's logits when few do.
//
// Why not a plain condition-variable pool: waking a sleeping thread takes longer (tens of
// µs) than the scan it would share (a few µs per 64 KB of logits), so a lone sequence
// gained nothing. The engine knows about when the device will finish (the last step's
// wait) and tells the pool before it waits (expect()): the helpers sleep until shortly
// before then and spin for the job over that window only, so the hand-off costs an atomic
// read, and the cores are not kept busy for the rest of the step. A job that comes outside
// the window wakes sleeping helpers the slow way; the calling thread starts on it at once
// and does whatever the helpers do not take, so a missed window is slower, never wrong.
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

    // A job is likely between `from` and `until`: helpers spin for it then, and sleep again
    // after it (or after `until`).
    void expect(clock::time_point from, clock::time_point until);

    // f(0) .. f(n-1), each once, on the helpers and the calling thread; returns when all
    // have returned. One caller at a time.
    void run(int n, const std::function<void(int)> & f);

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

    std::mutex m_;
    std::condition_variable cv_;
    uint64_t wakes_ = 0;                 // under m_: bumped by expect() and by run()
    uint64_t windows_ = 0;               // under m_: bumped by expect()
    int      sleeping_ = 0;              // under m_
    clock::time_point spin_from_{}, spin_until_{};   // under m_
    bool     quit_ = false;              // under m_
    std::atomic<int> sleeping_hint_{0};  // sleeping_, read by run() without the lock

    std::vector<std::thread> helpers_;
};

}  // namespace polyllama
