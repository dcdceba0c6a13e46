"""Where a model goes: from LLM(backend=..., device=..., n_gpu_layers=...) to llama_model_params.

resolve_candidates() turns the user's arguments into an ordered list of Candidates (a
device list plus split settings); LLM loads the first that fits and works, falling back
to the next. Memory figures and fitting come from llama.cpp's libcommon (common/fit.h):
we never estimate memory with a formula of our own.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Sequence, Union

from . import backend_table
from ._llamacpp_loader import llamacpp
from .backend_table import AUTO_ORDER, BACKEND_NAMES
from .discovery import Device, backends, devices
from .errors import (BackendNotCompiledError, ConflictingArgumentsError, ContextError, DeviceNotFoundError,
                     NoDeviceError, UnknownBackendError)

log = logging.getLogger("polyllama")

DeviceSpec = Union[int, str, Device]
SPLIT_MODES = tuple(llamacpp.SPLIT_MODES)   # llama_split_mode's names, in _llamacpp.pyx
DEFAULT_MARGIN = 1 << 30  # bytes left free per device when fitting, as llama.cpp's -fit
# split_mode="row" puts weights in a backend's split buffer type, which llama.cpp asks the
# registry for ("ggml_backend_split_buffer_type", src/llama-model.cpp make_gpu_buft_list)
# and fails without ("device Vulkan0 does not support split buffers"): backend_table's
# row_split says which backends export it.
ROW_SPLIT_BACKENDS = tuple(b.name for b in backend_table.BACKENDS if b.row_split)


@dataclass
class Candidate:
    """One way to place the model: a backend and the devices to offload to."""
    backend: str
    devices: list[Device]          # offload devices; [] means CPU only
    split_mode: str = "layer"
    main_gpu: int = 0              # index into `devices`
    tensor_split: list[float] | None = None
    n_gpu_layers: int | str = "auto"
    rpc_timeout: float | None = None   # seconds, for candidates with remote (rpc) devices

    def describe(self) -> str:
        if not self.devices:
            return "cpu"
        return ", ".join(f"{d.spec} ({d.name})" for d in self.devices)


@dataclass
class Placement:
    """Where a loaded model landed (LLM.placement)."""
    backend: str
    devices: list[str]                     # ggml device names holding layers; ["CPU"] for CPU only
    n_gpu_layers: int                      # layers offloaded (llama.cpp counts the output layer too)
    n_layers: int                          # repeating layers + output layer
    memory: list[dict] = field(default_factory=list)   # per device: model/context/compute bytes
    skipped: list[str] = field(default_factory=list)   # why earlier candidates were not used
    fitted: bool = False                   # n_gpu_layers chosen by llama.cpp's memory fitting
    remote: dict[str, str] = field(default_factory=dict)  # RPC device name -> "host:port"
    device_sampling: bool = False          # greedy picks in the decode graph (LLM(device_sampling=))

    def __post_init__(self) -> None:
        self.devices = real_device_names(self.devices)

    def __str__(self) -> str:
        where = ", ".join(f"{d} ({self.remote[d]})" if d in self.remote else d for d in self.devices)
        s = f"{self.backend} on {where}: {self.n_gpu_layers}/{self.n_layers} layers offloaded"
        if self.skipped:
            s += "; skipped: " + "; ".join(self.skipped)
        return s


# ---------------------------------------------------------------------------------------
# argument resolution
# ---------------------------------------------------------------------------------------
def _check_backend_name(name: str) -> str:
    name = name.strip().lower()
    if name == "auto" or name in BACKEND_NAMES:
        return name
    raise UnknownBackendError(f"unknown backend {name!r}; use one of: auto, "
                              + ", ".join(BACKEND_NAMES))


def _usable_devices(name: str) -> list[Device]:
    """The offload devices of a backend, raising when it is absent or has none."""
    st = next(s for s in backends() if s.name == name)
    if not st.compiled:
        raise BackendNotCompiledError(f"backend {name!r} is {st.reason}")
    if not st.devices:
        raise NoDeviceError(f"backend {name!r}: {st.reason}")
    return st.devices


def _device_table(devs: Sequence[Device]) -> str:
    return "; ".join(f"[{d.index}] {d.spec} {d.name} ({d.description})" for d in devs)


def _lookup_device(spec: DeviceSpec, all_devs: list[Device]) -> Device:
    if isinstance(spec, Device):
        spec = spec.index
    if isinstance(spec, bool) or not isinstance(spec, (int, str)):
        raise TypeError(f"device must be an int, a 'backend:N' string or a device name, "
                        f"not {type(spec).__name__}")
    if isinstance(spec, int):
        for d in all_devs:
            if d.index == spec:
                return d
        raise DeviceNotFoundError(f"device index {spec} out of range; devices: {_device_table(all_devs)}")
    s = spec.strip()
    if ":" in s:
        backend, _, ordinal = s.partition(":")
        backend = _check_backend_name(backend)
        if not ordinal.isdigit():
            raise DeviceNotFoundError(f"device {spec!r}: expected '<backend>:<number>', e.g. 'cuda:0'")
        matches = [d for d in all_devs if d.backend == backend]
        if not matches:
            _usable_devices(backend)  # raises the not-compiled / no-device error
        for d in matches:
            if d.ordinal == int(ordinal):
                return d
        raise DeviceNotFoundError(f"device {spec!r} not found; {backend} devices: {_device_table(matches)}")
    for d in all_devs:
        if d.name.lower() == s.lower():
            return d
    raise DeviceNotFoundError(f"no device named {spec!r}; devices: {_device_table(all_devs)}")


def resolve_candidates(backend: str | None = None, device: DeviceSpec | Sequence[DeviceSpec] | None = None,
                       n_gpu_layers: int | str = "auto", split_mode: str | None = None,
                       tensor_split: Sequence[float] | None = None,
                       main_device: DeviceSpec | None = None) -> tuple[list[Candidate], list[str]]:
    """Turn the user's placement arguments into candidates, best first, and skip reasons.

    backend None / device None fall back to $POLYLLAMA_BACKEND / $POLYLLAMA_DEVICE.
    """
    skipped: list[str] = []
    if backend is None:
        backend = os.environ.get("POLYLLAMA_BACKEND") or "auto"
    if device is None and os.environ.get("POLYLLAMA_DEVICE"):
        env_dev = os.environ["POLYLLAMA_DEVICE"]
        device = [int(x) if x.strip().isdigit() else x for x in env_dev.split(",")]
        if len(device) == 1:
            device = device[0]
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string, not {type(backend).__name__}")
    backend = _check_backend_name(backend)
    if split_mode is not None and split_mode not in SPLIT_MODES:
        raise ValueError(f"unknown split_mode {split_mode!r}; use one of {', '.join(SPLIT_MODES)}")
    if not (n_gpu_layers == "auto" or (isinstance(n_gpu_layers, int) and not isinstance(n_gpu_layers, bool))):
        raise TypeError(f"n_gpu_layers must be 'auto' or an int, not {n_gpu_layers!r}")
    if tensor_split is not None:
        if isinstance(tensor_split, (str, bytes)) or not hasattr(tensor_split, "__iter__") or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in tensor_split):
            raise TypeError(f"tensor_split must be a list of numbers (one proportion per device), "
                            f"not {tensor_split!r}")
        tensor_split = [float(x) for x in tensor_split]
        if any(not x >= 0 for x in tensor_split) or not any(x > 0 for x in tensor_split):
            raise ValueError("tensor_split must hold non-negative proportions, at least one > 0")

    all_devs = devices()

    # an explicit device list wins; it must agree with an explicit backend
    if device is not None:
        specs = list(device) if isinstance(device, (list, tuple)) else [device]
        if not specs:
            raise ValueError("device=[] selects nothing; use backend='cpu' for no offload")
        chosen = [_lookup_device(s, all_devs) for s in specs]
        if len({d.index for d in chosen}) != len(chosen):
            raise ConflictingArgumentsError(f"device list {specs!r} names a device twice")
        names = {d.backend for d in chosen}
        if backend not in ("auto",) and any(d.backend != backend and d.backend != "cpu" for d in chosen):
            raise ConflictingArgumentsError(
                f"backend={backend!r} conflicts with device={device!r} "
                f"(a {'/'.join(sorted(names))} device); drop one of the two")
        offload = [d for d in chosen if d.is_offload_target]
        if not offload:  # only the CPU device was named
            if n_gpu_layers not in ("auto", 0):
                raise ConflictingArgumentsError("n_gpu_layers > 0 needs an offload device; "
                                                "the CPU device was chosen")
            return [Candidate("cpu", [], n_gpu_layers=0)], skipped
        cand = Candidate(offload[0].backend if len(names - {"cpu"}) == 1 else "+".join(sorted(names - {"cpu"})),
                         offload, n_gpu_layers=n_gpu_layers)
        return [_finish(cand, split_mode, tensor_split, main_device, all_devs)], skipped

    if backend == "cpu":
        if n_gpu_layers not in ("auto", 0):
            raise ConflictingArgumentsError(
                f"backend='cpu' means no offload, but n_gpu_layers={n_gpu_layers}; "
                "drop n_gpu_layers or choose a GPU backend")
        if tensor_split is not None or main_device is not None:
            raise ConflictingArgumentsError("tensor_split/main_device need a GPU backend, not 'cpu'")
        return [Candidate("cpu", [], n_gpu_layers=0)], skipped

    if backend != "auto":
        devs = [d for d in _usable_devices(backend) if d.is_offload_target]
        if not devs:
            raise NoDeviceError(f"backend {backend!r} has no device that layers can be offloaded to")
        return [_finish(Candidate(backend, devs, n_gpu_layers=n_gpu_layers), split_mode,
                        tensor_split, main_device, all_devs)], skipped

    # auto: GPU backends in AUTO_ORDER, then the CPU
    cands = []
    statuses = {s.name: s for s in backends()}
    # one entry for all of them: the rebuild hint is the same for each (Metal only on macOS)
    absent = [n for n in AUTO_ORDER if not statuses[n].compiled
              and backend_table.by_name(n).only_on in (None, sys.platform)]
    if absent:
        hint = (f"make build-{absent[0]} or GGML_{absent[0].upper()}=1" if len(absent) == 1
                else "make build-<name> or GGML_<NAME>=1")
        skipped.append(f"{', '.join(absent)}: not compiled in (rebuild with {hint} pip install .)")
    no_row = []
    for name in AUTO_ORDER:
        st = statuses[name]
        if not st.compiled:
            continue
        if not st.devices:
            skipped.append(f"{name}: {st.reason}")
            continue
        devs = [d for d in st.devices if not d.software]
        if not devs:
            skipped.append(f"{name}: only software devices that run on the CPU "
                           f"({', '.join(d.name for d in st.devices)}); pass backend={name!r} to use them")
            continue
        if split_mode == "row" and name not in ROW_SPLIT_BACKENDS:
            no_row.append(name)
            skipped.append(f"{name}: no split_mode='row' support")
            continue
        # one backend's devices together (multi-GPU of one vendor); tensor_split applies to them
        cands.append(_finish(Candidate(name, devs, n_gpu_layers=n_gpu_layers), split_mode,
                             tensor_split, main_device, all_devs))
    if not cands and no_row:
        raise ConflictingArgumentsError(_row_split_message(no_row))
    if not cands and (tensor_split is not None or main_device is not None):
        raise ConflictingArgumentsError("tensor_split/main_device were given but no GPU backend is usable; "
                                        + "; ".join(skipped))
    cands.append(Candidate("cpu", [], n_gpu_layers=0))
    return cands, skipped


def _row_split_message(backends_without: Sequence[str]) -> str:
    return (f"split_mode='row' needs split buffers, which {'/'.join(backends_without)} does not have; "
            f"in this build's llama.cpp only {'/'.join(ROW_SPLIT_BACKENDS)} has them (CUDA and HIP "
            "replaced row split with split_mode='tensor'); use split_mode='layer' or 'tensor'")


def _finish(c: Candidate, split_mode, tensor_split, main_device, all_devs) -> Candidate:
    c.split_mode = split_mode or ("none" if len(c.devices) == 1 else "layer")
    if c.split_mode == "row":
        without = sorted({d.backend for d in c.devices if d.backend not in ROW_SPLIT_BACKENDS})
        if without:
            raise ConflictingArgumentsError(_row_split_message(without))
    if c.split_mode == "tensor" and c.n_gpu_layers == "auto":
        # llama.cpp's common_fit_params refuses SPLIT_MODE_TENSOR ("not implemented", which
        # polyllama reported as a false InsufficientMemoryError). llama-cli goes on without
        # fitting and offloads every layer (n_gpu_layers -1); so does polyllama.
        log.info("polyllama: split_mode='tensor': llama.cpp's memory fitting does not support it; "
                 "offloading all layers (pass an int n_gpu_layers to choose)")
        c.n_gpu_layers = -1
    if tensor_split is not None:
        if len(tensor_split) > len(c.devices):
            raise ConflictingArgumentsError(
                f"tensor_split has {len(tensor_split)} entries but {len(c.devices)} device(s) "
                f"were chosen ({c.describe()})")
        c.tensor_split = list(tensor_split)
    if main_device is not None:
        d = _lookup_device(main_device, all_devs)
        if d not in c.devices:
            raise ConflictingArgumentsError(f"main_device {d.spec} is not among the chosen devices ({c.describe()})")
        c.main_gpu = c.devices.index(d)
    return c


def real_device_names(names: Sequence[str], devices: Sequence[Device] = ()) -> list[str]:
    """Device names with llama.cpp's tensor-parallel meta device replaced by its members.

    split_mode="tensor" loads the model onto one ggml "Meta(<dev>,<dev>...)" device. The
    pinned ggml builds that name from a vector it has just moved from, so it always reads
    "Meta()"; then only the candidate's `devices` (what was passed to llama.cpp, all of
    which the meta device spans) can say which devices hold the model.
    """
    out: list[str] = []
    for name in names:
        if name.startswith("Meta(") and name.endswith(")"):
            inner = [n for n in name[len("Meta("):-1].split(",") if n]
            members = inner or [d.name for d in devices]
            if members:
                out += [m for m in members if m not in out]
                continue
        if name not in out:
            out.append(name)
    return out


# ---------------------------------------------------------------------------------------
# llama.cpp parameter objects
# ---------------------------------------------------------------------------------------
def model_params(c: Candidate, vocab_only: bool = False):
    ngl = None if c.n_gpu_layers == "auto" else c.n_gpu_layers
    if not c.devices:
        ngl = 0
    mp = llamacpp.ModelParams(devices=[d.index for d in c.devices], n_gpu_layers=ngl,
                          split_mode=c.split_mode, main_gpu=c.main_gpu,
                          tensor_split=c.tensor_split, vocab_only=vocab_only)
    if any(d.backend == "rpc" for d in c.devices):
        # calls that reach a remote device go through the RPC guard (polyllama.rpc)
        from .rpc import DEFAULT_TIMEOUT
        mp.remote_timeout = c.rpc_timeout or DEFAULT_TIMEOUT
    return mp


def check_kv_fits_devices(meta: dict | None, n_ctx: int, cand: Candidate) -> None:
    """ContextError when one layer's KV cache is larger than a device of `cand` takes in
    one tensor (asked through ggml's supports_op). ggml-vulkan refuses tensors beyond its
    storage-buffer range (128 MiB on lavapipe, 4 GiB on most GPUs); a KV cache layer
    allocated there anyway makes ggml's scheduler abort the process while a context is
    made, llama.cpp's fit and estimate included. `meta`: gguf_check.read_metadata's dict."""
    from .gguf_check import kv_layer_bytes
    if not cand.devices or cand.n_gpu_layers == 0:
        return
    nbytes = kv_layer_bytes(meta, n_ctx)
    if not nbytes:
        return
    for d in cand.devices:
        if not llamacpp.device_supports_tensor_bytes(d.index, nbytes):
            raise ContextError(
                f"one layer of the KV cache at n_ctx={n_ctx or 'the model maximum'} is "
                f"{nbytes / 2**20:.0f} MiB, more than {d.name} ({d.backend}) takes in one buffer; "
                "use a smaller n_ctx (or run that device's layers elsewhere)")


def estimate_memory(model_path: str | os.PathLike, n_ctx: int = 4096, *, backend: str | None = "auto",
                    device: DeviceSpec | Sequence[DeviceSpec] | None = None,
                    n_gpu_layers: int | str = "auto", n_batch: int = 2048, n_ubatch: int = 512,
                    n_seq_max: int = 1, flash_attn: str = "auto", split_mode: str | None = None,
                    tensor_split: Sequence[float] | None = None,
                    main_device: DeviceSpec | None = None) -> dict:
    """Bytes llama.cpp would allocate for weights, KV cache and compute buffers, per device.

    From libcommon's common_get_device_memory_data (model and context created with
    no_alloc). Returns {"backend", "devices": [{"device", "model", "context", "compute",
    "total", "free"}, ...], "n_layer", "n_ctx_train"}; the "Host" row is memory in RAM.
    With n_gpu_layers="auto" (default: all layers) nothing is fitted; see LLM for that.
    split_mode, tensor_split and main_device spread the model over several devices as in LLM.
    """
    from .gguf_check import check_gguf
    cands, _ = resolve_candidates(backend, device, n_gpu_layers, split_mode, tensor_split, main_device)
    c = cands[0]
    check_kv_fits_devices(check_gguf(model_path), n_ctx, c)
    mp = model_params(c)
    cp = llamacpp.ContextParams(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=n_seq_max,
                            flash_attn=flash_attn)
    est = llamacpp.estimate_memory(os.fspath(model_path), mp, cp)
    est["backend"] = c.backend
    for row in est["devices"]:
        row["bytes"] = row["model"] + row["context"] + row["compute"]
    return est
