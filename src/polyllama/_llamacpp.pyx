# cython: language_level=3, boundscheck=False, embedsignature=True
# distutils: language = c++
"""polyllama._llamacpp: wrappers that own llama.cpp objects (model, context, sampler, batch).

The C declarations live in polyllama/includes/*.pxd (one to one with llama.h and
ggml-backend.h) and includes/csrc.pxd (our C++ layer over libcommon). This module turns them
into Python objects with clear lifetimes: each class frees what it owns in close() and
__dealloc__, and every call into llama.cpp that can take long releases the GIL.
The user-facing API (polyllama.LLM, devices(), ...) is plain Python on top of this.
"""
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_CheckSignals
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset
from libc.math cimport exp, log
from posix.unistd cimport getpid, usleep
from libcpp cimport bool as cbool
from libcpp.string cimport string
from libcpp.vector cimport vector

from polyllama.includes.ggml cimport *
from polyllama.includes.ggml_backend cimport *
from polyllama.includes.llama cimport *
from polyllama.includes.ggml_rpc cimport (RPC_PROTO_MAJOR_VERSION, RPC_PROTO_MINOR_VERSION,
                                          ggml_backend_rpc_start_server_t)
from polyllama.includes cimport csrc
cimport cython

import array
import json
import re

from polyllama.errors import (ContextError, DecodeError, GrammarError, InsufficientMemoryError,
                              ModelLoadError, PolyllamaError, RemoteDeviceError, TemplateError)

# ---------------------------------------------------------------------------------------
# process-wide setup
# ---------------------------------------------------------------------------------------
# the log hook first: backends print while they register (ggml-opencl says why it
# drops a device), and those lines belong in our log buffer, not on stderr
csrc.log_install()
# GGML_ABORT inside a model load, a context creation or a tokenize on the calling thread
# becomes a failed call instead of abort() (csrc/hardening.h)
csrc.abort_guard_install()
llama_backend_init()
ggml_backend_dev_count()
REGISTRATION_LOG = csrc.log_recent_problems().decode("utf-8", "replace")

DEVICE_TYPES = {
    GGML_BACKEND_DEVICE_TYPE_CPU: "CPU",
    GGML_BACKEND_DEVICE_TYPE_GPU: "GPU",
    GGML_BACKEND_DEVICE_TYPE_IGPU: "iGPU",
    GGML_BACKEND_DEVICE_TYPE_ACCEL: "accelerator",
}

SPLIT_MODES = {"none": LLAMA_SPLIT_MODE_NONE, "layer": LLAMA_SPLIT_MODE_LAYER,
               "row": LLAMA_SPLIT_MODE_ROW, "tensor": LLAMA_SPLIT_MODE_TENSOR}

POOLING_TYPES = {"unspecified": LLAMA_POOLING_TYPE_UNSPECIFIED, "none": LLAMA_POOLING_TYPE_NONE,
                 "mean": LLAMA_POOLING_TYPE_MEAN, "cls": LLAMA_POOLING_TYPE_CLS,
                 "last": LLAMA_POOLING_TYPE_LAST, "rank": LLAMA_POOLING_TYPE_RANK}

FLASH_ATTN = {"auto": LLAMA_FLASH_ATTN_TYPE_AUTO, "off": LLAMA_FLASH_ATTN_TYPE_DISABLED,
              "on": LLAMA_FLASH_ATTN_TYPE_ENABLED}

LOG_LEVELS = {"debug": GGML_LOG_LEVEL_DEBUG, "info": GGML_LOG_LEVEL_INFO,
              "warning": GGML_LOG_LEVEL_WARN, "error": GGML_LOG_LEVEL_ERROR, "none": 99}


def set_log_level(str level):
    """Lowest llama.cpp log level echoed to stderr ("debug" … "error", "none")."""
    csrc.log_set_stderr_level(LOG_LEVELS[level])


cdef str _recent_log_problems():
    """Warnings and errors llama.cpp logged since the last call into it that clears them
    (a load, a context, a grammar: each starts with csrc.log_clear())."""
    return csrc.log_recent_problems().decode("utf-8", "replace")


def clean_log_line(str line):
    """A log line for a message: an abort that hardening.h turned into an error is shown
    as "llama.cpp aborted at <file>:<line>: <assert>", without the build's relative path."""
    line = re.sub(r"(?:\.\./)*thirdparty/llama\.cpp/", "", line).strip()
    if "GGML_ASSERT" in line or ": fatal error" in line or "GGML_ABORT" in line:
        line = re.sub(r"((?:src|ggml|common|vendor)/\S+:\d+: )", r"llama.cpp aborted at \1", line, count=1)
    return line


def _failure_reason(string & err):
    """Why a load / context creation failed: llama.cpp's last error line, else the abort
    that escaped its catch, else its last warning."""
    errors = csrc.log_recent_errors().decode("utf-8", "replace").splitlines()
    if errors:
        return clean_log_line(errors[-1])
    if err.size():
        return clean_log_line(err.decode("utf-8", "replace"))
    problems = _recent_log_problems().splitlines()
    return clean_log_line(problems[-1]) if problems else ""


def recent_log_errors():
    """The error lines among _recent_log_problems() (a failed call's reasons)."""
    return csrc.log_recent_errors().decode("utf-8", "replace")


# Objects made before os.fork() are unusable in the child: ggml's worker threads, the
# engine's threads and any device state exist only in the parent, and freeing them would
# join threads that are not there (a hang). In the child they are leaked, and
# polyllama.LLM refuses to use them (llm.py: _require).
cdef inline bint _forked(int pid) noexcept:
    return pid != getpid()


cdef str _s(const char * p):
    return p.decode("utf-8", "replace") if p != NULL else ""


def get_ggml_version():
    return _s(ggml_version())


def get_ggml_commit():
    return _s(ggml_commit())


def system_info():
    return _s(llama_print_system_info())


def device_supports_tensor_bytes(size_t index, uint64_t nbytes):
    """Whether ggml device `index` accepts one F16 tensor of nbytes (its supports_op)."""
    return csrc.device_supports_tensor_bytes(index, nbytes)


def cpu_extra_buffer_types():
    """Names of the CPU device's extra weight buffer types in this build and on this CPU
    (e.g. "AMX", "CPU_REPACK"): the layouts ggml-cpu repacks weights into at load time.
    AMX appears only where it was compiled in and the kernel granted its tile state."""
    cdef ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    cdef ggml_backend_dev_get_extra_bufts_t fn
    cdef ggml_backend_buffer_type_t * bufts
    if cpu == NULL:
        return []
    fn = <ggml_backend_dev_get_extra_bufts_t> ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(cpu), b"ggml_backend_dev_get_extra_bufts")
    if fn == NULL:
        return []
    bufts = fn(cpu)
    names = []
    while bufts != NULL and bufts[0] != NULL:
        names.append(_s(ggml_backend_buft_name(bufts[0])))
        bufts += 1
    return names


# ---------------------------------------------------------------------------------------
# devices
# ---------------------------------------------------------------------------------------
def registries():
    """Names of the ggml backend registries compiled into this extension."""
    return [_s(ggml_backend_reg_name(ggml_backend_reg_get(i))) for i in range(ggml_backend_reg_count())]


