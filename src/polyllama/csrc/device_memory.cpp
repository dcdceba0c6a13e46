// See device_memory.h.
#include "device_memory.h"
#include "guard.h"

#include "fit.h"
#include "llama-ext.h"

#include <stdexcept>

namespace polyllama {

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
    const bool ok = guarded(err, [&] {
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
    });
    if (ctx != nullptr) {
        llama_free(ctx);
    }
    if (model != nullptr) {
        llama_model_free(model);
    }
    return ok;
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
    int status = COMMON_PARAMS_FIT_STATUS_ERROR;
    guarded(err, [&] {
        status = (int) common_fit_params(path, mparams, cparams, tensor_split, overrides, margins,
                                         n_ctx_min, nullptr, GGML_LOG_LEVEL_ERROR);
    });
    return status;
}

size_t max_tensor_buft_overrides() { return llama_max_tensor_buft_overrides(); }

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

}  // namespace polyllama
