"""Tokenization against llama.cpp's own test vectors (models/ggml-vocab-*.gguf + .inp/.out),
read with the same conventions as llama.cpp's tests/test-tokenizer-0.cpp."""
from pathlib import Path

import pytest

from polyllama import Tokenizer

MODELS = Path(__file__).resolve().parent.parent / "thirdparty" / "llama.cpp" / "models"
SEP = "\n__ggml_vocab_test__\n"
VOCABS = ["gpt-2", "llama-spm", "llama-bpe", "qwen2", "phi-3", "deepseek-coder", "falcon", "starcoder"]


def load_cases(name):
    # bytes, not read_text(): universal newlines would turn "\r\n" cases into "\n"
    inp = (MODELS / f"ggml-vocab-{name}.gguf.inp").read_bytes().decode("utf-8")
    out = (MODELS / f"ggml-vocab-{name}.gguf.out").read_bytes().decode("utf-8")
    texts = inp.split(SEP)
    # the .inp file ends with a separator followed by nothing
    if texts and texts[-1] == "":
        texts = texts[:-1]
    ids = [[int(x) for x in line.split()] for line in out.split("\n")]
    return list(zip(texts, ids[:len(texts)]))


@pytest.mark.parametrize("name", VOCABS)
def test_tokenizer_matches_llama_cpp_vectors(name):
    path = MODELS / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        pytest.fail(f"{path} missing from the pinned tree")
    tok = Tokenizer(str(path))
    cases = load_cases(name)
    assert len(cases) > 20
    failures = []
    for text, expected in cases:
        got = tok.tokenize(text, add_special=False, parse_special=False)
        if got != expected:
            failures.append((text, expected, got))
    assert not failures, f"{len(failures)}/{len(cases)} differ; first: {failures[0]!r}"
