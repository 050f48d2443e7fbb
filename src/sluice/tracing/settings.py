"""Trace settings: tritonserver's ``--trace-config`` flags at start, and the updates of the
trace extension (``POST /v2/trace/setting``, ``/v2/models/{m}/trace/setting``, gRPC
``TraceSetting``) while serving.

Rules of this file (Triton 2.51's behaviour, checked on this machine, except where noted):
- Flags: ``--trace-config [<mode>,]<setting>=<value>``; global settings ``level`` (OFF,
  TIMESTAMPS, TENSORS; repeatable, case-insensitive), ``rate`` (default 1000), ``count``
  (default -1 = no limit), ``mode`` (triton, opentelemetry); ``triton,file``,
  ``triton,log-frequency``; ``opentelemetry,url|resource|bsp_max_queue_size|
  bsp_schedule_delay|bsp_max_export_batch_size``. Unlike Triton, an unknown setting is refused
  (Triton keeps ``triton,bogus=1`` and drops ``bogus=1``: a misspelt ``log_frequency`` would
  silently do nothing).
- Updates carry strings (``"trace_rate": "2"``) and a list of strings for ``trace_level``;
  ``null`` (gRPC: an empty value list) clears a field. Parse errors use Triton's words;
  where Triton answers 500 (a number instead of a string) or accepts nonsense silently (an
  unknown level turning tracing OFF, ``"-1"`` wrapping to 4294967295, ``"7x"`` read as 7),
  sluice answers 400 naming the setting.
- ``trace_file`` cannot change over the network (501, Triton's words); ``trace_mode`` and
  unknown keys are ignored, as in Triton.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument, Unsupported

__all__ = [
    "TraceConfig",
    "OtelConfig",
    "LEVELS",
    "MODES",
    "CLEAR",
    "parse_trace_flags",
    "parse_update",
    "level_names",
]

LEVELS = ("TIMESTAMPS", "TENSORS")  # Triton's display order
MODES = ("triton", "opentelemetry")
UINT32_MAX = 4294967295
INT32_MAX = 2147483647
_INT = re.compile(r"-?[0-9]+")
FIELDS = ("trace_level", "trace_rate", "trace_count", "log_frequency")


class _Clear:
    def __repr__(self) -> str:
        return "CLEAR"


CLEAR: Any = _Clear()  # an update value: this field goes back to its fallback


@dataclass(frozen=True, slots=True)
class OtelConfig:
    """``--trace-config opentelemetry,...``: the OTLP/HTTP exporter and its batching."""

    url: str = "http://localhost:4318/v1/traces"
    resource: tuple[tuple[str, str], ...] = ()  # as given, in order
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay: int = 5000  # ms
    bsp_max_export_batch_size: int = 512

    @property
    def endpoint(self) -> str:
        """The URL the exporter posts to. Triton 2.51 exports nothing for a URL without a
        scheme (``host:port/v1/traces``, the form its docs show); here it means http://."""
        url = self.url
        return url if "://" in url else f"http://{url}"


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """The start-up trace settings (the global setting's fallback)."""

    level: tuple[str, ...] = ()  # subset of LEVELS in LEVELS order; () = OFF
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"
    otel: OtelConfig = field(default_factory=OtelConfig)


def level_names(level: tuple[str, ...]) -> list[str]:
    """``trace_level`` as Triton shows it: ``["OFF"]`` or the levels in order."""
    return list(level) if level else ["OFF"]


def _flag_int(key: str, text: str, low: int, high: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"--trace-config {key}: invalid option value, got '{text}'") from None
    if not low <= value <= high:
        raise ValueError(f"--trace-config {key}: expected a value in [{low}, {high}], got {value}")
    return value


