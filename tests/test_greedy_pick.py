"""The vectorized greedy pick (Context.argmax) picks what llama.cpp's greedy sampler picks."""
import array

from polyllama import _core as core

PROMPTS = ["The capital of France is", "def fibonacci(n):", "日本の首都は", "1, 2, 3, 4,"]


def _greedy_sampler_pick(llm, idx):
    s = core.Sampler(llm._model)
    s.add_greedy()
    try:
        return s.sample(llm._ctx, idx)
    finally:
        s.close()


def test_argmax_equals_llama_greedy_sampler_at_every_position(llm):
    ctx = llm._ctx
    checked = 0
    for prompt in PROMPTS:
        toks = llm.tokenize(prompt)
        llm._forget_cache()
        ctx.decode(toks, 0, 0, logits_all=True)
        for idx in range(len(toks)):
            assert ctx.argmax(idx) == _greedy_sampler_pick(llm, idx)
            checked += 1
    llm._forget_cache()
    assert checked >= 16


def test_argmax_skips_the_excluded_token_and_restores_its_logit(llm):
    ctx = llm._ctx
    llm._forget_cache()
    ctx.decode(llm.tokenize("Once upon a"), 0, 0)
    before = ctx.logits(-1)
    first = ctx.argmax(-1)
    second = ctx.argmax(-1, first)
    ranked = sorted(range(len(before)), key=lambda i: (-before[i], i))
    assert (first, second) == (ranked[0], ranked[1])
    assert ctx.logits(-1) == before          # the excluded logit was put back
    assert ctx.argmax(-1, len(before) + 5) == first   # an id out of range excludes nothing
    llm._forget_cache()
    assert isinstance(before, array.array) and before.typecode == "f"
