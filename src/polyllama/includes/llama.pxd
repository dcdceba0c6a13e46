# Declarations from llama.h, one to one (pinned llama.cpp: thirdparty/llama.cpp/include/llama.h).
# Every enum (all members), every struct (all fields, in order) and every non-deprecated
# LLAMA_API function, in the header's order, with the header's names and argument types.
#
# Two C names are both an enum tag and a function; Cython has one namespace, so the function keeps
# the C name and the enum gets a Cython-only alias that still refers to the C type:
#   enum llama_vocab_type   -> llama_vocab_type_t   (function llama_vocab_type())
#   enum llama_pooling_type -> llama_pooling_type_t (function llama_pooling_type())
# The anonymous union of llama_model_kv_override is flattened: its members (val_i64, val_f64,
# val_bool, val_str) are declared as fields of the struct (C++ names them the same way).
#
# C `bool` is `bint`, except inside function-pointer types (callback typedefs, llama_sampler_i),
# where it is `cbool` (libcpp.bool): C++ will not convert `int (*)(...)` into `bool (*)(...)`,
# so a callback must be written as e.g.
#     cdef cbool on_progress(float progress, void * user_data) noexcept: ...
# not `cdef bint ...`. `cbool` comes with `from polyllama.includes.llama cimport *`.
#
# DEPRECATED functions are left out (the header marks them DEPRECATED(...)):
#   llama_load_model_from_file, llama_free_model, llama_new_context_with_model,
#   llama_n_ctx_train, llama_n_embd, llama_n_layer, llama_n_head, llama_n_vocab,
#   llama_get_state_size, llama_copy_state_data, llama_set_state_data,
#   llama_load_session_file, llama_save_session_file, llama_set_warmup,
#   llama_token_get_text, llama_token_get_score, llama_token_get_attr, llama_token_is_eog,
#   llama_token_is_control, llama_token_bos, llama_token_eos, llama_token_eot, llama_token_cls,
#   llama_token_sep, llama_token_nl, llama_token_pad, llama_add_bos_token, llama_add_eos_token,
#   llama_token_fim_pre, llama_token_fim_suf, llama_token_fim_mid, llama_token_fim_pad,
#   llama_token_fim_rep, llama_token_fim_sep, llama_vocab_cls, llama_sampler_init_grammar_lazy

from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdio cimport FILE
from libcpp cimport bool as cbool

# llama.h #includes ggml.h, ggml-cpu.h, ggml-backend.h, ggml-opt.h and gguf.h; likewise
# `from polyllama.includes.llama cimport *` brings in everything declared for those
# (ggml_type and its GGML_TYPE_* members, ggml_log_level, ggml_backend_dev_t, gguf_context, ...).
from polyllama.includes.ggml cimport *
from polyllama.includes.ggml_backend cimport *
from polyllama.includes.gguf cimport *


