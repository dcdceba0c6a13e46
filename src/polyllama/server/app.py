"""The OpenAI-compatible routes and the app factory (Starlette, served by uvicorn).

Why this file: it turns HTTP requests into engine requests and engine output into OpenAI
responses, and nothing else. Parsing and validation are schemas.py's, the hand-off between
the engine thread and the event loop is bridge.py's, the counters are metrics.py's.

Every generation is a Request of the LLM's one engine (llm.engine): chat turns through
LLM.submit_chat, completions through Engine.submit. `n` choices are n requests (the i-th
samples with seed + i). Requests beyond the engine's slots wait in the engine's queue; the
server admits at most slots + `queue` of them and answers 429 beyond that, 503 while the
model loads or the server stops. Submitting (chat template, tokenizing) runs in a worker
thread, so a long prompt never holds up the event loop, and the handlers only poll.

Streams are Server-Sent Events written by this module's own ASGI response: the headers go
out once the first token is sampled (an error at the first token, e.g. a grammar that
allows nothing, is still a 400), and a client that disconnects has its requests cancelled
as soon as uvicorn sees the connection close, so the engine frees the slot at its next step.
An SSE event is one preformatted string: only the new text goes through json.dumps.
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import math
import os
import struct
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, Callable

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response
from starlette.routing import Route

from ..errors import (ContextError, ContextOverflowError, GrammarError, PolyllamaError, TemplateError)
from ..sampling import SamplingParams
from .bridge import Bridge, Choice, Job
from .metrics import Metrics
from .schemas import (APIError, ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                      EmbeddingRequest, ToolChoiceNamed, TokenizeRequest, validation_error)

log = logging.getLogger("polyllama.server")

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]
DONE = b"data: [DONE]\n\n"
_BAN = -100.0        # OpenAI: a logit_bias of -100 bans the token


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body, ensure_ascii=False).encode(), status_code=status,
                    media_type="application/json")


class RequestLog:
    """What the one log line of a request says."""
    __slots__ = ("status", "n_prompt", "n_gen", "ttft", "note")

    def __init__(self):
        self.status = 200
        self.n_prompt = 0
        self.n_gen = 0
        self.ttft: float | None = None
        self.note = ""

    def add(self, choices: list[Choice]) -> None:
        for c in choices:
            t = c.request.timings
            if t is not None:
                self.n_prompt += t["n_prompt"]
                if t["t_first"] and c.tokens and (self.ttft is None or t["t_first"] - t["t_submit"] < self.ttft):
                    self.ttft = t["t_first"] - t["t_submit"]
            self.n_gen += len(c.tokens)


class ServerState:
    """The LLM, the bridge, the counters and the settings of one server."""

    def __init__(self, llm=None, *, loader: Callable[..., Any] | None = None, model_alias: str | None = None,
                 model_path: str | None = None, api_key: str | None = None, queue: int = 64,
                 on_ready: Callable[[Any], None] | None = None,
                 on_fatal: Callable[[BaseException], None] | None = None, owns_llm: bool = False):
        if llm is None and loader is None:
            raise ValueError("give an LLM or a loader")
        self.llm = llm
        self.loader = loader
        self.owns_llm = owns_llm or llm is None
        self.api_key = api_key or None
        self.queue = queue
        self.on_ready = on_ready
        self.on_fatal = on_fatal
        self.status = "loading"
        self.metrics = Metrics()
        self.bridge: Bridge | None = None
        self.stopping = False
        path = model_path or (llm.model_path if llm is not None else "")
        base = os.path.basename(path)
        stem = base[:-5] if base.endswith(".gguf") else base
        self.model_id = model_alias or stem or "model"
        self.model_names = {n for n in (model_alias, base, stem, path) if n}
        self.created = int(os.path.getmtime(path)) if path and os.path.exists(path) else int(time.time())
        self._pieces: dict[int, tuple[str, list[int]]] = {}
        self._load_task: asyncio.Task | None = None
        self._vocab: int | None = None

    # ---- lifetime ----
    def _ready(self, llm) -> None:
        self.llm = llm
        loop = asyncio.get_running_loop()
        self.bridge = Bridge(llm, loop, capacity=llm.engine.n_slots + self.queue, on_finish=self._finished)
        self.status = "ok"
        if self.on_ready is not None:
            self.on_ready(llm)

    async def _load(self) -> None:
        try:
            llm = await asyncio.to_thread(self.loader, progress=lambda _f: not self.stopping)
        except BaseException as e:  # noqa: BLE001 - reported, the server stops
            self.status = "error"
            if self.on_fatal is not None:
                self.on_fatal(e)
            else:
                log.error("polyllama serve: the model could not be loaded: %s", e)
            return
        if self.stopping:
            llm.close()
            return
        self._ready(llm)

    async def start(self) -> None:
        if self.llm is not None:
            self._ready(self.llm)
        else:
            self._load_task = asyncio.ensure_future(self._load())

    def begin_shutdown(self) -> None:
        """New requests get 503 from now on; the ones in flight go on until uvicorn's
        graceful timeout, after which their tasks are cancelled (and so their requests)."""
        self.stopping = True
        if self.status == "ok":
            self.status = "stopping"

    async def close(self) -> None:
        self.begin_shutdown()
        if self._load_task is not None and not self._load_task.done():
            await self._load_task          # the progress callback aborts the load
        if self.bridge is not None:
            self.bridge.stop()
            self.bridge = None
        if self.owns_llm and self.llm is not None:
            await asyncio.to_thread(self.llm.close)
        self.status = "stopped"

    # ---- helpers ----
    def _finished(self, c: Choice) -> None:
        self.metrics.finished(c.request.timings, len(c.tokens))

    def piece(self, token: int) -> tuple[str, list[int]]:
        p = self._pieces.get(token)
        if p is None:
            b = self.llm.token_piece(token)
            p = (b.decode("utf-8", "replace"), list(b))
            if len(self._pieces) < 1 << 17:
                self._pieces[token] = p
        return p

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.model_names:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {self.model_id!r} "
                                "(GET /v1/models)", param="model", code="model_not_found")

    def sampling(self, body, max_tokens: int | None, n_probs: int) -> SamplingParams:
        d = SamplingParams()
        bias: dict[int, float] = {}
        n_vocab = self._n_vocab()
        for k, v in (body.logit_bias or {}).items():
            t = int(k)
            if not 0 <= t < n_vocab:
                raise APIError(400, f"logit_bias names token {t}, out of range 0..{n_vocab - 1}",
                               param="logit_bias", code="invalid_value")
            bias[t] = -math.inf if v <= _BAN else float(v)
        seed = body.seed
        seed = None if seed is None or seed < 0 else seed & 0xFFFFFFFF
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=0.8 if body.temperature is None else body.temperature,
                top_p=d.top_p if body.top_p is None else body.top_p,
                top_k=d.top_k if body.top_k is None else body.top_k,
                min_p=d.min_p if body.min_p is None else body.min_p,
                typical_p=d.typical_p if body.typical_p is None else body.typical_p,
                repeat_penalty=d.repeat_penalty if body.repeat_penalty is None else body.repeat_penalty,
                repeat_last_n=d.repeat_last_n if body.repeat_last_n is None else body.repeat_last_n,
                presence_penalty=body.presence_penalty or 0.0,
                frequency_penalty=body.frequency_penalty or 0.0,
                seed=seed, stop=tuple(body.stop or ()), logit_bias=bias, grammar=body.grammar,
                n_probs=n_probs, ignore_eos=body.ignore_eos)
        except (TypeError, ValueError) as e:
            raise APIError(400, str(e), code="invalid_value") from None

    def _n_vocab(self) -> int:
        if self._vocab is None:
            self._vocab = self.llm.metadata["n_vocab"]
        return self._vocab

    async def submit(self, n: int, make: Callable[[], list[Choice]], receive, log_: RequestLog,
                     what: str) -> Job:
        """Admit n engine requests, submit them from a worker thread, watch them."""
        bridge = self.bridge
        if bridge is None or self.stopping:
            raise _unavailable(self)
        if not bridge.admit(n):
            self.metrics.rejected_queue_full += 1
            raise APIError(429, f"the server is busy: {bridge.outstanding} requests are running or "
                                f"queued (at most {bridge.capacity}); retry later",
                           type="rate_limit_error", code="queue_full")
        try:
            choices = await asyncio.to_thread(make)
        except BaseException as e:
            bridge.unadmit(n)
            raise _submit_error(e, what) from None
        job = bridge.attach(choices, n)
        job.watcher = asyncio.ensure_future(_watch_disconnect(receive, job, self.metrics))
        return job


def _unavailable(state: ServerState) -> APIError:
    if state.status == "loading":
        return APIError(503, "the model is loading; retry in a moment", type="unavailable_error",
                        code="loading")
    return APIError(503, "the server is shutting down", type="unavailable_error", code="shutting_down")


def _submit_error(e: BaseException, what: str) -> BaseException:
    """An exception of LLM.submit_chat / Engine.submit as the OpenAI error it means."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, ContextOverflowError):
        return APIError(400, str(e), param=what, code="context_length_exceeded")
    if isinstance(e, GrammarError):
        return APIError(400, f"the grammar or JSON schema cannot be used: {e}", param=None,
                        code="invalid_grammar")
    if isinstance(e, TemplateError):
        return APIError(400, f"the chat template cannot format these messages: {e}", param="messages",
                        code="invalid_messages")
    if isinstance(e, PolyllamaError) and "closed" in str(e):
        return APIError(503, "the server is shutting down", type="unavailable_error", code="shutting_down")
    if isinstance(e, (ValueError, TypeError)):
        return APIError(400, str(e), param=what, code="invalid_value")
    return e