# ggml RPC endpoints ("host:port") this process lost; their devices are never asked anything
# again (ggml-rpc cannot reconnect in the same process). Written by _remote_failure.
LOST_ENDPOINTS = set()
# seconds a memory query of a remote device may take before its server counts as lost
RPC_QUERY_TIMEOUT = 10.0


def device_list():
    """Every ggml device, in ggml's order, with memory queried now.

    Remote (RPC) devices are queried through the RPC guard, with a timeout; a device whose
    server was lost reports 0 bytes instead of being asked.
    """
    cdef size_t free_mem, total_mem
    cdef ggml_backend_dev_t dev
    cdef ggml_backend_dev_props props
    cdef string err
    cdef int status
    cdef double timeout = RPC_QUERY_TIMEOUT
    out = []
    for i in range(ggml_backend_dev_count()):
        dev = ggml_backend_dev_get(i)
        free_mem = 0
        total_mem = 0
        registry = _s(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)))
        if registry == "RPC":
            endpoint = _s(ggml_backend_dev_description(dev))
            if endpoint not in LOST_ENDPOINTS:
                with nogil:
                    status = csrc.remote_device_memory(dev, &free_mem, &total_mem, timeout, err)
                if status != csrc.REMOTE_OK:
                    LOST_ENDPOINTS.add(endpoint)
                    free_mem = total_mem = 0
        else:
            with nogil:
                ggml_backend_dev_memory(dev, &free_mem, &total_mem)
        memset(&props, 0, sizeof(props))
        if registry != "RPC":
            # ggml-rpc's get_props asks the server for its memory again, outside the guard;
            # a remote device has no local device id or caps worth reporting anyway
            ggml_backend_dev_get_props(dev, &props)
        out.append({
            "index": i,
            "name": _s(ggml_backend_dev_name(dev)),
            "description": _s(ggml_backend_dev_description(dev)),
            "registry": registry,
            "type": DEVICE_TYPES.get(ggml_backend_dev_type(dev), "unknown"),
            "memory_free": free_mem,
            "memory_total": total_mem,
            "device_id": _s(props.device_id),
            "caps": {"async": props.caps.async_, "host_buffer": props.caps.host_buffer,
                     "buffer_from_host_ptr": props.caps.buffer_from_host_ptr,
                     "events": props.caps.events},
        })
    return out


cdef int _fill_devices(ggml_backend_dev_t * out, object indices) except -1:
    """Write a NULL-terminated device list for llama_model_params.devices."""
    cdef size_t n = ggml_backend_dev_count()
    cdef int k = 0
    for i in indices:
        if i < 0 or i >= <int>n:
            raise PolyllamaError(f"device index {i} out of range (0..{n - 1})")
        out[k] = ggml_backend_dev_get(i)
        k += 1
    out[k] = NULL
    return k


# ---------------------------------------------------------------------------------------
# parameters
# ---------------------------------------------------------------------------------------
cdef class ModelParams:
    """llama_model_params plus the storage its pointers point into (devices, tensor_split).

    devices: None (llama.cpp's choice: all devices) or a list of ggml device indices
    (an empty list means no offload device at all, i.e. CPU only).
    """
    cdef llama_model_params c
    cdef ggml_backend_dev_t * _devs
    cdef float * _split
    cdef llama_model_tensor_buft_override * _overrides
    cdef public object devices
    # > 0: the device list holds remote (RPC) devices, and calls that can reach them run
    # through the RPC guard with this timeout in seconds
    cdef public double remote_timeout

    def __cinit__(self):
        self.c = llama_model_default_params()
        self.remote_timeout = 0
        self._devs = NULL
        self._split = NULL
        self._overrides = NULL

    def __init__(self, devices=None, n_gpu_layers=None, str split_mode="layer", int main_gpu=0,
                 tensor_split=None, bint vocab_only=False):
        cdef size_t nmax = llama_max_devices()
        self.devices = None if devices is None else list(devices)
        if devices is not None:
            self._devs = <ggml_backend_dev_t *> malloc((len(devices) + 1) * sizeof(ggml_backend_dev_t))
            _fill_devices(self._devs, devices)
            self.c.devices = self._devs
        if n_gpu_layers is not None:
            self.c.n_gpu_layers = n_gpu_layers
        self.c.split_mode = SPLIT_MODES[split_mode]
        self.c.main_gpu = main_gpu
        self._split = <float *> malloc(nmax * sizeof(float))
        memset(self._split, 0, nmax * sizeof(float))
        if tensor_split is not None:
            if len(tensor_split) > <Py_ssize_t>nmax:
                raise PolyllamaError(f"tensor_split has {len(tensor_split)} entries; at most {nmax}")
            for i, v in enumerate(tensor_split):
                self._split[i] = v
            self.c.tensor_split = self._split
        self.c.vocab_only = vocab_only

    def __dealloc__(self):
        free(self._devs)
        free(self._split)
        free(self._overrides)

    @property
    def n_gpu_layers(self):
        return self.c.n_gpu_layers

    @property
    def tensor_split(self):
        return [self._split[i] for i in range(llama_max_devices())]

    @property
    def main_gpu(self):
        return self.c.main_gpu

    @property
    def use_mmap(self):
        return self.c.load_mode != LLAMA_LOAD_MODE_NONE

    @use_mmap.setter
    def use_mmap(self, bint value):
        # False: read the weights into memory (a file changed on disk later cannot hurt)
        self.c.load_mode = LLAMA_LOAD_MODE_AUTO if value else LLAMA_LOAD_MODE_NONE

    @property
    def overrides_in_use(self):
        return self.c.tensor_buft_overrides != NULL and self.c.tensor_buft_overrides[0].pattern != NULL


cdef class ContextParams:
    cdef llama_context_params c

    def __cinit__(self):
        self.c = llama_context_default_params()

    def __init__(self, int n_ctx=0, int n_batch=2048, int n_ubatch=512, int n_seq_max=1,
                 int n_threads=-1, int n_threads_batch=-1, str flash_attn="auto",
                 bint embeddings=False, str pooling="unspecified", bint offload_kqv=True,
                 bint kv_unified=True, bint no_perf=False):
        if n_ctx < 0 or n_batch <= 0 or n_ubatch <= 0 or n_seq_max <= 0:
            raise ValueError("n_ctx must be >= 0 and n_batch, n_ubatch, n_seq_max > 0")
        self.c.n_ctx = n_ctx
        self.c.n_batch = n_batch
        self.c.n_ubatch = min(n_ubatch, n_batch)
        self.c.n_seq_max = n_seq_max
        if n_threads > 0:
            self.c.n_threads = n_threads
        if n_threads_batch > 0:
            self.c.n_threads_batch = n_threads_batch
        elif n_threads > 0:
            self.c.n_threads_batch = n_threads
        self.c.flash_attn_type = FLASH_ATTN[flash_attn]
        self.c.embeddings = embeddings
        self.c.pooling_type = POOLING_TYPES[pooling]
        self.c.offload_kqv = offload_kqv
        self.c.kv_unified = kv_unified
        self.c.no_perf = no_perf

    @property
    def n_ctx(self):
        return self.c.n_ctx

    @property
    def n_threads(self):
        return self.c.n_threads


