"""Benchmark helpers: polyllama beside llama-bench from the same llama.cpp tree.

Used by `python -m polyllama bench` and the scripts of benchmarks/, which add the other
bindings (benchmarks/peers.py) as extra runners. Every figure comes from a run; nothing
here is a timed unit test.
"""
from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

# the benchmark scripts' --device-sampling choices and the LLM(device_sampling=) each means
DEVICE_SAMPLING = {"auto": None, "on": True, "off": False}


def _command_line() -> str:
    """The command that made a report, as one would type it again: `python -m polyllama
    bench ...` read "/…/src/polyllama/__main__.py bench ..." from sys.argv alone."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "__main__.py" and argv0.parent.name == "polyllama":
        prog = "python -m polyllama"
    elif argv0.name == "polyllama":          # the console script
        prog = "polyllama"
    else:
        prog = f"python {sys.argv[0]}"
    return " ".join([prog, *(shlex.quote(a) for a in sys.argv[1:])])


def source_commit(root: Path) -> str:
    """The commit of the tree at `root` for a report's header: $POLYLLAMA_COMMIT where the
    caller names it, else git's short HEAD with "+changes" when tracked files differ from it,
    "unknown" outside a checkout. The device tool's copy of the tree can carry a stale .git:
    reports made there named a commit several behind (2026-11-25 and 26)."""
    if os.environ.get("POLYLLAMA_COMMIT"):
        return os.environ["POLYLLAMA_COMMIT"]

    def git(*args):
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")

def spread(values, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    """The median of per-round figures, with their range when there were several rounds:
    spread([0.991, 0.96, 1.012], 100, 1, "%") == "99.1% (96.0–101.2)"; "—" for none."""
    if not values:
        return "—"
    m = f"{scale * statistics.median(values):.{digits}f}{unit}"
    return m if len(values) == 1 else f"{m} ({scale * min(values):.{digits}f}–{scale * max(values):.{digits}f})"


def step_breakdown(before: dict, after: dict) -> dict:
    """Where the engine's steps went between two `Engine.stats()`, in µs per step:
    `launch` (inside llama_decode: graph build, inputs, queueing; llama.cpp's tools pay it
    too), `wait` (for the device), `sample` (picking tokens), `other` (the rest of the step:
    admitting, batch rows, text, handing out); and `in_ranges`, the picks per step whose scan
    several threads shared (n_threads_sample)."""
    d = {k: after[k] - before[k] for k in ("steps", "decode_seconds", "wait_seconds", "sample_seconds",
                                           "step_seconds", "tokens_picked_in_ranges")}
    n = max(1, d["steps"])
    per = {"launch": d["decode_seconds"] - d["wait_seconds"], "wait": d["wait_seconds"],
           "sample": d["sample_seconds"],
           "other": d["step_seconds"] - d["decode_seconds"] - d["sample_seconds"]}
    out = {k: v / n * 1e6 for k, v in per.items()}
    out["in_ranges"] = d["tokens_picked_in_ranges"] / n
    out["steps"] = d["steps"]
    return out


def llama_bench(binary: Path, model: str, threads: int, n_prompt: int, n_gen: int, reps: int,
                ngl: int, device: str | None, flash_attn: str = "auto", extra: list[str] | None = None) -> dict:
    """llama-bench's ppN and tgN tokens/s (mean and stddev over reps). `extra`: more of its
    options (-sm tensor, -ts 3/1, ...)."""
    fa = {"auto": "auto", "on": "1", "off": "0"}[flash_attn]
    cmd = [str(binary), "-m", model, "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen),
           "-r", str(reps), "-ngl", str(ngl), "-fa", fa, "-o", "json"]
    if device:
        cmd += ["-dev", device]
    cmd += extra or []
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
    rows = json.loads(out.stdout)
    res = {}
    for r in rows:
        key = "pp" if r["n_prompt"] else "tg"
        res[key] = r["avg_ts"]
        res[key + "_sd"] = r["stddev_ts"]
    return res


def polyllama_bench(model: str, threads: int, n_prompt: int, n_gen: int, reps: int, backend: str,
                    ngl, flash_attn: str = "auto", llm_kwargs: dict | None = None) -> dict:
    """polyllama's ppN (generate with max_tokens=1), tgN (generate) and stream tgN.

    Like llama-bench, each test warms up once and then repeats on its own, so that a
    test's first repetition does not pay for the previous test's graph shapes (on CUDA,
    a new batch shape re-captures the CUDA graph).
    """
    from .llm import LLM
    from .sampling import SamplingParams
    # the context llama-bench gives its tests, n_prompt + n_gen: llama.cpp also caps n_batch
    # and n_ubatch at it, and a micro-batch size off a multiple of 16 cost ggml's AMX kernels
    # a fifth of their prompt speed here (n_ctx 88: 1284 t/s for 64 tokens, 80 or 96: 1514
    # and 1545)
    llm = LLM(model, backend=backend, n_threads=threads, n_gpu_layers=ngl, flash_attn=flash_attn,
              n_ctx=n_prompt + n_gen, n_seq_max=1, **(llm_kwargs or {}))
    engine = llm.engine
    vocab = llm.metadata["n_vocab"]
    # a prompt of exactly n_prompt tokens, like llama-bench's (which uses random tokens)
    prompt = [(i * 7919 + 13) % (vocab - 1000) + 500 for i in range(n_prompt)]

    pp, tg_gen, tg_stream, overhead, steps = [], [], [], [], []
    for rep in range(reps + 1):   # repetition 0 is the warm-up
        engine.clear_cache()      # no prefix reuse: every repetition decodes its whole prompt
        r = llm.generate(prompt, max_tokens=1)
        if rep:
            pp.append(r.prompt_tokens_per_second)
    for rep in range(reps + 1):
        engine.clear_cache()
        before = engine.stats()
        t0 = time.perf_counter()
        r = llm.generate([prompt[0]], max_tokens=n_gen, ignore_eos=True)
        wall = time.perf_counter() - t0
        after = engine.stats()
        if rep:
            tg_gen.append(r.generation_tokens_per_second)
            # what is not llama_decode (nor waiting for the device), per generated token
            busy = after["decode_seconds"] - before["decode_seconds"]
            overhead.append((wall - busy) / r.generated_tokens * 1e6)
            b = step_breakdown(before, after)
            # and outside the steps: the call's Python (request, result), per generated token
            b["outside"] = (wall - (after["step_seconds"] - before["step_seconds"])) / r.generated_tokens * 1e6
            steps.append(b)
    params = SamplingParams(max_tokens=n_gen, ignore_eos=True)
    for rep in range(reps + 1):
        engine.clear_cache()
        # count tokens, not pieces: a piece may hold several tokens (multi-byte characters)
        req = engine.submit([prompt[0]], params)
        for _ in req:
            pass
        if rep:
            tg_stream.append(req.result().generation_tokens_per_second)
    placement, device_sampling = str(llm.placement), llm.placement.device_sampling
    llm.close()
    return {"pp": statistics.mean(pp), "pp_sd": statistics.pstdev(pp),
            "tg": statistics.mean(tg_gen), "tg_sd": statistics.pstdev(tg_gen),
            "tg_stream": statistics.mean(tg_stream), "tg_stream_sd": statistics.pstdev(tg_stream),
            "overhead_us_per_token": statistics.median(overhead) if overhead else None,
            "step_us": {k: statistics.median(b[k] for b in steps) for k in steps[0]} if steps else {},
            "placement": placement, "device_sampling": device_sampling}


def batched_bench(model: str, widths=(1, 4, 16, 64), n_gen: int = 128, backend: str = "auto",
                  threads: int | None = None, ngl="auto", kv_unified: bool = True,
                  n_prompt: int = 8, flash_attn: str = "auto", with_breakdown: bool = False,
                  llm_kwargs: dict | None = None):
    """Aggregate tokens/s of the generation phase for `width` prompts decoded together, as
    llama-batched-bench's S_TG counts it: the tokens decoded after the prompts, over the
    time from the first sampled token to the last.

    Each width repeats once after a warm-up of the same width (graph shapes, CUDA graphs).
    Returns {width: tokens/s}; with_breakdown: also {width: step_breakdown(...)} of the
    measured repetition (prompts included)."""
    from .llm import LLM
    from .sampling import SamplingParams
    out, breakdown = {}, {}
    # room for every sequence at once: on the CPU each takes a 64-aligned region of a
    # unified cache (ARCHITECTURE.md §6.3)
    per_seq = -(-(n_prompt + n_gen + 8) // 64) * 64
    llm = LLM(model, backend=backend, n_threads=threads, n_gpu_layers=ngl, n_seq_max=max(widths),
              n_ctx=max(widths) * per_seq, kv_unified=kv_unified, flash_attn=flash_attn,
              **(llm_kwargs or {}))
    engine = llm.engine
    vocab = llm.metadata["n_vocab"]
    params = SamplingParams(max_tokens=n_gen, ignore_eos=True)
    for w in widths:
        rates = []
        for rep in range(2):
            engine.clear_cache()
            # distinct prompts of n_prompt tokens each (no shared prefix to reuse)
            prompts = [[(i * 7919 + j * 104729 + 13) % (vocab - 1000) + 500 for j in range(n_prompt)]
                       for i in range(w)]
            before = engine.stats()
            reqs = [engine.submit(p, params) for p in prompts]
            for r in reqs:
                r.result()
            t = [r.timings for r in reqs]
            if rep:
                breakdown[w] = step_breakdown(before, engine.stats())
            first = max(x["t_first"] for x in t)
            last = max(x["t_end"] for x in t)
            decoded = sum(x["n_generated"] - 1 for x in t)
            if rep:
                rates.append(decoded / (last - first) if last > first else 0.0)
        out[w] = statistics.mean(rates)
    llm.close()
    if with_breakdown:
        return out, breakdown
    return out


def llama_batched_bench(binary: Path, model: str, widths=(1, 4, 16, 64), n_gen: int = 128,
                        n_prompt: int = 8, ngl: int = 99, flash_attn: str = "on",
                        kv_unified: bool = False, device: str | None = None,
                        extra: list[str] | None = None) -> dict:
    """llama.cpp's own batched generation figure per width: S_TG, aggregate tokens/s of the
    generation phase, from llama-batched-bench (same tree, same run)."""
    fa = {"auto": "auto", "on": "1", "off": "0"}[flash_attn]
    n_ctx = max(widths) * (n_prompt + n_gen + 8)
    cmd = [str(binary), "-m", model, "-c", str(n_ctx), "-b", "2048", "-ub", "512", "-ngl", str(ngl),
           "-fa", fa, "-npp", str(n_prompt), "-ntg", str(n_gen), "-npl", ",".join(map(str, widths)),
           "--output-format", "jsonl"] + (["-kvu"] if kv_unified else []) + (["-dev", device] if device else []) \
        + (extra or [])
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True, text=True)
    res = {}
    for line in (out.stdout + "\n" + out.stderr).splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            row = json.loads(line)
            res[int(row["pl"])] = float(row["speed_tg"])
    return res



def find_llama_bench(bin_dir: str | None = None) -> Path | None:
    """llama-bench from the same tree: bin_dir, then the checkout's build/cmake/bin, then PATH."""
    import shutil
    candidates = [Path(bin_dir)] if bin_dir else []
    candidates.append(Path(__file__).resolve().parents[2] / "build" / "cmake" / "bin")
    for d in candidates:
        if (d / "llama-bench").is_file():
            return d / "llama-bench"
    found = shutil.which("llama-bench")
    return Path(found) if found else None