def _end_error(c: Choice) -> APIError | None:
    """The error a finished request ended in, as an API error (None if it did not)."""
    try:
        c.request.raise_for_error()
    except GrammarError as e:
        return APIError(400, f"generation stopped: {e}", code="invalid_grammar")
    except ContextError as e:
        return APIError(400, f"the context is full: {e}", code="context_length_exceeded")
    except PolyllamaError as e:
        if "closed" in str(e):
            return APIError(503, "the server is shutting down", type="unavailable_error", code="shutting_down")
        return APIError(500, f"generation failed: {e}", type="server_error", code="generation_failed")
    return None


async def _watch_disconnect(receive, job: Job, metrics: Metrics) -> None:
    """Cancel the job's requests as soon as the client's connection closes."""
    try:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                if not job.done:
                    metrics.cancelled_disconnect += 1
                    job.cancel()
                return
    except Exception:  # noqa: BLE001 - a receive after the response finished
        return


async def _wait_started(job: Job) -> None:
    """Until every choice has sampled a token or finished (a stream answers then)."""
    while True:
        for c in job.choices:
            c.take()
        if job.disconnected or all(c.finished or c.tokens for c in job.choices):
            return
        await job.wait()


async def _wait_done(job: Job) -> None:
    while True:
        for c in job.choices:
            c.take()
        if job.disconnected or job.done:
            return
        await job.wait()


