# Declarations from ggml.h (plus the parts of ggml-cpu.h and ggml-opt.h that llama.h uses),
# pinned llama.cpp: thirdparty/llama.cpp/ggml/include/.
#
# Not the whole ggml API: the tensor-op / graph-building functions are left out; what is here is
# what llama.h, ggml-backend.h and gguf.h reference, plus a few small helpers (type sizes, version,
# logging, threadpools, tensor names and sizes).
#
# C `bool` is `bint`, except inside function-pointer types, where it is `cbool` (libcpp.bool):
# a C++ compiler will not convert `int (*)(...)` into `bool (*)(...)`, so callbacks assigned to
# those types must be written as `cdef cbool f(...) noexcept` (not `cdef bint`).

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdio cimport FILE
from libcpp cimport bool as cbool


cdef extern from "ggml.h" nogil:

    # constants (macros)
    const int GGML_FILE_MAGIC
    const int GGML_FILE_VERSION
    const int GGML_QNT_VERSION
    const int GGML_QNT_VERSION_FACTOR
    const int GGML_MAX_DIMS
    const int GGML_MAX_PARAMS
    const int GGML_MAX_SRC
    const int GGML_MAX_N_THREADS
    const int GGML_MAX_OP_PARAMS
    const int GGML_MAX_NAME
    const int GGML_DEFAULT_N_THREADS
    const int GGML_DEFAULT_GRAPH_SIZE
    const int GGML_MEM_ALIGN
    const int GGML_EXIT_SUCCESS
    const int GGML_EXIT_ABORTED
    const int GGML_ROPE_TYPE_NORMAL
    const int GGML_ROPE_TYPE_NEOX
    const int GGML_ROPE_TYPE_MROPE
    const int GGML_ROPE_TYPE_VISION
    const int GGML_ROPE_TYPE_IMROPE
    const int GGML_MROPE_SECTIONS

    # Function type used in fatal error callbacks
    ctypedef void (*ggml_abort_callback_t)(const char * error_message) noexcept

    # Set the abort callback (NULL restores the original: print a message to stdout)
    # Returns the old callback for chaining
    ggml_abort_callback_t ggml_set_abort_callback(ggml_abort_callback_t callback)

    enum ggml_status:
        GGML_STATUS_ALLOC_FAILED  # -2
        GGML_STATUS_FAILED        # -1
        GGML_STATUS_SUCCESS       # 0
        GGML_STATUS_ABORTED       # 1

    # get ggml_status name string
    const char * ggml_status_to_string(ggml_status status)

    # ieee 754-2008 half-precision float16
    ctypedef uint16_t ggml_fp16_t
    float       ggml_fp16_to_fp32(ggml_fp16_t)
    ggml_fp16_t ggml_fp32_to_fp16(float)
    void        ggml_fp16_to_fp32_row(const ggml_fp16_t *, float *, int64_t)
    void        ggml_fp32_to_fp16_row(const float *, ggml_fp16_t *, int64_t)

    # google brain half-precision bfloat16
    ctypedef struct ggml_bf16_t:
        uint16_t bits
    ggml_bf16_t ggml_fp32_to_bf16(float)
    float       ggml_bf16_to_fp32(ggml_bf16_t)  # consider just doing << 16
    void        ggml_bf16_to_fp32_row(const ggml_bf16_t *, float *, int64_t)
    void        ggml_fp32_to_bf16_row_ref(const float *, ggml_bf16_t *, int64_t)
    void        ggml_fp32_to_bf16_row(const float *, ggml_bf16_t *, int64_t)

    # opaque
    cdef struct ggml_object
    cdef struct ggml_context
    cdef struct ggml_cgraph

    # NOTE: always add types at the end of the enum to keep backward compatibility
    enum ggml_type:
        GGML_TYPE_F32      # 0
        GGML_TYPE_F16      # 1
        GGML_TYPE_Q4_0     # 2
        GGML_TYPE_Q4_1     # 3
        # GGML_TYPE_Q4_2 = 4, GGML_TYPE_Q4_3 = 5: support has been removed
        GGML_TYPE_Q5_0     # 6
        GGML_TYPE_Q5_1     # 7
        GGML_TYPE_Q8_0     # 8
        GGML_TYPE_Q8_1     # 9
        GGML_TYPE_Q2_K     # 10
        GGML_TYPE_Q3_K     # 11
        GGML_TYPE_Q4_K     # 12
        GGML_TYPE_Q5_K     # 13
        GGML_TYPE_Q6_K     # 14
        GGML_TYPE_Q8_K     # 15
        GGML_TYPE_IQ2_XXS  # 16
        GGML_TYPE_IQ2_XS   # 17
        GGML_TYPE_IQ3_XXS  # 18
        GGML_TYPE_IQ1_S    # 19
        GGML_TYPE_IQ4_NL   # 20
        GGML_TYPE_IQ3_S    # 21
        GGML_TYPE_IQ2_S    # 22
        GGML_TYPE_IQ4_XS   # 23
        GGML_TYPE_I8       # 24
        GGML_TYPE_I16      # 25
        GGML_TYPE_I32      # 26
        GGML_TYPE_I64      # 27
        GGML_TYPE_F64      # 28
        GGML_TYPE_IQ1_M    # 29
        GGML_TYPE_BF16     # 30
        # 31-33 (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8): removed from gguf files
        GGML_TYPE_TQ1_0    # 34
        GGML_TYPE_TQ2_0    # 35
        # 36-38 (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8): removed
        GGML_TYPE_MXFP4    # 39, MXFP4 (1 block)
        GGML_TYPE_NVFP4    # 40, NVFP4 (4 blocks, E4M3 scale)
        GGML_TYPE_Q1_0     # 41
        GGML_TYPE_Q2_0     # 42
        GGML_TYPE_COUNT    # 43

    enum ggml_log_level:
        GGML_LOG_LEVEL_NONE   # 0
        GGML_LOG_LEVEL_DEBUG  # 1
        GGML_LOG_LEVEL_INFO   # 2
        GGML_LOG_LEVEL_WARN   # 3
        GGML_LOG_LEVEL_ERROR  # 4
        GGML_LOG_LEVEL_CONT   # 5, continue previous log

    struct ggml_init_params:
        # memory pool
        size_t mem_size    # bytes
        void * mem_buffer  # if NULL, memory will be allocated internally
        bint   no_alloc    # don't allocate memory for the tensor data

    # n-dimensional tensor (opaque here: use the accessor functions)
    cdef struct ggml_tensor

    # Abort callback
    # If not NULL, called before ggml computation
    # If it returns true, the computation is aborted
    ctypedef cbool (*ggml_abort_callback)(void * data) noexcept

    # GUID types
    ctypedef uint8_t ggml_guid[16]
    ctypedef ggml_guid * ggml_guid_t

    bint ggml_guid_matches(ggml_guid_t guid_a, ggml_guid_t guid_b)

    # misc

    const char * ggml_version()
    const char * ggml_commit()

    void    ggml_time_init()  # call this once at the beginning of the program
    int64_t ggml_time_ms()
    int64_t ggml_time_us()
    int64_t ggml_cycles()
    int64_t ggml_cycles_per_ms()

    # accepts a UTF-8 path, even on Windows
    FILE *  ggml_fopen(const char * fname, const char * mode)

    int64_t ggml_nelements (const ggml_tensor * tensor)
    int64_t ggml_nrows     (const ggml_tensor * tensor)
    size_t  ggml_nbytes    (const ggml_tensor * tensor)
    size_t  ggml_nbytes_pad(const ggml_tensor * tensor)  # same as ggml_nbytes() but padded to GGML_MEM_ALIGN

    int64_t ggml_blck_size(ggml_type type)
    size_t  ggml_type_size(ggml_type type)              # size in bytes for all elements in a block
    size_t  ggml_row_size (ggml_type type, int64_t ne)  # size in bytes for all elements in a row

    const char * ggml_type_name(ggml_type type)

    size_t  ggml_element_size(const ggml_tensor * tensor)

    bint    ggml_is_quantized(ggml_type type)

    int     ggml_n_dims(const ggml_tensor * tensor)  # returns 1 for scalars

    size_t  ggml_tensor_overhead()

    # main
    ggml_context * ggml_init (ggml_init_params params)
    void           ggml_reset(ggml_context * ctx)
    void           ggml_free (ggml_context * ctx)

    size_t  ggml_used_mem(const ggml_context * ctx)

    # Context tensor enumeration and lookup
    ggml_tensor * ggml_get_first_tensor(const ggml_context * ctx)
    ggml_tensor * ggml_get_next_tensor (const ggml_context * ctx, ggml_tensor * tensor)
    ggml_tensor * ggml_get_tensor(ggml_context * ctx, const char * name)

    void *       ggml_get_data(const ggml_tensor * tensor)
    const char * ggml_get_name(const ggml_tensor * tensor)

    ctypedef void (*ggml_log_callback)(ggml_log_level level, const char * text, void * user_data) noexcept

    # Set callback for all future logging events.
    # If this is not called, or NULL is supplied, everything is output on stderr.
    void ggml_log_get(ggml_log_callback * log_callback, void ** user_data)
    void ggml_log_set(ggml_log_callback   log_callback, void *  user_data)

    # some quantization type cannot be used without an importance matrix
    bint ggml_quantize_requires_imatrix(ggml_type type)

    # scheduling priorities
    enum ggml_sched_priority:
        GGML_SCHED_PRIO_LOW       # -1
        GGML_SCHED_PRIO_NORMAL
        GGML_SCHED_PRIO_MEDIUM
        GGML_SCHED_PRIO_HIGH
        GGML_SCHED_PRIO_REALTIME

    # threadpool params
    # Use ggml_threadpool_params_default() or ggml_threadpool_params_init() to populate the defaults
    struct ggml_threadpool_params:
        cbool               cpumask[512]  # [GGML_MAX_N_THREADS] mask of cpu cores (all-zeros means use default affinity settings)
        int                 n_threads     # number of threads
        ggml_sched_priority prio          # thread priority
        uint32_t            poll          # polling level (0 - no polling, 100 - aggressive polling)
        bint                strict_cpu    # strict cpu placement
        bint                paused        # start in paused state

    cdef struct ggml_threadpool  # opaque

    ctypedef ggml_threadpool * ggml_threadpool_t

    ggml_threadpool_params ggml_threadpool_params_default(int n_threads)
    void                   ggml_threadpool_params_init   (ggml_threadpool_params * p, int n_threads)
    bint                   ggml_threadpool_params_match  (const ggml_threadpool_params * p0, const ggml_threadpool_params * p1)


