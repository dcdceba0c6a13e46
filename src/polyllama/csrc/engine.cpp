// The sequence engine (engine.h says what it does and why it is shaped this way).
#include "engine.h"

#include "greedy.h"
#include "guard.h"
#include "remote.h"
#include "scan_pool.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>

// thirdparty/patches/0001: where a sequence's cells start in a single-stream KV cache
bool llama_kv_cache_set_seq_base(llama_memory_t mem, llama_seq_id seq_id, int32_t base);

namespace polyllama {

namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- UTF-8: whole characters out, invalid bytes as U+FFFD --------------------------------
// Python's decoder with errors="replace" gives one U+FFFD per maximal invalid subpart; this
// does the same, so text made here equals what bytes.decode("utf-8", "replace") makes.
const char kReplacement[] = "\xEF\xBF\xBD";

// Appends the complete characters of `in` (with `partial` in front) to `out`; what could
// still become a character stays in `partial` unless `final`.
void utf8_feed(std::string & partial, const char * in, size_t n, std::string & out, bool final) {
    partial.append(in, n);
    const auto * s = reinterpret_cast<const unsigned char *>(partial.data());
    const size_t len = partial.size();
    size_t i = 0;
    while (i < len) {
        const unsigned char b = s[i];
        if (b < 0x80) {
            out.push_back(static_cast<char>(b));
            i++;
            continue;
        }
        int need;
        unsigned char lo = 0x80, hi = 0xBF;   // range of the first continuation byte
        if (b >= 0xC2 && b <= 0xDF) {
            need = 1;
        } else if (b == 0xE0) {
            need = 2; lo = 0xA0;
        } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
            need = 2;
        } else if (b == 0xED) {
            need = 2; hi = 0x9F;
        } else if (b == 0xF0) {
            need = 3; lo = 0x90;
        } else if (b >= 0xF1 && b <= 0xF3) {
            need = 3;
        } else if (b == 0xF4) {
            need = 3; hi = 0x8F;
        } else {
            out.append(kReplacement);
            i++;
            continue;
        }
        size_t k = 1;
        bool bad = false;
        for (; k <= static_cast<size_t>(need); k++) {
            if (i + k >= len) {
                break;   // incomplete so far
            }
            const unsigned char c = s[i + k];
            const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
            if (c < l || c > h) {
                bad = true;
                break;
            }
        }
        if (bad) {
            out.append(kReplacement);   // the maximal subpart s[i, i+k)
            i += k;
            continue;
        }
        if (k <= static_cast<size_t>(need)) {   // ran out of bytes
            if (final) {
                out.append(kReplacement);
                i = len;
            }
            break;
        }
        out.append(partial, i, need + 1);
        i += need + 1;
    }
    partial.erase(0, i);
}

// A KV cache per sequence: llama.cpp splits a batch into micro-batches of consecutive
// sequence ids in row order (llama_batch_allocr::split_equal, `sequential`), so rows in
// request order (slots 5, 2, 9, ...) would each start a micro-batch of their own, every
// weight read once per micro-batch. Measured on the CPU, 64 sequences whose slots had been
// handed out out of order: 531 against 1388 t/s in slot order. So the engine puts the rows
// of such a cache in slot order; a unified cache takes any order (split_simple), and its
// rows stay in request order.
template <class T, class SlotOf>
void in_slot_order(std::vector<T> & rows, SlotOf slot_of) {
    std::stable_sort(rows.begin(), rows.end(), [&](const T & a, const T & b) { return slot_of(a) < slot_of(b); });
}

}  // namespace

// ---- the objects ----------------------------------------------------------------------
struct engine::slot {
    int      id = 0;
    int64_t  owner = 0;                     // request id in this slot, 0: idle
    std::vector<llama_token> cells;         // what the KV cache holds for this sequence id
    std::vector<uint8_t>     wide;          // per cell: computed in a micro-batch of >= 64 rows
    uint64_t last_used = 0;
    int32_t  region_start = -1;             // its cells [start, start + len) of a unified cache
    int32_t  region_len = 0;                //   (64-aligned; patch 0001 puts position p at start + p)
};

struct engine::sequence {
    int64_t id = 0;
    request_params p;
    enum { QUEUED, PREFILL, GENERATING, DONE } state = QUEUED;
    int      slot = -1;
    int32_t  reserved = 0;                  // most cells this sequence will hold
    int32_t  pos = 0;                       // tokens in the KV cache (next position)
    int32_t  logits_row = -1;               // batch row of its logits after the last decode
    bool     cancel = false;                // under mu_
    bool     released = false;              // under mu_: nobody will read the output
    bool     on_device = false;             // a plain greedy pick: the graph may make it
    std::vector<llama_token> generated;

    // this step's sample (set by sample_one, read by the stepper) and what it means
    llama_token token = -1;
    int      fate = 0;                      // engine::GOES_ON, ENDS_EOG, ...
    std::vector<std::pair<llama_token, float>> top;
    int      sample_error = ERROR_NONE;
    std::string sample_error_text;
    std::vector<llama_token_data> cur;      // candidate scratch for sampler chains
    float *  logits = nullptr;              // its row of the last decode's logits (sample_all)

    // text
    std::string utf8_partial;
    std::string text;                       // valid UTF-8, cut at a stop string
    size_t   released_text = 0;             // bytes of `text` moved to `out`
    bool     stopped = false;
    size_t   max_stop = 0;

    request_output out;                     // under mu_: what the consumer has not taken
    bool     news = false;                  // under mu_

    ~sequence() {
        if (p.sampler != nullptr) {
            llama_sampler_free(p.sampler);   // handed over by submit()
        }
    }
};

