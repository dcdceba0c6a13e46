# cython: language_level=3, boundscheck=False, embedsignature=True
# distutils: language = c++
"""polyllama._core: wrappers that own llama.cpp objects (model, context, sampler, batch).

The C declarations live in polyllama/includes/*.pxd (one to one with llama.h and
ggml-backend.h) and _native.pxd (our C++ layer over libcommon). This module turns them
into Python objects with clear lifetimes: each class frees what it owns in close() and
__dealloc__, and every call into llama.cpp that can take long releases the GIL.
The user-facing API (polyllama.LLM, devices(), ...) is plain Python on top of this.
"""
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset
from libc.math cimport exp, log
from libcpp cimport bool as cbool
from libcpp.string cimport string
from libcpp.vector cimport vector

from polyllama.includes.ggml cimport *
from polyllama.includes.ggml_backend cimport *
from polyllama.includes.llama cimport *
from polyllama cimport _native

import array
import json

from polyllama.errors import (ContextError, DecodeError, GrammarError, InsufficientMemoryError,
                              ModelLoadError, PolyllamaError, TemplateError)

# ---------------------------------------------------------------------------------------
# process-wide setup
# ---------------------------------------------------------------------------------------
# the log hook first: backends print while they register (ggml-opencl says why it
# drops a device), and those lines belong in our log buffer, not on stderr
_native.log_install()
llama_backend_init()
ggml_backend_dev_count()
REGISTRATION_LOG = _native.log_recent_problems().decode("utf-8", "replace")

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
    _native.log_set_stderr_level(LOG_LEVELS[level])


def recent_log_problems():
    """Warnings and errors llama.cpp logged since the last clear_log_problems()."""
    return _native.log_recent_problems().decode("utf-8", "replace")


def clear_log_problems():
    _native.log_clear()


cdef str _s(const char * p):
    return p.decode("utf-8", "replace") if p != NULL else ""


def get_ggml_version():
    return _s(ggml_version())


def get_ggml_commit():
    return _s(ggml_commit())


def system_info():
    return _s(llama_print_system_info())


def max_devices():
    return llama_max_devices()


def supports_gpu_offload():
    return llama_supports_gpu_offload()


# ---------------------------------------------------------------------------------------
# devices
# ---------------------------------------------------------------------------------------
def registries():
    """Names of the ggml backend registries compiled into this extension."""
    return [_s(ggml_backend_reg_name(ggml_backend_reg_get(i))) for i in range(ggml_backend_reg_count())]


def registry_device_count(str name):
    cdef bytes b = name.encode()
    cdef ggml_backend_reg_t reg = ggml_backend_reg_by_name(b)
    if reg == NULL:
        return None
    return ggml_backend_reg_dev_count(reg)


def device_list():
    """Every ggml device, in ggml's order, with memory queried now."""
    cdef size_t free_mem, total_mem
    cdef ggml_backend_dev_t dev
    cdef ggml_backend_dev_props props
    out = []
    for i in range(ggml_backend_dev_count()):
        dev = ggml_backend_dev_get(i)
        free_mem = 0
        total_mem = 0
        with nogil:
            ggml_backend_dev_memory(dev, &free_mem, &total_mem)
        memset(&props, 0, sizeof(props))
        ggml_backend_dev_get_props(dev, &props)
        out.append({
            "index": i,
            "name": _s(ggml_backend_dev_name(dev)),
            "description": _s(ggml_backend_dev_description(dev)),
            "registry": _s(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev))),
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

    def __cinit__(self):
        self.c = llama_model_default_params()
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


cdef list _memory_rows(vector[_native.device_memory] & v):
    return [{"device": m.device.decode("utf-8", "replace"), "total": m.total, "free": m.free,
             "model": m.model, "context": m.context, "compute": m.compute} for m in v]


def estimate_memory(str path, ModelParams mparams, ContextParams cparams):
    """Per-device bytes llama.cpp would allocate (weights, KV cache, compute), last row the host.

    Uses libcommon's common_get_device_memory_data: the model and context are created with
    no_alloc, so nothing is actually allocated.
    """
    cdef vector[_native.device_memory] rows
    cdef uint32_t n_layer = 0, n_ctx_train = 0
    cdef string err
    cdef bytes bpath = path.encode()
    cdef const char * cpath = bpath
    cdef bint ok
    _native.log_clear()
    with nogil:
        ok = _native.estimate_device_memory(cpath, &mparams.c, &cparams.c, rows, n_layer, n_ctx_train, err)
    if not ok:
        raise ModelLoadError(f"could not estimate memory for {path}: {err.decode('utf-8', 'replace')}",
                             log=recent_log_problems())
    return {"devices": _memory_rows(rows), "n_layer": n_layer, "n_ctx_train": n_ctx_train}


