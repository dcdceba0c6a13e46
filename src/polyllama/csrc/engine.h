// The sequence engine: one llama_context, many live sequences, one multi-sequence batch
// per step (continuous batching), with prompt-prefix reuse across sequences.
//
// Each step, under the step lock, the engine
//   1. finishes cancelled sequences and admits queued requests into free slots (a slot is
//      a llama.cpp sequence id). A request takes the slot whose KV cells share the longest
//      prefix with its prompt, or copies that prefix from a busy slot (llama_memory_seq_cp,
//      unified KV only), so a chat's next turn or a common system prompt is not recomputed;
//   2. samples one token for every sequence whose logits the previous step computed
//      (argmax for plain greedy, the sequence's llama_sampler chain otherwise);
//   3. reads the next canonical chunk of the prompts still being read, in micro-batches of
//      their own (at most n_ubatch rows a step, so a long prompt holds the others back by
//      one micro-batch at most), and samples the first token of those it completes;
//   4. queues one llama_decode of all sampled tokens that go on, which on a GPU returns
//      before the device has finished;
//   5. meanwhile turns the sampled tokens into text: whole UTF-8 characters, cut at stop
//      strings, a possible stop-string prefix held back until it is decided.
// How prompts are chunked and which cached cells may be reused is chosen so that a request
// computes exactly what it computes alone (engine.cpp, kWideRows).
// Consumers get text, tokens and a finish reason per request; Python sees no per-token
// loop. Who runs the steps: either a driver (a thread calling step() in a loop, as the
// server does), or the consumers themselves: a consumer waiting for its request with no
// one stepping becomes the leader and steps for everybody until its own request has
// output (leader/follower), so one stream on its own pays no thread hand-off.
//
// Nothing here throws into Cython: every entry point catches and reports through its
// return value / the request's error text.
#pragma once

#include "llama.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace polyllama {

struct remote_worker;
class scan_pool;

enum finish_reason : int {
    FINISH_NONE      = 0,   // still running (or queued)
    FINISH_STOP      = 1,   // end-of-generation token or a stop string
    FINISH_LENGTH    = 2,   // max_tokens or the sequence's position limit
    FINISH_CANCELLED = 3,   // cancel() / release()
    FINISH_ERROR     = 4,   // see request_output::error and ::error_kind
};

enum error_kind : int {
    ERROR_NONE    = 0,
    ERROR_GRAMMAR = 1,   // the grammar (or grammar + logit bias) allows no token, or rejected one
    ERROR_DECODE  = 2,   // llama_decode failed
    ERROR_CONTEXT = 3,   // no KV-cache room even after evicting every cached prefix
    ERROR_REMOTE  = 4,   // an RPC server was lost or timed out
    ERROR_CLOSED  = 5,   // the engine was shut down
};

struct request_params {
    std::vector<llama_token> prompt;        // at least one token
    int32_t  max_tokens = -1;               // < 0: until `limit`
    int32_t  limit      = 0;                // most positions (prompt + generated); 0: n_ctx_seq
    int32_t  n_probs    = 0;                // top-n log-probabilities per generated token
    bool     greedy     = true;             // argmax of the logits, no sampler chain
    llama_token banned  = -1;               // greedy only: never pick this token (ignore_eos)
    bool     ignore_eos = false;            // end-of-generation tokens do not end the sequence
    std::vector<std::string> stops;         // UTF-8 stop strings (cut from the text)
    llama_sampler * sampler = nullptr;      // used when !greedy; submit() takes ownership
                                            // (freed with the request)
    bool     logits_only = false;           // read the prompt, return its last logits, generate nothing
};

