"""The build pipeline seen from outside: make -n flags, build_info, the CLI."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from polyllama.backend_table import BACKENDS
from conftest import child_env

ROOT = Path(__file__).resolve().parent.parent
FLAGS = {b.name: b.flag for b in BACKENDS if b.name != "cpu"}


def _env(**env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("GGML_") and k != "CMAKE_ARGS"}
    e.update(env)
    return e


def make_n(target, **env):
    """`make -n target`: the sub-make's environment words (build-<b> targets) and the cmake line."""
    r = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, env=_env(**env),
                       timeout=120)
    assert r.returncode == 0, r.stderr
    joined = r.stdout.replace("\\\n", " ")   # recipe lines continued with a backslash
    cmake = [line for line in joined.splitlines() if line.lstrip().startswith("cmake -S")]
    assert len(cmake) == 1, r.stdout
    sub = [line.split() for line in joined.splitlines() if line.rstrip().endswith("make build")]
    return cmake[0], [w for w in (sub[0][:-2] if sub else []) if "=" in w]


def resolved_flags(**env):
    """The -D settings CMakeLists.txt's configure step resolves (`buildconfig.py cmake-file`)
    from the environment make gives it, as `buildconfig.py cmake-args` prints them: the same
    resolution, except that a missing SDK is reported instead of stopping."""
    r = subprocess.run([sys.executable, str(ROOT / "buildtools" / "buildconfig.py"), "cmake-args"],
                       cwd=ROOT, capture_output=True, text=True, env=_env(**env), timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize("backend", sorted(FLAGS))
def test_make_n_build_backend_passes_its_flag(backend):
    line, words = make_n(f"build-{backend}")
    assert words == [f"{FLAGS[backend]}=1"] and "-DGGML_" not in line
    args = resolved_flags(**dict(w.split("=", 1) for w in words))
    assert f"-D{FLAGS[backend]}=ON" in args
    for other, flag in FLAGS.items():
        if other != backend and not (other == "metal" and sys.platform == "darwin"):
            assert f"-D{flag}=OFF" in args, (other, args)


def test_make_n_build_cpu_turns_everything_off():
    line, words = make_n("build-cpu", GGML_VULKAN="1")
    assert sorted(words) == sorted(f"{flag}=0" for flag in FLAGS.values())
    args = resolved_flags(**{"GGML_VULKAN": "1", **dict(w.split("=", 1) for w in words)})
    for flag in FLAGS.values():
        assert f"-D{flag}=OFF" in args


def test_make_n_build_reads_env_and_cmake_args():
    line, _ = make_n("build", GGML_VULKAN="ON", GGML_RPC="true", CMAKE_ARGS="-DFOO=bar")
    assert line.rstrip().endswith("-DFOO=bar")
    args = resolved_flags(GGML_VULKAN="ON", GGML_RPC="true", CMAKE_ARGS="-DFOO=bar")
    assert "-DGGML_VULKAN=ON" in args and "-DGGML_RPC=ON" in args


def test_cmake_resolves_the_flags_itself():
    # one path for make and pip: CMakeLists.txt runs buildconfig.py cmake-file at configure
    text = (ROOT / "CMakeLists.txt").read_text()
    assert '"${CMAKE_CURRENT_SOURCE_DIR}/buildtools/buildconfig.py" cmake-file' in text
    assert "POLYLLAMA_FLAGS_FROM_COMMAND_LINE" not in text


def test_make_build_unknown_target_names_the_choices():
    r = subprocess.run(["make", "-n", "build-nope"], cwd=ROOT, capture_output=True, text=True, env=_env(),
                       timeout=60)
    assert r.returncode != 0
    assert "no target build-nope" in r.stderr and "cpu cuda hip" in r.stderr


def test_make_build_rejects_bad_flag_value_fast():
    e = {k: v for k, v in os.environ.items() if not k.startswith("GGML_")}
    e["GGML_CUDA"] = "maybe"
    r = subprocess.run(["make", "build"], cwd=ROOT, capture_output=True, text=True, env=e, timeout=60)
    assert r.returncode != 0
    assert "GGML_CUDA" in r.stderr and "maybe" in r.stderr


def test_make_build_missing_sdk_fails_before_compiling():
    e = {k: v for k, v in os.environ.items() if not k.startswith("GGML_")}
    e["GGML_SYCL"] = "1"
    r = subprocess.run(["make", "build"], cwd=ROOT, capture_output=True, text=True, env=e, timeout=60)
    if r.returncode == 0:
        pytest.skip("a SYCL compiler is installed here")
    assert "SYCL" in r.stderr and "icpx" in r.stderr
    assert "cmake -S" not in r.stdout


def test_build_info_json_shipped_with_extension():
    import polyllama
    info = polyllama.build_info()
    data = json.loads((Path(polyllama.__file__).parent / "build_info.json").read_text())
    assert info["backends"] == data["backends"] and "cpu" in data["backends"]
    assert data["build_type"] == "Release"
    assert data["compiler"].split()[0] in ("GNU", "Clang", "AppleClang", "MSVC", "IntelLLVM")
    for flag in FLAGS.values():
        assert data["flags"][flag] in ("ON", "OFF")
        assert (data["flags"][flag] == "ON") == (flag[5:].lower() in data["backends"])


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


AMX_STATES = ("as -march=native finds it", "off (", "kept, not probed", "as ggml's GGML_AMX_*",
              "not applicable")


def test_cpu_amx_decision_matches_what_ggml_cpu_offers():
    """build_info()["cpu_amx"] records what CMakeLists.txt decided (ARCHITECTURE.md §5);
    the weight buffers ggml-cpu offers at run time agree with it."""
    import polyllama
    info = polyllama.build_info()
    state, bufs = info["cpu_amx"], info["cpu_weight_buffers"]
    assert state.startswith(AMX_STATES), state
    if state.startswith("off ("):
        assert "AMX" not in bufs, bufs
    if (state.startswith("as -march=native") and info["flags"].get("GGML_NATIVE") == "ON"
            and {"amx_tile", "amx_int8"} <= _cpu_flags()):
        # a native build on an AMX CPU whose tile probe passed keeps ggml's AMX buffer
        assert "AMX" in bufs, bufs


def test_prompt_through_the_amx_tile_kernels(model_path):
    """Prompts reach ggml's AMX tile kernels (single tokens take its VNNI ones). Built by
    GCC 12 at -O3 they died with SIGSEGV at their first ldtilecfg; CMakeLists.txt compiles
    them at -O2. In a child process, so that a crash fails this test, not the whole run."""
    import polyllama
    if "AMX" not in polyllama.build_info()["cpu_weight_buffers"]:
        pytest.skip("ggml-cpu offers no AMX buffer in this build or on this CPU")
    code = ("import sys\n"
            "from polyllama import LLM\n"
            "llm = LLM(sys.argv[1], backend='cpu', n_threads=2, n_ctx=1024)\n"
            "r = llm.generate(' '.join(f'word{i}' for i in range(100)), max_tokens=4, ignore_eos=True)\n"
            "print(r.prompt_tokens, r.generated_tokens)\n")
    env = child_env()
    r = subprocess.run([sys.executable, "-c", code, model_path], capture_output=True, text=True,
                       env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    n_prompt, n_gen = map(int, r.stdout.split())
    assert n_prompt > 200 and n_gen == 4   # one micro-batch of 290 rows


def run_cli(*args, timeout=300):
    env = child_env()
    return subprocess.run([sys.executable, "-m", "polyllama", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def test_cli_info_lists_cpu_device_with_memory():
    r = run_cli("info", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    cpu = [d for d in info["devices"] if d["backend"] == "cpu"]
    assert cpu and cpu[0]["memory_total"] > 0 and cpu[0]["memory_free"] > 0
    r = run_cli("info")
    assert r.returncode == 0 and "✓ cpu" in r.stdout and "recommended backend" in r.stdout


def test_cli_run_matches_library(model_path, llm):
    expected = llm.generate("The capital of France is", max_tokens=12).text
    r = run_cli("run", "-m", model_path, "-p", "The capital of France is", "-n", "12", "--temp", "0",
                "-t", "2", "--backend", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "The capital of France is" + expected + "\n"
    assert "cpu on CPU: 0/31 layers offloaded" in r.stderr


def test_cli_errors_are_messages_not_tracebacks(model_path):
    r = run_cli("run", "-m", model_path, "-p", "x", "--backend", "nope")
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1].startswith("polyllama: error: unknown backend 'nope'")
    assert "Traceback" not in r.stderr
    r = run_cli("run", "-m", "/nonexistent.gguf", "-p", "x")
    assert r.returncode == 1 and "model file not found: /nonexistent.gguf" in r.stderr


def test_cli_list_devices():
    from polyllama import devices
    r = run_cli("run", "--list-devices")
    assert r.returncode == 0
    for d in devices():   # the subprocess inherits GGML_VK_VISIBLE_DEVICES from conftest
        assert f"[{d.index}] {d.spec:<9} {d.name}" in r.stdout, d


def test_rpc_wire_constants_match_the_pinned_ggml_rpc():
    # polyllama.rpc speaks ggml-rpc's HELLO itself (to refuse a wrong server before ggml
    # would abort on it); a new llama.cpp pin must not leave its constants behind
    import re
    from polyllama import rpc
    root = Path(__file__).resolve().parent.parent / "thirdparty" / "llama.cpp" / "ggml"
    header = (root / "include" / "ggml-rpc.h").read_text()
    major = int(re.search(r"#define RPC_PROTO_MAJOR_VERSION\s+(\d+)", header).group(1))
    minor = int(re.search(r"#define RPC_PROTO_MINOR_VERSION\s+(\d+)", header).group(1))
    assert (rpc.PROTO_MAJOR, rpc.PROTO_MINOR) == (major, minor)
    src = (root / "src" / "ggml-rpc" / "ggml-rpc.cpp").read_text()
    assert re.search(r"RPC_CMD_HELLO == (\d+)", src).group(1) == str(rpc._CMD_HELLO)
    transport = (root / "src" / "ggml-rpc" / "transport.h").read_text()
    assert re.search(r"RPC_CONN_CAPS_SIZE = (\d+)", transport).group(1) == str(rpc._CAPS_SIZE)
