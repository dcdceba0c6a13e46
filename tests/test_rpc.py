"""ggml RPC (issue #8), loopback only: real rpc-server processes, the real model.

Every server is a `python -m polyllama rpc-server` subprocess started by a fixture on a
free port and killed in its teardown. A connection ggml-rpc lost cannot be reopened in
the same process, so each test gets servers of its own, and the test that kills a server
runs its client in a subprocess too (an abort there fails the test instead of pytest).
"""
from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from polyllama import ConflictingArgumentsError, LLM, PolyllamaError, RemoteDeviceError, devices
from polyllama._llamacpp_loader import llamacpp
from polyllama.rpc import PROTO_MAJOR, add_rpc_server, probe
from conftest import child_env

ROOT = Path(__file__).resolve().parent.parent
THREADS = 1          # per server and client: the machine has 2 cores, shared
PROMPT = "Once upon a time"

pytestmark = pytest.mark.skipif("RPC" not in llamacpp.registries(),
                                reason="the extension was built without the RPC backend "
                                       "(rebuild with GGML_RPC=1 make build)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = dict(os.environ)
    env = child_env(env)
    return env


class Server:
    """One `python -m polyllama rpc-server` on 127.0.0.1, its output in a file."""

    def __init__(self, tmp_path: Path, name: str):
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log = tmp_path / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "polyllama", "rpc-server", "--host", "127.0.0.1",
                 "--port", str(self.port), "--backend", "cpu", "-t", str(THREADS)],
                stdout=out, stderr=subprocess.STDOUT, env=_env())
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rpc-server exited with {self.proc.returncode}: {self.output()}")
            try:
                probe(self.endpoint, timeout=2)
                return
            except RemoteDeviceError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"rpc-server did not answer within 60 s: {self.output()}")
                time.sleep(0.2)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def servers(tmp_path):
    started: list[Server] = []
    try:
        for name in ("a", "b"):
            started.append(Server(tmp_path, name))
        yield started
    finally:
        for s in started:
            s.stop()


def greedy_tokens(llm: LLM, n: int = 24) -> list[int]:
    return llm.generate(PROMPT, max_tokens=n, temperature=0, ignore_eos=True).tokens


def test_split_over_two_servers_matches_local(model_path, servers):
    with LLM(model_path, backend="cpu", n_threads=THREADS, n_ctx=512) as local:
        expected = greedy_tokens(local)
    a, b = servers
    # 20 of the 31 layers remote (1:2 between the servers), the other 11 on the local CPU
    with LLM(model_path, rpc_servers=[a.endpoint, b.endpoint], n_gpu_layers=20,
             tensor_split=[1, 2], n_threads=THREADS, n_ctx=512) as split:
        p = split.placement
        assert p.backend == "rpc" and p.n_gpu_layers == 20
        assert sorted(p.remote.values()) == sorted([a.endpoint, b.endpoint])
        mem = {r["device"]: r for r in p.memory}
        remote_bytes = [mem[name]["model"] for name in p.remote]
        assert all(x > 0 for x in remote_bytes), p.memory
        assert mem["Host"]["model"] > 0          # the layers left on the local CPU
        assert greedy_tokens(split) == expected
        assert f"({a.endpoint})" in str(p)

    # tensor_split moves weight between the servers: a's share follows its proportion
    def weights_on_a(ts):
        with LLM(model_path, rpc_servers=[a.endpoint, b.endpoint], n_gpu_layers=20, tensor_split=ts,
                 n_threads=THREADS, n_ctx=512) as m:
            name = next(n for n, e in m.placement.remote.items() if e == a.endpoint)
            return next(r["model"] for r in m.placement.memory if r["device"] == name)
    assert weights_on_a([3, 1]) > weights_on_a([1, 1]) > weights_on_a([1, 3])
    rpc_devs = [d for d in devices() if d.backend == "rpc"]
    mine = [d for d in rpc_devs if d.description in (a.endpoint, b.endpoint)]
    assert len(mine) == 2 and all(d.memory_total > 0 for d in mine)
    assert all(d.spec.startswith("rpc:") for d in mine)
    # the same endpoint again: the same device, not a second one
    names = add_rpc_server(a.endpoint)
    assert len([d for d in devices() if d.backend == "rpc"]) == len(rpc_devs)
    assert names == [d.name for d in mine if d.description == a.endpoint]


