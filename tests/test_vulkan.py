"""Two real backends in one build: the CPU and Vulkan (Mesa's lavapipe on CI machines).

The same process loads SmolLM2 on each and compares them. Vulkan runs the matrix products
with other kernels (fp16 accumulation, its own quantized dot products), so bit-identical
output is not expected: the logits of the next token must agree within a tolerance and the
greedy continuation must agree for its first tokens (docs/BUILD_BACKENDS.md § Vulkan has
the figures that set these bounds).

The tests need a Vulkan device. conftest.py sets GGML_VK_VISIBLE_DEVICES=0 (unless the
caller set it) so that ggml-vulkan shows lavapipe; without any device they skip.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from conftest import ROOT, THREADS, child_env
from polyllama import LLM, NoDeviceError, backends, devices

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "Once upon a time, in a small village,"]
# Seen on lavapipe (Mesa 22.3.6): cosine >= 0.9987, max |difference| <= 0.87 on logits
# whose largest magnitude is 20-30, same arg-max for every prompt, against a CPU build for
# this machine (AVX-512, AMX); against a portable wheel's CPU kernels (x86-64-v3, `make
# test-wheel`, 2026-11-25) cosine 0.9941 on "The capital of France is", same arg-max and
# greedy prefix. A broken kernel lands far below either.
MIN_COSINE = 0.99
MAX_ABS_DIFF = 1.5
GREEDY_PREFIX = 4

_status = {b.name: b for b in backends()}
_vk_devices = [d for d in devices() if d.backend == "vulkan"]
needs_vulkan = pytest.mark.skipif(
    not _vk_devices,
    reason="no Vulkan device: " + (_status["vulkan"].reason or "none visible"))


@pytest.fixture(scope="module")
def vk_llm(model_path):
    with LLM(model_path, backend="vulkan", n_threads=THREADS, n_ctx=512) as m:
        yield m


@pytest.fixture(scope="module")
def half_llm(model_path, vk_llm):
    n_layer = vk_llm.metadata["n_layer"]
    with LLM(model_path, backend="vulkan", n_gpu_layers=n_layer // 2, n_threads=THREADS,
             n_ctx=512) as m:
        yield m


def _compare(a, b) -> tuple[float, float, bool]:
    dot = sum(x * y for x, y in zip(a, b))
    cos = dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))
    diff = max(abs(x - y) for x, y in zip(a, b))
    same_top = max(range(len(a)), key=a.__getitem__) == max(range(len(b)), key=b.__getitem__)
    return cos, diff, same_top


@needs_vulkan
def test_devices_lists_cpu_and_vulkan():
    devs = devices()
    assert [d.backend for d in devs].count("cpu") == 1
    vk = _vk_devices[0]
    assert vk.name == "Vulkan0" and vk.spec == "vulkan:0" and vk.is_offload_target
    assert vk.memory_total > 0 and 0 <= vk.memory_free <= vk.memory_total
    assert _status["vulkan"].usable and not _status["vulkan"].reason
    if "llvmpipe" in vk.description:
        assert vk.software
        assert any("software rendering on the CPU" in n for n in _status["vulkan"].notes)


@needs_vulkan
def test_backend_vulkan_lands_on_vulkan(vk_llm):
    p = vk_llm.placement
    assert p.backend == "vulkan"
    assert p.devices == ["Vulkan0"]
    assert p.n_gpu_layers == p.n_layers == vk_llm.metadata["n_layer"] + 1
    vk_row = next(r for r in p.memory if r["device"] == "Vulkan0")
    assert vk_row["model"] > 0 and vk_row["context"] > 0
    assert str(p).startswith("vulkan on Vulkan0: 31/31 layers offloaded")


@needs_vulkan
def test_backend_cpu_and_device_spec(model_path):
    with LLM(model_path, backend="cpu", n_threads=THREADS, n_ctx=256) as m:
        assert (m.placement.backend, m.placement.devices, m.placement.n_gpu_layers) == ("cpu", ["CPU"], 0)
    with LLM(model_path, device="vulkan:0", n_threads=THREADS, n_ctx=256) as m:
        assert (m.placement.backend, m.placement.devices) == ("vulkan", ["Vulkan0"])


@needs_vulkan
def test_auto_skips_software_vulkan_and_says_so(model_path):
    if not all(d.software for d in _vk_devices):
        pytest.skip("a hardware Vulkan device is present: auto would rightly pick it")
    with LLM(model_path, backend="auto", n_threads=THREADS, n_ctx=256) as m:
        assert m.placement.backend == "cpu"
        assert any(r.startswith("vulkan: only software devices that run on the CPU (Vulkan0)")
                   for r in m.placement.skipped), m.placement.skipped


@needs_vulkan
@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_agree_with_cpu(llm, vk_llm, half_llm, prompt):
    ref = llm.logits(prompt)
    for other in (vk_llm, half_llm):
        cos, diff, same_top = _compare(ref, other.logits(prompt))
        assert cos >= MIN_COSINE, (other.placement, cos)
        assert diff <= MAX_ABS_DIFF, (other.placement, diff)
        assert same_top, other.placement


@needs_vulkan
@pytest.mark.parametrize("prompt", PROMPTS)
def test_first_greedy_tokens_agree_with_cpu(llm, vk_llm, half_llm, prompt):
    ref = llm.generate(prompt, max_tokens=GREEDY_PREFIX).tokens
    assert len(ref) == GREEDY_PREFIX
    assert vk_llm.generate(prompt, max_tokens=GREEDY_PREFIX).tokens == ref
    assert half_llm.generate(prompt, max_tokens=GREEDY_PREFIX).tokens == ref


@needs_vulkan
def test_partial_offload_places_half_the_layers(half_llm):
    p = half_llm.placement
    n_layer = half_llm.metadata["n_layer"]
    assert p.backend == "vulkan" and p.devices == ["Vulkan0"]
    assert p.n_gpu_layers == n_layer // 2 and p.n_layers == n_layer + 1
    rows = {r["device"]: r for r in p.memory}
    assert rows["Vulkan0"]["model"] > 0 and rows["Host"]["model"] > 0


@pytest.mark.skipif(not _status["opencl"].compiled, reason="OpenCL is not compiled into this build")
def test_opencl_without_usable_device_says_why(model_path):
    if _status["opencl"].devices:
        pytest.skip("this machine has an OpenCL device ggml-opencl accepts")
    with pytest.raises(NoDeviceError, match=r"backend 'opencl': compiled in, no device found; "
                                            r"ggml-opencl accepts only Adreno/Qualcomm and Intel") as e:
        LLM(model_path, backend="opencl")
    from polyllama import _llamacpp
    said = [line.split(":", 1)[1].strip() for line in _llamacpp.REGISTRATION_LOG.splitlines()
            if line.startswith("ggml_opencl:")]
    if said:   # e.g. PoCL's CPU device: ggml-opencl logged why it dropped it
        assert "; ggml said: " in str(e.value) and said[-1] in str(e.value)


@pytest.mark.skipif(not _status["vulkan"].compiled, reason="Vulkan is not compiled into this build")
def test_hidden_cpu_vulkan_device_is_reported(tmp_path):
    """Without GGML_VK_VISIBLE_DEVICES ggml-vulkan hides lavapipe; backends() must say so."""
    env = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    env = child_env(env)
    code = ("import json, polyllama as p; s = {b.name: b for b in p.backends()}['vulkan'];"
            "print(json.dumps([s.reason, [d.name for d in s.devices]]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    reason, names = json.loads(out.stdout.strip().splitlines()[-1])
    hardware = [d for d in _vk_devices if not d.software]
    if hardware:
        pytest.skip("a hardware Vulkan device is visible without the variable")
    if not any(d.software for d in _vk_devices):
        pytest.skip("no CPU-type Vulkan driver (lavapipe) is installed")
    assert names == []
    assert reason == ("Vulkan compiled in; 1 CPU-type device hidden, set GGML_VK_VISIBLE_DEVICES "
                      "to use it (e.g. GGML_VK_VISIBLE_DEVICES=0)")


_KV_LIMIT_CHILD = r"""
import sys
import polyllama
from polyllama import LLM, ContextError
model = sys.argv[1]
for what in ("estimate", "load"):
    try:
        if what == "estimate":
            polyllama.estimate_memory(model, n_ctx=1 << 20, backend="vulkan")
        else:
            LLM(model, backend="vulkan", n_ctx=1 << 20, n_gpu_layers=-1, fallback=False)
        print(what, "no error")
    except ContextError as e:
        print(what, "ContextError", e)
