#!/usr/bin/env python3
"""GPU benchmark: polyllama vs llama-bench (same tree, same run) on random-weight llama
models of real shapes, for each GPU backend of the build (CUDA and Vulkan on one GPU),
plus llama-cpp-python when importable, plus batched generation beside llama-batched-bench;
writes a markdown table, JSON and a PNG chart.

    python benchmarks/bench_gpu.py --models-dir /tmp/polyllama-models --out OUTDIR \
        [--backends cuda,vulkan] [--shapes 1b,8b] [--types Q4_0,Q8_0,f16]

Models are the files scripts/device/gpu.sh writes: llama-{1b,8b}-{Q4_0,Q8_0,f16}.gguf.
Flash attention on and all layers offloaded, as the llama-bench anchors in issue 6.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from peers import llama_cpp_python_bench  # noqa: E402  (benchmarks/ is the script's folder)
from polyllama.bench import (batched_bench, llama_batched_bench, llama_bench,  # noqa: E402
                             polyllama_bench, source_commit, spread)

BIN = ROOT / "build" / "cmake" / "bin"
THREADS = 16
WIDTHS = (1, 4, 16, 64)


def _device_of(backend: str) -> str:
    """llama-bench's -dev name for the first non-software device of `backend`."""
    from polyllama import devices
    for d in devices():
        if d.backend == backend and d.is_offload_target and not d.software:
            return d.name
    raise SystemExit(f"bench_gpu: no {backend} device in this build/machine")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backends", default="cuda", help="comma-separated, e.g. cuda,vulkan")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3,
                    help="llama-bench and polyllama measured in turn this many times per model; "
                         "the table gives medians, and each ratio's median with its range")
    ap.add_argument("--shapes", default="1b,8b")
    ap.add_argument("--types", default="Q4_0,Q8_0,f16")
    ap.add_argument("--no-batched", action="store_true")
    ap.add_argument("--no-llama-cpp-python", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    backends = args.backends.split(",")
    rows = []
    for backend in backends:
        dev = _device_of(backend)
        for shape in args.shapes.split(","):
            for t in args.types.split(","):
                model = Path(args.models_dir) / f"llama-{shape}-{t}.gguf"
                if not model.is_file():
                    print(f"skip {model.name}: missing", flush=True)
                    continue
                # in turn, so that a drift of the GPU's clocks touches both sides of a ratio
                refs, ourss = [], []
                for _ in range(args.rounds):
                    refs.append(llama_bench(BIN / "llama-bench", str(model), THREADS, 512, 128, args.reps, 99,
                                            dev, flash_attn="on"))
                    ourss.append(polyllama_bench(str(model), THREADS, 512, 128, args.reps, backend, -1,
                                                 flash_attn="on"))
                ref = {k: statistics.median(r[k] for r in refs) for k in ("pp", "tg")}
                ours = {k: statistics.median(o[k] for o in ourss) for k in ("pp", "tg", "tg_stream")}
                ours["overhead_us_per_token"] = statistics.median(o["overhead_us_per_token"] or 0 for o in ourss)
                ours["placement"] = ourss[0]["placement"]
                ratios = {name: [o[mine] / r[theirs] for o, r in zip(ourss, refs)]
                          for name, mine, theirs in (("pp", "pp", "pp"), ("tg", "tg", "tg"),
                                                     ("stream", "tg_stream", "tg"))}
                lcp = None
                if backend == "cuda" and not args.no_llama_cpp_python:
                    try:
                        lcp = llama_cpp_python_bench(str(model), THREADS, 128, args.reps, n_gpu_layers=-1,
                                                     flash_attn=True)
                    except RuntimeError as err:   # reported, and the polyllama figures still count
                        print(f"{model.name}: {err}", flush=True)
                row = {"backend": backend, "device": dev, "model": f"{shape} {t}",
                       "bench_pp": ref["pp"], "bench_tg": ref["tg"],
                       "poly_pp": ours["pp"], "poly_tg": ours["tg"], "poly_tg_stream": ours["tg_stream"],
                       "overhead_us": ours["overhead_us_per_token"], "placement": ours["placement"],
                       "lcp_tg_stream": lcp["tg_stream"] if lcp else None,
                       "ratios": ratios, "rounds": {"llama_bench": refs, "polyllama": ourss}}
                rows.append(row)
                print(json.dumps(row), flush=True)

    # batched: polyllama and llama-batched-bench, each with one KV cache shared by the
    # sequences (unified, polyllama's default) and with one per sequence (llama.cpp's default)
    batched = {}
    m1 = Path(args.models_dir) / "llama-1b-Q4_0.gguf"
    if m1.is_file() and not args.no_batched:
        for unified in (True, False):
            kv = "unified KV" if unified else "KV per sequence"
            batched[f"polyllama, {kv}"] = batched_bench(str(m1), widths=WIDTHS, backend=backends[0], ngl=-1,
                                                        kv_unified=unified)
            batched[f"llama-batched-bench, {kv}"] = llama_batched_bench(
                BIN / "llama-batched-bench", str(m1), widths=WIDTHS, kv_unified=unified)
        print("batched:", json.dumps(batched), flush=True)

    commit = source_commit(ROOT)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip()
    lines = [f"## {', '.join(backends)} on {gpu} — {datetime.date.today()}, polyllama {commit}", "",
             f"command: `{' '.join(sys.argv)}` (flash attention on, all layers offloaded, "
             f"{args.rounds} rounds of {args.reps} reps, {THREADS} threads)", "",
             "Figures are medians over the rounds; a ratio is the median of the per-round ratios "
             "(llama-bench and polyllama measured in turn), with its range.", "",
             "| backend | model | llama-bench pp512 | polyllama pp512 | ratio | llama-bench tg128 "
             "| polyllama tg128 | ratio | stream tg128 | ratio | llama-cpp-python stream tg128 | overhead µs/token |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    def pct(values) -> str:
        return spread(values, 100, 1, "%")
    for r in rows:
        lcp = f"{r['lcp_tg_stream']:.1f}" if r["lcp_tg_stream"] else "—"
        q = r["ratios"]
        lines.append(f"| {r['backend']} | {r['model']} | {r['bench_pp']:.0f} | {r['poly_pp']:.0f} | {pct(q['pp'])} "
                     f"| {r['bench_tg']:.1f} | {r['poly_tg']:.1f} | {pct(q['tg'])} "
                     f"| {r['poly_tg_stream']:.1f} | {pct(q['stream'])} | {lcp} | {r['overhead_us'] or 0:.1f} |")
    lines += ["", "polyllama's tg128 includes sampling (greedy arg-max) and detokenizing each token; "
              "llama-bench's only decodes. The overhead column is polyllama's wall time per token "
              "minus llama.cpp's own decode time."]
    if len(backends) > 1:
        lines += ["", f"{backends[1]} vs {backends[0]} (llama-bench figures, same models):", "",
                  "| model | pp512 | tg128 |", "|---|---|---|"]
        first = {r["model"]: r for r in rows if r["backend"] == backends[0]}
        for r in rows:
            if r["backend"] == backends[1] and r["model"] in first:
                f = first[r["model"]]
                lines.append(f"| {r['model']} | {100 * r['bench_pp'] / f['bench_pp']:.0f}% "
                             f"| {100 * r['bench_tg'] / f['bench_tg']:.0f}% |")
    if batched:
        lines += ["", f"Batched generation, 1B Q4_0, {backends[0]}, 128 tokens per prompt "
                  "(aggregate tokens/s; polyllama: generate([...]) with greedy sampling and text; "
                  "llama-batched-bench: S_TG, decoding only, no sampling):", "",
                  "| runner | " + " | ".join(f"{w} prompts" for w in WIDTHS) + " | 16 vs 1 |",
                  "|---|" + "---|" * (len(WIDTHS) + 1)]
        for name, res in batched.items():
            lines.append(f"| {name} | " + " | ".join(f"{res.get(w, 0):.0f}" for w in WIDTHS)
                         + f" | {res.get(16, 0) / (res.get(1) or 1):.1f}× |")
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    (out / "bench.json").write_text(json.dumps({"rows": rows, "batched": batched}, indent=2))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        names = [f"{r['backend']} {r['model']}" for r in rows]
        x = range(len(rows))
        for ax, key, title in ((axes[0], "pp", "prompt processing pp512 (t/s)"),
                               (axes[1], "tg", "generation tg128 (t/s)")):
            ax.bar([i - 0.2 for i in x], [r[f"bench_{key}"] for r in rows], 0.4, label="llama-bench")
            ax.bar([i + 0.2 for i in x], [r[f"poly_{key}"] for r in rows], 0.4, label="polyllama")
            ax.set_xticks(list(x))
            ax.set_xticklabels(names, rotation=40, ha="right", fontsize=8)
            ax.set_title(title)
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / "bench.png", dpi=110)
    except ImportError:
        print("matplotlib missing: no chart", flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
