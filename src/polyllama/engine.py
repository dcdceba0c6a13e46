"""Engine: many sequences of one LLM decoded together (continuous batching), in native code.

Every generation of an LLM runs through its engine (`llm.engine`): generate, stream,
batched prompts, chat and logits. The engine owns the LLM's context and a set of slots
(llama.cpp sequence ids, `n_seq_max` of them); each step it samples every running
sequence, decodes their tokens and the next chunk of every new prompt in one batch, and
turns tokens into text (whole characters, stop strings) before handing it out. Requests
join and leave between steps, and a prompt that shares a prefix with what a slot already
holds (the previous turn of a chat, a common system prompt) starts after that prefix.

    req = llm.engine.submit("Once upon a time", max_tokens=64)
    for delta in req:                    # Delta(text, tokens, logprobs) as they come
        print(delta.text, end="")
    req.result()                         # GenerationResult once finished
    req.cancel()                         # or llm.engine.cancel(req)

Who runs the steps: the consumers themselves by default. A thread that waits for output
while no one steps becomes the leader and steps for every request until its own has
output, so one request alone pays no hand-off between threads, and requests from several
threads are batched together. A program with its own loop (a server) calls `step()`
from one thread instead, or `run_in_thread()`.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

from .errors import (ContextError, DecodeError, GrammarError, PolyllamaError, RemoteDeviceError)

if TYPE_CHECKING:  # pragma: no cover
    from .llm import LLM, GenerationResult
    from .sampling import SamplingParams

# seconds a waiting consumer stays in native code before Python looks at its signals
# (Ctrl-C); the engine also returns after each step it ran as the leader
_POLL = 0.1


@dataclass
class Delta:
    """New output of a request: text (whole characters), the new token ids, and their
    top log-probabilities when n_probs was asked for."""
    text: str
    tokens: list
    logprobs: list | None = None


class Request:
    """One submitted generation. Iterate it for Deltas, or call result()."""

    def __init__(self, engine: "Engine", rid: int, n_prompt: int, n_probs: int):
        self._engine = engine
        self.id = rid
        self.n_prompt = n_prompt
        self._n_probs = n_probs
        self._text: list[str] = []
        self._tokens: list[int] = []
        self._logprobs: list | None = [] if n_probs else None
        self._state = None              # llamacpp.RequestState once finished
        self._released = False

    # ---- output ----
    def _absorb(self, out) -> Delta | None:
        rc, text, tokens, logprobs, state = out
        if rc < 0:
            raise PolyllamaError(f"request {self.id} is not known to the engine (released or closed)")
        if state is not None:
            self._state = state
        if not text and not tokens and not logprobs:
            return None
        self._text.append(text)
        self._tokens += tokens
        if logprobs and self._logprobs is not None:
            self._logprobs += logprobs
        return Delta(text, tokens, logprobs)

    def _wait(self, until_finished: bool) -> Delta | None:
        eng = self._engine._core_engine()
        while True:
            out = eng.wait(self.id, until_finished, _POLL)
            if out[0] != 0:
                return self._absorb(out)
            # a timeout: the interpreter runs signal handlers (Ctrl-C) before we go back in

    def poll(self) -> Delta | None:
        """New output without waiting or stepping (for a program whose own thread drives
        the engine, e.g. with run_in_thread()); None when there is none yet. Check .done
        afterwards: the last output and the end can come together."""
        if self._state is not None:
            return None
        delta = self._absorb(self._engine._core_engine().take(self.id))
        if self._state is not None:
            self._release()
        return delta

    def raise_for_error(self) -> None:
        """Raise the request's error (GrammarError, ContextError, ...) if it ended in one."""
        self._raise_error()

    def __iter__(self) -> Iterator[Delta]:
        """Deltas until the request ends (then its error, if any, is raised). Leaving the
        loop early does not cancel the request; cancel() does, and so does dropping the
        Request. An exception while waiting (Ctrl-C) cancels it."""
        while self._state is None:
            try:
                delta = self._wait(False)
            except BaseException:
                self.cancel()
                raise
            if delta is not None:
                yield delta
        self._release()
        self._raise_error()

    def text_stream(self) -> Iterator[str]:
        """The text alone, piece by piece (empty pieces left out). This iterator owns the
        request: closing it early, or dropping it, cancels the request."""
        try:
            for d in self:
                if d.text:
                    yield d.text
        finally:
            if self._state is None:
                self.cancel()
            self._release()

    def result(self) -> "GenerationResult":
        """Block until the request finished (stepping the engine if nobody else does); its
        GenerationResult. Raises the request's error, if it ended in one."""
        try:
            while self._state is None:
                self._wait(True)
        except BaseException:
            self.cancel()
            self._release()
            raise
        self._release()
        self._raise_error()
        return self._result()

    @property
    def done(self) -> bool:
        return self._state is not None

    @property
    def finish_reason(self) -> str | None:
        """None while it runs; then "stop", "length", "cancelled" or "error"."""
        return self._state.finish_reason if self._state is not None else None

    @property
    def text(self) -> str:
        """The text received so far."""
        return "".join(self._text)

    def cancel(self) -> None:
        """End the request at the next step (finish_reason "cancelled")."""
        if self._state is None and not self._released:
            self._engine._cancel_id(self.id)

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._engine._release_id(self.id)

    def __del__(self):
        try:
            self._release()
        except Exception:
            pass

    # ---- the end ----
    def _raise_error(self) -> None:
        st = self._state
        if st is None or st.finish_reason != "error":
            return
        kind, msg = st.error_kind, st.error
        if kind == "grammar":
            raise GrammarError(msg)
        if kind == "context":
            raise ContextError(msg)
        if kind == "remote":
            self._engine._lost()
            self._engine._eng.raise_remote_error(st)
            raise RemoteDeviceError(msg)   # not reached: raise_remote_error raises
        if kind == "closed":
            raise PolyllamaError("the LLM was closed while this request was running" if "lost" not in msg
                                 else msg)
        raise DecodeError(msg)

    def _result(self) -> "GenerationResult":
        from .llm import GenerationResult
        st = self._state
        n_gen = len(self._tokens)
        pp = max(0.0, st.t_first - st.t_submit)
        tg = max(0.0, st.t_end - st.t_first)
        return GenerationResult(
            text="".join(self._text), tokens=list(self._tokens), finish_reason=st.finish_reason,
            prompt_tokens=st.n_prompt, generated_tokens=n_gen, time_to_first_token=pp,
            prompt_tokens_per_second=st.n_prompt / pp if pp > 0 else 0.0,
            generation_tokens_per_second=(n_gen - 1) / tg if n_gen > 1 and tg > 0 else 0.0,
            logprobs=self._logprobs, cached_tokens=st.n_reused)

    @property
    def timings(self) -> dict | None:
        """Once finished: when it was submitted, got a slot, sampled its first token and
        ended (seconds on one monotonic clock), and how many prompt tokens were reused."""
        st = self._state
        if st is None:
            return None
        return {"t_submit": st.t_submit, "t_start": st.t_start, "t_first": st.t_first,
                "t_end": st.t_end, "n_prompt": st.n_prompt, "n_reused": st.n_reused,
                "n_generated": st.n_generated}

    @property
    def logits(self):
        """For a logits-only request, once finished: the logits after the prompt."""
        return self._state.logits if self._state is not None else None


