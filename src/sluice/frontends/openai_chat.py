"""Chat messages as one prompt, and token counts: a local tokenizer directory (``--tokenizer``)
or sluice's plain template and whitespace counts.

Rules of this file:
- ``--tokenizer DIR`` is a local directory as Hugging Face saves one: ``tokenizer.json``
  (read with the ``tokenizers`` library) and ``tokenizer_config.json`` (its
  ``chat_template`` and special tokens); the template may instead be in
  ``chat_template.jinja`` or ``chat_template.json`` there. Nothing is downloaded. The
  libraries are the ``openai`` extra (``pip install sluice[openai]``), imported only when
  the flag is given.
- ``--chat-template FILE`` (a Jinja file) replaces the tokenizer's template.
- A Jinja template is rendered as transformers renders it: a sandboxed environment with
  ``trim_blocks`` and ``lstrip_blocks``, ``raise_exception`` and ``strftime_now``, the
  variables ``messages``, ``add_generation_prompt`` (true), ``tools`` (none) and the
  tokenizer's special tokens (``bos_token``, ``eos_token``, ...). An error the template
  raises for the messages (e.g. roles that do not alternate) is the client's: 400 naming
  ``messages``.
- Without a template, the plain template (``_plain``): each message as
  ``<role>: <content>`` and a newline, content parts joined with newlines, then
  ``assistant:``.
- Token counts, where the model answers none: the tokenizer's (no special tokens added),
  else the number of whitespace-separated words.

Usage::

    chat = ChatFormat.load(tokenizer="", template_file="")   # the plain template
    prompt = chat.render(messages)
    chat.count("a b c")  # 3
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import ServerError
from ..protocol.openai_schema import FieldError

__all__ = ["ChatFormat"]

_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content)


def _plain(messages: Sequence[dict[str, Any]]) -> str:
    lines = [f"{m['role']}: {_text(m['content'])}\n" for m in messages]
    return "".join(lines) + "assistant:"


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ServerError(f"--tokenizer: cannot read {path}: {exc}") from None


def _template_of(directory: Path, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if template is None and (directory / "chat_template.jinja").is_file():
        template = (directory / "chat_template.jinja").read_text()
    if template is None and (directory / "chat_template.json").is_file():
        template = _read_json(directory / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


class ChatFormat:
    """How chat messages become a prompt and how text is counted in tokens."""

    def __init__(
        self,
        template: str | None = None,
        tokenizer: Any = None,
        special: dict[str, str] | None = None,
        source: str = "",
    ) -> None:
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer, or None
        self.special = special or {}
        self.source = source  # where the template came from (logged at start)
        self._template: Any = None
        if template is not None:
            try:
                from jinja2 import TemplateError
                from jinja2.sandbox import ImmutableSandboxedEnvironment
            except ImportError as exc:  # pragma: no cover - jinja2 comes with the extra
                raise ServerError(
                    f"a chat template needs jinja2 (pip install 'sluice[openai]'): {exc}"
                ) from None
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
            )
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            try:
                self._template = env.from_string(template)
            except TemplateError as exc:
                raise ServerError(
                    f"the chat template of {source} does not compile: {exc}"
                ) from None

    @classmethod
    def load(cls, tokenizer: str = "", template_file: str = "") -> ChatFormat:
        """From ``--tokenizer`` and ``--chat-template`` (either may be ""); ServerError naming
        the flag when a file cannot be used."""
        template = None
        source = "the plain template"
        if template_file:
            try:
                template = Path(template_file).read_text()
            except OSError as exc:
                raise ServerError(
                    f"--chat-template {template_file}: {exc.strerror or exc}"
                ) from None
            source = f"--chat-template {template_file}"
        if not tokenizer:
            return cls(template, None, None, source)
        directory = Path(tokenizer)
        if not (directory / "tokenizer.json").is_file():
            raise ServerError(
                f"--tokenizer {tokenizer}: no tokenizer.json there (a local directory as "
                "Hugging Face saves a tokenizer; nothing is downloaded)"
            )
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ServerError(
                f"--tokenizer needs the tokenizers library (pip install 'sluice[openai]'): {exc}"
            ) from None
        try:
            tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as exc:  # the library's own error types
            raise ServerError(f"--tokenizer {tokenizer}: tokenizer.json: {exc}") from None
        config_path = directory / "tokenizer_config.json"
        config = _read_json(config_path) if config_path.is_file() else {}
        if not isinstance(config, dict):
            raise ServerError(f"--tokenizer {tokenizer}: tokenizer_config.json is not an object")
        special = {k: t for k in _SPECIAL if (t := _token_text(config.get(k))) is not None}
        if template is None:
            template = _template_of(directory, config)
            source = f"--tokenizer {tokenizer}" if template else "the plain template"
        return cls(template, tok, special, source)

    def render(self, messages: Sequence[dict[str, Any]]) -> str:
        if self._template is None:
            return _plain(messages)
        from jinja2 import TemplateError

        try:
            return str(
                self._template.render(
                    messages=list(messages), add_generation_prompt=True, tools=None, **self.special
                )
            )
        except TemplateError as exc:
            raise FieldError("messages", f"the chat template refused the messages: {exc}") from None

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(text, add_special_tokens=False).ids)
        return len(text.split())


def _raise(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)