// ---- construction ---------------------------------------------------------------------
engine::engine(llama_context * ctx, const llama_model * model, remote_worker * worker, double timeout_s,
               int sample_threads, bool aligned_regions, bool device_sampling)
    : ctx_(ctx), model_(model), vocab_(llama_model_get_vocab(model)), worker_(worker),
      timeout_s_(timeout_s) {
    n_slots_   = std::max<int>(1, llama_n_seq_max(ctx));
    n_vocab_   = llama_vocab_n_tokens(vocab_);
    n_ctx_     = llama_n_ctx(ctx);
    n_ctx_seq_ = llama_n_ctx_seq(ctx);
    n_ubatch_  = std::max<int>(1, llama_n_ubatch(ctx));
    unified_   = n_ctx_seq_ == n_ctx_ && n_slots_ >= 1;
    // recurrent / hybrid memories cannot drop a tail or share a prefix of a sequence
    can_shift_prefix_ = !llama_model_is_recurrent(model) && !llama_model_is_hybrid(model);
    batch_cap_ = std::max<int>(n_slots_, static_cast<int>(llama_n_batch(ctx)));
    batch_     = llama_batch_init(batch_cap_, 0, 1);
    slots_.resize(n_slots_);
    for (int i = 0; i < n_slots_; i++) {
        slots_[i].id = i;
    }
    // slot regions need the patched cache and a plain KV memory (not recurrent, not SWA pairs)
    exact_ = aligned_regions;
    placement_ = aligned_regions && unified_ && can_shift_prefix_ &&
                 llama_kv_cache_set_seq_base(llama_get_memory(ctx), 0, -1);
    // through an RPC worker llama_decode runs on another thread, with a timeout: keep the
    // context's sampler set out of that
    device_sampling_ = device_sampling && worker == nullptr;
    if (sample_threads > 1) {
        pool_ = std::make_unique<scan_pool>(sample_threads - 1);
    }
}

engine::~engine() {
    shutdown();
    {
        // every thread in wait() / step() has been woken by shutdown(): let them leave
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return inside_ == 0; });
    }
    pool_.reset();
    if (!lost_) {
        llama_batch_free(batch_);   // else a thread blocked on a lost RPC server still reads it
    }
}

// ---- requests -------------------------------------------------------------------------
int64_t engine::submit(request_params & params) {
    auto s = std::make_unique<sequence>();
    s->p = std::move(params);
    s->out.n_prompt = static_cast<int32_t>(s->p.prompt.size());
    s->out.t_submit = now_s();
    for (const auto & stop : s->p.stops) {
        s->max_stop = std::max(s->max_stop, stop.size());
    }
    int64_t id;
    {
        std::lock_guard<std::mutex> lk(mu_);
        id = next_id_++;
        s->id = id;
        // the device hands back the token only: what needs the logits row stays on the host
        s->on_device = device_sampling_ && (s->p.greedy || s->p.sampler == nullptr) && s->p.n_probs == 0 &&
                       !s->p.logits_only;
        if (closed_) {
            s->state = sequence::DONE;
            s->out.finish = FINISH_ERROR;
            s->out.error_kind = ERROR_CLOSED;
            s->out.error = lost_ ? "the engine lost its connection to an RPC server" : "the engine is closed";
            s->news = true;
        } else {
            queue_.push_back(id);
        }
        requests_[id] = std::move(s);
    }
    cv_.notify_all();
    return id;
}

void engine::cancel(int64_t id) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = requests_.find(id);
        if (it == requests_.end()) {
            return;
        }
        it->second->cancel = true;
    }
    cv_.notify_all();
}

void engine::cancel_all() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto & kv : requests_) {
            kv.second->cancel = true;
        }
    }
    cv_.notify_all();
}

void engine::release(int64_t id) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = requests_.find(id);
        if (it == requests_.end()) {
            return;
        }
        if (it->second->state == sequence::DONE) {
            requests_.erase(it);
        } else {
            it->second->cancel = true;
            it->second->released = true;   // erased by the step that finishes it
        }
    }
    cv_.notify_all();
}

static void move_output(request_output & from, request_output & to) {
    to.text += from.text;
    from.text.clear();
    to.tokens.insert(to.tokens.end(), from.tokens.begin(), from.tokens.end());
    from.tokens.clear();
    for (auto & lp : from.logprobs) {
        to.logprobs.push_back(std::move(lp));
    }
    from.logprobs.clear();
    if (!from.logits.empty()) {
        to.logits = std::move(from.logits);
        from.logits.clear();
    }
    to.finish = from.finish;
    to.error_kind = from.error_kind;
    to.error_code = from.error_code;
    to.error = from.error;
    to.n_prompt = from.n_prompt;
    to.n_reused = from.n_reused;
    to.n_generated = from.n_generated;
    to.t_submit = from.t_submit;
    to.t_start = from.t_start;
    to.t_first = from.t_first;
    to.t_end = from.t_end;
}

int engine::take(int64_t id, request_output & out) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = requests_.find(id);
    if (it == requests_.end()) {
        return -1;
    }
    sequence & s = *it->second;
    move_output(s.out, out);
    const bool had = s.news;
    s.news = false;
    return had ? 1 : 0;
}

int engine::wait(int64_t id, bool until_finished, double timeout_s, request_output & out) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(std::max(0.0, timeout_s)));
    std::unique_lock<std::mutex> lk(mu_);
    inside_++;
    struct leave {
        engine * e;
        ~leave() { e->inside_--; e->cv_.notify_all(); }
    } on_exit{this};   // runs with mu_ held (lk is destroyed after it)
    for (;;) {
        auto it = requests_.find(id);
        if (it == requests_.end()) {
            return -1;
        }
        sequence & s = *it->second;
        const bool done = s.state == sequence::DONE;
        if (done || (!until_finished && s.news)) {
            move_output(s.out, out);
            s.news = false;
            return 1;
        }
        if (!stepping_ && !closed_) {
            // nobody is stepping: lead for one step, then look again
            stepping_ = true;
            lk.unlock();
            std::vector<int64_t> changed;
            int64_t decoded = 0;
            {
                std::lock_guard<std::mutex> sl(step_mu_);
                const int64_t before = stats_.tokens_decoded;
                std::string ignored;   // step_locked reports through the requests
                guarded(ignored, [&] { step_locked(changed); });
                decoded = stats_.tokens_decoded - before;
            }
            lk.lock();
            stepping_ = false;
            cv_.notify_all();
            if (std::chrono::steady_clock::now() >= deadline) {
                return 0;   // let the caller look at its signals between steps
            }
            if (decoded == 0 && changed.empty()) {
                // nothing could move (e.g. waiting for KV room another consumer's release
                // frees): do not spin
                if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
                    return 0;
                }
            }
            continue;
        }
        if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
            return 0;
        }
    }
}

// ---- driving --------------------------------------------------------------------------
int engine::step(std::vector<int64_t> & changed) {
    {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return !stepping_ || closed_; });
        if (closed_) {
            return 0;
        }
        stepping_ = true;
        inside_++;
    }
    int n = 0;
    {
        std::lock_guard<std::mutex> sl(step_mu_);
        std::string ignored;   // step_locked reports through the requests
        guarded(ignored, [&] { n = step_locked(changed); });
    }
    {
        std::lock_guard<std::mutex> lk(mu_);
        stepping_ = false;
        inside_--;
    }
    cv_.notify_all();
    return n;
}

