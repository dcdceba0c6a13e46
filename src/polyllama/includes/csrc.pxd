# Declarations of polyllama's own C++ layer (csrc/*.h): the parts of llama.cpp that are
# C++ only (libcommon's memory fitting, chat templates, grammars, threadpools), and the
# guards that keep its aborts, exceptions and lost RPC servers out of Python.
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libcpp cimport bool as cbool
from libcpp.string cimport string
from libcpp.utility cimport pair
from libcpp.vector cimport vector

from polyllama.includes.ggml_backend cimport ggml_backend_dev_t, ggml_backend_reg_t
from polyllama.includes.llama cimport (llama_batch, llama_context, llama_context_params,
                                       llama_model, llama_model_params,
                                       llama_model_tensor_buft_override, llama_sampler,
                                       llama_token, llama_vocab)


cdef extern from "logging.h" namespace "polyllama" nogil:
    void log_install()
    void log_set_stderr_level(int min_level)
    string log_recent_problems()
    string log_recent_errors()
    void log_clear()


cdef extern from "greedy.h" namespace "polyllama" nogil:
    int argmax_f32(float * p, int n, int exclude) noexcept


cdef extern from "threadpools.h" namespace "polyllama" nogil:
    cdef cppclass threadpools:
        pass
    threadpools * threadpools_attach(llama_context * ctx, int n_threads, int n_threads_batch,
                                     string & err) noexcept
    void threadpools_free(threadpools * tp) noexcept


cdef extern from "device_memory.h" namespace "polyllama" nogil:
    cdef cppclass device_memory:
        string device
        int64_t total
        int64_t free
        uint64_t model
        uint64_t context
        uint64_t compute

    cbool estimate_device_memory(const char * path, const llama_model_params * mparams,
                                 const llama_context_params * cparams,
                                 vector[device_memory] & out, uint32_t & n_layer,
                                 uint32_t & n_ctx_train, string & err)
    size_t max_tensor_buft_overrides()
    cbool device_supports_tensor_bytes(size_t dev_index, uint64_t nbytes) noexcept


cdef extern from "chat_reply.h" namespace "polyllama" nogil:
    cdef cppclass chat_result:
        string prompt
        string grammar
        cbool grammar_lazy
        vector[string] grammar_trigger_patterns
        vector[string] additional_stops
        vector[string] preserved_tokens
        int format
        string generation_prompt
        string parser

    cbool chat_parse_reply(int format, const string & generation_prompt, const string & parser,
                           const string & text, cbool partial,
                           string & message_json, string & err)


# ggml RPC guard (csrc/remote.h). The *_via calls run on the worker when one is given,
# else on the calling thread (a model without remote devices passes NULL).
cdef extern from "remote.h" namespace "polyllama" nogil:
    cdef enum remote_status:
        REMOTE_OK
        REMOTE_ERROR
        REMOTE_LOST
        REMOTE_TIMEOUT
    cdef cppclass remote_worker:
        pass
    void remote_guard_install()
    remote_worker * remote_worker_new()
    void remote_worker_release(remote_worker * w)
    int model_load_via(remote_worker * w, const char * path, llama_model_params params,
                       llama_model ** out, double timeout_s, string & err)
    int context_init_via(remote_worker * w, llama_model * model, llama_context_params params,
                         llama_context ** out, double timeout_s, string & err)
    int decode_via(remote_worker * w, llama_context * ctx, llama_batch batch, int32_t * rc,
                   double timeout_s, string & err)
    int memory_clear_via(remote_worker * w, llama_context * ctx, double timeout_s, string & err)
    int context_free_via(remote_worker * w, llama_context * ctx, double timeout_s, string & err)
    int model_free_via(remote_worker * w, llama_model * model, double timeout_s, string & err)
    int context_memory_via(remote_worker * w, const llama_context * ctx,
                           vector[device_memory] & out, double timeout_s, string & err)
    int remote_device_memory(ggml_backend_dev_t dev, size_t * free, size_t * total,
                             double timeout_s, string & err)
    int remote_add_server(void * add_server_fn, const char * endpoint, ggml_backend_reg_t * out,
                          double timeout_s, string & err)
    int fit_params_via(const char * path, llama_model_params * mparams,
                       llama_context_params * cparams, float * tensor_split,
                       llama_model_tensor_buft_override * overrides, size_t * margins,
                       uint32_t n_ctx_min, int * status, double timeout_s, string & err)


