#!/usr/bin/env python3
"""polyllama vs llama-bench (same llama.cpp tree, same run) on one device.

Measures prompt processing (ppN) and generation (tgN) tokens/s:
  * llama-bench from build/cmake/bin (the reference: llama.cpp's own numbers),
  * polyllama `generate` (pp: a prompt of N tokens; tg: N tokens after a 1-token prompt),
  * polyllama `stream` (tg: the same, consumed piece by piece),
  * llama-cpp-python and cyllama when importable (reported, never required),
and the per-token Python overhead of polyllama's loop: wall time per generated token
minus llama.cpp's own decode time per token (llama_perf_context).

    python benchmarks/bench_cpu.py                      # SmolLM2, CPU, 2 threads
    python benchmarks/bench_cpu.py -m model.gguf --backend cuda -p 512 -n 128 --ngl 99

Prints a markdown table with ratios; --json FILE writes the raw figures.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from polyllama.bench import cyllama_bench, llama_bench, llama_cpp_python_bench, polyllama_bench  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--ngl", default="auto", help="layers to offload (llama-bench gets 99 for 'auto')")
    ap.add_argument("--device", default=None, help="llama-bench -dev value, e.g. CUDA0")
    ap.add_argument("--bin", default=str(ROOT / "build" / "cmake" / "bin"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from polyllama.models import default_model_path
    model = args.model or str(default_model_path())
    ngl = args.ngl if args.ngl == "auto" else int(args.ngl)
    bench_ngl = 0 if args.backend == "cpu" else (99 if ngl == "auto" else ngl)
    # backend="cpu" uses no device at all; llama-bench with -ngl 0 would still hand large
    # matrix products to a visible GPU (op offload), so it gets -dev none to match
    bench_dev = "none" if args.backend == "cpu" and not args.device else args.device
    ref = llama_bench(Path(args.bin) / "llama-bench", model, args.threads, args.n_prompt, args.n_gen,
                      args.reps, bench_ngl, bench_dev)
    ours = polyllama_bench(model, args.threads, args.n_prompt, args.n_gen, args.reps, args.backend, ngl)
    lcp = llama_cpp_python_bench(model, args.threads, args.n_gen, args.reps) if args.backend == "cpu" else None
    cyl = cyllama_bench(model, args.threads, args.n_gen, args.reps) if args.backend == "cpu" else None
    # polyllama stream / each other binding's stream (same prompt "The", greedy, n_gen tokens)
    ratios = {name: ours["tg_stream"] / other["tg_stream"]
              for name, other in (("llama_cpp_python", lcp), ("cyllama", cyl)) if other}

    pp, tg = f"pp{args.n_prompt}", f"tg{args.n_gen}"
    print(f"# polyllama benchmark — {datetime.date.today()}, {platform.node()}, "
          f"{Path(model).name}, {args.threads} threads, {ours['placement']}")
    print(f"command: {' '.join(sys.argv)}\n")
    print(f"| runner | {pp} t/s | {tg} t/s | {pp} vs llama-bench | {tg} vs llama-bench | polyllama stream / runner |")
    print("|---|---|---|---|---|---|")
    print(f"| llama-bench | {ref['pp']:.1f} ± {ref['pp_sd']:.1f} | {ref['tg']:.1f} ± {ref['tg_sd']:.1f} | 100% | 100% | — |")
    print(f"| polyllama generate | {ours['pp']:.1f} ± {ours['pp_sd']:.1f} | {ours['tg']:.1f} ± {ours['tg_sd']:.1f} "
          f"| {100 * ours['pp'] / ref['pp']:.1f}% | {100 * ours['tg'] / ref['tg']:.1f}% | — |")
    print(f"| polyllama stream | — | {ours['tg_stream']:.1f} ± {ours['tg_stream_sd']:.1f} | — "
          f"| {100 * ours['tg_stream'] / ref['tg']:.1f}% | 1.00× |")
    for label, key, other in (("llama-cpp-python", "llama_cpp_python", lcp), ("cyllama", "cyllama", cyl)):
        if other:
            print(f"| {label} {other['version']} stream | — | {other['tg_stream']:.1f} ± {other['tg_stream_sd']:.1f} "
                  f"| — | {100 * other['tg_stream'] / ref['tg']:.1f}% | {ratios[key]:.2f}× |")
    print(f"\npolyllama's {tg} includes sampling each token (greedy arg-max here) and detokenizing it; "
          f"llama-bench's decodes only.")
    if ours["overhead_us_per_token"] is not None:
        print(f"\npolyllama per-token overhead outside llama_decode: {ours['overhead_us_per_token']:.1f} µs")
    if args.json:
        Path(args.json).write_text(json.dumps({"llama_bench": ref, "polyllama": ours,
                                               "llama_cpp_python": lcp, "cyllama": cyl,
                                               "polyllama_stream_ratio": ratios, "args": vars(args)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