bool engine::wait_for_work(double timeout_s) {
    std::unique_lock<std::mutex> lk(mu_);
    auto has_work = [&] {
        if (closed_ || !queue_.empty()) {
            return true;
        }
        for (const auto & sl : slots_) {
            if (sl.owner) {
                return true;
            }
        }
        return false;
    };
    cv_.wait_for(lk, std::chrono::duration<double>(std::max(0.0, timeout_s)), has_work);
    return has_work() && !closed_;
}

void engine::shutdown() {
    std::vector<int64_t> changed;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!closed_) {
            closed_ = true;
            for (auto & kv : requests_) {
                sequence & s = *kv.second;
                if (s.state != sequence::DONE) {
                    s.cancel = true;
                }
            }
        }
    }
    cv_.notify_all();
    // the next step (or this one, if nobody steps) finishes them
    std::lock_guard<std::mutex> sl(step_mu_);
    std::lock_guard<std::mutex> lk(mu_);
    queue_.clear();
    for (auto & kv : requests_) {
        sequence & s = *kv.second;
        if (s.state != sequence::DONE) {
            if (s.slot >= 0) {
                slots_[s.slot].owner = 0;
                s.slot = -1;
            }
            s.state = sequence::DONE;
            s.out.finish = FINISH_ERROR;
            s.out.error_kind = ERROR_CLOSED;
            s.out.error = lost_ ? "the engine lost its connection to an RPC server" : "the engine is closed";
            s.out.t_end = now_s();
            s.news = true;
        }
    }
    cv_.notify_all();
}

// ---- the step -------------------------------------------------------------------------
void engine::finish(sequence & s, int reason, int kind, const std::string & err, int code) {
    // caller holds mu_
    if (s.state == sequence::DONE) {
        return;
    }
    if (reason != FINISH_ERROR && !s.stopped) {
        std::string tail;
        utf8_feed(s.utf8_partial, "", 0, tail, /*final=*/true);
        s.text += tail;
    }
    if (s.released_text < s.text.size()) {
        s.out.text.append(s.text, s.released_text, std::string::npos);
        s.released_text = s.text.size();
    }
    s.out.finish = reason;
    s.out.error_kind = kind;
    s.out.error_code = code;
    s.out.error = err;
    s.out.n_generated = static_cast<int32_t>(s.generated.size());
    s.out.t_end = now_s();
    if (s.out.t_first == 0) {
        s.out.t_first = s.out.t_end;
    }
    s.state = sequence::DONE;
    s.news = true;
    if (s.slot >= 0) {
        slot & sl = slots_[s.slot];
        sl.owner = 0;
        sl.last_used = ++clock_;
        s.slot = -1;
    }
}

void engine::free_slot(slot & sl, bool release_region) {
    llama_memory_seq_rm(llama_get_memory(ctx_), sl.id, -1, -1);
    sl.cells.clear();
    sl.wide.clear();
    if (release_region && sl.region_len > 0) {
        sl.region_start = -1;
        sl.region_len = 0;
        llama_kv_cache_set_seq_base(llama_get_memory(ctx_), sl.id, -1);
    }
}

// A 64-aligned start for `need` cells that no other slot's region overlaps, or -1.
int32_t engine::find_gap(int32_t need, int ignore) const {
    std::vector<std::pair<int32_t, int32_t>> taken;   // start, end
    for (const auto & sl : slots_) {
        if (sl.id != ignore && sl.region_len > 0) {
            taken.emplace_back(sl.region_start, sl.region_start + sl.region_len);
        }
    }
    std::sort(taken.begin(), taken.end());
    int32_t at = 0;
    for (const auto & t : taken) {
        if (at + need <= t.first) {
            return at;
        }
        at = std::max(at, (t.second + kRegionAlign - 1) / kRegionAlign * kRegionAlign);
    }
    return at + need <= n_ctx_ ? at : -1;
}

// Gives slot `sl` a region of at least `need` cells: its own when big enough, grown in place
// when the cells after it are free, else a new one (its cached cells are dropped: *moved).
// Evicts idle slots, least recently used first, but never `keep`. False: no room now.
bool engine::ensure_region(slot & sl, int32_t need, int keep, bool * moved) {
    *moved = false;
    if (sl.region_len >= need) {
        return true;
    }
    for (;;) {
        if (sl.region_len > 0) {
            const int32_t end = sl.region_start + need;
            bool free_after = end <= n_ctx_;
            for (const auto & o : slots_) {
                if (o.id != sl.id && o.region_len > 0 && o.region_start < end &&
                    o.region_start + o.region_len > sl.region_start) {
                    free_after = false;
                }
            }
            if (free_after) {
                sl.region_len = need;
                return true;
            }
        }
        const int32_t at = find_gap(need, sl.id);
        if (at >= 0) {
            if (!sl.cells.empty()) {
                free_slot(sl, false);
            }
            *moved = true;
            sl.region_start = at;
            sl.region_len = need;
            llama_kv_cache_set_seq_base(llama_get_memory(ctx_), sl.id, at);
            return true;
        }
        int victim = -1;
        for (const auto & o : slots_) {
            if (!o.owner && o.id != sl.id && o.id != keep && o.region_len > 0 &&
                (victim < 0 || o.last_used < slots_[victim].last_used)) {
                victim = o.id;
            }
        }
        if (victim < 0) {
            return false;
        }
        free_slot(slots_[victim], true);
    }
}

int engine::kv_used_locked() const {
    if (placement_) {
        int used = 0;
        for (const auto & sl : slots_) {
            used += sl.region_len;
        }
        return used;
    }
    int used = 0;
    for (const auto & sl : slots_) {
        int n = static_cast<int>(sl.cells.size());
        if (sl.owner) {
            auto it = requests_.find(sl.owner);
            if (it != requests_.end()) {
                n = std::max(n, it->second->reserved);
            }
        }
        used += n;
    }
    return used;
}