cdef list _memory_rows(vector[csrc.device_memory] & v):
    return [{"device": m.device.decode("utf-8", "replace"), "total": m.total, "free": m.free,
             "model": m.model, "context": m.context, "compute": m.compute} for m in v]


def estimate_memory(str path, ModelParams mparams, ContextParams cparams):
    """Per-device bytes llama.cpp would allocate (weights, KV cache, compute), last row the host.

    Uses libcommon's common_get_device_memory_data: the model and context are created with
    no_alloc, so nothing is actually allocated.
    """
    cdef vector[csrc.device_memory] rows
    cdef uint32_t n_layer = 0, n_ctx_train = 0
    cdef string err
    cdef bytes bpath = path.encode()
    cdef const char * cpath = bpath
    cdef bint ok
    csrc.log_clear()
    with nogil:
        csrc.abort_scope_enter()
        ok = csrc.estimate_device_memory(cpath, &mparams.c, &cparams.c, rows, n_layer, n_ctx_train, err)
        csrc.abort_scope_leave()
    if not ok:
        raise ModelLoadError(f"could not estimate memory for {path}: {err.decode('utf-8', 'replace')}",
                             log=_recent_log_problems())
    return {"devices": _memory_rows(rows), "n_layer": n_layer, "n_ctx_train": n_ctx_train}


def fit_params(str path, ModelParams mparams, ContextParams cparams, margins, int n_ctx_min=0):
    """common_fit_params: adjust n_gpu_layers/tensor_split (and n_ctx when 0) in place.

    margins: bytes to leave free per device of mparams' device list. Returns "success",
    "failure" (nothing fits) or raises on error.
    """
    cdef size_t nmax = llama_max_devices()
    cdef size_t nover = csrc.max_tensor_buft_overrides()
    cdef size_t * cmargins = <size_t *> malloc(nmax * sizeof(size_t))
    cdef string err
    cdef int status
    cdef bytes bpath = path.encode()
    cdef const char * cpath = bpath
    memset(cmargins, 0, nmax * sizeof(size_t))
    for i, m in enumerate(margins[:nmax]):
        cmargins[i] = m
    if mparams._overrides == NULL:
        mparams._overrides = <llama_model_tensor_buft_override *> malloc(nover * sizeof(llama_model_tensor_buft_override))
        memset(mparams._overrides, 0, nover * sizeof(llama_model_tensor_buft_override))
    cdef double timeout = mparams.remote_timeout
    cdef int rs = csrc.REMOTE_OK
    csrc.log_clear()
    try:
        with nogil:
            rs = csrc.fit_params_via(cpath, &mparams.c, &cparams.c, mparams._split,
                                        mparams._overrides, cmargins, n_ctx_min, &status,
                                        timeout, err)
    finally:
        if rs == csrc.REMOTE_OK or rs == csrc.REMOTE_ERROR:
            free(cmargins)
        # else: a blocked job may still write into cmargins and mparams; both leak
    if rs == csrc.REMOTE_LOST or rs == csrc.REMOTE_TIMEOUT:
        Py_INCREF(mparams)
    _raise_remote(rs, err, "fitting the model to the devices' memory", mparams.devices)
    mparams.c.tensor_split = mparams._split
    if status == 2:
        raise ModelLoadError(f"memory fitting failed for {path}: {err.decode('utf-8', 'replace')}",
                             log=_recent_log_problems())
    return "success" if status == 0 else "failure"


# ---------------------------------------------------------------------------------------
# ggml RPC guard: turning a lost server into RemoteDeviceError (csrc/remote.h says how)
# ---------------------------------------------------------------------------------------
def _rpc_endpoints(device_indices):
    """The endpoints of the RPC devices among ggml device indices."""
    out = []
    for i in device_indices or ():
        dev = ggml_backend_dev_get(i)
        if _s(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev))) == "RPC":
            ep = _s(ggml_backend_dev_description(dev))
            if ep not in out:
                out.append(ep)
    return out


cdef int _raise_remote(int status, string & err, str what, object device_indices) except -1:
    """Raise RemoteDeviceError for a guarded call that did not finish normally."""
    if status == csrc.REMOTE_OK:
        return 0
    msg = err.decode("utf-8", "replace")
    endpoints = _rpc_endpoints(device_indices)
    where = ", ".join(endpoints) or "an RPC server"
    if status == csrc.REMOTE_ERROR:
        raise RemoteDeviceError(f"{what} failed on {where}: {msg}")
    # the call is blocked for good: every endpoint it used is lost to this process
    LOST_ENDPOINTS.update(endpoints)
    if status == csrc.REMOTE_TIMEOUT:
        raise RemoteDeviceError(
            f"{what} got no answer from {where} ({msg}); the connection is given up. "
            "Check the rpc-server processes and the network, then create a new LLM "
            "in a new process (ggml-rpc cannot reconnect to an endpoint it lost)")
    raise RemoteDeviceError(
        f"lost the connection to {where} while {what} (ggml-rpc: {msg.strip()}). The "
        "model's memory here and on the surviving servers stays allocated until this "
        "process exits; restart the rpc-server and use a new process to connect again")


# ---------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------
cdef cbool _progress_trampoline(float progress, void * user_data) noexcept with gil:
    cdef Model model = <Model> user_data
    try:
        ret = model._progress(progress)
        return ret is None or bool(ret)
    except BaseException as e:
        # an exception (or Ctrl-C, which Python raises in whatever Python code runs next:
        # often the callback) stops loading; Model.__init__ raises it once llama.cpp returns
        if model._progress_error is None:
            model._progress_error = e
        return False


