"""Every bad argument of the public API raises a specific exception with a helpful message.

One table: (case, call, exception class, regex the message must match). The calls run on
the real default model. Runs in about 10 s on 2 shared cores.
"""
from __future__ import annotations

import re

import pytest

from polyllama import (LLM, ContextOverflowError, GrammarError, InsufficientMemoryError, ModelLoadError,
                       PolyllamaError, SamplingParams, TemplateError, Tokenizer, UnknownBackendError)

SMALL = dict(backend="cpu", n_ctx=64, n_threads=2)
USER = [{"role": "user", "content": "Hi"}]


def _nested(depth):
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def new(**kw):
    return lambda llm, path: LLM(path, **{**SMALL, **kw})


# (case, call(llm, model_path), exception, message regex)
CASES = [
    # ---- LLM(...) ---------------------------------------------------------------------
    ("model is an int", lambda llm, p: LLM(123, **SMALL), TypeError, r"model must be a path, not int"),
    ("model file missing", lambda llm, p: LLM("/nonexistent/m.gguf", **SMALL), ModelLoadError,
     r"model file not found: /nonexistent/m\.gguf"),
    ("model is a directory", lambda llm, p: LLM("/tmp", **SMALL), ModelLoadError,
     r"the model path /tmp is a directory; give the path of a \.gguf file"),
    ("model is /dev/zero", lambda llm, p: LLM("/dev/zero", **SMALL), ModelLoadError,
     r"/dev/zero is a character device, not a regular file"),
    ("n_ctx negative", new(n_ctx=-1), ValueError, r"n_ctx must be between 0 and 16777216, got -1"),
    ("n_ctx huge", new(n_ctx=1 << 30), ValueError, r"n_ctx must be between 0 and 16777216"),
    ("n_ctx a str", new(n_ctx="4096"), TypeError, r"n_ctx must be an int, not '4096'"),
    ("n_ctx a float", new(n_ctx=64.0), TypeError, r"n_ctx must be an int, not 64\.0"),
    ("n_ctx beyond memory", new(n_ctx=1 << 24), InsufficientMemoryError,
     r"n_ctx=16777216 needs \d+ MiB of host memory .* use a smaller n_ctx"),
    ("n_batch zero", new(n_batch=0), ValueError, r"n_batch must be between 1 and 16777216, got 0"),
    ("n_ubatch negative", new(n_ubatch=-5), ValueError, r"n_ubatch must be between 1 and 16777216, got -5"),
    ("n_batch 2**31", new(n_batch=2**31), ValueError, r"n_batch must be between 1 and 16777216, got 2147483648"),
    ("n_batch below n_seq_max", new(n_batch=7), ValueError, r"n_batch \(7\) must be at least n_seq_max \(8\)"),
    ("n_ctx below n_seq_max", new(n_ctx=7), ValueError, r"n_ctx \(7\) must be at least n_seq_max \(8\)"),
    ("n_seq_max too large", new(n_seq_max=1000), ValueError, r"n_seq_max must be between 1 and 256, got 1000"),
    ("use_mmap a str", new(use_mmap="no"), TypeError, r"use_mmap must be True or False, not 'no'"),
    ("chat_template with a lone surrogate", new(chat_template="{{ 1 }}\udc80"), ValueError,
     r"chat_template contains '\\udc80' at index 7, a lone surrogate"),
    ("n_seq_max None", new(n_seq_max=None), TypeError, r"n_seq_max must be an int, not None"),
    ("n_threads zero", new(n_threads=0), ValueError, r"n_threads must be between 1 and 1024, got 0"),
    ("n_threads a str", new(n_threads="2"), TypeError, r"n_threads must be a positive int or None, not '2'"),
    ("n_threads_batch negative", new(n_threads_batch=-1), ValueError,
     r"n_threads_batch must be between 1 and 1024, got -1"),
    ("n_threads_sample zero", new(n_threads_sample=0), ValueError, r"n_threads_sample must be between 1 and 1024, got 0"),
    ("n_threads_sample a float", new(n_threads_sample=2.0), TypeError,
     r"n_threads_sample must be a positive int or None, not 2\.0"),
    ("flash_attn a bool", new(flash_attn=True), ValueError, r"flash_attn must be 'auto', 'on' or 'off', not True"),
    ("backend unknown", new(backend="tpu"), UnknownBackendError, r"unknown backend 'tpu'; use one of: auto, cpu"),
    ("backend an int", new(backend=5), TypeError, r"backend must be a string, not int"),
    ("n_gpu_layers a word", new(n_gpu_layers="many"), TypeError, r"n_gpu_layers must be 'auto' or an int"),
    ("progress not callable", new(progress=5), TypeError, r"progress must be callable\(fraction\)"),
    ("fallback a str", new(fallback="no"), TypeError, r"fallback must be True or False, not 'no'"),
    ("kv_unified an int", new(kv_unified=1), TypeError, r"kv_unified must be True or False, not 1"),
    ("tensor_split a str", new(tensor_split="ab"), TypeError, r"tensor_split must be a list of numbers"),
    ("rpc_servers an int", new(rpc_servers=5), TypeError, r"rpc_servers must be a list of 'host:port' strings, not 5"),
    ("rpc_timeout a str", new(rpc_timeout="x"), TypeError, r"rpc_timeout must be a number of seconds, not 'x'"),
    ("memory_margin negative", new(memory_margin=-1), ValueError, r"memory_margin must be a number of bytes >= 0"),
    ("memory_margin past int64", new(memory_margin=1 << 63), ValueError,
     r"memory_margin must be a number of bytes >= 0 and below 2\*\*63, got 9223372036854775808"),
    ("chat_template an int", new(chat_template=5), TypeError, r"chat_template must be a Jinja template string or None"),
    ("chat_template broken Jinja", new(chat_template="{% for"), TemplateError,
     r"chat_template cannot be used .* pass a valid Jinja chat template"),
    ("Tokenizer of a missing file", lambda llm, p: Tokenizer("/nonexistent.gguf"), ModelLoadError,
     r"model file not found"),

    # ---- generate / stream: prompts ------------------------------------------------------
    ("empty prompt", lambda llm, p: llm.generate("", max_tokens=1), ValueError, r"the prompt is empty"),
    ("None prompt", lambda llm, p: llm.generate(None, max_tokens=1), TypeError,
     r"prompt must be a string \(or a list of token ids\), not None"),
    ("empty prompt list", lambda llm, p: llm.generate([], max_tokens=1), ValueError, r"the prompt list is empty"),
    ("bytes prompt", lambda llm, p: llm.generate(b"hi", max_tokens=1), TypeError,
     r"prompt must be a non-empty string or list of token ids, not bytes"),
    ("dict prompt", lambda llm, p: llm.generate({"a": 1}, max_tokens=1), TypeError, r"not dict"),
    ("float token ids", lambda llm, p: llm.generate([1.5, 2.0], max_tokens=1), TypeError,
     r"token ids must be ints, not float \(1\.5 at index 0\)"),
    ("bool token ids", lambda llm, p: llm.generate([True, 5], max_tokens=1), TypeError,
     r"token ids must be ints, not bool \(True at index 0\)"),
    ("mixed str and int prompts", lambda llm, p: llm.generate(["a", 1], max_tokens=1), TypeError,
     r"a prompt list holds either prompts \(strings or token-id lists\) or token ids, not both"),
    ("negative token id", lambda llm, p: llm.generate([-1], max_tokens=1), ValueError,
     r"token id -1 in the prompt is out of range 0\.\.49151"),
    ("token id past the vocabulary", lambda llm, p: llm.generate([49152], max_tokens=1), ValueError,
     r"token id 49152 in the prompt is out of range"),
    ("token id beyond int32", lambda llm, p: llm.generate([1 << 40], max_tokens=1), ValueError,
     r"token id 1099511627776 in the prompt is out of range"),
    ("lone surrogate in the prompt", lambda llm, p: llm.generate("a\ud800b", max_tokens=1), ValueError,
     r"the prompt contains '\\ud800' at index 1, a lone surrogate that is not valid in UTF-8"),
    ("prompt too long", lambda llm, p: llm.generate("word " * 5000, max_tokens=1), ContextOverflowError,
     r"the prompt has \d+ tokens but the context holds 4096; use a larger n_ctx.*truncate=True"),
    ("stream of a prompt list", lambda llm, p: llm.stream(["a", "b"]), TypeError,
     r"stream\(\) takes one prompt .* pass a list of prompts to generate\(\)"),
    ("stream of None", lambda llm, p: llm.stream(None), TypeError, r"prompt must be a string"),
    ("logits of an empty prompt", lambda llm, p: llm.logits(""), ValueError, r"the prompt is empty"),

    # ---- sampling parameters ----------------------------------------------------------
    ("unknown sampler keyword", lambda llm, p: llm.generate("hi", temprature=0.5), TypeError,
     r"unknown sampling parameter\(s\) temprature; known: frequency_penalty"),
    ("params of the wrong type", lambda llm, p: llm.generate("hi", {"max_tokens": 1}), TypeError,
     r"params must be a SamplingParams, not dict"),
    ("max_tokens zero", lambda llm, p: llm.generate("hi", max_tokens=0), ValueError, r"max_tokens must be >= 1, got 0"),
    ("max_tokens huge", lambda llm, p: llm.generate("hi", max_tokens=1 << 40), ValueError,
     r"max_tokens must be <= 16777216"),
    ("max_tokens a str", lambda llm, p: llm.generate("hi", max_tokens="4"), TypeError, r"max_tokens must be an int, not '4'"),
    ("temperature negative", lambda llm, p: llm.generate("hi", temperature=-0.1), ValueError,
     r"temperature must be >= 0\.0, got -0\.1"),
    ("temperature NaN", lambda llm, p: llm.generate("hi", temperature=float("nan")), TypeError,
     r"temperature must be a finite number, not nan"),
    ("temperature infinite", lambda llm, p: llm.generate("hi", temperature=float("inf")), TypeError,
     r"temperature must be a finite number, not inf"),
    ("top_p above 1", lambda llm, p: llm.generate("hi", top_p=1.5), ValueError, r"top_p must be <= 1\.0, got 1\.5"),
    ("top_k negative", lambda llm, p: llm.generate("hi", top_k=-1), ValueError, r"top_k must be >= 0, got -1"),
    ("top_k 2**31", lambda llm, p: llm.generate("hi", top_k=2**31), ValueError, r"top_k must be <= 2147483647"),
    ("repeat_last_n 2**63", lambda llm, p: llm.generate("hi", repeat_last_n=2**63), ValueError,
     r"repeat_last_n must be <= 2147483647"),
    ("stop with a lone surrogate", lambda llm, p: llm.generate("hi", stop=["\udc80"]), ValueError,
     r"stop string contains '\\udc80' at index 0, a lone surrogate"),
    ("min_p a str", lambda llm, p: llm.generate("hi", min_p="0.1"), TypeError, r"min_p must be a finite number"),
    ("repeat_last_n below -1", lambda llm, p: llm.generate("hi", repeat_last_n=-2), ValueError,
     r"repeat_last_n must be >= -1, got -2"),
    ("seed negative", lambda llm, p: llm.generate("hi", seed=-1), ValueError, r"seed must be >= 0, got -1"),
    ("seed beyond 32 bits", lambda llm, p: llm.generate("hi", seed=1 << 32), ValueError, r"seed must be <= 4294967295"),
    ("ignore_eos a str", lambda llm, p: llm.generate("hi", ignore_eos="yes"), TypeError,
     r"ignore_eos must be True or False, not 'yes'"),
    ("n_probs too many", lambda llm, p: llm.generate("hi", n_probs=101), ValueError, r"n_probs must be <= 100"),
    ("stop an int", lambda llm, p: llm.generate("hi", stop=5), TypeError,
     r"stop must be a string or a list of strings, not int"),
    ("stop None inside", lambda llm, p: llm.generate("hi", stop=[None]), TypeError, r"stop strings must be str, got None"),
    ("stop empty string", lambda llm, p: llm.generate("hi", stop=[""]), ValueError, r"stop strings must be non-empty"),
    ("logit_bias a list", lambda llm, p: llm.generate("hi", logit_bias=[1, 2]), TypeError,
     r"logit_bias must be a mapping \{token id: bias\}"),
    ("logit_bias str key", lambda llm, p: llm.generate("hi", logit_bias={"a": 1.0}), TypeError,
     r"logit_bias entries must be int -> float, got 'a': 1\.0"),
    ("logit_bias NaN", lambda llm, p: llm.generate("hi", logit_bias={5: float("nan")}), ValueError,
     r"logit_bias for token 5 is NaN"),
    ("logit_bias token out of range", lambda llm, p: llm.generate("hi", max_tokens=1, logit_bias={10 ** 6: 1.0}),
     ValueError, r"logit_bias token id 1000000 out of range 0\.\.49151"),
    ("grammar not a string", lambda llm, p: llm.generate("hi", grammar=5), TypeError, r"grammar must be a GBNF string"),
    ("grammar with a lone surrogate", lambda llm, p: llm.generate("hi", grammar='root ::= "\udc80"'), ValueError,
     r"grammar contains '\\udc80' at index 10, a lone surrogate"),
    ("grammar nested 30,000 deep", lambda llm, p: llm.generate(
        "hi", max_tokens=1, grammar="root ::= " + "(" * 30000 + '"a"' + ")" * 30000), GrammarError,
     r"the grammar nests parentheses 30000 deep; grammars are taken up to 10000 levels"),
    ("json_schema nested 3,000 deep", lambda llm, p: llm.generate("hi", max_tokens=1, json_schema=_nested(3000)),
     GrammarError, r"json_schema is nested more than 1000 levels deep"),
    ("json_schema text nested 100,000 deep", lambda llm, p: llm.generate(
        "hi", max_tokens=1, json_schema='{"items": ' * 100000 + "{}" + "}" * 100000), GrammarError,
     r"json_schema is nested too deeply"),
    ("grammar unbalanced", lambda llm, p: llm.generate("hi", max_tokens=1, grammar="root ::= ("), GrammarError,
     r"failed to parse grammar \(expecting '\)' at the end of the grammar\)\. Check the GBNF syntax"),
    ("grammar without root", lambda llm, p: llm.generate("hi", max_tokens=1, grammar='answer ::= "a"'), GrammarError,
     r"grammar does not contain a 'root' symbol"),
    ("grammar with an undefined rule", lambda llm, p: llm.generate("hi", max_tokens=1, grammar='root ::= x'),
     GrammarError, r"Undefined rule identifier 'x'"),
    ("grammar and json_schema", lambda llm, p: llm.generate("hi", grammar='root ::= "a"', json_schema={}), ValueError,
     r"give grammar or json_schema, not both"),
    ("json_schema not JSON", lambda llm, p: llm.generate("hi", max_tokens=1, json_schema="{bad"), GrammarError,
     r"json_schema is not valid JSON: Expecting property name"),
    ("json_schema with a bad type", lambda llm, p: llm.generate("hi", max_tokens=1, json_schema={"type": 5}),
     GrammarError, r"invalid JSON schema: .*type must be a string or an array of strings"),
    ("json_schema with a dangling $ref", lambda llm, p: llm.generate("hi", max_tokens=1, json_schema={"$ref": "#/x"}),
     GrammarError, r"cannot resolve \$ref #/x"),
    ("json_schema a list", lambda llm, p: llm.generate("hi", json_schema=[1]), TypeError,
     r"json_schema must be a dict or JSON text"),
    ("SamplingParams directly", lambda llm, p: SamplingParams(typical_p=2), ValueError, r"typical_p must be <= 1\.0"),

    # ---- chat ---------------------------------------------------------------------------
    ("chat of a str", lambda llm, p: llm.chat("hello"), ValueError, r"messages must be a non-empty list"),
    ("chat of no messages", lambda llm, p: llm.chat([]), ValueError, r"messages must be a non-empty list"),
    ("chat message without role", lambda llm, p: llm.chat([{"content": "x"}]), ValueError,
     r"each message needs a 'role'"),
    ("chat content an int", lambda llm, p: llm.chat([{"role": "user", "content": 5}], max_tokens=1), TemplateError,
     r"Invalid 'content' type: expected string or array"),
    ("chat content bytes", lambda llm, p: llm.chat([{"role": "user", "content": b"x"}]), TypeError,
     r"messages and tools must be JSON-serializable.*bytes"),
    ("chat content with a lone surrogate", lambda llm, p: llm.chat([{"role": "user", "content": "\udc80"}]),
     ValueError, r"a lone surrogate that is not valid in UTF-8"),
    ("chat content NaN", lambda llm, p: llm.chat([{"role": "user", "content": float("nan")}]), ValueError,
     r"messages and tools must be valid JSON, which has no NaN or infinity"),
    ("chat parse_special a str", lambda llm, p: llm.chat(USER, parse_special="yes"), TypeError,
     r"parse_special must be True or False, not 'yes'"),
    ("chat_template that recurses forever", new(chat_template="{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"),
     TemplateError, r"chat_template cannot be used .*recurses more than 1000 statements deep"),
    ("chat tools a str", lambda llm, p: llm.chat(USER, tools="search"), TypeError,
     r"tools must be a list of OpenAI-style tool definitions, not str"),
    ("chat response_format unknown", lambda llm, p: llm.chat(USER, response_format={"type": "xml"}), ValueError,
     r"response_format type must be 'text', 'json_object' or 'json_schema'"),
    ("chat response_format a str", lambda llm, p: llm.chat(USER, response_format="json"), ValueError,
     r"response_format type must be"),
    ("chat unknown sampler keyword", lambda llm, p: llm.chat(USER, top_q=1), TypeError, r"unknown sampling parameter"),

    # ---- embed, tokens ----------------------------------------------------------------
    ("embed None", lambda llm, p: llm.embed(None), TypeError, r"texts must be a str or a list of str, not NoneType"),
    ("embed an int", lambda llm, p: llm.embed(5), TypeError, r"texts must be a str or a list of str, not int"),
    ("embed empty text", lambda llm, p: llm.embed(""), ValueError, r"non-empty string"),
    ("embed empty list", lambda llm, p: llm.embed([]), ValueError, r"non-empty string or list"),
    ("embed unknown pooling", lambda llm, p: llm.embed("x", pooling="max"), ValueError,
     r"pooling must be 'mean', 'last' or 'cls', not 'max'"),
    ("tokenize None", lambda llm, p: llm.tokenize(None), TypeError, r"text must be str or bytes, not NoneType"),
    ("tokenize an int", lambda llm, p: llm.tokenize(5), TypeError, r"text must be str or bytes, not int"),
    ("tokenize add_special a str", lambda llm, p: llm.tokenize("hi", add_special="yes"), TypeError,
     r"add_special must be True or False, not 'yes'"),
    ("tokenize invalid UTF-8", lambda llm, p: llm.tokenize(b"ok \xff\xfe"), ValueError,
     r"text is not valid UTF-8 \(invalid start byte at byte 3\); decode it with errors='replace'"),
    ("tokenize truncated UTF-8", lambda llm, p: llm.tokenize("é".encode()[:1]), ValueError,
     r"text is not valid UTF-8 \(unexpected end of data at byte 0\)"),
    ("tokenize a lone surrogate", lambda llm, p: llm.tokenize("\ud83d"), ValueError, r"lone surrogate"),
    ("detokenize a str", lambda llm, p: llm.detokenize("abc"), TypeError, r"tokens must be a sequence of ints"),
    ("detokenize None", lambda llm, p: llm.detokenize(None), TypeError, r"tokens must be a sequence of ints"),
    ("detokenize floats", lambda llm, p: llm.detokenize([1.0]), TypeError, r"token ids must be ints, got 1\.0"),
    ("detokenize out of range", lambda llm, p: llm.detokenize([1 << 40]), ValueError,
     r"token id 1099511627776 out of range 0\.\.49151"),
]


@pytest.mark.parametrize("case,call,exc,pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_argument_raises_specific_error(llm, model_path, case, call, exc, pattern):
    with pytest.raises(exc) as info:
        result = call(llm, model_path)
        if isinstance(result, LLM):       # a constructor case that let the argument through
            result.close()
    assert type(info.value) is not Exception
    assert re.search(pattern, str(info.value), re.S), f"{case}: {info.value}"


def test_table_size():
    assert len(CASES) >= 90


def test_closed_llm_refuses_every_method(model_path):
    llm = LLM(model_path, **SMALL)
    llm.close()
    llm.close()                                # idempotent
    for call in (lambda: llm.generate("hi"), lambda: llm.stream("hi"), lambda: llm.chat(USER),
                 lambda: llm.embed("hi"), lambda: llm.tokenize("hi"), lambda: llm.detokenize([1]),
                 lambda: llm.logits("hi"), lambda: llm.metadata, lambda: llm.n_ctx,
                 lambda: llm.apply_chat_template(USER)):
        with pytest.raises(PolyllamaError, match="this LLM is closed"):
            call()
    llm.cancel()                               # harmless on a closed LLM
