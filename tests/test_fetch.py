"""scripts/fetch_llama_cpp.py: pinned source, hash check, nothing half-unpacked."""
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "fetch_llama_cpp.py"


def _run(*args, env=None):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _fake_sdist(path: Path, with_tree=True) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        files = {"pkg-1.0/README": b"x"}
        if with_tree:
            for f in ("CMakeLists.txt", "include/llama.h", "ggml/include/ggml-backend.h",
                      "common/fit.h", "src/llama.cpp"):
                files[f"pkg-1.0/vendor/llama.cpp/{f}"] = b"// fake\n"
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_pin_file_is_the_single_source():
    pin = json.loads((ROOT / "thirdparty" / "llama.cpp.pin.json").read_text())
    assert pin["sdist_package"] == "llama-cpp-python"
    assert pin["sdist_version"] == "0.3.36"
    assert pin["sdist_sha256"] == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"


def test_wrong_hash_is_rejected_and_nothing_is_left(tmp_path):
    sdist = _fake_sdist(tmp_path / "fake.tar.gz")
    dest = tmp_path / "thirdparty" / "llama.cpp"
    r = _run("--sdist", str(sdist), "--dest", str(dest))
    assert r.returncode == 1
    assert "sha256 mismatch" in r.stderr
    assert not dest.exists()
    leftovers = list((tmp_path / "thirdparty").glob("*")) if (tmp_path / "thirdparty").exists() else []
    assert leftovers == []


def test_matching_hash_unpacks_and_stamps(tmp_path):
    sdist = _fake_sdist(tmp_path / "fake.tar.gz")
    import hashlib
    pin = json.loads((ROOT / "thirdparty" / "llama.cpp.pin.json").read_text())
    pin["sdist_sha256"] = hashlib.sha256(sdist.read_bytes()).hexdigest()
    pin_file = tmp_path / "pin.json"
    pin_file.write_text(json.dumps(pin))
    dest = tmp_path / "tree"
    no_patches = tmp_path / "patches"
    no_patches.mkdir()
    r = _run("--sdist", str(sdist), "--dest", str(dest), "--pin", str(pin_file), "--patches", str(no_patches))
    assert r.returncode == 0, r.stderr
    assert (dest / "include" / "llama.h").is_file()
    assert json.loads((dest / ".polyllama-pin.json").read_text()) == dict(pin, patches={})
    assert r.stdout.strip().splitlines()[-1] == str(dest)


def test_sdist_without_tree_is_rejected(tmp_path):
    sdist = _fake_sdist(tmp_path / "fake.tar.gz", with_tree=False)
    import hashlib
    pin = json.loads((ROOT / "thirdparty" / "llama.cpp.pin.json").read_text())
    pin["sdist_sha256"] = hashlib.sha256(sdist.read_bytes()).hexdigest()
    (tmp_path / "pin.json").write_text(json.dumps(pin))
    dest = tmp_path / "tree"
    r = _run("--sdist", str(sdist), "--dest", str(dest), "--pin", str(tmp_path / "pin.json"),
             "--patches", str(tmp_path / "none"))
    assert r.returncode == 1
    assert "vendor/llama.cpp" in r.stderr
    assert not dest.exists()


def test_llama_cpp_dir_must_be_a_llama_tree(tmp_path):
    r = _run("--llama-cpp-dir", str(tmp_path))
    assert r.returncode == 1
    assert "is not a llama.cpp source tree" in r.stderr and "include/llama.h" in r.stderr


def test_llama_cpp_dir_env_is_used(tmp_path):
    import os
    tree = ROOT / "thirdparty" / "llama.cpp"
    env = dict(os.environ, LLAMA_CPP_DIR=str(tree))
    r = _run(env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tree.resolve())


def test_a_patch_that_does_not_apply_fails_and_leaves_nothing(tmp_path):
    sdist = _fake_sdist(tmp_path / "fake.tar.gz")
    import hashlib
    pin = json.loads((ROOT / "thirdparty" / "llama.cpp.pin.json").read_text())
    pin["sdist_sha256"] = hashlib.sha256(sdist.read_bytes()).hexdigest()
    (tmp_path / "pin.json").write_text(json.dumps(pin))
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-bad.patch").write_text(
        "why: nothing\n--- a/include/llama.h\n+++ b/include/llama.h\n@@ -1,1 +1,1 @@\n-no such line\n+x\n")
    dest = tmp_path / "tree"
    r = _run("--sdist", str(sdist), "--dest", str(dest), "--pin", str(tmp_path / "pin.json"),
             "--patches", str(patches))
    assert r.returncode == 1
    assert "0001-bad.patch does not apply to the pinned tree" in r.stderr
    assert not dest.exists() and not list(tmp_path.glob(".llama.cpp.partial-*"))


def test_the_pinned_tree_carries_the_patch_series():
    tree = ROOT / "thirdparty" / "llama.cpp"
    stamp = json.loads((tree / ".polyllama-pin.json").read_text())
    names = sorted(p.name for p in (ROOT / "thirdparty" / "patches").glob("*.patch"))
    assert names and sorted(stamp["patches"]) == names
    for name in names:
        # every patch says why before its diff
        head = (ROOT / "thirdparty" / "patches" / name).read_text().split("\n--- a/", 1)[0]
        assert "Why:" in head and "What:" in head, name
    assert "polyllama patch" in (tree / "src" / "llama-kv-cache.cpp").read_text()          # 0001
    assert "polyllama patch" in (tree / "src" / "llama-vocab.cpp").read_text()             # 0002
    for name in ("parser.cpp", "runtime.cpp"):                                             # 0003
        assert "polyllama patch" in (tree / "common" / "jinja" / name).read_text(), name