def compare(model: str, *, backend: str = "cpu", threads: int = 2, n_prompt: int = 512,
            n_gen: int = 128, reps: int = 5, ngl="auto", device: str | None = None,
            bin_dir: str | None = None, others=(), rounds: int = 1) -> tuple[dict, str]:
    """polyllama beside llama-bench, and beside `others` on the CPU, in one run. Returns the
    raw figures and a markdown report with ratios.

    `others`: (key, label, fn) of other bindings, fn(model, threads, n_gen, reps) -> dict
    or None when not installed (benchmarks/peers.py has llama-cpp-python and cyllama). They
    run twice on the CPU: with `threads` like everyone else, and as they come (their own
    default thread count, threads=None). `rounds` > 1 measures every runner once
    per round, in turn, so that a drift of the machine's speed touches them all; the
    report gives the median of each figure and of each per-round ratio, with the range.
    """
    import datetime
    import platform
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    binary = find_llama_bench(bin_dir)
    ngl = ngl if ngl == "auto" else int(ngl)
    # llama-bench offloads every layer with 99 (polyllama: "auto" fitting or -1, all of them)
    bench_ngl = 0 if backend == "cpu" else (99 if ngl in ("auto", -1) else int(ngl))
    # backend="cpu" uses no device at all; llama-bench with -ngl 0 would still hand large
    # matrix products to a visible GPU (op offload), so it gets -dev none to match
    bench_dev = "none" if backend == "cpu" and not device else device
    # (key, label, function, threads): the other bindings with our thread count, and as shipped
    other_runs = [(f"{name}_{how}", label, fn, t) for name, label, fn in others
                  for how, t in (("same_threads", threads), ("defaults", None))] if backend == "cpu" else []
    per_round = []
    for _ in range(rounds):
        fig = {"llama_bench": llama_bench(binary, model, threads, n_prompt, n_gen, reps, bench_ngl, bench_dev)
               if binary else None,
               "polyllama": polyllama_bench(model, threads, n_prompt, n_gen, reps, backend, ngl)}
        for key, _, fn, t in other_runs:
            fig[key] = fn(model, t, n_gen, reps)
        per_round.append(fig)

    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None


    def rate(key, field):
        return med([f[key][field] for f in per_round if f.get(key)])

    def stream_ratios(key):
        """polyllama's stream tg over runner `key`'s, per round"""
        return [f["polyllama"]["tg_stream"] / f[key]["tg_stream"] for f in per_round if f.get(key)]

    pp, tg = f"pp{n_prompt}", f"tg{n_gen}"
    first = per_round[0]
    lines = [f"# polyllama benchmark — {datetime.date.today()}, {platform.node()}, "
             f"{Path(model).name}, {threads} threads, {first['polyllama']['placement']}",
             f"command: {_command_line()}",
             f"{rounds} round(s) of {reps} repetitions; figures are medians over rounds"
             + (", ratios the median (and range) of the per-round ratios" if rounds > 1 else ""), "",
             f"| runner | threads | {pp} t/s | {tg} t/s | {pp} vs llama-bench | {tg} vs llama-bench "
             "| polyllama stream / runner |",
             "|---|---|---|---|---|---|---|"]

    def vs_bench(key, field, ref_field):
        return [f[key][field] / f["llama_bench"][ref_field] for f in per_round
                if f.get(key) and f.get("llama_bench")]

    def row(label, n_threads, key, pp_field, tg_field, with_ratio):
        pp_v = rate(key, pp_field) if pp_field else None
        pp_cell = f"{pp_v:.1f}" if pp_v is not None else "—"
        pp_ratio = spread(vs_bench(key, pp_field, "pp"), 100, 1, "%") if pp_field else "—"
        tg_ratio = spread(vs_bench(key, tg_field, "tg"), 100, 1, "%")
        mine = spread(stream_ratios(key), unit="×") if with_ratio else "—"
        return (f"| {label} | {n_threads} | {pp_cell} | {rate(key, tg_field):.1f} | {pp_ratio} | {tg_ratio} "
                f"| {mine} |")

    if binary:
        lines.append(f"| llama-bench | {threads} | {rate('llama_bench', 'pp'):.1f} "
                     f"| {rate('llama_bench', 'tg'):.1f} | 100% | 100% | — |")
    lines.append(row("polyllama generate", threads, "polyllama", "pp", "tg", False))
    lines.append(row("polyllama stream", threads, "polyllama", None, "tg_stream", False))
    ratios = {}
    for key, label, _, t in other_runs:
        got = [f[key] for f in per_round if f.get(key)]
        if not got:
            continue
        n_threads = got[0]["threads"]
        how = "" if t is not None else ", as shipped"
        lines.append(row(f"{label} {got[0]['version']} stream{how}", n_threads, key, None, "tg_stream", True))
        ratios[key] = med(stream_ratios(key))
    lines += ["", f"polyllama's {tg} includes sampling each token (greedy arg-max here) and detokenizing "
              "it; llama-bench's decodes only. The other bindings stream the same number of tokens "
              "after the prompt \"The\", greedily, in a child process; \"as shipped\" leaves them "
              "their own default thread count."]
    if not binary:
        lines += ["", "llama-bench not found (build it with `make build`, or pass its folder): "
                  "no reference figures, no ratios."]
    overhead = med([f["polyllama"]["overhead_us_per_token"] for f in per_round])
    if overhead is not None:
        lines += ["", f"polyllama per-token overhead outside llama_decode: {overhead:.1f} µs"]
    # per round: "llama_bench", "polyllama", and "<binding>_same_threads" / "<binding>_defaults"
    return {"rounds": per_round, "polyllama_stream_ratio": ratios}, "\n".join(lines)
