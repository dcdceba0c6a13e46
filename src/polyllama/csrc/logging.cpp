// See logging.h.
#include "logging.h"

#include "ggml.h"
#include "llama.h"
#include "log.h"   // libcommon's logger

#include <atomic>
#include <cstdio>
#include <deque>
#include <mutex>

namespace polyllama {

namespace {

std::mutex                g_log_mutex;
std::deque<std::string>   g_problems;        // recent WARN/ERROR lines
std::deque<std::string>   g_errors;          // the ERROR lines among them
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
        if (eff == GGML_LOG_LEVEL_ERROR) {
            g_errors.push_back(g_partial);
            if (g_errors.size() > k_max_problems) {
                g_errors.pop_front();
            }
        }
        g_problems.push_back(std::move(g_partial));
        g_partial.clear();
        while (g_problems.size() > k_max_problems) {
            g_problems.pop_front();
        }
    }
}

// libcommon logs through a logger of its own (common/log.h), straight to stderr; its
// threshold follows ours, so that e.g. common_threadpools' "threadpool init" line appears
// only with set_log_level("info") / -v.
void common_log_follow(int min_level) {
    int thold = -1;                                   // nothing
    if (min_level <= GGML_LOG_LEVEL_INFO) {
        thold = LOG_LEVEL_INFO;
    } else if (min_level <= GGML_LOG_LEVEL_WARN) {
        thold = LOG_LEVEL_WARN;
    } else if (min_level <= GGML_LOG_LEVEL_ERROR) {
        thold = LOG_LEVEL_ERROR;
    }
    common_log_set_verbosity_thold(thold);
}

}  // namespace

void log_install() {
    llama_log_set(log_callback, nullptr);
    common_log_follow(g_stderr_level.load());
}

void log_set_stderr_level(int min_level) {
    g_stderr_level.store(min_level);
    common_log_follow(min_level);
}

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

std::string log_recent_errors() {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    std::string out;
    for (const auto & line : g_errors) {
        out += (out.empty() ? "" : "\n") + line;
    }
    return out;
}

void log_clear() {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    g_problems.clear();
    g_errors.clear();
    g_partial.clear();
}

}  // namespace polyllama