def parse_trace_flags(items: Iterable[tuple[str, str, str]]) -> TraceConfig:
    """``(mode, setting, value)`` triples (mode "" = global) -> TraceConfig; raises ValueError
    with a one-line reason."""
    level: set[str] = set()
    rate, count, log_frequency, file, mode = 1000, -1, 0, "", "triton"
    otel: dict[str, Any] = {}
    resource: list[tuple[str, str]] = []
    for section, key, value in items:
        section = section.strip().lower()
        if section not in ("", *MODES):
            raise ValueError(
                f"invalid value for trace mode option: {section}. Available options are "
                '"triton" and "opentelemetry"'
            )
        if section == "":
            if key == "level":
                name = value.strip().upper()
                if name == "OFF":
                    level.clear()
                elif name in LEVELS:
                    level.add(name)
                else:
                    raise ValueError(
                        f"invalid value for trace level option: {value.strip().lower()} "
                        "(expected OFF, TIMESTAMPS or TENSORS)"
                    )
            elif key == "rate":
                rate = _flag_int("rate", value, 0, UINT32_MAX)
            elif key == "count":
                count = _flag_int("count", value, -1, INT32_MAX)
            elif key == "mode":
                mode = value.strip().lower()
                if mode not in MODES:
                    raise ValueError(
                        f"invalid value for trace mode option: {mode}. Available options are "
                        '"triton" and "opentelemetry"'
                    )
            else:
                raise ValueError(
                    f"--trace-config {key}={value}: unknown global trace setting '{key}' "
                    "(level, rate, count, mode; the file is triton,file=PATH)"
                )
        elif section == "triton":
            if key == "file":
                file = value
            elif key == "log-frequency":
                log_frequency = _flag_int("triton,log-frequency", value, 0, UINT32_MAX)
            else:
                raise ValueError(
                    f"--trace-config triton,{key}={value}: unknown triton trace setting "
                    f"'{key}' (file, log-frequency)"
                )
        else:
            if key == "url":
                otel["url"] = value
            elif key == "resource":
                rkey, eq, rvalue = value.partition("=")
                if not eq or not rkey:
                    raise ValueError(
                        f"--trace-config opentelemetry,resource={value}: expected <key>=<value>"
                    )
                resource.append((rkey, rvalue))
            elif key in ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"):
                otel[key] = _flag_int(f"opentelemetry,{key}", value, 1, UINT32_MAX)
            else:
                raise ValueError(
                    f"--trace-config opentelemetry,{key}={value}: unknown opentelemetry trace "
                    "setting (url, resource, bsp_max_queue_size, bsp_schedule_delay, "
                    "bsp_max_export_batch_size)"
                )
    cfg = OtelConfig(resource=tuple(resource), **otel)
    if cfg.bsp_max_export_batch_size > cfg.bsp_max_queue_size:
        raise ValueError(
            "--trace-config opentelemetry,bsp_max_export_batch_size must be <= bsp_max_queue_size"
        )
    return TraceConfig(
        level=tuple(n for n in LEVELS if n in level),
        rate=rate,
        count=count,
        log_frequency=log_frequency,
        file=file,
        mode=mode,
        otel=cfg,
    )


def split_flag(item: str) -> tuple[str, str, str]:
    """``[<mode>,]<setting>=<value>`` -> (mode, setting, value); ValueError in Triton's words."""
    head, eq, value = item.partition("=")
    mode, comma, key = head.rpartition(",")
    if not eq or not key or (comma and not mode):
        raise ValueError(
            f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {item}"
        )
    return mode, key, value


# ---------------------------------------------------------------------------------- updates
def _wire_int(key: str, value: Any, low: int, high: int) -> int:
    if type(value) is not str:
        raise InvalidArgument(
            f"trace setting '{key}' must be a string such as \"2\" (as tritonclient sends it), "
            f"got {value!r}"
        )
    if _INT.fullmatch(value.strip()) is None:
        raise InvalidArgument(f"Unable to parse '{key}', got: {value}")
    n = int(value)
    if key == "trace_count" and n < -1:
        raise InvalidArgument(f"Unable to parse 'trace_count'. Expecting value >= -1, got: {n}")
    if not low <= n <= high:
        raise InvalidArgument(
            f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {value}"
        )
    return n


def _wire_level(value: Any) -> tuple[str, ...] | None:
    """None: no change (Triton: an empty list changes nothing)."""
    if type(value) is not list or any(type(v) is not str for v in value):
        raise InvalidArgument(
            f"trace setting 'trace_level' must be a list of strings such as [\"TIMESTAMPS\"], "
            f"got {value!r}"
        )
    if not value:
        return None
    names = [v.strip().upper() for v in value]
    if "OFF" in names:
        if len(names) > 1:
            raise InvalidArgument("Expect only one trace level 'OFF' is specified")
        return ()
    unknown = [v for v, n in zip(value, names, strict=True) if n not in LEVELS]
    if unknown:
        raise InvalidArgument(
            f"unknown trace level {unknown[0]!r} in 'trace_level' (expected OFF, TIMESTAMPS or "
            "TENSORS)"
        )
    return tuple(n for n in LEVELS if n in names)


def parse_update(doc: Any) -> dict[str, Any]:
    """A trace-setting update (a JSON object of strings / a list for the level; None clears)
    -> ``{field: value or CLEAR}`` for the fields it changes."""
    if not isinstance(doc, dict):
        raise InvalidArgument("the trace setting request JSON must be an object")
    if "trace_file" in doc:
        raise Unsupported("trace file location can not be updated through network protocol")
    out: dict[str, Any] = {}
    for key in FIELDS:
        if key not in doc:
            continue
        value = doc[key]
        if value is None:
            out[key] = CLEAR
        elif key == "trace_level":
            level = _wire_level(value)
            if level is not None:
                out[key] = level
        elif key == "trace_rate":
            out[key] = _wire_int(key, value, 0, UINT32_MAX)
        elif key == "trace_count":
            out[key] = _wire_int(key, value, -1, INT32_MAX)
        else:
            out[key] = _wire_int(key, value, 0, UINT32_MAX)
    return out