def test_tensor_parallel_over_two_servers_agrees_with_local(model_path, servers):
    # split_mode="tensor", llama.cpp's tensor parallelism: every layer's weights are cut
    # between the two servers (ggml's meta device), the stand-in here for two GPUs of one
    # host (issue #22, tests/test_multi_gpu.py on the real thing). Unlike a layer split it
    # sums each product from two halves, in another order: measured on the CI machine, the
    # logits' cosine to the local ones was 0.99961 (native build) and 0.99482 (the portable
    # wheel), the greedy tokens the same for 24 and for 14 steps
    with LLM(model_path, backend="cpu", n_threads=THREADS, n_ctx=512) as local:
        ref = local.logits(PROMPT)
    a, b = servers
    with LLM(model_path, rpc_servers=[a.endpoint, b.endpoint], split_mode="tensor", n_gpu_layers=-1,
             n_threads=THREADS, n_ctx=512) as tp:
        p = tp.placement
        # llama.cpp reports the pair as one "Meta()" device (so this is tensor parallelism,
        # not a layer split, which reports each server); the placement names the servers
        assert [r["device"] for r in p.memory if r["device"] != "Host"] == ["Meta()"], p.memory
        assert sorted(p.devices) == sorted(p.remote) and len(p.devices) == 2, p
        assert "Meta()" not in str(p)
        got = tp.logits(PROMPT)
    dot = sum(x * y for x, y in zip(ref, got))
    cosine = dot / math.sqrt(sum(x * x for x in ref) * sum(y * y for y in got))
    assert cosine > 0.99, cosine
    assert max(range(len(got)), key=got.__getitem__) == max(range(len(ref)), key=ref.__getitem__)


def test_backend_rpc_puts_all_layers_remote(model_path, servers):
    a, b = servers
    with LLM(model_path, backend="rpc", rpc_servers=[a.endpoint, b.endpoint],
             n_threads=THREADS, n_ctx=512) as m:
        assert m.placement.n_gpu_layers == m.placement.n_layers
        mem = {r["device"]: r for r in m.placement.memory}
        assert all(mem[name]["model"] > 0 for name in m.placement.remote)
        assert m.generate("The capital of France is", max_tokens=4).text.strip()


def test_graph_picks_stay_off_through_rpc(model_path, servers):
    # through RPC llama_decode runs on a worker thread with a timeout: the backend table's
    # rpc entry neither makes greedy picks in the decode graph the default nor allows them
    a, _ = servers
    with LLM(model_path, backend="rpc", rpc_servers=[a.endpoint], n_threads=THREADS, n_ctx=512) as m:
        assert m.placement.n_gpu_layers == m.placement.n_layers and not m.placement.device_sampling
        m.generate("The capital of France is", max_tokens=3, ignore_eos=True)
        assert m.engine.stats()["tokens_picked_on_device"] == 0
    with pytest.raises(ConflictingArgumentsError, match=r"^device_sampling=True is not available on rpc "
                                                         r"\(only on cpu, cuda\): "):
        LLM(model_path, backend="rpc", rpc_servers=[a.endpoint], device_sampling=True)


