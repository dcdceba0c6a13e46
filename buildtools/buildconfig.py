#!/usr/bin/env python3
"""polyllama's build configuration: GGML_* flags, SDK detection, and what CMake gets.

The backends themselves (names, flags, registries, install hints, which are automatic...)
are facts of src/polyllama/backend_table.py, which this file loads by path; here is what
only a build needs. It runs where the build runs, never inside an installed polyllama:

* the Makefile runs it as a script::

      python3 buildtools/buildconfig.py check             # fail fast when an SDK is missing
      python3 buildtools/buildconfig.py target-env cuda   # the flags `make build-cuda` sets
      python3 buildtools/buildconfig.py show              # flags, detection, CMake settings

* CMakeLists.txt runs ``buildconfig.py cmake-file PATH`` at every configure (under `make
  build` and `pip install .` alike) and includes the file of ``set(... CACHE ... FORCE)``
  lines it writes. It imports only the standard library.

Flags are read from the environment: GGML_CUDA GGML_HIP GGML_SYCL GGML_METAL GGML_VULKAN
GGML_OPENCL GGML_RPC GGML_BLAS GGML_NATIVE (1/0, on/off, true/false, yes/no, any case),
GGML_AUTO=1 (build every backend whose SDK and device are found here), GGML_BLAS_VENDOR,
CMAKE_CUDA_ARCHITECTURES, GPU_TARGETS (or AMDGPU_TARGETS) and CMAKE_ARGS (passed to CMake
by make and by scikit-build-core; -D settings of the variables above inside it count as if
set in the environment).

Test hooks (environment variables; every detector takes an ``env`` mapping, so tests pass
a fake environment instead of touching the real system):

* ``POLYLLAMA_FAKE_ROOT=DIR``: every fixed absolute system path the detectors look at
  (/usr/include, /usr/lib..., /opt/rocm, /opt/intel/oneapi, /usr/local/cuda, /dev/kfd, ...)
  is looked up under DIR instead, so a test can build a fake layout in a temp dir.
  Paths that come from the environment itself (CUDA_HOME, ROCM_PATH, VULKAN_SDK, PATH...)
  are used as given.
* ``POLYLLAMA_FAKE_DEV_ROOT=DIR``: the same for /dev only (takes precedence over
  POLYLLAMA_FAKE_ROOT there).
* ``POLYLLAMA_FAKE_PLATFORM=darwin`` (or linux, ...): used instead of ``sys.platform``.
"""
from __future__ import annotations

import argparse
import functools
import glob
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple


def _load_backend_table():
    """src/polyllama/backend_table.py, loaded by path: importing the polyllama package
    would need its compiled extension, which is what is being built."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                        "src", "polyllama", "backend_table.py")
    spec = importlib.util.spec_from_file_location("polyllama_backend_table", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up while decorating
    spec.loader.exec_module(module)
    return module


_table = _load_backend_table()
Backend = _table.Backend
BACKENDS = _table.BACKENDS
backend_by_name = _table.by_name
backend_by_registry = _table.by_registry
host_path = _table.host_path

__all__ = [
    "Backend", "BACKENDS", "backend_by_name", "backend_by_registry",
    "BuildConfigError", "MissingSdkError", "parse_flag", "SdkInfo", "host_path",
    "detect_cpu", "detect_cuda", "detect_hip", "detect_sycl", "detect_metal",
    "detect_vulkan", "detect_opencl", "detect_rpc", "detect_blas", "DETECTORS",
    "detect", "detect_all", "BuildConfig", "resolve", "missing_sdk_problems",
    "cmake_file_text", "show_text", "main",
]


# --------------------------------------------------------------------------------------
# Errors and flag parsing
# --------------------------------------------------------------------------------------

class BuildConfigError(ValueError):
    """The build configuration in the environment is invalid or cannot be built."""


class MissingSdkError(BuildConfigError):
    """A backend is enabled but its SDK is not installed."""


_TRUE_WORDS = ("1", "on", "true", "yes")
_FALSE_WORDS = ("0", "off", "false", "no")


def parse_flag(var: str, value: Optional[str]) -> Optional[bool]:
    """An on/off environment value: None when unset or empty, else True/False.

    Strict on purpose: a typo such as GGML_CUDA=ye must stop the build, not silently
    build without CUDA.
    """
    if value is None:
        return None
    word = value.strip().lower()
    if word == "":
        return None
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise BuildConfigError(
        f"{var}={value!r} is not an on/off value; accepted (any case): "
        "1/0, on/off, true/false, yes/no, or leave it unset")


# --------------------------------------------------------------------------------------
# Detection helpers
# --------------------------------------------------------------------------------------

# Each tool probe may take this long. Version queries return in milliseconds; the limit
# is for device listers (sycl-ls, rocminfo, nvidia-smi) that can hang on a bad driver.
TOOL_TIMEOUT_S = 1.5

_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
             "/usr/local/lib")


def _environ(env: Optional[Mapping[str, str]]) -> Mapping[str, str]:
    return os.environ if env is None else env


def _platform(env: Mapping[str, str]) -> str:
    return env.get("POLYLLAMA_FAKE_PLATFORM") or sys.platform


def _machine(env: Mapping[str, str]) -> str:
    import platform
    return (env.get("POLYLLAMA_FAKE_MACHINE") or platform.machine()).lower()


def _is_exe(path: Optional[str]) -> bool:
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def _which(name: str, env: Mapping[str, str]) -> Optional[str]:
    """`name` on env's PATH (an env without PATH finds nothing)."""
    return shutil.which(name, path=env.get("PATH", ""))


def _first_exe(candidates: List[Tuple[str, Optional[str]]]) -> Tuple[Optional[str], str]:
    """The first executable among (how-found, path) pairs: (path, how) or (None, "")."""
    for how, path in candidates:
        if _is_exe(path):
            return path, how
    return None, ""


def _find_tool(name: str, env: Mapping[str, str], root_vars: Tuple[str, ...],
               roots: Tuple[str, ...]) -> Tuple[Optional[str], str]:
    """An SDK's compiler: <$VAR>/bin/<name> for each of root_vars, then PATH, then
    <root>/bin/<name> for each fixed root (under the fake root in tests). (path, how) or
    (None, "")."""
    candidates: List[Tuple[str, Optional[str]]] = [
        (f"${var}", os.path.join(env[var], "bin", name)) for var in root_vars if env.get(var)]
    candidates.append(("PATH", _which(name, env)))
    candidates += [(root, host_path(f"{root}/bin/{name}", env)) for root in roots]
    return _first_exe(candidates)


def _run(argv: List[str], env: Mapping[str, str], timeout: float = TOOL_TIMEOUT_S) -> Tuple[Optional[int], str]:
    """Run a probe: (exit status, stdout+stderr). Status None when it did not run to the end.

    Its own session, so a timeout kills wrappers' children too (hipcc and sycl-ls start
    helpers that would otherwise keep the pipe open and make us wait for them).
    """
    child_env = dict(env)
    child_env["LC_ALL"] = "C"  # parse English output
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=child_env,
                                start_new_session=(os.name == "posix"))
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return None, f"could not run {argv[0]}: {e}"
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            if os.name == "posix":
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        except OSError:
            pass
        try:
            proc.communicate(timeout=1)
        except Exception:
            pass
        return None, f"{os.path.basename(argv[0])} timed out after {timeout:g} s"
    except Exception as e:  # pragma: no cover - interrupted pipes and the like
        proc.kill()
        return None, f"{argv[0]}: {e}"
    return proc.returncode, out.decode("utf-8", "replace")


def _search(pattern: str, text: str, flags: int = 0) -> Optional[str]:
    m = re.search(pattern, text, flags)
    return m.group(1) if m else None


def _glob_first(patterns: List[str]) -> Optional[str]:
    for pattern in patterns:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


def _dedupe(paths: List[str]) -> List[str]:
    out: List[str] = []
    for p in paths:
        p = os.path.normpath(p)
        if p not in out:
            out.append(p)
    return out


def _lib_dirs(env: Mapping[str, str]) -> List[str]:
    """System library directories (moved under the fake root when the test hook is set)."""
    dirs = list(_LIB_DIRS)
    multiarch = getattr(sys.implementation, "_multiarch", None)
    if multiarch:
        dirs.insert(0, f"/usr/lib/{multiarch}")
    return _dedupe([host_path(d, env) for d in dirs])


