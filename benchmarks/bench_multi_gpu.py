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

    python benchmarks/bench_multi_gpu.py --merge run1/multi_gpu.json run2/multi_gpu.json

prints one table over several runs, every round of each pooled (how docs/benchmarks.md
gives runs of one day on one machine).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from polyllama import devices  # noqa: E402
from polyllama.bench import (DEVICE_SAMPLING, batched_bench, llama_batched_bench, llama_bench,  # noqa: E402
                             polyllama_bench, source_commit, spread)


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


def table(results: list[dict], widths: list[int]) -> list[str]:
    """The markdown table of one or more runs' results (multi_gpu.json): per model and
    placement, llama.cpp's median figure and polyllama's ratio to it, median (range) over
    every round of every run."""
    lines = ["| model | placement | rounds | pp512 llama-bench | pp512 ratio | tg128 llama-bench | tg128 ratio | "
             + " | ".join(f"{w} prompts batched-bench | ratio" for w in widths) + " |",
             "|---|---|---|---|---|---|---|" + "---|---|" * len(widths)]
    pooled: dict = {}
    for result in results:
        for name, per in result["models"].items():
            for label, rows in per.items():
                pooled.setdefault((name, label), []).extend(rows)
    for (name, label), rows in pooled.items():
        pp = [r["polyllama"]["pp"] / r["llama_bench"]["pp"] for r in rows]
        tg = [r["polyllama"]["tg"] / r["llama_bench"]["tg"] for r in rows]
        if all(r["polyllama"].get("device_sampling") for r in rows):   # absent before 2026-11-26
            label += ", graph picks"
        cells = [name, label, str(len(rows)), f"{statistics.median(r['llama_bench']['pp'] for r in rows):.0f}",
                 spread(pp, 100, 1, "%"), f"{statistics.median(r['llama_bench']['tg'] for r in rows):.1f}",
                 spread(tg, 100, 1, "%")]
        for w in widths:
            # keyed by int in a live run, by str once read back from multi_gpu.json
            def at(d: dict):
                return d.get(w) or d.get(str(w))
            have = [r for r in rows if at(r["batched_bench"]) and at(r["batched"])]
            ratios = [at(r["batched"]) / at(r["batched_bench"]) for r in have]
            cells += [f"{statistics.median(at(r['batched_bench']) for r in have):.0f}" if have else "-",
                      spread(ratios, 100, 1, "%") if have else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def merge(paths: list[str]) -> int:
    """Print the table of several runs' multi_gpu.json together (docs/benchmarks.md)."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    widths = sorted({int(w) for r in results for per in r["models"].values() for rows in per.values()
                     for row in rows for w in row["batched_bench"]})
    print("\n".join(table(results, widths)))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="GGUF file (repeat for several)")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--widths", default="16", help="concurrent prompts, comma-separated")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--placements", default="one,layer,tensor",
                    help="which of one (GPU), layer (split), tensor (split) to measure, comma-separated")
    ap.add_argument("--device-sampling", choices=tuple(DEVICE_SAMPLING), default="auto",
                    help="LLM(device_sampling=None|True|False): greedy picks in the decode graph (auto: the "
                         "LLM's default, on where every layer is on CUDA, off with tensor parallelism; on: "
                         "not with tensor parallelism, which refuses it)")
    ap.add_argument("--bin-dir", default=str(ROOT / "build" / "cmake" / "bin"))
    ap.add_argument("--out", help="directory for multi_gpu.md and multi_gpu.json")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="instead of measuring: one table over these runs' multi_gpu.json, every round pooled")
    args = ap.parse_args()
    if args.merge:
        return merge(args.merge)
    if not args.out or not args.model:
        ap.error("--model and --out are required when measuring")
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
    wanted = args.placements.split(",")
    if bad := [p for p in wanted if p not in ("one", "layer", "tensor")]:
        ap.error(f"--placements: unknown {', '.join(bad)} (one, layer, tensor)")
    if args.device_sampling == "on" and "tensor" in wanted:
        ap.error("--device-sampling on: leave tensor out of --placements (LLM refuses the pair)")
    result: dict = {"date": str(datetime.date.today()), "host": platform.node(), "backend": args.backend,
                    "gpus": [f"{g.name} ({g.description})" for g in (g0, g1)],
                    "device_sampling": args.device_sampling, "models": {}}

    def save():   # after every figure: a run cut short keeps what it measured
        (out / "multi_gpu.json").write_text(json.dumps(result, indent=2))

    for model in args.model:
        per = result["models"].setdefault(Path(model).name, {})
        for label, kw, sm, dev, bsm, bdev in placements(g0, g1):
            if label.split()[0] not in wanted:
                continue
            kw = {**kw, "device_sampling": DEVICE_SAMPLING[args.device_sampling]}
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

    commit = source_commit(ROOT)
    lines = [f"### Two GPUs: {result['gpus'][0]} and {result['gpus'][1]} — {result['date']}, polyllama {commit}", "",
             f"command: `python benchmarks/bench_multi_gpu.py {' '.join(sys.argv[1:])}` (flash attention on, "
             f"{args.threads} threads, device sampling {args.device_sampling}, {args.rounds} round(s) in turn; ratios: median (range))", "",
             *table([result], widths)]
    (out / "multi_gpu.md").write_text("\n".join(lines) + "\n")
    save()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
