#!/usr/bin/env python3
"""Server benchmark: `polyllama serve` beside llama-server (same tree) and llama-cpp-python's
server, streaming chat completions of a fixed length from 1, 8 and 32 concurrent clients.

    python benchmarks/bench_server.py [-m MODEL] [--backend cpu] [-t 2] [-np 8] [-c 4096] \
        [--clients 1,8,32] [-n 128] [--requests 2] [--bin-dir build/cmake/bin] [--out DIR]
    python benchmarks/bench_server.py --backend cuda -ngl 99 -t 16 -m llama-8b-Q4_0.gguf ...
    python benchmarks/bench_server.py --sse 20000      # per-event cost of polyllama's SSE path

Every server runs in its own child process on 127.0.0.1 with the same model, context,
slots (-np) and threads, one after the other. Each of C clients sends --requests streaming
requests in turn (chat, temperature 0, ignore_eos and max_tokens, so every request
generates exactly -n tokens); the clients share one asyncio loop and read the SSE stream
from a raw socket, so the client side costs little CPU. Reported per runner and C: the
aggregate generated tokens/s (all tokens / wall time of the round) and the p50 and p99
time to first token (until the first event with text). Runs offline: nothing is fetched.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
from polyllama.bench import source_commit  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the runners ---------------------------------------------------------------------------
def polyllama_cmd(a, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "polyllama", "serve", "-m", a.model, "--backend", a.backend, "-t", str(a.threads),
           "-c", str(a.ctx), "-np", str(a.parallel), "--port", str(port), "--queue", "1024"]
    if a.ngl is not None:
        cmd += ["-ngl", a.ngl]
    if a.device:
        cmd += ["-dev", a.device]
    return cmd


def llama_server_cmd(a, port: int) -> list[str] | None:
    exe = Path(a.bin_dir) / "llama-server"
    if not exe.is_file():
        return None
    cmd = [str(exe), "-m", a.model, "-t", str(a.threads), "-tb", str(a.threads), "-c", str(a.ctx),
           "-np", str(a.parallel), "--port", str(port), "--host", "127.0.0.1",
           "--no-webui", "--jinja", "-fa", "auto"]
    if a.backend == "cpu":
        cmd += ["--device", "none", "-ngl", "0"]
    else:
        cmd += ["-ngl", a.ngl or "99"]
        if a.device:
            cmd += ["-dev", a.device]
    return cmd


def llama_cpp_python_cmd(a, port: int) -> list[str] | None:
    probe = subprocess.run([sys.executable, "-c", "import llama_cpp.server, llama_cpp; print(llama_cpp.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return None
    ngl = "0" if a.backend == "cpu" else (a.ngl or "-1")
    return [sys.executable, "-m", "llama_cpp.server", "--model", a.model, "--n_ctx", str(a.ctx),
            "--n_threads", str(a.threads), "--n_threads_batch", str(a.threads), "--n_gpu_layers", ngl,
            "--host", "127.0.0.1", "--port", str(port)]


class Child:
    def __init__(self, name: str, cmd: list[str], port: int):
        self.name, self.port = name, port
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.log = open(f"/tmp/bench_server_{name.replace(' ', '_')}.log", "w")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)

    def wait_ready(self, timeout: float = 300) -> None:
        import http.client
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.p.returncode}); see {self.log.name}")
            try:
                # /health is 503 while a server loads (polyllama, llama-server); a server
                # without it (404) is ready once /v1/models answers
                for path in ("/health", "/v1/models"):
                    c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                    c.request("GET", path)
                    status = c.getresponse().status
                    c.close()
                    if status != 404:
                        break
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not get ready in {timeout} s")

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


# ---- the clients ---------------------------------------------------------------------------
async def one_stream(port: int, body: bytes) -> tuple[float, int, float]:
    """(time to first text, text events, total seconds) of one streaming request."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        rest = await reader.read()
        raise RuntimeError(f"HTTP {status!r}: {rest[-300:]!r}")
    chunked = False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        if line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower():
            chunked = True
    ttft, events, buf, done = None, 0, b"", False
    while not done:
        if chunked:
            size_line = await reader.readline()
            if not size_line:
                break
            size = int(size_line.strip().split(b";")[0] or b"0", 16)
            if size == 0:
                break
            data = await reader.readexactly(size + 2)
            buf += data[:-2]
        else:
            data = await reader.read(65536)
            if not data:
                break
            buf += data
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev.startswith(b"data: [DONE]"):
                done = True
                break
            # an event carrying text: "content":"<at least one character>"
            i = ev.find(b'"content":"')
            if i >= 0 and ev[i + 11:i + 12] != b'"':
                events += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
    writer.close()
    return (ttft if ttft is not None else float("nan")), events, time.perf_counter() - t0