cdef class Model:
    """A loaded llama_model. Free it with close(); it is also freed when collected."""
    cdef llama_model * ptr
    cdef const llama_vocab * vocab
    cdef readonly str path
    cdef object __weakref__
    # RPC guard (only for models with remote devices): the worker that runs calls which
    # can reach a server, its timeout, and whether a call was given up (then nothing of
    # this model may be freed: a blocked thread still uses it)
    cdef csrc.remote_worker * worker
    cdef readonly double remote_timeout
    cdef public bint lost
    cdef object _params
    cdef object _progress
    cdef object _progress_error   # what the progress callback raised (re-raised after the load)
    cdef int pid                  # the process that made it (see _forked)

    def __cinit__(self):
        self.ptr = NULL
        self.vocab = NULL
        self.worker = NULL
        self.remote_timeout = 0
        self.lost = False
        self.pid = getpid()

    def __init__(self, str path, ModelParams params, progress_callback=None):
        cdef bytes bpath = path.encode()
        cdef const char * cpath = bpath
        cdef llama_model_params p = params.c
        cdef string err
        cdef int status = csrc.REMOTE_OK
        cdef llama_model * loaded = NULL
        self.path = path
        self._params = params            # params.c points into it; a blocked load may read it
        self._progress = progress_callback
        self.remote_timeout = params.remote_timeout
        self._progress_error = None
        if progress_callback is not None:
            p.progress_callback = <llama_progress_callback> _progress_trampoline
            p.progress_callback_user_data = <void *> self
        csrc.log_clear()
        if self.remote_timeout > 0:
            self.worker = csrc.remote_worker_new()
        with nogil:
            status = csrc.model_load_via(self.worker, cpath, p, &loaded, self.remote_timeout, err)
        if status == csrc.REMOTE_LOST or status == csrc.REMOTE_TIMEOUT:
            self.lost = True
            Py_INCREF(self)  # the blocked load holds pointers into this object
        _raise_remote(status, err, "loading the model", params.devices)
        self.ptr = loaded
        if self._progress_error is not None:
            error, self._progress_error = self._progress_error, None
            if self.ptr != NULL:
                self._free()
            raise error
        if self.ptr == NULL:
            problems = _recent_log_problems()
            reason = _failure_reason(err)
            raise ModelLoadError(f"llama.cpp could not load {path}" + (f": {reason}" if reason else ""),
                                 log=problems)
        self.vocab = llama_model_get_vocab(self.ptr)
        # what the vocabulary would abort on at the first tokenize, refused now (the
        # vocabulary is in host memory, also for a model on remote devices)
        problem = csrc.vocab_problems(self.ptr).decode("utf-8", "replace")
        if problem:
            self._free()
            raise ModelLoadError(f"{path} has an unusable vocabulary: {problem}. The file is damaged "
                                 "or was written by a faulty converter: download or convert it again.")

    def __dealloc__(self):
        self._free()

    cdef void _free(self) noexcept:
        cdef string err
        cdef int status
        if _forked(self.pid):
            self.ptr = NULL      # the parent's: leaked here (see _forked)
            self.vocab = NULL
            self.worker = NULL
            return
        if self.ptr != NULL and not self.lost:
            with nogil:
                status = csrc.model_free_via(self.worker, self.ptr, self.remote_timeout, err)
            if status == csrc.REMOTE_LOST or status == csrc.REMOTE_TIMEOUT:
                self.lost = True
        # a lost model is leaked on purpose: a thread blocked on its server still uses it
        self.ptr = NULL
        self.vocab = NULL
        csrc.remote_worker_release(self.worker)
        self.worker = NULL

    cdef int _check(self) except -1:
        if self.lost:
            raise RemoteDeviceError("this model lost its connection to an RPC server; "
                                    "load it again (in a new process to reach that server)")
        if self.ptr == NULL:
            raise PolyllamaError("the model is closed")
        return 0

    def close(self):
        self._free()

    @property
    def closed(self):
        return self.ptr == NULL

    # ---- facts ----
    @property
    def n_layer(self):
        self._check(); return llama_model_n_layer(self.ptr)

    @property
    def n_embd(self):
        self._check(); return llama_model_n_embd(self.ptr)

    @property
    def n_ctx_train(self):
        self._check(); return llama_model_n_ctx_train(self.ptr)

    @property
    def n_head(self):
        self._check(); return llama_model_n_head(self.ptr)

    @property
    def n_vocab(self):
        self._check(); return llama_vocab_n_tokens(self.vocab)

    @property
    def n_params(self):
        self._check(); return llama_model_n_params(self.ptr)

    @property
    def size(self):
        self._check(); return llama_model_size(self.ptr)

    @property
    def has_encoder(self):
        self._check(); return llama_model_has_encoder(self.ptr)

    @property
    def is_recurrent(self):
        self._check(); return llama_model_is_recurrent(self.ptr)

    def description(self):
        cdef char buf[256]
        self._check()
        n = llama_model_desc(self.ptr, buf, sizeof(buf))
        return buf[:max(n, 0)].decode("utf-8", "replace")

    def metadata(self):
        """All GGUF key/value metadata as strings (arrays are summarised by llama.cpp)."""
        cdef char kbuf[512]
        cdef char * vbuf
        cdef int32_t n
        self._check()
        out = {}
        cdef int cap = 1 << 16
        vbuf = <char *> malloc(cap)
        try:
            for i in range(llama_model_meta_count(self.ptr)):
                n = llama_model_meta_key_by_index(self.ptr, i, kbuf, sizeof(kbuf))
                if n < 0:
                    continue
                key = kbuf[:min(n, sizeof(kbuf) - 1)].decode("utf-8", "replace")
                n = llama_model_meta_val_str_by_index(self.ptr, i, vbuf, cap)
                if n < 0:
                    continue
                out[key] = vbuf[:min(n, cap - 1)].decode("utf-8", "replace")
        finally:
            free(vbuf)
        return out

    def chat_template(self, name=None):
        cdef bytes bname
        cdef const char * tmpl
        self._check()
        if name is None:
            tmpl = llama_model_chat_template(self.ptr, NULL)
        else:
            bname = name.encode()
            tmpl = llama_model_chat_template(self.ptr, bname)
        return None if tmpl == NULL else tmpl.decode("utf-8", "replace")

    # ---- vocabulary ----
    @property
    def token_bos(self):
        self._check(); return llama_vocab_bos(self.vocab)

    @property
    def token_eos(self):
        self._check(); return llama_vocab_eos(self.vocab)

    @property
    def add_bos(self):
        self._check(); return llama_vocab_get_add_bos(self.vocab)

    def is_eog(self, int token):
        self._check(); return llama_vocab_is_eog(self.vocab, token)

    def special_tokens(self):
        """[(id, text, attr)] of the tokens llama.cpp's tokenizer matches as whole pieces of
        text before tokenizing the rest (control, user-defined and unknown tokens), in its
        order: longest text first."""
        cdef int n, i
        cdef int attr
        cdef int kinds = LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED | LLAMA_TOKEN_ATTR_UNKNOWN
        cdef const char * text
        self._check()
        n = llama_vocab_n_tokens(self.vocab)
        out = []
        for i in range(n):
            attr = llama_vocab_get_attr(self.vocab, i)
            if attr & kinds:
                text = llama_vocab_get_text(self.vocab, i)
                if text != NULL and text[0] != 0:
                    out.append((i, text.decode("utf-8", "replace"), attr))
        out.sort(key=lambda t: -len(t[1].encode("utf-8")))
        return out

    def tokenize(self, bytes text, bint add_special=True, bint parse_special=False):
        """Token ids of UTF-8 text. ValueError for text longer than llama.cpp takes (2**31-1
        bytes); PolyllamaError when the model's tokenizer fails or makes an id outside its
        vocabulary (a faulty vocabulary, not the caller's text)."""
        cdef const char * ctext = text
        cdef size_t ntext = len(text)
        cdef vector[llama_token] out
        cdef string err
        cdef int rc
        self._check()
        with nogil:
            rc = csrc.tokenize_checked(self.vocab, ctext, ntext, add_special, parse_special, out, err)
        if rc == csrc.TOKENIZE_TOO_LONG:
            raise ValueError(err.decode("utf-8", "replace") + "; split the text")
        if rc != csrc.TOKENIZE_OK:
            raise PolyllamaError(f"tokenizing failed: {err.decode('utf-8', 'replace')}. The model's "
                                 "vocabulary cannot represent this text; the model file is faulty")
        return [out[i] for i in range(out.size())]

    def token_to_piece(self, int token, bint special=False):
        cdef char buf[256]
        cdef int32_t n
        self._check()
        if token < 0 or token >= llama_vocab_n_tokens(self.vocab):
            raise ValueError(f"token id {token} out of range 0..{llama_vocab_n_tokens(self.vocab) - 1}")
        n = llama_token_to_piece(self.vocab, token, buf, sizeof(buf), 0, special)
        if n < 0:
            raise PolyllamaError(f"token {token} does not fit in a 256-byte piece")
        return PyBytes_FromStringAndSize(buf, n)

    def detokenize(self, tokens, bint remove_special=False, bint unparse_special=False):
        cdef int32_t n_tok = len(tokens)
        cdef llama_token * toks = <llama_token *> malloc((n_tok + 1) * sizeof(llama_token))
        cdef int32_t n_vocab = llama_vocab_n_tokens(self.vocab) if self.vocab != NULL else 0
        cdef int32_t cap = n_tok * 8 + 64
        cdef int32_t n
        cdef char * out = NULL
        try:
            self._check()
            for i, t in enumerate(tokens):
                if t < 0 or t >= n_vocab:
                    raise ValueError(f"token id {t} out of range 0..{n_vocab - 1}")
                toks[i] = t
            while True:
                out = <char *> malloc(cap)
                n = llama_detokenize(self.vocab, toks, n_tok, out, cap, remove_special, unparse_special)
                if n >= 0:
                    return PyBytes_FromStringAndSize(out, n)
                free(out)
                out = NULL
                cap = -n + 1
        finally:
            free(toks)
            free(out)

    # ---- chat ----
    def apply_chat_template(self, str messages_json, str tools_json="", str json_schema="",
                            bint add_generation_prompt=True, str template_override="",
                            bint enable_thinking=True, str tool_choice="auto",
                            int parallel_tool_calls=-1):
        """Format messages with the model's Jinja template through libcommon's chat code.
        tool_choice: "auto", "required" or "none"; parallel_tool_calls: 1, 0, or -1 for
        what the template supports."""
        cdef csrc.chat_result res
        cdef string err
        cdef string tmpl = template_override.encode()
        cdef string msgs = messages_json.encode()
        cdef string tools = tools_json.encode()
        cdef string schema = json_schema.encode()
        cdef string choice = tool_choice.encode()
        cdef bint ok
        cdef csrc.chat_job * job
        cdef int done = 0
        self._check()
        # parsed while we wait, rendered on a thread we wait for in slices: Ctrl-C ends the
        # wait (the render finishes in the background); see csrc/hardening.h
        with nogil:
            job = csrc.chat_job_start(self.ptr, tmpl, msgs, tools, schema, add_generation_prompt,
                                         enable_thinking, choice, parallel_tool_calls)
        try:
            while not done:
                with nogil:
                    done = csrc.chat_job_wait(job, 0.1)
                PyErr_CheckSignals()
            ok = csrc.chat_job_result(job, res, err)
        finally:
            csrc.chat_job_release(job)
        if not ok:
            raise TemplateError(f"chat template failed: {err.decode('utf-8', 'replace')}")
        return {
            "prompt": res.prompt.decode("utf-8", "replace"),
            "grammar": res.grammar.decode("utf-8", "replace"),
            "grammar_lazy": res.grammar_lazy,
            "grammar_triggers": [s.decode("utf-8", "replace") for s in res.grammar_trigger_patterns],
            "additional_stops": [s.decode("utf-8", "replace") for s in res.additional_stops],
            "preserved_tokens": [s.decode("utf-8", "replace") for s in res.preserved_tokens],
            "format": res.format,
            "generation_prompt": res.generation_prompt.decode("utf-8", "replace"),
            "parser": <bytes> res.parser,
        }


