"""The sequence engine (polyllama.Engine): continuous batching, prefix reuse, eviction,
cancellation and who steps, on the real model.

The property every test here leans on: a request's greedy tokens are the same whether it
runs alone on a fresh engine or beside others, after others, or from a cached prefix.
"""
from __future__ import annotations

import gc
import threading

import pytest

from polyllama import LLM, GrammarError, SamplingParams
from polyllama.engine import Delta, Request

PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):", "Water boils at",
           "The best way to learn programming is", "My favourite fruit is"]


@pytest.fixture(scope="module")
def small(model_path):
    """Few slots and a small context, so that queueing and eviction happen."""
    with LLM(model_path, backend="cpu", n_threads=2, n_ctx=1024, n_seq_max=3) as m:
        yield m


def alone(model_path, prompt, n=12, **kw) -> list[int]:
    """Tokens of prompt on a fresh LLM that has never run anything else."""
    with LLM(model_path, backend="cpu", n_threads=2, n_ctx=1024, n_seq_max=1) as m:
        return m.generate(prompt, max_tokens=n, **kw).tokens


@pytest.fixture(scope="module")
def expected(model_path):
    return {p: alone(model_path, p) for p in PROMPTS}


def test_submit_gives_deltas_and_a_result_equal_to_generate(llm):
    req = llm.engine.submit("The capital of France is", max_tokens=12)
    assert isinstance(req, Request) and req.n_prompt > 0
    deltas = list(req)
    assert all(isinstance(d, Delta) for d in deltas) and req.done
    res = req.result()
    assert "".join(d.text for d in deltas) == res.text
    assert sum((d.tokens for d in deltas), []) == res.tokens
    assert res.text == llm.generate("The capital of France is", max_tokens=12).text


def test_greedy_tokens_do_not_depend_on_neighbours(small, expected):
    # all at once: 6 requests on 3 slots, the last three join as the first ones finish
    reqs = [small.engine.submit(p, max_tokens=12) for p in PROMPTS]
    got = [r.result().tokens for r in reqs]
    assert got == [expected[p] for p in PROMPTS]
    # staggered: each new request joins a batch already running
    running = small.engine.submit(PROMPTS[0], max_tokens=40)
    it = iter(running)
    next(it)
    late = small.engine.submit(PROMPTS[1], max_tokens=12)
    assert late.result().tokens == expected[PROMPTS[1]]
    rest = list(it)
    t_run, t_late = running.timings, late.timings
    assert t_late["t_start"] < t_run["t_end"], "the late request did not join the running batch"
    assert (running.result().tokens[:12] == expected[PROMPTS[0]]) and rest


def test_greedy_tokens_do_not_depend_on_what_the_cache_held(small, expected):
    # a cache that other sequences filled, freed and refilled (holes below new prefixes):
    # patch 0001 keeps every sequence's cells in position order, so outputs stay exact
    small.generate(["Hello there friend", "A B C D E F G H"], max_tokens=3)
    small.generate(PROMPTS[1] + ", there", max_tokens=2)
    for p in PROMPTS:
        r = small.generate(p, max_tokens=12)
        assert r.tokens == expected[p], (p, r.cached_tokens)


def test_a_chat_continued_by_one_more_turn_starts_after_the_cached_turn(small, model_path):
    small.engine.clear_cache()
    system = "You answer in one short sentence. " + "Facts: the sky is blue, grass is green. " * 40
    history = [{"role": "system", "content": system}, {"role": "user", "content": "Name three colours."}]
    first = small.chat(history, max_tokens=16)
    assert first.prompt_tokens > 300
    history += [{"role": "assistant", "content": first.text},
                {"role": "user", "content": "And three animals?"}]
    before = small.engine.stats()
    second = small.chat(history, max_tokens=16)
    after = small.engine.stats()
    # the first turn's prompt was in the cache (its reply too, but a fresh read computes
    # those tokens as prompt rows, differently from generation: they are read again)
    assert second.cached_tokens >= first.prompt_tokens - 64, (second.cached_tokens, first.prompt_tokens)
    assert after["prompt_tokens_reused"] - before["prompt_tokens_reused"] == second.cached_tokens
    assert after["tokens_decoded"] - before["tokens_decoded"] <= second.prompt_tokens - second.cached_tokens + 16
    # and the reply is token for token the one a fresh engine gives
    with LLM(model_path, backend="cpu", n_threads=2, n_ctx=1024, n_seq_max=1) as fresh:
        assert fresh.chat(history, max_tokens=16).tokens == second.tokens