async def round_(port: int, clients: int, requests: int, n: int, model: str, salt: str) -> dict:
    async def client(ci: int):
        out = []
        for r in range(requests):
            body = json.dumps({"model": model, "stream": True, "temperature": 0, "max_tokens": n,
                               "ignore_eos": True, "messages": [{"role": "user", "content":
                                   f"[{salt}{ci}.{r}] Write a long story about a lighthouse keeper."}]}).encode()
            out.append(await one_stream(port, body))
        return out
    t0 = time.perf_counter()
    results = await asyncio.gather(*(client(i) for i in range(clients)))
    wall = time.perf_counter() - t0
    flat = [x for r in results for x in r]
    ttfts = sorted(x[0] for x in flat)
    return {"clients": clients, "requests": len(flat), "tokens": clients * requests * n, "wall_s": wall,
            "agg_tps": clients * requests * n / wall,
            "ttft_p50_ms": 1000 * percentile(ttfts, 50), "ttft_p99_ms": 1000 * percentile(ttfts, 99),
            "text_events": sum(x[1] for x in flat)}


def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def measure(name: str, cmd: list[str], port: int, a) -> list[dict]:
    print(f"# {name}: {' '.join(cmd)}", flush=True)
    child = Child(name, cmd, port)
    try:
        child.wait_ready()
        asyncio.run(round_(port, 1, 1, 8, a.model_id, "warm"))       # warm-up: graphs, threads, caches
        rows = []
        for c in a.clients:
            r = asyncio.run(round_(port, c, a.requests, a.n, a.model_id, f"{name[:1]}{c}-"))
            r["runner"] = name
            rows.append(r)
            print(f"  {c:3d} clients: {r['agg_tps']:8.1f} t/s  ttft p50 {r['ttft_p50_ms']:8.1f} ms  "
                  f"p99 {r['ttft_p99_ms']:8.1f} ms  ({r['requests']} requests, {r['wall_s']:.1f} s, "
                  f"{r['text_events']} text events for {r['tokens']} tokens)", flush=True)
        return rows
    finally:
        child.stop()


