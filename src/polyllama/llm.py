"""LLM: a model loaded on the device of your choice, with generate / stream / chat / embed.

    llm = LLM("model.gguf", backend="auto")          # or "cpu", "cuda", device="cuda:1", ...
    llm.generate("The capital of France is", max_tokens=16).text
    for piece in llm.stream("Once upon a time", max_tokens=64): print(piece, end="")
    llm.chat([{"role": "user", "content": "Hi!"}]).text
    llm.generate(["prompt 1", "prompt 2"])             # decoded in parallel, results in order

Thread safety: one LLM serializes its calls with a lock; calls from several threads
wait for each other (a stream holds the lock until it is exhausted or closed).
"""
from __future__ import annotations

import array
import json
import logging
import math
import os
import re
import stat
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from ._llamacpp_loader import llamacpp
from .backend_table import BACKENDS, by_name
from .engine import Engine, Request, default_sample_threads
from .errors import (ConflictingArgumentsError, ContextError, ContextOverflowError, GrammarError,
                     InsufficientMemoryError, LoadAbortedError, ModelLoadError, PolyllamaError,
                     TemplateError)
from .gguf_check import check_gguf
from .default_model import default_model_path
from .placement import (DEFAULT_MARGIN, Candidate, Placement, check_kv_fits_devices, model_params,
                        real_device_names, resolve_candidates)
from .sampling import SamplingParams, build_sampler, is_plain_greedy

log = logging.getLogger("polyllama")


@dataclass
class GenerationResult:
    """The outcome of one generation."""
    text: str
    tokens: list[int]
    finish_reason: str                     # "stop", "length" or "cancelled"
    prompt_tokens: int
    generated_tokens: int
    time_to_first_token: float             # seconds, prompt processing included
    prompt_tokens_per_second: float
    generation_tokens_per_second: float
    # per step: the top n_probs (token, logprob) of the raw logits, best first, then the
    # sampled token when it is not among them
    logprobs: list[list[tuple[int, float]]] | None = None
    message: dict | None = None            # chat(): the parsed assistant message
    cached_tokens: int = 0                 # prompt tokens found in the KV cache (not recomputed)

    @property
    def stats(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
                "time_to_first_token": self.time_to_first_token,
                "prompt_tokens_per_second": self.prompt_tokens_per_second,
                "generation_tokens_per_second": self.generation_tokens_per_second,
                "cached_tokens": self.cached_tokens}


# token attributes (llama.h llama_token_attr): what parse_special decides on, and stripping
_GUARDED_ATTRS = 1 << 3 | 1 << 0        # CONTROL | UNKNOWN
_LSTRIP, _RSTRIP = 1 << 7, 1 << 8
_C_SPACE = " \t\n\v\f\r"                # isspace() in the C locale, as llama.cpp strips


