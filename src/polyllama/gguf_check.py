"""Checks of a GGUF file's metadata that llama.cpp makes with an abort, made here first.

llama.cpp validates the structure of a GGUF file (magic, version, counts, lengths, types,
offsets) itself and reports damage as an error, which polyllama raises as ModelLoadError.
A few *values* it checks only with GGML_ASSERT, or not at all before using them, so a damaged
or hand-made file kills the whole process (SIGABRT) instead of failing the load. The
corrupt-file corpus of tests/test_corrupt_gguf.py found these; `check_gguf` rejects them
before the file reaches llama.cpp (docs/HARDENING.md lists them):

- `{arch}.block_count` outside 1..512, `{arch}.nextn_predict_layers` above it;
- expert counts that contradict each other or exceed 1024;
- `{arch}.rope.scaling.type` that is not none/linear/yarn/longrope;
- a negative or NaN normalization epsilon (aborts in the first decode);
- `tokenizer.ggml.tokens` with the same token text twice;
- an SPM vocabulary (`tokenizer.ggml.model = "llama"`) without a byte token for some byte
  (tokenizing text that needs it aborts with an uncaught std::out_of_range).

When the file's structure cannot be walked, `check_gguf` returns without a verdict: llama.cpp
then fails on the same damage with its own message.
"""
from __future__ import annotations

import math
import mmap
import os
import struct

from .errors import ModelLoadError

# GGUF value types (ggml/include/gguf.h) -> struct format of the fixed-size ones
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# mirrors of llama.cpp's limits (src/llama-hparams.h)
MAX_LAYERS = 512
MAX_EXPERTS = 1024
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
# the numeric arrays worth keeping (per-layer counts); long ones are only skipped
_KEEP_ARRAY_MAX = 4096


class _Truncated(Exception):
    """The metadata cannot be walked, or is damaged in a way llama.cpp reports itself."""


