# Included by _llamacpp.pyx: the owner of the native sequence engine (csrc/engine.h).
#
# The engine runs llama_decode and sampling for every live sequence of one Context; this
# class only carries requests in and output out. Every call that can wait or decode runs
# without the GIL. Lifetime: the engine keeps its Context (and so the model) alive; close()
# wakes every thread waiting in it, waits for them to leave, then frees it.

FINISH_REASONS = {csrc.FINISH_STOP: "stop", csrc.FINISH_LENGTH: "length",
                  csrc.FINISH_CANCELLED: "cancelled", csrc.FINISH_ERROR: "error"}
ERROR_KINDS = {csrc.ERROR_GRAMMAR: "grammar", csrc.ERROR_DECODE: "decode",
               csrc.ERROR_CONTEXT: "context", csrc.ERROR_REMOTE: "remote",
               csrc.ERROR_CLOSED: "closed"}


FORKED_MESSAGE = ("this LLM was loaded before os.fork(), in the parent process: llama.cpp's threads and "
                  "device state do not exist in this child. Load the model again in the child (with "
                  "multiprocessing: load it inside the worker, or use the 'spawn' or 'forkserver' start "
                  "method)")


cdef class RequestState:
    """The end of a request: how it finished and its counters (times in seconds)."""
    cdef readonly str finish_reason          # "stop", "length", "cancelled" or "error"
    cdef readonly str error_kind             # "" or one of ERROR_KINDS' values
    cdef readonly int error_code             # llama_decode's code; the remote_status of "remote"
    cdef readonly str error
    cdef readonly int n_prompt, n_reused, n_generated
    cdef readonly double t_submit, t_start, t_first, t_end
    cdef readonly object logits              # array('f') for logits_only requests, else None


cdef object _final_state(csrc.request_output & out):
    cdef RequestState st = RequestState.__new__(RequestState)
    st.finish_reason = FINISH_REASONS.get(out.finish, "error")
    st.error_kind = ERROR_KINDS.get(out.error_kind, "")
    st.error_code = out.error_code
    st.error = out.error.decode("utf-8", "replace")
    st.n_prompt = out.n_prompt
    st.n_reused = out.n_reused
    st.n_generated = out.n_generated
    st.t_submit = out.t_submit
    st.t_start = out.t_start
    st.t_first = out.t_first
    st.t_end = out.t_end
    if out.logits.size():
        a = array.array("f")
        a.frombytes(PyBytes_FromStringAndSize(<char *> out.logits.data(), out.logits.size() * sizeof(float)))
        st.logits = a
    else:
        st.logits = None
    return st


cdef tuple _output_tuple(int rc, csrc.request_output & out):
    """(rc, text, tokens, logprobs or None, RequestState or None)."""
    cdef size_t i, j
    text = out.text.decode("utf-8", "replace") if out.text.size() else ""
    tokens = [out.tokens[i] for i in range(out.tokens.size())]
    logprobs = None
    if out.logprobs.size():
        logprobs = [[(out.logprobs[i][j].first, out.logprobs[i][j].second)
                     for j in range(out.logprobs[i].size())] for i in range(out.logprobs.size())]
    final = _final_state(out) if out.finish != csrc.FINISH_NONE else None
    return rc, text, tokens, logprobs, final


