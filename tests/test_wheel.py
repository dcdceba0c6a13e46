"""The package as a wheel installs it: which copy is imported, what the wheel carries and
leaves to the system, and the errors that replace crashes on a machine it does not fit.

`make test-wheel` runs the whole suite against a wheel installed into a fresh venv
(POLYLLAMA_TEST_INSTALLED=1, conftest.INSTALLED); the tests here that need an installed,
portable wheel skip in the development tree and say so.
"""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import polyllama
from conftest import INSTALLED, ROOT, SRC, child_env
from polyllama._llamacpp_loader import build_info_file
from polyllama.backend_table import BACKENDS, CPU_ISA_FLAGS, PORTABLE_CPU_ISA
from polyllama.errors import ExtensionLoadError

INFO = build_info_file()
# a child that imports the package and prints the error that refused it
REFUSED = ("import polyllama\ntry:\n    import polyllama._llamacpp_loader\n"
           "except ImportError as x:\n    print('refused:', type(x).__name__, x)\n")
needs_installed = pytest.mark.skipif(not INSTALLED, reason="the development tree is imported from src/; "
                                     "`make test-wheel` runs this against an installed wheel")


def test_the_copy_under_test_is_the_one_imported():
    here = Path(polyllama.__file__).resolve()
    if not INSTALLED:
        assert here.is_relative_to(SRC), here
        return
    assert not here.is_relative_to(SRC), f"{here}: the checkout was imported, not the installed wheel"
    assert here.is_relative_to(Path(sys.prefix).resolve()), (here, sys.prefix)
    dist = importlib.metadata.distribution("polyllama")
    files = {str(f) for f in dist.files}
    ext = [f for f in files if f.startswith("polyllama/_llamacpp") and f.endswith(".so")]
    assert len(ext) == 1, files
    assert Path(dist.locate_file(ext[0])).resolve() == Path(polyllama._llamacpp_loader.llamacpp.__file__).resolve()
    # a wheel carries the package, not its sources or build helpers
    assert not any(f.endswith((".pyx", ".pxd", ".cpp", ".h")) or f.startswith(("buildtools/", "polyllama/csrc"))
                   for f in files), sorted(files)


@needs_installed
def test_wheel_is_portable_and_says_what_it_carries():
    assert INFO["portable"] is True
    assert INFO["flags"]["GGML_NATIVE"] == "OFF"
    if os.uname().machine == "x86_64":
        assert INFO["cpu_isa"] == list(PORTABLE_CPU_ISA)
    out = subprocess.run([sys.executable, "-m", "polyllama", "info"], env=child_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stdout
    assert f"compiled backends: {', '.join(INFO['backends'])}" in out.stdout
    assert "portable build (a wheel): ggml-cpu for " + "/".join(INFO["cpu_isa"]) in out.stdout


@needs_installed
def test_wheel_leaves_system_libraries_to_the_system():
    """auditwheel grafted what a manylinux wheel may carry (renamed, into polyllama.libs) but
    not the drivers' loaders of the backends the wheel has: those stay NEEDED by soname."""
    ext = polyllama._llamacpp_loader.llamacpp.__file__
    dyn = subprocess.run(["readelf", "-d", ext], stdout=subprocess.PIPE, text=True, check=True).stdout
    needed = [line.split("[", 1)[1].rstrip("]") for line in dyn.splitlines() if "(NEEDED)" in line]
    libs_dir = Path(ext).parent.parent / "polyllama.libs"
    grafted = sorted(p.name for p in libs_dir.iterdir()) if libs_dir.is_dir() else []
    for b in BACKENDS:
        for lib, _ in b.system_libs:
            if b.name in INFO["backends"] and b.name != "cuda":
                assert lib in needed, (lib, needed)
            assert not any(g.startswith(lib.split(".so")[0] + "-") for g in grafted), grafted


@pytest.mark.skipif(not INFO.get("cpu_isa"), reason="a build for this machine's CPU (GGML_NATIVE) "
                    "records no instruction sets; a portable build (make wheel) does")
def test_cpu_without_the_wheels_instruction_sets_is_refused(tmp_path):
    missing = CPU_ISA_FLAGS[INFO["cpu_isa"][-1]]
    flags = " ".join(f for f in ("fpu", "sse2", *(CPU_ISA_FLAGS[i] for i in INFO["cpu_isa"])) if f != missing)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    code = REFUSED
    out = subprocess.run([sys.executable, "-c", code], env=child_env(POLYLLAMA_FAKE_ROOT=str(tmp_path)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60, cwd="/")
    assert out.stdout.startswith(
        f"refused: ExtensionLoadError this polyllama was built for CPUs with {', '.join(INFO['cpu_isa'])} and this CPU lacks "
        f"{missing}; loading it would crash the interpreter (illegal instruction)."), out.stdout


@pytest.mark.parametrize("backend", [b.name for b in BACKENDS if b.system_libs and b.name != "cuda"])
def test_missing_system_library_is_named_with_its_provider(backend, tmp_path):
    """A machine without the backend's loader library (here: a broken stand-in found first
    on LD_LIBRARY_PATH) gets ExtensionLoadError naming the library and what provides it."""
    if backend not in INFO.get("backends", ()):
        pytest.skip(f"{backend} is not compiled in")
    b = next(x for x in BACKENDS if x.name == backend)
    lib, provider = b.system_libs[0]
    (tmp_path / lib).write_bytes(b"not an ELF file")
    code = REFUSED
    out = subprocess.run([sys.executable, "-c", code], env=child_env(LD_LIBRARY_PATH=str(tmp_path)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60, cwd="/")
    assert out.stdout.startswith(f"refused: ExtensionLoadError this polyllama carries the {b.title} backend, which needs {lib} "
                                 "from the system, and it does not load: "), out.stdout
    assert f"It comes with {provider}; or install a polyllama variant without that backend" in out.stdout


@needs_installed
def test_index_serves_the_wheel_to_pip(tmp_path):
    """dist/index/<variant>/ (make index) is a PEP 503 index pip resolves `polyllama` from."""
    variant = Path(os.environ.get("POLYLLAMA_TEST_WHEEL", "")).parent.name
    index = ROOT / "dist" / "index" / variant
    if not variant or not index.is_dir():
        pytest.fail(f"no index for the wheel under test ({index}); `make test-wheel` writes it")
    out = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                          "--index-url", index.resolve().as_uri(), "-d", str(tmp_path), "polyllama"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert out.returncode == 0, out.stdout
    got = [p.name for p in tmp_path.iterdir()]
    assert got == [Path(os.environ["POLYLLAMA_TEST_WHEEL"]).name], got