// Puts a queued sequence into a slot, reusing the longest cached prefix. Returns false when
// no slot is idle or the KV cache cannot hold what it reserves (it stays queued).
bool engine::place(sequence & s, std::vector<int64_t> & changed) {
    const auto & prompt = s.p.prompt;
    const size_t cap = prompt.size() - 1;   // the last prompt token is always decoded (its logits)
    int target = -1;
    size_t target_lcp = 0;
    for (const auto & sl : slots_) {
        if (sl.owner) {
            continue;
        }
        const size_t l = can_shift_prefix_ || sl.cells.empty() ? reusable_prefix(sl, prompt, cap) : 0;
        // among empty slots of a cache per sequence, the lowest id (slots_ is in id order, so
        // the first one found stays): llama.cpp decodes consecutive sequence ids together
        // (see in_slot_order), so live slots packed at the low end make fewer micro-batches
        const bool by_recency = unified_ || !sl.cells.empty();
        if (target < 0 || l > target_lcp ||
            (l == target_lcp && (sl.cells.empty() != slots_[target].cells.empty()
                                     ? sl.cells.empty()      // an empty slot before a cached one
                                     : by_recency && sl.last_used < slots_[target].last_used))) {
            target = sl.id;
            target_lcp = l;
        }
    }
    if (target < 0) {
        return false;
    }
    // a longer prefix in another slot (a common system prompt of a running request)
    int source = -1;
    size_t source_lcp = 0;
    if (unified_ && can_shift_prefix_) {
        for (const auto & sl : slots_) {
            if (sl.id == target) {
                continue;
            }
            const size_t l = reusable_prefix(sl, prompt, cap);
            if (l > source_lcp) {
                source = sl.id;
                source_lcp = l;
            }
        }
        if (placement_) {
            // a copied prefix keeps its cells where the source has them: whole 64-cell
            // tiles only, so that its tiles are the ones a lone sequence would have
            source_lcp = source_lcp / kRegionAlign * kRegionAlign;
        }
        if (source_lcp < target_lcp + 16) {   // not worth a copy
            source = -1;
        }
    }
    const int limit = s.p.limit > 0 ? std::min(s.p.limit, n_ctx_seq_) : n_ctx_seq_;
    const int64_t want = s.p.max_tokens < 0 ? static_cast<int64_t>(limit)
                                            : static_cast<int64_t>(prompt.size()) + s.p.max_tokens;
    s.reserved = static_cast<int32_t>(std::min<int64_t>(limit, want));
    if (placement_) {
        const int32_t need = (s.reserved + kRegionAlign - 1) / kRegionAlign * kRegionAlign;
        bool moved = false;
        if (!ensure_region(slots_[target], need, source, &moved)) {
            return false;
        }
        if (moved) {
            target_lcp = 0;   // its cached cells were dropped with its old region
        }
    } else if (unified_) {
        auto fits = [&] {
            return kv_used_locked() - static_cast<int>(slots_[target].cells.size()) + s.reserved <= n_ctx_;
        };
        while (!fits()) {
            int before = kv_used_locked();
            // evict the least recently used idle slot that is neither target nor source
            int victim = -1;
            for (const auto & sl : slots_) {
                if (!sl.owner && sl.id != target && sl.id != source && !sl.cells.empty() &&
                    (victim < 0 || sl.last_used < slots_[victim].last_used)) {
                    victim = sl.id;
                }
            }
            if (victim < 0) {
                break;
            }
            free_slot(slots_[victim]);
            if (kv_used_locked() >= before) {
                break;
            }
        }
        if (!fits()) {
            return false;
        }
    }
    llama_memory_t mem = llama_get_memory(ctx_);
    slot & sl = slots_[target];
    size_t reuse = target_lcp;
    if (source >= 0) {
        free_slot(sl);
        llama_memory_seq_cp(mem, source, sl.id, 0, static_cast<llama_pos>(source_lcp));
        sl.cells.assign(prompt.begin(), prompt.begin() + source_lcp);
        sl.wide.assign(slots_[source].wide.begin(), slots_[source].wide.begin() + source_lcp);
        reuse = source_lcp;
    } else if (reuse < sl.cells.size()) {
        if (!llama_memory_seq_rm(mem, sl.id, static_cast<llama_pos>(reuse), -1)) {
            free_slot(sl);
            reuse = 0;
        }
        sl.cells.resize(reuse);
        sl.wide.resize(reuse);
    }
    if (reuse == 0 && !sl.cells.empty()) {
        free_slot(sl);
    }
    sl.owner = s.id;
    sl.last_used = ++clock_;
    s.slot = sl.id;
    s.pos = static_cast<int32_t>(reuse);
    s.state = sequence::PREFILL;
    s.out.n_reused = static_cast<int32_t>(reuse);
    s.out.t_start = now_s();
    stats_.prompt_tokens_reused += static_cast<int64_t>(reuse);
    changed.push_back(s.id);
    return true;
}

void engine::admit_locked(std::vector<int64_t> & changed) {
    // cancelled ones leave the queue first; then first come, first placed
    for (auto it = queue_.begin(); it != queue_.end();) {
        auto rq = requests_.find(*it);
        if (rq == requests_.end()) {
            it = queue_.erase(it);
            continue;
        }
        if (rq->second->cancel) {
            finish(*rq->second, FINISH_CANCELLED);
            changed.push_back(rq->first);
            it = queue_.erase(it);
            continue;
        }
        ++it;
    }
    while (!queue_.empty()) {
        auto rq = requests_.find(queue_.front());
        if (!place(*rq->second, changed)) {
            break;
        }
        queue_.pop_front();
    }
}

// With n_probs: the sampled token's own log-probability (raw logits, as the top list) goes
// after the top n when it is not among them, so a consumer always finds it (OpenAI's
// logprobs report the chosen token beside the top_logprobs).
static void add_sampled_logprob(std::vector<std::pair<llama_token, float>> & top, int n_probs,
                                const float * logits, double lse, llama_token token) {
    if (n_probs <= 0) {
        return;
    }
    for (const auto & e : top) {
        if (e.first == token) {
            return;
        }
    }
    top.emplace_back(token, static_cast<float>(logits[token] - lse));
}

