#!/usr/bin/env python3
"""Local-only vs split over ggml RPC servers on this machine (loopback).

Starts N `python -m polyllama rpc-server` processes (CPU backend) on free loopback ports,
then measures, for the local CPU alone and for the model split over the servers (plus the
local CPU for the layers --ngl leaves over):
  * load time (LLM construction: model + context, remote uploads included),
  * tg tokens/s (greedy, --n-gen tokens after a short prompt, best of --reps),
and whether the greedy tokens agree. Prints a markdown table; every server is killed at
the end. Loopback measures the protocol's cost without a network: over a real network
each token also pays the round trips (docs/MORE_THAN_ONE_MACHINE.md).

    python benchmarks/bench_rpc.py                  # SmolLM2, 2 servers, 1 thread each
    python benchmarks/bench_rpc.py -m model.gguf --servers 2 --ngl 20 -n 64
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from polyllama import LLM  # noqa: E402
from polyllama.default_model import default_model_path  # noqa: E402
from polyllama.rpc import probe  # noqa: E402
from polyllama.errors import RemoteDeviceError  # noqa: E402

PROMPT = "Once upon a time"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "polyllama", "rpc-server", "--host", "127.0.0.1",
                             "--port", str(port), "-t", str(threads)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    endpoint = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            probe(endpoint, timeout=2)
            return proc, endpoint
        except RemoteDeviceError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"rpc-server on {endpoint} did not start")
            time.sleep(0.2)


def measure(label: str, make_llm, n_gen: int, reps: int) -> dict:
    t0 = time.perf_counter()
    llm = make_llm()
    load_s = time.perf_counter() - t0
    try:
        best = 0.0
        tokens = None
        for _ in range(reps):
            r = llm.generate(PROMPT, max_tokens=n_gen, temperature=0, ignore_eos=True)
            best = max(best, r.generation_tokens_per_second)
            tokens = r.tokens
        return {"label": label, "load_s": load_s, "tg": best, "tokens": tokens,
                "placement": str(llm.placement)}
    finally:
        llm.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=1, help="threads per server and locally")
    ap.add_argument("--ngl", type=int, default=None,
                    help="layers on the servers (default: all; fewer leaves the rest local)")
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-r", "--reps", type=int, default=3)
    args = ap.parse_args()
    model = args.model or str(default_model_path())

    rows = [measure("local CPU", lambda: LLM(model, backend="cpu", n_threads=args.threads, n_ctx=512),
                    args.n_gen, args.reps)]
    procs = []
    try:
        endpoints = []
        for _ in range(args.servers):
            p, ep = start_server(args.threads)
            procs.append(p)
            endpoints.append(ep)
        kw = {} if args.ngl is None else {"n_gpu_layers": args.ngl}
        rows.append(measure(f"{args.servers} loopback servers" + (f" + local (ngl {args.ngl})" if args.ngl else ""),
                            lambda: LLM(model, rpc_servers=endpoints, n_threads=args.threads,
                                        n_ctx=512, **kw),
                            args.n_gen, args.reps))
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)

    base = rows[0]
    print(f"model: {Path(model).name}; {args.threads} thread(s) per process; tg{args.n_gen}, "
          f"best of {args.reps}\n")
    print("| run | load s | tg t/s | vs local | greedy tokens = local |")
    print("|---|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['label']} | {r['load_s']:.2f} | {r['tg']:.1f} | {r['tg'] / base['tg']:.2f}x | "
              f"{'yes' if r['tokens'] == base['tokens'] else 'NO'} |")
    print()
    for r in rows:
        print(f"{r['label']}: {r['placement']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