def test_a_running_requests_prefix_is_copied_to_a_new_one(small, model_path):
    small.engine.clear_cache()
    system = "You are a careful assistant. " * 30           # ~180 tokens shared by both
    a = small.engine.submit(system + "Question: what is 2+2?", max_tokens=30)
    next(iter(a))                                            # a is read and generating
    b = small.engine.submit(system + "Question: what is the capital of Italy?", max_tokens=8)
    rb = b.result()
    a.result()
    assert rb.cached_tokens >= 60, rb.cached_tokens          # copied from a's slot
    with LLM(model_path, backend="cpu", n_threads=2, n_ctx=1024, n_seq_max=1) as fresh:
        assert fresh.generate(system + "Question: what is the capital of Italy?", max_tokens=8).tokens == rb.tokens


def test_the_cache_is_bounded_by_slots_and_context(small):
    for i in range(4 * small.engine.n_slots):
        small.generate(f"Item number {i} of a long list:", max_tokens=4)
    st = small.engine.stats()
    assert st["live"] == 0 and st["queued"] == 0
    assert st["cached_slots"] <= small.engine.n_slots
    assert st["kv_cells_used"] <= small.n_ctx


def test_requests_beyond_the_kv_cache_wait_for_room(model_path):
    # two requests that reserve most of a small context each: the second waits for the
    # first instead of failing or cutting it short
    with LLM(model_path, backend="cpu", n_threads=2, n_ctx=256, n_seq_max=2) as m:
        a = m.engine.submit("Tell me a story.", max_tokens=180, ignore_eos=True)
        b = m.engine.submit("Tell me a poem.", max_tokens=180, ignore_eos=True)
        ra, rb = a.result(), b.result()
        assert ra.generated_tokens == rb.generated_tokens == 180
        assert b.timings["t_start"] >= a.timings["t_end"] - 1e-3


def test_cancel_one_request_leaves_the_others(small, expected):
    keep = small.engine.submit(PROMPTS[2], max_tokens=12)
    drop = small.engine.submit("Tell me a long story.", max_tokens=400, ignore_eos=True)
    it = iter(drop)
    next(it)
    drop.cancel()
    list(it)
    assert drop.result().finish_reason == "cancelled"
    assert keep.result().tokens == expected[PROMPTS[2]]


def test_a_dropped_stream_frees_its_slot(small):
    s = small.stream("Tell me a long story.", max_tokens=400, ignore_eos=True)
    next(s)
    assert small.engine.stats()["live"] == 1
    del s
    gc.collect()
    small.generate("Hi", max_tokens=2)   # the next step finishes the released request
    st = small.engine.stats()
    assert st["live"] == 0 and st["queued"] == 0


def test_a_stream_left_open_by_an_exited_thread_does_not_wedge_the_llm(small, expected):
    kept = []

    def opener():
        s = small.stream("Tell me a long story.", max_tokens=60, ignore_eos=True)
        next(s)
        kept.append(s)           # outlives the thread, never read again

    t = threading.Thread(target=opener)
    t.start()
    t.join(30)
    assert not t.is_alive()
    assert small.generate(PROMPTS[3], max_tokens=12).tokens == expected[PROMPTS[3]]
    # the orphan went on beside it and can still be read here, on another thread
    assert "".join(kept[0])


def test_prompts_as_token_ids_in_a_batch(llm):
    ids = [llm.tokenize(p) for p in PROMPTS[:3]]
    by_ids = llm.generate(ids, max_tokens=8)
    by_text = llm.generate(PROMPTS[:3], max_tokens=8)
    assert [r.tokens for r in by_ids] == [r.tokens for r in by_text]


