"""Device discovery: which ggml devices and backends this build has, queried fresh each call.

Backend names (cpu, cuda, hip, ...), their ggml registry names and the order of
backend="auto" come from polyllama.backend_table, the same table the build reads.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from . import backend_table
from ._llamacpp_loader import llamacpp
from .backend_table import AUTO_ORDER, BACKENDS

# Drivers that implement a GPU API on the CPU. ggml-vulkan reports lavapipe as a GPU
# (it maps every non-integrated device to GGML_BACKEND_DEVICE_TYPE_GPU), so the device
# type alone cannot tell; the driver's device name can.
_SOFTWARE_DRIVERS = re.compile(r"llvmpipe|lavapipe|softpipe|swiftshader", re.IGNORECASE)


@dataclass(frozen=True)
class Device:
    """One ggml device as this process sees it now."""
    index: int            # position in ggml's global device list (what llama.cpp uses)
    name: str             # ggml device name, e.g. "CPU", "CUDA0", "Vulkan0"
    description: str      # vendor's name of the device
    backend: str          # polyllama backend name: cpu, cuda, hip, vulkan, ...
    ordinal: int          # position among the devices of its backend ("cuda:1" -> 1)
    type: str             # "CPU", "GPU", "iGPU" or "accelerator"
    memory_free: int      # bytes
    memory_total: int     # bytes
    registry: str         # ggml registry name, e.g. "CUDA", "Vulkan"
    device_id: str = ""   # PCI bus id where the backend reports one, else ""

    @property
    def software(self) -> bool:
        """A CPU-type device, or a GPU API implemented on the CPU (Mesa's lavapipe).

        backend="auto" never picks these: they are far slower than ggml's own CPU backend
        on the same cores (docs/BUILD_BACKENDS.md has the figures measured here).
        """
        return self.type == "CPU" or bool(_SOFTWARE_DRIVERS.search(self.description))

    @property
    def spec(self) -> str:
        """The device's spelling for LLM(device=...): "<backend>:<ordinal>"."""
        return f"{self.backend}:{self.ordinal}"

    @property
    def is_offload_target(self) -> bool:
        """Whether llama.cpp can place layers on it (the CPU and BLAS devices are not)."""
        b = backend_table.by_name(self.backend)
        return b is not None and b.offload


def _backend_name(registry: str) -> str:
    b = backend_table.by_registry(registry)
    return b.name if b is not None else registry.lower()


def devices() -> list[Device]:
    """Every ggml device compiled into this build, with free/total memory queried now."""
    out: list[Device] = []
    ordinals: dict[str, int] = {}
    for d in llamacpp.device_list():
        backend = _backend_name(d["registry"])
        ordinal = ordinals.get(backend, 0)
        ordinals[backend] = ordinal + 1
        out.append(Device(index=d["index"], name=d["name"], description=d["description"],
                          backend=backend, ordinal=ordinal, type=d["type"],
                          memory_free=d["memory_free"], memory_total=d["memory_total"],
                          registry=d["registry"], device_id=d["device_id"]))
    return out


@dataclass
class BackendStatus:
    """One backend polyllama knows, and whether this build can use it here."""
    name: str
    title: str
    compiled: bool
    devices: list[Device] = field(default_factory=list)
    reason: str = ""      # why it is unusable ("" when usable)
    notes: list[str] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return self.compiled and (bool(self.devices) or not backend_table.by_name(self.name).needs_device)


def _hidden_vulkan_cpu_devices() -> int:
    """How many CPU-type Vulkan devices (e.g. lavapipe) ggml-vulkan is hiding.

    ggml-vulkan skips CPU-type devices unless GGML_VK_VISIBLE_DEVICES is set; users then
    see no Vulkan device at all. We ask vulkaninfo (vulkan-tools), when it is installed, to
    tell them why; 0 when it is not or says nothing in time.
    """
    vulkaninfo = shutil.which("vulkaninfo")
    if os.environ.get("GGML_VK_VISIBLE_DEVICES") or vulkaninfo is None:
        return 0
    try:
        out = subprocess.run([vulkaninfo, "--summary"], capture_output=True, text=True, errors="replace",
                             stdin=subprocess.DEVNULL, timeout=5, env=dict(os.environ, LC_ALL="C")).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(kind == "CPU" for _, kind in backend_table.parse_vulkaninfo_summary(out))


def _registration_lines(b: backend_table.Backend) -> list[str]:
    """What a backend logged about its devices while registering at import.

    ggml-opencl, for one, names each device it drops and why ("device does not support
    FP16"); that is the most precise reason there is, so it goes into the status.
    """
    prefixes = (f"ggml_{b.registry.lower()}:",) + ((b.log_prefix,) if b.log_prefix else ())
    out = []
    for line in llamacpp.REGISTRATION_LOG.splitlines():
        prefix = next((p for p in prefixes if line.startswith(p)), None)
        if prefix:
            out.append(line[len(prefix):].strip())
    return out


def _amd_gpu_access() -> str:
    """What the kernel lacks when the ROCm runtime finds no GPU, or "" when nothing visible
    is: the runtime reaches AMD GPUs through /dev/kfd, the amdgpu driver's compute device."""
    kfd = backend_table.host_path("/dev/kfd")
    if not os.path.exists(kfd):
        return "/dev/kfd is absent: there is no AMD GPU here, or the amdgpu kernel driver is not loaded"
    if not os.access(kfd, os.R_OK | os.W_OK):
        return "this user cannot open /dev/kfd: add it to the render group (and video, on older distributions)"
    return ""


def _built_backends() -> list[str]:
    """Backends CMake compiled in, from build_info.json (empty if it cannot be read)."""
    try:
        from .info import build_info
        return list(build_info().get("backends", []))
    except (OSError, ValueError):
        return []


def backends() -> list[BackendStatus]:
    """Every backend polyllama knows: compiled in or not, its devices, why unusable."""
    registered = set(llamacpp.registries())
    built = set(_built_backends())
    devs = devices()
    out = []
    for b in BACKENDS:
        # a backend can be compiled in and still have no registry: ggml-vulkan, for one,
        # returns none when the Vulkan loader finds no usable driver at start-up
        st = BackendStatus(name=b.name, title=b.title,
                           compiled=b.registry in registered or b.name in built,
                           devices=[d for d in devs if d.backend == b.name])
        if not st.compiled:
            st.reason = (f"not compiled in: rebuild with `make {b.make_target}` or "
                         f"`{b.flag}=1 pip install .`")
        elif b.registry not in registered:
            st.reason = f"compiled in, but ggml's {b.title} backend did not start"
            if b.no_registry_hint:
                st.reason += f" ({b.no_registry_hint})"
        elif not st.devices and b.needs_device:
            st.reason = "compiled in, no device found"
            hidden = _hidden_vulkan_cpu_devices() if b.name == "vulkan" else 0
            if hidden:
                st.reason = (f"Vulkan compiled in; {hidden} CPU-type device"
                             f"{'s' if hidden > 1 else ''} hidden, set GGML_VK_VISIBLE_DEVICES "
                             "to use it (e.g. GGML_VK_VISIBLE_DEVICES=0)")
            elif b.no_device_hint:
                st.reason += "; " + b.no_device_hint
            elif b.name == "hip" and _amd_gpu_access():
                st.reason += "; " + _amd_gpu_access()
        if st.reason and st.compiled:
            said = _registration_lines(b)
            if said:
                st.reason += "; ggml said: " + " / ".join(said)
        soft = [d.name for d in st.devices if d.is_offload_target and d.software]
        if soft:
            st.notes.append(f"{', '.join(soft)}: software rendering on the CPU; "
                            f"backend='auto' does not pick it, backend={b.name!r} does")
        out.append(st)
    return out


def recommended_backend() -> str:
    """The backend backend="auto" would try first here (ignoring memory fit)."""
    for st in backends():
        if st.name in AUTO_ORDER and st.usable and any(not d.software for d in st.devices):
            return st.name
    return "cpu"


def _fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def backend_summary() -> str:
    """The text print_backend_summary() prints."""
    lines = ["polyllama backends", ""]
    for st in backends():
        mark = "✓" if st.usable else "✗"
        head = f"  {mark} {st.name:<7} {st.title}"
        if st.usable and st.devices:
            lines.append(head)
            for d in st.devices:
                lines.append(f"      [{d.index}] {d.spec:<9} {d.name:<10} {d.type:<11} "
                             f"{_fmt_bytes(d.memory_free)} free / {_fmt_bytes(d.memory_total)}  "
                             f"{d.description}")
        elif st.usable:
            lines.append(f"{head}  (compiled in)")
        else:
            lines.append(f"{head}  — {st.reason}")
        for note in st.notes:
            lines.append(f"      note: {note}")
    lines += ["", f"  recommended backend: {recommended_backend()}"]
    return "\n".join(lines)


def print_backend_summary() -> None:
    print(backend_summary())
