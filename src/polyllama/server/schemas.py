"""Request bodies of the OpenAI API as pydantic v2 models, and the OpenAI error shape.

Why this file: every body is validated into a typed model before anything reaches the
engine, so a wrong type, an unknown field or a value out of range is a 400 that names the
field (`param`), never an exception inside the engine. The models are strict (JSON types
are not coerced: "5" is not an int) and forbid unknown fields; the few OpenAI fields that
only matter to OpenAI's own service (user, store, metadata, service_tier, ...) are
accepted and ignored, and docs/SERVER.md lists them. llama-server's extensions that
clients use (ignore_eos, top_k, min_p, repeat_penalty, grammar) are accepted too.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# n and the number of stop strings, bounded so that one request cannot occupy the whole
# queue or make every step search hundreds of stop strings
MAX_N = 16
MAX_STOPS = 16


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# ---- the error shape ---------------------------------------------------------------------
class APIError(Exception):
    """An error answered as {"error": {"message", "type", "param", "code"}} with `status`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none", "literal"}


def validation_error(e: ValidationError) -> APIError:
    """The first problem pydantic found, as a 400 naming the field (dotted path)."""
    errors = e.errors(include_url=False)
    # for a union (str or list of parts) the deepest error is the informative one: the
    # branch that got furthest, not "should be a valid string"
    err = max(errors, key=lambda x: len(x.get("loc", ())))
    kind = err.get("type", "")
    if kind == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}",
                        code="invalid_json")
    if kind in ("json_type", "model_type", "model_attributes_type") and not err.get("loc"):
        return APIError(400, "the request body must be a JSON object", code="invalid_json")
    # a union's branches show up as extra path parts (`str`, `list[int]`, `ContentPart`):
    # keep the field names and list indexes only
    parts = [p for p in err.get("loc", ()) if isinstance(p, int) or (
        "[" not in p and p not in _TYPE_NAMES and not p[:1].isupper() and not p.startswith("function-"))]
    loc = ".".join(str(p) for p in parts) or None
    if kind == "extra_forbidden":
        return APIError(400, f"unknown field {loc!r} (docs/SERVER.md lists the supported fields)",
                        param=loc, code="unknown_field")
    if kind == "missing":
        return APIError(400, f"missing required field {loc!r}", param=loc, code="missing_field")
    msg = err.get("msg", "invalid value")
    return APIError(400, f"invalid value for {loc!r}: {msg}" if loc else msg, param=loc,
                    code="invalid_value")


# ---- shared pieces -------------------------------------------------------------------------
class StreamOptions(_Model):
    include_usage: bool = False
    include_obfuscation: Optional[bool] = None      # OpenAI's; nothing to obfuscate here


class _Sampling(_Model):
    """Fields shared by chat and completions (OpenAI's, then llama-server's extensions)."""
    model: Optional[str] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: int = Field(1, ge=1, le=MAX_N)
    stop: Union[str, list[str], None] = None
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[str, float]] = None
    seed: Optional[int] = Field(None, ge=-(1 << 63), lt=1 << 64)
    max_tokens: Optional[int] = Field(None, ge=1, le=1 << 24)
    # accepted and ignored: they only mean something to OpenAI's own service
    user: Optional[str] = None
    store: Optional[bool] = None
    metadata: Optional[dict[str, Any]] = None
    service_tier: Optional[str] = None
    # llama-server's extensions
    ignore_eos: bool = False
    top_k: Optional[int] = Field(None, ge=0)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    typical_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    repeat_penalty: Optional[float] = Field(None, ge=0.0)
    repeat_last_n: Optional[int] = Field(None, ge=-1)
    grammar: Optional[str] = None
    cache_prompt: Optional[bool] = None             # always on: prompts share cached prefixes

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if v is None:
            return v
        stops = [v] if isinstance(v, str) else v
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        if v is None:
            return v
        for k, b in v.items():
            if not k.lstrip("-").isdigit():
                raise ValueError(f"logit_bias keys are token ids (as strings), not {k!r}")
            if not -100.0 <= b <= 100.0:
                raise ValueError(f"logit_bias values must be between -100 and 100, got {b}")
        return v