def fit_params(str path, ModelParams mparams, ContextParams cparams, margins, int n_ctx_min=0):
    """common_fit_params: adjust n_gpu_layers/tensor_split (and n_ctx when 0) in place.

    margins: bytes to leave free per device of mparams' device list. Returns "success",
    "failure" (nothing fits) or raises on error.
    """
    cdef size_t nmax = llama_max_devices()
    cdef size_t nover = _native.max_tensor_buft_overrides()
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
    _native.log_clear()
    try:
        with nogil:
            status = _native.fit_params(cpath, &mparams.c, &cparams.c, mparams._split,
                                        mparams._overrides, cmargins, n_ctx_min, err)
    finally:
        free(cmargins)
    mparams.c.tensor_split = mparams._split
    if status == 2:
        raise ModelLoadError(f"memory fitting failed for {path}: {err.decode('utf-8', 'replace')}",
                             log=recent_log_problems())
    return "success" if status == 0 else "failure"


# ---------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------
cdef cbool _progress_trampoline(float progress, void * user_data) noexcept with gil:
    try:
        ret = (<object> user_data)(progress)
        return ret is None or bool(ret)
    except BaseException:
        return False  # an exception (or Ctrl-C) in the callback aborts loading


cdef class Model:
    """A loaded llama_model. Free it with close(); it is also freed when collected."""
    cdef llama_model * ptr
    cdef const llama_vocab * vocab
    cdef readonly str path
    cdef object __weakref__

    def __cinit__(self):
        self.ptr = NULL
        self.vocab = NULL

    def __init__(self, str path, ModelParams params, progress_callback=None):
        cdef bytes bpath = path.encode()
        cdef const char * cpath = bpath
        cdef llama_model_params p = params.c
        self.path = path
        if progress_callback is not None:
            p.progress_callback = <llama_progress_callback> _progress_trampoline
            p.progress_callback_user_data = <void *> progress_callback
        _native.log_clear()
        with nogil:
            self.ptr = llama_model_load_from_file(cpath, p)
        if self.ptr == NULL:
            problems = recent_log_problems()
            raise ModelLoadError(f"llama.cpp could not load {path}" +
                                 (f": {problems.splitlines()[-1]}" if problems else ""), log=problems)
        self.vocab = llama_model_get_vocab(self.ptr)

    def __dealloc__(self):
        if self.ptr != NULL:
            llama_model_free(self.ptr)
            self.ptr = NULL

    cdef int _check(self) except -1:
        if self.ptr == NULL:
            raise PolyllamaError("the model is closed")
        return 0

    def close(self):
        if self.ptr != NULL:
            llama_model_free(self.ptr)
            self.ptr = NULL
            self.vocab = NULL

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

    def tokenize(self, bytes text, bint add_special=True, bint parse_special=False):
        cdef const char * ctext = text
        cdef int32_t ntext = len(text)
        cdef int32_t cap = ntext + 8
        cdef int32_t n
        cdef llama_token * buf
        self._check()
        while True:
            buf = <llama_token *> malloc(cap * sizeof(llama_token))
            with nogil:
                n = llama_tokenize(self.vocab, ctext, ntext, buf, cap, add_special, parse_special)
            if n >= 0:
                try:
                    return [buf[i] for i in range(n)]
                finally:
                    free(buf)
            free(buf)
            if n == -2147483648 or -n <= cap:
                raise PolyllamaError("tokenization failed (input too long)")
            cap = -n

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
                            bint enable_thinking=True):
        """Format messages with the model's Jinja template through libcommon's chat code."""
        cdef _native.chat_result res
        cdef string err
        cdef string tmpl = template_override.encode()
        cdef string msgs = messages_json.encode()
        cdef string tools = tools_json.encode()
        cdef string schema = json_schema.encode()
        cdef bint ok
        self._check()
        with nogil:
            ok = _native.chat_apply(self.ptr, tmpl, msgs, tools, schema, add_generation_prompt,
                                    enable_thinking, res, err)
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


def parse_chat_reply(int fmt, str generation_prompt, bytes parser, str text):
    """The assistant message (content, reasoning, tool calls) of a finished reply."""
    cdef string out, err
    cdef string gp = generation_prompt.encode()
    cdef string pp = parser
    cdef string t = text.encode("utf-8", "surrogatepass")
    if not _native.chat_parse_reply(fmt, gp, pp, t, out, err):
        raise TemplateError(f"could not parse the reply: {err.decode('utf-8', 'replace')}")
    return json.loads(out.decode("utf-8", "replace"))


