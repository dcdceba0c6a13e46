"""Damaged GGUF files must raise a Python exception, never kill the interpreter.

tests/gguf_corpus.py writes ~700 deterministic variants of a tiny synthetic model and of
SmolLM2 (truncations, byte flips, absurd counts and lengths, wrong magic/version, duplicate
names, bad types, nonsense hyperparameters). A worker process (tests/gguf_load_worker.py)
loads them in sequence and reports over a pipe; when it dies, the file it was on is
recorded with the signal and the worker is restarted on the remaining files.

Runs in about 1-2 minutes on 2 shared cores.
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gguf_corpus import build_corpus, write_semantic_variants
from conftest import child_env

HERE = Path(__file__).resolve().parent
PER_FILE_TIMEOUT_S = 30


def load_all(paths: list[str], log_dir: Path, tokenizer: bool = False) -> dict[int, dict]:
    """Load every path in worker processes; {index: result}. A crash gives
    {"outcome": "crash", "signal"/"returncode": ..., "stderr": last lines}. tokenizer=True:
    each result also says what Tokenizer(path) did."""
    env = dict(os.environ)
    env["GGUF_WORKER_TOKENIZER"] = "1" if tokenizer else "0"
    env["GGML_NO_BACKTRACE"] = "1"   # ggml would run gdb for a backtrace on abort: slow
    env = child_env(env)
    results: dict[int, dict] = {}
    start = 0
    attempt = 0
    while start < len(paths):
        attempt += 1
        err_path = log_dir / f"worker-{attempt}.stderr"
        with open(err_path, "wb") as err:
            proc = subprocess.Popen([sys.executable, str(HERE / "gguf_load_worker.py")],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                    env=env, text=True, bufsize=1)
        proc.stdin.write("".join(p + "\n" for p in paths[start:]))
        proc.stdin.close()
        current = None
        hung = False
        done_here = 0
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], PER_FILE_TIMEOUT_S)
            if not ready:
                hung = True
                proc.kill()
                break
            line = proc.stdout.readline()
            if not line:
                break
            kind, n, *rest = line.rstrip("\n").split(" ", 2)
            if kind == "BEGIN":
                current = start + int(n)
            elif kind == "END":
                results[start + int(n)] = json.loads(rest[0])
                current = None
                done_here += 1
        rc = proc.wait()
        if current is None:
            if start + done_here < len(paths):   # died outside any file: not the corpus' fault
                raise RuntimeError(f"the worker exited with {rc} between files: "
                                   f"{err_path.read_text(errors='replace')[-2000:]}")
            break
        tail = err_path.read_text(errors="replace").strip().splitlines()[-3:]
        results[current] = {"outcome": "hang" if hung else "crash",
                            "signal": signal.Signals(-rc).name if rc < 0 else None,
                            "returncode": rc, "stderr": " | ".join(tail)}
        start = current + 1
    return results


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, model_path):
    out = tmp_path_factory.mktemp("corrupt-gguf")
    items = build_corpus(out, model_path, seed=7)
    yield out, items
    for path, _, _ in items:       # ~600 MB of (partly sparse) files: do not keep them
        Path(path).unlink(missing_ok=True)


def test_corrupt_gguf_files_raise_instead_of_crashing(corpus):
    out, items = corpus
    assert len(items) >= 500
    t0 = time.monotonic()
    results = load_all([p for p, _, _ in items], out)
    elapsed = time.monotonic() - t0
    assert len(results) == len(items)
    crashed = [(items[i], r) for i, r in sorted(results.items()) if r["outcome"] in ("crash", "hang")]
    # a file that fails to load, or loads and then fails to tokenize or generate, must
    # fail with a PolyllamaError either way
    foreign = [(items[i], r) for i, r in sorted(results.items())
               if "exception" in r and not r["polyllama"]]
    summary = {k: sum(r["outcome"] == k for r in results.values()) for k in ("loaded", "error", "crash", "hang")}
    print(f"\n{len(items)} files in {elapsed:.1f} s: {summary}")
    report = [f"{label} {name} ({Path(path).name}): {r['outcome']} {r.get('signal') or r.get('returncode')} "
              f"{r.get('stderr', '')}" for (path, label, name), r in crashed]
    assert not crashed, f"{len(crashed)} of {len(items)} damaged files killed the worker:\n" + "\n".join(report)
    assert not foreign, "damaged files raised exceptions outside PolyllamaError:\n" + "\n".join(
        f"{label} {name}: {r['exception']}: {r['message']}" for (path, label, name), r in foreign)
    # the intact synthetic model loads, and most damage is refused
    assert results[0]["outcome"] == "loaded" and "exception" not in results[0]
    assert summary["error"] > len(items) // 2
    # the messages name the problem, not just llama.cpp's final "failed to load model"
    generic = [items[i][2] for i, r in results.items() if "failed to load model" in r.get("message", "")]
    assert not generic, f"messages without a reason for: {generic[:20]}"
    expected = {"magic=b'GGUG'": "invalid magic characters: 'GGUG', expected 'GGUF'",
                "version=0": "bad GGUF version: 0",
                "n_tensors=2^64-1": "number of tensors is -1",
                "value[llama.block_count]=0": "llama.block_count is 0; llama.cpp supports 1 to 512 layers",
                "value[llama.attention.layer_norm_rms_epsilon]=nan": "must be a finite number >= 0",
                "duplicate_tensor[": "duplicate tensor name",
                "duplicate_key[": "duplicate key",
                "truncate@data:": "data is not within the file bounds"}
    for i, (path, label, name) in enumerate(items):
        for start, text in expected.items():
            if name.startswith(start):
                assert results[i]["exception"] == "ModelLoadError", (label, name, results[i])
                assert text in results[i]["message"] and "download or convert it again" in results[i]["message"], \
                    (label, name, results[i]["message"])


def test_semantic_damage_fails_at_load_naming_the_key(tmp_path):
    """Files whose structure is valid but whose values mean nothing (tests/gguf_corpus.py
    SEMANTIC): ModelLoadError from LLM() naming the key, never a signal and never at a later
    call; a vocabulary problem fails Tokenizer() the same way. Harmless ones load and run."""
    # (the context_length one needs n_ctx=0: test_context_length_beyond_what_llm_takes_with_n_ctx_0)
    items = [it for it in write_semantic_variants(tmp_path) if "n_ctx=0" not in it[1]]
    results = load_all([p for p, _, _, _ in items], tmp_path, tokenizer=True)
    bad = []
    for i, (path, name, expect, match) in enumerate(items):
        r = results[i]
        allowed = expect.split("|")
        if r["outcome"] in ("crash", "hang"):
            bad.append(f"{name}: {r['outcome']} {r.get('signal')} {r.get('stderr', '')}")
        elif r["outcome"] == "loaded" and "exception" not in r:
            if "ok" not in allowed:
                bad.append(f"{name}: loaded and ran; expected {expect}")
        elif r.get("exception") not in allowed or not re.search(match, r["message"]):
            bad.append(f"{name}: {r.get('exception')}: {r.get('message')}; expected {expect} /{match}/")
        elif r.get("exception") == "ModelLoadError" and r["outcome"] != "error":
            bad.append(f"{name}: ModelLoadError only after loading: {r['message']}")
        tok = r.get("tokenizer", {})
        if r.get("exception") == "ModelLoadError" and "tokenizer.ggml" in match:
            if tok.get("exception") != "ModelLoadError" or tok.get("loaded"):
                bad.append(f"{name}: Tokenizer() did not refuse it at load: {tok}")
        elif tok.get("exception") and not tok.get("polyllama"):
            bad.append(f"{name}: Tokenizer() raised {tok['exception']}: {tok['message']}")
    print(f"\n{len(items)} semantic variants: {sum(r['outcome'] == 'error' for r in results.values())} refused at load")
    assert not bad, "\n".join(bad)


def test_context_length_beyond_what_llm_takes_with_n_ctx_0(tmp_path):
    """n_ctx=0 takes the file's context_length: 2**32-1 overflowed llama.cpp's padding of
    n_ctx to 0 and aborted (GGML_ASSERT(n_outputs >= 1)); now a ValueError before loading."""
    from gguf_corpus import _set, write_synthetic_model
    from polyllama import LLM
    path = write_synthetic_model(tmp_path / "ctx.gguf", _set("llama.context_length", 0xFFFFFFFF))
    with pytest.raises(ValueError, match=r"n_ctx=0 takes the model's context_length, which is 4294967295"):
        LLM(path, backend="cpu", n_ctx=0, n_threads=1)
    with LLM(path, backend="cpu", n_ctx=64, n_threads=1) as llm:      # an explicit n_ctx is fine
        assert llm.generate("hello", max_tokens=1).generated_tokens == 1
