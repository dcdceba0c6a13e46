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

Round two (issue #16) added what a file can say that is well-formed but means nothing, or
means something llama.cpp cannot run:

- `general.alignment` below 32 with tensor data at offsets ggml's CPU buffers cannot map;
- token texts that are distinct as bytes but collide as llama.cpp reads them (C strings
  end at a NUL; an empty token becomes "[EMPTY_<id>]");
- a tokenizer model that does not fit the vocabulary: `no_vocab`, `bert` (WordPiece) with
  byte tokens, `rwkv` where tokenizing would loop forever; NaN token scores;
- weights in types llama.cpp does not compute with (integer or F64 tensors), and 1-D
  weights (norms, biases) in anything but F32;
- per-layer head counts that the layer's attention tensors do not have room for;
- floating-point hyperparameters that are NaN or infinite, a `rope.freq_base` <= 0, a
  `vocab_size` of 0, a `pooling_type` llama.cpp does not know.

When the file's structure cannot be walked, `check_gguf` returns without a verdict: llama.cpp
then fails on the same damage with its own message.
"""
from __future__ import annotations

import array
import math
import mmap
import os
import struct
import sys

from .errors import ModelLoadError

# GGUF value types (ggml/include/gguf.h) -> struct format of the fixed-size ones
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# mirrors of llama.cpp's limits (src/llama-hparams.h)
MAX_LAYERS = 512
MAX_EXPERTS = 1024
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
# the numeric arrays worth keeping (per-layer counts); long ones are only skipped, except
# these, read whole (a vocabulary's worth of numbers: a few ms)
_KEEP_ARRAY_MAX = 4096
_KEEP_WHOLE = (b"tokenizer.ggml.scores", b"tokenizer.ggml.token_type")
# ggml's CPU buffers map tensor data in place and need it 32-byte aligned (TENSOR_ALIGNMENT)
TENSOR_ALIGNMENT = 32
# ggml types (ggml.h) of tensors llama.cpp stores but never computes with as weights
_UNCOMPUTABLE = {24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64"}
_GGML_F32 = 0
_POOLING_TYPES = range(0, 5)      # llama_pooling_type NONE..RANK


class _Truncated(Exception):
    """The metadata cannot be walked, or is damaged in a way llama.cpp reports itself."""


def read_metadata(path: str | os.PathLike) -> dict | None:
    """The key/values of a GGUF file: scalars as Python values, strings as bytes, numeric
    arrays (up to 4096 entries) as lists, arrays of strings as lists of bytes for
    `tokenizer.ggml.tokens` only (others as None). None when the structure is damaged."""
    got = read_gguf(path)
    return None if got is None else got[0]


def read_gguf(path: str | os.PathLike):
    """(metadata as read_metadata gives it, tensor infos, file offset of the tensor data);
    a tensor info is (name, dims, ggml type, offset in the data). None when damaged."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            return None
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        meta = _walk(mm, size)
        if meta is None:
            return None
        tensors, data_start = _walk_tensors(mm, size, meta)
        return meta, tensors, data_start
    except (_Truncated, struct.error, OverflowError, MemoryError):
        return None
    finally:
        mm.close()


def _walk_tensors(mm, size: int, meta: dict):
    pos = meta.pop("__end__")
    n_tensors = meta.pop("__n_tensors__")
    if n_tensors > (size - pos) // 24:       # name length, n_dims, type, offset at least
        raise _Truncated
    tensors = []
    for _ in range(n_tensors):
        (n,) = struct.unpack_from("<Q", mm, pos)
        if pos + 8 + n > size:
            raise _Truncated
        name = mm[pos + 8:pos + 8 + n].decode("utf-8", "replace")
        pos += 8 + n
        (nd,) = struct.unpack_from("<I", mm, pos)
        if nd > 8:
            raise _Truncated                      # llama.cpp reports it (GGML_MAX_DIMS is 4)
        dims = struct.unpack_from(f"<{nd}Q", mm, pos + 4)
        ttype, offset = struct.unpack_from("<IQ", mm, pos + 4 + 8 * nd)
        pos += 4 + 8 * nd + 12
        tensors.append((name, dims, ttype, offset))
    alignment = meta.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise _Truncated                          # llama.cpp reports a bad alignment itself
    return tensors, (pos + alignment - 1) // alignment * alignment


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
                if count <= _KEEP_ARRAY_MAX or key in _KEEP_WHOLE:
                    val = array.array(_SCALAR[etype], mm[pos:pos + count * width])
                    if sys.byteorder != "little":
                        val.byteswap()
                    val = val.tolist() if count <= _KEEP_ARRAY_MAX else val
                else:
                    val = None
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
    out["__end__"] = pos
    out["__n_tensors__"] = n_tensors
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
                if j != i and t:                  # empty texts are renamed apart by llama.cpp
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


def _rwkv_unescape(text: bytes) -> bytes:
    """The bytes an RWKV token text stands for, as llama.cpp's llama_unescape_rwkv_token
    reads the escapes (\\t \\n \\r \\xHH and a backslash before anything else)."""
    out = bytearray()
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == 0x5C and i + 1 < n:                       # backslash
            e = text[i + 1]
            if e == ord("x"):
                acc = 0
                for h in text[i + 2:i + 4]:
                    acc = ((acc << 4) + ((h - ord("a") + 10) if h >= ord("a") else (h - ord("0")))) & 0xFF
                out.append(acc)
                i += 4
                continue
            out.append({ord("t"): 9, ord("n"): 10, ord("r"): 13}.get(e, e))
            i += 2
            continue
        out.append(c)
        i += 1
    return bytes(out)


def _vocabulary_problems(meta: dict) -> list[str]:
    problems = []
    tokens = meta.get("tokenizer.ggml.tokens")
    model = meta.get("tokenizer.ggml.model")
    model = model.decode("utf-8", "replace") if isinstance(model, bytes) else None
    if model in ("no_vocab", "none"):
        problems.append(f"tokenizer.ggml.model is {model!r}: the model has no vocabulary, and polyllama "
                        "needs one to turn text into tokens and back")
    if isinstance(tokens, list):
        # llama.cpp reads each text as a C string (up to a NUL) and names an empty one
        # "[EMPTY_<id>]"; two texts that read the same abort its vocabulary load
        seen: dict[bytes, int] = {}
        for i, t in enumerate(tokens):
            read = t.split(b"\0", 1)[0] or f"[EMPTY_{i}]".encode()
            j = seen.setdefault(read, i)
            if j != i and t != tokens[j]:         # the same bytes twice: reported by _problems
                why = "an embedded NUL" if b"\0" in t or b"\0" in tokens[j] else "renaming an empty token"
                problems.append(f"tokenizer.ggml.tokens has ids {j} and {i} that llama.cpp reads as the same "
                                f"text {read!r} (after {why}); token texts must be distinct")
                break
    types = meta.get("tokenizer.ggml.token_type")
    if model == "bert" and types is not None and 6 in types:
        problems.append(f"tokenizer.ggml.model is 'bert' (WordPiece), which has no byte tokens, but "
                        f"tokenizer.ggml.token_type marks id {list(types).index(6)} as one; llama.cpp aborts on it")
    if model == "rwkv" and isinstance(tokens, list):
        # llama.cpp's RWKV tokenizer matches the longest token; where a byte starts some
        # token but is no token itself and nothing longer matches, it never moves on
        texts = [_rwkv_unescape(t) for t in tokens]
        singles = {t for t in texts if len(t) == 1}
        stuck = sorted({t[0] for t in texts if len(t) > 1 and t[:1] not in singles})
        if stuck:
            problems.append("tokenizer.ggml.model is 'rwkv' but the vocabulary has no single-byte token for "
                            + ", ".join(f"0x{b:02X}" for b in stuck[:8]) + (" ..." if len(stuck) > 8 else "")
                            + ", which longer tokens start with: llama.cpp's RWKV tokenizer would loop forever "
                            "on text with such a byte")
    scores = meta.get("tokenizer.ggml.scores")
    if scores is not None:
        bad = next((i for i, x in enumerate(scores) if x != x), None)
        if bad is not None:
            problems.append(f"tokenizer.ggml.scores has NaN (id {bad}); token scores must be numbers")
    return problems


def _tensor_problems(meta: dict, tensors: list, data_start: int, arch: str) -> list[str]:
    problems = []
    alignment = meta.get("general.alignment", 32)
    for name, dims, ttype, offset in tensors:
        if (data_start + offset) % TENSOR_ALIGNMENT:
            problems.append(f"general.alignment is {alignment}: tensor {name!r} starts at byte {data_start + offset} "
                            f"of the file, which ggml cannot map (its CPU buffers need {TENSOR_ALIGNMENT}-byte "
                            f"alignment; write the file with general.alignment >= {TENSOR_ALIGNMENT})")
            break
    for name, dims, ttype, offset in tensors:
        if ttype in _UNCOMPUTABLE:
            problems.append(f"tensor {name!r} is stored as {_UNCOMPUTABLE[ttype]}; llama.cpp computes with "
                            "floating-point (F32, F16, BF16) and quantized weights only")
            break
        if len(dims) == 1 and ttype != _GGML_F32:
            problems.append(f"tensor {name!r} is 1-D (a norm or bias) stored as ggml type {ttype}; llama.cpp "
                            "needs these in F32, as every converter writes them")
            break
    # per-layer head counts: llama.cpp sizes every layer's attention tensors by layer 0's
    # counts, then builds each layer with its own, and aborts building the graph
    n_embd = meta.get(f"{arch}.embedding_length")
    n_head = meta.get(f"{arch}.attention.head_count")
    n_head_kv = meta.get(f"{arch}.attention.head_count_kv", n_head)
    if isinstance(n_head, list) or isinstance(n_head_kv, list):
        shapes = {name: dims for name, dims, _, _ in tensors}
        head0 = n_head[0] if isinstance(n_head, list) and n_head else n_head
        key_len = meta.get(f"{arch}.attention.key_length")
        val_len = meta.get(f"{arch}.attention.value_length")
        if isinstance(head0, int) and head0 > 0 and isinstance(n_embd, int):
            head_k = key_len if isinstance(key_len, int) else n_embd // head0
            head_v = val_len if isinstance(val_len, int) else n_embd // head0
            for il in range(len(n_head) if isinstance(n_head, list) else len(n_head_kv)):
                h = n_head[il] if isinstance(n_head, list) else n_head
                hkv = n_head_kv[il] if isinstance(n_head_kv, list) and il < len(n_head_kv) else n_head_kv
                for t, heads, width, key in (("attn_q", h, head_k, "head_count"),
                                             ("attn_k", hkv, head_k, "head_count_kv"),
                                             ("attn_v", hkv, head_v, "head_count_kv")):
                    dims = shapes.get(f"blk.{il}.{t}.weight")
                    if dims is None or len(dims) < 2 or not isinstance(heads, int):
                        continue
                    if dims[1] != heads * width:
                        problems.append(f"{arch}.attention.{key} gives layer {il} {heads} heads, but "
                                        f"blk.{il}.{t}.weight has {dims[1]} rows ({width} per head); the "
                                        "per-layer head counts do not match the tensors")
                        return problems
    return problems


def _value_problems(meta: dict, arch: str) -> list[str]:
    problems = []
    prefix = arch + "."
    for key, v in meta.items():
        if not key.startswith(prefix):
            continue
        values = v if isinstance(v, list) else [v]
        bad = next((x for x in values if isinstance(x, float) and not math.isfinite(x)), None)
        if bad is not None:
            problems.append(f"{key} is {'an array holding ' if isinstance(v, list) else ''}{bad}; a "
                            "hyperparameter must be a finite number")
    base = meta.get(f"{arch}.rope.freq_base")
    if isinstance(base, float) and math.isfinite(base) and base <= 0:
        problems.append(f"{arch}.rope.freq_base is {base}; the RoPE base frequency must be > 0")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if isinstance(factor, float) and math.isfinite(factor) and factor < 0:
        problems.append(f"{arch}.rope.scaling.factor is {factor}; it must be >= 0 (0: no scaling)")
    if meta.get(f"{arch}.vocab_size") == 0:
        problems.append(f"{arch}.vocab_size is 0")
    pooling = meta.get(f"{arch}.pooling_type")
    if isinstance(pooling, int) and not isinstance(pooling, bool) and pooling not in _POOLING_TYPES:
        problems.append(f"{arch}.pooling_type is {pooling}; llama.cpp knows 0 (none) to 4 (rank)")
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
        got = read_gguf(path)
    except OSError as e:
        raise ModelLoadError(f"cannot read {os.fspath(path)}: {e.strerror or e}; check that the "
                             "file exists and is readable") from None
    if got is None:
        return None
    meta, tensors, data_start = got
    problems = _problems(meta)
    arch = meta.get("general.architecture")
    arch = arch.decode("utf-8", "replace") if isinstance(arch, bytes) else None
    problems += _vocabulary_problems(meta)
    if arch is not None:
        problems += _tensor_problems(meta, tensors, data_start, arch)
        problems += _value_problems(meta, arch)
    problems = list(dict.fromkeys(problems))
    if problems:
        raise ModelLoadError(f"{os.fspath(path)} has invalid metadata: " + "; ".join(problems)
                             + ". The file is damaged or was written by a faulty converter: "
                             "download or convert it again.")
    return meta
