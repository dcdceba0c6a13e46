#!/usr/bin/env python3
"""The sequence engine beside llama.cpp's own tools, from the same build in the same run.

    python benchmarks/bench_engine.py --model M.gguf [--backend cuda] [--widths 16,64] --out DIR

For one model it measures
  * single-stream tg128 and pp512 against llama-bench, and polyllama's per-token overhead
    (wall time per generated token minus the time spent in llama_decode and waiting for
    the device, as the engine counts it);
  * aggregate generation tokens/s of N prompts decoded together, against
    llama-batched-bench's S_TG with the same KV layout (one cache shared by the sequences,
    -kvu, and one per sequence);
  * with --server: the same N prompts as concurrent requests to llama-server (llama.cpp's
    own slot engine, server_context) — the figure the decision between wrapping it and an
    engine of our own was made on (docs/ARCHITECTURE.md);
  * with --chat: a chat of about --chat-tokens prompt tokens continued by one more turn:
    time to first token of both turns, and whether the second turn's reply equals the one
    computed without the cached prefix.
Writes engine.md and engine.json into --out. Nothing here is a unit test: figures are
what the machine gave, in turn (llama.cpp's tool, then polyllama) for each figure.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import http.client
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from polyllama.bench import (DEVICE_SAMPLING, batched_bench, llama_batched_bench, llama_bench,  # noqa: E402
                             polyllama_bench, source_commit, spread)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_server_batched(binary: Path, model: str, width: int, n_gen: int, n_prompt: int, ngl: int,
                         threads: int, kv_unified: bool, device: str | None) -> float:
    """Aggregate generation tokens/s of `width` concurrent /completion requests to
    llama-server with `width` slots: the sum over requests of (tokens - 1) over the span
    from the first request's first token to the last one's end, from the server's own
    per-request timings (prompt_ms, predicted_ms) anchored at each request's send time."""
    port = _free_port()
    n_ctx = width * (n_prompt + n_gen + 16)
    cmd = [str(binary), "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", str(width),
           "-c", str(n_ctx), "-ngl", str(ngl), "-t", str(threads), "-fa", "on", "--no-webui",
           "-b", "2048", "-ub", "512"] + (["-kvu"] if kv_unified else ["-no-kvu"])
    if device:
        cmd += ["-dev", device]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {proc.stderr.read()[-2000:]}")
            time.sleep(0.5)
        vocab_words = [f"w{i}" for i in range(n_prompt)]

        def one(i: int, n: int) -> tuple[float, float, int]:
            body = json.dumps({"prompt": f"{i} " + " ".join(vocab_words[: max(1, n_prompt - 2)]),
                               "n_predict": n, "ignore_eos": True, "temperature": 0,
                               "cache_prompt": False, "stream": False})
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            t0 = time.perf_counter()
            c.request("POST", "/completion", body, {"Content-Type": "application/json"})
            r = json.loads(c.getresponse().read())
            t = r["timings"]
            first = t0 + t["prompt_ms"] / 1e3
            return first, first + t["predicted_ms"] / 1e3, t["predicted_n"]

        rates = []
        for rep in range(2):   # the first round warms up (graph shapes, CUDA graphs)
            with concurrent.futures.ThreadPoolExecutor(width) as ex:
                res = list(ex.map(lambda i: one(i, n_gen), range(width)))
            first = max(r[0] for r in res)
            last = max(r[1] for r in res)
            if rep:
                rates.append(sum(r[2] - 1 for r in res) / (last - first))
        return statistics.mean(rates)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def chat_continuation(model: str, backend: str, threads: int | None, n_tokens: int, ngl) -> dict:
    """TTFT of a chat of ~n_tokens prompt tokens and of one more turn, with the engine's
    cached prefix, and the second reply with and without it."""
    from polyllama import LLM
    # words of the list become ~2 tokens each: room for them, both turns and the replies
    llm = LLM(model, backend=backend, n_threads=threads, n_gpu_layers=ngl, n_ctx=3 * n_tokens + 1024, n_seq_max=1)
    try:
        words = " ".join(f"item{i}" for i in range(n_tokens))
        words = " ".join(words.split()[: n_tokens // 2])
        msgs = [{"role": "system", "content": "Read the list and answer briefly."},
                {"role": "user", "content": f"List: {words}. What comes first?"}]
        llm.chat(msgs, max_tokens=4)              # warm-up of the shapes
        llm.engine.clear_cache()
        first = llm.chat(msgs, max_tokens=32)
        msgs += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And last?"}]
        second = llm.chat(msgs, max_tokens=32)
        llm.engine.clear_cache()
        fresh = llm.chat(msgs, max_tokens=32)
        return {"prompt_tokens_1": first.prompt_tokens, "ttft_1": first.time_to_first_token,
                "prompt_tokens_2": second.prompt_tokens, "cached_2": second.cached_tokens,
                "ttft_2": second.time_to_first_token, "ttft_2_fresh": fresh.time_to_first_token,
                "ratio": second.time_to_first_token / first.time_to_first_token,
                "same_output": second.tokens == fresh.tokens}
    finally:
        llm.close()


def _step_row(label: str, b: dict) -> str:
    if not b:
        return f"| {label} | — | — | — | — | — | — |"
    cells = [f"{b[k]:.1f}" if k in b else "—" for k in ("launch", "wait", "sample", "other", "outside")]
    return f"| {label} | {b['steps']:.0f} | " + " | ".join(cells) + " |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--device", help="llama.cpp's -dev for its tools (default: none on cpu, the first GPU else)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--widths", default="8", help="concurrent prompts, comma-separated")
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kv", default="unified,split", help="unified and/or split (KV per sequence)")
    ap.add_argument("--device-sampling", choices=tuple(DEVICE_SAMPLING), default="auto",
                    help="LLM(device_sampling=None|True|False): greedy picks in the decode graph (auto: "
                         "the LLM's default, on where every layer is on CUDA)")
    ap.add_argument("--sample-threads", type=int, default=None,
                    help="LLM(n_threads_sample=N): threads that share the picks (default: LLM's own)")
    ap.add_argument("--server", action="store_true", help="also llama-server's slot engine")
    ap.add_argument("--chat", action="store_true", help="also the chat continuation")
    ap.add_argument("--chat-tokens", type=int, default=2000)
    ap.add_argument("--bin-dir", default=str(ROOT / "build" / "cmake" / "bin"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(args.bin_dir)
    cpu = args.backend == "cpu"
    ngl_tool = 0 if cpu else 99
    ngl_ours = 0 if cpu else -1
    dev = args.device or ("none" if cpu else None)
    if dev is None:
        # llama.cpp's tools take every GPU device by default; a CUDA + Vulkan build shows the
        # same GPU twice, and they would split the model over both
        from polyllama import devices
        dev = next(d.name for d in devices() if d.backend == args.backend and d.is_offload_target
                   and not d.software)
    fa = "on"
    llm_kwargs = {"device_sampling": DEVICE_SAMPLING[args.device_sampling], "n_threads_sample": args.sample_threads}
    widths = [int(w) for w in args.widths.split(",")]
    result: dict = {"model": Path(args.model).name, "backend": args.backend, "threads": args.threads,
                    "date": str(datetime.date.today()), "host": platform.node(),
                    "device_sampling": args.device_sampling, "n_threads_sample": args.sample_threads}

    def save():   # after every section: a run cut short still leaves what it measured
        (out / "engine.json").write_text(json.dumps(result, indent=2))

    # single stream, in turn
    singles = []
    for _ in range(args.rounds):
        ref = llama_bench(bin_dir / "llama-bench", args.model, args.threads, 512, args.n_gen, args.reps,
                          ngl_tool, dev, flash_attn=fa)
        ours = polyllama_bench(args.model, args.threads, 512, args.n_gen, args.reps, args.backend, ngl_ours,
                               flash_attn=fa, llm_kwargs=llm_kwargs)
        singles.append((ref, ours))
        print("single:", json.dumps({"llama_bench": ref, "polyllama": ours}), flush=True)
    result["single"] = {
        "llama_bench_tg": statistics.median(r["tg"] for r, _ in singles),
        "polyllama_tg": statistics.median(o["tg"] for _, o in singles),
        "polyllama_tg_stream": statistics.median(o["tg_stream"] for _, o in singles),
        "tg_ratios": [o["tg"] / r["tg"] for r, o in singles],
        "stream_ratios": [o["tg_stream"] / r["tg"] for r, o in singles],
        "pp_ratios": [o["pp"] / r["pp"] for r, o in singles],
        "overhead_us": statistics.median(o["overhead_us_per_token"] for _, o in singles),
        "step_us": singles[-1][1]["step_us"],
        "placement": singles[0][1]["placement"],
        "device_sampling": singles[0][1]["device_sampling"]}   # what "auto" chose
    save()

    # batched, per KV layout, in turn
    result["batched"] = {}
    for kv in args.kv.split(","):
        unified = kv == "unified"
        rows = []
        for _ in range(args.rounds):
            ref = llama_batched_bench(bin_dir / "llama-batched-bench", args.model, widths=widths, n_gen=args.n_gen,
                                      ngl=ngl_tool, flash_attn=fa, kv_unified=unified, device=dev)
            ours, steps = batched_bench(args.model, widths=widths, n_gen=args.n_gen, backend=args.backend,
                                        threads=args.threads, ngl=ngl_ours, kv_unified=unified, flash_attn=fa,
                                        with_breakdown=True, llm_kwargs=llm_kwargs)
            srv = {}
            if args.server and (bin_dir / "llama-server").is_file():
                for w in widths:
                    srv[w] = llama_server_batched(bin_dir / "llama-server", args.model, w, args.n_gen, 8, ngl_tool,
                                                  args.threads, unified, dev)
            rows.append({"batched_bench": ref, "polyllama": ours, "llama_server": srv, "step_us": steps})
            print(f"batched {kv}:", json.dumps(rows[-1]), flush=True)
        result["batched"][kv] = rows
        save()

    if args.chat:
        try:
            result["chat"] = chat_continuation(args.model, args.backend, args.threads, args.chat_tokens, ngl_ours)
        except Exception as e:   # reported; the other figures stand
            result["chat_error"] = f"{type(e).__name__}: {e}"
        print("chat:", json.dumps(result.get("chat") or result.get("chat_error")), flush=True)

    commit = source_commit(ROOT)
    s = result["single"]
    chosen = "on" if s["device_sampling"] else "off"
    lines = [f"### {result['model']}, {args.backend} ({s['placement']}) — {result['date']}, polyllama {commit}", "",
             f"command: `python benchmarks/bench_engine.py {' '.join(sys.argv[1:])}` "
             f"(flash attention on, {args.threads} threads, device sampling {args.device_sampling}"
             f"{f' ({chosen})' if args.device_sampling == 'auto' else ''}, "
             f"sample threads {args.sample_threads or 'default'}, "
             f"{args.rounds} rounds in turn; ratios: median (range))", "",
             "| single stream | llama-bench | polyllama | ratio |", "|---|---|---|---|",
             f"| tg{args.n_gen} generate | {s['llama_bench_tg']:.1f} | {s['polyllama_tg']:.1f} | "
             f"{spread(s['tg_ratios'], 100, 1, '%')} |",
             f"| tg{args.n_gen} stream | {s['llama_bench_tg']:.1f} | {s['polyllama_tg_stream']:.1f} | "
             f"{spread(s['stream_ratios'], 100, 1, '%')} |",
             f"| pp512 | | | {spread(s['pp_ratios'], 100, 1, '%')} |", "",
             f"Per-token overhead (wall minus decode): {s['overhead_us']:.1f} µs.", "",
             "Where the time went, µs per step (tokens/s and llama.cpp's tool agree on the device work; "
             "`launch` is inside llama_decode, which the tools pay too; `wait` is for the device; "
             "`sample` and `other` are the engine's own; `outside` is per token, outside the steps):", "",
             "| run | steps | launch | wait | sample | other | outside |", "|---|---|---|---|---|---|---|",
             _step_row("single stream, generate", s["step_us"])]
    for kv, rows in result["batched"].items():
        lines += [f"Batched generation, KV {'shared by the sequences (-kvu)' if kv == 'unified' else 'per sequence'} "
                  "(aggregate generated tokens/s of the generation phase):", "",
                  "| prompts | llama-batched-bench | polyllama | ratio | llama-server | llama-server ratio |",
                  "|---|---|---|---|---|---|"]
        for w in widths:
            ref = [r["batched_bench"].get(w, 0) for r in rows]
            ours = [r["polyllama"].get(w, 0) for r in rows]
            srv = [r["llama_server"].get(w) for r in rows if r["llama_server"].get(w)]
            ratio = [o / b for o, b in zip(ours, ref) if b]
            sratio = [x / b for x, b in zip(srv, ref) if b]
            lines.append(f"| {w} | {statistics.median(ref):.0f} | {statistics.median(ours):.0f} | "
                         f"{spread(ratio, 100, 1, '%')} | {statistics.median(srv):.0f} | "
                         f"{spread(sratio, 100, 1, '%')} |" if srv else
                         f"| {w} | {statistics.median(ref):.0f} | {statistics.median(ours):.0f} | "
                         f"{spread(ratio, 100, 1, '%')} | — | — |")
        lines.append("")
        lines += ["µs per step, the last round (prompts included):", "",
                  "| prompts | steps | launch | wait | sample | other |", "|---|---|---|---|---|---|"]
        for w in widths:
            lines.append(_step_row(str(w), rows[-1]["step_us"].get(w, {}))[:-4].rstrip(" |") + " |")
        lines.append("")
    if "chat" in result:
        c = result["chat"]
        lines += [f"Chat continued by one more turn: first turn {c['prompt_tokens_1']} prompt tokens, TTFT "
                  f"{c['ttft_1'] * 1e3:.0f} ms; second turn {c['prompt_tokens_2']} tokens of which {c['cached_2']} "
                  f"cached, TTFT {c['ttft_2'] * 1e3:.0f} ms ({100 * c['ratio']:.0f}% of the first; "
                  f"{c['ttft_2_fresh'] * 1e3:.0f} ms without the cache); same reply as without the cache: "
                  f"{'yes' if c['same_output'] else 'NO'}.", ""]
    (out / "engine.md").write_text("\n".join(lines) + "\n")
    (out / "engine.json").write_text(json.dumps(result, indent=2))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
