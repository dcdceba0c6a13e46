# Declarations from ggml-backend.h, one to one (pinned llama.cpp:
# thirdparty/llama.cpp/ggml/include/ggml-backend.h). Every GGML_API function, enum, struct and
# typedef of the header is here, in the header's order, with the header's names.
#
# Two C names are both a type tag and a function; Cython has one namespace, so the function keeps
# the C name and the type gets a Cython-only alias that still refers to the C type:
#   enum ggml_backend_dev_type    -> ggml_backend_dev_type_t    (function ggml_backend_dev_type())
#   struct ggml_backend_graph_copy -> ggml_backend_graph_copy_t (function ggml_backend_graph_copy())
# The `async` field of ggml_backend_dev_caps is `async_` (a Python keyword).
#
# C `bool` is `bint`, except inside function-pointer types, where it is `cbool` (see ggml.pxd).

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libcpp cimport bool as cbool

# ggml-backend.h #includes ggml.h: cimport * of this module brings in ggml.pxd's names too
from polyllama.includes.ggml cimport *


cdef extern from "ggml-backend.h" nogil:

    cdef struct ggml_backend_buffer_type
    cdef struct ggml_backend_buffer
    cdef struct ggml_backend_event
    cdef struct ggml_backend
    cdef struct ggml_backend_reg
    cdef struct ggml_backend_device

    ctypedef ggml_backend_buffer_type * ggml_backend_buffer_type_t
    ctypedef ggml_backend_buffer * ggml_backend_buffer_t
    ctypedef ggml_backend_event * ggml_backend_event_t
    ctypedef ggml_backend * ggml_backend_t
    ctypedef void * ggml_backend_graph_plan_t
    ctypedef ggml_backend_reg * ggml_backend_reg_t
    ctypedef ggml_backend_device * ggml_backend_dev_t

    #
    # Backend buffer type
    #

    const char *          ggml_backend_buft_name          (ggml_backend_buffer_type_t buft)
    ggml_backend_buffer_t ggml_backend_buft_alloc_buffer  (ggml_backend_buffer_type_t buft, size_t size)
    size_t                ggml_backend_buft_get_alignment (ggml_backend_buffer_type_t buft)
    size_t                ggml_backend_buft_get_max_size  (ggml_backend_buffer_type_t buft)
    size_t                ggml_backend_buft_get_alloc_size(ggml_backend_buffer_type_t buft, const ggml_tensor * tensor)
    bint                  ggml_backend_buft_is_host       (ggml_backend_buffer_type_t buft)
    ggml_backend_dev_t    ggml_backend_buft_get_device    (ggml_backend_buffer_type_t buft)

    #
    # Backend buffer
    #

    enum ggml_backend_buffer_usage:
        GGML_BACKEND_BUFFER_USAGE_ANY      # 0
        GGML_BACKEND_BUFFER_USAGE_WEIGHTS  # 1
        GGML_BACKEND_BUFFER_USAGE_COMPUTE  # 2

    const char *               ggml_backend_buffer_name          (ggml_backend_buffer_t buffer)
    void                       ggml_backend_buffer_free          (ggml_backend_buffer_t buffer)
    void *                     ggml_backend_buffer_get_base      (ggml_backend_buffer_t buffer)
    size_t                     ggml_backend_buffer_get_size      (ggml_backend_buffer_t buffer)
    ggml_status                ggml_backend_buffer_init_tensor   (ggml_backend_buffer_t buffer, ggml_tensor * tensor)
    size_t                     ggml_backend_buffer_get_alignment (ggml_backend_buffer_t buffer)
    size_t                     ggml_backend_buffer_get_max_size  (ggml_backend_buffer_t buffer)
    size_t                     ggml_backend_buffer_get_alloc_size(ggml_backend_buffer_t buffer, const ggml_tensor * tensor)
    void                       ggml_backend_buffer_clear         (ggml_backend_buffer_t buffer, uint8_t value)
    bint                       ggml_backend_buffer_is_host       (ggml_backend_buffer_t buffer)
    void                       ggml_backend_buffer_set_usage     (ggml_backend_buffer_t buffer, ggml_backend_buffer_usage usage)
    ggml_backend_buffer_usage  ggml_backend_buffer_get_usage     (ggml_backend_buffer_t buffer)
    ggml_backend_buffer_type_t ggml_backend_buffer_get_type      (ggml_backend_buffer_t buffer)
    void                       ggml_backend_buffer_reset         (ggml_backend_buffer_t buffer)

    # tensor copy between different backends
    void ggml_backend_tensor_copy(const ggml_tensor * src, ggml_tensor * dst)

    #
    # Backend (stream)
    #

    ggml_guid_t  ggml_backend_guid(ggml_backend_t backend)
    const char * ggml_backend_name(ggml_backend_t backend)
    void         ggml_backend_free(ggml_backend_t backend)

    ggml_backend_buffer_type_t ggml_backend_get_default_buffer_type(ggml_backend_t backend)
    ggml_backend_buffer_t      ggml_backend_alloc_buffer(ggml_backend_t backend, size_t size)
    size_t                     ggml_backend_get_alignment(ggml_backend_t backend)
    size_t                     ggml_backend_get_max_size(ggml_backend_t backend)

    void ggml_backend_tensor_set_async   (ggml_backend_t backend,       ggml_tensor * tensor, const void * data, size_t offset, size_t size)
    void ggml_backend_tensor_get_async   (ggml_backend_t backend, const ggml_tensor * tensor,       void * data, size_t offset, size_t size)
    void ggml_backend_tensor_set_2d_async(ggml_backend_t backend,       ggml_tensor * tensor, const void * data, size_t offset, size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data)
    void ggml_backend_tensor_get_2d_async(ggml_backend_t backend, const ggml_tensor * tensor,       void * data, size_t offset, size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data)

    # "offset" refers to the offset in tensor->data for setting/getting data
    void ggml_backend_tensor_set   (      ggml_tensor * tensor, const void * data, size_t offset, size_t size)
    void ggml_backend_tensor_get   (const ggml_tensor * tensor,       void * data, size_t offset, size_t size)
    void ggml_backend_tensor_set_2d(      ggml_tensor * tensor, const void * data, size_t offset, size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data)
    void ggml_backend_tensor_get_2d(const ggml_tensor * tensor,       void * data, size_t offset, size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data)
    void ggml_backend_tensor_memset(      ggml_tensor * tensor,     uint8_t value, size_t offset, size_t size)

    void ggml_backend_synchronize(ggml_backend_t backend)

    ggml_backend_graph_plan_t ggml_backend_graph_plan_create(ggml_backend_t backend, ggml_cgraph * cgraph)
    void                      ggml_backend_graph_plan_free  (ggml_backend_t backend, ggml_backend_graph_plan_t plan)

    ggml_status ggml_backend_graph_plan_compute (ggml_backend_t backend, ggml_backend_graph_plan_t plan)
    ggml_status ggml_backend_graph_compute      (ggml_backend_t backend, ggml_cgraph * cgraph)
    ggml_status ggml_backend_graph_compute_async(ggml_backend_t backend, ggml_cgraph * cgraph)

    # NOTE: will be removed, use device version instead
    bint ggml_backend_supports_op(ggml_backend_t backend, const ggml_tensor * op)
    bint ggml_backend_supports_buft(ggml_backend_t backend, ggml_backend_buffer_type_t buft)
    bint ggml_backend_offload_op(ggml_backend_t backend, const ggml_tensor * op)

    # asynchronous copy
    # the copy is performed after all the currently queued operations in backend_src
    # backend_dst will wait for the copy to complete before performing other operations
    # automatic fallback to sync copy if async is not supported
    void ggml_backend_tensor_copy_async(ggml_backend_t backend_src, ggml_backend_t backend_dst, const ggml_tensor * src, ggml_tensor * dst)

    ggml_backend_dev_t ggml_backend_get_device(ggml_backend_t backend)

    #
    # Events
    #

    ggml_backend_event_t ggml_backend_event_new(ggml_backend_dev_t device)
    void                 ggml_backend_event_free(ggml_backend_event_t event)
    void                 ggml_backend_event_record(ggml_backend_event_t event, ggml_backend_t backend)
    void                 ggml_backend_event_synchronize(ggml_backend_event_t event)
    void                 ggml_backend_event_wait(ggml_backend_t backend, ggml_backend_event_t event)

    #
    # Backend device
    #

    # C name: enum ggml_backend_dev_type (the name ggml_backend_dev_type is the function below)
    enum ggml_backend_dev_type_t "ggml_backend_dev_type":
        GGML_BACKEND_DEVICE_TYPE_CPU    # CPU device using system memory
        GGML_BACKEND_DEVICE_TYPE_GPU    # GPU device using dedicated memory
        GGML_BACKEND_DEVICE_TYPE_IGPU   # integrated GPU device using host memory
        GGML_BACKEND_DEVICE_TYPE_ACCEL  # accelerator devices intended to be used together with the CPU backend (e.g. BLAS or AMX)
        GGML_BACKEND_DEVICE_TYPE_META   # "meta" device wrapping multiple other devices for tensor parallelism

    # functionality supported by the device
    struct ggml_backend_dev_caps:
        bint async_ "async"         # asynchronous operations
        bint host_buffer            # pinned host buffer
        bint buffer_from_host_ptr   # creating buffers from host ptr
        bint events                 # event synchronization
        bint mmap_support           # mmap is supported for loading

    # all the device properties
    struct ggml_backend_dev_props:
        const char * name                # device name
        const char * description         # device description
        size_t memory_free               # device free memory in bytes
        size_t memory_total              # device total memory in bytes
        ggml_backend_dev_type_t type     # device type
        # device id
        #   for PCI devices, the lower-case PCI bus id formatted as "domain:bus:device.function" (e.g. "0000:c1:00.0")
        #   if the id is unknown, NULL
        const char * device_id
        ggml_backend_dev_caps caps       # device capabilities

    const char *                ggml_backend_dev_name(ggml_backend_dev_t device)
    const char *                ggml_backend_dev_description(ggml_backend_dev_t device)
    void                        ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total)
    ggml_backend_dev_type_t     ggml_backend_dev_type(ggml_backend_dev_t device)
    void                        ggml_backend_dev_get_props(ggml_backend_dev_t device, ggml_backend_dev_props * props)
    ggml_backend_reg_t          ggml_backend_dev_backend_reg(ggml_backend_dev_t device)
    ggml_backend_t              ggml_backend_dev_init(ggml_backend_dev_t device, const char * params)
    ggml_backend_buffer_type_t  ggml_backend_dev_buffer_type(ggml_backend_dev_t device)
    ggml_backend_buffer_type_t  ggml_backend_dev_host_buffer_type(ggml_backend_dev_t device)
    ggml_backend_buffer_t       ggml_backend_dev_buffer_from_host_ptr(ggml_backend_dev_t device, void * ptr, size_t size, size_t max_tensor_size)

    bint                        ggml_backend_dev_supports_op(ggml_backend_dev_t device, const ggml_tensor * op)
    bint                        ggml_backend_dev_supports_buft(ggml_backend_dev_t device, ggml_backend_buffer_type_t buft)
    bint                        ggml_backend_dev_offload_op(ggml_backend_dev_t device, const ggml_tensor * op)

    #
    # Backend (reg)
    #

    const char *       ggml_backend_reg_name(ggml_backend_reg_t reg)
    size_t             ggml_backend_reg_dev_count(ggml_backend_reg_t reg)
    ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index)
    void *             ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name)

    # Common functions that may be obtained using ggml_backend_reg_get_proc_address

    # Context management and operations for faster communication between backends, used for tensor parallelism (meta backend)
    ctypedef void * (*ggml_backend_comm_init_t)(ggml_backend_t * backends, size_t n_backends) noexcept
    ctypedef void   (*ggml_backend_comm_free_t)(void * comm_ctx) noexcept
    ctypedef cbool  (*ggml_backend_comm_allreduce_tensor_t)(void * comm_ctx, ggml_tensor ** tensors) noexcept

    # Split buffer type for tensor parallelism (old)
    ctypedef ggml_backend_buffer_type_t   (*ggml_backend_split_buffer_type_t)(int main_device, const float * tensor_split) noexcept
    # Set the number of threads for the backend
    ctypedef void                         (*ggml_backend_set_n_threads_t)(ggml_backend_t backend, int n_threads) noexcept
    # Get additional buffer types provided by the device (returns a NULL-terminated array)
    ctypedef ggml_backend_buffer_type_t * (*ggml_backend_dev_get_extra_bufts_t)(ggml_backend_dev_t device) noexcept
    # Set the abort callback for the backend
    ctypedef void                         (*ggml_backend_set_abort_callback_t)(ggml_backend_t backend, ggml_abort_callback abort_callback, void * abort_callback_data) noexcept
    # Get a list of feature flags supported by the backend (returns a NULL-terminated array)
    struct ggml_backend_feature:
        const char * name
        const char * value
    ctypedef ggml_backend_feature * (*ggml_backend_get_features_t)(ggml_backend_reg_t reg) noexcept

    #
    # Backend registry
    #

    void ggml_backend_register(ggml_backend_reg_t reg)

    void ggml_backend_device_register(ggml_backend_dev_t device)

    # Backend (reg) enumeration
    size_t             ggml_backend_reg_count()
    ggml_backend_reg_t ggml_backend_reg_get(size_t index)
    ggml_backend_reg_t ggml_backend_reg_by_name(const char * name)

    # Device enumeration
    size_t             ggml_backend_dev_count()
    ggml_backend_dev_t ggml_backend_dev_get(size_t index)
    ggml_backend_dev_t ggml_backend_dev_by_name(const char * name)
    ggml_backend_dev_t ggml_backend_dev_by_type(ggml_backend_dev_type_t type)

    # Direct backend (stream) initialization
    # = ggml_backend_dev_init(ggml_backend_dev_by_name(name), params)
    ggml_backend_t ggml_backend_init_by_name(const char * name, const char * params)
    # = ggml_backend_dev_init(ggml_backend_dev_by_type(type), params)
    ggml_backend_t ggml_backend_init_by_type(ggml_backend_dev_type_t type, const char * params)
    # = ggml_backend_dev_init(ggml_backend_dev_by_type(GPU) OR ggml_backend_dev_by_type(CPU), NULL)
    ggml_backend_t ggml_backend_init_best()

    # Load a backend from a dynamic library and register it
    ggml_backend_reg_t ggml_backend_load(const char * path)
    # Unload a backend if loaded dynamically and unregister it
    void               ggml_backend_unload(ggml_backend_reg_t reg)
    # Load all known backends from dynamic libraries
    void               ggml_backend_load_all()
    void               ggml_backend_load_all_from_path(const char * dir_path)

    #
    # Backend scheduler
    #
    # The backend scheduler allows for multiple backend devices to be used together
    # Handles compute buffer allocation, assignment of tensors to backends, and copying of tensors between backends
    # The backends are selected based on:
    # - the backend that supports the operation
    # - the location of the pre-allocated tensors (e.g. the weights)

    cdef struct ggml_backend_sched
    ctypedef ggml_backend_sched * ggml_backend_sched_t

    # Evaluation callback for each node in the graph (set with ggml_backend_sched_set_eval_callback)
    # when ask == true, the scheduler wants to know if the user wants to observe this node
    # this allows the scheduler to batch nodes together in order to evaluate them in a single call
    #
    # when ask == false, the scheduler is passing the node tensor to the user for observation
    # if the user returns false, the scheduler will cancel the graph compute
    ctypedef cbool (*ggml_backend_sched_eval_callback)(ggml_tensor * t, cbool ask, void * user_data) noexcept

    # Initialize a backend scheduler, backends with low index are given priority over backends with high index
    ggml_backend_sched_t ggml_backend_sched_new(ggml_backend_t * backends, ggml_backend_buffer_type_t * bufts, int n_backends, size_t graph_size, bint parallel, bint op_offload)
    void                 ggml_backend_sched_free(ggml_backend_sched_t sched)

    # Initialize backend buffers from a measure graph
    void                 ggml_backend_sched_reserve_size(ggml_backend_sched_t sched, ggml_cgraph * measure_graph, size_t * sizes)
    bint                 ggml_backend_sched_reserve(ggml_backend_sched_t sched, ggml_cgraph * measure_graph)  # returns success

    int                  ggml_backend_sched_get_n_backends(ggml_backend_sched_t sched)
    ggml_backend_t       ggml_backend_sched_get_backend(ggml_backend_sched_t sched, int i)

    # Get the number of splits of the last graph
    int                  ggml_backend_sched_get_n_splits(ggml_backend_sched_t sched)
    int                  ggml_backend_sched_get_n_copies(ggml_backend_sched_t sched)

    ggml_backend_buffer_type_t ggml_backend_sched_get_buffer_type(ggml_backend_sched_t sched, ggml_backend_t backend)
    size_t                     ggml_backend_sched_get_buffer_size(ggml_backend_sched_t sched, ggml_backend_t backend)

    void                 ggml_backend_sched_set_tensor_backend(ggml_backend_sched_t sched, ggml_tensor * node, ggml_backend_t backend)
    ggml_backend_t       ggml_backend_sched_get_tensor_backend(ggml_backend_sched_t sched, ggml_tensor * node)

    # Split graph without allocating it
    void                 ggml_backend_sched_split_graph(ggml_backend_sched_t sched, ggml_cgraph * graph)

    # Allocate and compute graph on the backend scheduler
    bint                 ggml_backend_sched_alloc_graph(ggml_backend_sched_t sched, ggml_cgraph * graph)  # returns success
    ggml_status          ggml_backend_sched_graph_compute(ggml_backend_sched_t sched, ggml_cgraph * graph)
    ggml_status          ggml_backend_sched_graph_compute_async(ggml_backend_sched_t sched, ggml_cgraph * graph)
    void                 ggml_backend_sched_synchronize(ggml_backend_sched_t sched)

    # Reset all assignments and allocators - must be called before changing the node backends or allocating a new graph.
    # This in effect deallocates all tensors that were previously allocated and leaves them with dangling pointers.
    # The correct way to use this API is to discard the deallocated tensors and create new ones.
    void                 ggml_backend_sched_reset(ggml_backend_sched_t sched)

    # Set a callback to be called for each resulting node during graph compute
    void                 ggml_backend_sched_set_eval_callback(ggml_backend_sched_t sched, ggml_backend_sched_eval_callback callback, void * user_data)

    #
    # Meta backend
    #

    const int GGML_BACKEND_META_MAX_DEVICES  # 16

    enum ggml_backend_meta_split_axis:
        # tensor split by tensor dimensions:
        GGML_BACKEND_SPLIT_AXIS_0         # 0
        GGML_BACKEND_SPLIT_AXIS_1         # 1
        GGML_BACKEND_SPLIT_AXIS_2         # 2
        GGML_BACKEND_SPLIT_AXIS_3         # 3
        GGML_BACKEND_SPLIT_AXIS_MIRRORED  # 10, all values on all backends
        GGML_BACKEND_SPLIT_AXIS_PARTIAL   # 11, each backend has a partial sum
        # for internal bookkeeping only:
        GGML_BACKEND_SPLIT_AXIS_NONE      # 98
        GGML_BACKEND_SPLIT_AXIS_UNKNOWN   # 99

    const char * ggml_backend_meta_split_axis_name(ggml_backend_meta_split_axis split_axis)

    struct ggml_backend_meta_split_state:
        ggml_backend_meta_split_axis axis
        # for tensors with axis >= 0 && axis < GGML_MAX_DIMS: each device has a slice of the tensor
        # along the split axis; ne has one entry per segment and device, and that segment repeats
        # nr times (see the header for the full layout)
        int64_t  ne[256]   # [16*GGML_BACKEND_META_MAX_DEVICES]
        uint32_t nr[16]
        uint32_t n_segments

    # function to assign split states for statically allocated tensors, compute tensor split states will be assigned to be compatible:
    ctypedef ggml_backend_meta_split_state (*ggml_backend_meta_get_split_state_t)(const ggml_tensor * tensor, void * userdata) noexcept

    # create a new meta device from "simple" devices, meta buffer type/buffer/backend is then derived from this:
    ggml_backend_dev_t ggml_backend_meta_device(
        ggml_backend_dev_t * devs, size_t n_devs, ggml_backend_meta_get_split_state_t get_split_state, void * get_split_state_ud)

    #
    # Utils
    #

    # C name: struct ggml_backend_graph_copy (the name ggml_backend_graph_copy is the function below)
    struct ggml_backend_graph_copy_t "ggml_backend_graph_copy":
        ggml_backend_buffer_t buffer
        ggml_context * ctx_allocated
        ggml_context * ctx_unallocated
        ggml_cgraph * graph

    # Copy a graph to a different backend
    ggml_backend_graph_copy_t ggml_backend_graph_copy(ggml_backend_t backend, ggml_cgraph * graph)
    void                      ggml_backend_graph_copy_free(ggml_backend_graph_copy_t copy)

    ctypedef cbool (*ggml_backend_eval_callback)(int node_index, ggml_tensor * t1, ggml_tensor * t2, void * user_data) noexcept

    # Compare the output of two backends
    bint ggml_backend_compare_graph_backend(ggml_backend_t backend1, ggml_backend_t backend2, ggml_cgraph * graph, ggml_backend_eval_callback callback, void * user_data, const ggml_tensor * const * test_nodes, size_t num_test_nodes)

    # Tensor initialization
    ggml_status ggml_backend_tensor_alloc(ggml_backend_buffer_t buffer, ggml_tensor * tensor, void * addr)
    ggml_status ggml_backend_view_init(ggml_tensor * tensor)

    # CPU buffer types are always available
    ggml_backend_buffer_t      ggml_backend_cpu_buffer_from_ptr(void * ptr, size_t size)
    ggml_backend_buffer_type_t ggml_backend_cpu_buffer_type()