def _first_error(job: Job) -> APIError | None:
    """A choice that ended in an error before producing anything fails the request."""
    for c in job.choices:
        if c.finished and not c.tokens:
            err = _end_error(c)
            if err is not None:
                return err
    return None


def _usage(choices: list[Choice]) -> dict:
    prompt, cached = 0, 0
    seen = set()
    for c in choices:
        t = c.request.timings
        if t is None:
            continue
        key = c.prompt_index
        if key in seen:
            continue   # the n choices of one prompt count its tokens once, as OpenAI
        seen.add(key)
        prompt += t["n_prompt"]
        cached += t["n_reused"]
    gen = sum(len(c.tokens) for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": gen, "total_tokens": prompt + gen,
            "prompt_tokens_details": {"cached_tokens": cached}}


class SSEResponse:
    """A text/event-stream answer: the body comes from an async iterator of bytes; the
    job's requests are released (cancelled if still running) however the stream ends."""

    def __init__(self, body, job: Job | None, on_end: Callable[[], None]):
        self.body = body
        self.job = job
        self.on_end = on_end

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            async for chunk in self.body:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if self.job is not None:
                if self.job.watcher is not None:
                    self.job.watcher.cancel()
                self.job.release()
            self.on_end()


# ---- chat ------------------------------------------------------------------------------------
def _chat_logprobs(state: ServerState, c: Choice, start: int, end: int, k: int) -> list[dict]:
    out = []
    for tok, top in zip(c.tokens[start:end], c.logprobs[start:end]):
        s, b = state.piece(tok)
        lp = next((v for t, v in top if t == tok), -math.inf)
        out.append({"token": s, "logprob": lp, "bytes": b,
                    "top_logprobs": [{"token": state.piece(t)[0], "logprob": v, "bytes": state.piece(t)[1]}
                                     for t, v in top[:k]]})
    return out


