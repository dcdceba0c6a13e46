"""A deterministic corpus of damaged GGUF files, for tests/test_corrupt_gguf.py.

Two originals are damaged:
  - a tiny synthetic llama model written here with the `gguf` package (SPM vocabulary of
    byte tokens, 2 layers, F32 weights; about 100 KB, so whole copies are cheap);
  - the default model, SmolLM2-135M-Instruct (98 MB). Only its metadata (1.8 MB, up to the
    start of the tensor data) is written; the file is then extended to its real size with
    a sparse hole, so llama.cpp sees a file of the right length whose weights are zeros.

Each mutation is described by a short name ("n_tensors=2^64-1", "truncate@kv:1234",
"flip x3 @tensor_infos", ...). `build_corpus(dir, seed)` writes every variant and returns
[(path, original, mutation)]; the same seed always gives the same files.

    python tests/gguf_corpus.py OUTDIR        # write the corpus and print the mutations
"""
from __future__ import annotations

import os
import random
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

GGUF_MAGIC = b"GGUF"
# GGUF value types (gguf.h): byte size of the fixed-size ones
SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
T_STRING, T_ARRAY = 8, 9
U64_MAX = (1 << 64) - 1


@dataclass
class Layout:
    """Byte offsets of the fields of a GGUF file's metadata (everything but tensor data)."""
    size: int
    n_tensors: int
    n_kv: int
    kv_start: int = 24
    ti_start: int = 0               # first tensor info
    data_start: int = 0             # first byte of tensor data (after alignment padding)
    kv_keys: list = field(default_factory=list)       # (key, offset of its u64 length)
    kv_types: list = field(default_factory=list)      # (key, offset of its u32 type)
    kv_values: dict = field(default_factory=dict)     # key -> (type, offset of the value)
    str_lens: list = field(default_factory=list)      # offsets of u64 string lengths (values)
    arr_types: list = field(default_factory=list)     # (key, offset of the u32 element type)
    arr_counts: list = field(default_factory=list)    # (key, offset of the u64 element count)
    ti_names: list = field(default_factory=list)      # (name, offset of its u64 length)
    ti_ndims: list = field(default_factory=list)      # offsets of u32 n_dims
    ti_dims: list = field(default_factory=list)       # offsets of u64 dims
    ti_types: list = field(default_factory=list)      # offsets of u32 ggml types
    ti_offsets: list = field(default_factory=list)    # offsets of u64 data offsets


def parse_layout(buf: bytes) -> Layout:
    """Walk an intact GGUF file (v3, little-endian) and record where every field lives."""
    if buf[:4] != GGUF_MAGIC:
        raise ValueError("not a GGUF file")
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
    lay = Layout(size=len(buf), n_tensors=n_tensors, n_kv=n_kv)
    pos = 24
    alignment = 32

    def read_str(p):
        (n,) = struct.unpack_from("<Q", buf, p)
        return buf[p + 8:p + 8 + n].decode("utf-8", "replace"), p + 8 + n

    for _ in range(n_kv):
        lay.kv_keys.append((None, pos))
        key, pos = read_str(pos)
        lay.kv_keys[-1] = (key, lay.kv_keys[-1][1])
        (vtype,) = struct.unpack_from("<I", buf, pos)
        lay.kv_types.append((key, pos))
        pos += 4
        lay.kv_values[key] = (vtype, pos)
        if vtype == T_STRING:
            lay.str_lens.append(pos)
            _, pos = read_str(pos)
        elif vtype == T_ARRAY:
            (etype,) = struct.unpack_from("<I", buf, pos)
            lay.arr_types.append((key, pos))
            (count,) = struct.unpack_from("<Q", buf, pos + 4)
            lay.arr_counts.append((key, pos + 4))
            pos += 12
            if etype == T_STRING:
                for _ in range(count):
                    lay.str_lens.append(pos)
                    _, pos = read_str(pos)
            else:
                pos += SCALAR_SIZE[etype] * count
        else:
            if key == "general.alignment":
                (alignment,) = struct.unpack_from("<I", buf, pos)
            pos += SCALAR_SIZE[vtype]
    lay.ti_start = pos
    for _ in range(n_tensors):
        name_at = pos
        name, pos = read_str(pos)
        lay.ti_names.append((name, name_at))
        (nd,) = struct.unpack_from("<I", buf, pos)
        lay.ti_ndims.append(pos)
        pos += 4
        for d in range(nd):
            lay.ti_dims.append(pos + 8 * d)
        pos += 8 * nd
        lay.ti_types.append(pos)
        lay.ti_offsets.append(pos + 4)
        pos += 12
    lay.data_start = (pos + alignment - 1) // alignment * alignment
    return lay


