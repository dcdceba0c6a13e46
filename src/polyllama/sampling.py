"""SamplingParams: how the next token is chosen. The sampling itself runs in llama.cpp's
sampler chain (llama_sampler_chain_*), built here in llama.cpp's own stage order."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
INT32_MAX = (1 << 31) - 1
# GBNF and JSON schemas: llama.cpp's parsers recurse once per nesting level (a grammar
# 30,000 parentheses deep overflowed the stack). They run on a thread with a large stack
# (csrc/hardening.h); these limits give a clear error long before that matters.
MAX_GRAMMAR_NESTING = 10_000
MAX_GRAMMAR_BYTES = 4 << 20
MAX_SCHEMA_DEPTH = 1_000


@dataclass
class SamplingParams:
    """Parameters of one generation. The defaults decode greedily (temperature 0).

    max_tokens: tokens to generate at most (None: until the context is full).
    temperature: 0 picks the most likely token (greedy); > 0 samples.
    top_k / top_p / min_p / typical_p: truncation before sampling (0 / 1.0 / 0.0 / 1.0 disable).
    repeat_penalty / presence_penalty / frequency_penalty over the last `repeat_last_n` tokens.
    seed: for sampling with temperature > 0; None draws a random seed.
    stop: strings that end the generation (not included in the text).
    logit_bias: {token id: bias added to its logit}.
    grammar: a GBNF grammar constraining the output; json_schema: a JSON schema (dict or
    JSON text) turned into a grammar by llama.cpp's json_schema_to_grammar.
    n_probs: also return the n most likely tokens and their log-probabilities per step.
    ignore_eos: keep generating past end-of-generation tokens.
    """
    max_tokens: int | None = 128
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: Sequence[str] = field(default_factory=tuple)
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    grammar: str | None = None
    json_schema: Any = None
    n_probs: int = 0
    ignore_eos: bool = False

    def __post_init__(self):
        self.validate()

    @classmethod
    def from_kwargs(cls, params: "SamplingParams | None" = None, **kwargs) -> "SamplingParams":
        """params with kwargs applied on top (kwargs alone build a new one)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown sampling parameter(s) {', '.join(unknown)}; "
                            f"known: {', '.join(sorted(names))}")
        if params is None:
            return cls(**kwargs)
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, not {type(params).__name__}")
        base = {f.name: getattr(params, f.name) for f in fields(cls)}
        base.update(kwargs)
        return cls(**base)

    def validate(self) -> None:
        def num(name, lo=None, hi=None, integer=False):
            v = getattr(self, name)
            ok_types = (int,) if integer else (int, float)
            if isinstance(v, bool) or not isinstance(v, ok_types) or (not integer and not math.isfinite(v)):
                raise TypeError(f"{name} must be {'an int' if integer else 'a finite number'}, not {v!r}")
            if lo is not None and v < lo:
                raise ValueError(f"{name} must be >= {lo}, got {v}")
            if hi is not None and v > hi:
                raise ValueError(f"{name} must be <= {hi}, got {v}")

        if self.max_tokens is not None:
            num("max_tokens", 1, 1 << 24, integer=True)
        num("temperature", 0.0)
        num("top_k", 0, INT32_MAX, integer=True)
        num("top_p", 0.0, 1.0)
        num("min_p", 0.0, 1.0)
        num("typical_p", 0.0, 1.0)
        num("repeat_penalty", 0.0)
        num("repeat_last_n", -1, INT32_MAX, integer=True)
        num("presence_penalty")
        num("frequency_penalty")
        num("n_probs", 0, 100, integer=True)
        if self.seed is not None:
            num("seed", 0, 0xFFFFFFFF, integer=True)
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be True or False, not {self.ignore_eos!r}")
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        if self.stop is None or isinstance(self.stop, (bytes, bytearray, Mapping)) \
                or not hasattr(self.stop, "__iter__"):
            raise TypeError(f"stop must be a string or a list of strings, not {type(self.stop).__name__}")
        self.stop = tuple(self.stop)
        for s in self.stop:
            if not isinstance(s, str):
                raise TypeError(f"stop strings must be str, got {s!r}")
            if not s:
                raise ValueError("stop strings must be non-empty (an empty stop string would end "
                                 "every generation at once)")
            _check_text(s, "stop string")
        if not isinstance(self.logit_bias, Mapping):
            raise TypeError("logit_bias must be a mapping {token id: bias}")
        for k, v in self.logit_bias.items():
            if isinstance(k, bool) or not isinstance(k, int) or isinstance(v, bool) \
                    or not isinstance(v, (int, float)):
                raise TypeError(f"logit_bias entries must be int -> float, got {k!r}: {v!r}")
            if math.isnan(v):
                raise ValueError(f"logit_bias for token {k} is NaN; use a number "
                                 "(-1000 or -inf bans the token)")
        if self.grammar is not None and not isinstance(self.grammar, str):
            raise TypeError("grammar must be a GBNF string")
        if self.grammar is not None:
            _check_text(self.grammar, "grammar")
        if self.grammar is not None and self.json_schema is not None:
            raise ValueError("give grammar or json_schema, not both")
        if self.json_schema is not None and not isinstance(self.json_schema, (str, dict, bool)):
            raise TypeError("json_schema must be a dict or JSON text")

    def schema_text(self) -> str | None:
        from .errors import GrammarError
        if self.json_schema is None:
            return None
        if isinstance(self.json_schema, str):
            _check_text(self.json_schema, "json_schema")
            try:
                parsed = json.loads(self.json_schema)
            except RecursionError:
                raise GrammarError(f"json_schema is nested too deeply (JSON schemas are taken up to "
                                   f"{MAX_SCHEMA_DEPTH} levels)") from None
            except ValueError as e:
                raise GrammarError(f"json_schema is not valid JSON: {e}") from None
            _check_schema_depth(parsed)
            return self.json_schema
        _check_schema_depth(self.json_schema)
        try:
            text = json.dumps(self.json_schema, ensure_ascii=False, allow_nan=False)
        except RecursionError:
            raise GrammarError(f"json_schema is nested too deeply (JSON schemas are taken up to "
                               f"{MAX_SCHEMA_DEPTH} levels)") from None
        except (TypeError, ValueError) as e:
            raise TypeError(f"json_schema must be JSON-serializable (str, numbers, lists, dicts; no NaN): "
                            f"{e}") from None
        _check_text(text, "json_schema")
        return text