class Engine:
    """The engine of one LLM (`llm.engine`). See the module docstring."""

    def __init__(self, llm: "LLM", core_engine):
        self._llm = llm
        self._eng = core_engine
        self._driver: threading.Thread | None = None
        self._driver_stop = threading.Event()

    def _core_engine(self):
        eng = self._eng
        if eng is not None and eng.forked:
            raise PolyllamaError(_forked_message())
        if eng is None or eng.closed:
            raise PolyllamaError("this LLM is closed")
        return eng

    # ---- requests ----
    def submit(self, prompt, params: "SamplingParams | None" = None, *, truncate: bool = False,
               **kwargs) -> Request:
        """Queue one prompt (a str or token ids) with SamplingParams (or their fields as
        keyword arguments); returns its Request at once."""
        from .sampling import SamplingParams
        params = SamplingParams.from_kwargs(params, **kwargs)
        return self._llm._submit(prompt, params, truncate)

    def cancel(self, request: Request) -> None:
        request.cancel()

    def cancel_all(self) -> None:
        """Cancel every request of this engine (what LLM.cancel() does)."""
        if self._eng is not None and not self._eng.closed:
            self._eng.cancel_all()

    def _cancel_id(self, rid: int) -> None:
        if self._eng is not None:
            self._eng.cancel(rid)

    def _release_id(self, rid: int) -> None:
        if self._eng is not None and not self._eng.closed:
            self._eng.release(rid)

    def _submit_tokens(self, tokens: Sequence[int], *, max_tokens: int = -1, limit: int = 0,
                       n_probs: int = 0, greedy: bool = True, banned: int = -1,
                       ignore_eos: bool = False, stops: Sequence[str] = (), sampler=None,
                       logits_only: bool = False) -> Request:
        eng = self._core_engine()
        rid = eng.submit(tokens, max_tokens, limit, n_probs, greedy, banned, ignore_eos,
                         tuple(stops), sampler, logits_only)
        return Request(self, rid, len(tokens), n_probs)

    def _lost(self) -> None:
        """An RPC server was lost during a decode: the context can never be freed."""
        self._llm._context_lost()

    # ---- driving ----
    def step(self) -> tuple[int, list[int]]:
        """Run one step; returns (requests live or queued afterwards, ids with new output).
        For programs with their own loop; consumers step by themselves otherwise."""
        return self._core_engine().step()

    def wait_for_work(self, timeout: float = 0.1) -> bool:
        return self._core_engine().wait_for_work(timeout)

    def run_in_thread(self, on_step=None) -> threading.Thread:
        """Start a thread that steps whenever there is work, calling on_step(changed_ids)
        after each step (from that thread). stop_thread() ends it."""
        if self._driver is not None and self._driver.is_alive():
            raise PolyllamaError("the engine already has a driver thread")
        self._driver_stop.clear()

        def drive():
            eng = self._eng
            while not self._driver_stop.is_set() and eng is not None and not eng.closed:
                try:
                    if not eng.wait_for_work(0.05):
                        continue
                    _, changed = eng.step()
                except PolyllamaError:
                    break
                if on_step is not None and changed:
                    on_step(changed)
        self._driver = threading.Thread(target=drive, name="polyllama-engine", daemon=True)
        self._driver.start()
        return self._driver

    def stop_thread(self, timeout: float | None = 5.0) -> None:
        self._driver_stop.set()
        if self._driver is not None:
            self._driver.join(timeout)
            self._driver = None

    # ---- facts ----
    @property
    def n_slots(self) -> int:
        """Sequences decoded together at most (the LLM's n_seq_max)."""
        return self._core_engine().n_slots

    def stats(self) -> dict:
        """Counters: steps, tokens decoded and generated, prompt tokens reused from the
        cache, live and queued requests, idle slots holding a prefix, KV cells in use."""
        return self._core_engine().stats()

    def clear_cache(self) -> None:
        """Forget every cached prefix (the next prompts are read in full)."""
        self._core_engine().clear_cache()

    def close(self) -> None:
        self.stop_thread()
        if self._eng is not None:
            self._eng.close()
            self._eng = None


def default_sample_threads(on_gpu: bool) -> int:
    """LLM(n_threads_sample=None): the threads that share the picks (csrc/scan_pool.h), one
    on the CPU (ggml's own threads need the cores), half the cores and at most 8 when the
    model runs on a GPU and the host's cores are idle."""
    if not on_gpu:
        return 1
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def _forked_message() -> str:
    from ._llamacpp_loader import llamacpp
    return llamacpp.FORKED_MESSAGE


def _now() -> float:
    return time.perf_counter()