def test_a_driver_thread_steps_and_consumers_poll(model_path, expected):
    with LLM(model_path, backend="cpu", n_threads=2, n_ctx=1024, n_seq_max=4) as m:
        changed = []
        done = threading.Event()

        def on_step(ids):
            changed.extend(ids)
            done.set()

        m.engine.run_in_thread(on_step)
        try:
            reqs = [m.engine.submit(p, max_tokens=12) for p in PROMPTS[:4]]
            tokens = {r.id: [] for r in reqs}
            while not all(r.done for r in reqs):
                done.wait(5)
                done.clear()
                for r in reqs:
                    d = r.poll()
                    if d is not None:
                        tokens[r.id] += d.tokens
            assert [tokens[r.id] for r in reqs] == [expected[p] for p in PROMPTS[:4]]
            assert set(changed) >= {r.id for r in reqs}
        finally:
            m.engine.stop_thread()


def test_an_unsatisfiable_grammar_ends_the_request_not_the_process(small, expected):
    a = small.tokenize("a", add_special=False)
    assert len(a) == 1
    for temperature in (0.0, 0.8):
        with pytest.raises(GrammarError, match="no token is possible"):
            small.generate("Say a", grammar='root ::= "a"', logit_bias={a[0]: float("-inf")},
                           temperature=temperature, max_tokens=4)
    assert small.generate(PROMPTS[0], max_tokens=12).tokens == expected[PROMPTS[0]]


def test_engine_facts_and_closed_errors(model_path):
    m = LLM(model_path, backend="cpu", n_threads=2, n_ctx=512, n_seq_max=2)
    eng = m.engine
    assert eng.n_slots == 2
    req = eng.submit("Hello", SamplingParams(max_tokens=2))
    req.result()
    m.close()
    with pytest.raises(Exception, match="closed"):
        eng.submit("Hello", max_tokens=2)


def _results(m, prompts, **sp):
    """Every prompt submitted before anybody waits, so the engine admits them in one step."""
    reqs = [m.engine.submit(p, **sp) for p in prompts]
    return [r.result() for r in reqs]


def _tokens(m, prompts, **sp):
    return [r.tokens for r in _results(m, prompts, **sp)]


@pytest.mark.parametrize("kv_unified", [True, False])
def test_greedy_picked_in_the_decode_graph_equals_the_host_pick(model_path, kv_unified):
    # device_sampling=True on the CPU runs what it runs on a GPU (thirdparty patch 0004): a
    # decode whose outputs are all plain greedy picks that ban the same token (or none) gets
    # them from one arg-max in its graph, and only the token ids come back. With a KV cache
    # per sequence llama.cpp cuts such a batch into several micro-batches whose picks are
    # gathered in turn
    kw = dict(backend="cpu", n_threads=2, n_ctx=1024, n_seq_max=3, kv_unified=kv_unified)
    prompts = PROMPTS[:3]
    with LLM(model_path, **kw) as host, LLM(model_path, device_sampling=True, **kw) as dev:
        def picked():
            return dev.engine.stats()["tokens_picked_on_device"]
        want = _tokens(host, prompts, max_tokens=24, ignore_eos=True)
        assert _tokens(dev, prompts, max_tokens=24, ignore_eos=True) == want
        assert picked() == 3 * 24   # ignore_eos: the end-of-sequence token banned in the graph
        plain = _results(host, prompts, max_tokens=12)
        before = picked()
        got = _results(dev, prompts, max_tokens=12)
        assert [r.tokens for r in got] == [r.tokens for r in plain]
        # every pick in the graph, the end-of-sequence ones included
        assert picked() - before == sum(len(r.tokens) + (r.finish_reason == "stop") for r in got)
        # off by default on the CPU (the backend table: its arg-max kernel is one thread's)
        assert host.engine.stats()["tokens_picked_on_device"] == 0
        assert not host.placement.device_sampling and dev.placement.device_sampling

        # a batch with an output that needs its logits (log-probabilities), or whose bans
        # differ, is read on the host as a whole: the same tokens, none picked in the graph
        before = picked()
        reqs = [dev.engine.submit(p, max_tokens=12, ignore_eos=True) for p in prompts[:2]]
        probs = dev.engine.submit(prompts[2], max_tokens=12, ignore_eos=True, n_probs=2)
        assert [r.result().tokens for r in reqs] == [w[:12] for w in want[:2]]
        assert probs.result().tokens == want[2][:12] and len(probs.result().logprobs) == 12
        banned = dev.engine.submit(prompts[0], max_tokens=12, ignore_eos=True)
        free = dev.engine.submit(prompts[1], max_tokens=12)
        assert banned.result().tokens == want[0][:12] and free.result().tokens == plain[1].tokens
        assert picked() == before
        # a sampled request in the same slots, then picks in the graph again
        assert len(dev.engine.submit(prompts[1], max_tokens=8, temperature=0.7, seed=3,
                                     ignore_eos=True).result().tokens) == 8
        assert _tokens(dev, prompts, max_tokens=24, ignore_eos=True) == want
        assert picked() == before + 3 * 24


