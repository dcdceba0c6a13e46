"""llama-cpp-python's streamed generation, measured in a child interpreter of
benchmarks/peers.py: argv[1] is a JSON object (model, threads, ngl, fa, reps, n_gen); the
last line printed is a JSON object of figures."""
import json, statistics, sys, time
from llama_cpp import Llama
import llama_cpp
a = json.loads(sys.argv[1])
# threads None: llama-cpp-python's own default (half the CPU count)
llm = Llama(a["model"], n_threads=a["threads"], n_ctx=4096, n_gpu_layers=a["ngl"],
            flash_attn=a["fa"], verbose=False)
for _ in llm.create_completion("The", max_tokens=4, stream=True, temperature=0):
    pass   # warm-up
rates = []
for _ in range(a["reps"]):
    llm.reset()
    t_first, n = None, 0
    for _ in llm.create_completion("The", max_tokens=a["n_gen"], stream=True, temperature=0):
        n += 1
        if t_first is None:
            t_first = time.perf_counter()
    rates.append((n - 1) / (time.perf_counter() - t_first))
print(json.dumps({"tg_stream": statistics.mean(rates), "tg_stream_sd": statistics.pstdev(rates),
                  "threads": llm.context_params.n_threads,
                  "version": getattr(llama_cpp, "__version__", "?")}))