void engine::sample_one(sequence & s) {
    s.sample_error = ERROR_NONE;
    s.top.clear();
    float * logits = s.logits;   // looked up by sample_all, in the stepping thread
    if (logits == nullptr) {
        s.sample_error = ERROR_DECODE;
        s.sample_error_text = "llama.cpp returned no logits for the sequence";
        return;
    }
    double lse = 0.0;   // log-sum-exp of the raw logits, when n_probs asks for them
    if (s.p.n_probs > 0) {
        // log-softmax of the raw logits: the top n before any sampling stage
        float mx = -std::numeric_limits<float>::infinity();
        for (int i = 0; i < n_vocab_; i++) {
            mx = std::max(mx, logits[i]);
        }
        double total = 0.0;
        for (int i = 0; i < n_vocab_; i++) {
            total += std::exp(static_cast<double>(logits[i]) - mx);
        }
        lse = mx + std::log(total);
        const int n = std::min(s.p.n_probs, n_vocab_);
        std::vector<int> best;
        best.reserve(n + 1);
        for (int i = 0; i < n_vocab_; i++) {
            if (static_cast<int>(best.size()) < n || logits[i] > logits[best.back()]) {
                auto pos = std::upper_bound(best.begin(), best.end(), i, [&](int a, int b) {
                    return logits[a] > logits[b];
                });
                best.insert(pos, i);
                if (static_cast<int>(best.size()) > n) {
                    best.pop_back();
                }
            }
        }
        for (int t : best) {
            s.top.emplace_back(t, static_cast<float>(logits[t] - lse));
        }
    }
    if (s.p.greedy || s.p.sampler == nullptr) {
        s.token = argmax_f32(logits, n_vocab_, s.p.banned);
        add_sampled_logprob(s.top, s.p.n_probs, logits, lse, s.token);
        return;
    }
    // llama_sampler_sample's steps, with a check between apply and accept: a grammar that
    // allows no token (all of them banned by logit bias, or none allowed at all) leaves only
    // -inf candidates, and accepting one of those aborts inside llama-grammar
    s.cur.resize(n_vocab_);
    for (int i = 0; i < n_vocab_; i++) {
        s.cur[i] = llama_token_data{i, logits[i], 0.0f};
    }
    llama_token_data_array arr{s.cur.data(), s.cur.size(), -1, false};
    std::string what;
    const bool ok = guarded(what, [&] {
        llama_sampler_apply(s.p.sampler, &arr);
        if (arr.selected < 0 || arr.selected >= static_cast<int64_t>(arr.size) ||
            !(arr.data[arr.selected].logit > -std::numeric_limits<float>::infinity())) {
            // NaN logits fail the same test: a broken model, not the sampling settings
            if (std::any_of(logits, logits + n_vocab_, [](float x) { return std::isnan(x); })) {
                s.sample_error = ERROR_DECODE;
                s.sample_error_text = "the model produced NaN logits: its weights or hyperparameters are "
                                      "broken (a damaged or badly converted file)";
                return;
            }
            s.sample_error = ERROR_GRAMMAR;
            s.sample_error_text = "no token is possible here: the grammar allows none that the other "
                                  "sampling settings (logit_bias, ...) leave";
            return;
        }
        s.token = arr.data[arr.selected].id;
        add_sampled_logprob(s.top, s.p.n_probs, logits, lse, s.token);
        llama_sampler_accept(s.p.sampler, s.token);
    });
    if (!ok) {
        s.sample_error = ERROR_GRAMMAR;
        s.sample_error_text = "the grammar rejected the sampled token: " + what;
    }
}

void engine::sample_all(std::vector<sequence *> & ready) {
    if (ready.empty()) {
        return;
    }
    // one synchronize for everybody, in this thread. llama_get_logits_ith synchronizes the
    // context on every call too (a stream synchronize per backend, 64 times a step at 64
    // sequences, and not safe from several threads at once): the first host row is looked
    // up so, the others found from it by their rank among the batch's outputs, which are in
    // batch order.
    last_wait_s_ = wait_for_device();
    const double t1 = now_s();
    // a batch row's rank among the last decode's outputs, -1 if it had none
    auto rank_of = [&](int row) {
        return row >= 0 && row < static_cast<int>(out_rank_.size()) ? out_rank_[row] : -1;
    };
    if (picked_in_graph_) {
        // the graph made every output's pick (run_decode): its token ids, in the same ranks
        const int32_t * picks = llama_get_output_argmax(ctx_);
        for (auto * s : ready) {
            const int rank = rank_of(s->logits_row);
            s->logits = nullptr;
            s->top.clear();
            s->sample_error = ERROR_NONE;
            s->token = picks != nullptr && rank >= 0 ? picks[rank] : -1;
            if (s->token < 0 || s->token >= n_vocab_) {
                s->sample_error = ERROR_DECODE;
                s->sample_error_text = "llama.cpp returned no token picked in the decode graph for the sequence";
            }
            stats_.tokens_picked_on_device++;
        }
        stats_.sample_seconds += now_s() - t1;
        return;
    }
    float * first = nullptr;
    int first_rank = 0;
    for (auto * s : ready) {
        const int rank = rank_of(s->logits_row);
        if (rank >= 0 && first != nullptr) {
            s->logits = first + static_cast<size_t>(rank - first_rank) * n_vocab_;
            continue;
        }
        s->logits = llama_get_logits_ith(ctx_, s->logits_row);
        if (rank >= 0 && s->logits != nullptr) {
            first = s->logits;
            first_rank = rank;
        }
    }
    if (!pool_) {
        for (auto * s : ready) {
            sample_one(*s);
        }
    } else {
        sample_shared(ready);
    }
    stats_.sample_seconds += now_s() - t1;
}