class _ChatDiff:
    """Turns a growing reply into OpenAI deltas through the chat format's parser
    (ChatTurn.parse with partial=True): content, reasoning and tool calls as they appear."""

    def __init__(self, turn):
        self.turn = turn
        self.sent = {"content": "", "reasoning_content": ""}
        self.calls: list[list[str]] = []     # [id, name, arguments sent]

    def update(self, text: str, final: bool) -> list[dict]:
        msg = self.turn.parse(text, partial=not final)
        deltas = []
        for key in ("reasoning_content", "content"):
            v = msg.get(key) or ""
            sent = self.sent[key]
            if len(v) > len(sent) and v.startswith(sent):
                deltas.append({key: v[len(sent):]})
                self.sent[key] = v
        for i, tc in enumerate(msg.get("tool_calls") or ()):
            fn = tc.get("function") or {}
            name, args = fn.get("name") or "", fn.get("arguments") or ""
            if i >= len(self.calls):
                if not name:
                    break
                self.calls.append([tc.get("id") or f"call_{uuid.uuid4().hex[:24]}", name, ""])
                deltas.append({"tool_calls": [{"index": i, "id": self.calls[i][0], "type": "function",
                                               "function": {"name": name, "arguments": ""}}]})
            sent = self.calls[i][2]
            if len(args) > len(sent) and args.startswith(sent):
                deltas.append({"tool_calls": [{"index": i, "function": {"arguments": args[len(sent):]}}]})
                self.calls[i][2] = args
        return deltas


def _message(c: Choice) -> dict:
    """The final assistant message of a chat choice, as OpenAI has it."""
    msg = c.turn.parse("".join(c.text))
    out: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or None}
    if msg.get("reasoning_content"):
        out["reasoning_content"] = msg["reasoning_content"]
    calls = msg.get("tool_calls")
    if calls:
        out["tool_calls"] = [{"id": tc.get("id") or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                              "function": {"name": tc["function"]["name"],
                                           "arguments": tc["function"].get("arguments") or "{}"}}
                             for tc in calls]
    elif out["content"] is None:
        out["content"] = ""
    return out


def _finish_reason(c: Choice, has_tool_calls: bool = False) -> str:
    st = c.request.finish_reason
    if has_tool_calls and st == "stop":
        return "tool_calls"
    return "length" if st == "length" else "stop"


async def chat_completions(state: ServerState, request: HTTPRequest, body: ChatCompletionRequest,
                           rlog: RequestLog):
    state.check_model(body.model)
    llm = state.llm
    max_tokens = body.max_completion_tokens or body.max_tokens
    n_probs = max(body.top_logprobs or 0, 1) if body.logprobs else 0
    params = state.sampling(body, max_tokens, n_probs)
    messages = [m.as_dict() for m in body.messages]
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    choice = body.tool_choice
    if isinstance(choice, ToolChoiceNamed):
        tools = [t for t in tools if t["function"]["name"] == choice.function.name]
        choice = "required"
    choice = choice or "auto"
    rf = body.response_format.as_dict() if body.response_format is not None else None
    seeds = _seeds(params, body.n)

    schema = (rf.get("json_schema") or {}).get("schema") or rf.get("schema") if rf else None

    def make() -> list[Choice]:
        if schema is not None:
            # a schema llama.cpp cannot use fails in the chat template's code too, where it
            # would read as a template error: check it on its own first
            from .._llamacpp_loader import llamacpp
            llamacpp.json_schema_to_grammar(json.dumps(schema))
        out: list[Choice] = []
        try:
            for i in range(body.n):
                req, turn = llm.submit_chat(messages, seeds[i], tools=tools, response_format=rf,
                                            tool_choice=choice, parallel_tool_calls=body.parallel_tool_calls)
                c = Choice(i, req, turn)
                c.prompt_index = 0        # the n choices share one prompt (usage counts it once)
                out.append(c)
        except BaseException:
            for c in out:
                c.request.cancel()
            raise
        return out

    job = await state.submit(body.n, make, request.receive, rlog, "messages")
    parse = bool(tools) and choice != "none" or any(c.turn.structured for c in job.choices)
    cid = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    k = body.top_logprobs or 0
    if not body.stream:
        try:
            await _wait_done(job)
            if job.disconnected:
                rlog.status = 499
                return None
            for c in job.choices:
                err = _end_error(c)
                if err is not None:
                    raise err
            choices = []
            for c in job.choices:
                msg = _message(c)
                entry = {"index": c.index, "message": msg, "logprobs": None,
                         "finish_reason": _finish_reason(c, "tool_calls" in msg)}
                if body.logprobs:
                    entry["logprobs"] = {"content": _chat_logprobs(state, c, 0, len(c.tokens), k)}
                choices.append(entry)
            rlog.add(job.choices)
            return _json({"id": cid, "object": "chat.completion", "created": created, "model": state.model_id,
                          "system_fingerprint": _FINGERPRINT, "choices": choices, "usage": _usage(job.choices)})
        finally:
            job.watcher.cancel()
            job.release()

    try:
        await _wait_started(job)
        err = _first_error(job)
        if err is not None:
            raise err
    except BaseException:
        job.watcher.cancel()
        job.release()
        raise
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    head = chat_head(cid, created, state.model_id)

    def chunk(index: int, delta: str, logprobs: str = "null", finish: str = "null") -> bytes:
        return chat_chunk(head, index, None, delta, logprobs, finish)

    async def events():
        differs = {c.index: _ChatDiff(c.turn) for c in job.choices} if parse else None
        sent_text = {c.index: 0 for c in job.choices}
        sent_tok = {c.index: 0 for c in job.choices}
        ended: set[int] = set()
        for c in job.choices:
            yield chunk(c.index, '{"role":"assistant","content":""}')
        while True:
            for c in job.choices:
                if c.index in ended:
                    continue
                c.take()
                lp = "null"
                if body.logprobs and len(c.tokens) > sent_tok[c.index]:
                    lp = json.dumps({"content": _chat_logprobs(state, c, sent_tok[c.index], len(c.tokens), k)})
                    sent_tok[c.index] = len(c.tokens)
                if differs is None:
                    if len(c.text) > sent_text[c.index]:
                        piece = "".join(c.text[sent_text[c.index]:])
                        sent_text[c.index] = len(c.text)
                        yield chat_chunk(head, c.index, piece, "", lp)
                    elif lp != "null":
                        yield chunk(c.index, "{}", lp)
                else:
                    if len(c.text) > sent_text[c.index] or c.finished:
                        sent_text[c.index] = len(c.text)
                        deltas = differs[c.index].update("".join(c.text), c.finished)
                        for i, d in enumerate(deltas):
                            yield chunk(c.index, json.dumps(d), lp if i == 0 else "null")
                        if not deltas and lp != "null":
                            yield chunk(c.index, "{}", lp)
                if c.finished:
                    ended.add(c.index)
                    err = _end_error(c)
                    if err is not None:
                        yield b"data: " + json.dumps(err.body()).encode() + b"\n\n"
                        rlog.status = err.status
                        continue
                    calls = bool(differs and differs[c.index].calls)
                    yield chunk(c.index, "{}", "null", '"%s"' % _finish_reason(c, calls))
            if len(ended) == len(job.choices) or job.disconnected:
                break
            await job.wait()
        if job.disconnected:
            rlog.status = 499
            return
        if include_usage:
            yield ('data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,'
                   '"system_fingerprint":"%s","choices":[],"usage":%s}\n\n'
                   % (cid, created, json.dumps(state.model_id), _FINGERPRINT,
                      json.dumps(_usage(job.choices)))).encode()
        yield DONE

    return SSEResponse(events(), job, lambda: rlog.add(job.choices))