# ---- the synthetic model ------------------------------------------------------------------
@dataclass
class _Model:
    kv: dict
    tensors: list
    writer: object


def write_synthetic_model(path: str | os.PathLike, edit=None) -> str:
    """A tiny but complete llama model: loads, tokenizes and generates (garbage) text.

    edit(model), when given, changes the model before it is written: model.kv is the
    writer's {key: GGUFValue} (general.architecture included), model.tensors a list of
    [name, array, raw_dtype or None] in file order, model.writer the gguf.GGUFWriter.
    Without it the file is always the same bytes (the damaged corpus is derived from them).
    """
    import gguf
    n_embd, n_layer, n_head, n_head_kv, n_ff = 32, 2, 4, 2, 64
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + \
             ["\u2581the", "\u2581a", "\u2581cat", "\u2581sat", "\u2581on", "\u2581mat", "\u2581hello"]
    types = [2, 3, 3] + [6] * 256 + [1] * 7        # unknown, control, byte, normal
    scores = [0.0] * 259 + [-float(i) for i in range(7)]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("polyllama-corrupt-test")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    rng = np.random.default_rng(0)

    def t(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)
    kv = n_head_kv * (n_embd // n_head)
    tensors = [["token_embd.weight", t(len(tokens), n_embd), None]]
    for i in range(n_layer):
        p = f"blk.{i}."
        tensors += [[p + "attn_norm.weight", np.ones(n_embd, np.float32), None],
                    [p + "attn_q.weight", t(n_embd, n_embd), None],
                    [p + "attn_k.weight", t(kv, n_embd), None],
                    [p + "attn_v.weight", t(kv, n_embd), None],
                    [p + "attn_output.weight", t(n_embd, n_embd), None],
                    [p + "ffn_norm.weight", np.ones(n_embd, np.float32), None],
                    [p + "ffn_gate.weight", t(n_ff, n_embd), None],
                    [p + "ffn_up.weight", t(n_ff, n_embd), None],
                    [p + "ffn_down.weight", t(n_embd, n_ff), None]]
    tensors.append(["output_norm.weight", np.ones(n_embd, np.float32), None])
    if edit is not None:
        edit(_Model(w.kv_data[0], tensors, w))
    for name, data, raw_dtype in tensors:
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    return str(path)


# ---- mutations ----------------------------------------------------------------------------
# A mutation is (name, patches, length): patches are (offset, bytes) written over a copy
# of the original's first `length` bytes (None: the whole file).

ABSURD_U64 = {"0": 0, "1": 1, "2^31": 1 << 31, "2^32": 1 << 32, "2^40": 1 << 40,
              "2^63": 1 << 63, "2^64-1": U64_MAX}
ABSURD_U32 = {"0": 0, "2^31-1": (1 << 31) - 1, "2^31": 1 << 31, "2^32-1": (1 << 32) - 1}


def u64(v):
    return struct.pack("<Q", v)


def u32(v):
    return struct.pack("<I", v)


def mutations(lay: Layout, rng: random.Random, label: str, budget: dict[str, int]):
    """Yield (name, patches, length) for one original, `budget[kind]` of each random kind."""
    sections = {"header": (0, 24), "kv": (lay.kv_start, lay.ti_start),
                "tensor_infos": (lay.ti_start, lay.data_start), "data": (lay.data_start, lay.size)}
    # truncation at random offsets of every section
    for sec, (lo, hi) in sections.items():
        cuts = sorted({lo, hi - 1} | {rng.randrange(lo, hi) for _ in range(budget["truncate"])})
        for cut in cuts:
            yield f"truncate@{sec}:{cut}", [], cut
    yield "truncate@empty:0", [], 0

    # wrong magic / version
    for magic in (b"GGUG", b"FUGG", b"\0\0\0\0", b"GGML", b"ggjt"):
        yield f"magic={magic!r}", [(0, magic)], None
    for v in (0, 1, 2, 4, 0xFFFF, 0x03000000, (1 << 32) - 1):
        yield f"version={v}", [(4, u32(v))], None

    # absurd counts in the header
    for name, v in ABSURD_U64.items():
        yield f"n_tensors={name}", [(8, u64(v))], None
        yield f"n_kv={name}", [(16, u64(v))], None
    yield "n_tensors+1", [(8, u64(lay.n_tensors + 1))], None
    yield "n_tensors-1", [(8, u64(lay.n_tensors - 1))], None
    yield "n_kv+1", [(16, u64(lay.n_kv + 1))], None
    yield "n_kv-1", [(16, u64(lay.n_kv - 1))], None

    # string lengths: keys, string values, tensor names
    picks = rng.sample(lay.kv_keys, min(budget["fields"], len(lay.kv_keys)))
    for key, at in picks:
        v = rng.choice(list(ABSURD_U64))
        yield f"key_len[{key}]={v}", [(at, u64(ABSURD_U64[v]))], None
    for at in rng.sample(lay.str_lens, min(budget["fields"], len(lay.str_lens))):
        v = rng.choice(list(ABSURD_U64) + ["size"])
        yield f"str_len@{at}={v}", [(at, u64(lay.size if v == "size" else ABSURD_U64[v]))], None
    for name, at in rng.sample(lay.ti_names, min(budget["fields"], len(lay.ti_names))):
        v = rng.choice(["0", "2^63", "2^64-1", "2^32", "65"])
        yield f"tensor_name_len[{name}]={v}", [(at, u64(ABSURD_U64.get(v, 65)))], None

    # value types and array element types/counts
    for key, at in rng.sample(lay.kv_types, min(budget["fields"], len(lay.kv_types))):
        v = rng.choice([13, 255, 0xFFFFFFFF, 9, 8, 12])
        yield f"kv_type[{key}]={v}", [(at, u32(v))], None
    for key, at in lay.arr_types:
        for v in (9, 13, 0xFFFFFFFF, 12, 0):
            yield f"array_type[{key}]={v}", [(at, u32(v))], None
    for key, at in lay.arr_counts:
        for name, v in ABSURD_U64.items():
            yield f"array_count[{key}]={name}", [(at, u64(v))], None

    # tensor infos: n_dims, dims, types, offsets
    for at in rng.sample(lay.ti_ndims, min(budget["fields"], len(lay.ti_ndims))):
        v = rng.choice([0, 3, 4, 5, 8, 0xFFFFFFFF])
        yield f"n_dims@{at}={v}", [(at, u32(v))], None
    for at in rng.sample(lay.ti_dims, min(budget["fields"], len(lay.ti_dims))):
        v = rng.choice(["0", "2^31", "2^32", "2^40", "2^63", "2^64-1", "3"])
        yield f"dim@{at}={v}", [(at, u64(ABSURD_U64.get(v, 3)))], None
    for at in rng.sample(lay.ti_types, min(budget["fields"], len(lay.ti_types))):
        v = rng.choice([4, 5, 31, 39, 40, 41, 1000, 0xFFFFFFFF, 0, 1, 2, 8])   # 4/5: removed Q4_2/Q4_3
        yield f"tensor_type@{at}={v}", [(at, u32(v))], None
    for at in rng.sample(lay.ti_offsets, min(budget["fields"], len(lay.ti_offsets))):
        v = rng.choice(["past_end", "unaligned", "2^63", "2^64-1", "size"])
        val = {"past_end": lay.size * 2, "unaligned": 1, "2^63": 1 << 63, "2^64-1": U64_MAX,
               "size": lay.size - lay.data_start}[v]
        yield f"tensor_offset@{at}={v}", [(at, u64(val))], None

    # duplicate tensor names: overwrite a name with another of the same length
    by_len: dict[int, list] = {}
    for name, at in lay.ti_names:
        by_len.setdefault(len(name.encode()), []).append((name, at))
    groups = [g for g in by_len.values() if len(g) > 1]
    for _ in range(budget["dup"]):
        g = rng.choice(groups)
        (a, _), (b, at_b) = rng.sample(g, 2)
        yield f"duplicate_tensor[{b}->{a}]", [(at_b + 8, a.encode())], None
    # duplicate keys
    kl: dict[int, list] = {}
    for key, at in lay.kv_keys:
        kl.setdefault(len(key.encode()), []).append((key, at))
    kgroups = [g for g in kl.values() if len(g) > 1]
    for _ in range(min(budget["dup"], 4 * len(kgroups))):
        g = rng.choice(kgroups)
        (a, _), (b, at_b) = rng.sample(g, 2)
        yield f"duplicate_key[{b}->{a}]", [(at_b + 8, a.encode())], None

    # hyperparameters and special token ids that make no sense
    for key, (vtype, at) in lay.kv_values.items():
        if vtype == 4 and (key.endswith(("count", "length", "_count_kv", "token_id", "dimension_count",
                                          "vocab_size", "file_type", "quantization_version", "alignment"))):
            for v in (0, 1, 3, 0x7FFFFFFF, 0xFFFFFFFF):
                yield f"value[{key}]={v}", [(at, u32(v))], None
        elif vtype == 6:
            for name, v in (("nan", float("nan")), ("inf", float("inf")), ("0", 0.0), ("-1", -1.0)):
                yield f"value[{key}]={name}", [(at, struct.pack("<f", v))], None
    for key in ("general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.pre"):
        if key in lay.kv_values and lay.kv_values[key][0] == T_STRING:
            at = lay.kv_values[key][1]
            yield f"value[{key}]=garbage", [(at + 8, b"\xff\xfe")], None

    # random byte flips: in the metadata, and in the data section
    meta_end = lay.data_start
    for sec, (lo, hi), n in (("metadata", (0, meta_end), budget["flips_meta"]),
                             ("data", (lay.data_start, lay.size), budget["flips_data"])):
        for i in range(n):
            k = rng.choice([1, 1, 2, 4, 16])
            offs = sorted(rng.randrange(lo, hi) for _ in range(k))
            yield f"flip x{k}@{sec}:{offs[0]}", [(o, bytes([rng.randrange(1, 256)])) for o in offs], "xor"


def _apply(orig: bytes, patches, mode) -> bytearray:
    buf = bytearray(orig)
    for off, data in patches:
        if off + len(data) > len(buf):
            continue
        if mode == "xor":
            for i, b in enumerate(data):
                buf[off + i] ^= b
        else:
            buf[off:off + len(data)] = data
    return buf


def build_corpus(outdir: str | os.PathLike, smol_path: str | os.PathLike | None, seed: int = 7) -> list:
    """Write every variant into outdir; returns [(path, original, mutation)]."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    items = []
    synth = write_synthetic_model(out / "synthetic.gguf")
    items.append((synth, "synthetic", "intact"))
    sources = [("synthetic", Path(synth), dict(truncate=12, fields=12, dup=6, flips_meta=60, flips_data=15))]
    if smol_path is not None:
        sources.append(("smollm2", Path(smol_path), dict(truncate=10, fields=10, dup=5, flips_meta=40, flips_data=0)))
    for label, src, budget in sources:
        size = src.stat().st_size
        with open(src, "rb") as f:
            lay, want = None, 1 << 16
            while lay is None:          # read just enough of the file to cover its metadata
                f.seek(0)
                try:
                    lay = parse_layout(f.read(want))
                except struct.error:    # the metadata goes on past `want` bytes
                    if want > size:
                        raise
                    want *= 2
            f.seek(0)
            keep = size if size <= (8 << 20) else lay.data_start   # whole small files only
            orig = f.read(keep)
        lay.size = size
        for i, (name, patches, length) in enumerate(mutations(lay, rng, label, budget)):
            path = out / f"{label}-{i:04d}.gguf"
            if isinstance(length, int):                 # truncation
                with open(path, "wb") as g:
                    g.write(orig[:min(length, len(orig))])
                    if length > len(orig):
                        g.truncate(length)              # sparse: the zeros of a hole
            else:
                buf = _apply(orig, [(o, d) for o, d in patches if o < len(orig)], length)
                with open(path, "wb") as g:
                    g.write(buf)
                    if len(buf) < size:
                        g.truncate(size)
            items.append((str(path), label, name))
    return items


# ---- semantic damage: valid structure, values that mean nothing ---------------------------
# gguf_check and llama.cpp read these files without a structural error; what is wrong is
# what a value means (or how two values fit together). Each entry: (name, edit, expected
# outcome, regex of the message). The expected outcome is ModelLoadError at LLM()/Tokenizer()
# naming the key, or "ok" where llama.cpp copes (the file loads, tokenizes and generates).

def _gv(value, vtype_name, sub=None):
    import gguf
    from gguf.gguf_writer import GGUFValue
    t = gguf.GGUFValueType
    return GGUFValue(value=value, type=t[vtype_name], sub_type=t[sub] if sub else None)


def _set(key, value, vtype="UINT32", sub=None):
    def edit(m):
        m.kv[key] = _gv(value, vtype, sub)
    return edit


def _drop(*keys):
    def edit(m):
        for k in keys:
            m.kv.pop(k, None)
    return edit


def _both(*edits):
    def edit(m):
        for e in edits:
            e(m)
    return edit


def _tokens(**changes):
    """Replace token texts by id: _tokens(t262="...")."""
    def edit(m):
        toks = list(m.kv["tokenizer.ggml.tokens"].value)
        for k, v in changes.items():
            toks[int(k[1:])] = v
        m.kv["tokenizer.ggml.tokens"] = _gv(toks, "ARRAY", "STRING")
    return edit


def _retype(name, dtype_name):
    """Store tensor `name` as another ggml type (same values, converted)."""
    def edit(m):
        import gguf
        q = gguf.GGMLQuantizationType[dtype_name]
        for t in m.tensors:
            if t[0] == name:
                data = t[1]
                if dtype_name in ("F32", "F16", "F64", "I8", "I16", "I32", "I64"):
                    np_t = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8,
                            "I16": np.int16, "I32": np.int32, "I64": np.int64}[dtype_name]
                    t[1], t[2] = data.astype(np_t), None
                else:
                    t[1], t[2] = gguf.quants.quantize(data, q), q
                return
        raise KeyError(name)
    return edit


def _arch(new):
    """Call the model another architecture (every llama.* key renamed)."""
    def edit(m):
        items = list(m.kv.items())
        m.kv.clear()
        for k, v in items:
            if k == "general.architecture":
                v = _gv(new, "STRING")
            elif k.startswith("llama."):
                k = new + k[len("llama"):]
            m.kv[k] = v
    return edit


def _arr(key, values, sub="INT32"):
    return _set(key, list(values), "ARRAY", sub)


_TOK = r"tokenizer\.ggml"
SEMANTIC = [
    # alignment: a power of two, so gguf accepts it, but tensors then start at offsets ggml's
    # CPU buffers refuse (they must be 32-byte aligned in the mapping)
    ("alignment=1, data at an odd offset", "alignment:1", "ModelLoadError", r"general\.alignment"),
    ("alignment=8, data off 32 bytes", "alignment:8", "ModelLoadError", r"general\.alignment"),
    ("alignment=16, data off 32 bytes", "alignment:16", "ModelLoadError", r"general\.alignment"),
    ("alignment=64", "alignment:64", "ok", ""),
    # token texts: C strings stop at NUL; llama.cpp renames an empty token "[EMPTY_<id>]"
    ("tokens equal up to an embedded NUL", _tokens(t262="\u2581c\0at", t263="\u2581c\0sat"),
     "ModelLoadError", _TOK + r"\.tokens.*(NUL|twice)"),
    ("a token with an embedded NUL", _tokens(t262="\u2581c\0at"), "ok", ""),
    ("an empty token renamed onto another", _tokens(t264="", t265="[EMPTY_264]"),
     "ModelLoadError", _TOK + r"\.tokens.*EMPTY_264"),
    ("an empty token", _tokens(t264=""), "ok", ""),
    # tokenizer models that do not fit the vocabulary
    ("bert over byte tokens", _set("tokenizer.ggml.model", "bert", "STRING"), "ModelLoadError",
     _TOK + r"\.model.*bert"),
    ("rwkv over an SPM vocabulary", _set("tokenizer.ggml.model", "rwkv", "STRING"), "ModelLoadError",
     _TOK + r"\.model.*rwkv|newline|vocabulary has no token"),
    ("no_vocab with a vocab_size", _both(_set("tokenizer.ggml.model", "no_vocab", "STRING"),
                                        _set("llama.vocab_size", 266)), "ModelLoadError", r"no_vocab|no vocabulary"),
    ("no_vocab", _set("tokenizer.ggml.model", "no_vocab", "STRING"), "ModelLoadError", r"no_vocab|no vocabulary"),
    ("gpt2 without merges", _set("tokenizer.ggml.model", "gpt2", "STRING"), "ModelLoadError", r"merges"),
    ("gpt2 whose merges name no byte tokens",
     _both(_set("tokenizer.ggml.model", "gpt2", "STRING"),
           _arr("tokenizer.ggml.merges", ["\u2581 t", "h e"], "STRING")), "ModelLoadError|ValueError",
     r"gives no tokens|vocabulary"),
    ("t5 (unigram) over an SPM vocabulary", _set("tokenizer.ggml.model", "t5", "STRING"), "ok|ModelLoadError", _TOK),
    ("plamo2 over an SPM vocabulary", _set("tokenizer.ggml.model", "plamo2", "STRING"), "ok|ModelLoadError", _TOK),
    ("the test tokenizer", _set("tokenizer.ggml.model", "test", "STRING"), "ok|ModelLoadError", _TOK),
    # special tokens the tokenizer must add but cannot
    ("add_bos_token without a BOS token (t5)",
     _both(_set("tokenizer.ggml.model", "t5", "STRING"), _drop("tokenizer.ggml.bos_token_id"),
           _set("tokenizer.ggml.add_bos_token", True, "BOOL")), "ModelLoadError", _TOK + r"\.add_bos_token"),
    ("add_eos_token without an EOS token (rwkv)",
     _both(_set("tokenizer.ggml.model", "test", "STRING"), _drop("tokenizer.ggml.eos_token_id"),
           _set("tokenizer.ggml.add_eos_token", True, "BOOL")), "ModelLoadError", _TOK + r"\.add_eos_token"),
    ("NaN token scores", lambda m: m.kv.__setitem__("tokenizer.ggml.scores", _gv(
        [float("nan")] * 266, "ARRAY", "FLOAT32")), "ModelLoadError", _TOK + r"\.scores"),
    ("an infinite token score (fine)", lambda m: m.kv.__setitem__("tokenizer.ggml.scores", _gv(
        [0.0] * 265 + [float("-inf")], "ARRAY", "FLOAT32")), "ok", ""),
    # weights in types ggml-cpu cannot compute with
    ("token_embd in I32", _retype("token_embd.weight", "I32"), "ModelLoadError", r"token_embd\.weight"),
    ("attn_q in F64", _retype("blk.0.attn_q.weight", "F64"), "ModelLoadError", r"blk\.0\.attn_q\.weight"),
    ("ffn_up in I8", _retype("blk.1.ffn_up.weight", "I8"), "ModelLoadError", r"blk\.1\.ffn_up\.weight"),
    ("attn_norm in F16", _retype("blk.0.attn_norm.weight", "F16"), "ModelLoadError|ok", r"blk\.0\.attn_norm\.weight"),
    ("output_norm in Q8_0", _retype("output_norm.weight", "Q8_0"), "ModelLoadError", r"output_norm\.weight"),
    ("token_embd in F16 (fine)", _retype("token_embd.weight", "F16"), "ok", ""),
    ("attn_q in Q8_0 (fine)", _retype("blk.0.attn_q.weight", "Q8_0"), "ok", ""),
    # weights that are NaN (damaged tensor data, which no check reads): greedy decoding goes
    # on with garbage, sampling says what is wrong instead of blaming the sampling settings
    ("NaN weights in token_embd", lambda m: m.tensors[0][1].fill(float("nan")), "DecodeError", r"NaN logits"),
    # per-layer hyperparameters that disagree with each other or with the tensors
    ("head_count_kv per layer [2, 3]", _arr("llama.attention.head_count_kv", [2, 3]), "ModelLoadError", r"head_count_kv|shape"),
    ("head_count_kv per layer [2, 0]", _arr("llama.attention.head_count_kv", [2, 0]), "ModelLoadError", r"head_count_kv|shape"),
    ("head_count_kv array longer than block_count", _arr("llama.attention.head_count_kv", [2, 2, 2]),
     "ModelLoadError", r"head_count_kv"),
    ("head_count_kv array shorter than block_count", _arr("llama.attention.head_count_kv", [2]),
     "ModelLoadError", r"head_count_kv"),
    ("head_count per layer [4, 3]", _arr("llama.attention.head_count", [4, 3]), "ModelLoadError", r"head_count"),
    ("head_count_kv 3 does not divide head_count 4", _set("llama.attention.head_count_kv", 3),
     "ModelLoadError", r"head_count"),
    ("rope.dimension_count above the head size", _set("llama.rope.dimension_count", 64),
     "ModelLoadError", r"rope\.dimension_count"),
    ("rope.dimension_count odd", _set("llama.rope.dimension_count", 7), "ModelLoadError|ok", r"rope\.dimension_count"),
    # an architecture whose required fields are missing
    ("qwen2moe without experts", _arch("qwen2moe"), "ModelLoadError", r"expert|qwen2moe"),
    ("qwen3moe without experts", _arch("qwen3moe"), "ModelLoadError", r"expert|qwen3moe"),
    ("olmoe without experts", _arch("olmoe"), "ModelLoadError", r"expert|olmoe"),
    ("deepseek2 without its fields", _arch("deepseek2"), "ModelLoadError", r"deepseek2|expert|lora|key"),
    ("mamba with llama's fields", _arch("mamba"), "ModelLoadError", r"mamba|ssm|key"),
    ("gemma3 with llama's fields", _arch("gemma3"), "ModelLoadError|ok", r"gemma3|key|tensor"),
    ("llama with expert_count but no expert tensors",
     _both(_set("llama.expert_count", 4), _set("llama.expert_used_count", 2)), "ModelLoadError", r"expert|tensor"),
    # values that make no sense, accepted silently before
    ("context_length 2**32-1 with n_ctx=0", _set("llama.context_length", 0xFFFFFFFF),
     "ModelLoadError|InsufficientMemoryError|ValueError", r"context_length|n_ctx"),
    ("rope.freq_base NaN", _set("llama.rope.freq_base", float("nan"), "FLOAT32"), "ModelLoadError", r"rope\.freq_base"),
    ("rope.freq_base -inf", _set("llama.rope.freq_base", float("-inf"), "FLOAT32"), "ModelLoadError", r"rope\.freq_base"),
    ("rope.freq_base 0", _set("llama.rope.freq_base", 0.0, "FLOAT32"), "ModelLoadError", r"rope\.freq_base"),
    ("rope.scaling.factor NaN", _set("llama.rope.scaling.factor", float("nan"), "FLOAT32"), "ModelLoadError",
     r"rope\.scaling\.factor"),
    ("logit_scale inf", _set("llama.logit_scale", float("inf"), "FLOAT32"), "ModelLoadError", r"logit_scale"),
    ("attention.scale NaN", _set("llama.attention.scale", float("nan"), "FLOAT32"), "ModelLoadError", r"attention\.scale"),
    ("vocab_size 0", _set("llama.vocab_size", 0), "ModelLoadError", r"vocab_size"),
    # llama.cpp reads {arch}.vocab_size only without a vocabulary: a wrong one is harmless
    ("vocab_size larger than the vocabulary (unused)", _set("llama.vocab_size", 100000), "ok", ""),
    ("pooling_type 1000", _set("llama.pooling_type", 1000), "ModelLoadError", r"pooling_type"),
    ("context_length 0", _set("llama.context_length", 0), "ModelLoadError|ok", r"context_length"),
    ("a chat template that recurses forever", _set(
        "tokenizer.chat_template", "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "STRING"), "ok", ""),
]
# files some cases of tests/crash_cases.py load by name
_NAMED = {"recursive-template": "a chat template that recurses forever",
          "rwkv-on-spm": "rwkv over an SPM vocabulary"}


def _file_name(name: str) -> str:
    return name + ".gguf"


def _aligned_variant(path: Path, alignment: int) -> None:
    """The synthetic model with general.alignment = `alignment` (< 32: with general.name
    padded so that the tensor data does not start on a 32-byte boundary)."""
    for pad in range(64):
        def edit(m):
            m.writer.data_alignment = alignment
            m.kv["general.alignment"] = _gv(alignment, "UINT32")
            m.kv["general.name"] = _gv("polyllama-corrupt-test" + "x" * pad, "STRING")
        write_synthetic_model(path, edit)
        buf = path.read_bytes()
        lay = parse_layout(buf)
        if alignment >= 32 or lay.data_start % 32:
            return
    raise AssertionError(f"no padding puts the data of alignment {alignment} off 32 bytes")


def write_semantic_variants(outdir: str | os.PathLike) -> list:
    """Write every SEMANTIC variant into outdir as '<name>.gguf' (plus the named copies
    crash_cases.py loads); returns [(path, name, expect, match)]."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    items = []
    for name, edit, expect, match in SEMANTIC:
        path = out / _file_name(name)
        if isinstance(edit, str) and edit.startswith("alignment:"):
            _aligned_variant(path, int(edit.split(":")[1]))
        else:
            write_synthetic_model(path, edit)
        items.append((str(path), name, expect, match))
    for alias, name in _NAMED.items():
        (out / f"{alias}.gguf").write_bytes((out / _file_name(name)).read_bytes())
    # a model whose block 1 lost its output projection, with vocabulary warnings logged
    # before llama.cpp fails on that: its error must be what the message shows
    def missing(m):
        m.tensors[:] = [t for t in m.tensors if t[0] != "blk.1.attn_output.weight"]
        _tokens(t264="", t265="")(m)
        _set("tokenizer.ggml.bos_token_id", 9999)(m)
        _set("tokenizer.ggml.eos_token_id", 9998)(m)
    write_synthetic_model(out / "missing-tensor.gguf", missing)
    return items


if __name__ == "__main__":
    here = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(here / "src"))
    from polyllama.default_model import default_model_path
    for path, label, name in build_corpus(sys.argv[1], default_model_path()):
        print(path, label, name)
