# Declarations of polyllama's own C++ layer (native/polyllama_native.h): the parts of
# llama.cpp that are C++ only (libcommon's memory fitting, chat templates, grammars).
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libcpp cimport bool as cbool
from libcpp.string cimport string
from libcpp.vector cimport vector

from polyllama.includes.llama cimport (llama_context, llama_context_params, llama_model,
                                       llama_model_params, llama_model_tensor_buft_override)


cdef extern from "polyllama_native.h" namespace "polyllama" nogil:
    void log_install()
    void log_set_stderr_level(int min_level)
    int log_get_stderr_level()
    string log_recent_problems()
    void log_clear()

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
    vector[device_memory] context_device_memory(const llama_context * ctx)
    int fit_params(const char * path, llama_model_params * mparams,
                   llama_context_params * cparams, float * tensor_split,
                   llama_model_tensor_buft_override * overrides, size_t * margins,
                   uint32_t n_ctx_min, string & err)
    size_t max_tensor_buft_overrides()

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

    cbool chat_apply(const llama_model * model, const string & template_override,
                     const string & messages_json, const string & tools_json,
                     const string & json_schema, cbool add_generation_prompt,
                     cbool enable_thinking, chat_result & out, string & err)
    cbool chat_parse_reply(int format, const string & generation_prompt, const string & parser,
                           const string & text,
                           string & message_json, string & err)
    cbool json_schema_to_gbnf(const string & schema_json, string & grammar, string & err)
