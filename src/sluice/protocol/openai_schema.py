"""OpenAI's request bodies (``/v1/completions``, ``/v1/chat/completions``, ``/v1/embeddings``)
parsed into frozen types; every mistake is a 400 naming its field.

Rules of this file:
- Pure: bytes in, types out. The fields, their bounds and their defaults are those of Triton's
  OpenAI-compatible front-end (``python/openai/openai_frontend/schemas/openai.py``): e.g.
  ``temperature`` 0..2 (default 1 for completions, 0.7 for chat), ``top_p`` 0..1, ``n``
  1..128, ``max_tokens`` >= 0, penalties -2..2, ``seed`` a 64-bit signed integer.
- A mistake raises ``FieldError`` (InvalidArgument, 400) whose ``param`` names the field as
  OpenAI's errors do (``messages[1].content``). A field nobody knows is refused naming it
  (Triton answers 422 from its schema); fields OpenAI's clients send that change nothing
  here (``user``, ``store``, ``metadata``, ``service_tier``, ``parallel_tool_calls``) are
  accepted and ignored.
- What sluice does not serve is refused naming the field, never ignored: ``tools``,
  ``functions``, ``logprobs``/``top_logprobs``, ``logit_bias``, ``suffix``, a
  ``response_format`` other than text, ``best_of`` > 1.

Usage::

    req = parse_chat(body)              # ChatRequest; FieldError naming the field
    req.sampling.max_tokens            # None: the server's --default-max-tokens
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument, NotFound
from . import json_body
from .json_body import show

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "FieldError",
    "ModelNotFound",
    "Sampling",
    "parse_chat",
    "parse_completion",
    "parse_embedding",
]

_INT64 = (-(2**63), 2**63 - 1)
MAX_CHOICES = 128  # n times the prompts of one call: the model requests it starts at once
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's bound
# accepted, and change nothing here
_IGNORED = frozenset({"user", "store", "metadata", "service_tier", "parallel_tool_calls"})
_REFUSED = {
    "tools": "tool calling is not supported by this server",
    "functions": "function calling is not supported by this server",
    "function_call": "function calling is not supported by this server",
    "logit_bias": "logit bias is not supported",
    "suffix": "suffix is not supported",
    "top_logprobs": "logprobs are not supported by this server",
    "modalities": "only text output is supported",
    "audio": "only text output is supported",
    "prediction": "predicted outputs are not supported",
}
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class FieldError(InvalidArgument):
    """A request field that is wrong: ``param`` names it (OpenAI's error ``param``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFound(NotFound):
    """The request's ``model`` is not served (404, OpenAI's code ``model_not_found``)."""

    param = "model"
    code = "model_not_found"


@dataclass(frozen=True, slots=True)
class Sampling:
    """The generation fields common to completions and chat. None: not given (the model's or
    the server's default applies)."""

    max_tokens: int | None
    temperature: float
    top_p: float
    n: int
    stop: str | tuple[str, ...] | None
    seed: int | None
    presence_penalty: float
    frequency_penalty: float
    min_tokens: int | None
    ignore_eos: bool
    stream: bool
    include_usage: bool
    # the fields the request gave (a TensorRT-LLM model must declare their inputs)
    given: frozenset[str]


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str
    prompts: tuple[str, ...]
    echo: bool
    sampling: Sampling


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    # each {"role": ..., "content": str | [{"type": "text", "text": ...}], "name"?: ...}
    messages: tuple[dict[str, Any], ...]
    sampling: Sampling


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[str | list[int], ...]
    dimensions: int | None
    encoding_format: str  # "float" or "base64"


class _Fields:
    """The members of one JSON object, read once each; ``done()`` refuses the rest."""

    def __init__(self, doc: Any, where: str) -> None:
        if type(doc) is not dict:
            raise FieldError(
                where or "body", f"{where or 'the request body'} must be a JSON object"
            )
        self.doc: dict[str, Any] = doc
        self.where = where
        self.seen: set[str] = set()

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str) -> Any:
        self.seen.add(key)
        return self.doc.get(key)

    def given(self) -> frozenset[str]:
        return frozenset(k for k, v in self.doc.items() if v is not None)

    def string(self, key: str, required: bool = False) -> str | None:
        value = self.get(key)
        if value is None:
            if required:
                raise FieldError(self.name(key), f"'{self.name(key)}' is required")
            return None
        if type(value) is not str:
            raise FieldError(
                self.name(key), f"'{self.name(key)}' must be a string, got {show(value)}"
            )
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.get(key)
        if value is None:
            return default
        if type(value) is not bool:
            raise FieldError(
                self.name(key), f"'{self.name(key)}' must be a boolean, got {show(value)}"
            )
        return value

    def number(self, key: str, default: float, lo: float, hi: float) -> float:
        value = self.get(key)
        if value is None:
            return default
        if type(value) not in (int, float) or not lo <= value <= hi:
            raise FieldError(
                self.name(key),
                f"'{self.name(key)}' must be a number from {lo:g} to {hi:g}, got {show(value)}",
            )
        return float(value)

    def integer(self, key: str, lo: int, hi: int | None = None) -> int | None:
        value = self.get(key)
        if value is None:
            return None
        if type(value) is not int or value < lo or (hi is not None and value > hi):
            bound = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
            raise FieldError(
                self.name(key), f"'{self.name(key)}' must be an integer {bound}, got {show(value)}"
            )
        return value

    def done(self) -> None:
        for key, value in self.doc.items():
            if key in self.seen or key in _IGNORED:
                continue
            if key in _REFUSED and value not in (None, [], {}):
                raise FieldError(self.name(key), f"'{key}': {_REFUSED[key]}")
            if key not in _REFUSED:
                raise FieldError(self.name(key), f"unknown field '{self.name(key)}'")