def builtin_chat_template(str tmpl, list messages, bint add_assistant=True):
    """llama.cpp's C formatter (llama_chat_apply_template): built-in templates only, no Jinja.

    Kept as an independent reference for the Jinja path of apply_chat_template.
    """
    cdef int n = len(messages)
    cdef llama_chat_message * msgs = <llama_chat_message *> malloc(max(n, 1) * sizeof(llama_chat_message))
    cdef bytes btmpl = tmpl.encode()
    cdef int32_t need
    cdef char * buf = NULL
    keep = []
    try:
        for i, m in enumerate(messages):
            role = m["role"].encode()
            content = m["content"].encode()
            keep += [role, content]
            msgs[i].role = role
            msgs[i].content = content
        need = llama_chat_apply_template(btmpl, msgs, n, add_assistant, NULL, 0)
        if need < 0:
            raise TemplateError("llama.cpp has no built-in formatter for this template")
        buf = <char *> malloc(need + 1)
        llama_chat_apply_template(btmpl, msgs, n, add_assistant, buf, need + 1)
        return buf[:need].decode("utf-8")
    finally:
        free(msgs)
        free(buf)


def parse_chat_reply(int fmt, str generation_prompt, bytes parser, str text, bint partial=False):
    """The assistant message (content, reasoning, tool calls) of a reply; partial=True for
    a reply still being generated."""
    cdef string out, err
    cdef string gp = generation_prompt.encode()
    cdef string pp = parser
    cdef string t = text.encode("utf-8", "surrogatepass")
    if not csrc.chat_parse_reply(fmt, gp, pp, t, partial, out, err):
        raise TemplateError(f"could not parse the reply: {err.decode('utf-8', 'replace')}")
    return json.loads(out.decode("utf-8", "replace"))


def json_schema_to_grammar(str schema_json):
    """GBNF for a JSON schema, by libcommon's json_schema_to_grammar."""
    cdef string out, err
    cdef string s = schema_json.encode()
    cdef bint ok
    with nogil:
        ok = csrc.json_schema_to_gbnf_checked(s, out, err)
    if not ok:
        raise GrammarError(f"invalid JSON schema: {err.decode('utf-8', 'replace')}")
    return out.decode("utf-8")


# ---------------------------------------------------------------------------------------
# context
# ---------------------------------------------------------------------------------------
cdef cbool _abort_trampoline(void * data) noexcept nogil:
    return (<Context> data).cancel_requested


