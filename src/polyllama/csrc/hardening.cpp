// See hardening.h.
#include "hardening.h"
#include "guard.h"
#include "remote.h"

#include "chat.h"
#include "common.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace polyllama {

namespace {

// ---- threads with a large stack -------------------------------------------------------------
// 256 MiB of address space; pages are only committed as the recursion touches them. The
// grammar and template code recurses a few hundred bytes per level, so this holds well
// over half a million levels, far beyond what the Python-side limits let through.
constexpr size_t k_big_stack = size_t(256) << 20;

struct thread_body {
    std::function<void()> fn;
};

void * thread_entry(void * arg) {
    std::unique_ptr<thread_body> body(static_cast<thread_body *>(arg));
    std::string ignored;   // fn reports its own errors; this only keeps them in the thread
    guarded(ignored, body->fn);
    return nullptr;
}

// Starts fn on a thread with a large stack; joinable unless `detached`. false when no
// thread could be made (fn did not run).
bool start_big_stack_thread(std::function<void()> fn, bool detached, pthread_t * out) {
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) {
        return false;
    }
    pthread_attr_setstacksize(&attr, k_big_stack);
    if (detached) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    }
    auto * body = new thread_body{std::move(fn)};
    pthread_t tid;
    const int rc = pthread_create(&tid, &attr, thread_entry, body);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        delete body;
        return false;
    }
    if (out != nullptr) {
        *out = tid;
    }
    return true;
}

// Runs fn on a big-stack thread and waits for it; runs it here if no thread can be made.
void run_on_big_stack(const std::function<void()> & fn) {
    pthread_t tid;
    if (!start_big_stack_thread(fn, false, &tid)) {
        fn();
        return;
    }
    pthread_join(tid, nullptr);
}

// ---- GGML_ABORT as an exception ------------------------------------------------------------------
thread_local int t_abort_scope = 0;

std::string piece_of(const llama_vocab * vocab, llama_token t) {
    char buf[64];
    const int n = llama_token_to_piece(vocab, t, buf, sizeof(buf), 0, true);
    return n > 0 ? std::string(buf, n) : std::string();
}

}  // namespace

void abort_scope_enter() { t_abort_scope++; }
void abort_scope_leave() { t_abort_scope--; }
bool abort_scope_active() { return t_abort_scope > 0; }

void abort_guard_install() {
    remote_guard_install();   // one ggml abort callback serves both guards
}

llama_model * model_load_guarded(const char * path, llama_model_params params, std::string & err) {
    abort_scope scope;
    llama_model * model = nullptr;
    // what reaches guarded() is an abort outside llama_model_load's own try (device set-up, splits)
    guarded(err, [&] { model = llama_model_load_from_file(path, params); });
    return model;
}

llama_context * context_init_guarded(llama_model * model, llama_context_params params, std::string & err) {
    abort_scope scope;
    llama_context * ctx = nullptr;
    guarded(err, [&] { ctx = llama_init_from_model(model, params); });
    return ctx;
}

std::string vocab_problems(const llama_model * model) {
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    if (llama_vocab_type(vocab) == LLAMA_VOCAB_TYPE_NONE || n_vocab <= 0) {
        return "the model has no vocabulary (tokenizer.ggml.model is no_vocab or none): polyllama needs "
               "one to turn text into tokens and back";
    }
    // llama_tokenize asserts on these when it adds the special tokens
    if (llama_vocab_get_add_bos(vocab) && llama_vocab_bos(vocab) == LLAMA_TOKEN_NULL) {
        return "tokenizer.ggml.add_bos_token is true but the vocabulary has no BOS token "
               "(tokenizer.ggml.bos_token_id is missing or out of range, and this tokenizer has no default)";
    }
    if (llama_vocab_get_add_eos(vocab) && llama_vocab_eos(vocab) == LLAMA_TOKEN_NULL) {
        return "tokenizer.ggml.add_eos_token is true but the vocabulary has no EOS token "
               "(tokenizer.ggml.eos_token_id is missing or out of range, and this tokenizer has no default)";
    }
    if (llama_vocab_type(vocab) == LLAMA_VOCAB_TYPE_WPM && llama_vocab_get_add_sep(vocab) &&
        llama_vocab_sep(vocab) == LLAMA_TOKEN_NULL) {
        return "tokenizer.ggml.add_sep_token is true but the vocabulary has no SEP token "
               "(tokenizer.ggml.seperator_token_id is missing or out of range)";
    }
    // the tokenizer itself, on text every model must take: each printable ASCII character,
    // and a sentence with the special tokens added
    std::string probe = "Hello, world!\n\t ";
    for (int c = 0x20; c < 0x7f; c++) {
        probe.push_back(static_cast<char>(c));
    }
    std::vector<llama_token> ids;
    std::string err;
    for (size_t i = 0; i <= probe.size(); i++) {
        // the whole probe first, then one character at a time
        const std::string text = i == 0 ? probe : probe.substr(i - 1, 1);
        const int rc = tokenize_checked(vocab, text.data(), text.size(), i == 0, false, ids, err);
        if (rc == TOKENIZE_BAD_ID) {
            std::string shown = text == "\n" ? "\\n" : text == "\t" ? "\\t" : text;
            return "the vocabulary cannot tokenize '" + shown + "': no token covers it and it has no "
                   "unknown token (" + err + "); tokenizer.ggml.model does not fit tokenizer.ggml.tokens";
        }
        if (rc != TOKENIZE_OK) {
            return "the model's tokenizer fails on plain text: " + err;
        }
    }
    return "";
}