# ---- the SSE microbenchmark ---------------------------------------------------------------
def sse_microbench(n: int) -> dict:
    """polyllama's per-event cost: formatting one chat chunk, and formatting + sending it
    through SSEResponse and uvicorn (the server's CPU time per event, the client being
    another process)."""
    import threading

    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Route

    from polyllama.server.app import SSEResponse, chat_chunk, chat_head

    head = chat_head("chatcmpl-0123456789abcdef0123456789abcdef", int(time.time()), "smollm2")
    t0 = time.perf_counter()
    for i in range(n):
        chat_chunk(head, 0, " word")
    fmt_us = (time.perf_counter() - t0) / n * 1e6

    async def events():
        for i in range(n):
            yield chat_chunk(head, 0, " word")
        yield b"data: [DONE]\n\n"

    async def endpoint(request):
        return SSEResponse(events(), None, lambda: None)

    app = Starlette(routes=[Route("/s", endpoint, methods=["GET"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.01)
    reader = ("import socket,sys,time; s=socket.create_connection(('127.0.0.1',%d)); "
              "s.sendall(b'GET /s HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n'); n=0\n"
              "while True:\n  d=s.recv(1<<20)\n  if not d: break\n  n+=len(d)\nprint(n)" % port)
    c0 = time.process_time()
    w0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - w0
    cpu = time.process_time() - c0
    server.should_exit = True
    th.join(10)
    return {"events": n, "format_us": fmt_us, "send_cpu_us": cpu / n * 1e6, "events_per_s": n / wall,
            "bytes": int(out.stdout.strip())}


# ---- the report ----------------------------------------------------------------------------
def report(rows: list[dict], a, notes: list[str]) -> str:
    commit = source_commit(ROOT)
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    lines = [f"Date {datetime.date.today()}, polyllama {commit}, {platform.system()} {platform.machine()}, "
             f"{os.cpu_count()} cores ({cpu}), backend {a.backend}, model {Path(a.model).name}, "
             f"{a.parallel} slots, context {a.ctx}, {a.threads} threads, {a.n} tokens per request "
             f"(ignore_eos), {a.requests} requests per client.", "",
             "    " + " ".join(sys.argv), "",
             "| runner | clients | aggregate t/s | vs llama-server | TTFT p50 ms | TTFT p99 ms | p99 vs llama-server |",
             "|---|---|---|---|---|---|---|"]
    ref = {r["clients"]: r for r in rows if r["runner"] == "llama-server"}
    for r in rows:
        b = ref.get(r["clients"])
        ratio = f"{100 * r['agg_tps'] / b['agg_tps']:.1f}%" if b else "—"
        p99 = f"{r['ttft_p99_ms'] / b['ttft_p99_ms']:.2f}×" if b else "—"
        lines.append(f"| {r['runner']} | {r['clients']} | {r['agg_tps']:.1f} | {ratio} | "
                     f"{r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | {p99} |")
    lines += [""] + [f"Note: {n}" for n in notes]
    return "\n".join(lines) + "\n"


def chart(rows: list[dict], path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runners = list(dict.fromkeys(r["runner"] for r in rows))
    clients = sorted({r["clients"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    w = 0.8 / len(runners)
    for i, name in enumerate(runners):
        by = {r["clients"]: r for r in rows if r["runner"] == name}
        xs = [j + (i - (len(runners) - 1) / 2) * w for j in range(len(clients))]
        axes[0].bar(xs, [by[c]["agg_tps"] if c in by else 0 for c in clients], w, label=name)
        axes[1].bar(xs, [by[c]["ttft_p99_ms"] if c in by else 0 for c in clients], w, label=name)
    for ax, title in ((axes[0], "aggregate generation (tokens/s)"), (axes[1], "time to first token, p99 (ms)")):
        ax.set_xticks(range(len(clients)))
        ax.set_xticklabels([f"{c} clients" for c in clients])
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: SmolLM2 from the cache)")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("-ngl", default=None, help="layers to offload (GPU backends; llama-server gets 99 by default)")
    ap.add_argument("-dev", "--device", default=None, help="device name for both servers, e.g. CUDA0")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("-np", "--parallel", type=int, default=8)
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("-n", type=int, default=128, help="tokens generated per request")
    ap.add_argument("--requests", type=int, default=2, help="requests per client, one after the other")
    ap.add_argument("--bin-dir", default=str(ROOT / "build" / "cmake" / "bin"), help="folder of llama-server")
    ap.add_argument("--runners", default="polyllama,llama-server,llama-cpp-python")
    ap.add_argument("--out", default=None, help="write bench.md, bench.json and bench.png here")
    ap.add_argument("--sse", type=int, default=0, help="only the SSE microbenchmark, with this many events")
    a = ap.parse_args()
    if a.sse:
        r = sse_microbench(a.sse)
        print(f"SSE: formatting a chunk {r['format_us']:.2f} µs; formatting + sending through uvicorn "
              f"{r['send_cpu_us']:.1f} µs of server CPU per event ({r['events_per_s']:.0f} events/s "
              f"to one client, {r['events']} events, {r['bytes']} bytes)")
        return 0
    if a.model is None:
        from polyllama.default_model import default_model_path
        a.model = str(default_model_path())
    a.model_id = Path(a.model).name[:-5] if a.model.endswith(".gguf") else Path(a.model).name
    a.clients = [int(x) for x in a.clients.split(",")]
    notes, rows = [], []
    makers = {"polyllama": polyllama_cmd, "llama-server": llama_server_cmd,
              "llama-cpp-python": llama_cpp_python_cmd}
    for name in a.runners.split(","):
        port = free_port()
        cmd = makers[name](a, port)
        if cmd is None:
            what = {"llama-server": f"no llama-server in {a.bin_dir} (make build builds it)",
                    "llama-cpp-python": "llama-cpp-python's server is not installed "
                                        "(pip install 'llama-cpp-python[server]')"}[name]
            print(f"# {name}: skipped: {what}", flush=True)
            notes.append(f"{name} skipped: {what}.")
            continue
        if name == "llama-cpp-python":
            notes.append("llama-cpp-python's server decodes one request at a time (no --parallel).")
        rows += measure(name, cmd, port, a)
    text = report(rows, a, notes)
    print()
    print(text)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.md").write_text(text)
        (out / "bench.json").write_text(json.dumps({"args": {k: v for k, v in vars(a).items()}, "rows": rows},
                                                   indent=2, default=str))
        if not chart(rows, out / "bench.png"):
            print("matplotlib missing: no chart", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