cdef class Context:
    """A llama_context with its batch. Owns both; keeps its Model alive."""
    cdef llama_context * ptr
    cdef readonly Model model
    cdef llama_batch batch
    cdef int batch_cap
    cdef int n_seq_batch
    cdef public bint cancel_requested
    cdef readonly int n_vocab
    # RPC guard, as in Model (a context has a worker of its own: decode runs there)
    cdef csrc.remote_worker * worker
    cdef readonly double remote_timeout
    cdef public bint lost
    cdef csrc.threadpools * pools   # persistent CPU threads (freed after the context)
    cdef int pid                        # the process that made it (see _forked)

    def __cinit__(self):
        self.pid = getpid()
        self.ptr = NULL
        self.pools = NULL
        self.batch_cap = 0
        self.worker = NULL
        self.remote_timeout = 0
        self.lost = False

    def __init__(self, Model model, ContextParams params):
        model._check()
        self.model = model
        self.n_vocab = model.n_vocab
        cdef llama_context_params p = params.c
        cdef string err
        cdef int status
        cdef llama_context * created = NULL
        p.abort_callback = <ggml_abort_callback> _abort_trampoline
        p.abort_callback_data = <void *> self
        csrc.log_clear()
        self.remote_timeout = model.remote_timeout
        if self.remote_timeout > 0:
            self.worker = csrc.remote_worker_new()
        with nogil:
            status = csrc.context_init_via(self.worker, model.ptr, p, &created,
                                              self.remote_timeout, err)
        self._after_remote(status, err, "creating the context")
        self.ptr = created
        if self.ptr == NULL:
            problems = _recent_log_problems()
            reason = _failure_reason(err)
            raise ContextError("llama.cpp could not create a context" + (f": {reason}" if reason else ""),
                               log=problems)
        self.batch_cap = llama_n_batch(self.ptr)
        self.n_seq_batch = max(1, llama_n_seq_max(self.ptr))
        self.batch = llama_batch_init(self.batch_cap, 0, self.n_seq_batch)
        if self.worker == NULL:
            # llama.cpp's tools attach persistent CPU threads; without them ggml-cpu starts
            # and joins threads on every decode (csrc/threadpools.h)
            self.pools = csrc.threadpools_attach(self.ptr, llama_n_threads(self.ptr),
                                                    llama_n_threads_batch(self.ptr), err)

    def __dealloc__(self):
        self._free()

    cdef void _free(self) noexcept:
        cdef string err
        cdef int status
        if _forked(self.pid):
            self.ptr = NULL      # the parent's: leaked here (see _forked)
            self.batch_cap = 0
            self.pools = NULL
            self.worker = NULL
            return
        if self.lost:
            # leaked on purpose, batch included: a thread blocked on a lost server uses them
            self.ptr = NULL
            self.batch_cap = 0
        if self.ptr != NULL:
            with nogil:
                status = csrc.context_free_via(self.worker, self.ptr, self.remote_timeout, err)
            if status == csrc.REMOTE_LOST or status == csrc.REMOTE_TIMEOUT:
                self.lost = True
                self.model.lost = True
                self.batch_cap = 0
            self.ptr = NULL
        if self.batch_cap:
            llama_batch_free(self.batch)
            self.batch_cap = 0
        if self.pools != NULL and not self.lost:
            csrc.threadpools_free(self.pools)
            self.pools = NULL
        csrc.remote_worker_release(self.worker)
        self.worker = NULL

    cdef int _after_remote(self, int status, string & err, str what) except -1:
        if status == csrc.REMOTE_LOST or status == csrc.REMOTE_TIMEOUT:
            # a thread is blocked inside this context for good: it and its model leak, and
            # this object stays alive for it (it reads the batch and the abort callback)
            self.lost = True
            self.model.lost = True
            Py_INCREF(self)
        return _raise_remote(status, err, what, self.model._params.devices)

    def close(self):
        self._free()

    def abandon(self):
        """A thread stays blocked inside this context for good (a lost RPC server, found by
        the engine): never free it or its model (see _after_remote)."""
        if not self.lost:
            self.lost = True
            self.model.lost = True
            Py_INCREF(self)

    cdef int _check(self) except -1:
        if self.lost:
            raise RemoteDeviceError("this context lost its connection to an RPC server; "
                                    "create a new LLM (in a new process to reach that server)")
        if self.ptr == NULL:
            raise PolyllamaError("the context is closed")
        if self.model.ptr == NULL:
            raise PolyllamaError("the model of this context is closed")
        return 0

    @property
    def n_ctx(self):
        self._check(); return llama_n_ctx(self.ptr)

    @property
    def n_ctx_seq(self):
        self._check(); return llama_n_ctx_seq(self.ptr)

    @property
    def n_batch(self):
        self._check(); return llama_n_batch(self.ptr)

    @property
    def n_ubatch(self):
        self._check(); return llama_n_ubatch(self.ptr)

    @property
    def n_seq_max(self):
        self._check(); return llama_n_seq_max(self.ptr)

    @property
    def n_threads(self):
        self._check(); return llama_n_threads(self.ptr)

    def set_threads(self, int n_threads, int n_threads_batch):
        cdef string err
        self._check()
        llama_set_n_threads(self.ptr, n_threads, n_threads_batch)
        if self.pools != NULL:   # the pools have a fixed size: new ones for the new counts
            llama_detach_threadpool(self.ptr)
            csrc.threadpools_free(self.pools)
            self.pools = csrc.threadpools_attach(self.ptr, n_threads, n_threads_batch, err)

    def memory(self):
        """What this context and its model actually allocated, per device, last row the host."""
        self._check()
        cdef vector[csrc.device_memory] rows
        cdef string err
        cdef int status
        with nogil:
            status = csrc.context_memory_via(self.worker, self.ptr, rows, self.remote_timeout, err)
        self._after_remote(status, err, "querying device memory")
        return _memory_rows(rows)

    def clear(self):
        if self.lost:
            return   # nothing to clear: the context is abandoned (see _after_remote)
        self._check()
        cdef string err
        cdef int status
        with nogil:
            status = csrc.memory_clear_via(self.worker, self.ptr, self.remote_timeout, err)
        self._after_remote(status, err, "clearing the KV cache")

    def seq_rm(self, int seq_id, int p0=-1, int p1=-1):
        self._check(); return llama_memory_seq_rm(llama_get_memory(self.ptr), seq_id, p0, p1)

    def seq_pos_max(self, int seq_id):
        self._check(); return llama_memory_seq_pos_max(llama_get_memory(self.ptr), seq_id)

    cdef int _decode(self, int n) except -1:
        cdef int32_t rc
        cdef string err
        cdef int status
        self.batch.n_tokens = n
        with nogil:
            status = csrc.decode_via(self.worker, self.ptr, self.batch, &rc, self.remote_timeout, err)
        self._after_remote(status, err, "decoding")
        if rc == 0:
            return 0
        if rc == 2:
            raise _Cancelled()
        if rc == 1:
            raise ContextError("the context is full: no KV-cache slot for the batch "
                               "(use a larger n_ctx or a shorter prompt)")
        problems = _recent_log_problems()
        raise DecodeError(f"llama_decode failed with code {rc}" +
                          (f": {problems.splitlines()[-1]}" if problems else ""))

    def decode(self, tokens, int seq_id=0, int pos=0, bint logits_last=True, bint logits_all=False):
        """Decode tokens of one sequence starting at position pos, in chunks of n_ubatch.

        Returns the batch index of the last token's logits (for sample/logits) or -1.
        One llama_decode per micro-batch (llama.cpp would split a larger batch into the
        same micro-batches): between them Python's signal handlers run, so Ctrl-C stops
        a long prompt within one micro-batch instead of at its end.
        """
        cdef int n = len(tokens)
        cdef int i, k, start
        cdef int last = -1
        cdef int chunk = min(self.batch_cap, <int> llama_n_ubatch(self.ptr)) if self.ptr != NULL else 0
        cdef llama_token t
        self._check()
        if n == 0:
            raise ValueError("nothing to decode: the token list is empty")
        start = 0
        while start < n:
            if start > 0:
                PyErr_CheckSignals()   # raises KeyboardInterrupt after Ctrl-C
            k = min(chunk, n - start)
            for i in range(k):
                t = tokens[start + i]
                if t < 0 or t >= self.n_vocab:
                    raise ValueError(f"token id {t} out of range 0..{self.n_vocab - 1}")
                self.batch.token[i] = t
                self.batch.pos[i] = pos + start + i
                self.batch.n_seq_id[i] = 1
                self.batch.seq_id[i][0] = seq_id
                self.batch.logits[i] = logits_all or (logits_last and start + i == n - 1)
            self._decode(k)
            start += k
            last = k - 1
        return last if (logits_last or logits_all) else -1

    def decode_one(self, int token, int pos, int seq_id=0):
        """Decode a single token (the generation step). Returns its batch index (0)."""
        self._check()
        if token < 0 or token >= self.n_vocab:
            raise ValueError(f"token id {token} out of range 0..{self.n_vocab - 1}")
        self.batch.token[0] = token
        self.batch.pos[0] = pos
        self.batch.n_seq_id[0] = 1
        self.batch.seq_id[0][0] = seq_id
        self.batch.logits[0] = True
        self._decode(1)
        return 0

    def decode_multi(self, tokens, positions, seq_ids, logits):
        """One batch mixing several sequences: parallel lists of equal length <= n_batch."""
        cdef int n = len(tokens)
        cdef int i
        self._check()
        if n == 0 or n > self.batch_cap:
            raise ValueError(f"batch of {n} tokens; must be 1..{self.batch_cap}")
        for i in range(n):
            self.batch.token[i] = tokens[i]
            self.batch.pos[i] = positions[i]
            self.batch.n_seq_id[i] = 1
            self.batch.seq_id[i][0] = seq_ids[i]
            self.batch.logits[i] = logits[i]
        self._decode(n)

    def logits(self, int idx):
        """A copy of the logits at batch index idx (-1: the last), as array('f')."""
        cdef float * p
        self._check()
        p = llama_get_logits_ith(self.ptr, idx)
        if p == NULL:
            raise PolyllamaError(f"no logits at batch index {idx}")
        out = array.array("f")
        out.frombytes(PyBytes_FromStringAndSize(<char *> p, self.n_vocab * sizeof(float)))
        return out

    def argmax(self, int idx, int exclude=-1):
        """Index of the largest logit at batch index idx, first one on ties.

        Exactly what llama_sampler_init_greedy selects (llama_sampler_greedy_apply scans
        the same logits in the same order), without building llama.cpp's n_vocab-long
        candidate array for every token: the fast path of plain greedy decoding.
        `exclude` (a token id, e.g. EOS for ignore_eos) is never chosen.
        """
        cdef float * p
        cdef int i, best
        cdef int n = self.n_vocab
        self._check()
        p = llama_get_logits_ith(self.ptr, idx)
        if p == NULL:
            raise PolyllamaError(f"no logits at batch index {idx}")
        with nogil:
            best = csrc.argmax_f32(p, n, exclude)
        return best

    def top_logprobs(self, int idx, int n):
        """The n most likely tokens at batch index idx with their log-probabilities."""
        cdef float * p
        cdef int i, j, k
        cdef double mx, total, lse
        self._check()
        p = llama_get_logits_ith(self.ptr, idx)
        if p == NULL:
            raise PolyllamaError(f"no logits at batch index {idx}")
        n = min(n, self.n_vocab)
        cdef int * best = <int *> malloc(n * sizeof(int))
        try:
            mx = p[0]
            for i in range(self.n_vocab):
                if p[i] > mx:
                    mx = p[i]
            total = 0.0
            for i in range(self.n_vocab):
                total += exp(p[i] - mx)
            lse = mx + log(total)
            k = 0
            for i in range(self.n_vocab):
                # insertion into the sorted top-n list
                if k < n or p[i] > p[best[k - 1]]:
                    j = k if k < n else n - 1
                    while j > 0 and p[best[j - 1]] < p[i]:
                        best[j] = best[j - 1]
                        j -= 1
                    best[j] = i
                    if k < n:
                        k += 1
            return [(best[i], p[best[i]] - lse) for i in range(k)]
        finally:
            free(best)

    def embeddings(self, int seq_id=0, int n_embd=0):
        """Pooled embedding of a sequence (pooling != none), as a list of floats."""
        cdef float * p
        self._check()
        p = llama_get_embeddings_seq(self.ptr, seq_id)
        if p == NULL:
            p = llama_get_embeddings_ith(self.ptr, -1)
        if p == NULL:
            raise PolyllamaError("no embeddings: the context was not created with embeddings=True")
        n = n_embd or llama_model_n_embd_out(self.model.ptr)
        return [p[i] for i in range(n)]

    def perf(self):
        cdef llama_perf_context_data d
        self._check()
        d = llama_perf_context(self.ptr)
        return {"t_load_ms": d.t_load_ms, "t_p_eval_ms": d.t_p_eval_ms, "t_eval_ms": d.t_eval_ms,
                "n_p_eval": d.n_p_eval, "n_eval": d.n_eval, "n_reused": d.n_reused}

    def perf_reset(self):
        self._check(); llama_perf_context_reset(self.ptr)