"""


@needs_vulkan
def test_kv_cache_beyond_a_vulkan_buffer_raises_instead_of_aborting(model_path):
    # lavapipe addresses 128 MiB per storage buffer; one layer of SmolLM2's KV cache at
    # n_ctx=2**20 is 384 MiB. ggml's scheduler aborted the process on that (estimate and
    # load alike) before polyllama asked the device first. Run in a child: a regression
    # would kill the interpreter.
    env = child_env()
    out = subprocess.run([sys.executable, "-c", _KV_LIMIT_CHILD, model_path], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    for what in ("estimate", "load"):
        line = next(x for x in lines if x.startswith(what + " "))
        assert "ContextError one layer of the KV cache at n_ctx=1048576 is 384 MiB, more than Vulkan0" in line


@needs_vulkan
def test_split_mode_row_on_vulkan_is_a_conflict_before_loading(model_path):
    # llama.cpp itself fails the load with "device Vulkan0 does not support split buffers"
    from polyllama import ConflictingArgumentsError
    for kw in (dict(backend="vulkan"), dict(device="vulkan:0")):
        with pytest.raises(ConflictingArgumentsError, match=r"split_mode='row' needs split buffers, which "
                                                            r"vulkan does not have; .* only sycl"):
            LLM(model_path, split_mode="row", n_threads=THREADS, n_ctx=256, **kw)


@needs_vulkan
def test_split_mode_tensor_skips_fitting_and_offloads_all(model_path, llm):
    # llama.cpp's common_fit_params refuses SPLIT_MODE_TENSOR; this was a false
    # InsufficientMemoryError ("Meta() needs 146 MiB, has 2048 MiB free")
    prompt = PROMPTS[0]
    with LLM(model_path, backend="vulkan", split_mode="tensor", n_threads=THREADS, n_ctx=256) as m:
        p = m.placement
        assert not p.fitted and p.n_gpu_layers == p.n_layers == m.metadata["n_layer"] + 1
        # the model sits on llama.cpp's meta device, named "Meta()" by the pinned ggml;
        # placement names the device it spans
        assert p.devices == ["Vulkan0"], p.devices
        ref = llm.generate(prompt, max_tokens=GREEDY_PREFIX).tokens
        assert m.generate(prompt, max_tokens=GREEDY_PREFIX).tokens == ref


@needs_vulkan
def test_device_sampling_is_refused_on_vulkan_and_off_by_default(model_path):
    # on lavapipe, a host-sampled request after greedy picks in the decode graph, in the
    # same slots, corrupted the heap inside ggml-vulkan (SIGSEGV / "corrupted double-linked
    # list"): the backend table does not allow it there, and the refusal comes before loading
    from polyllama import ConflictingArgumentsError
    with pytest.raises(ConflictingArgumentsError,
                       match=r"^device_sampling=True is not available on vulkan \(only on cpu, cuda\): "
                             r"it has not been seen to run safely there$"):
        LLM(model_path, backend="vulkan", device_sampling=True)
    # and the default leaves it off there, every layer offloaded or not (device_sampling=None)
    with LLM(model_path, backend="vulkan", n_gpu_layers=-1, n_ctx=512) as m:
        assert m.placement.n_gpu_layers == m.placement.n_layers and not m.placement.device_sampling
        m.generate("Hello", max_tokens=3)
        assert m.engine.stats()["tokens_picked_on_device"] == 0


@needs_vulkan
def test_a_margin_that_leaves_no_room_is_named_in_the_memory_error(model_path):
    # the free memory in the message is before the margin: without the margin named,
    # "needs 150 MiB, has 2048 MiB free" reads as a contradiction
    from polyllama import InsufficientMemoryError
    dev = _vk_devices[0]
    margin = dev.memory_free + (1 << 30)
    with pytest.raises(InsufficientMemoryError) as ei:
        LLM(model_path, backend="vulkan", memory_margin=margin, fallback=False, n_threads=THREADS, n_ctx=256)
    msg = str(ei.value)
    assert msg.startswith(("the model does not fit in free device memory: ",
                           "not even one layer fits in free device memory: ")), msg
    assert f"{dev.name} needs " in msg
    assert msg.endswith(f" MiB free (memory_margin keeps {margin / 2**20:.0f} MiB of each device free)"), msg
    assert ei.value.free[dev.name] > 0