def _load(body: bytes, what: str) -> _Fields:
    return _Fields(json_body.loads(body, what), "")


def _sampling(f: _Fields, *, temperature: float, max_key: str = "max_tokens") -> Sampling:
    max_tokens = f.integer(max_key, 0)
    if max_key != "max_tokens":  # chat: max_completion_tokens, else the deprecated max_tokens
        old = f.integer("max_tokens", 0)
        max_tokens = max_tokens if max_tokens is not None else old
    stop = f.get("stop")
    if stop is not None and type(stop) is not str:
        if type(stop) is not list or not all(type(s) is str for s in stop):
            raise FieldError(
                "stop", f"'stop' must be a string or a list of strings, got {show(stop)}"
            )
        stop = tuple(stop)
    n = f.integer("n", 1, 128)
    stream = f.boolean("stream", False)
    include_usage = False
    options = f.get("stream_options")
    if options is not None:
        if not stream:
            raise FieldError(
                "stream_options", "'stream_options' can only be used when 'stream' is true"
            )
        opts = _Fields(options, "stream_options")
        include_usage = opts.boolean("include_usage", False)
        opts.done()
    return Sampling(
        max_tokens=max_tokens,
        temperature=f.number("temperature", temperature, 0.0, 2.0),
        top_p=f.number("top_p", 1.0, 0.0, 1.0),
        n=n if n is not None else 1,
        stop=stop,
        seed=f.integer("seed", *_INT64),
        presence_penalty=f.number("presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=f.number("frequency_penalty", 0.0, -2.0, 2.0),
        min_tokens=f.integer("min_tokens", 0),
        ignore_eos=f.boolean("ignore_eos", False),
        stream=stream,
        include_usage=include_usage,
        given=f.given(),
    )


def parse_completion(body: bytes) -> CompletionRequest:
    f = _load(body, "completion request")
    model = f.string("model", required=True)
    prompt = f.get("prompt")
    if prompt is None:
        raise FieldError("prompt", "'prompt' is required")
    if type(prompt) is str:
        prompts: tuple[str, ...] = (prompt,)
    elif type(prompt) is list and prompt and all(type(p) is str for p in prompt):
        prompts = tuple(prompt)
    elif type(prompt) is list and prompt and all(type(p) in (int, list) for p in prompt):
        raise FieldError("prompt", "'prompt' as token ids is not supported: send text")
    else:
        raise FieldError(
            "prompt", f"'prompt' must be a string or a list of strings, got {show(prompt)}"
        )
    if any(not p for p in prompts):
        raise FieldError("prompt", "'prompt' must be non-empty")
    logprobs = f.integer("logprobs", 0, 5)
    if logprobs:
        raise FieldError("logprobs", "'logprobs': logprobs are not supported by this server")
    echo = f.boolean("echo", False)
    best_of = f.integer("best_of", 0, 20)
    if best_of is not None and best_of > 1:
        raise FieldError("best_of", f"'best_of' must be 1 (one choice per prompt), got {best_of}")
    sampling = _sampling(f, temperature=1.0)
    f.done()
    if sampling.n * len(prompts) > MAX_CHOICES:
        raise FieldError(
            "n",
            f"'n' ({sampling.n}) times the number of prompts ({len(prompts)}) must be at most "
            f"{MAX_CHOICES}",
        )
    assert model is not None
    return CompletionRequest(model, prompts, echo, sampling)


def _content(value: Any, where: str, required: bool) -> str | list[dict[str, str]] | None:
    if value is None:
        if required:
            raise FieldError(where, f"'{where}' is required")
        return None
    if type(value) is str:
        return value
    if type(value) is not list:
        raise FieldError(
            where, f"'{where}' must be a string or a list of content parts, got {show(value)}"
        )
    parts: list[dict[str, str]] = []
    for j, part in enumerate(value):
        p = _Fields(part, f"{where}[{j}]")
        kind = p.string("type", required=True)
        if kind != "text":
            raise FieldError(
                p.name("type"),
                f"'{p.name('type')}': only text content is supported, got {show(kind)}",
            )
        text = p.string("text", required=True)
        p.done()
        assert text is not None
        parts.append({"type": "text", "text": text})
    return parts


def parse_chat(body: bytes) -> ChatRequest:
    f = _load(body, "chat completion request")
    model = f.string("model", required=True)
    raw = f.get("messages")
    if type(raw) is not list or not raw:
        raise FieldError("messages", f"'messages' must be a non-empty list, got {show(raw)}")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        m = _Fields(item, f"messages[{i}]")
        role = m.string("role", required=True)
        if role not in CHAT_ROLES:
            raise FieldError(
                m.name("role"),
                f"'{m.name('role')}' must be one of {', '.join(CHAT_ROLES)}, got {show(role)}",
            )
        msg: dict[str, Any] = {
            "role": role,
            "content": _content(m.get("content"), m.name("content"), role != "assistant"),
        }
        for key in ("name", "tool_call_id"):
            value = m.string(key)
            if value is not None:
                msg[key] = value
        calls = m.get("tool_calls")
        if calls not in (None, []):
            raise FieldError(m.name("tool_calls"), "tool calling is not supported by this server")
        m.get("refusal")
        m.done()
        messages.append(msg)
    logprobs = f.boolean("logprobs", False)
    if logprobs:
        raise FieldError("logprobs", "'logprobs': logprobs are not supported by this server")
    if f.get("tool_choice") not in (None, "none"):
        raise FieldError("tool_choice", "tool calling is not supported by this server")
    fmt = f.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise FieldError(
            "response_format",
            f'\'response_format\': only {{"type": "text"}} is supported, got {show(fmt)}',
        )
    sampling = _sampling(f, temperature=0.7, max_key="max_completion_tokens")
    f.done()
    assert model is not None
    return ChatRequest(model, tuple(messages), sampling)


def parse_embedding(body: bytes) -> EmbeddingRequest:
    f = _load(body, "embedding request")
    model = f.string("model", required=True)
    raw = f.get("input")
    inputs: tuple[str | list[int], ...]
    if type(raw) is str:
        inputs = (raw,)
    elif type(raw) is list and raw and all(type(x) is str for x in raw):
        inputs = tuple(raw)
    elif type(raw) is list and raw and all(type(x) is int for x in raw):
        inputs = (raw,)  # one input as token ids: passed to the model as given
    elif (
        type(raw) is list
        and raw
        and all(type(x) is list and x and all(type(t) is int for t in x) for x in raw)
    ):
        inputs = tuple(raw)
    else:
        raise FieldError(
            "input",
            "'input' must be a string, a list of strings, a list of token ids or a list of "
            f"lists of token ids, got {show(raw)}",
        )
    if any(x == "" for x in inputs):
        raise FieldError("input", "'input' must not hold an empty string")
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise FieldError(
            "input", f"'input' holds {len(inputs)} inputs: at most {MAX_EMBEDDING_INPUTS}"
        )
    dimensions = f.integer("dimensions", 1)
    fmt = f.string("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise FieldError(
            "encoding_format", f'\'encoding_format\' must be "float" or "base64", got {show(fmt)}'
        )
    f.done()
    assert model is not None
    return EmbeddingRequest(model, inputs, dimensions, fmt)