def test_picks_in_the_graph_take_the_first_of_tied_logits(tmp_path):
    # a model whose output rows are all equal: every logit ties, and llama.cpp's greedy pick
    # (and polyllama's host scan) is the first token. ggml's CPU arg-max took the last one
    # until patch 0004 made every arg-max kernel take the first
    from gguf_corpus import write_synthetic_model

    def same_rows(model):   # the output matrix is the token embedding (tied)
        emb = next(t for t in model.tensors if t[0] == "token_embd.weight")[1]
        emb[:] = emb[-1]
    path = write_synthetic_model(tmp_path / "tied.gguf", same_rows)
    for device_sampling in (False, True):
        with LLM(path, backend="cpu", n_threads=2, n_ctx=256, n_seq_max=1, device_sampling=device_sampling) as m:
            logits = m.logits("the cat")
            assert min(logits) == max(logits)
            assert m.generate("the cat", max_tokens=5, ignore_eos=True).tokens == [0] * 5
            assert m.engine.stats()["tokens_picked_on_device"] == (5 if device_sampling else 0)


def test_shared_scans_pick_what_one_thread_picks(model_path, expected):
    # n_threads_sample > 1 on the CPU runs what GPU placements do by default: with fewer
    # sequences than threads each plain greedy scan is cut into ranges (csrc/scan_pool.h),
    # with more each sequence is one thread's job
    with LLM(model_path, backend="cpu", n_threads=2, n_ctx=1024, n_seq_max=6, n_threads_sample=5) as m:
        assert m.generate(PROMPTS[0], max_tokens=12).tokens == expected[PROMPTS[0]]
        assert m.engine.stats()["tokens_picked_in_ranges"] == 12
        # ignore_eos: the ranges skip the end-of-sequence token as the single scan does
        with LLM(model_path, backend="cpu", n_threads=2, n_ctx=1024, n_seq_max=1) as one:
            want = one.generate("Hi", max_tokens=40, ignore_eos=True).tokens
            assert one.engine.stats()["tokens_picked_in_ranges"] == 0   # 1 thread on the CPU
        assert m.generate("Hi", max_tokens=40, ignore_eos=True).tokens == want
        assert m.engine.stats()["tokens_picked_in_ranges"] == 52
        # two plain ones in ranges beside a request with log-probabilities and one with a
        # sampler chain (a neutral logit bias), which are whole jobs in the same pick
        plain = [m.engine.submit(p, max_tokens=12) for p in PROMPTS[1:3]]
        probs = m.engine.submit(PROMPTS[0], max_tokens=12, n_probs=2)
        chain = m.engine.submit(PROMPTS[3], max_tokens=12, logit_bias={0: 0.0})
        assert [r.result().tokens for r in plain] == [expected[p] for p in PROMPTS[1:3]]
        res = probs.result()
        assert res.tokens == expected[PROMPTS[0]] and len(res.logprobs) == 12
        assert chain.result().tokens == expected[PROMPTS[3]]
        assert m.engine.stats()["tokens_picked_in_ranges"] == 52 + 24
        # as many sequences as threads or more: a job each, no ranges
        reqs = [m.engine.submit(p, max_tokens=12) for p in PROMPTS]
        assert [r.result().tokens for r in reqs] == [expected[p] for p in PROMPTS]
        assert m.engine.stats()["tokens_picked_in_ranges"] == 52 + 24


def test_device_sampling_must_be_a_bool_or_none(model_path):
    with pytest.raises(TypeError, match=r"^device_sampling must be None, True or False, not 'yes'$"):
        LLM(model_path, backend="cpu", device_sampling="yes")
