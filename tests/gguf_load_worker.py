"""Worker process for tests/test_corrupt_gguf.py: loads GGUF files one after another.

Reads one path per line on stdin. For each, writes "BEGIN <n>" before touching the file and
"END <n> <json>" after, on stdout, flushed. If the process dies in between (a signal, an
abort in llama.cpp), the parent sees BEGIN without END and knows which file killed it.

The json is {"outcome": "loaded" | "error", "exception": class name, "message": text,
"polyllama": whether it is a PolyllamaError}. A file that loads is also asked to tokenize
and generate two tokens (greedy, then sampled), so damage that only shows later is caught
as well. With GGUF_WORKER_TOKENIZER=1 it also reports what Tokenizer(path) does.
"""
from __future__ import annotations

import json
import os
import resource
import sys

# Absurd sizes in a damaged file must fail as an allocation error, not swap the machine.
resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


def try_tokenizer(path: str) -> dict:
    """What Tokenizer(path) does (vocabulary only): {} when it loads and tokenizes."""
    from polyllama import PolyllamaError, Tokenizer
    try:
        t = Tokenizer(path)
    except Exception as e:
        return {"exception": type(e).__name__, "message": str(e)[:500], "polyllama": isinstance(e, PolyllamaError)}
    try:
        t.tokenize("hello world")
        return {}
    except Exception as e:
        return {"loaded": True, "exception": type(e).__name__, "message": str(e)[:500],
                "polyllama": isinstance(e, PolyllamaError)}
    finally:
        t.close()


def try_file(path: str) -> dict:
    from polyllama import LLM, PolyllamaError
    if os.environ.get("GGUF_WORKER_TOKENIZER") == "1":
        tok = try_tokenizer(path)
        res = try_file_llm(path)
        res["tokenizer"] = tok
        return res
    return try_file_llm(path)


def try_file_llm(path: str) -> dict:
    from polyllama import LLM, PolyllamaError
    try:
        llm = LLM(path, backend="cpu", n_ctx=64, n_batch=64, n_ubatch=64, n_seq_max=1, n_threads=1)
    except Exception as e:
        return {"outcome": "error", "exception": type(e).__name__, "message": str(e)[:500],
                "polyllama": isinstance(e, PolyllamaError)}
    try:
        llm.tokenize("hello world")
        llm.generate("hello", max_tokens=2)
        llm.generate("hello", max_tokens=2, temperature=0.7, seed=1)   # the sampler chain too
        return {"outcome": "loaded"}
    except Exception as e:
        return {"outcome": "loaded", "exception": type(e).__name__, "message": str(e)[:500],
                "polyllama": isinstance(e, PolyllamaError)}
    finally:
        llm.close()


def main() -> int:
    import polyllama  # noqa: F401  (import before the first BEGIN: an import failure is not a file's fault)
    out = sys.stdout
    for n, line in enumerate(sys.stdin):
        path = line.rstrip("\n")
        out.write(f"BEGIN {n}\n")
        out.flush()
        res = try_file(path)
        out.write(f"END {n} {json.dumps(res)}\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