// ---- tokenizing ---------------------------------------------------------------------------------------
namespace {

// llama_tokenize with the buffer grown once to the size it asks for; may throw (or abort,
// inside the caller's abort scope).
int tokenize_into(const llama_vocab * vocab, const char * text, int32_t n_text, bool add_special,
                  bool parse_special, std::vector<llama_token> & out, std::string & err) {
    // a token covers at least one byte, plus the special tokens added around the text
    size_t cap = static_cast<size_t>(n_text) + 8;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (cap > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
            cap = std::numeric_limits<int32_t>::max();
        }
        out.resize(cap);
        const int32_t n = llama_tokenize(vocab, text, n_text, out.data(), static_cast<int32_t>(cap),
                                         add_special, parse_special);
        if (n >= 0) {
            out.resize(n);
            const int32_t n_vocab = llama_vocab_n_tokens(vocab);
            for (size_t i = 0; i < out.size(); i++) {
                if (out[i] < 0 || out[i] >= n_vocab) {
                    err = "llama.cpp's tokenizer produced token id " + std::to_string(out[i]) +
                          " (the vocabulary has " + std::to_string(n_vocab) + ")";
                    return TOKENIZE_BAD_ID;
                }
            }
            return TOKENIZE_OK;
        }
        if (n == std::numeric_limits<int32_t>::min()) {
            break;   // the count itself overflowed
        }
        cap = static_cast<size_t>(-static_cast<int64_t>(n));
    }
    err = "the tokenized text does not fit in 2**31 tokens";
    return TOKENIZE_FAILED;
}

}  // namespace

int tokenize_checked(const llama_vocab * vocab, const char * text, size_t len, bool add_special,
                     bool parse_special, std::vector<llama_token> & out, std::string & err) {
    out.clear();
    if (len > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
        err = "the text is " + std::to_string(len) + " bytes; llama.cpp's tokenizer takes at most " +
              std::to_string(std::numeric_limits<int32_t>::max()) + " bytes at once";
        return TOKENIZE_TOO_LONG;
    }
    abort_scope scope;   // tokenizing only reads the vocabulary: an abort leaves nothing half-done
    int rc = TOKENIZE_FAILED;
    std::string what;
    if (!guarded(what, [&] {
            rc = tokenize_into(vocab, text, static_cast<int32_t>(len), add_special, parse_special, out, err);
        })) {
        err = "llama.cpp's tokenizer failed: " + what;
    }
    if (rc != TOKENIZE_OK) {
        out.clear();
    }
    return rc;
}

// ---- grammars ---------------------------------------------------------------------------------------------
llama_sampler * grammar_init_checked(const llama_vocab * vocab, const std::string & grammar,
                                     const std::string & root, const std::vector<std::string> & lazy_patterns,
                                     std::string & err) {
    llama_sampler * out = nullptr;
    run_on_big_stack([&] {
        guarded(err, [&] {
            if (lazy_patterns.empty()) {
                out = llama_sampler_init_grammar(vocab, grammar.c_str(), root.c_str());
            } else {
                std::vector<const char *> pats;
                for (const auto & p : lazy_patterns) {
                    pats.push_back(p.c_str());
                }
                out = llama_sampler_init_grammar_lazy_patterns(vocab, grammar.c_str(), root.c_str(), pats.data(),
                                                               pats.size(), nullptr, 0);
            }
        });
    });
    return out;
}

bool grammar_prefill(llama_sampler * grammar, const llama_vocab * vocab, const std::vector<llama_token> & tokens,
                     std::string & err) {
    for (size_t i = 0; i < tokens.size(); i++) {
        const llama_token t = tokens[i];
        llama_token_data one{t, 0.0f, 0.0f};
        llama_token_data_array arr{&one, 1, -1, false};
        bool allowed = false;
        std::string what;
        if (!guarded(what, [&] {
                llama_sampler_apply(grammar, &arr);
                allowed = one.logit > -std::numeric_limits<float>::infinity();
                if (allowed) {
                    llama_sampler_accept(grammar, t);
                }
            })) {
            err = "the grammar rejected token " + std::to_string(i) + " (" + std::to_string(t) + ", '" +
                  piece_of(vocab, t) + "') of the generation prompt: " + what;
            return false;
        }
        if (!allowed) {
            err = "token " + std::to_string(i) + " (" + std::to_string(t) + ", '" + piece_of(vocab, t) +
                  "') of the generation prompt is not allowed by the grammar";
            return false;
        }
    }
    return true;
}