_FINGERPRINT = "polyllama"


def chat_head(cid: str, created: int, model: str) -> str:
    """The start of every chunk of one chat stream, formatted once per stream."""
    return ('data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,'
            '"system_fingerprint":"%s","choices":[' % (cid, created, json.dumps(model), _FINGERPRINT))


def chat_chunk(head: str, index: int, text: str | None, delta: str = "", logprobs: str = "null",
               finish: str = "null") -> bytes:
    """One SSE event of a chat stream: new text (the common case: only it goes through
    json.dumps), or a delta already in JSON."""
    if text is not None:
        delta = '{"content":%s}' % json.dumps(text)
    return (head + '{"index":%d,"delta":%s,"logprobs":%s,"finish_reason":%s}]}\n\n'
            % (index, delta, logprobs, finish)).encode()


def _seeds(params: SamplingParams, n: int) -> list[SamplingParams]:
    """The params of each of n choices: choice i samples with seed + i (when a seed is set)."""
    if params.seed is None or n == 1:
        return [params] * n
    return [SamplingParams.from_kwargs(params, seed=(params.seed + i) & 0xFFFFFFFF) for i in range(n)]


# ---- completions -------------------------------------------------------------------------------
def _completion_logprobs(state: ServerState, c: Choice, start: int, end: int, k: int, offset: int) -> dict:
    tokens, lps, tops, offsets = [], [], [], []
    for tok, top in zip(c.tokens[start:end], c.logprobs[start:end]):
        s = state.piece(tok)[0]
        tokens.append(s)
        lps.append(next((v for t, v in top if t == tok), -math.inf))
        tops.append({state.piece(t)[0]: v for t, v in top[:k]})
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