# The C++ engine's destructor waits for the threads still stepping on the context (inside
# llama_decode, or its pick helpers reading the context's logits), so the Context must still
# be alive when it runs: without no_gc_clear a garbage collection could clear self.context,
# and free the context, first.
@cython.no_gc_clear
cdef class Engine:
    """Continuous batching over one Context (see csrc/engine.h)."""
    cdef csrc.engine * ptr
    cdef readonly Context context
    cdef int inside           # threads in a call that released the GIL
    cdef bint closing
    cdef int pid              # the process that made it (see _forked in _llamacpp.pyx)

    def __cinit__(self):
        self.ptr = NULL
        self.inside = 0
        self.closing = False
        self.pid = getpid()

    def __init__(self, Context context, int sample_threads=1, bint aligned_regions=True,
                 bint device_sampling=False):
        context._check()
        self.context = context
        self.ptr = new csrc.engine(context.ptr, context.model.ptr, context.worker,
                                      context.remote_timeout, sample_threads, aligned_regions,
                                      device_sampling)

    def __dealloc__(self):
        if self.ptr != NULL and not _forked(self.pid):
            with nogil:
                del self.ptr
        self.ptr = NULL

    cdef int _enter(self) except -1:
        if _forked(self.pid):
            raise PolyllamaError(FORKED_MESSAGE)
        if self.ptr == NULL or self.closing:
            raise PolyllamaError("the engine is closed")
        self.inside += 1
        return 0

    def close(self):
        """Fail what is still running (error_kind "closed"), wait for the threads inside to
        leave, and free the engine. Idempotent."""
        if self.ptr == NULL:
            return
        if _forked(self.pid):
            self.ptr = NULL      # the parent's: its threads and locks are not in this process
            return
        self.closing = True
        with nogil:
            self.ptr.shutdown()
        while self.inside > 0:
            with nogil:
                self.ptr.shutdown()     # wakes whoever waits again
                usleep(1000)
        with nogil:
            del self.ptr
        self.ptr = NULL

    @property
    def closed(self):
        return self.ptr == NULL or self.closing

    @property
    def forked(self):
        """Made in another process (this is a child of os.fork()): unusable here."""
        return _forked(self.pid)

    @property
    def n_slots(self):
        self._enter()
        self.inside -= 1
        return self.ptr.n_slots()

    def submit(self, tokens, int max_tokens=-1, int limit=0, int n_probs=0, bint greedy=True,
               int banned=-1, bint ignore_eos=False, stops=(), Sampler sampler=None,
               bint logits_only=False):
        """Queue a request; returns its id. A sampler (when not greedy) is handed over: the
        engine frees it with the request."""
        cdef csrc.request_params p
        cdef int64_t rid
        cdef int n_vocab = self.context.n_vocab
        self._enter()
        try:
            p.prompt.reserve(len(tokens))
            for t in tokens:
                if t < 0 or t >= n_vocab:
                    raise ValueError(f"token id {t} out of range 0..{n_vocab - 1}")
                p.prompt.push_back(t)
            if p.prompt.size() == 0:
                raise ValueError("the prompt is empty")
            p.max_tokens = max_tokens
            p.limit = limit
            p.n_probs = n_probs
            p.greedy = greedy
            p.banned = banned
            p.ignore_eos = ignore_eos
            p.logits_only = logits_only
            for s in stops:
                p.stops.push_back(s.encode("utf-8"))
            p.sampler = NULL
            if sampler is not None:
                p.sampler = sampler.ptr
                sampler.ptr = NULL
            with nogil:
                rid = self.ptr.submit(p)
            return rid
        finally:
            self.inside -= 1

    def wait(self, int64_t rid, bint until_finished=False, double timeout=0.1):
        """Wait (stepping when nobody else does) for new output of a request.

        Returns (rc, text, tokens, logprobs, state): rc 1 with output, 0 on timeout, -1 for
        an unknown id; state is a RequestState once the request has finished."""
        cdef csrc.request_output out
        cdef int rc
        self._enter()
        try:
            with nogil:
                rc = self.ptr.wait(rid, until_finished, timeout, out)
            return _output_tuple(rc, out)
        finally:
            self.inside -= 1

    def take(self, int64_t rid):
        """wait() without waiting or stepping."""
        cdef csrc.request_output out
        cdef int rc
        self._enter()
        try:
            rc = self.ptr.take(rid, out)
            return _output_tuple(rc, out)
        finally:
            self.inside -= 1

    def raise_remote_error(self, RequestState st):
        """RemoteDeviceError for a request that ended with error_kind "remote", worded as
        every other guarded call's (names the endpoints; see _raise_remote)."""
        cdef string err = st.error.encode()
        _raise_remote(st.error_code, err, "decoding", self.context.model._params.devices)

    def cancel(self, int64_t rid):
        if self.ptr != NULL and not _forked(self.pid):
            self.ptr.cancel(rid)

    def cancel_all(self):
        if self.ptr != NULL and not _forked(self.pid):
            self.ptr.cancel_all()

    def release(self, int64_t rid):
        """The consumer is gone: cancel the request if it runs, then forget it."""
        if self.ptr != NULL and not _forked(self.pid):
            self.ptr.release(rid)

    def step(self):
        """One engine step; returns (live + queued requests, ids whose output changed)."""
        cdef vector[int64_t] changed
        cdef int n
        self._enter()
        try:
            with nogil:
                n = self.ptr.step(changed)
            return n, [changed[i] for i in range(changed.size())]
        finally:
            self.inside -= 1

    def wait_for_work(self, double timeout=0.1):
        cdef cbool work
        self._enter()
        try:
            with nogil:
                work = self.ptr.wait_for_work(timeout)
            return work
        finally:
            self.inside -= 1

    def clear_cache(self):
        self._enter()
        try:
            with nogil:
                self.ptr.clear_cache()
        finally:
            self.inside -= 1

    def stats(self):
        cdef csrc.engine_stats st
        self._enter()
        try:
            st = self.ptr.stats()
        finally:
            self.inside -= 1
        return {"steps": st.steps, "tokens_decoded": st.tokens_decoded,
                "tokens_generated": st.tokens_generated,
                "prompt_tokens_reused": st.prompt_tokens_reused,
                "tokens_picked_on_device": st.tokens_picked_on_device,
                "tokens_picked_in_ranges": st.tokens_picked_in_ranges, "live": st.live,
                "queued": st.queued, "cached_slots": st.cached_slots,
                "kv_cells_used": st.kv_cells_used, "decode_seconds": st.decode_seconds,
                "wait_seconds": st.wait_seconds, "sample_seconds": st.sample_seconds,
                "step_seconds": st.step_seconds}
