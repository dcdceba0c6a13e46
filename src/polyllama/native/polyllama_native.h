// Thin C++ layer between Cython and llama.cpp's C++-only APIs (libcommon, llama-ext.h).
// Every function here catches C++ exceptions and reports them through `err`, so that no
// exception crosses into Cython-generated code; Cython sees plain structs and std types.
#pragma once

#include "llama.h"

#include <cstdint>
#include <string>
#include <vector>

namespace polyllama {

// ---- logging --------------------------------------------------------------------------
// llama.cpp and ggml log through one callback. Ours keeps the recent warning/error lines
// (so a failed load can say why) and echoes lines at or above a threshold to stderr.
void        log_install();
void        log_set_stderr_level(int min_level);  // ggml_log_level; >= 5 prints nothing
std::string log_recent_problems();                // warnings and errors since log_clear()
std::string log_recent_errors();                  // the errors alone (a failure's reason)
void        log_clear();

// ---- greedy pick -----------------------------------------------------------------------
// First index of the largest of p[0..n), never `exclude` (-1: none; p[exclude] is changed
// during the call and restored): the token that
// llama_sampler_init_greedy would pick, without building its n_vocab-long candidate array.
// Vectorized: with a 128k vocabulary a scalar scan took 38 µs per token on our build
// machine, 4% of the ~1 ms an H100 needs to decode a token of a 1B model.
int argmax_f32(float * p, int n, int exclude) noexcept;

// ---- CPU threadpools (common.h: common_threadpools) --------------------------------------
// Without an attached threadpool, ggml-cpu makes and joins a new set of threads for every
// llama_decode: on 2 cores that cost SmolLM2 about 9% of its generation speed against
// llama-bench, which attaches persistent pools as llama.cpp's own tools do. These wrap
// libcommon's pools (n_threads for single tokens, n_threads_batch for prompts, polling
// as llama.cpp's default). The pools must be freed after the context (llama_free).
struct threadpools;
threadpools * threadpools_attach(llama_context * ctx, int n_threads, int n_threads_batch,
                                 std::string & err) noexcept;
void threadpools_free(threadpools * tp) noexcept;

// ---- device limits -------------------------------------------------------------------------
// Whether device `dev_index` (ggml_backend_dev_get) accepts an F16 tensor of `nbytes` bytes,
// asked through ggml_backend_dev_supports_op on an unallocated tensor. ggml-vulkan refuses
// tensors larger than one storage buffer can address; a KV cache layer that large, once
// allocated there, makes ggml's scheduler abort (GGML_ABORT "pre-allocated tensor ... in a
// buffer that cannot run the operation"). Checked before a context is made.
bool device_supports_tensor_bytes(size_t dev_index, uint64_t nbytes) noexcept;

// ---- memory accounting (common/fit.h) -----------------------------------------------------
struct device_memory {
    std::string device;   // ggml device name; "Host" for the host (CPU-mapped) buffers
    int64_t     total;    // device memory, bytes
    int64_t     free;     // free device memory, bytes
    uint64_t    model;    // weights, bytes
    uint64_t    context;  // KV cache / recurrent state, bytes
    uint64_t    compute;  // compute buffers, bytes
};

// Loads the model and a context with no_alloc (nothing is allocated) and returns what
// would be allocated per device, last entry the host. Returns false and sets err on failure.
bool estimate_device_memory(const char * path, const llama_model_params * mparams,
                            const llama_context_params * cparams,
                            std::vector<device_memory> & out, uint32_t & n_layer,
                            uint32_t & n_ctx_train, std::string & err);

// What a live context actually allocated, per device, last entry the host.
std::vector<device_memory> context_device_memory(const llama_context * ctx);

// common_fit_params: adjusts n_gpu_layers / tensor_split / overrides / n_ctx (when 0) to
// the free memory of the devices in mparams. Returns 0 success, 1 does not fit, 2 error.
int fit_params(const char * path, llama_model_params * mparams, llama_context_params * cparams,
               float * tensor_split, llama_model_tensor_buft_override * overrides,
               size_t * margins, uint32_t n_ctx_min, std::string & err);
size_t max_tensor_buft_overrides();

// ---- chat templates and grammars (common/chat.h, common/json-schema-to-grammar.h) ----------
struct chat_result {
    std::string              prompt;             // the formatted prompt
    std::string              grammar;            // GBNF for tools / json_schema, may be empty
    bool                     grammar_lazy = false;
    std::vector<std::string> grammar_trigger_patterns;  // regex patterns for a lazy grammar
    std::vector<std::string> additional_stops;
    std::vector<std::string> preserved_tokens;
    int                      format = 0;         // common_chat_format, for parsing the reply
    std::string              generation_prompt;
    std::string              parser;             // serialized PEG parser for the reply
};

// Parses a reply (content, reasoning, tool calls) into OpenAI-style JSON; partial: the
// reply is still being generated (an unfinished tool call is left open, not an error).
bool chat_parse_reply(int format, const std::string & generation_prompt, const std::string & parser,
                      const std::string & text, bool partial,
                      std::string & message_json, std::string & err);

bool json_schema_to_gbnf(const std::string & schema_json, std::string & grammar, std::string & err);

// ---- ggml RPC: a lost remote device must not take the process down ------------------------
// ggml-rpc talks to each server from one "dispatcher" thread of its own. When a server dies
// mid-call, that thread hits GGML_ABORT (abort() of the whole process), and the thread that
// issued the call waits forever for an answer that will never come. We cannot change that
// code, so the guard works around it:
//   * the ggml abort callback parks a dispatcher thread that reports a dead server (it never
//     returns, so ggml never reaches abort()) and counts the failure;
//   * calls that can talk to a server run on a worker thread (remote_worker); the caller waits
//     for it, and gives up on it once a failure has been counted and the call has not
//     finished shortly after (REMOTE_LOST), or after a timeout (REMOTE_TIMEOUT). The
//     abandoned worker stays blocked for the life of the process, and so must everything it
//     was using: the caller must then never free that context or model (it leaks);
//   * an abort raised by ggml-rpc on a worker thread itself (connect or handshake failure,
//     which happen on the calling thread) is thrown as a C++ exception, unwound through
//     ggml-rpc's RAII locks, and reported as REMOTE_ERROR.
// Aborts that do not come from ggml-rpc keep ggml's default behaviour (message, backtrace,
// abort()).
enum remote_status { REMOTE_OK = 0, REMOTE_ERROR = 1, REMOTE_LOST = 2, REMOTE_TIMEOUT = 3 };

struct remote_worker;

void          remote_guard_install();                // idempotent
std::string   remote_last_failure();                 // ggml's message for the last one
remote_worker * remote_worker_new();
void          remote_worker_release(remote_worker * w);  // leaks the thread if it is stuck

int remote_model_load(remote_worker * w, const char * path, llama_model_params params,
                      llama_model ** out, double timeout_s, std::string & err);
int remote_context_init(remote_worker * w, llama_model * model, llama_context_params params,
                        llama_context ** out, double timeout_s, std::string & err);
int remote_decode(remote_worker * w, llama_context * ctx, llama_batch batch, int32_t * rc,
                  double timeout_s, std::string & err);
int remote_memory_clear(remote_worker * w, llama_context * ctx, double timeout_s, std::string & err);
int remote_context_free(remote_worker * w, llama_context * ctx, double timeout_s, std::string & err);
int remote_model_free(remote_worker * w, llama_model * model, double timeout_s, std::string & err);
int remote_context_memory(remote_worker * w, const llama_context * ctx,
                          std::vector<device_memory> & out, double timeout_s, std::string & err);
// one-off calls on a worker of their own
int remote_device_memory(ggml_backend_dev_t dev, size_t * free, size_t * total, double timeout_s,
                         std::string & err);
// add_server_fn: ggml_backend_rpc_add_server as returned by the RPC registry's proc address.
// Registers the server's registry (and so its devices) with ggml once per endpoint.
int remote_add_server(void * add_server_fn, const char * endpoint, ggml_backend_reg_t * out,
                      double timeout_s, std::string & err);
int remote_fit_params(const char * path, llama_model_params * mparams, llama_context_params * cparams,
                      float * tensor_split, llama_model_tensor_buft_override * overrides,
                      size_t * margins, uint32_t n_ctx_min, int * status, double timeout_s,
                      std::string & err);

}  // namespace polyllama
