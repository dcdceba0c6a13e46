// ggml RPC: a lost remote device must not take the process down.
//
// ggml-rpc talks to each server from one "dispatcher" thread of its own. When a server dies
// mid-call, that thread hits GGML_ABORT (abort() of the whole process), and the thread that
// issued the call waits forever for an answer that will never come. We cannot change that
// code, so the guard works around it:
//   * the ggml abort callback parks a dispatcher thread that reports a dead server (it never
//     returns, so ggml never reaches abort()) and counts the failure;
//   * calls that can talk to a server run on a worker thread (remote_worker); the caller waits
//     for it, and gives up on it once a failure has been counted and the call has not
//     finished shortly after (REMOTE_LOST), or after a timeout (REMOTE_TIMEOUT). The
//     abandoned worker stays blocked for the life of the process, and so must everything it
//     was using: the caller must then never free that context or model (it leaks);
//   * an abort raised by ggml-rpc on a worker thread itself (connect or handshake failure,
//     which happen on the calling thread) is thrown as a C++ exception, unwound through
//     ggml-rpc's RAII locks, and reported as REMOTE_ERROR.
// Aborts that do not come from ggml-rpc keep ggml's default behaviour (message, backtrace,
// abort()), except inside an abort scope (hardening.h), where they are thrown.
#pragma once

#include "device_memory.h"

#include "ggml-backend.h"
#include "llama.h"

#include <cstdint>
#include <string>
#include <vector>

namespace polyllama {

enum remote_status { REMOTE_OK = 0, REMOTE_ERROR = 1, REMOTE_LOST = 2, REMOTE_TIMEOUT = 3 };

struct remote_worker;

void            remote_guard_install();                    // idempotent
remote_worker * remote_worker_new();
void            remote_worker_release(remote_worker * w);  // leaks the thread if it is stuck

// ---- one call per operation on a model or context, "via" its worker ----------------------
// A model with remote devices has a worker (and so has each of its contexts): the call runs
// on that thread under the guard. A model without one passes w == NULL and the call runs
// here, as it would without the guard: nothing then blocks on a server, and no thread
// switch is paid per token. Either way the status is a remote_status, REMOTE_OK for a
// call that ran here.
// load and context creation run inside an abort scope when they run here (hardening.h);
// NULL in *out with REMOTE_OK is llama.cpp's own failure (its log says why).
int model_load_via(remote_worker * w, const char * path, llama_model_params params,
                   llama_model ** out, double timeout_s, std::string & err);
int context_init_via(remote_worker * w, llama_model * model, llama_context_params params,
                     llama_context ** out, double timeout_s, std::string & err);
// *rc: llama_decode's result (-1 with err when it threw). On the worker the call also waits
// for the backends (llama_synchronize): otherwise the socket I/O that can fail would happen
// in llama_get_logits*, outside the guard.
int decode_via(remote_worker * w, llama_context * ctx, llama_batch batch, int32_t * rc,
               double timeout_s, std::string & err);
int memory_clear_via(remote_worker * w, llama_context * ctx, double timeout_s, std::string & err);
int context_free_via(remote_worker * w, llama_context * ctx, double timeout_s, std::string & err);
int model_free_via(remote_worker * w, llama_model * model, double timeout_s, std::string & err);
int context_memory_via(remote_worker * w, const llama_context * ctx,
                       std::vector<device_memory> & out, double timeout_s, std::string & err);

// ---- calls made before a model exists: on a worker of their own --------------------------
int remote_device_memory(ggml_backend_dev_t dev, size_t * free, size_t * total, double timeout_s,
                         std::string & err);
// add_server_fn: ggml_backend_rpc_add_server as returned by the RPC registry's proc address.
// Registers the server's registry (and so its devices) with ggml once per endpoint.
int remote_add_server(void * add_server_fn, const char * endpoint, ggml_backend_reg_t * out,
                      double timeout_s, std::string & err);
// fit_params (device_memory.h) on a worker of its own when timeout_s > 0 (the device list
// holds remote devices), else here inside an abort scope. *status: fit_params' result.
// On REMOTE_LOST/TIMEOUT the job may still write the caller's buffers later: the caller
// must leak them.
int fit_params_via(const char * path, llama_model_params * mparams, llama_context_params * cparams,
                   float * tensor_split, llama_model_tensor_buft_override * overrides,
                   size_t * margins, uint32_t n_ctx_min, int * status, double timeout_s,
                   std::string & err);

}  // namespace polyllama
