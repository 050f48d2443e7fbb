"""The server's log settings: tritonserver's ``--log-*`` flags and the logging extension
(``GET/POST /v2/logging``, gRPC ``LogSettings``) read and change the same object.

Rules of this file (Triton 2.51's behaviour, checked on this machine, except where noted):
- Settings: ``log_file`` (read-only over the network: 501 "log file location can not be
  updated through network protocol"), ``log_info``, ``log_warning``, ``log_error`` (booleans),
  ``log_verbose_level`` (>= 0; > 0 turns on debug lines), ``log_format`` (``default`` or
  ``ISO8601``). An update answers the whole settings object; unknown fields are ignored.
- Wrong types and unknown formats are client mistakes: 400 naming the field (Triton answers
  500 and 503 for these).
- One filter on the root handler applies the switches, so every logger of the server process
  follows them at once; nothing is reconfigured per record.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import InvalidArgument, Unsupported

__all__ = ["LogSettings", "setup_logging", "server_handler"]

_FORMATS = {"default", "ISO8601"}
_LINE = "%(levelname).1s %(name)s] %(message)s"


@dataclass(slots=True)
class LogSettings:
    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def update(self, doc: Any) -> dict[str, Any]:
        """Apply a logging-extension update (a JSON object); returns the new settings."""
        if not isinstance(doc, dict):
            raise InvalidArgument("the logging settings must be a JSON object")
        if "log_file" in doc:
            raise Unsupported("log file location can not be updated through network protocol")
        for key in ("log_info", "log_warning", "log_error"):
            if key in doc and type(doc[key]) is not bool:
                raise InvalidArgument(f"logging setting '{key}' must be a boolean")
        if "log_verbose_level" in doc:
            level = doc["log_verbose_level"]
            if type(level) is not int or level < 0:
                raise InvalidArgument(
                    "logging setting 'log_verbose_level' must be a non-negative integer"
                )
        if "log_format" in doc and doc["log_format"] not in _FORMATS:
            raise InvalidArgument(
                f"invalid argument for --log_format, got: {doc['log_format']} "
                "(logging setting 'log_format' must be 'default' or 'ISO8601')"
            )
        for key in ("log_info", "log_warning", "log_error", "log_verbose_level", "log_format"):
            if key in doc:
                setattr(self, key, doc[key])
        self.apply()
        return self.as_dict()

    def apply(self) -> None:
        root = logging.getLogger()
        root.setLevel(logging.DEBUG if self.log_verbose_level > 0 else logging.INFO)
        for handler in root.handlers:
            handler.setFormatter(_formatter(self.log_format))

    def allows(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.ERROR:
            return self.log_error
        if level >= logging.WARNING:
            return self.log_warning
        if level >= logging.INFO:
            return self.log_info
        return self.log_verbose_level > 0


def _formatter(fmt: str) -> logging.Formatter:
    if fmt == "ISO8601":
        f = logging.Formatter("%(asctime)s " + _LINE, "%Y-%m-%dT%H:%M:%SZ")
        f.converter = time.gmtime
        return f
    return logging.Formatter("%(asctime)s " + _LINE)


def server_handler(settings: LogSettings) -> logging.Handler:
    """The handler the server logs through: to ``log_file`` (appended) or stderr, filtered
    by ``settings`` and in their format."""
    handler: logging.Handler = (
        logging.FileHandler(settings.log_file)
        if settings.log_file
        else logging.StreamHandler(sys.stderr)
    )
    handler.addFilter(settings.allows)
    handler.setFormatter(_formatter(settings.log_format))
    return handler


def setup_logging(settings: LogSettings) -> None:
    """Root logging for ``sluice serve``: ``server_handler`` alone on the root logger,
    filtered and formatted by ``settings`` from then on."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(server_handler(settings))
    settings.apply()
