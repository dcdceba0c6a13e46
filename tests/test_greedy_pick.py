"""The engine's vectorized greedy pick (native argmax_f32) picks what llama.cpp's greedy
sampler picks. Plain greedy decoding takes the fast path; a logit bias of 0 on one token
changes no logit but sends every step through llama.cpp's sampler chain (bias, greedy)."""

PROMPTS = ["The capital of France is", "def fibonacci(n):", "日本の首都は", "1, 2, 3, 4,"]
NEUTRAL = {0: 0.0}   # a bias that changes nothing but is not "plain greedy"


def test_argmax_equals_llama_greedy_sampler_at_every_position(llm):
    checked = 0
    for prompt in PROMPTS:
        fast = llm.generate(prompt, max_tokens=24, ignore_eos=True)
        chain = llm.generate(prompt, max_tokens=24, ignore_eos=True, logit_bias=NEUTRAL)
        assert fast.tokens == chain.tokens, prompt
        checked += len(fast.tokens)
    assert checked >= 64


def test_argmax_skips_the_excluded_token(llm):
    # a chat turn that ends: the model wants its end-of-turn token early
    prompt = llm.apply_chat_template([{"role": "user", "content": "Say OK."}])["prompt"]
    ended = llm.generate(prompt, max_tokens=40)
    assert ended.finish_reason == "stop" and ended.generated_tokens < 40
    # ignore_eos: the fast path excludes EOS from its arg-max, the chain biases it to -inf
    fast = llm.generate(prompt, max_tokens=40, ignore_eos=True)
    chain = llm.generate(prompt, max_tokens=40, ignore_eos=True, logit_bias=NEUTRAL)
    eos = llm._model.token_eos
    assert fast.tokens == chain.tokens and eos not in fast.tokens
    assert fast.generated_tokens == 40 and fast.tokens[:ended.generated_tokens] == ended.tokens