def _cache_dir(env: Mapping[str, str]) -> str:
    """polyllama's cache (same rule as scripts/fetch_llama_cpp.py and setup.sh)."""
    if env.get("POLYLLAMA_CACHE_DIR"):
        return env["POLYLLAMA_CACHE_DIR"]
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(base, "polyllama")


def _tool_root(exe: str) -> str:
    """<root> for <root>/bin/<exe>, following symlinks (/usr/bin/hipcc -> /opt/rocm/bin/hipcc)."""
    real = os.path.realpath(exe)
    bindir = os.path.dirname(real)
    return os.path.dirname(bindir) if os.path.basename(bindir) == "bin" else bindir


# --------------------------------------------------------------------------------------
# SDK detection
# --------------------------------------------------------------------------------------

@dataclass
class SdkInfo:
    """What a detector found for one backend."""
    backend: str
    found: bool                                         # everything needed to build it is here
    path: Optional[str] = None                          # the SDK's root (or its main file)
    version: Optional[str] = None
    missing: List[str] = field(default_factory=list)    # what is missing, in words
    device_present: Optional[bool] = None               # None: cannot tell
    device_note: str = ""
    notes: List[str] = field(default_factory=list)
    cmake: Dict[str, str] = field(default_factory=dict)  # extra CMake cache variables it needs
    tool: Optional[str] = None                          # the compiler / probe used (nvcc, hipcc, ...)
    devices: List[str] = field(default_factory=list)    # device names the device probe listed
    archs: List[str] = field(default_factory=list)      # CUDA architectures ("90") or AMD gfx targets
    cpu_type_devices: int = 0                           # Vulkan: CPU-type devices (llvmpipe)
    # Where the SDK is pieced together (Vulkan: headers from one place, the loader from
    # another), what `version` and `path` belong to, e.g. "headers" / "loader 1.3.239".
    version_of: str = ""
    path_of: str = ""

    def summary(self) -> str:
        b = backend_by_name(self.backend)
        what = b.sdk_name if b is not None else self.backend
        if not self.found:
            return f"{what} not found: {'; '.join(self.missing) or 'unknown reason'}"
        if self.version_of or self.path_of:
            parts = []
            if self.version:
                parts.append(f"{self.version_of or 'version'} {self.version}")
            if self.path:
                parts.append(f"{self.path_of + ' ' if self.path_of else ''}at {self.path}")
            return f"{what}: " + ", ".join(parts)
        bits = [what]
        if self.version:
            bits.append(self.version)
        if self.path:
            bits.append(f"at {self.path}")
        return " ".join(bits)


def _never_raises(fn: Callable[[Optional[Mapping[str, str]]], SdkInfo]):
    """A detector must never break a build config or `import polyllama`: a bug or an odd
    system turns into an unfound SDK with the reason, not an exception."""
    backend = fn.__name__[len("detect_"):]

    @functools.wraps(fn)
    def wrapper(env: Optional[Mapping[str, str]] = None) -> SdkInfo:
        try:
            return fn(env)
        except Exception as e:  # noqa: BLE001 - deliberate
            return SdkInfo(backend, False, missing=[f"detection failed: {type(e).__name__}: {e}"],
                           device_note="unknown (detection failed)")
    return wrapper


@_never_raises
def detect_cpu(env: Optional[Mapping[str, str]] = None) -> SdkInfo:
    return SdkInfo("cpu", True, device_present=True, device_note="the host CPU")


@_never_raises
def detect_rpc(env: Optional[Mapping[str, str]] = None) -> SdkInfo:
    return SdkInfo("rpc", True, device_present=None,
                   device_note="remote: devices are rpc-server processes given at run time")


@_never_raises
def detect_cuda(env: Optional[Mapping[str, str]] = None) -> SdkInfo:
    env = _environ(env)
    info = SdkInfo("cuda", False)
    nvcc, how = _find_tool("nvcc", env, ("CUDA_PATH", "CUDA_HOME"), ("/usr/local/cuda",))
    if nvcc is None:
        info.missing.append("nvcc (the CUDA compiler) not found in $CUDA_PATH/bin, $CUDA_HOME/bin, "
                            "on PATH or in /usr/local/cuda/bin")
    else:
        info.found = True
        info.tool = nvcc
        root = _tool_root(nvcc)
        # Report the toolkit root when nvcc sits in one; a wrapper script on PATH
        # (/usr/local/bin/nvcc) is reported as itself.
        looks_like_toolkit = (os.path.isfile(os.path.join(root, "include", "cuda_runtime.h"))
                              or os.path.isdir(os.path.join(root, "targets")))
        info.path = root if looks_like_toolkit else nvcc
        rc, out = _run([nvcc, "--version"], env)
        info.version = _search(r"release (\d+\.\d+)", out) if rc == 0 else None
        if info.version is None:
            info.notes.append(f"could not read the version from `{nvcc} --version`: {out.strip()[-200:]}")
        # CMake looks for nvcc on PATH (and CUDACXX); one found elsewhere must be named.
        if how != "PATH" and not env.get("CUDACXX"):
            info.cmake["CMAKE_CUDA_COMPILER"] = nvcc
    _probe_nvidia_gpus(info, env)
    return info


def _probe_nvidia_gpus(info: SdkInfo, env: Mapping[str, str]) -> None:
    no_gpu = "no NVIDIA GPU found (nvidia-smi missing or failed)"
    smi = _which("nvidia-smi", env)
    if smi is None:
        info.device_present, info.device_note = False, no_gpu
        return
    rc, out = _run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"], env)
    rows = [line.strip() for line in out.splitlines() if line.strip()] if rc == 0 else []
    if rc is not None and rc != 0:
        # Drivers older than 510 do not know compute_cap: ask for names only (but do not
        # wait for a hung nvidia-smi twice).
        rc, out = _run([smi, "--query-gpu=name", "--format=csv,noheader"], env)
        rows = [line.strip() + ", " for line in out.splitlines() if line.strip()] if rc == 0 else []
    if not rows:
        info.device_present, info.device_note = False, no_gpu
        return
    for i, row in enumerate(rows):
        name, _, cap = row.rpartition(",")
        name, cap = name.strip(), cap.strip()
        info.devices.append(name)
        if re.fullmatch(r"\d+\.\d+", cap):
            arch = cap.replace(".", "")
            if arch not in info.archs:
                info.archs.append(arch)
            info.notes.append(f"GPU {i}: {name} (compute capability {cap}, CUDA architecture {arch})")
        else:
            info.notes.append(f"GPU {i}: {name} (compute capability unknown)")
    info.device_present = True
    info.device_note = f"{len(rows)} NVIDIA GPU{'s' if len(rows) > 1 else ''}: {', '.join(info.devices)}"


# The pinned ggml-hip refuses older HIP (thirdparty/llama.cpp/ggml/src/ggml-hip/CMakeLists.txt:
# `if (${hip_VERSION} VERSION_LESS 6.1)`); tests check this against the pinned tree.
HIP_MIN_VERSION = (6, 1)

# What ggml-hip's CMake needs, by component: the CMake packages it finds (hip-lang for
# enable_language(HIP), then find_package(hip/hipblas/rocblas)) and the library behind each
# BLAS. The package names are Debian's (sid) and those of AMD's ROCm apt repository.
_HIP_PARTS = (
    ("hip", "the HIP runtime", ("hip", "hip-lang"), "libamdhip64-dev", "hip-dev"),
    ("hipblas", "hipBLAS", ("hipblas",), "libhipblas-dev", "hipblas-dev"),
    ("rocblas", "rocBLAS", ("rocblas",), "librocblas-dev", "rocblas-dev"),
)


def _hip_lib_dirs(root: str) -> List[str]:
    """<root>'s library directories: AMD's layout (lib, lib64) and Debian's (lib/<multiarch>)."""
    dirs = [os.path.join(root, d) for d in ("lib", "lib64")]
    multiarch = getattr(sys.implementation, "_multiarch", None)
    for triplet in ([multiarch] if multiarch else []) + ["x86_64-linux-gnu"]:
        dirs.append(os.path.join(root, "lib", triplet))
    return _dedupe(dirs)


