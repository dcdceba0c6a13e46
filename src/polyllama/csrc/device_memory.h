// What a model and its context take on each device, and fitting them to what is free
// (libcommon's common/fit.h), so that placement can be decided before anything is allocated.
#pragma once

#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace polyllama {

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

// Whether device `dev_index` (ggml_backend_dev_get) accepts an F16 tensor of `nbytes` bytes,
// asked through ggml_backend_dev_supports_op on an unallocated tensor. ggml-vulkan refuses
// tensors larger than one storage buffer can address; a KV cache layer that large, once
// allocated there, makes ggml's scheduler abort (GGML_ABORT "pre-allocated tensor ... in a
// buffer that cannot run the operation"). Checked before a context is made.
bool device_supports_tensor_bytes(size_t dev_index, uint64_t nbytes) noexcept;

}  // namespace polyllama
