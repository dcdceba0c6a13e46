"""cyllama's streamed generation, measured in a child interpreter of benchmarks/peers.py:
argv[1] is a JSON object (model, threads, ngl, reps, n_gen); the last line printed is a
JSON object of figures."""
import json, statistics, sys, time
import cyllama
from cyllama import LLM, GenerationConfig
a = json.loads(sys.argv[1])
cfg = GenerationConfig(temperature=0.0, n_ctx=4096, n_gpu_layers=a["ngl"])   # 0.0: greedy sampler
llm = LLM(a["model"], config=cfg, verbose=False)
warm = GenerationConfig(temperature=0.0, n_ctx=4096, n_gpu_layers=a["ngl"], max_tokens=4)
for _ in llm("The", config=warm, stream=True):
    pass   # warm-up; also creates the context, which later calls reuse (same n_ctx)
# cyllama's LLM has no thread option: its context gets llama.cpp's default (4 threads),
# so the count is set on that context (threads None: left as cyllama sets it), and
# checked on every repetition
if a["threads"] is not None:
    llm._ctx.set_n_threads(a["threads"], a["threads"])
    for _ in llm("The", config=warm, stream=True):
        pass   # warm-up with the thread count that is measured
threads = llm._ctx.n_threads()
run = GenerationConfig(temperature=0.0, n_ctx=4096, n_gpu_layers=a["ngl"], max_tokens=a["n_gen"])
rates = []
for _ in range(a["reps"]):
    t_first, n = None, 0
    for _ in llm("The", config=run, stream=True):   # one chunk per token (no stop sequences)
        n += 1
        if t_first is None:
            t_first = time.perf_counter()
    rates.append((n - 1) / (time.perf_counter() - t_first))
    if llm._ctx.n_threads() != threads:
        sys.exit(f"cyllama context runs {llm._ctx.n_threads()} threads, not {threads}")
print(json.dumps({"tg_stream": statistics.mean(rates), "tg_stream_sd": statistics.pstdev(rates),
                  "threads": threads, "version": getattr(cyllama, "__version__", "?")}))