def _hip_lib(root: str, stem: str) -> Optional[str]:
    """<root>'s lib<stem>.so* or include/<stem> (AMD's layout and Debian's)."""
    hit = _glob_first([os.path.join(d, f"lib{stem}.so*") for d in _hip_lib_dirs(root)])
    if hit:
        return hit
    inc = os.path.join(root, "include", stem)
    return inc if os.path.isdir(inc) else None


def _hip_cmake_config(roots: List[str], package: str) -> Optional[str]:
    """The first <root>/<libdir>/cmake/<package>/<package>-config.cmake (CMake's search order
    for these prefixes), or None."""
    for root in roots:
        for d in _hip_lib_dirs(root):
            for name in (f"{package}-config.cmake", f"{package}Config.cmake"):
                path = os.path.join(d, "cmake", package, name)
                if os.path.isfile(path):
                    return path
    return None


def _hip_version_tuple(text: Optional[str]) -> Optional[Tuple[int, ...]]:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def _hip_file_version(root: str) -> Tuple[Optional[str], str]:
    """(version, file) from the files a HIP install carries, for when its tools cannot run."""
    header = os.path.join(root, "include", "hip", "hip_version.h")
    try:
        with open(header, encoding="utf-8", errors="replace") as f:
            text = f.read(64 * 1024)
        parts = [_search(rf"#define\s+HIP_VERSION_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
        if parts[0] and parts[1]:
            return ".".join(p for p in parts if p), header
    except OSError:
        pass
    for path in (os.path.join(root, ".info", "version"),          # AMD's layout
                 os.path.join(root, "share", "hip", "version")):  # Debian's (HIP_VERSION_MAJOR=6 ...)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(64 * 1024)
        except OSError:
            continue
        major, minor = (_search(rf"HIP_VERSION_{k}=(\d+)", text) for k in ("MAJOR", "MINOR"))
        if major and minor:
            patch = _search(r"HIP_VERSION_PATCH=(\d+)", text)
            return ".".join(p for p in (major, minor, patch) if p), path
        version = _search(r"(\d+(?:\.\d+)+)", text)
        if version:
            return version, path
    return None, ""


def _hip_cmake_version(config: str) -> Optional[str]:
    """PACKAGE_VERSION of the <package>-config-version.cmake next to `config`: the hip_VERSION
    that ggml-hip compares with 6.1."""
    d = os.path.dirname(config)
    for name in (f"{os.path.basename(d)}-config-version.cmake", f"{os.path.basename(d)}ConfigVersion.cmake"):
        try:
            with open(os.path.join(d, name), encoding="utf-8", errors="replace") as f:
                return _search(r'set\(\s*PACKAGE_VERSION\s+"?(\d+(?:\.\d+)+)', f.read())
        except OSError:
            continue
    return None


@_never_raises
def detect_hip(env: Optional[Mapping[str, str]] = None) -> SdkInfo:
    env = _environ(env)
    info = SdkInfo("hip", False)
    hipcc, _ = _find_tool("hipcc", env, ("ROCM_PATH", "HIP_PATH"), ("/opt/rocm", "/usr"))  # /usr: Debian's
    root = None
    if hipcc is None:
        info.missing.append("hipcc (the ROCm HIP compiler) not found in $ROCM_PATH/bin, $HIP_PATH/bin, "
                            "on PATH, in /opt/rocm/bin or /usr/bin")
        _probe_amd_gpus(info, env, root)
        return info
    info.tool = hipcc
    root = _tool_root(hipcc)  # /opt/rocm, or /usr for Debian's /usr/bin/hipcc
    info.path = root

    # hipconfig (next to hipcc; Debian's is a link to it) knows the HIP version, platform and
    # the clang that CMake's HIP language uses. On a foreign root (a chroot's hipcc seen from
    # the host) it may not run: then the files say what they can.
    hipconfig = os.path.join(os.path.dirname(hipcc), "hipconfig")
    hipconfig = hipconfig if _is_exe(hipconfig) else _which("hipconfig", env)
    asked: Dict[str, Optional[str]] = {}
    if hipconfig:
        for opt in ("--version", "--platform", "--hipclangpath"):
            rc, out = _run([hipconfig, opt], env)
            asked[opt] = out.strip().splitlines()[-1].strip() if rc == 0 and out.strip() else None
    tool_version = _search(r"^(\d+\.\d+(?:\.\d+)*)", asked.get("--version") or "")
    how = "hipconfig --version"
    if tool_version is None:
        rc, out = _run([hipcc, "--version"], env)
        tool_version = _search(r"HIP version:\s*(\d+(?:\.\d+)+)", out) if rc == 0 else None
        how = "hipcc --version"
    if tool_version is None:
        tool_version, how = _hip_file_version(root)
    info.version = tool_version
    if tool_version:
        info.notes.append(f"HIP {tool_version} (from {how})")

    platform = asked.get("--platform")
    if platform and platform not in ("amd", "hcc"):
        info.missing.append(f"this HIP targets platform {platform!r} (hipconfig --platform), not AMD GPUs: "
                            "ggml's HIP backend is for AMD GPUs (for NVIDIA build GGML_CUDA=1)")

    # CMake packages where ggml-hip looks first ($ROCM_PATH, else /opt/rocm if it exists,
    # else /usr), then hipcc's own root and /usr: a second, older ROCm there is what CMake
    # would take.
    ggml_root = env.get("ROCM_PATH") if env.get("ROCM_PATH") and os.path.exists(env["ROCM_PATH"]) else (
        host_path("/opt/rocm", env) if os.path.exists(host_path("/opt/rocm", env)) else host_path("/usr", env))
    roots = _dedupe([ggml_root, root, host_path("/usr", env)])
    for stem, title, packages, deb, amd in _HIP_PARTS:
        gone = [f"CMake package {p} ({p}-config.cmake)" for p in packages if not _hip_cmake_config(roots, p)]
        lib = _hip_lib(root, stem) if stem != "hip" else "-"
        if lib is None:
            gone.insert(0, f"lib{stem}.so* (in {root}/lib, lib64 or lib/<multiarch>; no {root}/include/{stem})")
        if gone:
            info.missing.append(f"{title} not found: {'; '.join(gone)}; install Debian's {deb} "
                                f"(AMD's repository: {amd})")
        elif lib != "-":
            info.notes.append(f"{title}: {lib}")

    hip_config = _hip_cmake_config(roots, "hip")
    cmake_version = _hip_cmake_version(hip_config) if hip_config else None
    if hip_config:
        info.notes.append(f"CMake package hip {cmake_version or '(version unknown)'}: {hip_config}")
    # ggml-hip compares the CMake package's version; the tool's says the same where it alone is known.
    gate = _hip_version_tuple(cmake_version) or _hip_version_tuple(tool_version)
    tv, cv = _hip_version_tuple(tool_version), _hip_version_tuple(cmake_version)
    if tv and cv and tv[:2] != cv[:2]:
        info.missing.append(f"two ROCm installations are mixed: {hipcc} is HIP {tool_version} but CMake would "
                            f"take HIP {cmake_version} from {hip_config}; set ROCM_PATH to the one to build with")
    elif gate is not None and gate[:2] < HIP_MIN_VERSION:
        info.missing.append(f"HIP {_dotted(gate)} is too old: the pinned ggml-hip needs HIP >= "
                            f"{_dotted(HIP_MIN_VERSION)}; install ROCm >= {_dotted(HIP_MIN_VERSION)} (Debian sid: "
                            "hipcc libamdhip64-dev libhipblas-dev librocblas-dev, HIP 6.4; Debian 13's HIP 5.7 "
                            "is too old) or AMD's ROCm apt repository")
    elif gate is None:
        info.notes.append(f"could not tell the HIP version (hipconfig, hipcc --version and the version files "
                          f"were silent); CMake checks HIP >= {_dotted(HIP_MIN_VERSION)} when it configures")

    # The clang CMake's HIP language compiles with: CMake asks `hipconfig --hipclangpath`
    # from PATH itself, so the compiler is named only when that hipconfig is not on PATH.
    clang_dirs = [asked["--hipclangpath"]] if asked.get("--hipclangpath") else [
        os.path.join(root, "llvm", "bin"), os.path.join(root, "lib", "llvm", "bin")]
    clang = next((c for c in (os.path.join(d, "clang++") for d in clang_dirs) if _is_exe(c)), None)
    if clang is None and asked.get("--hipclangpath"):
        info.missing.append(f"clang++ not found in {asked['--hipclangpath']} (hipconfig --hipclangpath): the "
                            "clang hipcc runs compiles HIP for CMake (Debian: the clang-NN package hipcc "
                            "depends on; AMD: rocm-llvm)")
    elif clang:
        info.notes.append(f"HIP compiler for CMake: {clang}")
        if not env.get("HIPCXX") and _which("hipconfig", env) is None:
            info.cmake["CMAKE_HIP_COMPILER"] = clang
    info.found = not info.missing
    _probe_amd_gpus(info, env, root)
    return info


def _probe_amd_gpus(info: SdkInfo, env: Mapping[str, str], root: Optional[str]) -> None:
    kfd = host_path("/dev/kfd", env)
    rocminfo = _which("rocminfo", env)
    if rocminfo is None and root and _is_exe(os.path.join(root, "bin", "rocminfo")):
        rocminfo = os.path.join(root, "bin", "rocminfo")
    if rocminfo:
        rc, out = _run([rocminfo], env)
        if rc == 0:
            for gfx in re.findall(r"^\s*Name:\s*(gfx[0-9a-z]+)\s*$", out, re.MULTILINE):
                if gfx not in info.archs:
                    info.archs.append(gfx)
            info.devices = re.findall(r"^\s*Marketing Name:\s*(.+?)\s*$", out, re.MULTILINE)
    if os.path.exists(kfd) or info.archs:
        info.device_present = True
        info.device_note = ("AMD GPU" + (f" ({', '.join(info.archs)})" if info.archs else "")
                            + (" - /dev/kfd present" if os.path.exists(kfd) else ""))
        if info.archs:
            info.notes.append(f"set GPU_TARGETS={';'.join(info.archs)} to compile only for this machine's GPUs")
    else:
        info.device_present = False
        info.device_note = "no AMD GPU found (/dev/kfd absent; rocminfo missing, failed or lists no gfx agent)"


@_never_raises
def detect_sycl(env: Optional[Mapping[str, str]] = None) -> SdkInfo:
    env = _environ(env)
    info = SdkInfo("sycl", False)
    candidates: List[Tuple[str, Optional[str]]] = []
    if env.get("ONEAPI_ROOT"):
        candidates.append(("$ONEAPI_ROOT", os.path.join(env["ONEAPI_ROOT"], "compiler", "latest", "bin", "icpx")))
    candidates.append(("PATH", _which("icpx", env)))
    candidates.append(("/opt/intel/oneapi", host_path("/opt/intel/oneapi/compiler/latest/bin/icpx", env)))
    icpx, _ = _first_exe(candidates)
    if icpx is None:
        info.missing.append("icpx (the Intel oneAPI DPC++ compiler) not found in "
                            "$ONEAPI_ROOT/compiler/latest/bin, on PATH or in /opt/intel/oneapi/compiler/latest/bin")
    else:
        info.tool = icpx
        bindir = os.path.dirname(icpx)
        info.path = os.path.dirname(bindir) if os.path.basename(bindir) == "bin" else bindir
        rc, out = _run([icpx, "--version"], env)
        if rc == 0:
            info.version = (_search(r"Compiler\s+(\d+(?:\.\d+)+)", out)
                            or _search(r"(\d+\.\d+\.\d+)", out))
        icx = os.path.join(bindir, "icx")
        if not _is_exe(icx):
            info.missing.append(f"icx (the oneAPI C compiler) not found next to {icpx}")
        else:
            # ggml-sycl must be compiled by the oneAPI compilers, C and C++ alike.
            info.cmake["CMAKE_C_COMPILER"] = icx
            info.cmake["CMAKE_CXX_COMPILER"] = icpx
        info.found = not info.missing
        if not env.get("SETVARS_COMPLETED") and not env.get("MKLROOT"):
            info.notes.append("the oneAPI environment is not loaded: run "
                              "`source /opt/intel/oneapi/setvars.sh` before building (ggml-sycl needs oneMKL)")
    _probe_sycl_devices(info, env, icpx)
    return info


def _probe_sycl_devices(info: SdkInfo, env: Mapping[str, str], icpx: Optional[str]) -> None:
    sycl_ls = _which("sycl-ls", env)
    if sycl_ls is None and icpx and _is_exe(os.path.join(os.path.dirname(icpx), "sycl-ls")):
        sycl_ls = os.path.join(os.path.dirname(icpx), "sycl-ls")
    if sycl_ls is None:
        info.device_present, info.device_note = None, "cannot tell: sycl-ls not found"
        return
    rc, out = _run([sycl_ls], env)
    if rc != 0:
        info.device_present = None
        info.device_note = f"cannot tell: sycl-ls failed ({out.strip()[-160:]})"
        return
    # Lines look like "[level_zero:gpu][level_zero:0] Intel(R) Level-Zero, Intel(R) Arc(TM) A770 ..."
    for line in out.splitlines():
        m = re.match(r"\s*\[([^\]]*)\]\s*(?:\[[^\]]*\]\s*)?(.*)", line)
        if m and (":gpu" in m.group(1) or "level_zero" in m.group(1)):
            info.devices.append(f"{m.group(2).strip()} [{m.group(1)}]")
    info.device_present = bool(info.devices)
    info.device_note = (f"SYCL GPU devices: {'; '.join(info.devices)}" if info.devices
                        else "sycl-ls lists no GPU / Level Zero device")


@_never_raises
def detect_metal(env: Optional[Mapping[str, str]] = None) -> SdkInfo:
    env = _environ(env)
    info = SdkInfo("metal", False)
    if _platform(env) != "darwin":
        info.missing.append("macOS (Metal exists only on Apple platforms)")
        info.device_present, info.device_note = False, "not macOS"
        return info
    info.device_present, info.device_note = True, "the Mac's GPU (Metal is always present on macOS)"
    xcrun, _ = _first_exe([("PATH", _which("xcrun", env)), ("/usr/bin", host_path("/usr/bin/xcrun", env))])
    if xcrun is None:
        info.missing.append("xcrun (Xcode command line tools) not found")
        return info
    info.tool = xcrun
    rc, out = _run([xcrun, "-sdk", "macosx", "metal", "--version"], env)
    if rc == 0:
        info.found = True
        info.version = _search(r"metal version\s+(\S+)", out) or _search(r"(\d+(?:\.\d+)+)", out)
        info.path = xcrun
        return info
    # ggml embeds the Metal shader source and compiles it at run time by default
    # (GGML_METAL_EMBED_LIBRARY), so the command line tools' macOS SDK is enough; the
    # offline `metal` compiler comes only with full Xcode.
    rc, out = _run([xcrun, "--sdk", "macosx", "--show-sdk-path"], env)
    if rc == 0 and out.strip():
        info.found = True
        info.path = out.strip().splitlines()[-1]
        info.notes.append("the offline metal shader compiler is absent (it comes with full Xcode); "
                          "fine: ggml compiles its embedded Metal shaders at run time")
    else:
        info.missing.append("the macOS SDK (`xcrun -sdk macosx metal --version` and "
                            "`xcrun --show-sdk-path` both failed)")
    return info


# ggml-vulkan uses VK_EXT_layer_settings, first in the 1.3.261 headers.
VULKAN_MIN_HEADERS = (1, 3, 261)


def _vulkan_header_version(include_dir: str) -> Optional[Tuple[int, int, int]]:
    """(major, minor, patch) of <include_dir>/vulkan/vulkan_core.h, or None."""
    try:
        with open(os.path.join(include_dir, "vulkan", "vulkan_core.h"), encoding="utf-8", errors="replace") as f:
            text = f.read(512 * 1024)  # the defines are near the top of a ~1 MB file
    except OSError:
        return None
    patch = _search(r"#define\s+VK_HEADER_VERSION\s+(\d+)", text)
    if patch is None:
        return None
    major, minor = 1, 0  # headers before 1.2.140 lack VK_HEADER_VERSION_COMPLETE: old anyway
    complete = _search(r"#define\s+VK_HEADER_VERSION_COMPLETE\s+VK_MAKE_(?:API_)?VERSION\(([^)]*)\)", text)
    if complete:
        args = [a.strip() for a in complete.split(",")]
        # VK_MAKE_API_VERSION(variant, major, minor, patch) or VK_MAKE_VERSION(major, minor, patch)
        nums = args[-3:-1]
        if all(n.isdigit() for n in nums):
            major, minor = int(nums[0]), int(nums[1])
    return major, minor, int(patch)


def _dotted(v: Tuple[int, ...]) -> str:
    return ".".join(str(x) for x in v)


def _find_spirv_headers(env: Mapping[str, str], extra_prefixes: List[str]) -> Optional[str]:
    """SPIRV-HeadersConfig.cmake, which ggml-vulkan's find_package(SPIRV-Headers CONFIG) needs."""
    prefixes = [host_path(p, env) for p in ("/usr", "/usr/local")] + extra_prefixes
    prefixes += [p for p in env.get("CMAKE_PREFIX_PATH", "").split(os.pathsep) if p]
    subdirs = ["share/cmake/SPIRV-Headers", "lib/cmake/SPIRV-Headers", "lib64/cmake/SPIRV-Headers",
               "lib/*/cmake/SPIRV-Headers", "share/SPIRV-Headers*/cmake"]
    return _glob_first([os.path.join(p, s, "SPIRV-HeadersConfig.cmake") for p in prefixes for s in subdirs])


@_never_raises
def detect_vulkan(env: Optional[Mapping[str, str]] = None) -> SdkInfo:
    env = _environ(env)
    info = SdkInfo("vulkan", False)
    sdk = env.get("VULKAN_SDK") or None

    # 1. Headers. Debian 12 ships 1.3.239, too old; setup.sh --vulkan-headers unpacks
    # newer ones into the cache, hence the search order (explicit, cache, SDK, system).
    system_include = host_path("/usr/include", env)
    cache_include = os.path.join(_cache_dir(env), "vulkan-headers", "usr", "include")
    explicit = os.path.normpath(env["POLYLLAMA_VULKAN_INCLUDE_DIR"]) if env.get("POLYLLAMA_VULKAN_INCLUDE_DIR") else None
    include_dirs: List[str] = [explicit] if explicit else []
    include_dirs.append(cache_include)
    if sdk:
        include_dirs.append(os.path.join(sdk, "include"))
    include_dirs.append(system_include)
    found_headers = []  # (version, dir), in search order
    for d in _dedupe(include_dirs):
        v = _vulkan_header_version(d)
        if v is not None:
            found_headers.append((v, d))
        elif d == explicit:
            info.notes.append(f"POLYLLAMA_VULKAN_INCLUDE_DIR={d} has no vulkan/vulkan_core.h")
    good = [(v, d) for v, d in found_headers if v >= VULKAN_MIN_HEADERS]
    headers_ok = False
    if good:
        version, include_dir = good[0]
        headers_ok = True
        info.version, info.version_of = _dotted(version), "headers"
        info.notes.append(f"headers {info.version} in {include_dir}")
        if os.path.normpath(include_dir) != os.path.normpath(system_include):
            info.cmake["Vulkan_INCLUDE_DIR"] = include_dir
    elif found_headers:
        version, include_dir = max(found_headers, key=lambda vd: vd[0])
        info.version = _dotted(version)
        too_old = (f"Vulkan headers {info.version} are too old for ggml-vulkan (needs VK_EXT_layer_settings, "
                   f"headers >= {_dotted(VULKAN_MIN_HEADERS)}); run scripts/setup.sh --vulkan-headers")
        info.missing.append(f"{too_old} (found in {include_dir})")
        info.notes.append(too_old)
    else:
        info.missing.append("Vulkan headers (vulkan/vulkan_core.h; package libvulkan-dev)")

    # 2. The loader. FindVulkan links libvulkan.so (libvulkan-dev); with only the runtime's
    # libvulkan.so.1, name that file so CMake can still link it.
    lib_dirs = _lib_dirs(env) + ([os.path.join(sdk, "lib")] if sdk else [])
    dev_lib = _glob_first([os.path.join(d, "libvulkan.so") for d in lib_dirs])
    runtime_lib = _glob_first([os.path.join(d, "libvulkan.so.1") for d in lib_dirs])
    if dev_lib or runtime_lib:
        info.path = dev_lib or runtime_lib
        # the loader's version is in its real file name (libvulkan.so.1 -> libvulkan.so.1.3.239);
        # it is not the headers' version and need not match it
        real = os.path.realpath(runtime_lib or info.path)
        loader_version = _search(r"^libvulkan\.so\.(\d+\.\d+\.\d+)$", os.path.basename(real))
        info.path_of = f"loader {loader_version}" if loader_version else "loader"
        info.notes.append(f"{info.path_of} at {info.path}"
                          + (f" (-> {os.path.basename(real)})" if real != info.path else ""))
        if not dev_lib:
            info.cmake["Vulkan_LIBRARY"] = runtime_lib
    else:
        info.missing.append("the Vulkan loader (libvulkan.so.1; packages libvulkan1, libvulkan-dev)")

    # 3. glslc compiles ggml's compute shaders at build time.
    glslc, _ = _first_exe([("PATH", _which("glslc", env)),
                           ("$VULKAN_SDK", os.path.join(sdk, "bin", "glslc") if sdk else None)])
    if glslc:
        info.tool = glslc
        rc, out = _run([glslc, "--version"], env)
        # upstream/LunarG: "shaderc v2023.2 v2023.2"; Debian's package: "shaderc 2023.2-1"
        lines = out.strip().splitlines() if rc == 0 else []
        first = next((ln for ln in lines if ln.lower().startswith("shaderc")), lines[0] if lines else "")
        glslc_version = _search(r"(?<![\w.])v?(\d+(?:\.\d+)+)", first)
        info.notes.append(f"glslc {glslc_version or '(version unknown)'} at {glslc}")
    else:
        info.missing.append("glslc (GLSL to SPIR-V compiler; package glslc)")

    # 4. SPIR-V headers: ggml-vulkan's CMake requires their package config.
    spirv_prefixes = ([sdk] if sdk else []) + [os.path.dirname(cache_include)]
    spirv = _find_spirv_headers(env, spirv_prefixes)
    if spirv:
        info.notes.append(f"SPIRV-Headers {os.path.dirname(spirv)}")
    else:
        info.missing.append("SPIRV-Headers (SPIRV-HeadersConfig.cmake; package spirv-headers)")

    info.found = headers_ok and not info.missing
    _probe_vulkan_devices(info, env)
    return info


def _probe_vulkan_devices(info: SdkInfo, env: Mapping[str, str]) -> None:
    vulkaninfo = _which("vulkaninfo", env)
    if vulkaninfo is None:
        info.device_present = None
        info.device_note = "cannot tell: vulkaninfo (package vulkan-tools) not found"
        return
    rc, out = _run([vulkaninfo, "--summary"], env)
    listed = _table.parse_vulkaninfo_summary(out)
    if rc is None and not listed:
        info.device_present, info.device_note = None, f"cannot tell: {out.strip()[-160:]}"
        return
    types = [kind for _, kind in listed]
    info.devices += [f"{name} [{kind}]" for name, kind in listed]
    cpu_names = [name for name, kind in listed if kind == "CPU"]
    info.cpu_type_devices = len(cpu_names)
    # A CPU-type device (Mesa's lavapipe) is software rendering: slower than ggml's own CPU
    # backend and hidden by ggml-vulkan by default, so it does not make GGML_AUTO build Vulkan.
    info.device_present = len(types) > len(cpu_names)
    if not types:
        info.device_note = "vulkaninfo lists no Vulkan device (no Vulkan driver/ICD installed?)"
        return
    info.device_note = f"Vulkan devices: {'; '.join(info.devices)}"
    if not info.device_present:
        info.device_note += ("; only CPU-type (software) devices: GGML_AUTO leaves Vulkan off, "
                             "GGML_VULKAN=1 builds it anyway")
    if cpu_names:
        info.notes.append(f"CPU-type Vulkan device{'s' if len(cpu_names) > 1 else ''}: {', '.join(cpu_names)}; "
                          "ggml-vulkan hides CPU-type devices unless GGML_VK_VISIBLE_DEVICES is set")


@_never_raises
def detect_opencl(env: Optional[Mapping[str, str]] = None) -> SdkInfo:
    env = _environ(env)
    info = SdkInfo("opencl", False)
    ocl_root = env.get("OCL_ROOT") or None
    include_dirs = [host_path("/usr/include", env), host_path("/usr/local/include", env)]
    lib_dirs = _lib_dirs(env)
    if ocl_root:
        include_dirs.insert(0, os.path.join(ocl_root, "include"))
        lib_dirs = [os.path.join(ocl_root, "lib"), os.path.join(ocl_root, "lib64")] + lib_dirs
    header = _glob_first([os.path.join(d, "CL", "cl.h") for d in include_dirs])
    if header:
        # The newest CL_VERSION_X_Y the headers know is what they can target.
        text = ""
        for name in ("cl_version.h", "cl.h"):
            try:
                with open(os.path.join(os.path.dirname(header), name), encoding="utf-8", errors="replace") as f:
                    text += f.read()
            except OSError:
                pass
        versions = sorted({(int(a), int(b)) for a, b in re.findall(r"CL_VERSION_(\d+)_(\d+)", text)})
        if versions:
            info.version = _dotted(versions[-1])
        info.notes.append(f"headers {header}")
    else:
        info.missing.append("OpenCL headers (CL/cl.h; package opencl-headers)")
    loader = _glob_first([os.path.join(d, "libOpenCL.so*") for d in lib_dirs])
    if loader:
        info.path = loader
        info.notes.append(f"ICD loader {loader}")
    else:
        info.missing.append("the OpenCL ICD loader (libOpenCL.so; package ocl-icd-opencl-dev)")
    info.found = not info.missing
    info.notes.append("ggml-opencl accepts only Adreno/Qualcomm or Intel GPUs with fp16 and OpenCL C >= 2.0")
    _probe_opencl_devices(info, env)
    return info


def _probe_opencl_devices(info: SdkInfo, env: Mapping[str, str]) -> None:
    clinfo = _which("clinfo", env)
    if clinfo is None:
        info.device_present, info.device_note = None, "cannot tell: clinfo not found"
        return
    rc, out = _run([clinfo, "-l"], env)
    if rc is None:
        info.device_present, info.device_note = None, f"cannot tell: {out.strip()[-160:]}"
        return
    # `clinfo -l` prints "Platform #N: <platform>" and, under it, " `-- Device #M: <device>"
    usable, platform = [], ""
    for line in out.splitlines():
        m = re.match(r"\s*Platform #\d+:\s*(.+)", line)
        if m:
            platform = m.group(1).strip()
            continue
        m = re.search(r"Device #\d+:\s*(.+)", line)
        if not m:
            continue
        name = m.group(1).strip()
        info.devices.append(name)
        # PoCL names its CPU device after the CPU ("pthread-...-Intel(R) Xeon(R)"): the
        # "Intel" in it is not an Intel GPU, and the device fails ggml-opencl's checks.
        if "portable computing language" in platform.lower():
            continue
        if re.search(r"adreno|qualcomm|intel", name, re.IGNORECASE):
            usable.append(name)
    # A device ggml-opencl would reject (NVIDIA's or AMD's OpenCL, PoCL) does not count:
    # GGML_AUTO should not build a backend that can never run here.
    info.device_present = bool(usable)
    if usable:
        info.device_note = f"OpenCL devices ggml-opencl may accept: {'; '.join(usable)}"
    elif info.devices:
        info.device_note = (f"no OpenCL device ggml-opencl accepts (clinfo lists: {'; '.join(info.devices)}; "
                            "it takes Adreno/Qualcomm or Intel GPUs, never PoCL's devices)")
    else:
        info.device_note = "clinfo lists no OpenCL device"


@_never_raises
def detect_blas(env: Optional[Mapping[str, str]] = None) -> SdkInfo:
    env = _environ(env)
    info = SdkInfo("blas", False, device_present=None, device_note="runs on the CPU")
    if _platform(env) == "darwin":
        info.found, info.path = True, "Accelerate.framework"
        return info
    vendor = env.get("GGML_BLAS_VENDOR")
    lib = _glob_first([os.path.join(d, pat) for d in _lib_dirs(env)
                       for pat in ("libopenblas.so*", "libblas.so*")])
    if lib:
        info.found, info.path = True, lib
    elif vendor:
        # A named vendor (MKL, BLIS, ...) lives wherever its installer put it; trust
        # FindBLAS to find it rather than guessing every layout here.
        info.found = True
        info.notes.append(f"GGML_BLAS_VENDOR={vendor}: left to CMake's FindBLAS to locate")
    else:
        info.missing.append("a BLAS library (libopenblas.so or libblas.so; package libopenblas-dev)")
    return info


DETECTORS: Dict[str, Callable[..., SdkInfo]] = {
    "cpu": detect_cpu, "cuda": detect_cuda, "hip": detect_hip, "sycl": detect_sycl,
    "metal": detect_metal, "vulkan": detect_vulkan, "opencl": detect_opencl,
    "rpc": detect_rpc, "blas": detect_blas,
}


def detect(names: Iterable[str], env: Optional[Mapping[str, str]] = None) -> Dict[str, SdkInfo]:
    """Run the detectors of `names` concurrently (each is mostly waiting on a subprocess)."""
    env = _environ(env)
    wanted = set(names)
    names = [b.name for b in BACKENDS if b.name in wanted]
    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        futures = {n: pool.submit(DETECTORS[n], env) for n in names}
        return {n: f.result() for n, f in futures.items()}


def detect_all(env: Optional[Mapping[str, str]] = None) -> Dict[str, SdkInfo]:
    """Detection for every backend, in BACKENDS order."""
    return detect([b.name for b in BACKENDS], env)


# --------------------------------------------------------------------------------------
# Resolving the environment into a build configuration
# --------------------------------------------------------------------------------------

@dataclass
class BuildConfig:
    enabled: Dict[str, bool]               # every backend name -> built or not (cpu always)
    requested: Dict[str, Optional[bool]]   # what the environment / CMAKE_ARGS said (None: unset)
    options: Dict[str, str]                # CMake cache variables to pass, in order
    warnings: List[str] = field(default_factory=list)
    sdks: Dict[str, SdkInfo] = field(default_factory=dict)  # detectors that were run
    extra_cmake_args: List[str] = field(default_factory=list)  # CMAKE_ARGS, split, passed last

    @property
    def enabled_backends(self) -> List[str]:
        return [b.name for b in BACKENDS if self.enabled.get(b.name)]

    def cmake_args(self) -> List[str]:
        """-D arguments for every option, then CMAKE_ARGS (last, so the user's word wins)."""
        return [f"-D{k}={v}" for k, v in self.options.items()] + list(self.extra_cmake_args)

    def to_json(self) -> dict:
        return {
            "enabled_backends": self.enabled_backends,
            "enabled": dict(self.enabled),
            "requested": dict(self.requested),
            "options": dict(self.options),
            "cmake_args": self.cmake_args(),
            "warnings": list(self.warnings),
            "sdks": {n: asdict(s) for n, s in self.sdks.items()},
        }


def _split_cmake_args(text: str) -> Tuple[List[str], Dict[str, str]]:
    """CMAKE_ARGS split like a shell would, and its -DNAME[:TYPE]=VALUE definitions."""
    try:
        tokens = shlex.split(text)
    except ValueError as e:
        raise BuildConfigError(f"CMAKE_ARGS cannot be split into arguments ({e}): {text!r}") from None
    definitions: Dict[str, str] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        body = None
        if tok == "-D" and i + 1 < len(tokens):
            body, i = tokens[i + 1], i + 2
        else:
            body, i = (tok[2:] if tok.startswith("-D") else None), i + 1
        if body and "=" in body:
            name, value = body.split("=", 1)
            definitions[name.split(":", 1)[0]] = value
    return tokens, definitions


def _setting(name: str, env: Mapping[str, str], cmake_defs: Mapping[str, str], is_flag: bool):
    """A variable from the environment or from -D in CMAKE_ARGS; both set differently is an error.

    CMAKE_ARGS counts because `CMAKE_ARGS="-DGGML_CUDA=ON" pip install .` is a common
    spelling, and the cmake-file we write (FORCE) would otherwise silently override it.
    """
    env_raw = env.get(name)
    cm_raw = cmake_defs.get(name)
    if is_flag:
        env_val = parse_flag(name, env_raw)
        cm_val = parse_flag(f"-D{name} in CMAKE_ARGS", cm_raw)
    else:
        env_val = env_raw.strip() if env_raw and env_raw.strip() else None
        cm_val = cm_raw.strip() if cm_raw and cm_raw.strip() else None
    if env_val is not None and cm_val is not None and env_val != cm_val:
        raise BuildConfigError(f"{name}={env_raw} in the environment contradicts -D{name}={cm_raw} "
                               "in CMAKE_ARGS; set it in one place")
    return env_val if env_val is not None else cm_val


def _on_off(value: bool) -> str:
    return "ON" if value else "OFF"


def missing_sdk_problems(config: BuildConfig) -> List[str]:
    """One sentence per enabled backend whose SDK was not found (empty: buildable)."""
    problems = []
    for b in BACKENDS:
        if not config.enabled.get(b.name) or not b.needs_sdk:
            continue
        sdk = config.sdks.get(b.name)
        if sdk is None or sdk.found:
            continue
        if config.requested.get(b.name):
            why = f"{b.flag}=1 was requested"
        else:
            why = f"{b.title} is built by default on this platform (set {b.flag}=0 to skip it)"
        problems.append(f"{why} but the {b.sdk_name} was not found: {'; '.join(sdk.missing)}. "
                        f"Install: {b.install_hint}")
    return problems


def resolve(env: Optional[Mapping[str, str]] = None, check: bool = True, *,
            detected: Optional[Mapping[str, SdkInfo]] = None) -> BuildConfig:
    """The build configuration the environment asks for.

    check=True raises MissingSdkError (all missing SDKs in one message) when an enabled
    backend cannot be built here; check=False only reports. Invalid flag values raise
    BuildConfigError either way. `detected` reuses detection results already at hand.
    """
    env = _environ(env)
    extra_args, cmake_defs = _split_cmake_args(env.get("CMAKE_ARGS", ""))
    requested: Dict[str, Optional[bool]] = {"cpu": None}
    for b in BACKENDS[1:]:
        requested[b.name] = _setting(b.flag, env, cmake_defs, is_flag=True)
    native = _setting("GGML_NATIVE", env, cmake_defs, is_flag=True)
    auto = parse_flag("GGML_AUTO", env.get("GGML_AUTO"))
    # A portable build (what `make wheel` makes) runs on other machines than this one: no
    # -march=native, GPU code for the GPUs of the table rather than those found here.
    portable = bool(parse_flag("POLYLLAMA_PORTABLE", env.get("POLYLLAMA_PORTABLE")))
    if portable and native is None:
        native = False
    cuda_runtime = (_setting("POLYLLAMA_CUDA_RUNTIME", env, cmake_defs, is_flag=False) or "shared").lower()
    if cuda_runtime not in ("shared", "static"):
        raise BuildConfigError(f"POLYLLAMA_CUDA_RUNTIME={cuda_runtime!r}: use shared (NVIDIA's runtime "
                               "libraries loaded at run time, from their PyPI wheels in a wheel) or "
                               "static (cudart and cuBLAS linked into the extension)")
    blas_vendor = _setting("GGML_BLAS_VENDOR", env, cmake_defs, is_flag=False)
    cuda_archs = _setting("CMAKE_CUDA_ARCHITECTURES", env, cmake_defs, is_flag=False)
    gpu_targets = _setting("GPU_TARGETS", env, cmake_defs, is_flag=False)
    amdgpu_targets = _setting("AMDGPU_TARGETS", env, cmake_defs, is_flag=False)
    if gpu_targets and amdgpu_targets and gpu_targets != amdgpu_targets:
        raise BuildConfigError(f"GPU_TARGETS={gpu_targets} and AMDGPU_TARGETS={amdgpu_targets} differ; "
                               "set only GPU_TARGETS (AMDGPU_TARGETS is its old name)")
    gpu_targets = gpu_targets or amdgpu_targets

    # Platform default: the CPU everywhere, plus a backend that exists only here and
    # always can be built (Metal on macOS: every Mac has it).
    enabled = {b.name: False for b in BACKENDS}
    enabled["cpu"] = True
    enabled.update({b.name: True for b in BACKENDS if b.only_on and b.only_on == _platform(env)})

    # Detection: what an explicit or default backend needs checked, plus AUTO's candidates.
    auto_candidates = [n for n in _table.AUTO_ORDER if requested[n] is None] if auto else []
    wanted_on = {n for n in enabled if n != "cpu" and (requested[n] if requested[n] is not None else enabled[n])}
    need = wanted_on | set(auto_candidates)
    sdks: Dict[str, SdkInfo] = {n: detected[n] for n in need if detected and n in detected}
    sdks.update(detect([n for n in need if n not in sdks], env))
    sdks = {b.name: sdks[b.name] for b in BACKENDS if b.name in sdks}

    warnings: List[str] = []
    for name in auto_candidates:
        sdk, b = sdks[name], backend_by_name(name)
        enabled[name] = sdk.found and sdk.device_present is not False
        if sdk.found and sdk.device_present is False:
            where = f" found at {sdk.path}" if sdk.path else " found"
            warnings.append(f"{b.sdk_name}{' ' + sdk.version if sdk.version else ''}{where} but {sdk.device_note}; "
                            f"compiling {b.title} for no device here is slow, so GGML_AUTO skips it "
                            f"— set {b.flag}=1 to build it anyway")
    for name, value in requested.items():
        if value is not None:
            enabled[name] = value  # explicit beats the default and GGML_AUTO, both ways

    # Every backend flag explicitly ON or OFF, so a reused CMake cache keeps no stale value.
    options: Dict[str, str] = {b.flag: _on_off(enabled[b.name]) for b in BACKENDS[1:]}
    if native is not None:
        options["GGML_NATIVE"] = _on_off(native)
    options["POLYLLAMA_PORTABLE"] = _on_off(portable)
    if portable and _machine(env) in ("x86_64", "amd64"):
        # set, not left to ggml's defaults: option() keeps what a cache already holds
        # (GGML_<ISA> in the environment or CMAKE_ARGS still wins)
        for isa in _table.CPU_ISA_FLAGS:
            chosen = _setting(f"GGML_{isa}", env, cmake_defs, is_flag=True)
            options[f"GGML_{isa}"] = _on_off(isa in _table.PORTABLE_CPU_ISA if chosen is None else chosen)
    if blas_vendor:
        options["GGML_BLAS_VENDOR"] = blas_vendor
    if enabled["cuda"]:
        cuda = sdks.get("cuda")
        options["POLYLLAMA_CUDA_RUNTIME"] = cuda_runtime
        if cuda_archs:
            options["CMAKE_CUDA_ARCHITECTURES"] = cuda_archs
        elif portable:
            options["CMAKE_CUDA_ARCHITECTURES"] = backend_by_name("cuda").portable_archs
        elif cuda is not None and cuda.archs:
            options["CMAKE_CUDA_ARCHITECTURES"] = ";".join(cuda.archs)
            warnings.append(f"CMAKE_CUDA_ARCHITECTURES={options['CMAKE_CUDA_ARCHITECTURES']} taken from this "
                            "machine's GPUs (nvidia-smi); set CMAKE_CUDA_ARCHITECTURES to build for others too")
        else:
            # ggml's own fallback: "native" when GGML_NATIVE is on (its default), which
            # needs a GPU at configure time, else a long list of architectures.
            if native is False:
                fallback = "ggml's default list of architectures, which takes a long time to compile"
            else:
                fallback = ("`native` (GGML_NATIVE is on), which needs a GPU at configure time; with "
                            "GGML_NATIVE=0 ggml's default list of architectures, which takes a long time to compile")
            warnings.append("CMAKE_CUDA_ARCHITECTURES is not set and no NVIDIA GPU was found to take it from, "
                            f"so ggml uses {fallback}; set e.g. CMAKE_CUDA_ARCHITECTURES=90 (H100), "
                            "89 (RTX 40xx) or 86 (RTX 30xx)")
    if enabled["cuda"] and portable:
        # NCCL (multi-GPU tensor parallelism) where the build machine has it would put
        # libnccl (181 MiB) into every wheel; wheels leave it out unless asked for
        nccl = _setting("GGML_CUDA_NCCL", env, cmake_defs, is_flag=True)
        options["GGML_CUDA_NCCL"] = _on_off(bool(nccl))
    if enabled["hip"]:
        if gpu_targets:
            options["GPU_TARGETS"] = gpu_targets
        else:
            hip = sdks.get("hip")
            hint = f" (this machine's: GPU_TARGETS={';'.join(hip.archs)})" if hip and hip.archs else ""
            warnings.append("GPU_TARGETS is not set, so ggml compiles HIP for its default list of AMD GPUs, "
                            f"which takes a long time; set GPU_TARGETS{hint}")
    if enabled["opencl"]:
        # The Adreno kernels only matter on Qualcomm phones and cost build time elsewhere;
        # embedded kernels keep the extension free of loose .cl files.
        options["GGML_OPENCL_USE_ADRENO_KERNELS"] = "OFF"
        options["GGML_OPENCL_EMBED_KERNELS"] = "ON"
    for b in BACKENDS:
        if enabled[b.name] and b.name in sdks:
            for k, v in sdks[b.name].cmake.items():
                options.setdefault(k, v)
    sycl = sdks.get("sycl")
    if enabled["sycl"] and sycl is not None and sycl.found:
        # Without setvars.sh, ggml-sycl's find_package(MKL) fails minutes into configure.
        warnings.extend(n for n in sycl.notes if n.startswith("the oneAPI environment"))

    config = BuildConfig(enabled=enabled, requested=requested, options=options, warnings=warnings,
                         sdks=sdks, extra_cmake_args=extra_args)
    if check:
        problems = missing_sdk_problems(config)
        if problems:
            raise MissingSdkError("\n".join(problems))
    return config


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------

_PREFIX = "polyllama build config"


def _cmake_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def cmake_file_text(config: BuildConfig) -> str:
    """The .cmake file CMakeLists.txt includes at every configure."""
    lines = [
        "# Written by buildtools/buildconfig.py cmake-file: the backend flags resolved from the",
        "# environment. Do not edit; it is rewritten at every configure.",
        "# CMAKE_ARGS is not repeated here: make and scikit-build-core pass it to CMake themselves",
        "# (its -DGGML_*, CMAKE_CUDA_ARCHITECTURES, GPU_TARGETS settings are folded in below).",
    ]
    for name, value in config.options.items():
        kind = "BOOL" if value in ("ON", "OFF") else "STRING"
        lines.append(f'set({name} {_cmake_quote(value)} CACHE {kind} "" FORCE)')
    lines.append(f"set(POLYLLAMA_ENABLED_BACKENDS {_cmake_quote(';'.join(config.enabled_backends))})")
    lines.append(f"set(POLYLLAMA_CPU_ISA_OPTIONS {_cmake_quote(';'.join(_table.CPU_ISA_FLAGS))})")
    lines.append(f"set(POLYLLAMA_BACKEND_FLAGS {_cmake_quote(';'.join(b.flag for b in BACKENDS if b.name != 'cpu'))})")
    return "\n".join(lines) + "\n"


def _warn(config: BuildConfig) -> None:
    for w in config.warnings:
        print(f"{_PREFIX}: warning: {w}", file=sys.stderr)


def _fmt_flag(value: Optional[bool]) -> str:
    return "-" if value is None else ("1" if value else "0")


def _fmt_device(value: Optional[bool]) -> str:
    return "?" if value is None else ("yes" if value else "no")


def show_text(env: Optional[Mapping[str, str]] = None) -> str:
    """The `show` report: flags, detection for every backend, and the resulting CMake args."""
    env = _environ(env)
    detected = detect_all(env)
    config = resolve(env, check=False, detected=detected)
    auto = env.get("GGML_AUTO") or "unset"
    out = [f"polyllama build configuration (platform {_platform(env)}, GGML_AUTO={auto})", ""]
    header = f"{'backend':<8} {'flag':<12} {'requested':<9} {'enabled':<7} {'SDK':<9} {'version':<10} device"
    out += [header, "-" * len(header)]
    for b in BACKENDS:
        sdk = detected[b.name]
        out.append(f"{b.name:<8} {b.flag:<12} {_fmt_flag(config.requested.get(b.name)):<9} "
                   f"{'yes' if config.enabled[b.name] else 'no':<7} {'found' if sdk.found else 'missing':<9} "
                   f"{sdk.version or '-':<10} {_fmt_device(sdk.device_present)}")
    out.append("")
    for b in BACKENDS:
        sdk = detected[b.name]
        if not b.needs_sdk:
            continue
        out.append(f"{b.name}: {sdk.summary()}")
        if sdk.device_note:
            out.append(f"    device: {sdk.device_note}")
        for note in sdk.notes:
            out.append(f"    note: {note}")
        if not sdk.found:
            out.append(f"    install: {b.install_hint}")
    if config.warnings:
        out.append("")
        out += [f"warning: {w}" for w in config.warnings]
    problems = missing_sdk_problems(config)
    if problems:
        out.append("")
        out += [f"`make build` would stop: {p}" for p in problems]
    out += ["", f"backends to build: {', '.join(config.enabled_backends)}",
            "CMake arguments:", "    " + shlex.join(config.cmake_args())]
    return "\n".join(out)


# `make build-<name>`: a backend's name adds that backend; these stand for several
_GROUP_TARGETS = {
    "cpu": "every backend flag off: the CPU alone",
    "all": "every backend this platform can have; fails fast naming each missing SDK",
    "auto": "every backend whose SDK (and device) is detected here (GGML_AUTO=1)",
}


def target_names() -> List[str]:
    """The <b> of every `make build-<b>` target."""
    return [b.name for b in BACKENDS] + [g for g in _GROUP_TARGETS if g not in _table.BACKEND_NAMES]


def target_env(name: str, env: Optional[Mapping[str, str]] = None) -> List[str]:
    """The VAR=VALUE settings `make build-<name>` runs `make build` with."""
    if name == "cpu":
        return [f"{b.flag}=0" for b in BACKENDS if b.name != "cpu"]
    if name == "all":
        platform = _platform(_environ(env))
        return [f"{b.flag}=1" for b in BACKENDS if b.in_build_all and b.only_on in (None, platform)]
    if name == "auto":
        return ["GGML_AUTO=1"]
    b = backend_by_name(name)
    if b is None:
        raise BuildConfigError(f"no build target for {name!r}; make build-<b> takes b = {' '.join(target_names())}")
    return [f"{b.flag}=1"]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="buildconfig.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("cmake-args", help="print the CMake -D arguments on one line (never fails on missing SDKs)")
    sub.add_parser("check", help="fail (exit 2) when an enabled backend's SDK is missing")
    p_file = sub.add_parser("cmake-file", help="write a .cmake file of cache settings (for CMakeLists.txt)")
    p_file.add_argument("path")
    sub.add_parser("show", help="flags, SDK detection for every backend, and the CMake arguments")
    sub.add_parser("json", help="the configuration and detection for every backend, as JSON")
    p_target = sub.add_parser("target-env", help="the flags `make build-NAME` sets, as VAR=VALUE words")
    p_target.add_argument("name")
    sub.add_parser("target-names", help="the NAMEs of `make build-NAME`")
    args = parser.parse_args(argv)
    try:
        if args.command == "cmake-args":
            config = resolve(check=False)
            _warn(config)
            print(shlex.join(config.cmake_args()))
        elif args.command == "check":
            config = resolve(check=True)
            print(f"polyllama: building backends: {', '.join(config.enabled_backends)}", file=sys.stderr)
            _warn(config)
        elif args.command == "cmake-file":
            config = resolve(check=True)
            print(f"polyllama: building backends: {', '.join(config.enabled_backends)}", file=sys.stderr)
            _warn(config)
            directory = os.path.dirname(os.path.abspath(args.path))
            os.makedirs(directory, exist_ok=True)
            with open(args.path, "w", encoding="utf-8") as f:
                f.write(cmake_file_text(config))
        elif args.command == "show":
            print(show_text())
        elif args.command == "target-env":
            print(" ".join(target_env(args.name)))
        elif args.command == "target-names":
            print(" ".join(target_names()))
        elif args.command == "json":
            detected = detect_all()
            data = resolve(check=False, detected=detected).to_json()
            data["detected"] = {n: asdict(s) for n, s in detected.items()}
            print(json.dumps(data, indent=2))
    except BuildConfigError as e:
        print(f"{_PREFIX}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
