#include "polyllama_native.h"
#include "hardening.h"

#include "chat.h"
#include "common.h"
#include "fit.h"
#include "json-schema-to-grammar.h"
#include "json.h"
#include "llama-ext.h"
#include "log.h"

#include <atomic>
#include <limits>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

// defined in ggml.c (not in a public header); used to keep ggml's default abort output
extern "C" void ggml_print_backtrace(void);

namespace polyllama {

// ---- logging --------------------------------------------------------------------------

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
}  // namespace

// libcommon logs through a logger of its own (common/log.h), straight to stderr; its
// threshold follows ours, so that e.g. common_threadpools' "threadpool init" line appears
// only with set_log_level("info") / -v.
static void common_log_follow(int min_level) {
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

// ---- memory accounting ------------------------------------------------------------------

// libcommon's common_get_device_memory_data, but for one thing: its breakdown keeps a
// non-host buffer type only when its device is one the model lists, so the CPU's own
// extra buffers (ggml-cpu's AMX buffer: device CPU, not a host buffer) were dropped, and
// the estimate left out the AMX-repacked weights (95 of SmolLM2's 187 MiB). Here the same
// no-alloc load goes through context_device_memory, which counts the live context too:
// such buffers land on the host, so estimate and actual are counted alike.
bool estimate_device_memory(const char * path, const llama_model_params * mparams,
                            const llama_context_params * cparams,
                            std::vector<device_memory> & out, uint32_t & n_layer,
                            uint32_t & n_ctx_train, std::string & err) {
    llama_model * model = nullptr;
    llama_context * ctx = nullptr;
    try {
        llama_model_params mp = *mparams;
        mp.no_alloc  = true;                   // sizes only: nothing is allocated or read
        mp.load_mode = LLAMA_LOAD_MODE_NONE;
        model = llama_model_load_from_file(path, mp);
        if (model == nullptr) {
            throw std::runtime_error("failed to load model");
        }
        ctx = llama_init_from_model(model, *cparams);
        if (ctx == nullptr) {
            throw std::runtime_error("failed to create llama_context from model");
        }
        out = context_device_memory(ctx);
        size_t free = 0, total = 0;
        ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        if (cpu != nullptr) {
            ggml_backend_dev_memory(cpu, &free, &total);
        }
        device_memory & host = out.back();
        host.free  = (int64_t) free;
        host.total = (int64_t) total;
        for (size_t i = 0; i + 1 < out.size(); i++) {
            // as libcommon: a device that is no GPU and reports no memory (BLAS) uses the host's
            ggml_backend_dev_t dev = llama_model_get_device(model, (int) i);
            const auto type = ggml_backend_dev_type(dev);
            if (out[i].free == 0 && out[i].total == 0 && type != GGML_BACKEND_DEVICE_TYPE_GPU &&
                type != GGML_BACKEND_DEVICE_TYPE_IGPU) {
                out[i].free  = host.free;
                out[i].total = host.total;
            }
        }
        n_layer     = llama_model_n_layer(model) + (mparams->load_mtp ? llama_model_n_layer_nextn(model) : 0);
        n_ctx_train = llama_model_n_ctx_train(model);
        llama_free(ctx);
        llama_model_free(model);
        return true;
    } catch (const std::exception & e) {
        err = e.what();
    } catch (...) {
        err = "unknown C++ exception";
    }
    if (ctx != nullptr) {
        llama_free(ctx);
    }
    if (model != nullptr) {
        llama_model_free(model);
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

bool chat_parse_reply(int format, const std::string & generation_prompt, const std::string & parser,
                      const std::string & text, bool partial, std::string & message_json, std::string & err) {
    try {
        common_chat_parser_params params;
        params.format            = (common_chat_format) format;
        params.generation_prompt = generation_prompt;
        if (!parser.empty()) {
            params.parser.load(parser);
        }
        common_chat_msg msg = common_chat_parse(text, partial, params);
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

// ---- ggml RPC guard ------------------------------------------------------------------------

namespace {

// GGML_ABORT turned into an exception on a worker thread (see on_ggml_abort)
struct ggml_rpc_abort : std::runtime_error {
    using std::runtime_error::runtime_error;
};

thread_local bool        t_is_worker = false;   // set on remote_worker threads only
std::atomic<uint64_t>    g_failures{0};
std::mutex               g_failure_mutex;
std::string              g_last_failure;

bool from_ggml_rpc(const char * message) {
    return std::strstr(message, "ggml-rpc") != nullptr;
}

void on_ggml_abort(const char * message) {
    if (message != nullptr && from_ggml_rpc(message)) {
        if (t_is_worker) {
            // connect/handshake failures happen on the calling thread: unwind to the worker's
            // catch (ggml-rpc holds its locks through lock_guard, so they are released)
            throw ggml_rpc_abort(message);
        }
        // A dispatcher thread whose server went away: report it, then never return (ggml
        // would call abort() next). The thread holds no lock at this point.
        {
            std::lock_guard<std::mutex> lock(g_failure_mutex);
            g_last_failure = message;
        }
        g_failures.fetch_add(1);
        for (;;) {
            std::this_thread::sleep_for(std::chrono::hours(24));
        }
    }
    if (message != nullptr && abort_scope_active()) {
        // inside a load, context creation or tokenize on this thread (hardening.h): unwind to
        // the catch that turns it into a failed call
        throw ggml_abort_error(message);
    }
    // anything else: what ggml does without a callback; ggml_abort calls abort() after us
    fprintf(stderr, "%s\n", message ? message : "ggml_abort");
    ggml_print_backtrace();
}

// How long a call may still run after a dispatcher failed before it counts as blocked on it:
// a call that does not use the lost server finishes; one that does never will.
constexpr double k_lost_grace_s = 1.0;

}  // namespace

void remote_guard_install() {
    static std::once_flag once;
    std::call_once(once, [] { ggml_set_abort_callback(on_ggml_abort); });
}

std::string remote_last_failure() {
    std::lock_guard<std::mutex> lock(g_failure_mutex);
    return g_last_failure;
}

struct remote_worker {
    struct shared {
        std::mutex              mutex;
        std::condition_variable cv;
        std::function<void()>   job;
        bool                    has_job = false;
        bool                    done    = false;
        bool                    quit    = false;
        int                     status  = REMOTE_OK;
        std::string             err;
    };
    // the worker thread holds a reference too: an abandoned thread keeps its state alive
    std::shared_ptr<shared> st = std::make_shared<shared>();
    bool stuck = false;

    remote_worker() {
        std::thread([st = st] {
            t_is_worker = true;
            std::unique_lock<std::mutex> lock(st->mutex);
            for (;;) {
                st->cv.wait(lock, [&] { return st->has_job || st->quit; });
                if (st->quit) {
                    return;
                }
                std::function<void()> job = std::move(st->job);
                st->has_job = false;
                lock.unlock();
                int status = REMOTE_OK;
                std::string err;
                try {
                    job();
                } catch (const std::exception & e) {
                    status = REMOTE_ERROR;
                    err    = e.what();
                } catch (...) {
                    status = REMOTE_ERROR;
                    err    = "unknown C++ exception";
                }
                lock.lock();
                st->status = status;
                st->err    = std::move(err);
                st->done   = true;
                st->cv.notify_all();
            }
        }).detach();
    }

    int run(std::function<void()> job, double timeout_s, std::string & err) {
        if (stuck) {
            err = "an earlier call on this object is still blocked on a lost RPC server";
            return REMOTE_LOST;
        }
        using clock = std::chrono::steady_clock;
        const auto start = clock::now();
        const uint64_t failures_before = g_failures.load();
        clock::time_point failure_seen{};
        bool failed = false;
        std::unique_lock<std::mutex> lock(st->mutex);
        st->job     = std::move(job);
        st->has_job = true;
        st->done    = false;
        st->cv.notify_all();
        for (;;) {
            if (st->cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return st->done; })) {
                err = st->err;
                return st->status;
            }
            const auto now = clock::now();
            if (!failed && g_failures.load() != failures_before) {
                failed       = true;
                failure_seen = now;
            }
            if (failed && std::chrono::duration<double>(now - failure_seen).count() > k_lost_grace_s) {
                stuck = true;
                err   = remote_last_failure();
                return REMOTE_LOST;
            }
            if (timeout_s > 0 && std::chrono::duration<double>(now - start).count() > timeout_s) {
                stuck = true;
                err   = "no answer within " + std::to_string((int) timeout_s) + " s";
                return REMOTE_TIMEOUT;
            }
        }
    }
};

remote_worker * remote_worker_new() { return new remote_worker(); }

void remote_worker_release(remote_worker * w) {
    if (w == nullptr) {
        return;
    }
    if (!w->stuck) {
        std::lock_guard<std::mutex> lock(w->st->mutex);
        w->st->quit = true;
        w->st->cv.notify_all();
    }
    delete w;   // a stuck thread keeps the shared state alive on its own
}

int remote_model_load(remote_worker * w, const char * path, llama_model_params params,
                      llama_model ** out, double timeout_s, std::string & err) {
    *out = nullptr;
    // results go through shared slots: an abandoned job may still write them later
    auto slot = std::make_shared<llama_model *>(nullptr);
    const std::string path_copy = path;   // the caller's buffer may be gone if we give up
    int status = w->run([=] { *slot = llama_model_load_from_file(path_copy.c_str(), params); },
                        timeout_s, err);
    if (status == REMOTE_OK) {
        *out = *slot;
    }
    return status;
}

int remote_context_init(remote_worker * w, llama_model * model, llama_context_params params,
                        llama_context ** out, double timeout_s, std::string & err) {
    *out = nullptr;
    auto slot = std::make_shared<llama_context *>(nullptr);
    int status = w->run([=] { *slot = llama_init_from_model(model, params); }, timeout_s, err);
    if (status == REMOTE_OK) {
        *out = *slot;
    }
    return status;
}

int remote_decode(remote_worker * w, llama_context * ctx, llama_batch batch, int32_t * rc,
                  double timeout_s, std::string & err) {
    auto slot = std::make_shared<int32_t>(-1);
    // llama_decode returns before the backends finish; the wait for them (and the socket
    // I/O that can fail) would otherwise happen in llama_get_logits*, outside the guard
    int status = w->run([=] {
        *slot = llama_decode(ctx, batch);
        llama_synchronize(ctx);
    }, timeout_s, err);
    *rc = *slot;
    return status;
}

int remote_memory_clear(remote_worker * w, llama_context * ctx, double timeout_s, std::string & err) {
    return w->run([=] { llama_memory_clear(llama_get_memory(ctx), true); }, timeout_s, err);
}

int remote_context_free(remote_worker * w, llama_context * ctx, double timeout_s, std::string & err) {
    return w->run([=] { llama_free(ctx); }, timeout_s, err);
}

int remote_model_free(remote_worker * w, llama_model * model, double timeout_s, std::string & err) {
    return w->run([=] { llama_model_free(model); }, timeout_s, err);
}

int remote_context_memory(remote_worker * w, const llama_context * ctx,
                          std::vector<device_memory> & out, double timeout_s, std::string & err) {
    auto slot = std::make_shared<std::vector<device_memory>>();
    int status = w->run([=] { *slot = context_device_memory(ctx); }, timeout_s, err);
    if (status == REMOTE_OK) {
        out = *slot;
    }
    return status;
}

namespace {
int run_once(std::function<void()> job, double timeout_s, std::string & err) {
    remote_worker * w = remote_worker_new();
    int status = w->run(std::move(job), timeout_s, err);
    remote_worker_release(w);
    return status;
}
}  // namespace

int remote_device_memory(ggml_backend_dev_t dev, size_t * free, size_t * total, double timeout_s,
                         std::string & err) {
    auto slot = std::make_shared<std::pair<size_t, size_t>>(0, 0);
    int status = run_once([=] { ggml_backend_dev_memory(dev, &slot->first, &slot->second); },
                          timeout_s, err);
    *free  = slot->first;
    *total = slot->second;
    return status;
}

int remote_add_server(void * add_server_fn, const char * endpoint, ggml_backend_reg_t * out,
                      double timeout_s, std::string & err) {
    using add_server_t = ggml_backend_reg_t (*)(const char *);
    auto add_server = (add_server_t) add_server_fn;
    auto slot = std::make_shared<ggml_backend_reg_t>(nullptr);
    const std::string ep = endpoint;
    int status = run_once([=] {
        ggml_backend_reg_t reg = add_server(ep.c_str());
        if (reg == nullptr) {
            throw std::runtime_error("the server reports no device");
        }
        // ggml_backend_rpc_add_server returns the same registry for the same endpoint;
        // register it (and with it its devices) only the first time
        for (size_t i = 0; i < ggml_backend_reg_count(); i++) {
            if (ggml_backend_reg_get(i) == reg) {
                *slot = reg;
                return;
            }
        }
        ggml_backend_register(reg);
        *slot = reg;
    }, timeout_s, err);
    *out = status == REMOTE_OK ? *slot : nullptr;
    return status;
}

int remote_fit_params(const char * path, llama_model_params * mparams, llama_context_params * cparams,
                      float * tensor_split, llama_model_tensor_buft_override * overrides,
                      size_t * margins, uint32_t n_ctx_min, int * status, double timeout_s,
                      std::string & err) {
    // the caller's buffers are written by the job: on REMOTE_LOST/TIMEOUT the caller must
    // leak them (they may still be written later)
    auto fit_err = std::make_shared<std::string>();
    auto fit_status = std::make_shared<int>(COMMON_PARAMS_FIT_STATUS_ERROR);
    int rs = run_once([=] {
        *fit_status = fit_params(path, mparams, cparams, tensor_split, overrides, margins,
                                 n_ctx_min, *fit_err);
    }, timeout_s, err);
    *status = *fit_status;
    if (rs == REMOTE_OK && !fit_err->empty()) {
        err = *fit_err;
    }
    return rs;
}

}  // namespace polyllama


namespace polyllama {

// ---- greedy pick -----------------------------------------------------------------------
// Blocks of 256 floats: four independent 8-wide running maxima per block (GCC/Clang vector
// extensions, lowered to SSE/AVX/NEON as the target allows; on x86-64 an AVX2 clone is
// picked at load time when the CPU has it), reduced to the block's maximum, which is
// compared with the running maximum once per block. Only a block whose maximum is strictly
// larger than every earlier one can hold the answer, so the first index of the maximum lies
// in the last such block, and scanning that block alone keeps greedy's first-on-ties order.
// NaN never wins a comparison, so it is never picked (except as index 0 when nothing else
// is a number). `exclude` is overwritten with the lowest float for the scan, then restored.
// Measured on this 2-core build machine (AVX-512 CPU, AVX2 clone): 2.8 µs for 49,152 floats
// and 7.6 µs for 128,256, against 14 and 38 µs for an 8-lane scalar scan.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define POLYLLAMA_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define POLYLLAMA_CPU_CLONES
#endif

POLYLLAMA_CPU_CLONES
static int argmax_blocks(const float * p, int n, int * tail) noexcept {
    constexpr int block = 256;
    float best   = -std::numeric_limits<float>::infinity();
    int   best_b = -1;
    int   i      = 0;
#if defined(__GNUC__)
    typedef float v8 __attribute__((vector_size(32)));
    for (; i + block <= n; i += block) {
        v8 m0, m1, m2, m3, x;
        std::memcpy(&m0, p + i, sizeof(v8));
        std::memcpy(&m1, p + i + 8, sizeof(v8));
        std::memcpy(&m2, p + i + 16, sizeof(v8));
        std::memcpy(&m3, p + i + 24, sizeof(v8));
        for (int k = 32; k < block; k += 32) {
            std::memcpy(&x, p + i + k, sizeof(v8));      m0 = x > m0 ? x : m0;
            std::memcpy(&x, p + i + k + 8, sizeof(v8));  m1 = x > m1 ? x : m1;
            std::memcpy(&x, p + i + k + 16, sizeof(v8)); m2 = x > m2 ? x : m2;
            std::memcpy(&x, p + i + k + 24, sizeof(v8)); m3 = x > m3 ? x : m3;
        }
        m0 = m1 > m0 ? m1 : m0;
        m2 = m3 > m2 ? m3 : m2;
        m0 = m2 > m0 ? m2 : m0;
        float bm = m0[0];
        for (int k = 1; k < 8; k++) {
            bm = m0[k] > bm ? m0[k] : bm;
        }
        if (bm > best) {
            best   = bm;
            best_b = i / block;
        }
    }
#endif
    *tail = i;
    int arg = 0;
    if (best_b >= 0) {
        for (int j = best_b * block; j < best_b * block + block; j++) {
            if (p[j] == best) {
                arg = j;
                break;
            }
        }
    }
    return arg;
}

bool device_supports_tensor_bytes(size_t dev_index, uint64_t nbytes) noexcept {
    if (dev_index >= ggml_backend_dev_count()) {
        return false;
    }
    ggml_init_params params = { ggml_tensor_overhead() * 2, nullptr, /*no_alloc*/ true };
    ggml_context * ctx = ggml_init(params);
    if (ctx == nullptr) {
        return false;
    }
    ggml_tensor * t = ggml_new_tensor_1d(ctx, GGML_TYPE_F16, (int64_t) ((nbytes + 1) / 2));
    const bool ok = ggml_backend_dev_supports_op(ggml_backend_dev_get(dev_index), t);
    ggml_free(ctx);
    return ok;
}

struct threadpools {
    common_threadpools pools;
};

threadpools * threadpools_attach(llama_context * ctx, int n_threads, int n_threads_batch,
                                 std::string & err) noexcept {
    try {
        common_params params;
        params.cpuparams.n_threads       = n_threads;
        params.cpuparams_batch.n_threads = n_threads_batch;
        auto * tp = new threadpools();
        tp->pools.init(ctx, params);   // attaches them to ctx (llama_attach_threadpool)
        return tp;
    } catch (const std::exception & e) {
        err = e.what();
    } catch (...) {
        err = "unknown error";
    }
    return nullptr;
}

void threadpools_free(threadpools * tp) noexcept {
    delete tp;
}

int argmax_f32(float * p, int n, int exclude) noexcept {
    if (n <= 0) {
        return 0;
    }
    const bool  excl  = exclude >= 0 && exclude < n;
    const float saved = excl ? p[exclude] : 0.0f;
    if (excl) {
        p[exclude] = -std::numeric_limits<float>::max();
    }
    int tail = 0;
    int arg  = argmax_blocks(p, n, &tail);
    float best = p[arg];
    for (int j = tail; j < n; j++) {   // what follows the last whole block (or all of p)
        if (p[j] > best) {
            best = p[j];
            arg  = j;
        }
    }
    if (excl) {
        p[exclude] = saved;
    }
    return arg;
}

}  // namespace polyllama