def json_schema_to_grammar(str schema_json):
    """GBNF for a JSON schema, by libcommon's json_schema_to_grammar."""
    cdef string out, err
    cdef string s = schema_json.encode()
    if not _native.json_schema_to_gbnf(s, out, err):
        raise GrammarError(f"invalid JSON schema: {err.decode('utf-8', 'replace')}")
    return out.decode("utf-8")


# ---------------------------------------------------------------------------------------
# context
# ---------------------------------------------------------------------------------------
cdef cbool _abort_trampoline(void * data) noexcept nogil:
    return (<Context> data).cancel_requested


cdef int _argmax(const float * p, int n, int exclude) noexcept nogil:
    """First index of the largest value, skipping `exclude` (-1: none).

    Two passes: the maximum over 8 independent lanes (no loop-carried dependency on a
    single running maximum, so the compiler can keep several comparisons in flight), then
    the first index holding it, which gives llama_sampler_greedy's tie-breaking.
    """
    cdef float lane[8]
    cdef float mx
    cdef int i, k
    cdef float saved = 0.0
    if exclude >= 0:
        saved = (<float *> p)[exclude]
        (<float *> p)[exclude] = -3.4028234663852886e38
    for k in range(8):
        lane[k] = p[0]
    i = 0
    while i + 8 <= n:
        for k in range(8):
            if p[i + k] > lane[k]:
                lane[k] = p[i + k]
        i += 8
    mx = lane[0]
    for k in range(1, 8):
        if lane[k] > mx:
            mx = lane[k]
    while i < n:
        if p[i] > mx:
            mx = p[i]
        i += 1
    for i in range(n):
        if p[i] == mx:
            break
    if exclude >= 0:
        (<float *> p)[exclude] = saved
    return i


cdef class Context:
    """A llama_context with its batch. Owns both; keeps its Model alive."""
    cdef llama_context * ptr
    cdef readonly Model model
    cdef llama_batch batch
    cdef int batch_cap
    cdef int n_seq_batch
    cdef public bint cancel_requested
    cdef readonly int n_vocab

    def __cinit__(self):
        self.ptr = NULL
        self.batch_cap = 0

    def __init__(self, Model model, ContextParams params):
        model._check()
        self.model = model
        self.n_vocab = model.n_vocab
        cdef llama_context_params p = params.c
        p.abort_callback = <ggml_abort_callback> _abort_trampoline
        p.abort_callback_data = <void *> self
        _native.log_clear()
        with nogil:
            self.ptr = llama_init_from_model(model.ptr, p)
        if self.ptr == NULL:
            problems = recent_log_problems()
            raise ContextError("llama.cpp could not create a context" +
                               (f": {problems.splitlines()[-1]}" if problems else ""), log=problems)
        self.batch_cap = llama_n_batch(self.ptr)
        self.n_seq_batch = max(1, llama_n_seq_max(self.ptr))
        self.batch = llama_batch_init(self.batch_cap, 0, self.n_seq_batch)

    def __dealloc__(self):
        self._free()

    cdef void _free(self) noexcept:
        if self.batch_cap:
            llama_batch_free(self.batch)
            self.batch_cap = 0
        if self.ptr != NULL:
            llama_free(self.ptr)
            self.ptr = NULL

    def close(self):
        self._free()

    cdef int _check(self) except -1:
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
        self._check(); llama_set_n_threads(self.ptr, n_threads, n_threads_batch)

    def memory(self):
        """What this context and its model actually allocated, per device, last row the host."""
        self._check()
        cdef vector[_native.device_memory] rows = _native.context_device_memory(self.ptr)
        return _memory_rows(rows)

    def clear(self):
        self._check(); llama_memory_clear(llama_get_memory(self.ptr), True)

    def seq_rm(self, int seq_id, int p0=-1, int p1=-1):
        self._check(); return llama_memory_seq_rm(llama_get_memory(self.ptr), seq_id, p0, p1)

    def seq_pos_max(self, int seq_id):
        self._check(); return llama_memory_seq_pos_max(llama_get_memory(self.ptr), seq_id)

    cdef int _decode(self, int n) except -1:
        cdef int32_t rc
        self.batch.n_tokens = n
        with nogil:
            rc = llama_decode(self.ptr, self.batch)
        if rc == 0:
            return 0
        if rc == 2:
            raise _Cancelled()
        if rc == 1:
            raise ContextError("the context is full: no KV-cache slot for the batch "
                               "(use a larger n_ctx or a shorter prompt)")
        problems = recent_log_problems()
        raise DecodeError(f"llama_decode failed with code {rc}" +
                          (f": {problems.splitlines()[-1]}" if problems else ""))

    def decode(self, tokens, int seq_id=0, int pos=0, bint logits_last=True, bint logits_all=False):
        """Decode tokens of one sequence starting at position pos, in chunks of n_batch.

        Returns the batch index of the last token's logits (for sample/logits) or -1.
        """
        cdef int n = len(tokens)
        cdef int i, k, start
        cdef int last = -1
        cdef llama_token t
        self._check()
        if n == 0:
            raise ValueError("nothing to decode: the token list is empty")
        start = 0
        while start < n:
            k = min(self.batch_cap, n - start)
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
        out = array.array("f", bytes(self.n_vocab * sizeof(float)))
        cdef float[::1] view = out
        memcpy(&view[0], p, self.n_vocab * sizeof(float))
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
            best = _argmax(p, n, exclude)
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
                "n_p_eval": d.n_p_eval, "n_eval": d.n_eval}

    def perf_reset(self):
        self._check(); llama_perf_context_reset(self.ptr)