def _check_text(text: str, what: str) -> None:
    """ValueError for a str that cannot be UTF-8 (lone surrogates), which llama.cpp needs."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} contains {text[e.start]!r} at index {e.start}, a lone surrogate that is "
                         "not valid in UTF-8; clean it first, e.g. s.encode('utf-8', 'replace').decode()") from None


def _check_schema_depth(schema) -> None:
    """GrammarError for a schema nested deeper than MAX_SCHEMA_DEPTH (walked without
    recursion: Python's own limit would raise RecursionError first)."""
    from .errors import GrammarError
    stack = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise GrammarError(f"json_schema is nested more than {MAX_SCHEMA_DEPTH} levels deep; llama.cpp's "
                               "schema-to-grammar conversion recurses once per level")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def grammar_nesting(grammar: str) -> int:
    """The deepest nesting of parentheses in a GBNF grammar, outside string literals,
    character classes and comments (what llama.cpp's recursive parser descends)."""
    depth = deepest = 0
    i, n = 0, len(grammar)
    while i < n:
        c = grammar[i]
        if c == "#":
            j = grammar.find("\n", i)
            i = n if j < 0 else j
        elif c == '"' or c == "[":
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and grammar[i] != close:
                i += 2 if grammar[i] == "\\" else 1
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
        i += 1
    return deepest


def check_grammar_size(grammar: str) -> None:
    """GrammarError for a grammar too large or too deeply nested to parse safely."""
    from .errors import GrammarError
    if len(grammar) > MAX_GRAMMAR_BYTES:
        raise GrammarError(f"the grammar is {len(grammar)} characters; grammars are taken up to "
                           f"{MAX_GRAMMAR_BYTES} (llama.cpp's grammar code recurses along chains of rules)")
    depth = grammar_nesting(grammar)
    if depth > MAX_GRAMMAR_NESTING:
        raise GrammarError(f"the grammar nests parentheses {depth} deep; grammars are taken up to "
                           f"{MAX_GRAMMAR_NESTING} levels (llama.cpp's GBNF parser recurses once per level)")


def is_plain_greedy(params: SamplingParams, grammar: str | None = None) -> bool:
    """True when the chain would be just llama.cpp's greedy stage (no state, no masking):
    the caller may then take the arg-max of the logits itself (Context.argmax, which
    also excludes EOS for ignore_eos as the chain's logit bias would)."""
    return (params.temperature <= 0 and not params.logit_bias
            and not grammar and not params.grammar
            and (params.repeat_last_n == 0 or (params.repeat_penalty == 1.0
                 and not params.presence_penalty and not params.frequency_penalty)))


def _grammar_parse_error(llamacpp, model, grammar: str) -> str:
    """llama.cpp's grammar parser prints where it failed to stderr, not to its log:
    parse the grammar once more with file descriptor 2 captured to get that line."""
    import os
    import sys
    import tempfile
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        return ""
    probe = llamacpp.Sampler(model)
    try:
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                probe.add_grammar(grammar, "root")
            except Exception:
                pass
            finally:
                os.dup2(saved, 2)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace")
    finally:
        os.close(saved)
        probe.close()
    for line in text.splitlines():
        if "error parsing grammar:" in line:
            what = line.split("error parsing grammar:", 1)[1].strip()
            if what.endswith(" at"):       # llama.cpp prints the rest of the input after "at"
                what += " the end of the grammar"
            return f" ({what})"
    return ""


def build_sampler(llamacpp, model, params: SamplingParams, grammar: str | None = None,
                  lazy_patterns: Sequence[str] | None = None, grammar_prefill: Sequence[int] = ()):
    """A llama.cpp sampler chain for params: bias, penalties, grammar, truncation, pick.

    The stage order follows llama.cpp's common sampler. `grammar` (already GBNF) overrides
    params.grammar; it comes from json_schema or from a chat template's tool grammar.
    """
    s = llamacpp.Sampler(model)
    if params.logit_bias:
        s.add_logit_bias(dict(params.logit_bias))
    if params.ignore_eos:
        eog = [t for t in (model.token_eos,) if t >= 0]
        s.add_logit_bias({t: -math.inf for t in eog})
    if (params.repeat_penalty != 1.0 or params.presence_penalty or params.frequency_penalty) \
            and params.repeat_last_n != 0:
        s.add_penalties(params.repeat_last_n, params.repeat_penalty, params.frequency_penalty,
                        params.presence_penalty)
    g = grammar if grammar is not None else params.grammar
    if g:
        try:
            check_grammar_size(g)
        except Exception:
            s.close()
            raise
        try:
            s.add_grammar(g, "root", lazy_patterns, grammar_prefill)
        except Exception as e:
            s.close()
            from .errors import GrammarError
            if not isinstance(e, GrammarError):
                raise
            raise GrammarError(f"{e}{_grammar_parse_error(llamacpp, model, g)}. Check the GBNF syntax: "
                               "rules look like `name ::= \"text\" | other-rule`, and the grammar "
                               "needs a `root` rule.") from None
    if params.temperature <= 0:
        s.add_greedy()
        return s
    if params.top_k > 0:
        s.add_top_k(params.top_k)
    if params.typical_p < 1.0:
        s.add_typical(params.typical_p)
    if params.top_p < 1.0:
        s.add_top_p(params.top_p)
    if params.min_p > 0.0:
        s.add_min_p(params.min_p)
    s.add_temp(params.temperature)
    s.add_dist(LLAMA_DEFAULT_SEED if params.seed is None else params.seed)
    return s
