#!/usr/bin/env python3
"""Write a llama-architecture GGUF with random weights in a real model's shape.

Speed does not depend on weight values, so benchmarks on machines that cannot download
real models use these. The tokenizer (Llama 3's BPE vocabulary, 128256 tokens) is copied
from llama.cpp's own test vocabulary models/ggml-vocab-llama-bpe.gguf of the pinned tree;
the writer is the tree's gguf-py. Weights are written as F16; quantize with llama-quantize
from the same build (Q4_0, Q8_0, ...).

    python benchmarks/make_random_model.py --shape 1b -o /tmp/llama-1b-f16.gguf
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "thirdparty" / "llama.cpp"
sys.path.insert(0, str(LLAMA / "gguf-py"))

import numpy as np  # noqa: E402
import gguf  # noqa: E402

# Shapes of Llama 3.2 1B and Llama 3.1 8B.
SHAPES = {
    "1b": dict(n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192, tied=True),
    "8b": dict(n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, n_ff=14336, tied=False),
    "tiny": dict(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=512, tied=True),
}


def copy_tokenizer(writer: gguf.GGUFWriter, vocab_file: Path) -> int:
    reader = gguf.GGUFReader(str(vocab_file))
    n_vocab = 0
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == gguf.GGUFValueType.STRING:
                val = [bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data]
            else:
                val = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_array(field.name, val)
            if field.name == "tokenizer.ggml.tokens":
                n_vocab = len(val)
        elif vtype == gguf.GGUFValueType.STRING:
            writer.add_string(field.name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            writer.add_key_value(field.name, field.parts[field.data[0]].tolist()[0], vtype)
    return n_vocab


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--vocab", default=str(LLAMA / "models" / "ggml-vocab-llama-bpe.gguf"))
    args = ap.parse_args()
    s = SHAPES[args.shape]
    w = gguf.GGUFWriter(args.output, "llama")
    w.add_name(f"random-llama-{args.shape}")
    n_vocab = copy_tokenizer(w, Path(args.vocab))
    head_dim = s["n_embd"] // s["n_head"]
    w.add_context_length(8192)
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    rng = np.random.default_rng(0)
    # one random block reused for every tensor: values do not matter for speed, and
    # generating gigabytes of fresh random numbers would dominate the run time
    pool = (rng.standard_normal(1 << 24, dtype=np.float32) * 0.02).astype(np.float16)

    def tensor(shape):
        n = int(np.prod(shape))
        reps = -(-n // pool.size)
        data = np.tile(pool, reps)[:n] if reps > 1 else pool[:n]
        return data.reshape(shape)

    kv = s["n_head_kv"] * head_dim
    e, f = s["n_embd"], s["n_ff"]
    w.add_tensor("token_embd.weight", tensor((n_vocab, e)))
    for i in range(s["n_layer"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(e, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", tensor((e, e)))
        w.add_tensor(p + "attn_k.weight", tensor((kv, e)))
        w.add_tensor(p + "attn_v.weight", tensor((kv, e)))
        w.add_tensor(p + "attn_output.weight", tensor((e, e)))
        w.add_tensor(p + "ffn_norm.weight", np.ones(e, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", tensor((f, e)))
        w.add_tensor(p + "ffn_up.weight", tensor((f, e)))
        w.add_tensor(p + "ffn_down.weight", tensor((e, f)))
    w.add_tensor("output_norm.weight", np.ones(e, dtype=np.float32))
    if not s["tied"]:
        w.add_tensor("output.weight", tensor((n_vocab, e)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
