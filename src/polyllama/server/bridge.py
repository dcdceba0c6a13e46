"""The engine on one thread, the HTTP handlers on the event loop, and what connects them.

Why this file: the engine must be stepped by exactly one thread (Engine.run_in_thread), and
a handler on the event loop must never block (Request.result() or iterating a Request
would wait, and step the engine itself). So the driver thread tells the loop once per
step which requests changed (one loop.call_soon_threadsafe per step, not per token), the
loop sets those requests' asyncio.Events, and each handler then takes everything new with
Request.poll(). A handler that is slow to send (a lagging client) finds several tokens at
its next poll and sends them as one chunk: output is coalesced in the engine, never queued
per token in Python.

A Job is what one HTTP request submitted: one Request per choice (n > 1 submits n), one
Event for all of them. The Bridge also keeps the server's admission count (requests
submitted and not yet finished), which bounds the queue.
"""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # pragma: no cover
    from ..engine import Delta, Request
    from ..llm import LLM

# the loop wakes every waiting handler this often even without news from the engine: a
# safety net for a request that ends without a step reporting it (closed engine)
_SWEEP_S = 0.5


class Choice:
    """One Request of a Job and what it produced so far."""
    __slots__ = ("index", "request", "turn", "text", "tokens", "logprobs", "finished", "prompt_index")

    def __init__(self, index: int, request: "Request", turn=None):
        self.index = index
        self.request = request
        self.turn = turn               # ChatTurn for chat completions
        self.text: list[str] = []
        self.tokens: list[int] = []
        self.logprobs: list = []
        self.finished = False
        self.prompt_index = index      # completions: which prompt of the list it answers

    def take(self) -> "Delta | None":
        """New output since the last take (None when there is none)."""
        if self.finished:
            return None
        d = self.request.poll()
        if d is not None:
            if d.text:
                self.text.append(d.text)
            if d.tokens:
                self.tokens += d.tokens
            if d.logprobs:
                self.logprobs += d.logprobs
        if self.request.done:
            self.finished = True
        return d


class Job:
    """The engine requests of one HTTP request, with one wake-up Event."""

    def __init__(self, bridge: "Bridge", choices: list[Choice]):
        self.bridge = bridge
        self.choices = choices
        self.event = asyncio.Event()
        self.disconnected = False
        self.t_start = time.perf_counter()
        self._released = False
        self._reserved = 0                # admission slots to return when released
        self.watcher: asyncio.Task | None = None   # the task that notices a disconnect

    @property
    def done(self) -> bool:
        return all(c.finished for c in self.choices)

    async def wait(self) -> None:
        """Until a step changed one of this job's requests (or the sweep, or a disconnect)."""
        await self.event.wait()
        self.event.clear()

    def cancel(self) -> None:
        """The client went away: every request of the job ends at the engine's next step."""
        self.disconnected = True
        for c in self.choices:
            c.request.cancel()
        self.event.set()

    def release(self) -> None:
        """The handler is finished with the job (answered, failed or cancelled)."""
        if self._released:
            return
        self._released = True
        for c in self.choices:
            if not c.request.done:
                c.request.cancel()
        self.bridge._forget(self)


class Bridge:
    """Drives llm.engine from its own thread and wakes the event loop's jobs."""

    def __init__(self, llm: "LLM", loop: asyncio.AbstractEventLoop, *, capacity: int,
                 on_finish: Callable[[Choice], None] | None = None):
        self.llm = llm
        self.loop = loop
        self.capacity = capacity          # engine requests admitted at once (slots + queue)
        self.outstanding = 0              # engine requests submitted and not yet released
        self._by_id: dict[int, Job] = {}
        self._jobs: set[Job] = set()
        self._on_finish = on_finish
        self._closed = False
        self._sweeper = loop.create_task(self._sweep())
        llm.engine.run_in_thread(self._on_step)

    # ---- the engine thread ----
    def _on_step(self, changed: list[int]) -> None:
        try:
            self.loop.call_soon_threadsafe(self._wake, changed)
        except RuntimeError:      # the loop is closed: the server is going away
            pass

    # ---- the event loop ----
    def _wake(self, changed: list[int]) -> None:
        by_id = self._by_id
        for rid in changed:
            job = by_id.get(rid)
            if job is not None:
                job.event.set()

    async def _sweep(self) -> None:
        while not self._closed:
            await asyncio.sleep(_SWEEP_S)
            for job in self._jobs:
                job.event.set()

    def free(self) -> int:
        return self.capacity - self.outstanding

    def admit(self, n: int) -> bool:
        """Reserve room for n engine requests; False when the queue is full."""
        if self.outstanding + n > self.capacity:
            return False
        self.outstanding += n
        return True

    def unadmit(self, n: int) -> None:
        self.outstanding -= n

    def attach(self, choices: list[Choice], reserved: int) -> Job:
        """Watch the requests of a new job. `reserved` is what admit() reserved for it
        (returned when the job is released)."""
        job = Job(self, choices)
        job._reserved = reserved
        for c in choices:
            self._by_id[c.request.id] = job
        self._jobs.add(job)
        # output may have arrived between submit() and now: look at once
        job.event.set()
        return job

    def _forget(self, job: Job) -> None:
        for c in job.choices:
            self._by_id.pop(c.request.id, None)
            if self._on_finish is not None:
                self._on_finish(c)
        self._jobs.discard(job)
        self.outstanding -= job._reserved

    def stop(self) -> None:
        """Cancel what runs and stop the driver thread (the LLM stays open)."""
        self._closed = True
        self._sweeper.cancel()
        for job in list(self._jobs):
            job.cancel()
        self.llm.engine.stop_thread()
