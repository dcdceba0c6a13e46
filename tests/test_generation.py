"""Generation on the real model: greedy text equals llama.cpp's llama-completion, streaming,
sampling, stop strings, batching, cancellation, threads, context limits."""
import threading
import time

import pytest

from conftest import llama_completion

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_llama_completion(llm, model_path, prompt):
    expected = llama_completion(model_path, prompt, 32)
    got = llm.generate(prompt, max_tokens=32, temperature=0)
    assert got.text == expected
    assert got.finish_reason == "length" and got.generated_tokens == 32


def test_result_fields_and_stats(llm):
    r = llm.generate("The capital of France is", max_tokens=8)
    assert r.prompt_tokens == len(llm.tokenize("The capital of France is", parse_special=True))
    assert len(r.tokens) == r.generated_tokens == 8
    assert r.time_to_first_token > 0
    assert r.prompt_tokens_per_second > 0 and r.generation_tokens_per_second > 0
    assert llm.detokenize(r.tokens) == r.text


def test_stream_concatenation_equals_generate(llm):
    for seed in (None, 7):
        kw = dict(max_tokens=40) if seed is None else dict(max_tokens=40, temperature=0.9, seed=seed)
        pieces = list(llm.stream("The sea at night is", **kw))
        full = llm.generate("The sea at night is", **kw).text
        assert len(pieces) > 5
        assert "".join(pieces) == full


def test_same_seed_same_text_different_seed_different_text(llm):
    p = "My favourite colour is"
    a = llm.generate(p, max_tokens=32, temperature=1.0, seed=1).text
    b = llm.generate(p, max_tokens=32, temperature=1.0, seed=1).text
    c = llm.generate(p, max_tokens=32, temperature=1.0, seed=2).text
    assert a == b
    assert a != c


def test_stop_string_cuts_text_and_spans_pieces(llm):
    full = llm.generate("The capital of France is", max_tokens=32).text
    assert "United States" in full
    # "ted Sta" spans token boundaries ("United", " States")
    r = llm.generate("The capital of France is", max_tokens=32, stop=["ted Sta"])
    assert r.finish_reason == "stop"
    assert r.text == full[:full.index("ted Sta")]
    streamed = "".join(llm.stream("The capital of France is", max_tokens=32, stop=["ted Sta"]))
    assert streamed == r.text


def test_emoji_and_cjk_round_trip_and_stream_unbroken(llm):
    text = "Hello 👋🏽 world — 你好，世界！ 日本語のテキスト 🚀✨"
    toks = llm.tokenize(text, add_special=False)
    assert llm.detokenize(toks) == text
    # tokens are byte-level: single characters span several tokens
    assert any(not llm._model.token_to_piece(t).decode("utf-8", "ignore") for t in toks)
    pieces = list(llm.stream("Translate to Chinese: good morning 🌅 ->", max_tokens=24, temperature=0))
    for p in pieces:
        assert "\ufffd" not in p
    assert "".join(pieces) == llm.generate("Translate to Chinese: good morning 🌅 ->", max_tokens=24).text


def test_batched_equals_one_by_one(llm):
    prompts = PROMPTS + ["The best way to learn programming is"]
    single = [llm.generate(p, max_tokens=16).text for p in prompts]
    batched = llm.generate(prompts, max_tokens=16)
    assert [r.text for r in batched] == single
    assert all(r.generated_tokens == 16 for r in batched)


def test_batched_more_prompts_than_sequences(llm):
    prompts = [f"Count to {i}:" for i in range(1, 11)]   # n_seq_max is 8: two waves
    out = llm.generate(prompts, max_tokens=6)
    assert len(out) == 10
    assert [r.text for r in out] == [llm.generate(p, max_tokens=6).text for p in prompts]


def test_batched_prompts_longer_than_one_batch(llm, model_path):
    # the prompts of a wave go through one decode when they fit in n_batch; here they do
    # not (n_batch 16), so each prompt is decoded alone: same text either way
    from polyllama import LLM
    prompts = PROMPTS + ["The best way to learn programming is"]
    with LLM(model_path, backend="cpu", n_threads=2, n_ctx=1024, n_batch=16, n_seq_max=4) as small:
        out = small.generate(prompts, max_tokens=8)
    assert [r.text for r in out] == [llm.generate(p, max_tokens=8).text for p in prompts]