async def completions(state: ServerState, request: HTTPRequest, body: CompletionRequest, rlog: RequestLog):
    state.check_model(body.model)
    llm = state.llm
    p = body.prompt
    if isinstance(p, str):
        prompts: list = [p]
    elif p and all(isinstance(x, int) for x in p):
        prompts = [list(p)]
    else:
        prompts = list(p)
    if body.echo and body.logprobs is not None:
        raise APIError(400, "echo with logprobs is not supported (the prompt's own log-probabilities "
                            "are not computed)", param="logprobs", code="unsupported")
    n_probs = max(body.logprobs, 1) if body.logprobs is not None else 0
    params = state.sampling(body, body.max_tokens, n_probs)
    seeds = _seeds(params, body.n)
    total = len(prompts) * body.n

    def make() -> list[Choice]:
        out: list[Choice] = []
        try:
            for pi, prompt in enumerate(prompts):
                for j in range(body.n):
                    c = Choice(pi * body.n + j, llm.engine.submit(prompt, seeds[j]))
                    c.prompt_index = pi
                    out.append(c)
        except BaseException:
            for c in out:
                c.request.cancel()
            raise
        return out

    job = await state.submit(total, make, request.receive, rlog, "prompt")
    echo = {}
    if body.echo:
        for pi, prompt in enumerate(prompts):
            echo[pi] = prompt if isinstance(prompt, str) else llm.detokenize(prompt)
    cid = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    k = body.logprobs or 0
    if not body.stream:
        try:
            await _wait_done(job)
            if job.disconnected:
                rlog.status = 499
                return None
            for c in job.choices:
                err = _end_error(c)
                if err is not None:
                    raise err
            choices = []
            for c in job.choices:
                text = echo.get(c.prompt_index, "") + "".join(c.text)
                lp = (_completion_logprobs(state, c, 0, len(c.tokens), k, 0)
                      if body.logprobs is not None else None)
                choices.append({"index": c.index, "text": text, "logprobs": lp,
                                "finish_reason": _finish_reason(c)})
            rlog.add(job.choices)
            return _json({"id": cid, "object": "text_completion", "created": created, "model": state.model_id,
                          "system_fingerprint": _FINGERPRINT, "choices": choices, "usage": _usage(job.choices)})
        finally:
            job.watcher.cancel()
            job.release()

    try:
        await _wait_started(job)
        err = _first_error(job)
        if err is not None:
            raise err
    except BaseException:
        job.watcher.cancel()
        job.release()
        raise
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    head = ('data: {"id":"%s","object":"text_completion","created":%d,"model":%s,'
            '"system_fingerprint":"%s","choices":[' % (cid, created, json.dumps(state.model_id), _FINGERPRINT))

    def chunk(index: int, text: str, logprobs: str = "null", finish: str = "null") -> bytes:
        return (head + '{"index":%d,"text":%s,"logprobs":%s,"finish_reason":%s}]}\n\n'
                % (index, json.dumps(text), logprobs, finish)).encode()

    async def events():
        sent_text = {c.index: 0 for c in job.choices}
        sent_tok = {c.index: 0 for c in job.choices}
        offset = {c.index: 0 for c in job.choices}
        ended: set[int] = set()
        for c in job.choices:
            if c.prompt_index in echo:
                yield chunk(c.index, echo[c.prompt_index])
        while True:
            for c in job.choices:
                if c.index in ended:
                    continue
                c.take()
                lp = "null"
                if body.logprobs is not None and len(c.tokens) > sent_tok[c.index]:
                    d = _completion_logprobs(state, c, sent_tok[c.index], len(c.tokens), k, offset[c.index])
                    offset[c.index] += sum(len(t) for t in d["tokens"])
                    lp = json.dumps(d)
                    sent_tok[c.index] = len(c.tokens)
                if len(c.text) > sent_text[c.index] or lp != "null":
                    piece = "".join(c.text[sent_text[c.index]:])
                    sent_text[c.index] = len(c.text)
                    yield chunk(c.index, piece, lp)
                if c.finished:
                    ended.add(c.index)
                    err = _end_error(c)
                    if err is not None:
                        yield b"data: " + json.dumps(err.body()).encode() + b"\n\n"
                        rlog.status = err.status
                        continue
                    yield chunk(c.index, "", "null", '"%s"' % _finish_reason(c))
            if len(ended) == len(job.choices) or job.disconnected:
                break
            await job.wait()
        if job.disconnected:
            rlog.status = 499
            return
        if include_usage:
            yield ('data: {"id":"%s","object":"text_completion","created":%d,"model":%s,'
                   '"system_fingerprint":"%s","choices":[],"usage":%s}\n\n'
                   % (cid, created, json.dumps(state.model_id), _FINGERPRINT,
                      json.dumps(_usage(job.choices)))).encode()
        yield DONE

    return SSEResponse(events(), job, lambda: rlog.add(job.choices))