// The pool's share of the picks: a job per sequence when there are at least as many
// sequences as threads; else each plain greedy scan is cut into ranges (whole 256-float
// blocks, at least kMinRange floats), two per thread between them so that a helper that
// comes late leaves less for the others to wait on, and merged in order, which gives
// exactly argmax_f32's answer.
void engine::sample_shared(std::vector<sequence *> & ready) {
    const int threads = pool_->threads();
    const int n_seq = static_cast<int>(ready.size());
    struct range_job {
        sequence * s;
        int        begin, end;   // end 0: the whole of sample_one
    };
    std::vector<range_job> jobs;
    // argmax_f32's exclusion, held around the ranges of each split sequence
    std::deque<excluded_logit> banned;
    int per_seq = 1;
    if (n_seq < threads) {
        per_seq = std::min(2 * ((threads + n_seq - 1) / n_seq), std::max(1, n_vocab_ / kMinRange));
    }
    for (auto * s : ready) {
        const bool plain = s->logits != nullptr && s->p.n_probs == 0 &&
                           (s->p.greedy || s->p.sampler == nullptr);
        if (per_seq == 1 || !plain) {
            jobs.push_back({s, 0, 0});
            continue;
        }
        banned.emplace_back(s->logits, n_vocab_, s->p.banned);
        const int len = ((n_vocab_ / per_seq + 255) / 256) * 256;
        for (int b = 0; b < n_vocab_; b += len) {
            jobs.push_back({s, b, std::min(n_vocab_, b + len)});
        }
    }
    std::vector<argmax_part> parts(jobs.size());
    std::function<void(int)> job = [&](int i) {
        const range_job & j = jobs[i];
        if (j.end == 0) {
            sample_one(*j.s);
        } else {
            parts[i] = argmax_range(j.s->logits, j.begin, j.end);
        }
    };
    // a device that computed for a while will again: the helpers wait for the next pick;
    // napping ones are woken only for whole sequences' picks
    pool_->run(static_cast<int>(jobs.size()), job, last_wait_s_ >= kPacedWait, banned.empty());
    // merge each split sequence's ranges, which are consecutive jobs in ascending order
    for (size_t i = 0; i < jobs.size();) {
        if (jobs[i].end == 0) {
            i++;
            continue;
        }
        sequence * s = jobs[i].s;
        argmax_part best;
        for (; i < jobs.size() && jobs[i].s == s; i++) {
            argmax_merge(best, parts[i]);
        }
        s->sample_error = ERROR_NONE;
        s->top.clear();
        s->token = best.index < 0 ? 0 : best.index;
        stats_.tokens_picked_in_ranges++;
    }
}

double engine::wait_for_device() {
    const double t0 = now_s();
    llama_synchronize(ctx_);
    const double waited = now_s() - t0;
    stats_.decode_seconds += waited;
    stats_.wait_seconds += waited;
    return waited;
}

int engine::decode(llama_batch & batch, std::string & err) {
    int32_t rc = -1;
    const int status = decode_via(worker_, ctx_, batch, &rc, timeout_s_, err);
    if (status != REMOTE_OK) {
        lost_ = status == REMOTE_LOST || status == REMOTE_TIMEOUT;
        return -1000 - status;
    }
    return rc;
}

void engine::fail_all(int kind, const std::string & msg, int code, std::vector<int64_t> & changed) {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto & kv : requests_) {
        if (kv.second->state != sequence::DONE) {
            finish(*kv.second, FINISH_ERROR, kind, msg, code);
            changed.push_back(kv.first);
        }
    }
    queue_.clear();
}

int engine::step_locked(std::vector<int64_t> & changed) {
    const double t0 = now_s();
    const int live = step_body(changed);
    stats_.step_seconds += now_s() - t0;
    return live;
}

// The order a row's arithmetic runs in depends on how it was computed: ggml-cpu's flash
// attention takes a per-row kernel for micro-batches of fewer than 64 query rows and a
// tiled one from 64 rows on (GGML_FA_TILE_Q), and the two round differently; within each
// kernel a row's result does not depend on the other rows of its micro-batch (measured on
// SmolLM2: splitting a prompt into chunks of 64 rows or more gives bit-identical logits,
// a last chunk under 64 rows does not). So the engine
//   * reads every prompt in its canonical chunks ([0, U), [U, 2U), ... with U = n_ubatch),
//     never mixed with generated tokens, packed with other prompts' chunks of the same
//     kind only (wide with wide up to U rows, narrow with narrow below 64 rows);
//   * tags every cached cell wide or narrow, and reuses a cached prefix only as far as its
//     tags match what a fresh read of the new prompt would compute (see reusable_prefix).
// A request then computes exactly what it computes alone, beside up to 63 other sequences
// and from a cached prefix (on the CPU; GPU kernels have thresholds of their own).
static constexpr int kWideRows = 64;

// what a fresh read of a prompt of n tokens computes at position i: wide or narrow
static bool fresh_is_wide(size_t i, size_t n, size_t chunk) {
    const size_t s = i / chunk * chunk;
    const size_t e = std::min(s + chunk, n);
    return e - s >= static_cast<size_t>(kWideRows);
}

size_t engine::reusable_prefix(const slot & sl, const std::vector<llama_token> & prompt, size_t cap) const {
    const size_t n = prompt.size();
    const size_t chunk = static_cast<size_t>(n_ubatch_);
    const size_t lim = std::min({sl.cells.size(), n, cap});
    size_t r = 0;
    while (r < lim && sl.cells[r] == prompt[r] && (sl.wide[r] != 0) == fresh_is_wide(r, n, chunk)) {
        r++;
    }
    if (r < n && r > 0) {
        // the first chunk read after the prefix is [r, e): it must be wide where a fresh read
        // is, so read at least 64 rows of it (giving back some of the prefix)
        const size_t s = r / chunk * chunk;
        const size_t e = std::min(s + chunk, n);
        if (e - s >= static_cast<size_t>(kWideRows) && e - r < static_cast<size_t>(kWideRows)) {
            r = e - kWideRows;
        }
    }
    return r;
}

int engine::run_decode(int n, const std::vector<sequence *> & outs, std::string & err) {
    batch_.n_tokens = n;
    // the graph makes the picks when every output of the batch is a plain greedy one and
    // they ban the same token (or none); the setting is the context's, so it is put back
    // after the decode (the graph is built inside llama_decode), and nothing else that
    // decodes on this context (Context.decode) finds it on
    bool in_graph = device_sampling_ && !outs.empty();
    const llama_token ban = in_graph ? outs.front()->p.banned : -1;
    for (const auto * s : outs) {
        in_graph = in_graph && s->on_device && s->p.banned == ban;
    }
    picked_in_graph_ = false;
    const double t0 = now_s();
    if (in_graph) {
        llama_set_output_argmax(ctx_, true, ban);
    }
    int rc = decode(batch_, err);
    if (rc == 1) {
        // no room in the KV cache (the engine's count is conservative, so this means cells
        // it did not count): drop every cached prefix and try once more
        std::lock_guard<std::mutex> lk(mu_);
        for (auto & sl : slots_) {
            if (!sl.owner && (!sl.cells.empty() || sl.region_len > 0)) {
                free_slot(sl, true);
            }
        }
        rc = decode(batch_, err);
    }
    if (in_graph) {
        llama_set_output_argmax(ctx_, false, -1);
    }
    stats_.decode_seconds += now_s() - t0;
    if (rc == 0) {
        stats_.tokens_decoded += n;
        picked_in_graph_ = in_graph;
        // where each row's logits will be: llama.cpp keeps the outputs in batch order
        out_rank_.assign(n, -1);
        for (int i = 0, r = 0; i < n; i++) {
            if (batch_.logits[i]) {
                out_rank_[i] = r++;
            }
        }
    }
    return rc;
}