# ---- chat ------------------------------------------------------------------------------------
class ContentPart(BaseModel):
    """One part of a message's content. Only text parts are supported (no multimodal model);
    other parts are refused by name rather than as unknown fields."""
    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: Optional[str] = None

    @model_validator(mode="after")
    def _text_only(self):
        if self.type != "text":
            raise ValueError(f"content parts of type {self.type!r} are not supported: this server "
                             "reads text only")
        if self.text is None:
            raise ValueError("a text content part needs 'text'")
        return self


class FunctionCall(_Model):
    name: str
    arguments: str


class ToolCall(_Model):
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None
    reasoning_content: Optional[str] = None
    refusal: Optional[str] = None

    @model_validator(mode="after")
    def _needs_content(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs 'content'")
        return self

    def as_dict(self) -> dict:
        """What libcommon's chat code reads (common_chat_msgs_parse_oaicompat)."""
        d: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role}
        if isinstance(self.content, list):
            d["content"] = [{"type": "text", "text": p.text} for p in self.content]
        else:
            d["content"] = self.content
        if self.name is not None:
            d["name"] = self.name
        if self.tool_calls:
            d["tool_calls"] = [{"id": c.id or f"call_{i}", "type": "function",
                                "function": {"name": c.function.name, "arguments": c.function.arguments}}
                               for i, c in enumerate(self.tool_calls)]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            d["reasoning_content"] = self.reasoning_content
        return d


class FunctionDef(_Model):
    name: str = Field(min_length=1)
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class Tool(_Model):
    type: Literal["function"]
    function: FunctionDef


class ToolChoiceFunction(_Model):
    name: str


class ToolChoiceNamed(_Model):
    type: Literal["function"]
    function: ToolChoiceFunction


class JSONSchemaFormat(_Model):
    name: Optional[str] = None
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JSONSchemaFormat] = None
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")   # llama-server: json_object + schema
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError("response_format json_schema needs json_schema.schema")
        return self

    def as_dict(self) -> dict:
        if self.type == "json_schema":
            return {"type": "json_schema", "json_schema": {"schema": self.json_schema.schema_}}
        if self.type == "json_object":
            return {"type": "json_object", "schema": self.schema_} if self.schema_ else {"type": "json_object"}
        return {"type": "text"}


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1, le=1 << 24)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    response_format: Optional[ResponseFormat] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], ToolChoiceNamed, None] = None
    parallel_tool_calls: Optional[bool] = None
    reasoning_effort: Optional[str] = None           # accepted, ignored

    @model_validator(mode="after")
    def _consistent(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if isinstance(self.tool_choice, ToolChoiceNamed):
            names = [t.function.name for t in self.tools or ()]
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not "
                                 "in tools")
        elif self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs tools")
        if self.grammar is not None and (self.tools or self.response_format is not None):
            raise ValueError("grammar cannot be combined with tools or response_format")
        return self


# ---- completions -----------------------------------------------------------------------------
class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int] = Field(16, ge=1, le=1 << 24)   # OpenAI's default for completions
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=20)
    best_of: Optional[int] = Field(None, ge=1, le=1)          # only 1: no server-side reranking
    suffix: Optional[str] = None

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v):
        if isinstance(v, str):
            return v
        if not v:
            raise ValueError("the prompt list is empty")
        if any(isinstance(p, (str, list)) and len(p) == 0 for p in v):
            raise ValueError("a prompt in the list is empty")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v):
        if v:
            raise ValueError("suffix (fill-in-the-middle) is not supported")
        return v


# ---- the rest -------------------------------------------------------------------------------
class EmbeddingRequest(_Model):
    input: Union[str, list[str], list[int], list[list[int]]]
    model: Optional[str] = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(None, ge=1)
    user: Optional[str] = None


class TokenizeRequest(_Model):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Model):
    tokens: list[int]
