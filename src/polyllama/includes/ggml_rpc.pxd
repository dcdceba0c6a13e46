# Declarations from ggml-rpc.h, everything it declares (pinned llama.cpp:
# thirdparty/llama.cpp/ggml/include/ggml-rpc.h).

from libc.stdint cimport uint32_t

# ggml-rpc.h #includes ggml-backend.h: cimport * of this module brings in its names too
from polyllama.includes.ggml_backend cimport *


cdef extern from "ggml-rpc.h" nogil:

    const int RPC_PROTO_MAJOR_VERSION
    const int RPC_PROTO_MINOR_VERSION
    const int RPC_PROTO_PATCH_VERSION

    const int GGML_RPC_MAX_SERVERS

    # backend API
    ggml_backend_t ggml_backend_rpc_init(const char * endpoint, uint32_t device)
    bint ggml_backend_is_rpc(ggml_backend_t backend)

    ggml_backend_buffer_type_t ggml_backend_rpc_buffer_type(const char * endpoint, uint32_t device)

    void ggml_backend_rpc_get_device_memory(const char * endpoint, uint32_t device, size_t * free, size_t * total)

    void ggml_backend_rpc_start_server(const char * endpoint, const char * cache_dir,
                                       size_t n_threads, size_t n_devices, ggml_backend_dev_t * devices)

    ggml_backend_reg_t ggml_backend_rpc_reg()
    ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint)


# Not in the header: the type of ggml_backend_rpc_start_server, for calling it through the
# RPC registry's ggml_backend_reg_get_proc_address. A build without GGML_RPC has no such
# symbol to link, so polyllama never calls it by name; ggml-rpc.h itself (and so the
# RPC_PROTO_* constants) is in every build.
ctypedef void (*ggml_backend_rpc_start_server_t)(const char * endpoint, const char * cache_dir,
                                                 size_t n_threads, size_t n_devices,
                                                 ggml_backend_dev_t * devices) noexcept nogil