# ---- embeddings, models, tokens ------------------------------------------------------------------
async def embeddings(state: ServerState, request: HTTPRequest, body: EmbeddingRequest, rlog: RequestLog):
    state.check_model(body.model)
    inp = body.input
    if isinstance(inp, str):
        texts = [inp]
    elif inp and all(isinstance(x, str) for x in inp):
        texts = list(inp)
    else:
        raise APIError(400, "token-id input is not supported by /v1/embeddings: send text",
                       param="input", code="unsupported")
    if not texts or any(not t for t in texts):
        raise APIError(400, "input must be a non-empty string or list of non-empty strings", param="input",
                       code="invalid_value")
    if state.bridge is None or state.stopping:
        raise _unavailable(state)
    llm = state.llm

    def run():
        vecs = llm.embed(texts)
        return vecs, sum(len(llm.tokenize(t)) for t in texts)

    try:
        vecs, n_tokens = await asyncio.to_thread(run)
    except BaseException as e:
        raise _submit_error(e, "input") from None
    if body.dimensions is not None and body.dimensions != len(vecs[0]):
        raise APIError(400, f"dimensions must be {len(vecs[0])} for this model (it cannot shorten its "
                            "embeddings)", param="dimensions", code="invalid_value")
    data = []
    for i, v in enumerate(vecs):
        emb: Any = v if body.encoding_format == "float" else base64.b64encode(
            struct.pack(f"<{len(v)}f", *v)).decode()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    rlog.n_prompt = n_tokens
    return _json({"object": "list", "data": data, "model": state.model_id,
                  "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})


async def models(state: ServerState, request: HTTPRequest, rlog: RequestLog):
    meta = {}
    if state.llm is not None and state.status == "ok":
        m = state.llm.metadata
        meta = {"n_ctx": state.llm.n_ctx, "n_ctx_train": m["n_ctx_train"], "n_params": m["n_params"],
                "n_vocab": m["n_vocab"], "size": m["size_bytes"], "slots": state.llm.engine.n_slots}
    return _json({"object": "list", "data": [{"id": state.model_id, "object": "model", "created": state.created,
                                              "owned_by": "polyllama", "meta": meta}]})


async def tokenize(state: ServerState, request: HTTPRequest, body: TokenizeRequest, rlog: RequestLog):
    toks = await asyncio.to_thread(state.llm.tokenize, body.content, body.add_special, body.parse_special)
    if body.with_pieces:
        out = []
        for t in toks:
            s, b = state.piece(t)
            out.append({"id": t, "piece": s if "\ufffd" not in s else b})
        return _json({"tokens": out})
    return _json({"tokens": toks})


async def detokenize(state: ServerState, request: HTTPRequest, body: DetokenizeRequest, rlog: RequestLog):
    n_vocab = state._n_vocab()
    bad = next((t for t in body.tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is out of range 0..{n_vocab - 1}", param="tokens",
                       code="invalid_value")
    return _json({"content": state.llm.detokenize(body.tokens)})


async def health(state: ServerState, request: HTTPRequest, rlog: RequestLog):
    if state.status != "ok":
        raise _unavailable(state)
    return _json({"status": "ok"})


async def metrics(state: ServerState, request: HTTPRequest, rlog: RequestLog):
    b = state.bridge
    stats = state.llm.engine.stats() if b is not None and state.status == "ok" else None
    text = state.metrics.render(stats, outstanding=b.outstanding if b else 0,
                                capacity=b.capacity if b else 0,
                                slots=state.llm.engine.n_slots if stats is not None else 0)
    return Response(text, media_type="text/plain; version=0.0.4")


# ---- the app ------------------------------------------------------------------------------------
def _authorized(state: ServerState, request: HTTPRequest) -> bool:
    if state.api_key is None:
        return True
    got = request.headers.get("authorization", "")
    if got[:7].lower() == "bearer ":
        got = got[7:].strip()
    else:
        got = request.headers.get("x-api-key", "")
    return hmac.compare_digest(got.encode(), state.api_key.encode())


def _endpoint(state: ServerState, handler, schema=None, *, public: bool = False, ready: bool = True):
    """Wraps a handler: API key, 503 before the model is ready, body validation, the
    OpenAI error shape, the request's log line and counter."""
    async def endpoint(request: HTTPRequest):
        t0 = time.perf_counter()
        rlog = RequestLog()
        route = request.scope["route"].path if "route" in request.scope else request.url.path
        streaming = False
        try:
            if not public and not _authorized(state, request):
                raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                               type="invalid_request_error", code="invalid_api_key")
            if ready and state.status != "ok":
                raise _unavailable(state)
            if schema is not None:
                raw = await request.body()
                try:
                    body = schema.model_validate_json(raw or b"{}")
                except ValidationError as e:
                    raise validation_error(e) from None
                resp = await handler(state, request, body, rlog)
            else:
                resp = await handler(state, request, rlog)
            if resp is None:      # the client went away before the answer
                return Response(status_code=499)
            if isinstance(resp, SSEResponse):
                streaming = True
                end = resp.on_end

                def on_end():
                    end()
                    _log_line(state, request, route, rlog, t0)
                resp.on_end = on_end
            else:
                rlog.status = resp.status_code
            return resp
        except APIError as e:
            rlog.status = e.status
            return _json(e.body(), e.status)
        except Exception as e:  # noqa: BLE001 - a bug: answered 500 and logged, the server goes on
            log.exception("polyllama serve: %s %s failed", request.method, request.url.path)
            rlog.status = 500
            return _json(APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error").body(), 500)
        finally:
            if not streaming:
                _log_line(state, request, route, rlog, t0)
    return endpoint


def _log_line(state: ServerState, request: HTTPRequest, route: str, rlog: RequestLog, t0: float) -> None:
    state.metrics.request(route, rlog.status)
    if not log.isEnabledFor(logging.INFO):
        return
    client = request.client
    extra = ""
    if rlog.n_prompt or rlog.n_gen:
        extra = f" prompt={rlog.n_prompt} gen={rlog.n_gen}"
        if rlog.ttft is not None:
            extra += f" ttft={rlog.ttft:.3f}s"
    log.info('%s "%s %s" %d %.3fs%s', f"{client.host}:{client.port}" if client else "-", request.method,
             request.url.path, rlog.status, time.perf_counter() - t0, extra)


def create_app(llm=None, *, loader: Callable[..., Any] | None = None, model_alias: str | None = None,
               model_path: str | None = None, api_key: str | None = None, queue: int = 64,
               on_ready: Callable[[Any], None] | None = None,
               on_fatal: Callable[[BaseException], None] | None = None) -> Starlette:
    """The ASGI app of `polyllama serve`.

    llm: a loaded LLM to serve (it stays open when the app stops), or loader: a callable
    loader(progress=cb) -> LLM run in a worker thread at startup (the app answers 503 until
    it returns, and closes that LLM when it stops). queue: engine requests admitted beyond
    the LLM's slots (n_seq_max) before 429. api_key: required as 'Authorization: Bearer KEY'
    on every route but /health. app.state.server is the ServerState.
    """
    if isinstance(queue, bool) or not isinstance(queue, int) or queue < 0:
        raise ValueError(f"queue must be an int >= 0, not {queue!r}")
    state = ServerState(llm, loader=loader, model_alias=model_alias, model_path=model_path, api_key=api_key,
                        queue=queue, on_ready=on_ready, on_fatal=on_fatal)

    @asynccontextmanager
    async def lifespan(app):
        await state.start()
        try:
            yield
        finally:
            await state.close()

    def both(path, handler, schema=None, methods=("POST",), **kw):
        ep = _endpoint(state, handler, schema, **kw)
        return [Route(path, ep, methods=list(methods)), Route(path.replace("/v1", "", 1), ep, methods=list(methods))]

    routes = [
        *both("/v1/chat/completions", chat_completions, ChatCompletionRequest),
        *both("/v1/completions", completions, CompletionRequest),
        *both("/v1/embeddings", embeddings, EmbeddingRequest),
        *both("/v1/models", models, methods=("GET",), ready=False),
        Route("/health", _endpoint(state, health, public=True, ready=False), methods=["GET"]),
        Route("/v1/health", _endpoint(state, health, public=True, ready=False), methods=["GET"]),
        Route("/metrics", _endpoint(state, metrics, ready=False), methods=["GET"]),
        Route("/tokenize", _endpoint(state, tokenize, TokenizeRequest), methods=["POST"]),
        Route("/detokenize", _endpoint(state, detokenize, DetokenizeRequest), methods=["POST"]),
    ]

    async def not_found(request, exc):
        status = getattr(exc, "status_code", 404)
        if status == 405:
            err = APIError(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed")
        else:
            err = APIError(404, f"no route {request.method} {request.url.path} (docs/SERVER.md lists the "
                                "endpoints)", code="not_found")
        state.metrics.request("unknown", err.status)
        return _json(err.body(), err.status)

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    app.state.server = state
    return app
