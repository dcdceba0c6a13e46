#include "polyllama_native.h"

#include "chat.h"
#include "fit.h"
#include "json-schema-to-grammar.h"
#include "json.h"
#include "llama-ext.h"

#include <atomic>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>

namespace polyllama {

// ---- logging --------------------------------------------------------------------------

namespace {
std::mutex                g_log_mutex;
std::deque<std::string>   g_problems;        // recent WARN/ERROR lines
std::string               g_partial;         // a line llama.cpp printed in pieces
int                       g_partial_level = GGML_LOG_LEVEL_NONE;
std::atomic<int>          g_stderr_level{GGML_LOG_LEVEL_ERROR + 1};
constexpr size_t          k_max_problems = 64;

void log_callback(ggml_log_level level, const char * text, void * /*user_data*/) {
    if (text == nullptr) {
        return;
    }
    // CONT continues the previous line at the previous line's level.
    const int eff = level == GGML_LOG_LEVEL_CONT ? g_partial_level : (int) level;
    if (eff >= g_stderr_level.load(std::memory_order_relaxed)) {
        fputs(text, stderr);
    }
    if (eff != GGML_LOG_LEVEL_WARN && eff != GGML_LOG_LEVEL_ERROR) {
        return;
    }
    std::lock_guard<std::mutex> lock(g_log_mutex);
    if (level != GGML_LOG_LEVEL_CONT) {
        g_partial.clear();
    }
    g_partial_level = eff;
    g_partial += text;
    if (!g_partial.empty() && g_partial.back() == '\n') {
        g_partial.pop_back();
        g_problems.push_back(std::move(g_partial));
        g_partial.clear();
        while (g_problems.size() > k_max_problems) {
            g_problems.pop_front();
        }
    }
}
}  // namespace

void log_install() { llama_log_set(log_callback, nullptr); }
void log_set_stderr_level(int min_level) { g_stderr_level.store(min_level); }
int  log_get_stderr_level() { return g_stderr_level.load(); }

std::string log_recent_problems() {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    std::string out;
    for (const auto & line : g_problems) {
        if (!out.empty()) {
            out += '\n';
        }
        out += line;
    }
    if (!g_partial.empty()) {
        out += (out.empty() ? "" : "\n") + g_partial;
    }
    return out;
}

void log_clear() {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    g_problems.clear();
    g_partial.clear();
}

// ---- memory accounting ------------------------------------------------------------------

bool estimate_device_memory(const char * path, const llama_model_params * mparams,
                            const llama_context_params * cparams,
                            std::vector<device_memory> & out, uint32_t & n_layer,
                            uint32_t & n_ctx_train, std::string & err) {
    try {
        std::vector<ggml_backend_dev_t> devs;
        uint32_t n_expert = 0;
        // GGML_LOG_LEVEL_ERROR: fit's own report lines go to the debug level (hidden).
        auto data = common_get_device_memory_data(path, mparams, cparams, devs, n_layer,
                                                  n_ctx_train, n_expert, GGML_LOG_LEVEL_ERROR);
        out.clear();
        for (size_t i = 0; i < data.size(); i++) {
            device_memory m;
            m.device  = i < devs.size() ? ggml_backend_dev_name(devs[i]) : "Host";
            m.total   = data[i].total;
            m.free    = data[i].free;
            m.model   = data[i].model;
            m.context = data[i].context;
            m.compute = data[i].compute;
            out.push_back(std::move(m));
        }
        return true;
    } catch (const std::exception & e) {
        err = e.what();
    } catch (...) {
        err = "unknown C++ exception";
    }
    return false;
}

std::vector<device_memory> context_device_memory(const llama_context * ctx) {
    const llama_model * model = llama_get_model(ctx);
    const int nd = llama_model_n_devices(model);
    std::vector<device_memory> out(nd + 1);
    for (int i = 0; i < nd; i++) {
        ggml_backend_dev_t dev = llama_model_get_device(model, i);
        out[i].device = ggml_backend_dev_name(dev);
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(dev, &free, &total);
        out[i].free  = (int64_t) free;
        out[i].total = (int64_t) total;
    }
    out[nd].device = "Host";
    for (const auto & [buft, mb] : llama_get_memory_breakdown(ctx)) {
        size_t slot = nd;  // host buffers
        if (!ggml_backend_buft_is_host(buft)) {
            ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
            for (int i = 0; i < nd; i++) {
                if (dev == llama_model_get_device(model, i)) {
                    slot = i;
                    break;
                }
            }
        }
        out[slot].model   += mb.model;
        out[slot].context += mb.context;
        out[slot].compute += mb.compute;
    }
    return out;
}

int fit_params(const char * path, llama_model_params * mparams, llama_context_params * cparams,
               float * tensor_split, llama_model_tensor_buft_override * overrides,
               size_t * margins, uint32_t n_ctx_min, std::string & err) {
    try {
        return (int) common_fit_params(path, mparams, cparams, tensor_split, overrides, margins,
                                       n_ctx_min, nullptr, GGML_LOG_LEVEL_ERROR);
    } catch (const std::exception & e) {
        err = e.what();
    } catch (...) {
        err = "unknown C++ exception";
    }
    return COMMON_PARAMS_FIT_STATUS_ERROR;
}

size_t max_tensor_buft_overrides() { return llama_max_tensor_buft_overrides(); }

// ---- chat templates and grammars ----------------------------------------------------------

bool chat_apply(const llama_model * model, const std::string & template_override,
                const std::string & messages_json, const std::string & tools_json,
                const std::string & json_schema, bool add_generation_prompt,
                bool enable_thinking, chat_result & out, std::string & err) {
    try {
        auto tmpls = common_chat_templates_init(model, template_override);
        common_chat_templates_inputs inputs;
        inputs.messages = common_chat_msgs_parse_oaicompat(common_json::parse(messages_json));
        if (!tools_json.empty()) {
            inputs.tools = common_chat_tools_parse_oaicompat(common_json::parse(tools_json));
        }
        inputs.json_schema           = json_schema;
        inputs.add_generation_prompt = add_generation_prompt;
        inputs.enable_thinking       = enable_thinking;
        inputs.use_jinja             = true;
        common_chat_params params = common_chat_templates_apply(tmpls.get(), inputs);
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
        return true;
    } catch (const std::exception & e) {
        err = e.what();
    } catch (...) {
        err = "unknown C++ exception";
    }
    return false;
}

bool chat_parse_reply(int format, const std::string & generation_prompt, const std::string & parser,
                      const std::string & text, std::string & message_json, std::string & err) {
    try {
        common_chat_parser_params params;
        params.format            = (common_chat_format) format;
        params.generation_prompt = generation_prompt;
        if (!parser.empty()) {
            params.parser.load(parser);
        }
        common_chat_msg msg = common_chat_parse(text, false, params);
        message_json = msg.to_json_oaicompat().dump();
        return true;
    } catch (const std::exception & e) {
        err = e.what();
    } catch (...) {
        err = "unknown C++ exception";
    }
    return false;
}

bool json_schema_to_gbnf(const std::string & schema_json, std::string & grammar, std::string & err) {
    try {
        grammar = json_schema_to_grammar(common_json::parse(schema_json));
        return true;
    } catch (const std::exception & e) {
        err = e.what();
    } catch (...) {
        err = "unknown C++ exception";
    }
    return false;
}

}  // namespace polyllama
