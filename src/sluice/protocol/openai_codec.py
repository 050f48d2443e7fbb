"""OpenAI's answers as bytes: completions, chat completions, embeddings, models, errors, and
the server-sent events of a stream.

Rules of this file:
- Pure: values in, JSON bytes out; the field names and ``object`` values are OpenAI's, as
  Triton's OpenAI-compatible front-end writes them (``system_fingerprint`` null; a stream's
  chunks carry ``"usage": null``).
- A stream is ``data: <json>\\n\\n`` per chunk and ends with ``data: [DONE]\\n\\n``. A chat
  stream opens each choice with a chunk whose delta is ``{"role": "assistant", "content":
  ""}``; the chunk that finishes a choice carries its ``finish_reason`` (and an empty delta
  when the model's last response had no text); with ``stream_options.include_usage`` a last
  chunk before ``[DONE]`` has ``"choices": []`` and the usage.
- An error is ``{"error": {"message", "type", "param", "code"}}``; the type follows the
  status as OpenAI's API words it (400/404/405/413/415 ``invalid_request_error``, 401
  ``authentication_error``, 403 ``permission_error``, 429 ``rate_limit_error``, 5xx
  ``server_error``). An error in the middle of a stream is one such event, without
  ``[DONE]``.
- A chunk's fixed parts are encoded once per stream (``ChunkWriter``): a token costs one
  JSON string encoding.

Usage::

    w = ChunkWriter("chat", "chatcmpl-1", 1700000000, "llm")
    w.role(0); w.delta(0, "Hello", None); w.delta(0, "", "stop"); w.usage(3, 1); DONE
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "DONE",
    "ChunkWriter",
    "chat_body",
    "completion_body",
    "embedding_body",
    "error_body",
    "error_doc",
    "model_doc",
    "models_doc",
    "usage_doc",
]

DONE = b"data: [DONE]\n\n"
OWNED_BY = "Triton Inference Server"  # Triton's front-end's words (clients may show them)

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
}


def error_doc(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status) or (
        "server_error" if status >= 500 else "invalid_request_error"
    )
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> bytes:
    return _dumps(error_doc(status, message, param, code)).encode()


def model_doc(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": OWNED_BY}


def models_doc(models: Sequence[tuple[str, int]]) -> dict[str, Any]:
    return {"object": "list", "data": [model_doc(n, c) for n, c in models]}


def usage_doc(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion_body(
    rid: str,
    created: int,
    model: str,
    choices: Sequence[tuple[str, str]],
    usage: dict[str, int],
) -> dict[str, Any]:
    """``choices``: (text, finish_reason) in choice order."""
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": i, "text": text, "logprobs": None, "finish_reason": finish}
            for i, (text, finish) in enumerate(choices)
        ],
        "usage": usage,
        "system_fingerprint": None,
    }


def chat_body(
    rid: str,
    created: int,
    model: str,
    choices: Sequence[tuple[str, str]],
    usage: dict[str, int],
) -> dict[str, Any]:
    """``choices``: (content, finish_reason) in choice order."""
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
            for i, (text, finish) in enumerate(choices)
        ],
        "usage": usage,
        "system_fingerprint": None,
    }


def embedding_body(
    model: str, vectors: Sequence[list[float]], encoding_format: str, usage: dict[str, int]
) -> dict[str, Any]:
    """``base64``: each vector's float32 bytes, little-endian, base64 (OpenAI's encoding)."""
    data = []
    for i, vector in enumerate(vectors):
        value: Any = vector
        if encoding_format == "base64":
            value = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
        data.append({"object": "embedding", "embedding": value, "index": i})
    return {"object": "list", "data": data, "model": model, "usage": usage}


class ChunkWriter:
    """The events of one stream (``kind`` "chat" or "completion")."""

    __slots__ = ("_head", "_tail", "_chat", "_usage_head")

    def __init__(self, kind: str, rid: str, created: int, model: str) -> None:
        self._chat = kind == "chat"
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        fixed = _dumps({"id": rid, "object": obj, "created": created, "model": model})
        # '{"id":...,"model":"m"' + ',"system_fingerprint":null,"choices":['
        self._head = b"data: " + fixed[:-1].encode() + b',"system_fingerprint":null,"choices":['
        self._tail = b'],"usage":null}\n\n'

    @property
    def chat(self) -> bool:
        return self._chat

    def _choice(self, index: int, body: str, finish: str | None) -> bytes:
        end = "null" if finish is None else _dumps(finish)
        return (
            self._head
            + f'{{"index":{index},{body},"logprobs":null,"finish_reason":{end}}}'.encode()
            + self._tail
        )

    def role(self, index: int) -> bytes:
        """A chat choice's first chunk: its role."""
        return self._choice(index, '"delta":{"role":"assistant","content":""}', None)

    def delta(self, index: int, text: str, finish: str | None) -> bytes:
        if self._chat:
            body = '"delta":{}' if not text and finish else f'"delta":{{"content":{_dumps(text)}}}'
        else:
            body = f'"text":{_dumps(text)}'
        return self._choice(index, body, finish)

    def usage(self, prompt: int, completion: int) -> bytes:
        return (
            self._head + b'],"usage":' + _dumps(usage_doc(prompt, completion)).encode() + b"}\n\n"
        )

    @staticmethod
    def error(status: int, message: str) -> bytes:
        return b"data: " + error_body(status, message) + b"\n\n"
