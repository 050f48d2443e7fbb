"""What an LLM answer says to ``sluice perf``: which of a stream's events carry text, how many
output tokens the answer had, and the error it ended with. Pure: bytes in, counts out.

Rules of this file:
- Kinds: ``chat`` (``/v1/chat/completions``: a chunk's ``choices[].delta.content``),
  ``completions`` (``/v1/completions``: ``choices[].text``) and ``generate`` (Triton's
  generate extension: ``text_output``). An event carries text when one of those is a
  non-empty string (a list: any non-empty element). ``data: [DONE]`` carries nothing.
- Output tokens: the count the server reports where it reports one (OpenAI's
  ``usage.completion_tokens``, a total, from the usage chunk that ``stream_options.
  include_usage`` asks for; the generate extension's ``num_output_tokens``, per response,
  added up), else the number of events that carried text (a streaming LLM backend sends
  one token per response). No tokenizer runs on the client.
- An event ``{"error": ...}`` (OpenAI's object with ``message``, or the generate extension's
  string) ends the answer as failed; so does an event that is not a JSON object.
- A non-streamed answer is one JSON document read the same way (``choices[].message.content``
  for chat), with no time to first token.

Usage::

    tally = StreamTally("chat")
    carried_text = tally.event(b'{"choices": [{"delta": {"content": "Hi"}}]}')
    tally.tokens, tally.error
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["KINDS", "StreamTally"]

KINDS = ("chat", "completions", "generate")


def _nonempty(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value)
    if isinstance(value, list):
        return any(isinstance(v, str) and v for v in value)
    return False


def _count(value: Any) -> int | None:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


class StreamTally:
    """One answer, read event by event (``reset`` before the next request)."""

    __slots__ = ("kind", "text_events", "reported", "error")

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown LLM endpoint kind {kind!r}")
        self.kind = kind
        self.text_events = 0
        self.reported: int | None = None
        self.error: str | None = None

    def reset(self) -> None:
        self.text_events = 0
        self.reported = None
        self.error = None

    @property
    def tokens(self) -> int:
        return self.reported if self.reported is not None else self.text_events

    def event(self, data: bytes) -> bool:
        """Read one event's data; True when it carried text."""
        if data == b"[DONE]" or self.error is not None:
            return False
        doc = self._doc(data)
        if doc is None:
            return False
        if self.kind == "generate":
            n = _count(doc.get("num_output_tokens"))
            if n is not None:
                self.reported = (self.reported or 0) + n
            text = _nonempty(doc.get("text_output"))
        else:
            self._usage(doc)
            text = any(self._choice_text(c, "delta") for c in self._choices(doc))
        if text:
            self.text_events += 1
        return text

    def whole(self, body: bytes) -> None:
        """Read a non-streamed answer (one JSON document)."""
        doc = self._doc(body)
        if doc is None:
            return
        if self.kind == "generate":
            self.reported = _count(doc.get("num_output_tokens"))
            text = _nonempty(doc.get("text_output"))
        else:
            self._usage(doc)
            text = any(self._choice_text(c, "message") for c in self._choices(doc))
        self.text_events = 1 if text else 0

    # ------------------------------------------------------------------ helpers
    def _doc(self, data: bytes) -> dict[str, Any] | None:
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            self.error = f"an answer that is not a JSON object: {data[:200]!r}"
            return None
        err = doc.get("error")
        if err is not None:
            if isinstance(err, dict):
                err = err.get("message", err)
            self.error = f"error event: {err}"
            return None
        return doc

    def _usage(self, doc: dict[str, Any]) -> None:
        usage = doc.get("usage")
        if isinstance(usage, dict):
            n = _count(usage.get("completion_tokens"))
            if n is not None:
                self.reported = n

    @staticmethod
    def _choices(doc: dict[str, Any]) -> list[Any]:
        choices = doc.get("choices")
        return choices if isinstance(choices, list) else []

    def _choice_text(self, choice: Any, part: str) -> bool:
        if not isinstance(choice, dict):
            return False
        if self.kind == "completions":
            return _nonempty(choice.get("text"))
        inner = choice.get(part)
        return isinstance(inner, dict) and _nonempty(inner.get("content"))