@pytest.mark.skipif(not any(d.backend == "vulkan" for d in devices()), reason="no Vulkan device in this build")
def test_device_sampling_asks_every_backend_of_a_mixed_device_list(model_path, servers):
    # a list of two backends' devices makes a candidate named "rpc+vulkan", which the backend
    # table does not know: each backend is asked in the list's order (this was an
    # AttributeError before)
    a, _ = servers
    add_rpc_server(a.endpoint)
    vk = next(d for d in devices() if d.backend == "vulkan")
    remote = next(d for d in devices() if d.backend == "rpc" and d.description == a.endpoint)
    with pytest.raises(ConflictingArgumentsError, match=r"^device_sampling=True is not available on vulkan "
                                                         r"\(only on cpu, cuda\): "):
        LLM(model_path, device=[vk, remote], n_gpu_layers=-1, device_sampling=True)


# The client that loses a server: prints one JSON line with what happened.
KILL_CLIENT = textwrap.dedent("""
    import json, os, signal, sys, time
    from polyllama import LLM, RemoteDeviceError
    model, ep_a, ep_b, victim = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    out = {}
    m = LLM(model, rpc_servers=[ep_a, ep_b], n_gpu_layers=20, n_threads=1, n_ctx=512)
    pieces, t_kill = 0, None
    try:
        for _ in m.stream("Once upon a time", max_tokens=400, temperature=0, ignore_eos=True):
            pieces += 1
            if pieces == 8:
                t_kill = time.monotonic()
                os.kill(victim, signal.SIGKILL)
        out["error"] = None
    except RemoteDeviceError as e:
        out["error"] = str(e)
        out["seconds_to_error"] = time.monotonic() - t_kill
    out["pieces"] = pieces
    m.close()
    try:
        LLM(model, rpc_servers=[ep_b], n_threads=1, n_ctx=512)
        out["reuse"] = None
    except RemoteDeviceError as e:
        out["reuse"] = str(e)
    with LLM(model, backend="cpu", n_threads=1, n_ctx=512) as local:
        out["local_after"] = local.generate("The capital of France is", max_tokens=8).text
    print("RESULT " + json.dumps(out), flush=True)
""")


def test_server_killed_mid_generation_raises_and_process_survives(model_path, servers):
    a, b = servers
    proc = subprocess.Popen([sys.executable, "-c", KILL_CLIENT, model_path, a.endpoint,
                             b.endpoint, str(b.proc.pid)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    try:
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, f"the client died (rc {proc.returncode}):\n{output[-3000:]}"
    line = next(l for l in output.splitlines() if l.startswith("RESULT "))
    res = json.loads(line[len("RESULT "):])
    assert res["error"] is not None, f"no exception after the server was killed: {res}"
    assert "lost the connection" in res["error"] and b.endpoint in res["error"]
    assert res["seconds_to_error"] < 10, res
    assert b.proc.wait(timeout=10) == -signal.SIGKILL
    assert "cannot reconnect" in res["reuse"]
    assert "Paris" in res["local_after"]


def test_closed_port_raises_quickly(model_path):
    endpoint = f"127.0.0.1:{free_port()}"   # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(RemoteDeviceError, match="cannot reach RPC server"):
        LLM(model_path, rpc_servers=[endpoint], n_threads=THREADS)
    assert time.monotonic() - t0 < 10


def test_wrong_protocol_version_is_refused():
    # a listener answering HELLO like an rpc-server of another major version
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def answer():
        conn, _ = srv.accept()
        with conn:
            conn.recv(1 + 8 + 24)
            conn.sendall((28).to_bytes(8, "little") + bytes([PROTO_MAJOR + 1, 0, 0, 0]) + bytes(24))

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        with pytest.raises(RemoteDeviceError, match="speaks protocol"):
            add_rpc_server(f"127.0.0.1:{port}")
    finally:
        t.join(timeout=5)
        srv.close()


def test_bad_endpoint_is_a_polyllama_error(model_path):
    with pytest.raises(PolyllamaError, match="host:port"):
        LLM(model_path, rpc_servers=["no-port-here"])


def test_server_warns_and_stops_on_ctrl_c(servers):
    s = servers[0]
    assert "no authentication" in s.output()
    s.proc.send_signal(signal.SIGINT)
    assert s.proc.wait(timeout=10) == 0
    assert "stopped" in s.output()
