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
int         log_get_stderr_level();
std::string log_recent_problems();                // warnings and errors since log_clear()
void        log_clear();

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

// messages_json / tools_json: OpenAI-style arrays as JSON text (tools may be empty).
bool chat_apply(const llama_model * model, const std::string & template_override,
                const std::string & messages_json, const std::string & tools_json,
                const std::string & json_schema, bool add_generation_prompt,
                bool enable_thinking, chat_result & out, std::string & err);

// Parses a finished reply (content, reasoning, tool calls) into OpenAI-style JSON.
bool chat_parse_reply(int format, const std::string & generation_prompt, const std::string & parser,
                      const std::string & text,
                      std::string & message_json, std::string & err);

bool json_schema_to_gbnf(const std::string & schema_json, std::string & grammar, std::string & err);

}  // namespace polyllama
