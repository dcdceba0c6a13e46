"""`polyllama serve`: the OpenAI-compatible server, with real clients on 127.0.0.1.

The official `openai` package talks to servers started by the fixtures (uvicorn on a thread
of this process, or `python -m polyllama serve` in a child process for the command line
and its signals); plain HTTP (http.client, raw sockets) checks what a client library would
hide: malformed bodies, the SSE framing, a client that disconnects. Nothing is mocked:
every answer comes from SmolLM2 through the engine. Every request is bounded (max_tokens,
timeouts) and every server is stopped by its fixture.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import child_env

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parent.parent
KEY = "test-key"
MSG = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
QWEN = ROOT / "thirdparty" / "llama.cpp" / "models" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"


class Running:
    """A uvicorn server of create_app() on a thread, on a free port of 127.0.0.1."""

    def __init__(self, llm=None, **kw):
        import uvicorn
        from polyllama.server import create_app
        self.llm = llm
        self.app = create_app(llm, **kw)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", access_log=False,
                                                    timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)

    @property
    def state(self):
        return self.app.state.server

    def client(self, key=KEY, **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120, **kw)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive()
        self.sock.close()


def call(base_or_port, method, path, body=None, headers=None, timeout=60):
    """(status, parsed JSON or text) of one plain HTTP request."""
    port = base_or_port if isinstance(base_or_port, int) else base_or_port.port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Authorization": f"Bearer {KEY}"}
    h.update(headers or {})
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
        h.setdefault("Content-Type", "application/json")
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read().decode()
    conn.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data


def assert_error(status_body, status, code=None, param=None):
    st, body = status_body
    assert st == status, (st, body)
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], body
    if code is not None:
        assert err["code"] == code, body
    if param is not None:
        assert err["param"] == param, body
    return err


@pytest.fixture(scope="module")
def srv(model_path):
    from polyllama import LLM
    # a KV cache per slot, as `polyllama serve` by default: with one cache shared by all
    # sequences (kv_unified=True) a greedy answer can change with what runs beside it
    llm = LLM(model_path, backend="cpu", n_threads=2, n_ctx=4096, n_seq_max=8, kv_unified=False)
    s = Running(llm, model_alias="smollm2", api_key=KEY, queue=64)
    yield s
    s.stop()
    llm.close()


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()


def healthy(s):
    assert call(s, "GET", "/health") == (200, {"status": "ok"})


# ---- basics --------------------------------------------------------------------------------
def test_models_health_and_metrics(srv, client):
    models = client.models.list().data
    assert [m.id for m in models] == ["smollm2"] and models[0].owned_by == "polyllama"
    healthy(srv)
    st, text = call(srv, "GET", "/metrics")
    assert st == 200 and "polyllama_requests_total" in text and "polyllama_slots 8" in text
    assert "polyllama_time_to_first_token_seconds_bucket" in text


def test_chat_matches_the_library(srv, client):
    r = client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=12, temperature=0)
    lib = srv.llm.chat(MSG, max_tokens=12)
    assert r.choices[0].message.content == lib.message["content"]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.created > 0
    assert r.model == "smollm2" and r.choices[0].index == 0
    assert r.choices[0].finish_reason == ("length" if lib.finish_reason == "length" else "stop")
    assert r.usage.prompt_tokens == lib.prompt_tokens
    assert r.usage.completion_tokens == lib.generated_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # the model's file name is accepted as well as the alias
    r2 = client.chat.completions.create(model=Path(srv.llm.model_path).name, messages=MSG, max_tokens=12,
                                        temperature=0)
    assert r2.choices[0].message.content == r.choices[0].message.content


def test_content_parts_and_developer_role(srv, client):
    plain = client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=8, temperature=0)
    parts = client.chat.completions.create(
        model="smollm2", max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": [{"type": "text", "text": MSG[0]["content"]}]}])
    assert parts.choices[0].message.content == plain.choices[0].message.content
    r = client.chat.completions.create(model="smollm2", max_tokens=4, temperature=0,
                                       messages=[{"role": "developer", "content": "Answer briefly."}, *MSG])
    assert r.choices[0].message.content is not None


def test_stream_with_usage_equals_the_plain_answer(srv, client):
    whole = client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)


def test_sse_framing_ends_with_done(srv):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", json.dumps(
        {"messages": MSG, "max_tokens": 6, "temperature": 0, "stream": True}),
        {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
    raw = r.read().decode()
    conn.close()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    for e in events[:-1]:
        json.loads(e[6:])


def test_lengths_stop_ignore_eos(srv, client):
    for field in ("max_tokens", "max_completion_tokens"):
        r = client.chat.completions.create(model="smollm2", messages=MSG, temperature=0,
                                           extra_body={"ignore_eos": True}, **{field: 7})
        assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"
    r = client.completions.create(model="smollm2", prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[" 7"])
    assert r.choices[0].finish_reason == "stop" and " 7" not in r.choices[0].text
    assert r.choices[0].text.startswith(" 5, 6,")


def test_n_choices_use_seed_plus_i(srv, client):
    kw = dict(model="smollm2", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=10,
              temperature=1.0, top_p=0.95)
    r = client.chat.completions.create(n=3, seed=7, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    singles = [client.chat.completions.create(seed=7 + i, **kw).choices[0].message.content for i in range(3)]
    assert [c.message.content for c in r.choices] == singles
    assert len(set(singles)) > 1       # different seeds, different samples
    # the n choices count their shared prompt once
    one = client.chat.completions.create(seed=7, **kw)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens


def test_logprobs_and_logit_bias(srv, client):
    r = client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    lps = r.choices[0].logprobs.content
    assert len(lps) == r.usage.completion_tokens == 6
    assert "".join(t.token for t in lps) == r.choices[0].message.content
    for t in lps:   # greedy: the chosen token is the most likely one
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob) and t.logprob <= 0
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
    first = srv.llm.tokenize(lps[0].token, add_special=False)[0]
    banned = client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=6, temperature=0,
                                            logprobs=True, logit_bias={str(first): -100})
    assert banned.choices[0].logprobs.content[0].token != lps[0].token


def test_json_schema_and_json_object(srv, client):
    import jsonschema
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client.chat.completions.create(
        model="smollm2", max_tokens=64, temperature=0,
        messages=[{"role": "user", "content": "Invent a person: name and age."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(model="smollm2", max_tokens=64, temperature=0, messages=MSG,
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


# ---- completions, embeddings, tokens -----------------------------------------------------------
def test_completions(srv, client):
    prompt = "The capital of France is"
    lib = srv.llm.generate(prompt, max_tokens=8)
    r = client.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text == lib.text
    assert r.usage.prompt_tokens == lib.prompt_tokens and r.usage.completion_tokens == lib.generated_tokens
    r = client.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0, echo=True)
    assert r.choices[0].text == prompt + lib.text
    two = client.completions.create(model="smollm2", prompt=[prompt, "Once upon a time"], max_tokens=8,
                                    temperature=0)
    assert [c.index for c in two.choices] == [0, 1] and two.choices[0].text == lib.text
    ids = srv.llm.tokenize(prompt)
    r = client.completions.create(model="smollm2", prompt=ids, max_tokens=8, temperature=0)
    assert r.choices[0].text == lib.text
    r = client.completions.create(model="smollm2", prompt=prompt, max_tokens=4, temperature=0, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and "".join(lp.tokens) == r.choices[0].text
    assert all(len(t) == 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="smollm2", prompt=prompt, max_tokens=8, temperature=0, stream=True) if c.choices)
    assert streamed == lib.text


def test_embeddings(srv, client):
    r = client.embeddings.create(model="smollm2", input=["a cat", "a dog"])
    ref = srv.llm.embed(["a cat", "a dog"])
    assert [d.index for d in r.data] == [0, 1] and len(r.data[0].embedding) == len(ref[0])
    assert r.data[0].embedding == pytest.approx(ref[0], abs=1e-5)
    assert r.usage.prompt_tokens == sum(len(srv.llm.tokenize(t)) for t in ("a cat", "a dog"))
    b64 = client.embeddings.create(model="smollm2", input="a cat", encoding_format="base64")
    import base64
    import struct
    raw = base64.b64decode(b64.data[0].embedding)          # little-endian float32, as OpenAI's
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(ref[0], abs=1e-5)


def test_tokenize_detokenize(srv):
    st, body = call(srv, "POST", "/tokenize", {"content": "Hello world"})
    assert st == 200 and body["tokens"] == srv.llm.tokenize("Hello world", add_special=False)
    st, body = call(srv, "POST", "/detokenize", {"tokens": body["tokens"]})
    assert (st, body) == (200, {"content": "Hello world"})
    st, body = call(srv, "POST", "/tokenize", {"content": "Hi", "with_pieces": True})
    assert st == 200 and body["tokens"][0]["piece"] == "Hi"
    assert_error(call(srv, "POST", "/detokenize", {"tokens": [10 ** 9]}), 400, "invalid_value", "tokens")


# ---- errors ---------------------------------------------------------------------------------------
def test_bad_requests_get_openai_errors(srv):
    chat = "/v1/chat/completions"
    assert_error(call(srv, "POST", chat, b"{not json", {"Content-Type": "application/json"}), 400, "invalid_json")
    assert_error(call(srv, "POST", chat, b"[1, 2]"), 400, "invalid_json")
    assert_error(call(srv, "POST", chat, {"messages": MSG, "max_tokens": "many"}), 400, "invalid_value", "max_tokens")
    assert_error(call(srv, "POST", chat, {"messages": MSG, "temperature": 5}), 400, "invalid_value", "temperature")
    assert_error(call(srv, "POST", chat, {"messages": MSG, "frobnicate": 1}), 400, "unknown_field", "frobnicate")
    assert_error(call(srv, "POST", chat, {"messages": [{"role": "user", "content": "x", "colour": 1}]}),
                 400, "unknown_field", "messages.0.colour")
    assert_error(call(srv, "POST", chat, {"max_tokens": 3}), 400, "missing_field", "messages")
    assert_error(call(srv, "POST", chat, {"messages": [{"role": "wizard", "content": "x"}]}), 400,
                 "invalid_value", "messages.0.role")
    err = assert_error(call(srv, "POST", chat, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}), 400, "invalid_value")
    assert "image_url" in err["message"]
    assert_error(call(srv, "POST", chat, {"messages": MSG, "logit_bias": {"999999999": 1}}), 400,
                 "invalid_value", "logit_bias")
    assert_error(call(srv, "POST", chat, {"model": "gpt-4o", "messages": MSG}), 404, "model_not_found", "model")
    assert_error(call(srv, "GET", "/v1/nothing-here"), 404, "not_found")
    assert_error(call(srv, "GET", chat), 405)
    assert_error(call(srv, "POST", chat, {"messages": MSG}, {"Authorization": "Bearer wrong"}), 401, "invalid_api_key")
    assert_error(call(srv, "GET", "/v1/models", headers={"Authorization": ""}), 401, "invalid_api_key")
    with pytest.raises(openai.AuthenticationError):
        srv.client(key="wrong").models.list()
    long = "word " * 5000      # over the context (512 tokens per slot)
    assert_error(call(srv, "POST", chat, {"messages": [{"role": "user", "content": long}], "max_tokens": 4}),
                 400, "context_length_exceeded")
    assert_error(call(srv, "POST", "/v1/completions", {"prompt": long, "max_tokens": 4}), 400,
                 "context_length_exceeded", "prompt")
    assert_error(call(srv, "POST", "/v1/embeddings", {"input": long}), 400, "context_length_exceeded")
    with pytest.raises(openai.BadRequestError) as e:
        srv.client().chat.completions.create(model="smollm2", messages=[{"role": "user", "content": long}])
    assert e.value.code == "context_length_exceeded"
    healthy(srv)


def _digit_tokens(llm):
    return [t for t in range(llm.metadata["n_vocab"])
            if re.fullmatch(rb"[0-9]+", llm.token_piece(t) or b"-")]


def test_crash_classes_are_400s_and_the_server_keeps_serving(srv, client):
    chat = "/v1/chat/completions"
    # a grammar whose only tokens are all banned: no token is possible at the first step
    ban = {str(t): -100 for t in _digit_tokens(srv.llm)}
    for stream in (False, True):
        err = assert_error(call(srv, "POST", chat, {"messages": MSG, "max_tokens": 4, "grammar": "root ::= [0-9]+",
                                                    "logit_bias": ban, "stream": stream}), 400, "invalid_grammar")
        assert "no token is possible" in err["message"]
    assert_error(call(srv, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 4, "grammar": "root ::= [0-9]",
                                                       "logit_bias": ban}), 400, "invalid_grammar")
    # a grammar that does not parse, and JSON schemas llama.cpp cannot turn into a grammar
    assert_error(call(srv, "POST", chat, {"messages": MSG, "grammar": "root ::= (((("}), 400, "invalid_grammar")
    for schema in ({"$ref": "#/definitions/nowhere"}, {"type": "object", "properties": {"a": {"$ref": "#/x"}}}):
        assert_error(call(srv, "POST", chat, {"messages": MSG, "max_tokens": 4, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}), 400, "invalid_grammar")
    healthy(srv)
    r = client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=4, temperature=0)
    assert r.choices[0].message.content
    assert srv.llm.engine.stats()["live"] == 0


# ---- concurrency --------------------------------------------------------------------------------
def _stream_text(client, prompt, n=16):
    out = []
    for c in client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": prompt}],
                                            max_tokens=n, temperature=0, stream=True):
        if c.choices and c.choices[0].delta.content:
            out.append(c.choices[0].delta.content)
    return "".join(out)


def test_32_concurrent_streams_equal_their_single_outputs(srv, client):
    prompts = [f"Write one sentence about the number {i}." for i in range(32)]
    alone = [_stream_text(client, p) for p in prompts]
    steps0 = srv.llm.engine.stats()["steps"]
    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda p: _stream_text(client, p), prompts))
    assert together == alone
    # they really ran together: far fewer steps than 32 requests one after another
    assert srv.llm.engine.stats()["steps"] - steps0 < 32 * 17 * 0.5
    assert srv.llm.engine.stats()["live"] == 0 and srv.state.bridge.outstanding == 0
    healthy(srv)


def _open_stream(port, body):
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def _wait_idle(srv, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = srv.llm.engine.stats()
        if st["live"] == 0 and st["queued"] == 0 and srv.state.bridge.outstanding == 0:
            return time.time()
        time.sleep(0.01)
    raise AssertionError(f"still busy: {srv.llm.engine.stats()}, outstanding {srv.state.bridge.outstanding}")


def test_a_dropped_client_frees_its_slot(srv):
    before = srv.state.metrics.cancelled_disconnect
    for stream in (True, False):
        gen0 = srv.llm.engine.stats()["tokens_generated"]
        s = _open_stream(srv.port, {"messages": MSG, "max_tokens": 3000, "ignore_eos": True, "stream": stream})
        if stream:
            got = b""
            while got.count(b"data: ") < 3:
                got += s.recv(65536)
        else:
            deadline = time.time() + 30
            while srv.llm.engine.stats()["tokens_generated"] - gen0 < 3:
                assert time.time() < deadline
                time.sleep(0.01)
        s.close()
        t0 = time.time()
        _wait_idle(srv)
        assert time.time() - t0 < 2.0
        assert srv.llm.engine.stats()["tokens_generated"] - gen0 < 3000
    assert srv.state.metrics.cancelled_disconnect == before + 2
    st, text = call(srv, "GET", "/metrics")
    assert f"polyllama_cancelled_disconnect_total {before + 2}" in text
    healthy(srv)


def test_queue_full_is_429(model_path):
    from polyllama import LLM
    llm = LLM(model_path, backend="cpu", n_threads=2, n_ctx=1024, n_seq_max=1)
    s = Running(llm, api_key=KEY, queue=1)
    socks = []
    try:
        body = {"messages": MSG, "max_tokens": 2000, "ignore_eos": True, "stream": True}
        for _ in range(2):
            socks.append(_open_stream(s.port, body))
        deadline = time.time() + 10
        while s.state.bridge.outstanding < 2:
            assert time.time() < deadline
            time.sleep(0.01)
        err = assert_error(call(s, "POST", "/v1/chat/completions", {"messages": MSG, "max_tokens": 2}), 429,
                           "queue_full")
        assert "busy" in err["message"]
        with pytest.raises(openai.RateLimitError):
            s.client().chat.completions.create(model=Path(model_path).stem, messages=MSG, max_tokens=2)
        for k in socks:
            k.close()
        _wait_idle(s)
        r = s.client().chat.completions.create(model=Path(model_path).stem, messages=MSG, max_tokens=2)
        assert r.choices[0].message.content is not None
    finally:
        for k in socks:
            k.close()
        s.stop()
        llm.close()


def test_503_while_loading(model_path):
    from polyllama import LLM
    go = threading.Event()

    def loader(progress=None):
        assert go.wait(30)
        return LLM(model_path, backend="cpu", n_threads=2, n_ctx=512, n_seq_max=1, progress=progress)

    s = Running(loader=loader, model_path=model_path)
    try:
        assert_error(call(s, "GET", "/health"), 503, "loading")
        assert_error(call(s, "POST", "/v1/chat/completions", {"messages": MSG}), 503, "loading")
        go.set()
        deadline = time.time() + 30
        while call(s, "GET", "/health")[0] != 200:
            assert time.time() < deadline
            time.sleep(0.05)
        st, body = call(s, "POST", "/v1/chat/completions", {"messages": MSG, "max_tokens": 2})
        assert st == 200 and body["choices"][0]["message"]["role"] == "assistant"
    finally:
        go.set()
        s.stop()
    assert s.state.llm is not None and s.state.status == "stopped"   # it closed the LLM it loaded


# ---- tools (llama.cpp's Qwen2.5 template, as tests/test_chat.py) --------------------------------------
@pytest.fixture(scope="module")
def tool_srv(model_path):
    from polyllama import LLM
    llm = LLM(model_path, backend="cpu", n_threads=2, n_ctx=2048, n_seq_max=2, kv_unified=False,
              chat_template=QWEN.read_text())
    s = Running(llm, model_alias="qwen-tools", api_key=KEY)
    yield s
    s.stop()
    llm.close()


def test_tool_calls_plain_and_streamed(tool_srv):
    c = tool_srv.client()
    # SmolLM2 was not trained on Qwen's tool-call syntax: with tool_choice "required"
    # libcommon's grammar lets it write text before the call, and greedy decoding does.
    # A small bias on "<" (the first token of "<tool_call>") makes it start with the call;
    # the biased model would then start a second call (libcommon's grammar for this
    # template allows several even with parallel_tool_calls false): a stop string ends it.
    lt = tool_srv.llm.tokenize("<tool_call>", add_special=False)[0]
    kw = dict(model="qwen-tools", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
              tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=64, temperature=0,
              logit_bias={str(lt): 5}, stop=["\n<tool_call>"])
    r = c.chat.completions.create(**kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.tool_calls
    call = ch.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    args = json.loads(call.function.arguments)
    assert isinstance(args.get("city"), str)
    # streamed: the tool call arrives as deltas (name first, then pieces of the arguments)
    name, pieces, finish, n_arg_deltas = None, [], None, 0
    for chunk in c.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        for tc in d.tool_calls or ():
            assert tc.index == 0
            if tc.function.name:
                name = tc.function.name
            if tc.function.arguments:
                pieces.append(tc.function.arguments)
                n_arg_deltas += 1
        finish = chunk.choices[0].finish_reason or finish
    assert name == "get_weather" and json.loads("".join(pieces)) == args and finish == "tool_calls"
    assert n_arg_deltas > 1
    # a named tool_choice; and "none" answers in text
    r = c.chat.completions.create(**{**kw, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    r = c.chat.completions.create(**{**kw, "tool_choice": "none", "max_tokens": 8})
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("stop", "length")
    # the tool's answer goes back in a tool message
    follow = [*kw["messages"], {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24 C"}]
    r = c.chat.completions.create(model="qwen-tools", messages=follow, tools=TOOLS, max_tokens=8, temperature=0)
    assert r.choices[0].message.role == "assistant"
    healthy(tool_srv)


# ---- the command line -------------------------------------------------------------------------------
def _serve(*extra, env=None):
    """`python -m polyllama serve` in a child process; (process, port) once /health is OK."""
    cmd = [sys.executable, "-m", "polyllama", "serve", "--backend", "cpu", "-t", "2", "-c", "1024", "-np", "2",
           "--port", "0", "--api-key", KEY, *extra]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=child_env(**(env or {})))
    lines = []
    port = None
    deadline = time.time() + 60
    while port is None:
        line = p.stderr.readline()
        assert line and time.time() < deadline, "".join(lines)
        lines.append(line)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
    while True:
        line = p.stderr.readline()
        assert line and time.time() < deadline, "".join(lines)
        lines.append(line)
        if "ready at" in line:
            break
    return p, port, lines


def _finish(p, lines, timeout=30):
    out, err = p.communicate(timeout=timeout)
    return "".join(lines) + err


def test_cli_serve_logs_and_stops_on_sigterm_mid_stream():
    p, port, lines = _serve("--shutdown-timeout", "2")
    try:
        assert "cpu" in "".join(lines)                       # the placement
        assert call(port, "GET", "/health") == (200, {"status": "ok"})
        st, body = call(port, "POST", "/v1/chat/completions", {"messages": MSG, "max_tokens": 3})
        assert st == 200
        s = _open_stream(port, {"messages": MSG, "max_tokens": 100000, "ignore_eos": True, "stream": True})
        got = b""
        while got.count(b"data: ") < 2:
            got += s.recv(65536)
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        # the listener closes at once: new connections are refused while the stream drains
        deadline = time.time() + 5
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                time.sleep(0.05)
            except OSError:
                break
        else:
            raise AssertionError("still accepting connections after SIGTERM")
        rest = b""
        while True:          # the stream is ended by the server within the grace period
            k = s.recv(65536)
            if not k:
                break
            rest += k
        s.close()
        assert p.wait(30) == 0
        assert time.time() - t0 < 2 + 10
        log = _finish(p, lines)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert re.search(r'"POST /v1/chat/completions" 200 [0-9.]+s prompt=\d+ gen=3', log), log
    assert "stopped" in log


def test_cli_serve_sigint_when_idle_exits_0():
    p, port, lines = _serve()
    try:
        assert call(port, "GET", "/health")[0] == 200
        p.send_signal(signal.SIGINT)
        assert p.wait(20) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_serve_says_what_to_install_without_the_extra(tmp_path):
    code = ("import sys; sys.modules['starlette'] = None; from polyllama.cli import main; "
            "sys.exit(main(['serve', '--port', '0']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=child_env())
    assert r.returncode == 1 and "pip install 'polyllama[server]'" in r.stderr and "starlette" in r.stderr