def _strings_in(value):
    """Every str inside nested dicts/lists (messages, tools), without recursion."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            stack.extend(v.values())
            stack.extend(k for k in v if isinstance(k, str))
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


class ChatTurn:
    """What a chat template made of one turn, kept to parse the model's reply.
    prompt_tokens: the tokens the turn was submitted with (set by submit_chat)."""

    prompt_tokens: list | None = None

    def __init__(self, chat: dict):
        self.prompt = chat["prompt"]
        self._format = chat["format"]
        self._generation_prompt = chat["generation_prompt"]
        self._parser = chat["parser"]
        self._markers = bool(chat.get("preserved_tokens"))

    @property
    def structured(self) -> bool:
        """True when the reply may be more than its text: the template marks tool calls or
        reasoning (<tool_call>, <think>, ...) that parse() takes out. False: parse(text)
        gives the text back as the content, so a stream may pass the text on as it is."""
        return self._format != 0 and self._markers

    def parse(self, text: str, partial: bool = False) -> dict:
        """The assistant message in `text` as OpenAI-style JSON: content, and tool_calls
        where the template's format has them (libcommon's common_chat_parse). With
        partial=True, text is a reply still being generated."""
        try:
            msg = llamacpp.parse_chat_reply(self._format, self._generation_prompt, self._parser, text, partial)
        except PolyllamaError:
            msg = {"role": "assistant", "content": text}
        msg.setdefault("role", "assistant")
        return msg


class Tokenizer:
    """Only the vocabulary of a GGUF file (no weights are loaded): tokenize / detokenize."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        _check_model_file(self.path)
        check_gguf(self.path)
        self._model = _load_model(self.path, llamacpp.ModelParams(devices=[], n_gpu_layers=0, vocab_only=True))

    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self._model.tokenize(_utf8(text), add_special, parse_special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return self._model.detokenize(_token_list(tokens), False, special).decode("utf-8", "replace")

    def close(self) -> None:
        self._model.close()


# Lines of llama.cpp's log that only say *that* loading failed (or in which section of
# the file), not why.
_SECTION_LINES = ("failed to read header", "failed to read key-value pairs",
                  "failed to read tensor info", "failed to read tensor data")
_LOG_PREFIXES = ("llama_model_load: error loading model: ", "gguf_init_from_reader: ",
                 "gguf_init_from_file_impl: ", "llama_model_loader: ",
                 "llama_init_from_model: failed to initialize the context: ")


def _load_model(path: str, params, progress=None):
    """llamacpp.Model, with a ModelLoadError that names llama.cpp's reason rather than its
    last log line (which is always the generic "failed to load model").

    A progress callback that returns False stops loading with LoadAbortedError; one that
    raises stops it too, and its exception (Ctrl-C included) comes out unchanged.
    """
    stopped: list = []
    watched = None
    if progress is not None:
        def watched(fraction):
            try:
                ret = progress(fraction)
            except BaseException as e:   # noqa: BLE001 - re-raised once llama.cpp returns
                stopped.append(e)
                return False
            if ret is not None and not ret:
                stopped.append(None)
                return False
            return True
    try:
        return llamacpp.Model(path, params, watched)
    except ModelLoadError as e:
        if stopped:
            if stopped[0] is not None:
                raise stopped[0] from None
            raise LoadAbortedError(f"loading {path} was stopped by the progress callback "
                                   "(it returned False)", log=e.log) from None
        if not str(e).startswith("llama.cpp could not load"):
            raise                 # one of polyllama's own checks after the load: already specific
        # llama.cpp's error lines say why; its warnings (logged first) rarely do
        errors = [_clean_log_line(x) for x in llamacpp.recent_log_errors().splitlines()]
        errors = [x for x in errors if x and "failed to load model" not in x]
        if errors:
            reasons = list(dict.fromkeys(x for x in errors if x not in _SECTION_LINES)) or errors
            raise ModelLoadError(f"llama.cpp could not load {path}: {'; '.join(reasons[-3:])}. If the file "
                                 "is damaged or incomplete, download or convert it again.", log=e.log) from None
        specific, section = [], []
        for line in (e.log or "").splitlines():
            for prefix in _LOG_PREFIXES:
                if line.startswith(prefix):
                    line = line[len(prefix):]
            line = line.strip()
            if not line or "failed to load model" in line:
                continue
            (section if line in _SECTION_LINES else specific).append(line)
        reasons = list(dict.fromkeys(specific or section))
        if not reasons:
            raise
        raise ModelLoadError(f"llama.cpp could not load {path}: {'; '.join(reasons[:3])}. If the file "
                             "is damaged or incomplete, download or convert it again.", log=e.log) from None


def _clean_log_line(line: str) -> str:
    """A line of llama.cpp's log without its function-name prefix (and an abort's message
    without the build's relative path: llamacpp.clean_log_line)."""
    for prefix in _LOG_PREFIXES:
        if line.startswith(prefix):
            line = line[len(prefix):]
    return llamacpp.clean_log_line(line)


# the largest n_ctx (and n_batch, n_ubatch) an LLM takes
MAX_CTX = 1 << 24


def _check_batch_vs_sequences(n_ctx: int, n_batch: int, n_seq_max: int, meta: dict | None) -> None:
    """ValueError for contexts llama.cpp would abort in: every step can ask for one output
    per sequence, and llama.cpp reserves n_batch outputs (n_batch itself capped at n_ctx;
    GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max) in llama-context.cpp). n_ctx=0
    takes the file's context_length, which must then be usable too."""
    train = None
    if meta is not None:
        arch = meta.get("general.architecture")
        arch = arch.decode("utf-8", "replace") if isinstance(arch, bytes) else ""
        train = meta.get(f"{arch}.context_length")
        train = train if isinstance(train, int) and not isinstance(train, bool) else None
    if n_ctx == 0 and train is not None and not 1 <= train <= MAX_CTX:
        raise ValueError(f"n_ctx=0 takes the model's context_length, which is {train}; pass an n_ctx between "
                         f"1 and {MAX_CTX}")
    ctx = n_ctx or train
    if n_batch < n_seq_max:
        raise ValueError(f"n_batch ({n_batch}) must be at least n_seq_max ({n_seq_max}): one step decodes a "
                         "token for each sequence; raise n_batch or lower n_seq_max")
    if ctx is not None and ctx < n_seq_max:
        raise ValueError(f"n_ctx ({ctx}) must be at least n_seq_max ({n_seq_max}): llama.cpp caps the batch at "
                         "the context size and one step decodes a token for each sequence; raise n_ctx or "
                         "lower n_seq_max")


def _check_model_file(path: str) -> os.stat_result:
    """ModelLoadError unless path is a readable regular file: llama.cpp would read /dev/zero
    forever, block on a FIFO, and report a directory as a damaged file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ModelLoadError(f"model file not found: {path}") from None
    except OSError as e:
        raise ModelLoadError(f"cannot read the model file {path}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelLoadError(f"the model path {path} is a directory; give the path of a .gguf file")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a character device" if stat.S_ISCHR(st.st_mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "a block device" if stat.S_ISBLK(st.st_mode)
                else "not a regular file")
        raise ModelLoadError(f"the model path {path} is {kind}, not a regular file; give the path of a .gguf file")
    if not os.access(path, os.R_OK):
        raise ModelLoadError(f"cannot read the model file {path}: permission denied")
    return st


def _allocation_failed(e: Exception) -> bool:
    """Whether llama.cpp's log or message says a buffer allocation failed."""
    text = ((getattr(e, "log", "") or "") + " " + str(e)).lower()
    return "failed to allocate" in text or "unable to allocate" in text or "out of memory" in text


def _tool_name(tool) -> str:
    """The name of an OpenAI-style tool definition ({"function": {"name": ...}} or
    {"name": ...}); "" for anything else, which libcommon's template may still accept."""
    if not isinstance(tool, dict):
        return ""
    fn = tool.get("function")
    name = (fn if isinstance(fn, dict) else tool).get("name")
    return name if isinstance(name, str) else ""


# llama.cpp takes a text's length as an int32_t (llama_tokenize)
_MAX_TEXT_BYTES = (1 << 31) - 1


def _utf8(text, what: str = "text") -> bytes:
    """UTF-8 bytes of text; ValueError for what cannot be UTF-8 (llama.cpp's tokenizers
    expect valid UTF-8: lone surrogates in a str, invalid sequences in bytes) and for more
    than 2**31-1 bytes, checked before encoding (a str has at least a byte per character)."""
    if isinstance(text, (str, bytes, bytearray, memoryview)) and len(text) > _MAX_TEXT_BYTES:
        raise ValueError(f"{what} is {len(text)} {'characters' if isinstance(text, str) else 'bytes'} long; "
                         f"llama.cpp takes at most {_MAX_TEXT_BYTES} bytes of text at once: split it")
    if isinstance(text, str):
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{what} contains {text[e.start]!r} at index {e.start}, a lone surrogate that "
                             "is not valid in UTF-8; clean it first, e.g. "
                             "s.encode('utf-8', 'replace').decode()") from None
    if isinstance(text, (bytes, bytearray, memoryview)):
        data = bytes(text)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start}); decode it "
                             "with errors='replace' first, or pass a str") from None
        return data
    raise TypeError(f"{what} must be str or bytes, not {type(text).__name__}")


def _check_token_ids(prompt) -> None:
    """TypeError naming what is wrong in a list meant as token ids (or as prompts)."""
    kinds = {type(t) for t in prompt}
    if any(isinstance(t, (str, list, tuple)) for t in prompt) and any(isinstance(t, int) for t in prompt):
        raise TypeError("a prompt list holds either prompts (strings or token-id lists) or token ids, not "
                        f"both: got {', '.join(sorted(k.__name__ for k in kinds))}")
    for i, t in enumerate(prompt):
        if isinstance(t, bool) or not isinstance(t, int):
            raise TypeError(f"token ids must be ints, not {type(t).__name__} ({t!r} at index {i})")


def _token_list(tokens) -> list[int]:
    if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__"):
        raise TypeError("tokens must be a sequence of ints")
    tokens = list(tokens)
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int):
            raise TypeError(f"token ids must be ints, got {t!r}")
    return tokens