cdef extern from "llama.h" nogil:

    # constants (macros)
    const uint32_t LLAMA_DEFAULT_SEED     # 0xFFFFFFFF
    const int32_t  LLAMA_TOKEN_NULL       # -1

    const uint32_t LLAMA_FILE_MAGIC_GGLA  # 'ggla'
    const uint32_t LLAMA_FILE_MAGIC_GGSN  # 'ggsn'
    const uint32_t LLAMA_FILE_MAGIC_GGSQ  # 'ggsq'

    const uint32_t LLAMA_SESSION_MAGIC    # LLAMA_FILE_MAGIC_GGSN
    const int      LLAMA_SESSION_VERSION

    const uint32_t LLAMA_STATE_SEQ_MAGIC  # LLAMA_FILE_MAGIC_GGSQ
    const int      LLAMA_STATE_SEQ_VERSION

    #
    # C interface
    #

    cdef struct llama_vocab
    cdef struct llama_model
    cdef struct llama_context
    # struct llama_sampler: defined below (with llama_sampler_i)

    cdef struct llama_memory_i
    ctypedef llama_memory_i * llama_memory_t

    ctypedef int32_t llama_pos
    ctypedef int32_t llama_token
    ctypedef int32_t llama_seq_id

    # C name: enum llama_vocab_type (the name llama_vocab_type is the function below)
    enum llama_vocab_type_t "llama_vocab_type":
        LLAMA_VOCAB_TYPE_NONE    # 0, For models without vocab
        LLAMA_VOCAB_TYPE_SPM     # 1, LLaMA tokenizer based on byte-level BPE with byte fallback
        LLAMA_VOCAB_TYPE_BPE     # 2, GPT-2 tokenizer based on byte-level BPE
        LLAMA_VOCAB_TYPE_WPM     # 3, BERT tokenizer based on WordPiece
        LLAMA_VOCAB_TYPE_UGM     # 4, T5 tokenizer based on Unigram
        LLAMA_VOCAB_TYPE_RWKV    # 5, RWKV tokenizer based on greedy tokenization
        LLAMA_VOCAB_TYPE_PLAMO2  # 6, PLaMo-2 tokenizer based on Aho-Corasick with dynamic programming
        LLAMA_VOCAB_TYPE_TEST    # 7, Dummy tokenizer for testing

    enum llama_rope_type:
        LLAMA_ROPE_TYPE_NONE    # -1
        LLAMA_ROPE_TYPE_NORM    # 0
        LLAMA_ROPE_TYPE_NEOX    # GGML_ROPE_TYPE_NEOX
        LLAMA_ROPE_TYPE_MROPE   # GGML_ROPE_TYPE_MROPE
        LLAMA_ROPE_TYPE_IMROPE  # GGML_ROPE_TYPE_IMROPE
        LLAMA_ROPE_TYPE_VISION  # GGML_ROPE_TYPE_VISION

    enum llama_token_type:  # TODO: remove, required until per token attributes are available from GGUF file
        LLAMA_TOKEN_TYPE_UNDEFINED     # 0
        LLAMA_TOKEN_TYPE_NORMAL        # 1
        LLAMA_TOKEN_TYPE_UNKNOWN       # 2
        LLAMA_TOKEN_TYPE_CONTROL       # 3
        LLAMA_TOKEN_TYPE_USER_DEFINED  # 4
        LLAMA_TOKEN_TYPE_UNUSED        # 5
        LLAMA_TOKEN_TYPE_BYTE          # 6

    enum llama_token_attr:
        LLAMA_TOKEN_ATTR_UNDEFINED     # 0
        LLAMA_TOKEN_ATTR_UNKNOWN       # 1 << 0
        LLAMA_TOKEN_ATTR_UNUSED        # 1 << 1
        LLAMA_TOKEN_ATTR_NORMAL        # 1 << 2
        LLAMA_TOKEN_ATTR_CONTROL       # 1 << 3, SPECIAL?
        LLAMA_TOKEN_ATTR_USER_DEFINED  # 1 << 4
        LLAMA_TOKEN_ATTR_BYTE          # 1 << 5
        LLAMA_TOKEN_ATTR_NORMALIZED    # 1 << 6
        LLAMA_TOKEN_ATTR_LSTRIP        # 1 << 7
        LLAMA_TOKEN_ATTR_RSTRIP        # 1 << 8
        LLAMA_TOKEN_ATTR_SINGLE_WORD   # 1 << 9

    # model file types ("except 1d tensors" for all MOSTLY_* types)
    enum llama_ftype:
        LLAMA_FTYPE_ALL_F32           # 0
        LLAMA_FTYPE_MOSTLY_F16        # 1
        LLAMA_FTYPE_MOSTLY_Q4_0       # 2
        LLAMA_FTYPE_MOSTLY_Q4_1       # 3
        # 4 (Q4_1_SOME_F16), 5 (Q4_2), 6 (Q4_3): support has been removed
        LLAMA_FTYPE_MOSTLY_Q8_0       # 7
        LLAMA_FTYPE_MOSTLY_Q5_0       # 8
        LLAMA_FTYPE_MOSTLY_Q5_1       # 9
        LLAMA_FTYPE_MOSTLY_Q2_K       # 10
        LLAMA_FTYPE_MOSTLY_Q3_K_S     # 11
        LLAMA_FTYPE_MOSTLY_Q3_K_M     # 12
        LLAMA_FTYPE_MOSTLY_Q3_K_L     # 13
        LLAMA_FTYPE_MOSTLY_Q4_K_S     # 14
        LLAMA_FTYPE_MOSTLY_Q4_K_M     # 15
        LLAMA_FTYPE_MOSTLY_Q5_K_S     # 16
        LLAMA_FTYPE_MOSTLY_Q5_K_M     # 17
        LLAMA_FTYPE_MOSTLY_Q6_K       # 18
        LLAMA_FTYPE_MOSTLY_IQ2_XXS    # 19
        LLAMA_FTYPE_MOSTLY_IQ2_XS     # 20
        LLAMA_FTYPE_MOSTLY_Q2_K_S     # 21
        LLAMA_FTYPE_MOSTLY_IQ3_XS     # 22
        LLAMA_FTYPE_MOSTLY_IQ3_XXS    # 23
        LLAMA_FTYPE_MOSTLY_IQ1_S      # 24
        LLAMA_FTYPE_MOSTLY_IQ4_NL     # 25
        LLAMA_FTYPE_MOSTLY_IQ3_S      # 26
        LLAMA_FTYPE_MOSTLY_IQ3_M      # 27
        LLAMA_FTYPE_MOSTLY_IQ2_S      # 28
        LLAMA_FTYPE_MOSTLY_IQ2_M      # 29
        LLAMA_FTYPE_MOSTLY_IQ4_XS     # 30
        LLAMA_FTYPE_MOSTLY_IQ1_M      # 31
        LLAMA_FTYPE_MOSTLY_BF16       # 32
        # 33-35 (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8): removed from gguf files, use Q4_0 and runtime repack
        LLAMA_FTYPE_MOSTLY_TQ1_0      # 36
        LLAMA_FTYPE_MOSTLY_TQ2_0      # 37
        LLAMA_FTYPE_MOSTLY_MXFP4_MOE  # 38
        LLAMA_FTYPE_MOSTLY_NVFP4      # 39
        LLAMA_FTYPE_MOSTLY_Q1_0       # 40
        LLAMA_FTYPE_MOSTLY_Q2_0       # 41
        LLAMA_FTYPE_GUESSED           # 1024, not specified in the model file

    # Get the model file type (quantization) as a string, e.g. "Q8_0" or "Q4_K - Medium"
    const char * llama_ftype_name(llama_ftype ftype)

    enum llama_rope_scaling_type:
        LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED  # -1
        LLAMA_ROPE_SCALING_TYPE_NONE         # 0
        LLAMA_ROPE_SCALING_TYPE_LINEAR       # 1
        LLAMA_ROPE_SCALING_TYPE_YARN         # 2
        LLAMA_ROPE_SCALING_TYPE_LONGROPE     # 3
        LLAMA_ROPE_SCALING_TYPE_MAX_VALUE    # = LLAMA_ROPE_SCALING_TYPE_LONGROPE

    # C name: enum llama_pooling_type (the name llama_pooling_type is the function below)
    enum llama_pooling_type_t "llama_pooling_type":
        LLAMA_POOLING_TYPE_UNSPECIFIED  # -1
        LLAMA_POOLING_TYPE_NONE         # 0
        LLAMA_POOLING_TYPE_MEAN         # 1
        LLAMA_POOLING_TYPE_CLS          # 2
        LLAMA_POOLING_TYPE_LAST         # 3
        LLAMA_POOLING_TYPE_RANK         # 4, used by reranking models to attach the classification head to the graph

    enum llama_attention_type:
        LLAMA_ATTENTION_TYPE_UNSPECIFIED  # -1
        LLAMA_ATTENTION_TYPE_CAUSAL       # 0
        LLAMA_ATTENTION_TYPE_NON_CAUSAL   # 1

    enum llama_flash_attn_type:
        LLAMA_FLASH_ATTN_TYPE_AUTO      # -1
        LLAMA_FLASH_ATTN_TYPE_DISABLED  # 0
        LLAMA_FLASH_ATTN_TYPE_ENABLED   # 1

    const char * llama_flash_attn_type_name(llama_flash_attn_type flash_attn_type)

    enum llama_split_mode:
        LLAMA_SPLIT_MODE_NONE    # 0, single GPU
        LLAMA_SPLIT_MODE_LAYER   # 1, split layers and KV across GPUs
        LLAMA_SPLIT_MODE_ROW     # 2, split layers and KV across GPUs, use tensor parallelism if supported
        LLAMA_SPLIT_MODE_TENSOR  # 3

    enum llama_load_mode:
        LLAMA_LOAD_MODE_AUTO        # -1, auto-detect based on device capabilities
        LLAMA_LOAD_MODE_NONE        # 0, no special loading mode
        LLAMA_LOAD_MODE_MMAP        # 1, memory map the model
        LLAMA_LOAD_MODE_MLOCK       # 2, force system to keep model in RAM rather than swapping or compressing
        LLAMA_LOAD_MODE_MMAP_MLOCK  # 3, mmap + force system to keep model in RAM
        LLAMA_LOAD_MODE_DIRECT_IO   # 4, use direct I/O if available

    const char * llama_load_mode_name(llama_load_mode load_mode)
    llama_load_mode llama_load_mode_from_str(const char * str)

    enum llama_lazy_mode:
        LLAMA_LAZY_MODE_OFF   # 0, always read the whole tensor up front
        LLAMA_LAZY_MODE_AUTO  # 1, lazy only for marked tensors larger than 4 GiB (requires mmap)
        LLAMA_LAZY_MODE_ON    # 2, read the rows of tensors marked by the arch on demand (requires mmap)

    enum llama_context_type:
        LLAMA_CONTEXT_TYPE_DEFAULT  # 0
        LLAMA_CONTEXT_TYPE_MTP      # 1

    ctypedef struct llama_token_data:
        llama_token id  # token id
        float logit     # log-odds of the token
        float p         # probability of the token

    ctypedef struct llama_token_data_array:
        # NOTE: this pointer can be modified by the samplers
        llama_token_data * data
        size_t size
        int64_t selected  # this is the index in the data array (i.e. not the token id)
        bint sorted       # note: do not assume the data is sorted - always check this flag

    ctypedef cbool (*llama_progress_callback)(float progress, void * user_data) noexcept

    # Input data for llama_encode/llama_decode
    # A llama_batch object can contain input about one or many sequences
    # The provided arrays (i.e. token, embd, pos, etc.) must have size of n_tokens
    #
    # - token  : the token ids of the input (used when embd is NULL)
    # - embd   : token embeddings (i.e. float vector of size n_embd) (used when token is NULL)
    # - pos    : the positions of the respective token in the sequence
    #            (if set to NULL, the token position will be tracked automatically by llama_encode/llama_decode)
    # - seq_id : the sequence to which the respective token belongs
    #            (if set to NULL, the sequence ID will be assumed to be 0)
    # - logits : if zero, the logits (and/or the embeddings) for the respective token will not be output
    #            (if set to NULL: if embeddings, all tokens are output; if not, only the last token is output)
    ctypedef struct llama_batch:
        int32_t n_tokens

        llama_token  *  token
        float        *  embd
        llama_pos    *  pos
        int32_t      *  n_seq_id
        llama_seq_id ** seq_id
        int8_t       *  logits  # TODO: rename this to "output"

    enum llama_model_kv_override_type:
        LLAMA_KV_OVERRIDE_TYPE_INT
        LLAMA_KV_OVERRIDE_TYPE_FLOAT
        LLAMA_KV_OVERRIDE_TYPE_BOOL
        LLAMA_KV_OVERRIDE_TYPE_STR

    enum llama_model_meta_key:
        LLAMA_MODEL_META_KEY_SAMPLING_SEQUENCE
        LLAMA_MODEL_META_KEY_SAMPLING_TOP_K
        LLAMA_MODEL_META_KEY_SAMPLING_TOP_P
        LLAMA_MODEL_META_KEY_SAMPLING_MIN_P
        LLAMA_MODEL_META_KEY_SAMPLING_XTC_PROBABILITY
        LLAMA_MODEL_META_KEY_SAMPLING_XTC_THRESHOLD
        LLAMA_MODEL_META_KEY_SAMPLING_TEMP
        LLAMA_MODEL_META_KEY_SAMPLING_PENALTY_LAST_N
        LLAMA_MODEL_META_KEY_SAMPLING_PENALTY_REPEAT
        LLAMA_MODEL_META_KEY_SAMPLING_MIROSTAT
        LLAMA_MODEL_META_KEY_SAMPLING_MIROSTAT_TAU
        LLAMA_MODEL_META_KEY_SAMPLING_MIROSTAT_ETA

    enum llama_process_type:
        LLAMA_PROCESS_TYPE_ENCODE
        LLAMA_PROCESS_TYPE_DECODE

    struct llama_model_kv_override:
        llama_model_kv_override_type tag

        char key[128]

        # anonymous union in C (one of these, chosen by tag)
        int64_t val_i64
        double  val_f64
        bint    val_bool
        char    val_str[128]

    struct llama_model_tensor_buft_override:
        const char * pattern
        ggml_backend_buffer_type_t buft

    struct llama_model_params:
        # NULL-terminated list of devices to use for offloading (if NULL, all available devices are used)
        ggml_backend_dev_t * devices

        # NULL-terminated list of buffer types to use for tensors that match a pattern
        const llama_model_tensor_buft_override * tensor_buft_overrides

        int32_t n_gpu_layers         # number of layers to store in VRAM, a negative value means all layers
        llama_split_mode split_mode  # how to split the model across multiple GPUs
        llama_load_mode  load_mode   # how to load the model

        llama_lazy_mode lazy_mode    # on-demand reading of tensors marked by the arch

        # the GPU that is used for the entire model when split_mode is LLAMA_SPLIT_MODE_NONE
        int32_t main_gpu

        # proportion of the model (layers or rows) to offload to each GPU, size: llama_max_devices()
        const float * tensor_split

        # Called with a progress value between 0.0 and 1.0. Pass NULL to disable.
        # If the provided progress_callback returns true, model loading continues.
        # If it returns false, model loading is immediately aborted.
        llama_progress_callback progress_callback

        # context pointer passed to the progress callback
        void * progress_callback_user_data

        # override key-value pairs of the model meta data
        const llama_model_kv_override * kv_overrides

        # Keep the booleans together to avoid misalignment during copy-by-value.
        bint vocab_only       # only load the vocabulary, no weights
        bint check_tensors    # validate model tensor data
        bint use_extra_bufts  # use extra buffer types (used for weight repacking)
        bint no_host          # bypass host buffer allowing extra buffers to be used
        bint no_alloc         # only load metadata and simulate memory allocations
        bint load_mtp         # whether to load MTP layers

    struct llama_sampler_seq_config:
        llama_seq_id    seq_id
        llama_sampler * sampler

    # NOTE: changing the default values of parameters marked as [EXPERIMENTAL] may cause crashes or incorrect results in certain configurations
    #       https://github.com/ggml-org/llama.cpp/pull/7544
    struct llama_context_params:
        uint32_t n_ctx                  # text context, 0 = from model
        uint32_t n_batch                # logical maximum batch size that can be submitted to llama_decode
        uint32_t n_ubatch               # physical maximum batch size
        uint32_t n_seq_max              # max number of sequences (i.e. distinct states for recurrent models)
        uint32_t n_rs_seq               # number of recurrent-state snapshots per seq for rollback (0 = no rollback) [EXPERIMENTAL]
        uint32_t n_outputs_max          # max outputs in a ubatch (0 = n_batch)
        uint32_t n_outputs_max_per_seq  # max outputs per sequence (0 = n_outputs_max)
        int32_t  n_threads              # number of threads to use for generation
        int32_t  n_threads_batch        # number of threads to use for batch processing

        llama_context_type      ctx_type           # set the context type (e.g. MTP)
        llama_rope_scaling_type rope_scaling_type  # RoPE scaling type, from `enum llama_rope_scaling_type`
        llama_pooling_type_t    pooling_type       # whether to pool (sum) embedding results by sequence id
        llama_attention_type    attention_type     # attention type to use for embeddings
        llama_flash_attn_type   flash_attn_type    # when to enable Flash Attention

        # ref: https://github.com/ggml-org/llama.cpp/pull/2054
        float    rope_freq_base    # RoPE base frequency, 0 = from model
        float    rope_freq_scale   # RoPE frequency scaling factor, 0 = from model
        float    yarn_ext_factor   # YaRN extrapolation mix factor, negative = from model
        float    yarn_attn_factor  # YaRN magnitude scaling factor
        float    yarn_beta_fast    # YaRN low correction dim
        float    yarn_beta_slow    # YaRN high correction dim
        uint32_t yarn_orig_ctx     # YaRN original context size
        float    defrag_thold      # [DEPRECATED] defragment the KV cache if holes/size > thold, <= 0 disabled (default)

        ggml_backend_sched_eval_callback cb_eval
        void * cb_eval_user_data

        ggml_type type_k  # data type for K cache [EXPERIMENTAL]
        ggml_type type_v  # data type for V cache [EXPERIMENTAL]

        # Abort callback
        # if it returns true, execution of llama_decode() will be aborted
        # currently works only with CPU execution
        ggml_abort_callback abort_callback
        void *              abort_callback_data

        # Keep the booleans together and at the end of the struct to avoid misalignment during copy-by-value.
        bint embeddings   # if true, extract embeddings (together with logits)
        bint offload_kqv  # offload the KQV ops (including the KV cache) to GPU
        bint no_perf      # measure performance timings
        bint op_offload   # offload host tensor operations to device
        bint swa_full     # use full-size SWA cache (https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)
                          # NOTE: setting to false when n_seq_max > 1 can cause bad performance in some cases
        bint kv_unified   # use a unified buffer across the input sequences when computing the attention
                          # try to disable when n_seq_max > 1 for improved performance when the sequences do not share a large prefix

        # [EXPERIMENTAL]
        # backend sampler chain configuration (make sure the caller keeps the sampler chains alive)
        # note: the samplers must be sampler chains (i.e. use llama_sampler_chain_init)
        llama_sampler_seq_config * samplers
        size_t                     n_samplers

        # a source/target/parent context
        # can be utilized in various ways, for example by sharing results or llama_memory between 2 contexts
        llama_context * ctx_other

    struct llama_model_tensor_override:
        const char * pattern
        ggml_type type

    struct llama_model_imatrix_data:
        const char * name
        const float * data
        size_t size

    # model quantization parameters
    ctypedef struct llama_model_quantize_params:
        int32_t nthread                                   # number of threads to use for quantizing, if <=0 will use std::thread::hardware_concurrency()
        llama_ftype ftype                                 # quantize to this llama_ftype
        ggml_type output_tensor_type                      # output tensor type
        ggml_type token_embedding_type                    # token embeddings tensor type
        bint allow_requantize                             # allow quantizing non-f32/f16 tensors
        bint quantize_output_tensor                       # quantize output.weight
        bint only_copy                                    # only copy tensors - ftype, allow_requantize and quantize_output_tensor are ignored
        bint pure                                         # quantize all tensors to the default type
        bint keep_split                                   # quantize to the same number of shards
        bint dry_run                                      # calculate and show the final quantization size without performing quantization
        const llama_model_imatrix_data * imatrix          # pointer to importance matrix data
        const llama_model_kv_override * kv_overrides      # pointer to kv overrides
        const llama_model_tensor_override * tt_overrides  # pointer to tensor overrides
        const int32_t * prune_layers                      # pointer to layer indices to prune
        size_t max_buf_size                               # max bytes of tensor rows kept in memory at once, 0 = default (8 GiB)

    ctypedef struct llama_logit_bias:
        llama_token token
        float bias

    ctypedef struct llama_sampler_chain_params:
        bint no_perf  # whether to measure performance timings

    # used in chat template
    ctypedef struct llama_chat_message:
        const char * role
        const char * content

    # lora adapter
    cdef struct llama_adapter_lora

    const char * llama_version()

    # Helpers for getting default parameters
    llama_model_params          llama_model_default_params()
    llama_context_params        llama_context_default_params()
    llama_sampler_chain_params  llama_sampler_chain_default_params()
    llama_model_quantize_params llama_model_quantize_default_params()

    # Initialize the llama + ggml backend
    # Call once at the start of the program
    void llama_backend_init()

    # Call once at the end of the program - currently only used for MPI
    void llama_backend_free()

    # Optional: enable numa optimizations
    void llama_numa_init(ggml_numa_strategy numa)

    # Optional: an auto threadpool gets created in ggml if not passed explicitly
    void llama_attach_threadpool(
            llama_context * ctx,
            ggml_threadpool_t threadpool,
            ggml_threadpool_t threadpool_batch)

    void llama_detach_threadpool(llama_context * ctx)

    ctypedef void (*llama_model_set_tensor_data_t)(ggml_tensor * tensor, void * userdata) noexcept

    # Create a new model from GGUF metadata as well as a function to set the tensor data
    #   - tensors are created as GGML_TYPE_F32 by default,
    #     override by adding a tensor with the same name but a different name to the context
    llama_model * llama_model_init_from_user(
            gguf_context * metadata,
            llama_model_set_tensor_data_t set_tensor_data,  # function to initialize tensor data with
            void * set_tensor_data_ud,                      # userdata for function
            llama_model_params params)

    # Load a model from a file
    # If the file is split into multiple parts, the file name must follow this pattern: <name>-%05d-of-%05d.gguf
    # If the split file name does not follow this pattern, use llama_model_load_from_splits
    llama_model * llama_model_load_from_file(
            const char * path_model,
            llama_model_params params)

    # Load a model from an open FILE pointer
    # The GGUF is read from the current position, so it can be embedded in a larger file
    # mmap needs the GGUF data section at a file offset to be aligned to the CPU tensor alignment (32 bytes)
    llama_model * llama_model_load_from_file_ptr(
            FILE * file,
            llama_model_params params)

    # Load a model from multiple splits (support custom naming scheme)
    # The paths must be in the correct order
    llama_model * llama_model_load_from_splits(
            const char ** paths,
            size_t n_paths,
            llama_model_params params)

    void llama_model_save_to_file(
            const llama_model * model,
            const char * path_model)

    void llama_model_free(llama_model * model)

    llama_context * llama_init_from_model(
            llama_model * model,
            llama_context_params params)

    # Frees all allocated memory
    void llama_free(llama_context * ctx)

    int64_t llama_time_us()

    size_t llama_max_devices()
    size_t llama_max_parallel_sequences()
    size_t llama_max_tensor_buft_overrides()

    bint llama_supports_mmap       ()
    bint llama_supports_mlock      ()
    bint llama_supports_gpu_offload()
    bint llama_supports_rpc        ()

    # NOTE: After creating a llama_context, it is recommended to query the actual values using these functions
    #       In some cases the requested values via llama_context_params may differ from the actual values used by the context
    uint32_t llama_n_ctx      (const llama_context * ctx)
    uint32_t llama_n_ctx_seq  (const llama_context * ctx)
    uint32_t llama_n_batch    (const llama_context * ctx)
    uint32_t llama_n_ubatch   (const llama_context * ctx)
    uint32_t llama_n_seq_max  (const llama_context * ctx)
    uint32_t llama_n_rs_seq   (const llama_context * ctx)

    const llama_model *  llama_get_model   (const llama_context * ctx)
    llama_memory_t       llama_get_memory  (const llama_context * ctx)
    llama_pooling_type_t llama_pooling_type(const llama_context * ctx)  # TODO: rename to llama_get_pooling_type

    const llama_vocab * llama_model_get_vocab(const llama_model * model)
    llama_rope_type     llama_model_rope_type(const llama_model * model)

    int32_t llama_model_n_ctx_train  (const llama_model * model)
    int32_t llama_model_n_embd       (const llama_model * model)
    int32_t llama_model_n_embd_inp   (const llama_model * model)
    int32_t llama_model_n_embd_out   (const llama_model * model)
    int32_t llama_model_n_layer      (const llama_model * model)
    int32_t llama_model_n_layer_nextn(const llama_model * model)
    int32_t llama_model_n_head       (const llama_model * model)
    int32_t llama_model_n_head_kv    (const llama_model * model)
    int32_t llama_model_n_swa        (const llama_model * model)

    # Get the model's RoPE frequency scaling factor
    float llama_model_rope_freq_scale_train(const llama_model * model)

    # Returns the number of classifier outputs (only valid for classifier models)
    # Undefined behavior for non-classifier models
    uint32_t llama_model_n_cls_out(const llama_model * model)

    # Returns label of classifier output by index (<n_cls_out). Returns nullptr if no label provided
    const char * llama_model_cls_label(const llama_model * model, uint32_t i)

    llama_vocab_type_t llama_vocab_type(const llama_vocab * vocab)

    int32_t llama_vocab_n_tokens(const llama_vocab * vocab)

    # Functions to access the model's GGUF metadata scalar values
    # - The functions return the length of the string on success, or -1 on failure
    # - The output string is always null-terminated and cleared on failure
    # - When retrieving a string, an extra byte must be allocated to account for the null terminator
    # - GGUF array values are not supported by these functions

    # Get metadata value as a string by key name
    int32_t llama_model_meta_val_str(const llama_model * model, const char * key, char * buf, size_t buf_size)

    # Get the number of metadata key/value pairs
    int32_t llama_model_meta_count(const llama_model * model)

    # Get sampling metadata key name. Returns nullptr if the key is invalid
    const char * llama_model_meta_key_str(llama_model_meta_key key)

    # Get metadata key name by index
    int32_t llama_model_meta_key_by_index(const llama_model * model, int32_t i, char * buf, size_t buf_size)

    # Get metadata value as a string by index
    int32_t llama_model_meta_val_str_by_index(const llama_model * model, int32_t i, char * buf, size_t buf_size)

    # Get a string describing the model type
    int32_t llama_model_desc(const llama_model * model, char * buf, size_t buf_size)

    # Get the model file type (quantization), e.g. LLAMA_FTYPE_MOSTLY_Q8_0
    llama_ftype llama_model_ftype(const llama_model * model)

    # Returns the total size of all the tensors in the model in bytes
    uint64_t llama_model_size(const llama_model * model)

    # Get the default chat template. Returns nullptr if not available
    # If name is NULL, returns the default chat template
    const char * llama_model_chat_template(const llama_model * model, const char * name)

    # Returns the total number of parameters in the model
    uint64_t llama_model_n_params(const llama_model * model)

    # Returns true if the model contains an encoder that requires llama_encode() call
    bint llama_model_has_encoder(const llama_model * model)

    # Returns true if the model contains a decoder that requires llama_decode() call
    bint llama_model_has_decoder(const llama_model * model)

    # For encoder-decoder models, this function returns id of the token that must be provided
    # to the decoder to start generating output sequence. For other models, it returns -1.
    llama_token llama_model_decoder_start_token(const llama_model * model)

    # Returns true if the model is recurrent (like Mamba, RWKV, etc.)
    bint llama_model_is_recurrent(const llama_model * model)

    # Returns true if the model is hybrid (like Jamba, Granite, etc.)
    bint llama_model_is_hybrid(const llama_model * model)

    # Returns true if the model is diffusion-based (like LLaDA, Dream, etc.)
    bint llama_model_is_diffusion(const llama_model * model)

    # Returns 0 on success
    uint32_t llama_model_quantize(
            const char * fname_inp,
            const char * fname_out,
            const llama_model_quantize_params * params)

    #
    # Adapters
    #

    # Load a LoRA adapter from file
    # The adapter is valid as long as the associated model is not freed
    llama_adapter_lora * llama_adapter_lora_init(
            llama_model * model,
            const char * path_lora)

    # Load a LoRA adapter from an open FILE pointer, reading from its current position
    llama_adapter_lora * llama_adapter_lora_init_from_file_ptr(
            llama_model * model,
            FILE * file)

    # Functions to access the adapter's GGUF metadata scalar values (same conventions as llama_model_meta_*)

    # Get metadata value as a string by key name
    int32_t llama_adapter_meta_val_str(const llama_adapter_lora * adapter, const char * key, char * buf, size_t buf_size)

    # Get the number of metadata key/value pairs
    int32_t llama_adapter_meta_count(const llama_adapter_lora * adapter)

    # Get metadata key name by index
    int32_t llama_adapter_meta_key_by_index(const llama_adapter_lora * adapter, int32_t i, char * buf, size_t buf_size)

    # Get metadata value as a string by index
    int32_t llama_adapter_meta_val_str_by_index(const llama_adapter_lora * adapter, int32_t i, char * buf, size_t buf_size)

    # Manually free a LoRA adapter
    # NOTE: loaded adapters that are not manually freed will be freed when the associated model is deleted
    void llama_adapter_lora_free(llama_adapter_lora * adapter)

    # Get the invocation tokens if the current lora is an alora
    uint64_t            llama_adapter_get_alora_n_invocation_tokens(const llama_adapter_lora * adapter)
    const llama_token * llama_adapter_get_alora_invocation_tokens  (const llama_adapter_lora * adapter)

    # The following functions operate on a llama_context, hence the naming: llama_verb_...

    # Set LoRa adapters on the context. Will only modify if the adapters currently in context are different.
    int32_t llama_set_adapters_lora(
            llama_context * ctx,
            llama_adapter_lora ** adapters,
            size_t n_adapters,
            float * scales)

    # Apply a loaded control vector to a llama_context, or if data is NULL, clear
    # the currently loaded vector.
    # n_embd should be the size of a single layer's control, and data should point
    # to an n_embd x n_layers buffer starting from layer 1.
    # il_start and il_end are the layer range the vector should apply to (both inclusive)
    # See llama_control_vector_load in common to load a control vector.
    int32_t llama_set_adapter_cvec(
            llama_context * ctx,
            const float * data,
            size_t len,
            int32_t n_embd,
            int32_t il_start,
            int32_t il_end)

    #
    # Memory
    #

    # Clear the memory contents
    # If data == true, the data buffers will also be cleared together with the metadata
    void llama_memory_clear(
            llama_memory_t mem,
            bint data)

    # Removes all tokens that belong to the specified sequence and have positions in [p0, p1)
    # Returns false if a partial sequence cannot be removed. Removing a whole sequence never fails
    # seq_id < 0 : match any sequence
    # p0 < 0     : [0,  p1]
    # p1 < 0     : [p0, inf)
    bint llama_memory_seq_rm(
            llama_memory_t mem,
            llama_seq_id seq_id,
            llama_pos p0,
            llama_pos p1)

    # Copy all tokens that belong to the specified sequence to another sequence
    # p0 < 0 : [0,  p1]
    # p1 < 0 : [p0, inf)
    void llama_memory_seq_cp(
            llama_memory_t mem,
            llama_seq_id seq_id_src,
            llama_seq_id seq_id_dst,
            llama_pos p0,
            llama_pos p1)

    # Removes all tokens that do not belong to the specified sequence
    void llama_memory_seq_keep(
            llama_memory_t mem,
            llama_seq_id seq_id)

    # Adds relative position "delta" to all tokens that belong to the specified sequence and have positions in [p0, p1)
    # p0 < 0 : [0,  p1]
    # p1 < 0 : [p0, inf)
    void llama_memory_seq_add(
            llama_memory_t mem,
            llama_seq_id seq_id,
            llama_pos p0,
            llama_pos p1,
            llama_pos delta)

    # Integer division of the positions by factor of `d > 1`
    # p0 < 0 : [0,  p1]
    # p1 < 0 : [p0, inf)
    void llama_memory_seq_div(
            llama_memory_t mem,
            llama_seq_id seq_id,
            llama_pos p0,
            llama_pos p1,
            int d)

    # Returns the smallest position present in the memory for the specified sequence
    # This is typically non-zero only for SWA caches
    # Note that all positions in the range [pos_min, pos_max] are guaranteed to be present in the memory
    # Return -1 if the sequence is empty
    llama_pos llama_memory_seq_pos_min(
            llama_memory_t mem,
            llama_seq_id seq_id)

    # Returns the largest position present in the memory for the specified sequence
    # Note that all positions in the range [pos_min, pos_max] are guaranteed to be present in the memory
    # Return -1 if the sequence is empty
    llama_pos llama_memory_seq_pos_max(
            llama_memory_t mem,
            llama_seq_id seq_id)

    # Check if the memory supports shifting
    bint llama_memory_can_shift(llama_memory_t mem)

    #
    # State / sessions
    #

    # Returns the *actual* size in bytes of the state
    # (logits, embedding and memory)
    # Only use when saving the state, not when restoring it, otherwise the size may be too small.
    size_t llama_state_get_size(llama_context * ctx)

    # Copies the state to the specified destination address.
    # Destination needs to have allocated enough memory.
    # Returns the number of bytes copied
    size_t llama_state_get_data(
            llama_context * ctx,
            uint8_t * dst,
            size_t size)

    # Set the state reading from the specified address
    # Returns the number of bytes read
    size_t llama_state_set_data(
            llama_context * ctx,
            const uint8_t * src,
            size_t size)

    # Save/load session file
    bint llama_state_load_file(
            llama_context * ctx,
            const char * path_session,
            llama_token * tokens_out,
            size_t n_token_capacity,
            size_t * n_token_count_out)

    bint llama_state_save_file(
            llama_context * ctx,
            const char * path_session,
            const llama_token * tokens,
            size_t n_token_count)

    # Get the exact size needed to copy the state of a single sequence
    size_t llama_state_seq_get_size(
            llama_context * ctx,
            llama_seq_id seq_id)

    # Copy the state of a single sequence into the specified buffer
    size_t llama_state_seq_get_data(
            llama_context * ctx,
            uint8_t * dst,
            size_t size,
            llama_seq_id seq_id)

    # Copy the sequence data (originally copied with `llama_state_seq_get_data`) into the specified sequence
    # Returns:
    #  - Positive: Ok
    #  - Zero: Failed to load
    size_t llama_state_seq_set_data(
            llama_context * ctx,
            const uint8_t * src,
            size_t size,
            llama_seq_id dest_seq_id)

    size_t llama_state_seq_save_file(
            llama_context * ctx,
            const char * filepath,
            llama_seq_id seq_id,
            const llama_token * tokens,
            size_t n_token_count)

    # If tokens_out is NULL, only the token count is reported through n_token_count_out and no state is loaded
    size_t llama_state_seq_load_file(
            llama_context * ctx,
            const char * filepath,
            llama_seq_id dest_seq_id,
            llama_token * tokens_out,
            size_t n_token_capacity,
            size_t * n_token_count_out)

    const uint32_t LLAMA_STATE_SEQ_FLAGS_NONE          # 0
    const uint32_t LLAMA_STATE_SEQ_FLAGS_SWA_ONLY      # 1, for backwards-compat
    # work only with partial states, such as SWA KV cache or recurrent cache (e.g. Mamba)
    const uint32_t LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # 1
    # Keeps the tensor data on device buffers (i.e. not accessible in host memory, but faster save/load).
    # Getting the state for a seq_id with this flag invalidates all prior states gotten for that seq_id with this flag.
    const uint32_t LLAMA_STATE_SEQ_FLAGS_ON_DEVICE     # 2

    ctypedef uint32_t llama_state_seq_flags

    size_t llama_state_seq_get_size_ext(
            llama_context * ctx,
            llama_seq_id seq_id,
            llama_state_seq_flags flags)

    size_t llama_state_seq_get_data_ext(
            llama_context * ctx,
            uint8_t * dst,
            size_t size,
            llama_seq_id seq_id,
            llama_state_seq_flags flags)

    size_t llama_state_seq_set_data_ext(
            llama_context * ctx,
            const uint8_t * src,
            size_t size,
            llama_seq_id dest_seq_id,
            llama_state_seq_flags flags)

    #
    # Decoding
    #

    # Return batch for single sequence of tokens
    # The sequence ID will be fixed to 0
    # The position of the tokens will be tracked automatically by llama_decode
    #
    # NOTE: this is a helper function to facilitate transition to the new batch API - avoid using it
    llama_batch llama_batch_get_one(
            llama_token * tokens,
            int32_t n_tokens)

    # Allocates a batch of tokens on the heap that can hold a maximum of n_tokens
    # Each token can be assigned up to n_seq_max sequence ids
    # The batch has to be freed with llama_batch_free()
    # If embd != 0, llama_batch.embd will be allocated with size of n_tokens * embd * sizeof(float)
    # Otherwise, llama_batch.token will be allocated to store n_tokens llama_token
    # The rest of the llama_batch members are allocated with size n_tokens
    # All members are left uninitialized
    llama_batch llama_batch_init(
            int32_t n_tokens,
            int32_t embd,
            int32_t n_seq_max)

    # Frees a batch of tokens allocated with llama_batch_init()
    void llama_batch_free(llama_batch batch)

    # Process a batch of tokens.
    # In contrast to llama_decode() - this call does not use KV cache.
    # For encode-decoder contexts, processes the batch using the encoder.
    # Can store the encoder output internally for later use by the decoder's cross-attention layers.
    #   0 - success
    # < 0 - error. the memory state is restored to the state before this call
    int32_t llama_encode(
            llama_context * ctx,
            llama_batch batch)

    # Process a batch of tokens.
    # Requires the context to have a memory.
    # For encode-decoder contexts, processes the batch using the decoder.
    # Positive return values does not mean a fatal error, but rather a warning.
    # Upon fatal-error or abort, the ubatches that managed to be been processed will remain in the memory state of the context
    #   To handle this correctly, query the memory state using llama_memory_seq_pos_min() and llama_memory_seq_pos_max()
    # Upon other return values, the memory state is restored to the state before this call
    #    0 - success
    #    1 - could not find a KV slot for the batch (try reducing the size of the batch or increase the context)
    #    2 - aborted     (processed ubatches will remain in the context's memory)
    #   -1 - invalid input batch
    # < -1 - fatal error (processed ubatches will remain in the context's memory)
    int32_t llama_decode(
            llama_context * ctx,
            llama_batch batch)

    #
    # Extended batch API
    #

    cdef struct llama_batch_ext

    struct llama_embd:
        const float * data
        size_t n_rows  # number of embedding rows in data
        size_t n_embd  # size of one row

    llama_batch_ext * llama_batch_ext_init (llama_context * ctx)
    void              llama_batch_ext_free (llama_batch_ext * batch)
    void              llama_batch_ext_clear(llama_batch_ext * batch)

    # Add an input token to the batch, with default values:
    #     id = LLAMA_TOKEN_NULL
    #     embd = nullptr
    #     pos = not set, the caller must set it with llama_batch_ext_set_pos()
    # Returns the batch index (>= 0)
    # On error:
    #     -1: batch is full
    #     -2: token is invalid (id == LLAMA_TOKEN_NULL or invalid embd)
    #     -3: invalid sequence id
    int32_t llama_batch_ext_add      (llama_batch_ext * batch, llama_seq_id seq_id)

    # Add an input token to the batch, with a specified token ID or token embedding
    int32_t llama_batch_ext_add_token(llama_batch_ext * batch, llama_seq_id seq_id, llama_token id)
    int32_t llama_batch_ext_add_embd (llama_batch_ext * batch, llama_seq_id seq_id, llama_embd embd)

    # Add the token at index idx in the batch to another sequence id. The position will stays the same.
    # Note: this should be called before other _set() functions
    bint llama_batch_ext_add_seq(
            llama_batch_ext * batch,
            int32_t idx,
            llama_seq_id seq_id)

    # Set the token embedding for the token at index idx in the batch
    # use it after llama_batch_ext_add_token() to have an entry with both a token id and an embedding
    bint llama_batch_ext_set_embd_token(
            llama_batch_ext * batch,
            int32_t idx,
            llama_embd embd)

    # Set the "state" embedding for the token at index idx in the batch
    # "state" here means extra hidden state carried over from a previous stage, e.g.:
    #   - MTP: state from N layers of the target model
    #   - Qwen3 VL (deepstack): state from N layers of the vision encoder
    bint llama_batch_ext_set_embd_state(
            llama_batch_ext * batch,
            int32_t idx,
            llama_embd embd)

    # Set if output embeddings should be available for the token at index idx in the batch
    # Note: for now, this is equivalent to setting the output logits
    bint llama_batch_ext_set_output_embd(
            llama_batch_ext * batch,
            int32_t idx,
            bint value)

    # Set output logits for the token at index idx in the batch
    # Note: for now, this is equivalent to setting the output embd
    bint llama_batch_ext_set_output_logits(
            llama_batch_ext * batch,
            int32_t idx,
            bint value)

    # Set custom position for the token at index idx in the batch
    # For M-RoPE models:
    #     - Embedding tokens must have multiple positions per token
    #     - Text token only requires one single position per token
    bint llama_batch_ext_set_pos(
            llama_batch_ext * batch,
            int32_t idx,
            const llama_pos * pos)

    # Return values are the same as llama_decode()
    int32_t llama_process(
            llama_context * ctx,
            llama_process_type type,
            llama_batch_ext * batch)

    # Set the number of threads used for decoding
    # n_threads is the number of threads used for generation (single token)
    # n_threads_batch is the number of threads used for prompt and batch processing (multiple tokens)
    void llama_set_n_threads(llama_context * ctx, int32_t n_threads, int32_t n_threads_batch)

    # Get the number of threads used for generation of a single token.
    int32_t llama_n_threads(llama_context * ctx)

    # Get the number of threads used for prompt and batch processing (multiple token).
    int32_t llama_n_threads_batch(llama_context * ctx)

    # Set whether the context outputs embeddings or not
    void llama_set_embeddings(llama_context * ctx, bint embeddings)

    # Set whether to use causal attention or not
    # If set to true, the model will only attend to the past tokens
    void llama_set_causal_attn(llama_context * ctx, bint causal_attn)

    # Returns whether the context is currently using causal attention
    bint llama_get_causal_attn(const llama_context * ctx)

    # Set abort callback
    void llama_set_abort_callback(llama_context * ctx, ggml_abort_callback abort_callback, void * abort_callback_data)

    # Wait until all computations are finished
    # This is automatically done when using one of the functions below to obtain the computation results
    # and is not necessary to call it explicitly in most cases
    void llama_synchronize(llama_context * ctx)

    # Token logits obtained from the last call to llama_decode()
    # The logits for which llama_batch.logits[i] != 0 are stored contiguously
    # in the order they have appeared in the batch.
    # Rows: number of tokens for which llama_batch.logits[i] != 0
    # Cols: n_vocab
    float * llama_get_logits(llama_context * ctx)

    # Logits for the ith token. For positive indices, Equivalent to:
    # llama_get_logits(ctx) + ctx->output_ids[i]*n_vocab
    # Negative indices can be used to access logits in reverse order, -1 is the last logit.
    # returns NULL for invalid ids.
    float * llama_get_logits_ith(llama_context * ctx, int32_t i)

    # Get all output token embeddings.
    # when pooling_type == LLAMA_POOLING_TYPE_NONE or when using a generative model,
    # the embeddings for which llama_batch.logits[i] != 0 are stored contiguously
    # in the order they have appeared in the batch.
    # shape: [n_outputs*n_embd]
    # Otherwise, returns NULL.
    float * llama_get_embeddings(llama_context * ctx)

    # Get the embeddings for the ith token. For positive indices, Equivalent to:
    # llama_get_embeddings(ctx) + ctx->output_ids[i]*n_embd
    # Negative indices can be used to access embeddings in reverse order, -1 is the last embedding.
    # shape: [n_embd] (1-dimensional)
    # returns NULL for invalid ids.
    float * llama_get_embeddings_ith(llama_context * ctx, int32_t i)

    # Get the embeddings for a sequence id
    # Returns NULL if pooling_type is LLAMA_POOLING_TYPE_NONE
    # when pooling_type == LLAMA_POOLING_TYPE_RANK, returns float[n_cls_out] with the rank(s) of the sequence
    # otherwise: float[n_embd] (1-dimensional)
    float * llama_get_embeddings_seq(llama_context * ctx, llama_seq_id seq_id)

    #
    # backend sampling API [EXPERIMENTAL]
    # note: use only if the llama_context was created with at least one llama_sampler_seq_config
    #

    # Get the backend sampled token for the ith token.
    # With multiple outputs, sampler state advances when the token is accepted,
    # not when it is read through this function.
    # When accepting multiple outputs, accept a contiguous prefix in output order.
    # Returns LLAMA_TOKEN_NULL if no token was sampled.
    llama_token llama_get_sampled_token_ith(llama_context * ctx, int32_t i)

    # Get the backend sampled probabilities for the ith token
    # The index matches llama_get_sampled_token_ith().
    # Returns NULL if no probabilities were generated.
    float *  llama_get_sampled_probs_ith      (llama_context * ctx, int32_t i)
    uint32_t llama_get_sampled_probs_count_ith(llama_context * ctx, int32_t i)

    # Get the backend sampled logits for the ith token
    # Returns NULL if no logits were sampled.
    float *  llama_get_sampled_logits_ith      (llama_context * ctx, int32_t i)
    uint32_t llama_get_sampled_logits_count_ith(llama_context * ctx, int32_t i)

    # Get the backend sampled candidates (token ids) for the ith token
    # These are needed to map probability/logit indices to vocab token ids.
    # Returns NULL if no candidates were sampled.
    llama_token * llama_get_sampled_candidates_ith      (llama_context * ctx, int32_t i)
    uint32_t      llama_get_sampled_candidates_count_ith(llama_context * ctx, int32_t i)

    #
    # Vocab
    #

    const char * llama_vocab_get_text(const llama_vocab * vocab, llama_token token)

    float llama_vocab_get_score(const llama_vocab * vocab, llama_token token)

    llama_token_attr llama_vocab_get_attr(const llama_vocab * vocab, llama_token token)

    # Check if the token is supposed to end generation (end-of-generation, eg. EOS, EOT, etc.)
    bint llama_vocab_is_eog(const llama_vocab * vocab, llama_token token)

    # Identify if Token Id is a control token or a render-able token
    bint llama_vocab_is_control(const llama_vocab * vocab, llama_token token)

    # Special tokens
    llama_token llama_vocab_bos(const llama_vocab * vocab)   # beginning-of-sentence
    llama_token llama_vocab_eos(const llama_vocab * vocab)   # end-of-sentence
    llama_token llama_vocab_eot(const llama_vocab * vocab)   # end-of-turn
    llama_token llama_vocab_sep(const llama_vocab * vocab)   # sentence separator
    llama_token llama_vocab_nl (const llama_vocab * vocab)   # next-line
    llama_token llama_vocab_pad(const llama_vocab * vocab)   # padding
    llama_token llama_vocab_mask(const llama_vocab * vocab)  # mask

    bint llama_vocab_get_add_bos(const llama_vocab * vocab)
    bint llama_vocab_get_add_eos(const llama_vocab * vocab)
    bint llama_vocab_get_add_sep(const llama_vocab * vocab)

    # model-specific suppress tokens (gguf key: tokenizer.ggml.suppress_tokens)
    const llama_token * llama_vocab_get_suppress_tokens(const llama_vocab * vocab, int32_t * n_suppress_tokens)

    llama_token llama_vocab_fim_pre(const llama_vocab * vocab)
    llama_token llama_vocab_fim_suf(const llama_vocab * vocab)
    llama_token llama_vocab_fim_mid(const llama_vocab * vocab)
    llama_token llama_vocab_fim_pad(const llama_vocab * vocab)
    llama_token llama_vocab_fim_rep(const llama_vocab * vocab)
    llama_token llama_vocab_fim_sep(const llama_vocab * vocab)

    #
    # Tokenization
    #
    # The API is thread-safe.
    #

    # Convert the provided text into tokens.
    # tokens: must be large enough to hold the resulting tokens.
    # Returns the number of tokens on success, no more than n_tokens_max
    # Returns a negative number on failure - the number of tokens that would have been returned
    # Returns INT32_MIN on overflow (e.g., tokenization result size exceeds int32_t limit)
    # add_special: Allow to add BOS and EOS tokens if model is configured to do so.
    # parse_special: Allow tokenizing special and/or control tokens which otherwise are not exposed and treated
    #                as plaintext. Does not insert a leading space.
    int32_t llama_tokenize(
            const llama_vocab * vocab,
            const char * text,
            int32_t text_len,
            llama_token * tokens,
            int32_t n_tokens_max,
            bint add_special,
            bint parse_special)

    # Token Id -> Piece.
    # Uses the vocabulary in the provided context.
    # Does not write null terminator to the buffer.
    # User can skip up to 'lstrip' leading spaces before copying (useful when encoding/decoding multiple tokens with 'add_space_prefix')
    # special: If true, special tokens are rendered in the output.
    int32_t llama_token_to_piece(
            const llama_vocab * vocab,
            llama_token token,
            char * buf,
            int32_t length,
            int32_t lstrip,
            bint special)

    # Convert the provided tokens into text (inverse of llama_tokenize()).
    # text: must be large enough to hold the resulting text.
    # Returns the number of chars/bytes on success, no more than text_len_max.
    # Returns a negative number on failure - the number of chars/bytes that would have been returned.
    # remove_special: Allow to remove BOS and EOS tokens if model is configured to do so.
    # unparse_special: If true, special tokens are rendered in the output.
    int32_t llama_detokenize(
            const llama_vocab * vocab,
            const llama_token * tokens,
            int32_t n_tokens,
            char * text,
            int32_t text_len_max,
            bint remove_special,
            bint unparse_special)

    #
    # Chat templates
    #

    # Apply chat template. Inspired by hf apply_chat_template() on python.
    #
    # NOTE: This function does not use a jinja parser. It only support a pre-defined list of template.
    # tmpl: A Jinja template to use for this chat.
    # chat: Pointer to a list of multiple llama_chat_message
    # n_msg: Number of llama_chat_message in this chat
    # add_ass: Whether to end the prompt with the token(s) that indicate the start of an assistant message.
    # buf: A buffer to hold the output formatted prompt. The recommended alloc size is 2 * (total number of characters of all messages)
    # length: The size of the allocated buffer
    # Returns the total number of bytes of the formatted prompt. If is it larger than the size of buffer, you may need to re-alloc it and then re-apply the template.
    int32_t llama_chat_apply_template(
            const char * tmpl,
            const llama_chat_message * chat,
            size_t n_msg,
            bint add_ass,
            char * buf,
            int32_t length)

    # Get list of built-in chat templates
    int32_t llama_chat_builtin_templates(const char ** output, size_t len)

    #
    # Sampling API
    #
    # prepare the sampling chain at the start (llama_sampler_chain_init + llama_sampler_chain_add),
    # typically ending with a sampler that selects the token ("greedy", "dist" or "mirostat"),
    # then in the decoding loop: llama_decode(ctx, batch); llama_sampler_sample(smpl, ctx, -1);
    # finally llama_sampler_free(smpl).

    ctypedef void * llama_sampler_context_t

    struct llama_sampler_data:
        ggml_tensor * logits
        ggml_tensor * probs
        ggml_tensor * sampled
        ggml_tensor * candidates

    # user code can implement the interface below in order to create custom llama_sampler
    struct llama_sampler_i:
        const char *    (*name)  (const llama_sampler * smpl) noexcept                                 # can be NULL
        void            (*accept)(      llama_sampler * smpl, llama_token token) noexcept              # can be NULL
        void            (*apply) (      llama_sampler * smpl, llama_token_data_array * cur_p) noexcept  # required
        void            (*reset) (      llama_sampler * smpl) noexcept                                 # can be NULL
        llama_sampler * (*clone) (const llama_sampler * smpl) noexcept                                 # can be NULL if ctx is NULL
        void            (*free)  (      llama_sampler * smpl) noexcept                                 # can be NULL if ctx is NULL

        # [EXPERIMENTAL]
        # backend sampling interface:

        # return true if the backend supports all ops needed by the sampler and can handle up to n_outputs_max_per_seq outputs per sequence
        # note: call once per sampler
        cbool (*backend_init)(
                llama_sampler * smpl,
                ggml_backend_buffer_type_t buft,
                uint32_t n_outputs_max_per_seq) noexcept

        # call after .backend_apply()
        void (*backend_accept)(
                llama_sampler * smpl,
                ggml_context * ctx,
                ggml_cgraph * gf,
                ggml_tensor * selected_token) noexcept

        # call after .backend_init()
        void (*backend_apply)(
                llama_sampler * smpl,
                ggml_context * ctx,
                ggml_cgraph * gf,
                llama_sampler_data * data) noexcept

        # called before graph execution to set inputs for the current ubatch
        void (*backend_set_input)(llama_sampler * smpl) noexcept

        # called before rebuilding a sampling graph to clear any internal sampler state
        void (*backend_reset)(llama_sampler * smpl) noexcept

        # copy mutable state from src into dst while keeping dst's references to the current sampling graph
        # src and dst must have the same type and configuration
        void (*copy_state)(const llama_sampler * src, llama_sampler * dst) noexcept

    struct llama_sampler:
        llama_sampler_i * iface

        llama_sampler_context_t ctx

    # [EXPERIMENTAL]
    # attach a sampler to the context
    # note: prefer initializing the context with llama_context_params.samplers when possible
    bint llama_set_sampler(llama_context * ctx, llama_seq_id seq_id, llama_sampler * smpl)

    # mirror of llama_sampler_i:
    llama_sampler * llama_sampler_init  (      llama_sampler_i * iface, llama_sampler_context_t ctx)
    const char *    llama_sampler_name  (const llama_sampler * smpl)
    void            llama_sampler_accept(      llama_sampler * smpl, llama_token token)
    void            llama_sampler_apply (      llama_sampler * smpl, llama_token_data_array * cur_p)
    void            llama_sampler_reset (      llama_sampler * smpl)
    llama_sampler * llama_sampler_clone (const llama_sampler * smpl)
    void            llama_sampler_copy  (const llama_sampler * src, llama_sampler * dst)
    # important: do not free if the sampler has been added to a llama_sampler_chain (via llama_sampler_chain_add)
    void            llama_sampler_free  (      llama_sampler * smpl)

    # llama_sampler_chain
    # a type of llama_sampler that can chain multiple samplers one after another

    llama_sampler * llama_sampler_chain_init(llama_sampler_chain_params params)

    # important: takes ownership of the sampler object and will free it when llama_sampler_free is called
    void            llama_sampler_chain_add(      llama_sampler * chain, llama_sampler * smpl)

    # return NULL if:
    #   - the sampler is NULL
    #   - the sampler is not a llama_sampler_chain
    #   - the index is out of bounds, unless i == -1
    #   - if i == -1, returns the chain itself (can be used to check if the sampler is a chain)
    llama_sampler * llama_sampler_chain_get(      llama_sampler * chain, int32_t i)

    # the total number of samplers in the chain
    int32_t         llama_sampler_chain_n  (const llama_sampler * chain)

    # after removing a sampler, the chain will no longer own it, and it will not be freed when the chain is freed
    llama_sampler * llama_sampler_chain_remove(   llama_sampler * chain, int32_t i)

    # available samplers:

    llama_sampler * llama_sampler_init_greedy()

    # seed == LLAMA_DEFAULT_SEED to use a random seed.
    llama_sampler * llama_sampler_init_dist(uint32_t seed)

    # Top-K sampling described in academic paper "The Curious Case of Neural Text Degeneration" https://arxiv.org/abs/1904.09751
    # Setting k <= 0 makes this a noop
    llama_sampler * llama_sampler_init_top_k      (int32_t k)

    # Nucleus sampling described in academic paper "The Curious Case of Neural Text Degeneration" https://arxiv.org/abs/1904.09751
    llama_sampler * llama_sampler_init_top_p      (float   p, size_t min_keep)

    # Minimum P sampling as described in https://github.com/ggml-org/llama.cpp/pull/3841
    llama_sampler * llama_sampler_init_min_p      (float   p, size_t min_keep)

    # Locally Typical Sampling implementation described in the paper https://arxiv.org/abs/2202.00666.
    llama_sampler * llama_sampler_init_typical    (float   p, size_t min_keep)

    # Updates the logits l_i` = l_i/t. When t <= 0.0f, the maximum logit is kept at it's original value, the rest are set to -inf
    llama_sampler * llama_sampler_init_temp       (float   t)

    # Dynamic temperature implementation (a.k.a. entropy) described in the paper https://arxiv.org/abs/2309.02772.
    llama_sampler * llama_sampler_init_temp_ext   (float   t, float   delta, float exponent)

    # XTC sampler as described in https://github.com/oobabooga/text-generation-webui/pull/6335
    llama_sampler * llama_sampler_init_xtc        (float   p, float   t,     size_t min_keep, uint32_t seed)

    # Top n sigma sampling as described in academic paper "Top-nσ: Not All Logits Are You Need" https://arxiv.org/pdf/2411.07641
    llama_sampler * llama_sampler_init_top_n_sigma(float   n)

    # Mirostat 1.0 algorithm described in the paper https://arxiv.org/abs/2007.14966. Uses tokens instead of words.
    # tau: The target cross-entropy (or surprise) value you want to achieve for the generated text.
    # eta: The learning rate used to update `mu` based on the error between the target and observed surprisal of the sampled word.
    # m: The number of tokens considered in the estimation of `s_hat` (the paper uses m = 100).
    llama_sampler * llama_sampler_init_mirostat(
            int32_t n_vocab,
            uint32_t seed,
            float tau,
            float eta,
            int32_t m)

    # Mirostat 2.0 algorithm described in the paper https://arxiv.org/abs/2007.14966. Uses tokens instead of words.
    # tau: The target cross-entropy (or surprise) value you want to achieve for the generated text.
    # eta: The learning rate used to update `mu` based on the error between the target and observed surprisal of the sampled word.
    llama_sampler * llama_sampler_init_mirostat_v2(
            uint32_t seed,
            float tau,
            float eta)

    # Initializes a GBNF grammar, see grammars/README.md for details.
    # vocab: The vocabulary that this grammar will be used with.
    # grammar_str: The production rules for the grammar, encoded as a string. Returns an empty grammar if empty. Returns NULL if parsing of grammar_str fails.
    # grammar_root: The name of the start symbol for the grammar.
    llama_sampler * llama_sampler_init_grammar(
            const llama_vocab * vocab,
            const char * grammar_str,
            const char * grammar_root)

    # Lazy grammar sampler, introduced in https://github.com/ggml-org/llama.cpp/pull/9639
    # trigger_patterns: A list of patterns that will trigger the grammar sampler. Pattern will be matched from the start of the generation output, and grammar sampler will be fed content starting from its first match group.
    # trigger_tokens: A list of tokens that will trigger the grammar sampler. Grammar sampler will be fed content starting from the trigger token included.
    llama_sampler * llama_sampler_init_grammar_lazy_patterns(
            const llama_vocab * vocab,
            const char * grammar_str,
            const char * grammar_root,
            const char ** trigger_patterns,
            size_t num_trigger_patterns,
            const llama_token * trigger_tokens,
            size_t num_trigger_tokens)

    # NOTE: Avoid using on the full vocabulary as searching for repeated tokens can become slow. For example, apply top-k or top-p sampling first.
    llama_sampler * llama_sampler_init_penalties(
            int32_t n_vocab,
            int32_t penalty_last_n,   # last n tokens to penalize (0 = disable penalty)
            float penalty_repeat,     # must be > 0.0, 1.0 = disabled
            float penalty_freq,       # must be finite, 0.0 = disabled
            float penalty_present)    # must be finite, 0.0 = disabled

    # DRY sampler, designed by p-e-w, as described in: https://github.com/oobabooga/text-generation-webui/pull/5677, porting Koboldcpp implementation authored by pi6am: https://github.com/LostRuins/koboldcpp/pull/982
    llama_sampler * llama_sampler_init_dry(
            const llama_vocab * vocab,
            float dry_multiplier,
            float dry_base,
            int32_t dry_allowed_length,
            int32_t dry_penalty_last_n,  # last n tokens to penalize (0 = disable penalty)
            const char ** seq_breakers,
            size_t num_breakers)

    # adaptive-p: select tokens near a configurable target probability over time.
    # It keeps an EMA of the *original* probabilities of selected tokens and adapts the target
    # to it; it selects a token, so it must be last in the sampler chain (like mirostat, dist, greedy).
    # target: select tokens near this probability (valid range 0.0 to 1.0; negative = disabled)
    # decay: EMA decay for adaptation; history ≈ 1/(1-decay) tokens (valid range 0.0 - 0.99)
    # seed: RNG seed
    llama_sampler * llama_sampler_init_adaptive_p(
            float target,
            float decay,
            uint32_t seed)

    llama_sampler * llama_sampler_init_logit_bias(
            int32_t n_vocab,
            int32_t n_logit_bias,
            const llama_logit_bias * logit_bias)

    # this sampler is meant to be used for fill-in-the-middle infilling
    # it's supposed to be used after top_k + top_p sampling
    # 1. if the sum of the EOG probs times the number of candidates is higher than the sum of the other probs -> pick EOG
    # 2. combine probs of tokens that have the same prefix
    # 3. discard non-EOG tokens with low prob
    # 4. if no tokens are left -> pick EOT
    llama_sampler * llama_sampler_init_infill(const llama_vocab * vocab)

    # Returns the seed used by the sampler if applicable, LLAMA_DEFAULT_SEED otherwise
    uint32_t llama_sampler_get_seed(const llama_sampler * smpl)

    # Sample and accept a token from the idx-th output of the last evaluation
    # For multiple outputs from one sampler, call this function in output order without gaps.
    # Shorthand for: logits of idx -> llama_token_data_array -> llama_sampler_apply -> llama_sampler_accept
    # Returns the sampled token
    llama_token llama_sampler_sample(llama_sampler * smpl, llama_context * ctx, int32_t idx)

    #
    # Model split
    #

    # Build a split GGUF final path for this chunk.
    #   llama_split_path(split_path, sizeof(split_path), "/models/ggml-model-q4_0", 2, 4) => split_path = "/models/ggml-model-q4_0-00002-of-00004.gguf"
    # Returns the split_path length.
    int32_t llama_split_path(char * split_path, size_t maxlen, const char * path_prefix, int32_t split_no, int32_t split_count)

    # Extract the path prefix from the split_path if and only if the split_no and split_count match.
    #   llama_split_prefix(split_prefix, 64, "/models/ggml-model-q4_0-00002-of-00004.gguf", 2, 4) => split_prefix = "/models/ggml-model-q4_0"
    # Returns the split_prefix length.
    int32_t llama_split_prefix(char * split_prefix, size_t maxlen, const char * split_path, int32_t split_no, int32_t split_count)

    # Print system information
    const char * llama_print_system_info()

    # Set callback for all future logging events.
    # If this is not called, or NULL is supplied, everything is output on stderr.
    # The logger state is global so these functions are NOT thread safe.
    void llama_log_get(ggml_log_callback * log_callback, void ** user_data)
    void llama_log_set(ggml_log_callback   log_callback, void *  user_data)

    #
    # Performance utils
    #
    # NOTE: Used by llama.cpp examples/tools, avoid using in third-party apps. Instead, do your own performance measurements.
    #

    struct llama_perf_context_data:
        # ms == milliseconds
        double t_start_ms   # absolute start time
        double t_load_ms    # time needed for loading the model
        double t_p_eval_ms  # time needed for processing the prompt
        double t_eval_ms    # time needed for generating tokens

        int32_t n_p_eval    # number of prompt tokens
        int32_t n_eval      # number of generated tokens
        int32_t n_reused    # number of times a ggml compute graph had been reused

    struct llama_perf_sampler_data:
        double t_sample_ms  # time needed for sampling in ms

        int32_t n_sample    # number of sampled tokens

    llama_perf_context_data llama_perf_context      (const llama_context * ctx)
    void                    llama_perf_context_print(const llama_context * ctx)
    void                    llama_perf_context_reset(      llama_context * ctx)

    # NOTE: the following work only with samplers constructed via llama_sampler_chain_init
    llama_perf_sampler_data llama_perf_sampler      (const llama_sampler * chain)
    void                    llama_perf_sampler_print(const llama_sampler * chain)
    void                    llama_perf_sampler_reset(      llama_sampler * chain)

    #
    # training
    #

    # function that returns whether or not a given tensor contains trainable parameters
    ctypedef cbool (*llama_opt_param_filter)(const ggml_tensor * tensor, void * userdata) noexcept

    # always returns true
    bint llama_opt_param_filter_all(const ggml_tensor * tensor, void * userdata)

    struct llama_opt_params:
        uint32_t n_ctx_train  # assumed context size post training, use context size specified in llama_context if 0

        llama_opt_param_filter param_filter  # callback for determining which tensors contain trainable parameters
        void * param_filter_ud               # userdata for determining which tensors contain trainable parameters

        ggml_opt_get_optimizer_params get_opt_pars  # callback for calculating optimizer parameters
        void * get_opt_pars_ud                      # userdata for calculating optimizer parameters

        ggml_opt_optimizer_type optimizer_type

    void llama_opt_init(llama_context * lctx, llama_model * model, llama_opt_params lopt_params)

    void llama_opt_epoch(
            llama_context * lctx,
            ggml_opt_dataset_t dataset,
            ggml_opt_result_t result_train,
            ggml_opt_result_t result_eval,
            int64_t idata_split,
            ggml_opt_epoch_callback callback_train,
            ggml_opt_epoch_callback callback_eval)