def test_batched_with_a_kv_cache_per_sequence(llm, model_path):
    # kv_unified=False: llama.cpp's own default for parallel sequences, each sequence has
    # n_ctx / n_seq_max cells of its own (llama.cpp rounds that up to a multiple of 256 and
    # grows n_ctx to match); same greedy text as one prompt at a time
    from polyllama import LLM
    from polyllama.errors import ContextOverflowError
    prompts = PROMPTS + ["The best way to learn programming is"]
    with LLM(model_path, backend="cpu", n_threads=2, n_ctx=1000, n_seq_max=4, kv_unified=False) as split:
        assert split._ctx.n_ctx_seq == 256 and split.n_ctx == 1024
        out = split.generate(prompts, max_tokens=12)
        assert [r.text for r in out] == [llm.generate(p, max_tokens=12).text for p in prompts]
        # one prompt gets its sequence's share, not the whole context
        assert split.generate(prompts[0], max_tokens=12).text == out[0].text
        with pytest.raises(ContextOverflowError, match="the context holds 256"):
            split.generate(list(range(100, 400)), max_tokens=4)


def test_cancel_from_another_thread(llm):
    before = llm.generate("The capital of France is", max_tokens=4).text
    started = threading.Event()

    def run():
        for _ in llm.stream("Tell me a very long story.", max_tokens=4000, ignore_eos=True):
            started.set()

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(30)
    t0 = time.monotonic()
    llm.cancel()
    t.join(5)
    assert not t.is_alive()
    assert time.monotonic() - t0 < 1.0
    # still usable and deterministic afterwards
    assert llm.generate("The capital of France is", max_tokens=4).text == before


def test_cancel_sets_finish_reason(llm):
    res = {}

    def run():
        res["r"] = llm.generate("Tell me a very long story.", max_tokens=4000, ignore_eos=True)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)
    llm.cancel()
    t.join(10)
    assert res["r"].finish_reason == "cancelled"
    assert 0 < res["r"].generated_tokens < 4000


def test_threads_share_one_llm_without_corruption(llm):
    expected = {p: llm.generate(p, max_tokens=12).text for p in PROMPTS}
    results, errors = [], []

    def worker(p):
        try:   # one generate and one stream each: neither interleaves with another thread's
            results.append((p, llm.generate(p, max_tokens=12).text))
            results.append((p, "".join(llm.stream(p, max_tokens=12))))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(PROMPTS[i % 3],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert len(results) == 16
    assert all(text == expected[p] for p, text in results)


def test_context_overflow_raises_and_truncate_works(model_path):
    from polyllama import LLM, ContextOverflowError
    with LLM(model_path, backend="cpu", n_ctx=256, n_threads=2) as small:
        assert small.n_ctx == 256
        long_prompt = "word " * 300
        with pytest.raises(ContextOverflowError, match="the prompt has 30[0-9] tokens but the context holds 256"):
            small.generate(long_prompt, max_tokens=4)
        r = small.generate(long_prompt, max_tokens=4, truncate=True)
        assert r.generated_tokens == 4
        # generation that reaches the end of the context stops with "length"
        r = small.generate("Once upon a time", max_tokens=1000, ignore_eos=True)
        assert r.finish_reason == "length"
        # the last token is sampled from the final logits and needs no cache cell
        assert r.prompt_tokens + r.generated_tokens == 256 + 1


def test_logprobs(llm):
    r = llm.generate("The capital of France is", max_tokens=3, n_probs=5)
    assert len(r.logprobs) == 3
    for step, tok in zip(r.logprobs, r.tokens):
        assert len(step) == 5
        assert step[0][0] == tok           # greedy: the chosen token is the most likely
        lps = [lp for _, lp in step]
        assert lps == sorted(lps, reverse=True) and all(lp <= 0 for lp in lps)


def test_grammar_constrains_output(llm):
    r = llm.generate("Is Paris in France? Answer:", max_tokens=8, grammar='root ::= " yes" | " no"')
    assert r.text in (" yes", " no")


def test_json_schema_output_validates(llm):
    import json
    import jsonschema
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
              "required": ["city", "population"]}
    r = llm.generate("Give the largest city of France as JSON:", max_tokens=64, json_schema=schema)
    data = json.loads(r.text)
    jsonschema.validate(data, schema)


def test_logit_bias_bans_a_token(llm):
    tok = llm.tokenize(" Paris", add_special=False)[0]
    r = llm.generate("The capital of France is", max_tokens=4, logit_bias={tok: -1000.0})
    assert tok not in r.tokens


def test_embeddings(llm):
    import math
    a, b, c = llm.embed(["The cat sat on the mat.", "A cat is sitting on a mat.", "Stock markets fell sharply."])
    assert len(a) == llm.metadata["n_embd"]
    assert abs(math.sqrt(sum(x * x for x in a)) - 1.0) < 1e-4

    def cos(u, v):
        return sum(x * y for x, y in zip(u, v))
    assert cos(a, b) > cos(a, c)


def test_metadata(llm):
    md = llm.metadata
    assert md["architecture"] == "llama"
    assert md["n_vocab"] == 49152 and md["n_layer"] == 30
    assert md["n_ctx_train"] == 8192
    assert 130e6 < md["n_params"] < 140e6
    assert "im_start" in md["chat_template"]
    assert "Q4_1" in md["quantization"]
    assert llm.n_ctx == 4096