def read_metadata(path: str | os.PathLike) -> dict | None:
    """The key/values of a GGUF file: scalars as Python values, strings as bytes, numeric
    arrays (up to 4096 entries) as lists, arrays of strings as lists of bytes for
    `tokenizer.ggml.tokens` only (others as None). None when the structure is damaged."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            return None
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _walk(mm, size)
    except (_Truncated, struct.error, OverflowError, MemoryError):
        return None
    finally:
        mm.close()


def _walk(mm, size: int) -> dict | None:
    if mm[:4] != b"GGUF":
        return None
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", mm, 4)
    if version not in (2, 3):
        return None
    if n_kv > (size - 24) // 13:            # a key/value takes at least 13 bytes
        return None
    unpack = struct.unpack_from
    pos = 24
    out: dict = {}

    def string(p, keep=True):
        (n,) = unpack("<Q", mm, p)
        end = p + 8 + n
        if end > size:
            raise _Truncated
        return (mm[p + 8:end] if keep else None), end

    for _ in range(n_kv):
        key, pos = string(pos)
        (vtype,) = unpack("<I", mm, pos)
        pos += 4
        if vtype in _SCALAR:
            fmt = "<" + _SCALAR[vtype]
            (val,) = unpack(fmt, mm, pos)
            pos += struct.calcsize(fmt)
        elif vtype == _STRING:
            val, pos = string(pos)
        elif vtype == _ARRAY:
            etype, count = unpack("<IQ", mm, pos)
            pos += 12
            if etype == _STRING:
                if count > (size - pos) // 8:
                    raise _Truncated
                keep = key == b"tokenizer.ggml.tokens"
                items = [] if keep else None
                for _ in range(count):
                    s, pos = string(pos, keep)
                    if keep:
                        items.append(s)
                val = items
            elif etype in _SCALAR:
                width = struct.calcsize("<" + _SCALAR[etype])
                if count * width > size - pos:
                    raise _Truncated
                val = list(struct.unpack_from(f"<{count}{_SCALAR[etype]}", mm, pos)) \
                    if count <= _KEEP_ARRAY_MAX else None
                pos += count * width
            else:
                raise _Truncated                  # nested arrays: llama.cpp refuses them
        else:
            raise _Truncated
        if pos > size:
            raise _Truncated
        name = key.decode("utf-8", "replace")
        if name in out:
            raise _Truncated                      # llama.cpp reports duplicate keys itself
        out[name] = val
    return out


def _problems(meta: dict) -> list[str]:
    arch = meta.get("general.architecture")
    if not isinstance(arch, bytes):
        return []                                  # llama.cpp reports a missing architecture
    arch = arch.decode("utf-8", "replace")
    problems = []

    def num(key):
        v = meta.get(f"{arch}.{key}")
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def num_or_max(key):
        v = meta.get(f"{arch}.{key}")
        if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
            return max(v)
        return num(key)

    n_layer = num("block_count")
    if n_layer is not None and not (0 < n_layer <= MAX_LAYERS):
        problems.append(f"{arch}.block_count is {n_layer}; llama.cpp supports 1 to {MAX_LAYERS} layers")
    nextn = num("nextn_predict_layers")
    if nextn is not None and n_layer is not None and nextn > n_layer:
        problems.append(f"{arch}.nextn_predict_layers ({nextn}) exceeds {arch}.block_count ({n_layer})")
    n_expert = num("expert_count") or 0
    n_used = num_or_max("expert_used_count") or 0
    n_groups = num("expert_group_count") or 0
    n_group_used = num("expert_group_used_count") or 0
    if n_expert > MAX_EXPERTS:
        problems.append(f"{arch}.expert_count is {n_expert}; llama.cpp supports at most {MAX_EXPERTS}")
    elif n_expert > 0:
        if not (0 < n_used <= n_expert):
            problems.append(f"{arch}.expert_used_count ({n_used}) must be between 1 and "
                            f"{arch}.expert_count ({n_expert})")
        if n_groups >= n_expert:
            problems.append(f"{arch}.expert_group_count ({n_groups}) must be below {arch}.expert_count ({n_expert})")
        elif n_groups > 1 and (n_expert % n_groups or not (0 < n_group_used < n_groups)):
            problems.append(f"{arch}.expert_group_count ({n_groups}) / expert_group_used_count "
                            f"({n_group_used}) do not divide {n_expert} experts")
    elif n_used or n_groups:
        problems.append(f"{arch}.expert_used_count / expert_group_count are set but the model has no experts")
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if isinstance(scaling, bytes) and scaling.decode("utf-8", "replace") not in ROPE_SCALING_TYPES:
        problems.append(f"{arch}.rope.scaling.type is {scaling!r}; llama.cpp knows "
                        + ", ".join(ROPE_SCALING_TYPES))
    for key in ("attention.layer_norm_epsilon", "attention.layer_norm_rms_epsilon"):
        eps = num(key)
        if eps is not None and not (math.isfinite(eps) and eps >= 0):
            problems.append(f"{arch}.{key} is {eps}; a normalization epsilon must be a finite number >= 0")

    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):
        texts = set(tokens)
        if len(texts) != len(tokens):
            first: dict[bytes, int] = {}
            for i, t in enumerate(tokens):
                j = first.setdefault(t, i)
                if j != i:
                    problems.append(f"tokenizer.ggml.tokens has {t!r} twice (ids {j} and {i}); "
                                    "llama.cpp requires distinct token texts")
                    break
        if meta.get("tokenizer.ggml.model") == b"llama":
            missing = [b for b in range(256)
                       if f"<0x{b:02X}>".encode() not in texts and bytes([b]) not in texts]
            if missing:
                problems.append(f"the SPM vocabulary has no token for byte(s) "
                                + ", ".join(f"0x{b:02X}" for b in missing[:8])
                                + (" ..." if len(missing) > 8 else "")
                                + "; llama.cpp would abort tokenizing text that needs them")
    return problems


def kv_layer_bytes(meta: dict | None, n_ctx: int) -> int | None:
    """Bytes of the largest F16 K or V tensor of one layer for n_ctx cells (llama.cpp pads
    the cache to a multiple of 256), from the standard attention keys; None when the file
    does not say. Architectures with another cache layout (MLA, recurrent) may differ."""
    if not meta or not isinstance(meta.get("general.architecture"), bytes):
        return None
    arch = meta["general.architecture"].decode("utf-8", "replace")

    def largest(key):
        v = meta.get(f"{arch}.{key}")
        if isinstance(v, list):
            v = max((x for x in v if isinstance(x, int)), default=None)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
    n_embd, n_head = largest("embedding_length"), largest("attention.head_count")
    n_head_kv = largest("attention.head_count_kv") or n_head
    if not n_embd or not n_head or not n_head_kv:
        return None
    head = max(largest("attention.key_length") or n_embd // n_head,
               largest("attention.value_length") or n_embd // n_head)
    cells = n_ctx or largest("context_length") or 0
    cells = -(-cells // 256) * 256
    return cells * n_head_kv * head * 2


def check_gguf(path: str | os.PathLike) -> dict | None:
    """Raise ModelLoadError when the file has metadata llama.cpp would abort on; else
    return the metadata (read_metadata's dict, None when it could not be walked)."""
    try:
        meta = read_metadata(path)
    except OSError as e:
        raise ModelLoadError(f"cannot read {os.fspath(path)}: {e.strerror or e}; check that the "
                             "file exists and is readable") from None
    if meta is None:
        return None
    problems = _problems(meta)
    if problems:
        raise ModelLoadError(f"{os.fspath(path)} has invalid metadata: " + "; ".join(problems)
                             + ". The file is damaged or was written by a faulty converter: "
                             "download or convert it again.")
    return meta