void engine::add_row(int i, llama_token token, llama_pos pos, int seq, bool logits) {
    batch_.token[i] = token;
    batch_.pos[i] = pos;
    batch_.n_seq_id[i] = 1;
    batch_.seq_id[i][0] = seq;
    batch_.logits[i] = logits;
}

// A decode that failed: its sequences end and their slots forget what they held. Returns
// true when the engine itself is lost (an RPC server), after failing everything.
bool engine::decode_failed(int rc, const std::string & err, const std::vector<sequence *> & seqs,
                           std::vector<int64_t> & changed) {
    if (rc <= -1000) {
        fail_all(ERROR_REMOTE, err, -1000 - rc, changed);
        std::lock_guard<std::mutex> lk(mu_);
        closed_ = true;
        cv_.notify_all();
        return true;
    }
    const int kind = rc == 1 ? ERROR_CONTEXT : ERROR_DECODE;
    const std::string msg = rc == 1
        ? "the KV cache is full (use a larger n_ctx or fewer parallel sequences)"
        : "llama_decode failed with code " + std::to_string(rc) + (err.empty() ? "" : ": " + err);
    std::lock_guard<std::mutex> lk(mu_);
    for (auto * s : seqs) {
        if (s->slot >= 0) {
            free_slot(slots_[s->slot]);
        }
        s->logits_row = -1;
        finish(*s, FINISH_ERROR, kind, msg, rc);
        changed.push_back(s->id);
    }
    return false;
}

// What a sampled token means for its sequence: it ends it, or it is decoded next.
void engine::judge(sequence & s) {
    s.logits_row = -1;
    s.fate = GOES_ON;
    if (s.sample_error != ERROR_NONE) {
        s.fate = ENDS_ERROR;
        return;
    }
    if (llama_vocab_is_eog(vocab_, s.token) && !s.p.ignore_eos) {
        s.fate = ENDS_EOG;
        return;
    }
    s.generated.push_back(s.token);
    const int limit = s.p.limit > 0 ? std::min(s.p.limit, n_ctx_seq_) : n_ctx_seq_;
    if ((s.p.max_tokens >= 0 && static_cast<int>(s.generated.size()) >= s.p.max_tokens) || s.pos >= limit) {
        s.fate = ENDS_LENGTH;
    }
}

// Reads one group of prompt chunks in a micro-batch of its own; the prompts it completes
// are sampled at once (their first token joins this step's generation batch) or, for
// logits-only requests, answered. Returns false when the engine was lost.
bool engine::read_prompts(std::vector<std::pair<sequence *, int>> & group, std::vector<sequence *> & ready,
                          std::vector<int64_t> & changed) {
    if (group.empty()) {
        return true;
    }
    if (!unified_) {
        in_slot_order(group, [](const std::pair<sequence *, int> & g) { return g.first->slot; });
    }
    int n = 0;
    for (const auto & g : group) {
        sequence & s = *g.first;
        const int left = static_cast<int>(s.p.prompt.size()) - s.pos;
        for (int j = 0; j < g.second; j++) {
            add_row(n++, s.p.prompt[s.pos + j], s.pos + j, s.slot, j == g.second - 1 && g.second == left);
        }
        s.logits_row = g.second == left ? n - 1 : -1;
    }
    std::vector<sequence *> seqs, outs;
    for (const auto & g : group) {
        seqs.push_back(g.first);
        if (g.first->logits_row >= 0) {
            outs.push_back(g.first);
        }
    }
    std::string err;
    const int rc = run_decode(n, outs, err);
    if (rc != 0) {
        return !decode_failed(rc, err, seqs, changed);
    }
    const uint8_t wide = n >= kWideRows ? 1 : 0;
    std::vector<sequence *> done;
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (const auto & g : group) {
            sequence & s = *g.first;
            slot & sl = slots_[s.slot];
            sl.cells.insert(sl.cells.end(), s.p.prompt.begin() + s.pos, s.p.prompt.begin() + s.pos + g.second);
            sl.wide.insert(sl.wide.end(), g.second, wide);
            s.pos += g.second;
            if (s.pos == static_cast<int32_t>(s.p.prompt.size())) {
                s.state = sequence::GENERATING;
                done.push_back(&s);
            }
        }
    }
    if (done.empty()) {
        return true;
    }
    std::vector<sequence *> sample;
    for (auto * s : done) {
        if (!s->p.logits_only) {
            sample.push_back(s);
            continue;
        }
        wait_for_device();
        const float * row = llama_get_logits_ith(ctx_, s->logits_row);
        std::lock_guard<std::mutex> lk(mu_);
        s->logits_row = -1;
        if (row == nullptr) {
            finish(*s, FINISH_ERROR, ERROR_DECODE, "llama.cpp returned no logits for the prompt");
        } else {
            s->out.logits.assign(row, row + n_vocab_);
            finish(*s, FINISH_LENGTH);
        }
        changed.push_back(s->id);
    }
    sample_all(sample);
    for (auto * s : sample) {
        judge(*s);
        ready.push_back(s);
    }
    return true;
}