cdef extern from "ggml-cpu.h" nogil:

    # numa strategies
    enum ggml_numa_strategy:
        GGML_NUMA_STRATEGY_DISABLED    # 0
        GGML_NUMA_STRATEGY_DISTRIBUTE  # 1
        GGML_NUMA_STRATEGY_ISOLATE     # 2
        GGML_NUMA_STRATEGY_NUMACTL     # 3
        GGML_NUMA_STRATEGY_MIRROR      # 4
        GGML_NUMA_STRATEGY_COUNT

    void ggml_numa_init(ggml_numa_strategy numa)  # call once for better performance on NUMA systems
    bint ggml_is_numa()  # true if init detected that system has >1 NUMA node

    # threadpools (for llama_attach_threadpool)
    ggml_threadpool * ggml_threadpool_new          (ggml_threadpool_params * params)
    void              ggml_threadpool_free         (ggml_threadpool * threadpool)
    int               ggml_threadpool_get_n_threads(ggml_threadpool * threadpool)
    void              ggml_threadpool_pause        (ggml_threadpool * threadpool)
    void              ggml_threadpool_resume       (ggml_threadpool * threadpool)


cdef extern from "ggml-opt.h" nogil:
    # only the types that llama.h's training API (llama_opt_params, llama_opt_epoch) uses

    cdef struct ggml_opt_dataset
    cdef struct ggml_opt_context
    cdef struct ggml_opt_result

    ctypedef ggml_opt_dataset * ggml_opt_dataset_t
    ctypedef ggml_opt_context * ggml_opt_context_t
    ctypedef ggml_opt_result  * ggml_opt_result_t

    # built-in loss types, i.e. the built-in quantities minimized by the optimizer
    enum ggml_opt_loss_type:
        GGML_OPT_LOSS_TYPE_MEAN
        GGML_OPT_LOSS_TYPE_SUM
        GGML_OPT_LOSS_TYPE_CROSS_ENTROPY
        GGML_OPT_LOSS_TYPE_MEAN_SQUARED_ERROR

    enum ggml_opt_build_type:
        GGML_OPT_BUILD_TYPE_FORWARD  # 10
        GGML_OPT_BUILD_TYPE_GRAD     # 20
        GGML_OPT_BUILD_TYPE_OPT      # 30

    enum ggml_opt_optimizer_type:
        GGML_OPT_OPTIMIZER_TYPE_ADAMW
        GGML_OPT_OPTIMIZER_TYPE_SGD
        GGML_OPT_OPTIMIZER_TYPE_COUNT

    # the two members of ggml_opt_optimizer_params are anonymous structs in C;
    # these Cython names refer to them through decltype (C++ only)
    ctypedef struct ggml_opt_adamw_params "decltype(ggml_opt_optimizer_params::adamw)":
        float alpha  # learning rate
        float beta1  # first AdamW momentum
        float beta2  # second AdamW momentum
        float eps    # epsilon for numerical stability
        float wd     # weight decay - 0.0f to disable

    ctypedef struct ggml_opt_sgd_params "decltype(ggml_opt_optimizer_params::sgd)":
        float alpha  # learning rate
        float wd     # weight decay

    # parameters that control which optimizer is used and how said optimizer tries to find the minimal loss
    struct ggml_opt_optimizer_params:
        ggml_opt_adamw_params adamw
        ggml_opt_sgd_params   sgd

    # callback to calculate optimizer parameters prior to a backward pass
    # userdata can be used to pass arbitrary data
    ctypedef ggml_opt_optimizer_params (*ggml_opt_get_optimizer_params)(void * userdata) noexcept

    # returns the default optimizer params (constant, hard-coded values)
    # userdata is not used
    ggml_opt_optimizer_params ggml_opt_get_default_optimizer_params(void * userdata)

    # casts userdata to ggml_opt_optimizer_params and returns it
    ggml_opt_optimizer_params ggml_opt_get_constant_optimizer_params(void * userdata)

    # signature for a callback while evaluating opt_ctx on dataset, called after an evaluation
    ctypedef void (*ggml_opt_epoch_callback)(
            cbool              train,       # true after training evaluation, false after validation evaluation
            ggml_opt_context_t opt_ctx,
            ggml_opt_dataset_t dataset,
            ggml_opt_result_t  result,      # result associated with the dataset subsection
            int64_t            ibatch,      # number of batches that have been evaluated so far
            int64_t            ibatch_max,  # total number of batches in this dataset subsection
            int64_t            t_start_us) noexcept  # time at which the evaluation on the dataset subsection was started

    # callback that prints a progress bar on stderr
    void ggml_opt_epoch_callback_progress_bar(
            bint               train,
            ggml_opt_context_t opt_ctx,
            ggml_opt_dataset_t dataset,
            ggml_opt_result_t  result,
            int64_t            ibatch,
            int64_t            ibatch_max,
            int64_t            t_start_us)
