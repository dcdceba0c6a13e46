// Input that would make llama.cpp abort, overflow the stack or loop for good, turned into
// errors before it reaches llama.cpp or while llama.cpp is still able to unwind
// (docs/HARDENING.md; issue #16). Nothing here throws into Cython: every function reports
// through its return value and `err`.
#pragma once

#include "llama.h"
#include "chat_reply.h"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace polyllama {

// What a GGML_ABORT becomes inside an abort scope (below).
struct ggml_abort_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// ---- GGML_ABORT as an exception, on this thread, for the calls llama.cpp wraps in try --------
// llama_model_load and llama_init_from_model catch std::exception and return NULL. Inside
// an abort scope, a GGML_ASSERT/GGML_ABORT reached on the calling thread (a hyperparameter or
// vocabulary check that llama.cpp makes with an assert, a graph that cannot be built) is
// thrown as ggml_abort_error instead of ending the process, and so becomes a failed load.
// Aborts on other threads (ggml's compute threads) are not affected. The scope nests.
void abort_scope_enter();
void abort_scope_leave();
bool abort_scope_active();          // read by the ggml abort callback (remote.cpp)
void abort_guard_install();         // installs that callback (idempotent)
struct abort_scope {
    abort_scope() { abort_scope_enter(); }
    ~abort_scope() { abort_scope_leave(); }
    abort_scope(const abort_scope &) = delete;
    abort_scope & operator=(const abort_scope &) = delete;
};

// llama_model_load_from_file / llama_init_from_model inside an abort scope; NULL on failure
// (llama.cpp logged why; err holds an abort's message if one escaped llama.cpp's own catch).
llama_model *   model_load_guarded(const char * path, llama_model_params params, std::string & err);
llama_context * context_init_guarded(llama_model * model, llama_context_params params, std::string & err);

// What the loaded vocabulary would abort on later, found now: special tokens it must add
// but does not have, and a tokenizer that fails (assert, exception, or an id out of range)
// on plain ASCII text. "" when there is nothing.
std::string vocab_problems(const llama_model * model);

// ---- tokenizing ---------------------------------------------------------------------------------
enum tokenize_status { TOKENIZE_OK = 0, TOKENIZE_TOO_LONG = 1, TOKENIZE_FAILED = 2, TOKENIZE_BAD_ID = 3 };
// llama_tokenize over the whole text (its length is an int32_t), with the buffer grown as
// needed, exceptions caught, and every id checked to be a token of the vocabulary.
int tokenize_checked(const llama_vocab * vocab, const char * text, size_t len, bool add_special,
                     bool parse_special, std::vector<llama_token> & out, std::string & err);

// ---- grammars -------------------------------------------------------------------------------------
// llama_sampler_init_grammar(_lazy_patterns) on a thread with a large stack: llama.cpp's GBNF
// parser and its grammar set-up recurse once per nesting level and per rule in a chain.
// NULL when the grammar does not parse (llama.cpp printed why on stderr).
llama_sampler * grammar_init_checked(const llama_vocab * vocab, const std::string & grammar,
                                     const std::string & root, const std::vector<std::string> & lazy_patterns,
                                     std::string & err);
// Feeds tokens (a chat template's generation prompt) to a grammar sampler, checking each
// with the grammar first: llama_sampler_accept aborts (end-of-generation tokens) or throws
// on a token the grammar does not allow. false, with err naming the token, when one is refused.
bool grammar_prefill(llama_sampler * grammar, const llama_vocab * vocab, const std::vector<llama_token> & tokens,
                     std::string & err);

// json_schema_to_gbnf (libcommon) on a thread with a large stack.
bool json_schema_to_gbnf_checked(const std::string & schema_json, std::string & grammar, std::string & err);

// ---- chat templates ----------------------------------------------------------------------------
// the chat template in two steps, both on threads with a large stack (the Jinja parser and
// interpreter recurse with the template's nesting and its macro calls; patch 0003 bounds the
// depth): chat_job_start parses the template and waits for that (it reads the model), then
// renders on a thread of its own that the caller waits for in slices (chat_job_wait), so
// that Ctrl-C can end the wait; a job given up on finishes in the background.
struct chat_job;
chat_job * chat_job_start(const llama_model * model, const std::string & template_override,
                          const std::string & messages_json, const std::string & tools_json,
                          const std::string & json_schema, bool add_generation_prompt, bool enable_thinking,
                          const std::string & tool_choice, int parallel_tool_calls);
int  chat_job_wait(chat_job * job, double timeout_s);   // 1 finished, 0 not yet
bool chat_job_result(chat_job * job, chat_result & out, std::string & err);
void chat_job_release(chat_job * job);                  // the caller's reference

}  // namespace polyllama
