#!/usr/bin/env python3
"""One GPU, a layer split and tensor parallelism over two GPUs, beside llama.cpp's tools.

    python benchmarks/bench_multi_gpu.py --model M.gguf [--model M2.gguf] [--backend cuda] --out DIR

For each model and each placement (one GPU; both GPUs with split_mode="layer"; both with
split_mode="tensor") it measures, in turn and from the same build:
  * pp512 and tg128: llama-bench `-sm none|layer|tensor` against polyllama's `generate`;
  * aggregate generation tokens/s of --widths prompts decoded together (KV per sequence):
    llama-batched-bench with the same -sm / -dev against polyllama's engine.
Writes multi_gpu.md and multi_gpu.json into --out (issue #22; docs/benchmarks.md). Without
two GPUs of the backend it says so and exits 2. Nothing here is a unit test.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from polyllama import devices  # noqa: E402
from polyllama.bench import (batched_bench, llama_batched_bench, llama_bench,  # noqa: E402
                             polyllama_bench, spread)


def placements(g0, g1) -> list[tuple[str, dict, list[str], str, list[str], str]]:
    """(label, LLM kwargs, llama-bench options, its -dev, llama-batched-bench options, its -dev)."""
    both_bench, both_batched = f"{g0.name}/{g1.name}", f"{g0.name},{g1.name}"
    return [
        ("one GPU", {"device": g0.spec}, ["-sm", "none"], g0.name, ["-sm", "none"], g0.name),
        ("layer split", {"device": [g0.spec, g1.spec], "split_mode": "layer"}, ["-sm", "layer"], both_bench,
         ["-sm", "layer"], both_batched),
        ("tensor split", {"device": [g0.spec, g1.spec], "split_mode": "tensor"}, ["-sm", "tensor"], both_bench,
         ["-sm", "tensor"], both_batched),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", required=True, help="GGUF file (repeat for several)")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--widths", default="16", help="concurrent prompts, comma-separated")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--bin-dir", default=str(ROOT / "build" / "cmake" / "bin"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gpus = [d for d in devices() if d.backend == args.backend and d.type in ("GPU", "iGPU")
            and d.is_offload_target and not d.software]
    if len(gpus) < 2:
        print(f"bench_multi_gpu: {len(gpus)} {args.backend} GPU(s) here; two are needed", file=sys.stderr)
        return 2
    g0, g1 = gpus[:2]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(args.bin_dir)
    widths = [int(w) for w in args.widths.split(",")]
    result: dict = {"date": str(datetime.date.today()), "host": platform.node(), "backend": args.backend,
                    "gpus": [f"{g.name} ({g.description})" for g in (g0, g1)], "models": {}}

    def save():   # after every figure: a run cut short keeps what it measured
        (out / "multi_gpu.json").write_text(json.dumps(result, indent=2))

    for model in args.model:
        per = result["models"].setdefault(Path(model).name, {})
        for label, kw, sm, dev, bsm, bdev in placements(g0, g1):
            rows = []
            for _ in range(args.rounds):
                ref = llama_bench(bin_dir / "llama-bench", model, args.threads, 512, 128, args.reps, 99, dev,
                                  flash_attn="on", extra=sm)
                ours = polyllama_bench(model, args.threads, 512, 128, args.reps, args.backend, -1,
                                       flash_attn="on", llm_kwargs=kw)
                bref = llama_batched_bench(bin_dir / "llama-batched-bench", model, widths=widths, ngl=99,
                                           flash_attn="on", device=bdev, extra=bsm)
                bours = batched_bench(model, widths=widths, backend=args.backend, threads=args.threads, ngl=-1,
                                      kv_unified=False, flash_attn="on", llm_kwargs=kw)
                rows.append({"llama_bench": ref, "polyllama": ours, "batched_bench": bref, "batched": bours})
                print(f"{Path(model).name}, {label}:", json.dumps(rows[-1]), flush=True)
            per[label] = rows
            save()

    commit = os.environ.get("POLYLLAMA_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    lines = [f"### Two GPUs: {result['gpus'][0]} and {result['gpus'][1]} — {result['date']}, polyllama {commit}", "",
             f"command: `python benchmarks/bench_multi_gpu.py {' '.join(sys.argv[1:])}` (flash attention on, "
             f"{args.threads} threads, {args.rounds} round(s) in turn; ratios: median (range))", "",
             "| model | placement | pp512 llama-bench | pp512 ratio | tg128 llama-bench | tg128 ratio | "
             + " | ".join(f"{w} prompts batched-bench | ratio" for w in widths) + " |",
             "|---|---|---|---|---|---|" + "---|---|" * len(widths)]
    for name, per in result["models"].items():
        for label, rows in per.items():
            pp = [r["polyllama"]["pp"] / r["llama_bench"]["pp"] for r in rows]
            tg = [r["polyllama"]["tg"] / r["llama_bench"]["tg"] for r in rows]
            cells = [name, label, f"{statistics.median(r['llama_bench']['pp'] for r in rows):.0f}",
                     spread(pp, 100, 1, "%"), f"{statistics.median(r['llama_bench']['tg'] for r in rows):.1f}",
                     spread(tg, 100, 1, "%")]
            for w in widths:
                ratios = [r["batched"][w] / r["batched_bench"][w] for r in rows if r["batched_bench"].get(w)]
                cells += [f"{statistics.median(r['batched_bench'].get(w, 0) for r in rows):.0f}",
                          spread(ratios, 100, 1, "%")]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    (out / "multi_gpu.md").write_text("\n".join(lines) + "\n")
    save()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
