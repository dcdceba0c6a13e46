// See scan_pool.h.
//
// The protocol, for one caller and any number of helpers:
// - run() publishes job_ and n_, zeroes finished_, then opens ticket_ with a new
//   generation and item 0. It closes ticket_ only after finished_ reached n, and writes
//   job_/n_ only while ticket_ is closed.
// - A helper reads ticket_, then job_ and n_, and claims item i with a compare-and-swap of
//   the ticket it read. If job_ or n_ were already the next job's, ticket_ was closed
//   before they were written (all sequentially consistent), so the swap fails and the
//   helper reads again; a successful swap therefore means job_ and n_ belong to the item's
//   generation, and the caller cannot return (nor end `f`'s life) before that item's
//   finished_ increment.
#include "scan_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace polyllama {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#else
    std::this_thread::yield();
#endif
}

}  // namespace

scan_pool::scan_pool(int helpers) {
    for (int t = 0; t < helpers; t++) {
        helpers_.emplace_back([this] { helper_loop(); });
    }
}

scan_pool::~scan_pool() {
    {
        std::lock_guard<std::mutex> lk(m_);
        quit_ = true;
    }
    cv_.notify_all();
    for (auto & t : helpers_) {
        t.join();
    }
}

void scan_pool::expect(clock::time_point from, clock::time_point until) {
    {
        std::lock_guard<std::mutex> lk(m_);
        spin_from_  = from;
        spin_until_ = until;
        windows_++;
        wakes_++;
    }
    cv_.notify_all();
}

bool scan_pool::work() {
    bool ran = false;
    uint64_t t = ticket_.load();
    for (;;) {
        const uint64_t item = t & kClosed;
        if (item == kClosed) {
            return ran;
        }
        const auto * f = job_.load();
        const int    n = n_.load();
        if (item >= static_cast<uint64_t>(n)) {
            return ran;
        }
        if (!ticket_.compare_exchange_weak(t, t + 1)) {
            continue;   // t now holds the current ticket
        }
        (*f)(static_cast<int>(item));
        finished_.fetch_add(1);
        ran = true;
        t = ticket_.load();
    }
}

void scan_pool::helper_loop() {
    uint64_t seen = 0;       // the wake last acted on
    uint64_t window = 0;     // the last window spun in, or whose job was run: used up
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
        if (wakes_ == seen) {
            sleeping_++;
            sleeping_hint_.store(sleeping_);
            cv_.wait(lk, [&] { return quit_ || wakes_ != seen; });
            sleeping_--;
            sleeping_hint_.store(sleeping_);
        }
        if (quit_) {
            return;
        }
        seen = wakes_;
        lk.unlock();
        const bool ran = work();
        lk.lock();
        if (ran) {
            window = windows_;
            continue;
        }
        if (windows_ == window) {
            continue;   // no new window: sleep
        }
        // a new window: wait for its start (a new wake, from run() or expect(), comes first)
        while (!quit_ && wakes_ == seen && clock::now() < spin_from_) {
            cv_.wait_until(lk, spin_from_);
        }
        if (quit_) {
            return;
        }
        if (wakes_ != seen) {
            continue;   // a job (or another window) arrived meanwhile
        }
        window = windows_;
        const clock::time_point until = spin_until_;
        lk.unlock();
        // spin for the job until the window closes, reading the clock every 64 rounds
        for (int k = 0;; k++) {
            if (work()) {
                break;
            }
            if ((k & 63) == 63 && clock::now() >= until) {
                break;
            }
            cpu_relax();
        }
        lk.lock();
    }
}

void scan_pool::run(int n, const std::function<void(int)> & f) {
    if (n <= 0) {
        return;
    }
    generation_++;
    job_.store(&f);
    n_.store(n);
    finished_.store(0);
    ticket_.store(generation_ << kIndexBits);
    if (sleeping_hint_.load() > 0) {
        // helpers outside an expected window: wake them (they may come too late to help)
        {
            std::lock_guard<std::mutex> lk(m_);
            wakes_++;
        }
        cv_.notify_all();
    }
    work();
    int spins = 0;
    while (finished_.load() < n) {
        // a helper is running the last items; it may have been descheduled
        if (++spins > 4096) {
            std::this_thread::yield();
        } else {
            cpu_relax();
        }
    }
    ticket_.store((generation_ << kIndexBits) | kClosed);
}

}  // namespace polyllama