class _Cancelled(Exception):
    """Raised inside the generation loop when cancel() aborted a decode."""


Cancelled = _Cancelled


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
            problems = recent_log_problems()
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
        cdef bytes g = grammar.encode()
        cdef bytes r = root.encode()
        cdef const char ** pats = NULL
        cdef llama_sampler * gs
        cdef list keep
        _native.log_clear()
        if lazy_patterns:
            keep = [p.encode() for p in lazy_patterns]
            pats = <const char **> malloc(len(keep) * sizeof(char *))
            for i, b in enumerate(keep):
                pats[i] = b
            try:
                gs = llama_sampler_init_grammar_lazy_patterns(self.model.vocab, g, r, pats, len(keep), NULL, 0)
            finally:
                free(pats)
        else:
            gs = llama_sampler_init_grammar(self.model.vocab, g, r)
        if gs != NULL:
            for t in prefill:
                llama_sampler_accept(gs, t)
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
ctypedef ggml_backend_reg_t (*_rpc_add_server_t)(const char * endpoint) noexcept nogil
ctypedef void (*_rpc_start_server_t)(const char * endpoint, const char * cache_dir,
                                     size_t n_threads, size_t n_devices,
                                     ggml_backend_dev_t * devices) noexcept nogil

cdef void * _rpc_proc(const char * name) except NULL:
    cdef ggml_backend_reg_t reg = ggml_backend_reg_by_name(b"RPC")
    cdef void * fn = NULL
    if reg != NULL:
        fn = ggml_backend_reg_get_proc_address(reg, name)
    if fn == NULL:
        raise PolyllamaError("this build has no RPC backend: rebuild with GGML_RPC=1 (make build-rpc)")
    return fn


def rpc_add_server(str endpoint):
    """Connect to an rpc-server and register its devices; return their ggml device indices.

    The caller must have probed the endpoint first: ggml aborts the process when it cannot
    connect. Adding an endpoint twice returns the devices registered the first time (the
    RPC registry caches servers by endpoint; ggml_backend_device_register does not dedupe).
    """
    cdef _rpc_add_server_t fn = <_rpc_add_server_t> _rpc_proc(b"ggml_backend_rpc_add_server")
    cdef bytes b = endpoint.encode()
    cdef const char * c = b
    cdef ggml_backend_reg_t reg
    cdef ggml_backend_dev_t dev
    with nogil:
        reg = fn(c)
    if reg == NULL:
        raise PolyllamaError(f"could not add RPC server {endpoint}")
    out = []
    for j in range(ggml_backend_reg_dev_count(reg)):
        dev = ggml_backend_reg_dev_get(reg, j)
        idx = -1
        for i in range(ggml_backend_dev_count()):
            if ggml_backend_dev_get(i) == dev:
                idx = i
                break
        if idx < 0:
            ggml_backend_device_register(dev)
            idx = ggml_backend_dev_count() - 1
        out.append(idx)
    return out


def rpc_start_server(str endpoint, list device_indices, cache_dir=None, int n_threads=1):
    """Serve the given local devices over ggml RPC. Blocks for the life of the server."""
    cdef _rpc_start_server_t fn = <_rpc_start_server_t> _rpc_proc(b"ggml_backend_rpc_start_server")
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