# The sequence engine (csrc/engine.h).
cdef extern from "engine.h" namespace "polyllama" nogil:
    cdef enum finish_reason:
        FINISH_NONE
        FINISH_STOP
        FINISH_LENGTH
        FINISH_CANCELLED
        FINISH_ERROR

    cdef enum error_kind:
        ERROR_NONE
        ERROR_GRAMMAR
        ERROR_DECODE
        ERROR_CONTEXT
        ERROR_REMOTE
        ERROR_CLOSED

    cdef cppclass request_params:
        vector[llama_token] prompt
        int32_t max_tokens
        int32_t limit
        int32_t n_probs
        cbool greedy
        llama_token banned
        cbool ignore_eos
        vector[string] stops
        llama_sampler * sampler
        cbool logits_only

    cdef cppclass request_output:
        string text
        vector[llama_token] tokens
        vector[vector[pair[llama_token, float]]] logprobs
        vector[float] logits
        int finish
        int error_kind
        int error_code
        string error
        int32_t n_prompt
        int32_t n_reused
        int32_t n_generated
        double t_submit
        double t_start
        double t_first
        double t_end

    cdef cppclass engine_stats:
        int64_t steps
        int64_t tokens_decoded
        int64_t tokens_generated
        int64_t prompt_tokens_reused
        int64_t tokens_picked_on_device
        int64_t tokens_picked_in_ranges
        int32_t live
        int32_t queued
        int32_t cached_slots
        int32_t kv_cells_used
        double decode_seconds
        double wait_seconds
        double sample_seconds
        double step_seconds

    cdef cppclass engine:
        engine(llama_context * ctx, const llama_model * model, remote_worker * worker,
               double timeout_s, int sample_threads, cbool aligned_regions,
               cbool device_sampling) except +
        int64_t submit(request_params & params)
        void cancel(int64_t id)
        void cancel_all()
        void release(int64_t id)
        int wait(int64_t id, cbool until_finished, double timeout_s, request_output & out)
        int take(int64_t id, request_output & out)
        int step(vector[int64_t] & changed)
        cbool wait_for_work(double timeout_s)
        void shutdown()
        void clear_cache()
        engine_stats stats()
        int n_slots()


# Hardening (csrc/hardening.h): aborts, deep recursion and bad ids turned into errors.
cdef extern from "hardening.h" namespace "polyllama" nogil:
    void abort_scope_enter()
    void abort_scope_leave()
    void abort_guard_install()
    string vocab_problems(const llama_model * model)

    cdef enum tokenize_status:
        TOKENIZE_OK
        TOKENIZE_TOO_LONG
        TOKENIZE_FAILED
        TOKENIZE_BAD_ID
    int tokenize_checked(const llama_vocab * vocab, const char * text, size_t len, cbool add_special,
                         cbool parse_special, vector[llama_token] & out, string & err)

    llama_sampler * grammar_init_checked(const llama_vocab * vocab, const string & grammar,
                                         const string & root, const vector[string] & lazy_patterns,
                                         string & err)
    cbool grammar_prefill(llama_sampler * grammar, const llama_vocab * vocab,
                          const vector[llama_token] & tokens, string & err)
    cbool json_schema_to_gbnf_checked(const string & schema_json, string & grammar, string & err)

    cdef cppclass chat_job:
        pass
    chat_job * chat_job_start(const llama_model * model, const string & template_override,
                              const string & messages_json, const string & tools_json,
                              const string & json_schema, cbool add_generation_prompt,
                              cbool enable_thinking, const string & tool_choice,
                              int parallel_tool_calls)
    int chat_job_wait(chat_job * job, double timeout_s)
    cbool chat_job_result(chat_job * job, chat_result & out, string & err)
    void chat_job_release(chat_job * job)