bool json_schema_to_gbnf_checked(const std::string & schema_json, std::string & grammar, std::string & err) {
    bool ok = false;
    run_on_big_stack([&] { ok = json_schema_to_gbnf(schema_json, grammar, err); });
    return ok;
}

// ---- chat templates ----------------------------------------------------------------------------------
struct chat_job {
    std::mutex              mutex;
    std::condition_variable cv;
    bool                    done = false;
    int                     refs = 2;       // the caller and the rendering thread
    bool                    ok = false;
    chat_result             result;
    std::string             err;
    common_chat_templates_ptr tmpls;
    common_chat_templates_inputs inputs;
};

static void chat_job_unref(chat_job * job) {
    bool last;
    {
        std::lock_guard<std::mutex> lock(job->mutex);
        last = --job->refs == 0;
    }
    if (last) {
        delete job;
    }
}

static void chat_job_finish(chat_job * job, bool ok, std::string err) {
    {
        std::lock_guard<std::mutex> lock(job->mutex);
        job->ok = ok;
        job->err = std::move(err);
        job->done = true;
    }
    job->cv.notify_all();
}

chat_job * chat_job_start(const llama_model * model, const std::string & template_override,
                          const std::string & messages_json, const std::string & tools_json,
                          const std::string & json_schema, bool add_generation_prompt, bool enable_thinking,
                          const std::string & tool_choice, int parallel_tool_calls) {
    auto * job = new chat_job();
    // 1. parse the template (and the messages), which reads the model: waited for here
    std::string err;
    bool parsed = false;
    run_on_big_stack([&] {
        parsed = guarded(err, [&] {
            job->tmpls = common_chat_templates_init(model, template_override);
            job->inputs.messages = common_chat_msgs_parse_oaicompat(common_json::parse(messages_json));
            if (!tools_json.empty()) {
                job->inputs.tools = common_chat_tools_parse_oaicompat(common_json::parse(tools_json));
            }
            job->inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(tool_choice.empty() ? "auto" : tool_choice);
            job->inputs.parallel_tool_calls = parallel_tool_calls < 0
                ? common_chat_templates_get_caps(job->tmpls.get())["supports_parallel_tool_calls"]
                : parallel_tool_calls != 0;
            job->inputs.json_schema           = json_schema;
            job->inputs.add_generation_prompt = add_generation_prompt;
            job->inputs.enable_thinking       = enable_thinking;
            job->inputs.use_jinja             = true;
        });
    });
    if (!parsed) {
        job->refs = 1;
        chat_job_finish(job, false, err);
        return job;
    }
    // 2. render, on a thread of its own: it no longer needs the model
    const bool started = start_big_stack_thread([job] {
        std::string e;
        const bool ok = guarded(e, [&] {
            common_chat_params params = common_chat_templates_apply(job->tmpls.get(), job->inputs);
            chat_result & out = job->result;
            out.prompt            = params.prompt;
            out.grammar           = params.grammar;
            out.grammar_lazy      = params.grammar_lazy;
            out.additional_stops  = params.additional_stops;
            out.preserved_tokens  = params.preserved_tokens;
            out.format            = (int) params.format;
            out.generation_prompt = params.generation_prompt;
            out.parser            = params.parser;
            out.grammar_trigger_patterns.clear();
            for (const auto & t : params.grammar_triggers) {
                out.grammar_trigger_patterns.push_back(t.value);
            }
        });
        chat_job_finish(job, ok, e);
        chat_job_unref(job);
    }, true, nullptr);
    if (!started) {
        job->refs = 1;
        chat_job_finish(job, false, "could not start a thread to render the chat template");
    }
    return job;
}

int chat_job_wait(chat_job * job, double timeout_s) {
    std::unique_lock<std::mutex> lock(job->mutex);
    job->cv.wait_for(lock, std::chrono::duration<double>(std::max(0.0, timeout_s)), [&] { return job->done; });
    return job->done ? 1 : 0;
}

bool chat_job_result(chat_job * job, chat_result & out, std::string & err) {
    std::lock_guard<std::mutex> lock(job->mutex);
    if (!job->done) {
        err = "the chat template is still being rendered";
        return false;
    }
    out = job->result;
    err = job->err;
    return job->ok;
}

void chat_job_release(chat_job * job) {
    chat_job_unref(job);
}

}  // namespace polyllama
