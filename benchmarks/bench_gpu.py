#!/usr/bin/env python3
"""GPU benchmark: polyllama vs llama-bench (same tree, same run) on random-weight llama
models of real shapes, plus batched generation; writes a markdown table and a PNG chart.

    python benchmarks/bench_gpu.py --models-dir /tmp/polyllama-models --out OUTDIR

Models are the files scripts/device_gpu.sh writes: llama-{1b,8b}-{Q4_0,Q8_0,f16}.gguf.
Flash attention on and all layers offloaded, as the llama-bench anchors in issue 6.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from polyllama.bench import batched_bench, llama_bench, polyllama_bench  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--device", default="CUDA0", help="llama-bench -dev")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--shapes", default="1b,8b")
    ap.add_argument("--types", default="Q4_0,Q8_0,f16")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in args.shapes.split(","):
        for t in args.types.split(","):
            model = Path(args.models_dir) / f"llama-{shape}-{t}.gguf"
            if not model.is_file():
                print(f"skip {model.name}: missing", flush=True)
                continue
            ref = llama_bench(ROOT / "build/cmake/bin/llama-bench", str(model), 16, 512, 128, args.reps,
                              99, args.device, flash_attn="on")
            ours = polyllama_bench(str(model), 16, 512, 128, args.reps, args.backend, -1, flash_attn="on")
            row = {"model": f"{shape} {t}", "bench_pp": ref["pp"], "bench_tg": ref["tg"],
                   "poly_pp": ours["pp"], "poly_tg": ours["tg"], "poly_tg_stream": ours["tg_stream"],
                   "overhead_us": ours["overhead_us_per_token"], "placement": ours["placement"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    batched = {}
    m1 = Path(args.models_dir) / "llama-1b-Q4_0.gguf"
    if m1.is_file():
        batched = batched_bench(str(m1), backend=args.backend, ngl=-1)
        print("batched:", json.dumps(batched), flush=True)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip() or "unknown"
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip()
    lines = [f"## {args.backend} on {gpu} — {datetime.date.today()}, polyllama {commit}", "",
             f"command: `{' '.join(sys.argv)}` (flash attention on, all layers offloaded, {args.reps} reps)", "",
             "| model | llama-bench pp512 | polyllama pp512 | ratio | llama-bench tg128 | polyllama tg128 | ratio | stream tg128 | overhead µs/token |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['bench_pp']:.0f} | {r['poly_pp']:.0f} | {100 * r['poly_pp'] / r['bench_pp']:.1f}% "
                     f"| {r['bench_tg']:.1f} | {r['poly_tg']:.1f} | {100 * r['poly_tg'] / r['bench_tg']:.1f}% "
                     f"| {r['poly_tg_stream']:.1f} | {r['overhead_us'] or 0:.1f} |")
    lines += ["", "polyllama's tg128 includes sampling (greedy arg-max) and detokenizing each token; "
              "llama-bench's only decodes. The overhead column is polyllama's wall time per token "
              "minus llama.cpp's own decode time."]
    if batched:
        lines += ["", "Batched generation, 1B Q4_0, 128 tokens per prompt (aggregate tokens/s):", "",
                  "| prompts | " + " | ".join(str(w) for w in batched) + " |",
                  "|---|" + "---|" * len(batched),
                  "| tokens/s | " + " | ".join(f"{v:.0f}" for v in batched.values()) + " |",
                  "", f"16 prompts vs 1: {batched.get(16, 0) / batched.get(1, 1):.1f}×"]
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    (out / "bench.json").write_text(json.dumps({"rows": rows, "batched": batched}, indent=2))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        names = [r["model"] for r in rows]
        x = range(len(rows))
        for ax, key, title in ((axes[0], "pp", "prompt processing pp512 (t/s)"),
                               (axes[1], "tg", "generation tg128 (t/s)")):
            ax.bar([i - 0.2 for i in x], [r[f"bench_{key}"] for r in rows], 0.4, label="llama-bench")
            ax.bar([i + 0.2 for i in x], [r[f"poly_{key}"] for r in rows], 0.4, label="polyllama")
            ax.set_xticks(list(x))
            ax.set_xticklabels(names, rotation=30)
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
