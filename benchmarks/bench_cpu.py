#!/usr/bin/env python3
"""polyllama vs llama-bench (same llama.cpp tree, same run) on one device.

Measures prompt processing (ppN) and generation (tgN) tokens/s:
  * llama-bench from build/cmake/bin (the reference: llama.cpp's own numbers),
  * polyllama `generate` (pp: a prompt of N tokens; tg: N tokens after a 1-token prompt),
  * polyllama `stream` (tg: the same, consumed piece by piece),
  * llama-cpp-python and cyllama when importable (benchmarks/peers.py; reported, never
    required; on the CPU only; --no-others skips them),
and the per-token Python overhead of polyllama's loop: wall time per generated token
minus llama.cpp's own decode time per token (llama_perf_context).

    python benchmarks/bench_cpu.py                      # SmolLM2, CPU, 2 threads
    python benchmarks/bench_cpu.py -m model.gguf --backend cuda -p 512 -n 128 --ngl 99

Prints a markdown table with ratios; --json FILE writes the raw figures.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from peers import RUNNERS  # noqa: E402  (this folder is on sys.path: the script's own)
from polyllama.bench import compare  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1, help="measure every runner this many times, in turn")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--ngl", default="auto", help="layers to offload (llama-bench gets 99 for 'auto')")
    ap.add_argument("--device", default=None, help="llama-bench -dev value, e.g. CUDA0")
    ap.add_argument("--bin", default=str(ROOT / "build" / "cmake" / "bin"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-others", action="store_true", help="skip llama-cpp-python and cyllama")
    args = ap.parse_args()

    from polyllama.default_model import default_model_path
    model = args.model or str(default_model_path())
    figures, report = compare(model, backend=args.backend, threads=args.threads, n_prompt=args.n_prompt,
                              n_gen=args.n_gen, reps=args.reps, ngl=args.ngl, device=args.device,
                              bin_dir=args.bin, rounds=args.rounds, others=() if args.no_others else RUNNERS)
    print(report)
    if args.json:
        Path(args.json).write_text(json.dumps({**figures, "args": vars(args)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