int engine::step_body(std::vector<int64_t> & changed) {
    std::vector<sequence *> active;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (closed_) {
            return 0;
        }
        for (auto & sl : slots_) {
            if (!sl.owner) {
                continue;
            }
            auto it = requests_.find(sl.owner);
            if (it == requests_.end()) {
                sl.owner = 0;
                continue;
            }
            if (it->second->cancel) {
                finish(*it->second, FINISH_CANCELLED);
                changed.push_back(it->first);
            }
        }
        admit_locked(changed);
        for (auto & kv : requests_) {
            if (kv.second->state == sequence::PREFILL || kv.second->state == sequence::GENERATING) {
                active.push_back(kv.second.get());
            }
        }
    }
    stats_.steps++;

    // 1. sample every sequence whose logits the last generation batch made
    std::vector<sequence *> ready;
    for (auto * s : active) {
        if (s->state == sequence::GENERATING && s->logits_row >= 0) {
            ready.push_back(s);
        }
    }
    sample_all(ready);
    for (auto * s : ready) {
        judge(*s);
    }

    // 2. prompts being read: their next canonical chunks, wide ones together up to one
    //    micro-batch, narrow ones together below kWideRows rows (first come, first read)
    std::vector<std::pair<sequence *, int>> wide_group, narrow_group;
    int wide_rows = 0, narrow_rows = 0;
    // exact (CPU) placements keep narrow chunks narrow; elsewhere short prompts are read
    // together up to a micro-batch, so many new requests start in one step
    const int narrow_cap = exact_ ? kWideRows : n_ubatch_ + 1;
    for (auto * sp : active) {
        sequence & s = *sp;
        if (s.state != sequence::PREFILL) {
            continue;
        }
        const int n = static_cast<int>(s.p.prompt.size());
        const int end = std::min((s.pos / n_ubatch_ + 1) * n_ubatch_, n);
        const int k = end - s.pos;
        if (k >= kWideRows || k >= n_ubatch_) {
            if (wide_group.empty() || (wide_rows + k <= n_ubatch_ && wide_rows + k <= batch_cap_)) {
                wide_group.emplace_back(&s, k);
                wide_rows += k;
            }
        } else if (narrow_group.empty() || (narrow_rows + k < narrow_cap && narrow_rows + k <= batch_cap_)) {
            narrow_group.emplace_back(&s, k);
            narrow_rows += k;
        }
    }
    if (!read_prompts(wide_group, ready, changed) || !read_prompts(narrow_group, ready, changed)) {
        return 0;
    }
    const double t_sampled = now_s();

    // 3. the generation batch: every sampled token that goes on (on a GPU this returns
    //    before the device is done, and the text below is made meanwhile)
    int n = 0;
    std::vector<sequence *> decoding;
    for (auto * s : ready) {
        if (s->fate != GOES_ON || s->state == sequence::DONE) {
            continue;
        }
        decoding.push_back(s);
    }
    if (!unified_) {
        in_slot_order(decoding, [](const sequence * s) { return s->slot; });
    }
    for (auto * s : decoding) {
        add_row(n, s->token, s->pos, s->slot, true);
        s->logits_row = n++;
    }
    if (n > 0) {
        std::string err;
        const int rc = run_decode(n, decoding, err);
        if (rc != 0) {
            if (decode_failed(rc, err, decoding, changed)) {
                return 0;
            }
        } else {
            std::lock_guard<std::mutex> lk(mu_);
            const uint8_t wide = n >= kWideRows ? 1 : 0;
            for (auto * s : decoding) {
                slot & sl = slots_[s->slot];
                sl.cells.push_back(s->token);
                sl.wide.push_back(wide);
                s->pos++;
            }
        }
    }

    // 4. text of the sampled tokens
    std::lock_guard<std::mutex> lk(mu_);
    char buf[256];
    for (auto * sp : ready) {
        sequence & s = *sp;
        if (s.state == sequence::DONE) {
            continue;   // its decode failed above
        }
        if (s.out.t_first == 0) {
            s.out.t_first = t_sampled;
        }
        if (s.fate == ENDS_ERROR) {
            finish(s, FINISH_ERROR, s.sample_error, s.sample_error_text);
            changed.push_back(s.id);
            continue;
        }
        if (s.p.n_probs > 0) {
            s.out.logprobs.push_back(s.top);
        }
        if (s.fate == ENDS_EOG) {
            finish(s, FINISH_STOP);
            changed.push_back(s.id);
            continue;
        }
        stats_.tokens_generated++;
        s.out.tokens.push_back(s.token);
        int32_t len = llama_token_to_piece(vocab_, s.token, buf, sizeof(buf), 0, false);
        std::string big;
        const char * piece = buf;
        if (len < 0) {
            big.resize(-len);
            len = llama_token_to_piece(vocab_, s.token, &big[0], static_cast<int32_t>(big.size()), 0, false);
            piece = big.data();
        }
        const size_t before = s.text.size();
        utf8_feed(s.utf8_partial, piece, std::max(0, len), s.text, false);
        if (!s.p.stops.empty() && s.text.size() > before) {
            const size_t from = before >= s.max_stop ? before - s.max_stop + 1 : 0;
            size_t cut = std::string::npos;
            for (const auto & stop : s.p.stops) {
                const size_t at = s.text.find(stop, from);
                if (at != std::string::npos && at < cut) {
                    cut = at;
                }
            }
            if (cut != std::string::npos) {
                s.text.resize(cut);
                s.stopped = true;
            }
        }
        size_t safe = s.text.size();
        if (!s.stopped) {
            // hold back the longest tail that could still become a stop string
            size_t held = 0;
            for (const auto & stop : s.p.stops) {
                for (size_t k = std::min(stop.size() - 1, s.text.size()); k > held; k--) {
                    if (s.text.compare(s.text.size() - k, k, stop, 0, k) == 0) {
                        held = k;
                        break;
                    }
                }
            }
            safe -= held;
        }
        if (safe > s.released_text) {
            s.out.text.append(s.text, s.released_text, safe - s.released_text);
            s.released_text = safe;
        }
        s.out.n_generated = static_cast<int32_t>(s.generated.size());
        s.news = true;
        changed.push_back(s.id);
        if (s.stopped) {
            finish(s, FINISH_STOP);
        } else if (s.fate == ENDS_LENGTH) {
            finish(s, FINISH_LENGTH);
        }
    }
    // requests whose consumer is gone are forgotten once done
    for (auto it = requests_.begin(); it != requests_.end();) {
        if (it->second->released && it->second->state == sequence::DONE) {
            it = requests_.erase(it);
        } else {
            ++it;
        }
    }
    int live = static_cast<int>(queue_.size());
    for (const auto & sl : slots_) {
        live += sl.owner ? 1 : 0;
    }
    return live;
}

// ---- jobs -----------------------------------------------------------------------------
void engine::clear_cache() {
    std::lock_guard<std::mutex> sl(step_mu_);
    std::lock_guard<std::mutex> lk(mu_);
    for (auto & s : slots_) {
        if (!s.owner) {
            free_slot(s, true);
        }
    }
}

engine_stats engine::stats() {
    std::lock_guard<std::mutex> sl(step_mu_);   // the stepper writes stats_ without mu_
    std::lock_guard<std::mutex> lk(mu_);
    engine_stats st = stats_;
    st.queued = static_cast<int32_t>(queue_.size());
    st.live = 0;
    st.cached_slots = 0;
    for (const auto & sl : slots_) {
        st.live += sl.owner ? 1 : 0;
        st.cached_slots += (!sl.owner && !sl.cells.empty()) ? 1 : 0;
    }
    st.kv_cells_used = kv_used_locked();
    return st;
}


}  // namespace polyllama