struct request_output {
    std::string text;                        // newly released text (valid UTF-8)
    std::vector<llama_token> tokens;         // newly generated tokens
    // per sampled token (n_probs > 0): the top n_probs of the raw logits as (token, logprob),
    // best first, then the sampled token itself when it is not among them
    std::vector<std::vector<std::pair<llama_token, float>>> logprobs;
    std::vector<float> logits;               // logits_only: the n_vocab logits after the prompt
    int      finish      = FINISH_NONE;
    int      error_kind  = ERROR_NONE;
    int      error_code  = 0;                // llama_decode's code, or the remote_status of ERROR_REMOTE
    std::string error;
    int32_t  n_prompt    = 0;
    int32_t  n_reused    = 0;                // prompt tokens found in the KV cache
    int32_t  n_generated = 0;
    double   t_submit = 0, t_start = 0, t_first = 0, t_end = 0;   // seconds (steady clock)
};

struct engine_stats {
    int64_t steps = 0;
    int64_t tokens_decoded = 0;       // prompt + generated tokens sent to llama_decode
    int64_t tokens_generated = 0;
    int64_t prompt_tokens_reused = 0;
    int64_t tokens_picked_on_device = 0;   // greedy tokens picked in the decode graph
    int64_t tokens_picked_in_ranges = 0;   // greedy tokens whose scan several threads shared
    int32_t live = 0;                 // sequences in slots (prefill or generating)
    int32_t queued = 0;
    int32_t cached_slots = 0;         // idle slots holding a reusable prefix
    int32_t kv_cells_used = 0;        // by the engine's own count (shared prefixes counted once per slot)
    double  decode_seconds = 0;       // inside llama_decode and waiting for the device
    double  wait_seconds = 0;         //   of which waiting for the device (llama_synchronize)
    double  sample_seconds = 0;       // picking tokens from logits that are there
    double  step_seconds = 0;         // inside steps altogether
};

class engine {
  public:
    // ctx/model stay owned by the caller and must outlive the engine. n_slots: the
    // context's n_seq_max. worker/timeout: the RPC guard of the context (may be null).
    // aligned_regions: the CPU's exactness rules (ARCHITECTURE.md §6.3): 64-aligned slot
    // regions of a unified cache, short prompt chunks read apart from long ones. Off on
    // GPUs, whose kernels are not exact across batch shapes anyway: regions leave cells
    // unused, and short prompts are read together there.
    // device_sampling: when every output of a batch is a plain greedy pick, the decode
    // graph makes the picks (llama_set_output_argmax, thirdparty patch 0004) and only the
    // token ids come back, not the logits; off for RPC.
    engine(llama_context * ctx, const llama_model * model, remote_worker * worker, double timeout_s,
           int sample_threads, bool aligned_regions, bool device_sampling = false);
    ~engine();

    // ---- requests (any thread) ----
    int64_t submit(request_params & params);    // moves params in; returns the request id (> 0)
    void cancel(int64_t id);                     // ends it with FINISH_CANCELLED at the next step
    void cancel_all();
    void release(int64_t id);                    // the consumer is gone: cancel, then forget it

    // Moves the request's new output into `out`. wait(): blocks until there is some (or, with
    // until_finished, until the request finished), running steps as the leader when nobody
    // else does; returns 1 with output, 0 on timeout (the caller checks signals and calls
    // again), -1 for an unknown id. take(): the same without blocking or stepping.
    int wait(int64_t id, bool until_finished, double timeout_s, request_output & out);
    int take(int64_t id, request_output & out);

    // ---- driving (one thread at a time holds the step lock) ----
    // One step. `changed`: ids whose output or state changed. Returns the number of live
    // plus queued requests afterwards (0: idle).
    int step(std::vector<int64_t> & changed);
    // Blocks until a request is queued or live, the timeout passes, or shutdown(); returns
    // whether there is work.
    bool wait_for_work(double timeout_s);
    void shutdown();                             // fails every request with ERROR_CLOSED, wakes all

    // ---- the KV cache ----
    void clear_cache();                          // drop every idle slot's cached prefix
    engine_stats stats();
    int n_slots() const { return n_slots_; }

  private:
    struct sequence;
    struct slot;

    enum { GOES_ON = 0, ENDS_EOG, ENDS_LENGTH, ENDS_ERROR };   // sequence::fate

