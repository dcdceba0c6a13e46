// See remote.h.
#include "remote.h"
#include "guard.h"
#include "hardening.h"

#include "fit.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

// defined in ggml.c (not in a public header); used to keep ggml's default abort output
extern "C" void ggml_print_backtrace(void);

namespace polyllama {

namespace {

// GGML_ABORT turned into an exception on a worker thread (see on_ggml_abort)
struct ggml_rpc_abort : std::runtime_error {
    using std::runtime_error::runtime_error;
};

thread_local bool        t_is_worker = false;   // set on remote_worker threads only
std::atomic<uint64_t>    g_failures{0};         // dispatcher threads parked so far
std::mutex               g_failure_mutex;
std::string              g_last_failure;        // ggml's message for the last one

bool from_ggml_rpc(const char * message) {
    return std::strstr(message, "ggml-rpc") != nullptr;
}

std::string last_failure() {
    std::lock_guard<std::mutex> lock(g_failure_mutex);
    return g_last_failure;
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
                std::string err;
                const int status = guarded(err, job) ? REMOTE_OK : REMOTE_ERROR;
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
                err   = last_failure();
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

// Results of jobs on a worker go through shared slots, and the jobs copy what they read
// from the caller: a job given up on may still run, long after the caller has returned.

int model_load_via(remote_worker * w, const char * path, llama_model_params params,
                   llama_model ** out, double timeout_s, std::string & err) {
    if (w == nullptr) {
        *out = model_load_guarded(path, params, err);
        return REMOTE_OK;
    }
    *out = nullptr;
    auto slot = std::make_shared<llama_model *>(nullptr);
    const std::string path_copy = path;
    int status = w->run([=] { *slot = llama_model_load_from_file(path_copy.c_str(), params); },
                        timeout_s, err);
    if (status == REMOTE_OK) {
        *out = *slot;
    }
    return status;
}

int context_init_via(remote_worker * w, llama_model * model, llama_context_params params,
                     llama_context ** out, double timeout_s, std::string & err) {
    if (w == nullptr) {
        *out = context_init_guarded(model, params, err);
        return REMOTE_OK;
    }
    *out = nullptr;
    auto slot = std::make_shared<llama_context *>(nullptr);
    int status = w->run([=] { *slot = llama_init_from_model(model, params); }, timeout_s, err);
    if (status == REMOTE_OK) {
        *out = *slot;
    }
    return status;
}

int decode_via(remote_worker * w, llama_context * ctx, llama_batch batch, int32_t * rc,
               double timeout_s, std::string & err) {
    if (w == nullptr) {
        *rc = -1;
        guarded(err, [&] { *rc = llama_decode(ctx, batch); });
        return REMOTE_OK;
    }
    auto slot = std::make_shared<int32_t>(-1);
    int status = w->run([=] {
        *slot = llama_decode(ctx, batch);
        llama_synchronize(ctx);
    }, timeout_s, err);
    *rc = *slot;
    return status;
}

int memory_clear_via(remote_worker * w, llama_context * ctx, double timeout_s, std::string & err) {
    if (w == nullptr) {
        llama_memory_clear(llama_get_memory(ctx), true);
        return REMOTE_OK;
    }
    return w->run([=] { llama_memory_clear(llama_get_memory(ctx), true); }, timeout_s, err);
}

int context_free_via(remote_worker * w, llama_context * ctx, double timeout_s, std::string & err) {
    if (w == nullptr) {
        llama_free(ctx);
        return REMOTE_OK;
    }
    return w->run([=] { llama_free(ctx); }, timeout_s, err);
}

int model_free_via(remote_worker * w, llama_model * model, double timeout_s, std::string & err) {
    if (w == nullptr) {
        llama_model_free(model);
        return REMOTE_OK;
    }
    return w->run([=] { llama_model_free(model); }, timeout_s, err);
}

int context_memory_via(remote_worker * w, const llama_context * ctx,
                       std::vector<device_memory> & out, double timeout_s, std::string & err) {
    if (w == nullptr) {
        out = context_device_memory(ctx);
        return REMOTE_OK;
    }
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

int fit_params_via(const char * path, llama_model_params * mparams, llama_context_params * cparams,
                   float * tensor_split, llama_model_tensor_buft_override * overrides,
                   size_t * margins, uint32_t n_ctx_min, int * status, double timeout_s,
                   std::string & err) {
    if (timeout_s <= 0) {
        abort_scope scope;
        *status = fit_params(path, mparams, cparams, tensor_split, overrides, margins, n_ctx_min, err);
        return REMOTE_OK;
    }
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