class _Cancelled(Exception):
    """Raised inside the generation loop when cancel() aborted a decode."""


# ---------------------------------------------------------------------------------------
# sampler chain
# ---------------------------------------------------------------------------------------
cdef class Sampler:
    """A llama_sampler chain. Stages are added in order; the last picks the token."""
    cdef llama_sampler * ptr
    cdef Model model

    def __cinit__(self):
        self.ptr = NULL

    def __init__(self, Model model, bint no_perf=True):
        cdef llama_sampler_chain_params p = llama_sampler_chain_default_params()
        p.no_perf = no_perf
        self.model = model
        self.ptr = llama_sampler_chain_init(p)

    def __dealloc__(self):
        if self.ptr != NULL:
            llama_sampler_free(self.ptr)
            self.ptr = NULL

    def close(self):
        if self.ptr != NULL:
            llama_sampler_free(self.ptr)
            self.ptr = NULL

    cdef _add(self, llama_sampler * s, str what):
        if s == NULL:
            problems = _recent_log_problems()
            raise GrammarError(f"could not create the {what} sampler" +
                               (f": {problems.splitlines()[-1]}" if problems else ""))
        llama_sampler_chain_add(self.ptr, s)

    def add_logit_bias(self, dict bias):
        cdef int n = len(bias)
        cdef llama_logit_bias * arr = <llama_logit_bias *> malloc(max(n, 1) * sizeof(llama_logit_bias))
        n_vocab = self.model.n_vocab
        try:
            for i, (tok, b) in enumerate(bias.items()):
                if not (0 <= tok < n_vocab):
                    raise ValueError(f"logit_bias token id {tok} out of range 0..{n_vocab - 1}")
                arr[i].token = tok
                arr[i].bias = b
            self._add(llama_sampler_init_logit_bias(n_vocab, n, arr), "logit bias")
        finally:
            free(arr)

    def add_penalties(self, int last_n, float repeat, float frequency, float presence):
        self._add(llama_sampler_init_penalties(self.model.n_vocab, last_n, repeat, frequency, presence), "penalties")

    def add_grammar(self, str grammar, str root="root", lazy_patterns=None, prefill=()):
        """A GBNF grammar stage; `prefill` tokens are fed to it first (a chat template's
        generation prompt, which libcommon's output grammars start with)."""
        cdef string g = grammar.encode()
        cdef string r = root.encode()
        cdef vector[string] pats
        cdef vector[llama_token] pre
        cdef llama_sampler * gs
        cdef string err
        cdef bint ok = True
        csrc.log_clear()
        for p in lazy_patterns or ():
            pats.push_back(p.encode())
        with nogil:
            gs = csrc.grammar_init_checked(self.model.vocab, g, r, pats, err)
        if gs != NULL and prefill:
            for t in prefill:
                pre.push_back(t)
            with nogil:
                ok = csrc.grammar_prefill(gs, self.model.vocab, pre, err)
            if not ok:
                llama_sampler_free(gs)
                raise GrammarError(f"the chat template's generation prompt does not fit the output grammar "
                                   f"made for it: {err.decode('utf-8', 'replace')}; the template's "
                                   "generation prompt must be what the model's replies start with")
        if gs == NULL and err.size():
            raise GrammarError(f"could not create the grammar sampler: {err.decode('utf-8', 'replace')}")
        self._add(gs, "grammar")

    def add_top_k(self, int k):
        self._add(llama_sampler_init_top_k(k), "top_k")

    def add_top_p(self, float p, int min_keep=1):
        self._add(llama_sampler_init_top_p(p, min_keep), "top_p")

    def add_min_p(self, float p, int min_keep=1):
        self._add(llama_sampler_init_min_p(p, min_keep), "min_p")

    def add_typical(self, float p, int min_keep=1):
        self._add(llama_sampler_init_typical(p, min_keep), "typical_p")

    def add_temp(self, float t):
        self._add(llama_sampler_init_temp(t), "temperature")

    def add_dist(self, unsigned int seed):
        self._add(llama_sampler_init_dist(seed), "dist")

    def add_greedy(self):
        self._add(llama_sampler_init_greedy(), "greedy")

    def sample(self, Context ctx, int idx=-1):
        """Pick (and accept) the next token from ctx's logits at batch index idx."""
        cdef llama_token t
        ctx._check()
        with nogil:
            t = llama_sampler_sample(self.ptr, ctx.ptr, idx)
        return t

    def accept(self, int token):
        llama_sampler_accept(self.ptr, token)

    def reset(self):
        llama_sampler_reset(self.ptr)