    int  step_locked(std::vector<int64_t> & changed);   // step_body, timed
    int  step_body(std::vector<int64_t> & changed);
    size_t reusable_prefix(const slot & sl, const std::vector<llama_token> & prompt, size_t cap) const;
    // outs: the sequences with an output row in the batch
    int  run_decode(int n, const std::vector<sequence *> & outs, std::string & err);
    void add_row(int i, llama_token token, llama_pos pos, int seq, bool logits);
    bool decode_failed(int rc, const std::string & err, const std::vector<sequence *> & seqs,
                       std::vector<int64_t> & changed);
    void judge(sequence & s);
    double wait_for_device();                   // llama_synchronize, timed into stats_; the wait
    bool read_prompts(std::vector<std::pair<sequence *, int>> & group, std::vector<sequence *> & ready,
                      std::vector<int64_t> & changed);
    void admit_locked(std::vector<int64_t> & changed);
    bool place(sequence & s, std::vector<int64_t> & changed);
    void sample_all(std::vector<sequence *> & ready);
    void sample_shared(std::vector<sequence *> & ready);
    void sample_one(sequence & s);
    int  decode(llama_batch & batch, std::string & err);
    void finish(sequence & s, int reason, int kind = ERROR_NONE, const std::string & err = "", int code = 0);
    void free_slot(slot & sl, bool release_region = false);
    int32_t find_gap(int32_t need, int ignore) const;
    bool ensure_region(slot & sl, int32_t need, int keep, bool * moved);
    // ggml-cpu's flash attention works in tiles of 64 KV cells (GGML_FA_TILE_KV): a slot's
    // region starts at a multiple of it, so its cells group into tiles as a lone sequence's
    static constexpr int32_t kRegionAlign = 64;
    int  kv_used_locked() const;
    void fail_all(int kind, const std::string & msg, int code, std::vector<int64_t> & changed);

    llama_context *       ctx_;
    const llama_model *   model_;
    const llama_vocab *   vocab_;
    remote_worker *       worker_;
    double                timeout_s_;
    int                   n_slots_;
    int                   n_vocab_;
    int                   n_ctx_;
    int                   n_ctx_seq_;
    int                   n_ubatch_;
    bool                  unified_;
    bool                  can_shift_prefix_;   // partial seq_rm / seq_cp work (not recurrent)
    bool                  placement_ = false;  // slots have regions (unified cache, patch 0001)
    bool                  exact_ = true;       // CPU: keep each request's arithmetic its own (§6.3)
    bool                  device_sampling_ = false;
    bool                  picked_in_graph_ = false;   // the last decode made its outputs' picks
    std::vector<int>      out_rank_;          // the last decode's batch rows: their output's rank, or -1

    std::mutex            mu_;          // requests, queue, outputs
    std::condition_variable cv_;        // output appeared / step ended / work arrived
    std::mutex            step_mu_;     // held while stepping
    bool                  stepping_ = false;   // under mu_: somebody holds step_mu_
    bool                  closed_   = false;
    bool                  lost_     = false;
    int                   inside_   = 0;       // under mu_: threads in wait() / step()

    int64_t               next_id_ = 1;
    std::map<int64_t, std::unique_ptr<sequence>> requests_;
    std::deque<int64_t>   queue_;
    std::vector<slot>     slots_;
    llama_batch           batch_{};
    int                   batch_cap_ = 0;
    uint64_t              clock_ = 0;   // slot recency
    engine_stats          stats_;

    // threads for the scans of logits (GPU placements): spread over sequences, or over
    // ranges of one; between steps they wait for the next pick around when it is due
    // (scan_pool.h) if the device, not the host, computed the last step
    std::unique_ptr<scan_pool> pool_;
    double                last_wait_s_ = 0.0;
    static constexpr double kPacedWait = 50e-6;       // a shorter wait: the host computed
    static constexpr int    kMinRange = 8192;         // floats: a range smaller costs more to hand out
};

}  // namespace polyllama
