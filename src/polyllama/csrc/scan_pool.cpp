// See scan_pool.h.
//
// The job protocol, for one caller and any number of helpers:
// - run() publishes job_ and n_, zeroes finished_, then opens ticket_ with a new
//   generation and item 0. It closes ticket_ only after finished_ reached n, and writes
//   job_/n_ only while ticket_ is closed.
// - A helper reads ticket_, then job_ and n_, and claims item i with a compare-and-swap of
//   the ticket it read. If job_ or n_ were already the next job's, ticket_ was closed
//   before they were written (all sequentially consistent), so the swap fails and the
//   helper reads again; a successful swap therefore means job_ and n_ belong to the item's
//   generation, and the caller cannot return (nor end `f`'s life) before that item's
//   finished_ increment.
// The window for the next job is set before the ticket opens, so a helper that took part
// in a job always finds the window that job foretold.
#include "scan_pool.h"

#include <algorithm>

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
    uint64_t seen = 0;       // the last wake acted on
    uint64_t used = 0;       // the last window waited in
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
        if (quit_) {
            return;
        }
        lk.unlock();
        work();
        lk.lock();
        if (windows_ != used && clock::now() < window_until_) {
            used = windows_;
            const clock::time_point until = window_until_;
            napping_++;
            cv_.wait_until(lk, window_from_, [&] { return quit_ || wakes_ != seen; });
            napping_--;
            if (wakes_ != seen) {
                seen = wakes_;   // a job came early and was big enough to wake us for
                continue;
            }
            if (quit_) {
                return;
            }
            lk.unlock();
            // spin for the job until the window closes (reading the clock every 64 rounds),
            // or until it came and others took all of it
            const uint64_t before = ticket_.load() >> kIndexBits;
            for (int k = 0;; k++) {
                if (work() || ticket_.load() >> kIndexBits != before) {
                    break;
                }
                if ((k & 63) == 63 && clock::now() >= until) {
                    break;
                }
                cpu_relax();
            }
            lk.lock();
            continue;
        }
        sleeping_++;
        cv_.wait(lk, [&] { return quit_ || wakes_ != seen; });
        sleeping_--;
        seen = wakes_;
    }
}

void scan_pool::run(int n, const std::function<void(int)> & f, bool paced, bool big) {
    if (n <= 0) {
        return;
    }
    using std::chrono::microseconds;
    const clock::time_point now = clock::now();
    const clock::duration interval = now - last_run_;
    last_run_ = now;
    bool wake;
    {
        std::lock_guard<std::mutex> lk(m_);
        if (paced && interval < std::chrono::milliseconds(100)) {
            // the next job should come `interval` from now: wait for it from a tenth of that
            // before (at least 100 µs: a napping thread wakes some tens of µs late) to two
            // tenths after, each at most 1 ms
            const clock::duration margin = std::clamp<clock::duration>(interval / 10, microseconds(100),
                                                                       microseconds(1000));
            window_from_  = now + interval - margin;
            window_until_ = now + interval + 2 * margin;
            windows_++;
        }
        // helpers asleep without a window: wake them to learn of the new one, or for a big
        // job; napping ones only for a big job (the wake costs this thread microseconds)
        wake = (sleeping_ > 0 && (paced || big)) || (napping_ > 0 && big);
        if (wake) {
            wakes_++;
        }
    }
    generation_++;
    job_.store(&f);
    n_.store(n);
    finished_.store(0);
    ticket_.store(generation_ << kIndexBits);
    if (wake) {
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