# ---------------------------------------------------------------------------------------
# ggml RPC (issue #8). Both entry points are looked up through the RPC registry's
# get_proc_address rather than linked directly, so this module still links (and these
# functions raise cleanly) when the build has no GGML_RPC.

# the protocol version this build's ggml-rpc speaks: polyllama.rpc.probe checks a server's
# HELLO against it before ggml would abort on a mismatch
RPC_PROTO_MAJOR = RPC_PROTO_MAJOR_VERSION
RPC_PROTO_MINOR = RPC_PROTO_MINOR_VERSION

cdef void * _rpc_proc(const char * name) except NULL:
    cdef ggml_backend_reg_t reg = ggml_backend_reg_by_name(b"RPC")
    cdef void * fn = NULL
    if reg != NULL:
        fn = ggml_backend_reg_get_proc_address(reg, name)
    if fn == NULL:
        raise PolyllamaError("this build has no RPC backend: rebuild with GGML_RPC=1 (make build-rpc)")
    return fn


def rpc_add_server(str endpoint, double timeout=30.0):
    """Connect to an rpc-server and register its devices with ggml; return their ggml names.

    ggml-rpc aborts the process when it cannot connect; here the connection is made on a
    guarded worker (csrc/remote.h), so a failure raises RemoteDeviceError. The caller
    should still probe the endpoint first (polyllama.rpc.probe): it has a connect timeout,
    ggml does not. Adding an endpoint again returns the same devices: ggml-rpc keeps one
    registry per endpoint, and it is registered with ggml only once.
    """
    cdef void * fn = _rpc_proc(b"ggml_backend_rpc_add_server")
    cdef bytes b = endpoint.encode()
    cdef const char * c = b
    cdef ggml_backend_reg_t reg = NULL
    cdef string err
    cdef int status
    csrc.remote_guard_install()
    with nogil:
        status = csrc.remote_add_server(fn, c, &reg, timeout, err)
    if status != csrc.REMOTE_OK:
        if status != csrc.REMOTE_ERROR:
            LOST_ENDPOINTS.add(endpoint)
        raise RemoteDeviceError(f"could not add RPC server {endpoint}: "
                                f"{err.decode('utf-8', 'replace').strip()}")
    # the registry's devices, found in ggml's global list by identity (ggml names them
    # RPC<n> in the order servers were added, so names, not positions, identify them)
    wanted = set()
    for j in range(ggml_backend_reg_dev_count(reg)):
        wanted.add(<size_t> ggml_backend_reg_dev_get(reg, j))
    names = [_s(ggml_backend_dev_name(ggml_backend_dev_get(i))) for i in range(ggml_backend_dev_count())
             if <size_t> ggml_backend_dev_get(i) in wanted]
    if len(names) != len(wanted):
        raise RemoteDeviceError(f"RPC server {endpoint}: {len(wanted)} device(s) reported, "
                                f"{len(names)} registered with ggml")
    return names


def rpc_start_server(str endpoint, list device_indices, cache_dir=None, int n_threads=1):
    """Serve the given local devices over ggml RPC. Blocks for the life of the server."""
    cdef ggml_backend_rpc_start_server_t fn = <ggml_backend_rpc_start_server_t> _rpc_proc(
        b"ggml_backend_rpc_start_server")
    cdef size_t n = len(device_indices)
    if n == 0:
        raise PolyllamaError("rpc_start_server needs at least one device")
    cdef ggml_backend_dev_t * devs = <ggml_backend_dev_t *> malloc((n + 1) * sizeof(ggml_backend_dev_t))
    cdef bytes be = endpoint.encode()
    cdef bytes bc = cache_dir.encode() if cache_dir else b""
    cdef const char * ce = be
    cdef const char * cc = <const char *> bc if cache_dir else NULL
    cdef size_t nt = n_threads
    try:
        _fill_devices(devs, device_indices)
        with nogil:
            fn(ce, cc, nt, n, devs)
    finally:
        free(devs)


# ---------------------------------------------------------------------------------------
# the sequence engine (continuous batching)
# ---------------------------------------------------------------------------------------
include "_engine.pxi"