def _available_host_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class LLM:
    """A GGUF model loaded onto the chosen device(s), with one context.

    model: path of a .gguf file; None loads the embedded default (SmolLM2-135M-Instruct).
    backend: "auto" (default, or $POLYLLAMA_BACKEND), "cpu", "cuda", "hip", "sycl", "metal",
        "vulkan", "opencl", "rpc". "cpu" means no offload at all.
    device: an int (ggml device index), "cuda:1", a ggml device name ("Vulkan0"), or a
        list of them to spread the model over several devices ($POLYLLAMA_DEVICE).
    n_gpu_layers: "auto" fits the layers to free device memory with llama.cpp's
        common_fit_params (as `llama-cli -fit`); an int offloads that many (-1: all).
    split_mode / tensor_split / main_device: how layers are spread over several devices.
    fallback: with backend="auto", try the next backend when one does not fit or fails.
    n_ctx: context size in tokens (0: the model's training context, fitted to memory).
    n_seq_max: how many prompts generate([...]) decodes in parallel.
    kv_unified: True (default): one KV cache shared by all sequences, so a single prompt
        may fill all of n_ctx and parallel prompts share it. False: llama.cpp gives each of
        the n_seq_max sequences its own n_ctx/n_seq_max cells (rounded up to a multiple of
        256, n_ctx growing to match) and attends to each apart, which is faster with many
        parallel prompts (llama-batched-bench's default), but one prompt then gets only
        that share.
    progress: callable(fraction) called while the model loads; return False to abort.
    rpc_servers: "host:port" endpoints of `python -m polyllama rpc-server`; their devices
        are registered (see polyllama.add_rpc_server) before the placement is resolved.
        Without device=, layers go to those servers' devices (split by tensor_split) and
        whatever n_gpu_layers leaves over stays on the local CPU; to add a local GPU, list
        it with the remote devices in device=. docs/MORE_THAN_ONE_MACHINE.md.
    rpc_timeout: seconds one call that reaches a remote device (load, decode, free) may
        take before its server counts as lost (default polyllama.rpc.DEFAULT_TIMEOUT). A
        server that dies is noticed at once; this bounds one that hangs.
    n_threads_sample: threads that pick the next tokens between two decodes (None: 1 when
        the model runs on the CPU, whose cores ggml needs; half the cores, at most 8, when
        it is offloaded). They share the arg-max scans over the logits: a sequence each
        when many run, ranges of one sequence's logits when few do.
    device_sampling: whether a step whose outputs are all plain greedy picks makes them
        inside the decode graph, one arg-max over all rows, so that only the token ids come
        back from the device instead of n_vocab logits each (thirdparty patch 0004). A step
        with a request that needs logits (logprobs, a sampler chain, logits()) reads them
        all on the host. None (default): on where the backend table makes it the default
        (CUDA) and every layer, the output layer included, is on such GPUs without tensor
        parallelism or RPC; there it lifted 64 prompts from 93-95% to 114-130% of
        llama-batched-bench on an H100 (docs/benchmarks.md), off elsewhere (Placement.
        device_sampling says which). True asks for it where the table allows it (CPU, CUDA;
        ConflictingArgumentsError elsewhere, because on lavapipe an earlier, per-sequence
        form corrupted ggml-vulkan's heap, and with split_mode="tensor" over several
        devices); never through RPC. False: always on the host.
    """

    def __init__(self, model: str | os.PathLike | None = None, *, backend: str | None = None,
                 device=None, n_gpu_layers: int | str = "auto", split_mode: str | None = None,
                 tensor_split: Sequence[float] | None = None, main_device=None,
                 fallback: bool = True, n_ctx: int = 4096, n_batch: int = 2048,
                 n_ubatch: int = 512, n_threads: int | None = None,
                 n_threads_batch: int | None = None, n_threads_sample: int | None = None,
                 n_seq_max: int = 8, kv_unified: bool = True,
                 flash_attn: str = "auto", memory_margin: int = DEFAULT_MARGIN,
                 progress: Callable[[float], Any] | None = None, chat_template: str | None = None,
                 rpc_servers: Sequence[str] | None = None, rpc_timeout: float | None = None,
                 use_mmap: bool = True, device_sampling: bool | None = None):
        # guards loading, close() and what reads the model outside the engine; generation
        # runs in the engine, which serializes nothing per thread (requests batch together)
        self._lock = threading.RLock()
        self._model = None
        self._ctx = None
        self._engine: Engine | None = None
        self._embed_ctx = None
        self._model_fd = None
        path = default_model_path() if model is None else model
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"model must be a path, not {type(path).__name__}")
        self.model_path = os.fspath(path)
        self._file_size = _check_model_file(self.model_path).st_size
        # values llama.cpp would abort on (docs/HARDENING.md); the metadata is kept for
        # the device-limit check of _load
        self._gguf_meta = check_gguf(self.model_path)
        for name, v in (("n_ctx", n_ctx), ("n_batch", n_batch), ("n_ubatch", n_ubatch),
                        ("n_seq_max", n_seq_max)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int, not {v!r}")
        if n_ctx < 0 or n_ctx > MAX_CTX:
            raise ValueError(f"n_ctx must be between 0 and {MAX_CTX}, got {n_ctx}")
        for name, v in (("n_batch", n_batch), ("n_ubatch", n_ubatch)):
            if not 1 <= v <= MAX_CTX:
                raise ValueError(f"{name} must be between 1 and {MAX_CTX}, got {v} (n_batch and n_ubatch "
                                 "are tokens per llama_decode and per micro-batch)")
        if not (1 <= n_seq_max <= 256):
            raise ValueError(f"n_seq_max must be between 1 and 256, got {n_seq_max}")
        _check_batch_vs_sequences(n_ctx, n_batch, n_seq_max, self._gguf_meta)
        if not isinstance(use_mmap, bool):
            raise TypeError(f"use_mmap must be True or False, not {use_mmap!r}")
        self._use_mmap = use_mmap
        if device_sampling is not None and not isinstance(device_sampling, bool):
            raise TypeError(f"device_sampling must be None, True or False, not {device_sampling!r}")
        self._device_sampling = device_sampling
        if flash_attn not in ("auto", "on", "off"):
            raise ValueError(f"flash_attn must be 'auto', 'on' or 'off', not {flash_attn!r}")
        if progress is not None and not callable(progress):
            raise TypeError("progress must be callable(fraction)")
        threads = n_threads if n_threads is not None else (os.cpu_count() or 4)
        for name, v in (("n_threads", threads), ("n_threads_batch", n_threads_batch),
                        ("n_threads_sample", n_threads_sample)):
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be a positive int or None, not {v!r}")
            if not 1 <= v <= 1024:
                raise ValueError(f"{name} must be between 1 and 1024, got {v}")
        if not isinstance(fallback, bool):
            raise TypeError(f"fallback must be True or False, not {fallback!r}")
        if not isinstance(kv_unified, bool):
            raise TypeError(f"kv_unified must be True or False, not {kv_unified!r}")
        # llama.cpp's fit reads the margin as int64_t: from 2**63 on it wrapped to a deficit,
        # and every layer "fitted" on a 2 GiB device (lavapipe, 2026-11-26)
        if (isinstance(memory_margin, bool) or not isinstance(memory_margin, int)
                or not 0 <= memory_margin < 1 << 63):
            raise ValueError(f"memory_margin must be a number of bytes >= 0 and below 2**63, got {memory_margin!r}")
        if chat_template is not None and not isinstance(chat_template, str):
            raise TypeError(f"chat_template must be a Jinja template string or None, not "
                            f"{type(chat_template).__name__}")
        if chat_template:
            _utf8(chat_template, "chat_template")
        self._chat_template = chat_template or ""
        self._cparams = dict(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=n_seq_max,
                             n_threads=threads, n_threads_batch=n_threads_batch or threads,
                             flash_attn=flash_attn, kv_unified=kv_unified)
        self._n_threads_sample = n_threads_sample

        if rpc_timeout is not None and (isinstance(rpc_timeout, bool)
                                        or not isinstance(rpc_timeout, (int, float))):
            raise TypeError(f"rpc_timeout must be a number of seconds, not {rpc_timeout!r}")
        if rpc_servers is not None and not isinstance(rpc_servers, str) and (
                not isinstance(rpc_servers, (list, tuple)) or not all(isinstance(e, str) for e in rpc_servers)):
            raise TypeError(f"rpc_servers must be a list of 'host:port' strings, not {rpc_servers!r}")
        if rpc_timeout is not None and not rpc_timeout > 0:
            raise ValueError(f"rpc_timeout must be a positive number of seconds, got {rpc_timeout!r}")
        if rpc_servers:
            # register the remote devices first so backend="rpc" / device="rpc:N" can see them
            from .rpc import add_rpc_server
            remote: list[str] = []
            for endpoint in ([rpc_servers] if isinstance(rpc_servers, str) else rpc_servers):
                remote += [n for n in add_rpc_server(endpoint) if n not in remote]
            if device is None and (backend or "auto") in ("auto", "rpc") \
                    and not os.environ.get("POLYLLAMA_DEVICE"):
                # the servers named here, not every RPC device this process has seen
                device = remote
        candidates, skipped = resolve_candidates(backend, device, n_gpu_layers, split_mode,
                                                 tensor_split, main_device)
        for cand in candidates:
            cand.rpc_timeout = rpc_timeout
        for reason in skipped:
            log.info("polyllama: skipped %s", reason)
        last_error: Exception | None = None
        for i, cand in enumerate(candidates):
            is_last = i == len(candidates) - 1
            try:
                self._load(cand, memory_margin, progress, skipped)
                break
            except LoadAbortedError:
                raise   # the caller asked to stop: no other candidate
            except (InsufficientMemoryError, ModelLoadError, ContextError) as e:
                if not fallback or is_last:
                    raise
                last_error = e
                reason = f"{cand.backend} ({cand.describe()}): {e}"
                skipped.append(reason)
                log.warning("polyllama: %s; trying the next candidate", reason)
        else:  # pragma: no cover - the loop always breaks or raises
            raise last_error or PolyllamaError("no candidate placement")
        if self._chat_template:
            # a template that cannot format one message would fail every chat(): say so now
            try:
                self._model.apply_chat_template(json.dumps([{"role": "user", "content": "Hello"}]), "", "",
                                                True, self._chat_template)
            except TemplateError as e:
                self.close()
                raise TemplateError(f"chat_template cannot be used ({e}); pass a valid Jinja chat "
                                    "template, or None for the one in the model file") from None

    # ---- loading ------------------------------------------------------------------------
    def _load(self, cand: Candidate, margin: int, progress, skipped: list[str]) -> None:
        # each backend the model would run on: a device list may mix them (its candidate is
        # then named "cuda+vulkan", which the backend table does not know)
        backends = [by_name(b) for b in dict.fromkeys(d.backend for d in cand.devices)] or [by_name("cpu")]
        tensor_parallel = cand.split_mode == "tensor" and len(cand.devices) > 1
        refused = [b.name for b in backends if not b.device_sampling]
        if self._device_sampling and refused:
            allowed = ", ".join(b.name for b in BACKENDS if b.device_sampling)
            raise ConflictingArgumentsError(
                f"device_sampling=True is not available on {refused[0]} (only on {allowed}): "
                "it has not been seen to run safely there")
        if self._device_sampling and tensor_parallel:
            # llama.cpp's own backend sampling refuses tensor parallelism, and the graph's
            # pick (patch 0004) has not run on its meta device
            raise ConflictingArgumentsError(
                "device_sampling=True cannot be combined with split_mode='tensor': the pick in the "
                "decode graph has not run on llama.cpp's tensor-parallel device; use split_mode='layer' "
                "or device_sampling=False")
        check_kv_fits_devices(self._gguf_meta, self._cparams["n_ctx"], cand)
        mp = model_params(cand)
        mp.use_mmap = self._use_mmap
        cp = llamacpp.ContextParams(**self._cparams)
        fitted = False
        if cand.devices and cand.n_gpu_layers == "auto":
            status = llamacpp.fit_params(self.model_path, mp, cp, [margin] * len(cand.devices),
                                     n_ctx_min=min(self._cparams["n_ctx"] or 4096, 4096))
            if status != "success":
                raise self._memory_error(cand, cp, "the model does not fit in free device memory", margin)
            fitted = True
            if mp.n_gpu_layers == 0:
                # llama.cpp's fit left every layer on the host: this candidate adds nothing
                raise self._memory_error(cand, cp, "not even one layer fits in free device memory", margin)
        if not cand.devices:
            self._check_host_memory(cand, cp)
        try:
            model = _load_model(self.model_path, mp, progress)
        except LoadAbortedError:
            raise
        except ModelLoadError as e:
            # an explicit n_gpu_layers that does not fit: llama.cpp fails to allocate a buffer
            if cand.devices and _allocation_failed(e):
                err = self._memory_error(cand, cp, "the model does not fit in device memory with "
                                         f"n_gpu_layers={cand.n_gpu_layers} (use fewer, or 'auto')")
                err.log = e.log
                raise err from None
            raise
        try:
            ctx = llamacpp.Context(model, cp)
        except ContextError as e:
            model.close()
            if _allocation_failed(e):
                err = self._memory_error(cand, cp, f"the context (n_ctx={self._cparams['n_ctx']}) does not "
                                         "fit in memory; use a smaller n_ctx or n_seq_max")
                err.log = e.log
                raise err from None
            raise
        except BaseException:
            model.close()
            raise
        self._model, self._ctx = model, ctx
        if self._use_mmap:
            # the weights are read from the file's pages as they are used: a file truncated in
            # place would end the process with SIGBUS at the next decode. An open descriptor
            # lets each request check the size first (_check_file)
            try:
                self._model_fd = os.open(self.model_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                self._model_fd = None
        on_gpu = bool(cand.devices) and any(d.backend != "rpc" for d in cand.devices)
        offloaded = on_gpu and mp.n_gpu_layers != 0
        # aligned slot regions buy exact CPU results (ARCHITECTURE.md §6.3) for some unused
        # cells; GPU kernels are not exact across batch shapes anyway, so they go without
        n_sample = self._n_threads_sample or default_sample_threads(offloaded)
        n_layers = model.n_layer + 1
        ngl = mp.n_gpu_layers
        ngl = 0 if not cand.devices else (n_layers if ngl < 0 else min(ngl, n_layers))
        device_sampling = self._device_sampling
        if device_sampling is None:
            # the output layer is the last of llama.cpp's n_layer + 1 slots: with fewer
            # offloaded it, and so the arg-max, runs on the CPU, whose kernel is one thread's.
            # Never through RPC (its table entry), where llama_decode runs on a worker thread
            device_sampling = (ngl == n_layers and all(b.device_sampling_default for b in backends)
                               and not tensor_parallel)
        self._engine = Engine(self, llamacpp.Engine(ctx, n_sample,
                                                aligned_regions=not offloaded,
                                                device_sampling=device_sampling))
        mem = ctx.memory()
        # split_mode="tensor" reports one "Meta()" device: name the real ones
        used = real_device_names([r["device"] for r in mem[:-1] if r["model"] > 0], cand.devices)
        self.placement = Placement(backend=cand.backend if ngl > 0 else "cpu",
                                   devices=used if ngl > 0 and used else ["CPU"],
                                   n_gpu_layers=ngl, n_layers=n_layers, memory=mem,
                                   skipped=list(skipped), fitted=fitted,
                                   device_sampling=device_sampling,
                                   remote={d.name: d.description for d in cand.devices
                                           if d.backend == "rpc"})
        log.info("polyllama: %s", self.placement)

    # Below this context size even large models' KV caches are a few GiB; the estimate
    # (a metadata-only load, ~0.15 s for the default model) is skipped there.
    HOST_CHECK_MIN_CTX = 8192

    def _check_host_memory(self, cand: Candidate, cp) -> None:
        """InsufficientMemoryError when the CPU context would not fit in available RAM.

        llama.cpp allocates and clears the whole KV cache up front: a context larger than
        free memory either fails to allocate or, within overcommit, swaps the machine to a
        halt or gets the process OOM-killed.
        """
        n_ctx = self._cparams["n_ctx"]
        if n_ctx and n_ctx <= self.HOST_CHECK_MIN_CTX:
            return
        avail = _available_host_memory()
        if avail is None:
            return
        est = llamacpp.estimate_memory(self.model_path, model_params(cand), cp)
        needed = sum(r["context"] + r["compute"] for r in est["devices"])
        if needed > avail:
            raise InsufficientMemoryError(
                f"n_ctx={n_ctx or est['n_ctx_train']} needs {needed / 2**20:.0f} MiB of host memory for the "
                f"KV cache and compute buffers, but {avail / 2**20:.0f} MiB are available; use a smaller "
                "n_ctx (or n_seq_max)", needed={"Host": needed}, free={"Host": avail})

    def _memory_error(self, cand: Candidate, cp, what: str, margin: int | None = None) -> InsufficientMemoryError:
        """InsufficientMemoryError with llama.cpp's estimate of a full offload vs free memory;
        `margin` where the fit kept it free, else "needs 400 MiB, has 1,000 MiB free" reads as
        a contradiction (seen with a large memory_margin on 2 x H200, 2026-11-26)."""
        est = llamacpp.estimate_memory(self.model_path, model_params(cand), cp)
        needed = {r["device"]: r["model"] + r["context"] + r["compute"] for r in est["devices"]}
        free = {r["device"]: r["free"] for r in est["devices"]}
        msg = f"{what}: " + ", ".join(f"{d} needs {needed[d] / 2**20:.0f} MiB, has {free[d] / 2**20:.0f} MiB free"
                                      for d in needed if d != "Host")
        if margin:
            msg += f" (memory_margin keeps {margin / 2**20:.0f} MiB of each device free)"
        return InsufficientMemoryError(msg, needed=needed, free=free)

    # ---- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        """Free the context(s) and the model (device memory too). Idempotent."""
        with self._lock:
            if self._engine is not None:
                self._engine.close()     # fails what still runs, waits for its threads
            if self._embed_ctx is not None:
                self._embed_ctx[1].close()
            if self._ctx is not None:
                self._ctx.close()
            if self._model is not None:
                self._model.close()
            self._engine = self._embed_ctx = self._ctx = self._model = None
            fd, self._model_fd = getattr(self, "_model_fd", None), None
            if fd is not None:
                os.close(fd)

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # LLM and its Engine refer to each other, so the cyclic GC runs this at any allocation;
        # a Ctrl-C that Python raises in here is lost ("Exception ignored"): do as little
        # Python as possible when there is nothing left to free
        if getattr(self, "_model", None) is None and getattr(self, "_ctx", None) is None:
            return
        try:
            self.close()
        except Exception:
            pass

    def _require(self):
        if self._ctx is None:
            raise PolyllamaError("this LLM is closed")
        if self._engine is not None and self._engine._eng is not None and self._engine._eng.forked:
            raise PolyllamaError(llamacpp.FORKED_MESSAGE)
        return self._ctx

    def _check_file(self) -> None:
        """ModelLoadError when the memory-mapped model file shrank since it was loaded: its
        missing pages would raise SIGBUS inside llama.cpp (a file replaced by rename keeps
        the old inode mapped and is harmless)."""
        fd = getattr(self, "_model_fd", None)
        if fd is None:
            return
        try:
            size = os.fstat(fd).st_size
        except OSError:
            return
        if size < self._file_size:
            raise ModelLoadError(
                f"the model file {self.model_path} was truncated on disk while loaded ({self._file_size} -> "
                f"{size} bytes); its weights are read from the file as they are used, so this LLM cannot "
                "run any more. Load the model again, or pass use_mmap=False to read it into memory")

    def cancel(self) -> None:
        """Stop every generation of this LLM running in other threads; each ends with
        finish_reason="cancelled" at the engine's next step."""
        eng = self._engine
        if eng is not None:
            eng.cancel_all()

    @property
    def engine(self) -> Engine:
        """The sequence engine every generation of this LLM runs through (polyllama.Engine):
        submit() requests and drive them yourself, e.g. from a server."""
        self._require()
        return self._engine

    def _context_lost(self) -> None:
        """An RPC server was lost during a decode: a thread stays blocked in the context,
        so it and its model must never be freed (they leak; see MORE_THAN_ONE_MACHINE.md)."""
        ctx = self._ctx
        if ctx is not None:
            ctx.abandon()

    # ---- facts --------------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return self._require().n_ctx

    @property
    def metadata(self) -> dict:
        """Architecture, parameters, training context, vocabulary, chat template, quantization."""
        with self._lock:
            self._require()
            return self._metadata(self._model)

    @staticmethod
    def _metadata(m) -> dict:
        meta = m.metadata()
        return {
            "architecture": meta.get("general.architecture", ""),
            "name": meta.get("general.name", ""),
            "description": m.description(),
            "n_params": m.n_params,
            "size_bytes": m.size,
            "n_ctx_train": m.n_ctx_train,
            "n_layer": m.n_layer,
            "n_embd": m.n_embd,
            "n_head": m.n_head,
            "n_vocab": m.n_vocab,
            "chat_template": m.chat_template(),
            "quantization": m.description().split()[-1] if m.description() else "",
            "file_type": meta.get("general.file_type", ""),
            "gguf": meta,
        }

    # ---- tokens -------------------------------------------------------------------------
    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of text (str, or bytes taken as UTF-8)."""
        for name, v in (("add_special", add_special), ("parse_special", parse_special)):
            if not isinstance(v, bool):
                raise TypeError(f"{name} must be True or False, not {v!r}")
        with self._lock:   # close() from another thread waits; an open stream on this thread does not block it
            self._require()
            return self._model.tokenize(_utf8(text), add_special, parse_special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        """Text of token ids (invalid UTF-8 across token boundaries is replaced)."""
        with self._lock:
            self._require()
            return self._model.detokenize(_token_list(tokens), False, special).decode("utf-8", "replace")

    def token_piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (a piece may hold part of a UTF-8 character). special=True
        renders control tokens (<|im_end|>) as their text."""
        if isinstance(token, bool) or not isinstance(token, int):
            raise TypeError(f"token must be an int, not {token!r}")
        self._require()
        return self._model.token_to_piece(token, special)

    @staticmethod
    def _check_prompt_type(prompt) -> None:
        """The type errors of _prompt_tokens, raised before a stream starts."""
        if prompt is None:
            raise TypeError("prompt must be a string (or a list of token ids), not None")
        if not isinstance(prompt, (str, list, tuple)):
            raise TypeError(f"prompt must be a non-empty string or list of token ids, not {type(prompt).__name__}")

    def _prompt_tokens(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty")
            tokens = self._model.tokenize(_utf8(prompt, "the prompt"), True, True)
            if not tokens:
                raise ValueError(f"the prompt {prompt[:40]!r} gives no tokens: llama.cpp's tokenizer dropped all "
                                 "of it (characters this model's vocabulary has no token for, such as some "
                                 "control characters)")
            return tokens
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            n_vocab = self._model.n_vocab
            bad = next((t for t in prompt if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise ValueError(f"token id {bad} in the prompt is out of range 0..{n_vocab - 1}")
            return list(prompt)
        if isinstance(prompt, (list, tuple)) and prompt:
            _check_token_ids(prompt)
        if prompt is None:
            raise TypeError("prompt must be a string (or a list of token ids), not None")
        raise TypeError(f"prompt must be a non-empty string or list of token ids, not {type(prompt).__name__}")

    def logits(self, prompt: str | list[int]) -> "array.array":
        """llama.cpp's logits for the token after `prompt` (n_vocab floats, array('f'))."""
        with self._lock:
            self._require()
            self._check_file()
            n_ctx = self._ctx.n_ctx_seq
            tokens = self._fit_prompt(self._prompt_tokens(prompt), SamplingParams(), False, n_ctx)
            req = self._engine._submit_tokens(tokens, limit=n_ctx, logits_only=True)
        req.result()
        return req.logits

    # ---- generation ---------------------------------------------------------------------
    def _grammar_for(self, params: SamplingParams) -> str | None:
        schema = params.schema_text()
        if schema is not None:
            return llamacpp.json_schema_to_grammar(schema)
        return params.grammar

    def _fit_prompt(self, tokens: list[int], params: SamplingParams, truncate: bool, n_ctx: int) -> list[int]:
        if len(tokens) < n_ctx:
            return tokens
        if not truncate:
            raise ContextOverflowError(
                f"the prompt has {len(tokens)} tokens but the context holds {n_ctx}; "
                "use a larger n_ctx, a shorter prompt, or truncate=True")
        keep = n_ctx - min(params.max_tokens or 1, n_ctx // 2)
        head = tokens[:1] if self._model.add_bos and tokens and tokens[0] == self._model.token_bos else []
        return head + tokens[len(tokens) - (keep - len(head)):]

    def _submit(self, prompt, params: SamplingParams, truncate: bool, *, grammar: str | None = None,
                lazy_patterns=None, prefill=(), limit: int = 0, seed_offset: int = 0) -> Request:
        """Tokens, sampler and limits of one prompt, queued in the engine."""
        self._check_prompt_type(prompt)
        with self._lock:   # close() waits for this, not for the generation
            self._require()
            self._check_file()
            limit = limit or self._ctx.n_ctx_seq
            tokens = self._fit_prompt(self._prompt_tokens(prompt), params, truncate, limit)
            if grammar is None:
                grammar = self._grammar_for(params)
            greedy = is_plain_greedy(params, grammar)
            sampler = None
            if not greedy:
                p = params
                if seed_offset and params.seed is not None:
                    p = SamplingParams.from_kwargs(params, seed=(params.seed + seed_offset) & 0xFFFFFFFF)
                sampler = build_sampler(llamacpp, self._model, p, grammar, lazy_patterns, prefill)
            return self._engine._submit_tokens(
                tokens, max_tokens=params.max_tokens or -1, limit=limit, n_probs=params.n_probs,
                greedy=greedy, banned=self._model.token_eos if params.ignore_eos else -1,
                ignore_eos=params.ignore_eos, stops=params.stop, sampler=sampler)

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None, *,
               truncate: bool = False, **kwargs) -> Iterator[str]:
        """Yield the generated text piece by piece as tokens arrive (whole characters only).

        The request is queued at once (argument and prompt errors are raised here); closing
        the iterator early, or dropping it, cancels it."""
        params = SamplingParams.from_kwargs(params, **kwargs)
        self._require()
        if isinstance(prompt, (list, tuple)) and any(isinstance(p, (str, list, tuple)) for p in prompt):
            raise TypeError("stream() takes one prompt (a str or a list of token ids); "
                            "pass a list of prompts to generate() instead")
        return self._submit(prompt, params, truncate).text_stream()

    @staticmethod
    def _is_prompt_list(prompt) -> bool:
        """A list of prompts (strings or token-id lists), as opposed to one prompt of ids."""
        return (isinstance(prompt, (list, tuple)) and bool(prompt)
                and all(isinstance(p, str) or (isinstance(p, (list, tuple)) and not isinstance(p, str))
                        for p in prompt))

    def generate(self, prompt, params: SamplingParams | None = None, *, truncate: bool = False,
                 **kwargs):
        """Complete a prompt (str or token ids), or a list of prompts decoded in parallel.

        Returns a GenerationResult, or a list of them in input order for a list of prompts
        (strings or token-id lists). Keyword arguments are SamplingParams fields
        (max_tokens=16, temperature=0.7, ...).
        """
        params = SamplingParams.from_kwargs(params, **kwargs)
        self._require()
        if isinstance(prompt, (list, tuple)) and not prompt:
            raise ValueError("the prompt list is empty")
        if self._is_prompt_list(prompt):
            return self._generate_batch(list(prompt), params, truncate)
        return self._submit(prompt, params, truncate).result()

    def _generate_batch(self, prompts: list, params: SamplingParams, truncate: bool) -> list[GenerationResult]:
        """Every prompt is a request of the engine: up to n_seq_max decode together, the
        rest join as others finish. Prompt i samples with seed + i."""
        n_ctx, n_ctx_seq = self._ctx.n_ctx, self._ctx.n_ctx_seq
        # without max_tokens a request runs until its limit; the prompts share the context
        limit = n_ctx_seq if params.max_tokens else max(1, min(n_ctx // len(prompts), n_ctx_seq))
        reqs: list[Request] = []
        try:
            for i, p in enumerate(prompts):
                reqs.append(self._submit(p, params, truncate, limit=limit, seed_offset=i))
            return [r.result() for r in reqs]
        except BaseException:
            for r in reqs:
                r.cancel()
            raise

    # ---- chat ---------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict], *, tools: list[dict] | None = None,
                            add_generation_prompt: bool = True, json_schema: str = "",
                            tool_choice: str = "auto", parallel_tool_calls: bool | None = None) -> dict:
        """The prompt (and grammar) llama.cpp's chat code makes of OpenAI-style messages.

        tool_choice: "auto", "required" (the reply must be a tool call) or "none" (the tools
        stay in the prompt, no tool-call grammar); parallel_tool_calls: None for what the
        template supports, as llama-server."""
        self._require()
        if tool_choice not in ("auto", "required", "none"):
            raise ValueError(f"tool_choice must be 'auto', 'required' or 'none', not {tool_choice!r}")
        if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
            raise TypeError(f"parallel_tool_calls must be True, False or None, not {parallel_tool_calls!r}")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...}")
        for m in messages:
            if not isinstance(m, dict) or "role" not in m:
                raise ValueError(f"each message needs a 'role' (and usually 'content'): {m!r}")
        if tools is not None and not isinstance(tools, list):
            raise TypeError(f"tools must be a list of OpenAI-style tool definitions, not {type(tools).__name__}")
        try:
            as_json = json.dumps(messages, ensure_ascii=False, allow_nan=False)
            tools_json = json.dumps(tools, ensure_ascii=False, allow_nan=False) if tools else ""
        except RecursionError:
            raise ValueError("messages or tools are nested too deeply to be turned into JSON") from None
        except ValueError as e:
            # json's only ValueError with allow_nan=False (circular references aside)
            raise ValueError(f"messages and tools must be valid JSON, which has no NaN or infinity ({e}); "
                             "give numbers that are finite, or strings") from None
        except TypeError as e:
            raise TypeError(f"messages and tools must be JSON-serializable (str, numbers, lists, "
                            f"dicts): {e}") from None
        _utf8(as_json, "messages")
        _utf8(tools_json, "tools")
        return self._model.apply_chat_template(
            as_json, tools_json, json_schema, add_generation_prompt, self._chat_template, True,
            tool_choice, -1 if parallel_tool_calls is None else int(parallel_tool_calls))

    # ---- special tokens in chat content ----------------------------------------------------
    def _special_tokens(self):
        """The model's special tokens (llamacpp.Model.special_tokens), and a regex matching the
        text of those that tokenizing with parse_special=True turns into control tokens."""
        cached = getattr(self, "_specials_cache", None)
        if cached is None or cached[0] is not self._model:
            specials = self._model.special_tokens()
            guarded = [text for _, text, attr in specials if attr & _GUARDED_ATTRS]
            pattern = re.compile("|".join(re.escape(t) for t in guarded)) if guarded else None
            cached = self._specials_cache = (self._model, specials, pattern)
        return cached[1], cached[2]

    def _chat_prompt_tokens(self, chat: dict, messages, tools, json_schema: str, parse_special: bool,
                            **template_args) -> list[int]:
        """The tokens of a chat prompt: the template's special-token text as special tokens,
        special-token text that came from the messages (or tools) as plain text unless
        parse_special (what user content cannot then do: end a turn, open a system turn).

        Which is which: the template is rendered a second time with that text in the
        messages replaced by as many private-use characters; a special token whose text
        reads the same in both renders is the template's."""
        prompt = chat["prompt"]
        if parse_special:
            return self._prompt_tokens(prompt)
        specials, pattern = self._special_tokens()
        if pattern is None or not any(pattern.search(t) for t in _strings_in((messages, tools))):
            return self._prompt_tokens(prompt)

        def defang(value):
            if isinstance(value, str):
                return pattern.sub(lambda m: "\ue000" * len(m.group()), value)
            if isinstance(value, dict):
                return {k: defang(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [defang(v) for v in value]
            return value
        other = self.apply_chat_template(defang(messages), tools=defang(tools) if tools else tools,
                                         json_schema=json_schema, **template_args)["prompt"]
        if len(other) != len(prompt):
            raise TemplateError("a message holds special-token text (e.g. "
                                f"{pattern.search(' '.join(_strings_in((messages, tools)))).group()!r}) that this "
                                "chat template reads and reacts to, so it cannot be kept as plain text; remove it, "
                                "or pass parse_special=True to let it act as a special token")
        return self._tokenize_partitioned(prompt, specials, lambda a, b: other[a:b] == prompt[a:b])

    def _tokenize_partitioned(self, text: str, specials, keep) -> list[int]:
        """llama.cpp's tokenize(text, add_special=True, parse_special=True), except that an
        occurrence of a control token's text at [a, b) with keep(a, b) false stays text.

        The same steps as llama.cpp's tokenizer_st_partition: special tokens longest first,
        each splitting the raw fragments at its occurrences (with its lstrip/rstrip), then
        every raw fragment tokenized on its own (tests/test_chat.py compares the two)."""
        frags = [(0, len(text), None)]
        for tid, stext, attr in specials:
            if stext not in text:
                continue
            out = []
            for a, b, t in frags:
                if t is not None:
                    out.append((a, b, t))
                    continue
                pos = a
                while True:
                    k = text.find(stext, pos, b)
                    if k < 0:
                        break
                    e = k + len(stext)
                    if attr & _GUARDED_ATTRS and not keep(k, e):
                        pos = e            # text from a message: it stays in the raw fragment
                        continue
                    left = k
                    if attr & _LSTRIP:
                        while left > a and text[left - 1] in _C_SPACE:
                            left -= 1
                    if left > a:
                        out.append((a, left, None))
                    out.append((k, e, tid))
                    if attr & _RSTRIP:
                        while e < b and text[e] in _C_SPACE:
                            e += 1
                    a = pos = e
                if a < b:
                    out.append((a, b, None))
            frags = out
        ends = self._model.tokenize(b"", True, False)     # what add_special puts around the text
        head = ends[:1] if ends and self._model.add_bos and ends[0] == self._model.token_bos else []
        tokens = list(head)
        for a, b, t in frags:
            if t is None:
                tokens += self._model.tokenize(text[a:b].encode("utf-8"), False, False)
            else:
                tokens.append(t)
        return tokens + ends[len(head):]

    def _generation_prompt_tokens(self, chat: dict) -> list[int]:
        """Tokens of the template's generation prompt, which libcommon's output grammars
        expect first (as llama.cpp's common sampler feeds them to its grammar)."""
        gp = chat["generation_prompt"]
        if not gp:
            return []
        toks = self._model.tokenize(gp.encode("utf-8"), False, True)
        if toks and self._model.token_to_piece(toks[0], True)[:1].isspace() and not gp[:1].isspace():
            toks = toks[1:]   # some tokenizers add a space before the first special token
        return toks

    def chat(self, messages: list[dict], params: SamplingParams | None = None, *, stream: bool = False,
             tools: list[dict] | None = None, response_format: dict | None = None,
             parse_special: bool = False, **kwargs):
        """Answer OpenAI-style messages using the model's own chat template.

        response_format={"type": "json_object"} or {"type": "json_schema", "json_schema":
        {"schema": {...}}} constrains the reply with a grammar made by llama.cpp.
        Returns a GenerationResult whose .message is the parsed assistant message
        (content, tool_calls), or with stream=True an iterator of text pieces.

        Special-token text inside the messages (e.g. "<|im_end|>" in a user's content) stays
        plain text; parse_special=True lets it act as the special token it spells.
        """
        params = SamplingParams.from_kwargs(params, **kwargs)
        req, turn = self.submit_chat(messages, params, tools=tools, response_format=response_format,
                                     parse_special=parse_special)
        if stream:
            return req.text_stream()
        res = req.result()
        res.message = turn.parse(res.text)
        return res

    def submit_chat(self, messages: list[dict], params: SamplingParams | None = None, *,
                    tools: list[dict] | None = None, response_format: dict | None = None,
                    tool_choice: str = "auto", parallel_tool_calls: bool | None = None,
                    parse_special: bool = False, **kwargs) -> tuple[Request, "ChatTurn"]:
        """Queue a chat turn in the engine: (its Request, a ChatTurn that parses the reply,
        also while it is still partial). What chat() and the server build on.
        tool_choice / parallel_tool_calls: see apply_chat_template."""
        params = SamplingParams.from_kwargs(params, **kwargs)
        if not isinstance(parse_special, bool):
            raise TypeError(f"parse_special must be True or False, not {parse_special!r}")
        schema = ""
        if response_format is not None:
            kind = response_format.get("type") if isinstance(response_format, dict) else None
            if kind == "json_object":
                schema = json.dumps(response_format.get("schema") or {"type": "object"})
            elif kind == "json_schema":
                js = response_format.get("json_schema") or {}
                schema = json.dumps(js.get("schema", js) if isinstance(js, dict) else js)
            elif kind != "text":
                raise ValueError("response_format type must be 'text', 'json_object' or 'json_schema'")
        with self._lock:
            chat = self.apply_chat_template(messages, tools=tools, json_schema=schema,
                                            tool_choice=tool_choice,
                                            parallel_tool_calls=parallel_tool_calls)
            if tools and not chat["grammar"] and not any(
                    _tool_name(t) and _tool_name(t) in chat["prompt"] for t in tools):
                log.warning("polyllama: this model's chat template does not use tools: they were "
                            "left out of the prompt (pass chat_template= with a template that has them)")
            grammar = chat["grammar"] or (llamacpp.json_schema_to_grammar(schema) if schema else None)
            stops = tuple(params.stop) + tuple(s for s in chat["additional_stops"] if s)
            p = SamplingParams.from_kwargs(params, stop=stops)
            if grammar:   # the template's (or response_format's) grammar replaces the caller's
                p = SamplingParams.from_kwargs(p, grammar=None, json_schema=None)
            lazy = chat["grammar_triggers"] if chat["grammar_lazy"] else None
            prefill = self._generation_prompt_tokens(chat) if chat["grammar"] and not lazy else ()
            tokens = self._chat_prompt_tokens(chat, messages, tools, schema, parse_special,
                                              tool_choice=tool_choice,
                                              parallel_tool_calls=parallel_tool_calls)
            req = self._submit(tokens, p, False, grammar=grammar, lazy_patterns=lazy, prefill=prefill)
        turn = ChatTurn(chat)
        turn.prompt_tokens = tokens
        return req, turn

    # ---- embeddings ---------------------------------------------------------------------
    def embed(self, texts: str | Sequence[str], *, pooling: str = "mean", normalize: bool = True):
        """Embeddings of texts from the loaded model's last hidden state.

        For a causal LM (like the default model) "mean" (average over tokens) or "last"
        (the final token) are the meaningful poolings; "cls" takes the first token.
        Returns one list of floats for a str, a list of them for a list of str.
        """
        single = isinstance(texts, str)
        if not single and (texts is None or isinstance(texts, (bytes, bytearray))
                           or not hasattr(texts, "__iter__")):
            raise TypeError(f"texts must be a str or a list of str, not {type(texts).__name__}")
        items = [texts] if single else list(texts)
        if not items or not all(isinstance(t, str) and t for t in items):
            raise ValueError("texts must be a non-empty string or list of non-empty strings")
        if pooling not in ("mean", "last", "cls"):
            raise ValueError(f"pooling must be 'mean', 'last' or 'cls', not {pooling!r}")
        with self._lock:
            self._require()
            self._check_file()
            key = pooling
            if self._embed_ctx is None or self._embed_ctx[0] != key:
                if self._embed_ctx is not None:
                    self._embed_ctx[1].close()
                n = max(512, self._cparams["n_ubatch"])
                cp = llamacpp.ContextParams(n_ctx=min(self._cparams["n_ctx"] or 4096, 4096), n_batch=n,
                                        n_ubatch=n, n_threads=self._cparams["n_threads"],
                                        embeddings=True, pooling=pooling)
                self._embed_ctx = (key, llamacpp.Context(self._model, cp))
            ectx = self._embed_ctx[1]
            out = []
            for t in items:
                toks = self._model.tokenize(_utf8(t), True, False)
                if len(toks) > ectx.n_ubatch:
                    raise ContextOverflowError(f"text of {len(toks)} tokens exceeds the embedding batch of {ectx.n_ubatch}")
                ectx.clear()
                ectx.decode(toks, 0, 0, logits_all=False)
                v = ectx.embeddings(0)
                if normalize:
                    norm = math.sqrt(sum(x * x for x in v)) or 1.0
                    v = [x / norm for x in v]
                out.append(v)
            return out[0] if single else out

    def __repr__(self) -> str:
        where = getattr(self, "placement", None)
        return f"LLM({self.model_path!r}, {where})" if where else f"LLM({self.model_path!r}, closed)"
