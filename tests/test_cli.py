"""The command line (`python -m polyllama` / `polyllama`): llama.cpp's flag spellings and
clean errors. Real model, no mocks; see test_build.py for the info/--list-devices tests.
"""
from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import tomllib

import pytest

from conftest import ROOT, THREADS, TOOLS_DIR, child_env

from polyllama import cli

PROMPT = "The capital of France is"


def run_cli(*args, stdin=None, timeout=300):
    env = child_env()
    return subprocess.run([sys.executable, "-m", "polyllama", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, input=stdin,
                          stdin=subprocess.DEVNULL if stdin is None else None)


def test_llama_cpp_spellings_match_library_greedy(model_path, llm, capsys):
    expected = llm.generate(PROMPT, max_tokens=8).text
    rc = cli.main(["run", "-m", model_path, "-ngl", "0", "-sm", "none", "-dev", "cpu:0", "-p", PROMPT,
                   "-n", "8", "--temp", "0", "-t", str(THREADS)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert out.out == PROMPT + expected + "\n"
    assert out.err.startswith("[cpu")


def test_run_without_model_uses_default(llm):
    expected = llm.generate(PROMPT, max_tokens=4).text
    r = run_cli("run", "-p", PROMPT, "-n", "4", "--temp", "0", "-t", str(THREADS), "--backend", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout == PROMPT + expected + "\n"


@pytest.mark.parametrize("text,meaning", [
    ("auto", "auto"), ("-1", "auto"),           # llama.cpp common.h: -1 is auto
    ("all", -1), ("ALL", -1), ("-2", -1), ("-99", -1),   # <= -2 is all; -1 in the Python API
    ("0", 0), ("12", 12),
])
def test_ngl_values_mean_what_llama_cpp_means(text, meaning):
    for cmd in ("run", "chat", "bench"):
        assert cli.build_parser().parse_args([cmd, "-ngl", text]).n_gpu_layers == meaning


@pytest.mark.parametrize("ngl", ["all", "auto"])
def test_ngl_all_and_auto_are_accepted(model_path, ngl, capsys):
    rc = cli.main(["run", "-m", model_path, "-ngl", ngl, "-p", "Hi", "-n", "1", "-t", str(THREADS)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "Traceback" not in out.err


def test_ngl_all_reaches_the_library_as_every_layer(model_path, capsys):
    # backend cpu refuses any offload: the library's message shows the value it received
    rc = cli.main(["run", "-m", model_path, "--backend", "cpu", "-ngl", "all", "-p", "Hi", "-n", "1"])
    assert rc == 1
    assert "n_gpu_layers=-1" in capsys.readouterr().err


@pytest.mark.parametrize("args,flag", [
    (["-ngl", "many"], "-ngl/--n-gpu-layers"),
    (["-ngl", "1.5"], "-ngl/--n-gpu-layers"),
    (["-ts", "3,x"], "-ts/--tensor-split"),
    (["-ts", "0,0"], "-ts/--tensor-split"),
    (["-ts", ""], "-ts/--tensor-split"),
    (["-dev", ","], "-dev/--device"),
    (["-dev", "none,cpu:0"], "-dev/--device"),
])
def test_bad_placement_values_are_argparse_errors(args, flag, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "-p", "Hi", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"polyllama run: error: argument {flag}" in err


def test_bad_ngl_in_subprocess_is_a_message(model_path):
    r = run_cli("run", "-m", model_path, "-ngl", "many", "-p", "Hi")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "expected 'auto', 'all' or a number of layers, not 'many'" in r.stderr


def test_tensor_split_accepts_llama_cpp_separators():
    assert cli.build_parser().parse_args(["run", "-ts", "3/1"]).tensor_split == [3.0, 1.0]
    assert cli.build_parser().parse_args(["run", "-ts", "1,2,1"]).tensor_split == [1.0, 2.0, 1.0]


def test_device_none_runs_on_cpu(model_path, llm, capsys):
    expected = llm.generate("Hi", max_tokens=2).text
    rc = cli.main(["run", "-m", model_path, "--device", "none", "-p", "Hi", "-n", "2", "--temp", "0",
                   "-t", str(THREADS)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert out.err.startswith("[cpu"), out.err
    assert out.out == "Hi" + expected + "\n"


def test_device_none_conflicts_with_a_gpu_backend(model_path, capsys):
    assert cli.main(["run", "-m", model_path, "-dev", "none", "--backend", "cuda", "-p", "Hi"]) == 2
    assert capsys.readouterr().err.startswith("polyllama: error: --device none")


@pytest.mark.parametrize("args,flag", [
    (["-n", "0"], "-n/--n-predict"),
    (["-t", "0"], "-t/--threads"),
    (["--temp", "-1"], "--temp"),
    (["-c", "-5"], "-c/--ctx-size"),
    (["-r", ""], "-r/--reverse-prompt"),
])
def test_values_the_library_rejects_are_clean_errors(model_path, args, flag):
    r = run_cli("run", "-m", model_path, "-p", "Hi", *args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1].startswith(f"polyllama: error: argument {flag}: ")


def test_empty_prompt_is_a_clean_error(model_path, capsys):
    assert cli.main(["run", "-m", model_path, "-p", ""]) == 2
    assert "the prompt is empty" in capsys.readouterr().err


def test_main_gpu_out_of_range_is_a_clean_error(model_path, capsys):
    assert cli.main(["run", "-m", model_path, "-dev", "cpu:0", "-mg", "3", "-p", "Hi"]) == 2
    assert "argument -mg/--main-gpu" in capsys.readouterr().err


def test_chat_from_stdin_keeps_history(model_path, llm):
    q1 = "My name is Zorblax and my favourite colour is teal."
    q2 = "What is my name?"
    n = 16
    # the same history as the CLI's fresh LLM (what the engine's cache holds decides where
    # cells lie, and ggml-cpu's arithmetic depends on that: ARCHITECTURE.md §6.3)
    llm.engine.clear_cache()
    r1 = llm.chat([{"role": "user", "content": q1}], max_tokens=n).text
    r2 = llm.chat([{"role": "user", "content": q1}, {"role": "assistant", "content": r1},
                   {"role": "user", "content": q2}], max_tokens=n).text
    alone = llm.chat([{"role": "user", "content": q2}], max_tokens=n).text
    # the model only knows the name when the first turn is in the prompt
    assert "Zorb" in r2 and "Zorb" not in alone, (r2, alone)
    r = run_cli("chat", "-m", model_path, "-n", str(n), "--temp", "0", "-t", str(THREADS),
                "--backend", "cpu", stdin=f"{q1}\n{q2}\n")
    assert r.returncode == 0, r.stderr
    # input() writes its "> " prompt to stdout; EOF ends the session with a newline
    assert r.stdout == f"> {r1}\n> {r2}\n> \n"


def test_console_script_is_declared_and_callable():
    with open(ROOT / "pyproject.toml", "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    target = scripts["polyllama"]
    module, _, attr = target.partition(":")
    fn = importlib.import_module(module)
    for part in attr.split("."):
        fn = getattr(fn, part)
    assert callable(fn)
    inspect.signature(fn).bind()   # the generated script calls it with no arguments
    assert fn is cli.main


def test_bench_rounds_report_medians_and_ratios(model_path, tmp_path, capsys):
    """`bench --rounds 2`: llama-bench and polyllama measured in each round, the report
    gives per-round ratios as a median with a range, the JSON keeps every round."""
    out_json = tmp_path / "bench.json"
    rc = cli.main(["bench", "-m", model_path, "-t", str(THREADS), "-p", "16", "-n", "8", "-r", "1",
                   "--rounds", "2", "--json", str(out_json), "--llama-bench-dir", str(TOOLS_DIR)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in out.out.splitlines() if line.startswith("| ") and not line.startswith("| runner")}
    assert set(rows) == {"llama-bench", "polyllama generate", "polyllama stream"}
    assert rows["llama-bench"][:1] == [str(THREADS)]
    # pp16 and tg8 of generate against llama-bench: "median% (min–max)" over the two rounds
    for cell in rows["polyllama generate"][3:5]:
        assert re.fullmatch(r"\d+\.\d% \(\d+\.\d–\d+\.\d\)", cell), cell
    figures = json.loads(out_json.read_text())
    assert len(figures["rounds"]) == 2
    for r in figures["rounds"]:
        assert r["llama_bench"]["tg"] > 0 and r["polyllama"]["tg"] > 0 and r["polyllama"]["pp"] > 0


@pytest.mark.parametrize("flag,value", [("--rounds", "0"), ("-r", "0"), ("--rounds", "two")])
def test_bench_counts_must_be_positive(flag, value, capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["bench", flag, value])
    assert e.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_bench_reports_name_the_commit_and_flag_a_tree_that_differs(tmp_path, monkeypatch):
    # the device tool's copy of the tree carried a stale .git: reports named a commit
    # several behind what ran (2026-11-25 and 26)
    from polyllama.bench import source_commit
    monkeypatch.delenv("POLYLLAMA_COMMIT", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))   # a TMPDIR inside a checkout
    assert source_commit(tmp_path) == "unknown"
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f.txt").write_text("one\n")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (tmp_path / "untracked.txt").write_text("not part of the tree\n")
    assert source_commit(tmp_path) == head
    (tmp_path / "f.txt").write_text("two\n")
    assert source_commit(tmp_path) == head + "+changes"
    monkeypatch.setenv("POLYLLAMA_COMMIT", "abc1234")
    assert source_commit(tmp_path) == "abc1234"


@pytest.mark.parametrize("argv,shown", [
    (["/x/src/polyllama/__main__.py", "bench", "-t", "2"], "python -m polyllama bench -t 2"),
    (["/venv/bin/polyllama", "bench", "-m", "my model.gguf"], "polyllama bench -m 'my model.gguf'"),
    (["benchmarks/bench_cpu.py", "--rounds", "3"], "python benchmarks/bench_cpu.py --rounds 3"),
])
def test_bench_reports_give_the_command_as_typed(argv, shown, monkeypatch):
    from polyllama import bench
    monkeypatch.setattr(sys, "argv", argv)
    assert bench._command_line() == shown
