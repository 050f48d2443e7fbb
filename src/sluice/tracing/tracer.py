"""The tracer: the trace settings in force (global and per model), sampling, and the sink
the finished traces go to (Triton's JSON file, or OpenTelemetry).

Rules of this file (Triton 2.51's behaviour, checked on this machine):
- A setting samples every ``rate``-th request that uses it (a model's own setting counts its
  own requests); ``count`` is the number of traces still to take (-1 = no limit) and goes
  down as traces are taken. A setting traces only with a level, a non-zero rate, a count
  left and (mode triton) a file.
- A model's setting holds the fields it was given and mirrors the global ones it was not
  given; clearing a field (``null``) falls back to the global value (global: to the value
  given at start); a model with no field of its own uses the global setting itself.
- Every update makes a new setting object (counters start again, as in Triton); the old one
  writes out the traces it holds.
- The off switch: ``on`` is False when no setting can trace; front-ends test it before
  anything else, so tracing off costs one attribute test per request.
- File mode (``triton_file``): traces collect in memory and are written at exit, or every
  ``log_frequency`` traces into ``<file>.<n>``, or into ``<file>.<n>`` when ``count`` runs out
  with every sampled request collected.

Usage::

    tracer = Tracer(parse_trace_flags(items))
    trace = tracer.sample("add_sub") if tracer.on else None
    tracer.update("add_sub", {"trace_rate": "2"})   # -> the setting as (key, value) pairs
    tracer.close()                                  # at exit: writes what is left
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, cast

from ..errors import InvalidArgument
from .settings import CLEAR, TraceConfig, level_names, parse_update
from .trace import Trace
from .triton_file import TraceFile, format_traces

__all__ = ["Tracer", "TraceSetting"]

log = logging.getLogger("sluice.tracing")

_FIELD_ATTR = {
    "trace_level": "level",
    "trace_rate": "rate",
    "trace_count": "count",
    "log_frequency": "log_frequency",
}


@dataclass(slots=True, eq=False)
class TraceSetting:
    level: tuple[str, ...]
    rate: int
    count: int  # traces still to take; -1 = no limit
    log_frequency: int
    file: TraceFile | None
    mode: str
    specified: frozenset[str] = frozenset()  # fields given through the API
    sampled: int = 0
    collected: int = 0
    stream: list[str] = field(default_factory=list)  # formatted traces not yet written
    valid: bool = False
    retired: bool = False  # replaced by an update: its traces are written as they finish
    tensors: bool = False
    timestamps: bool = False

    def __post_init__(self) -> None:
        self.tensors = "TENSORS" in self.level
        self.timestamps = "TIMESTAMPS" in self.level
        self.valid = not self.reason() and self.count != 0

    def reason(self) -> str:
        """Why this setting cannot trace ("" = it can, count aside): Triton's reasons."""
        if not self.level:
            return "tracing is disabled"
        if self.rate == 0:
            return "sample rate must be non-zero"
        if self.mode == "triton" and (self.file is None or not self.file.path):
            return "trace file name is not given"
        return ""

    def value(self, name: str) -> Any:
        return getattr(self, _FIELD_ATTR[name])


class Tracer:
    def __init__(self, config: TraceConfig | None = None) -> None:
        self.config = config = config or TraceConfig()
        self.mode = config.mode
        self._ids = itertools.count(1)
        self._files: dict[str, TraceFile] = {}
        self._default = self._make(
            config.level, config.rate, config.count, config.log_frequency, frozenset()
        )
        self._global = self._make(
            config.level, config.rate, config.count, config.log_frequency, frozenset()
        )
        self._models: dict[str, TraceSetting] = {}
        self._partial: set[str] = set()  # models mirroring some global fields
        self._retired: list[TraceSetting] = []  # replaced settings still holding traces
        self._otel: Any = None
        if config.mode == "opentelemetry":
            from .otel import OtelSink

            self._otel = OtelSink(config.otel)
        self.on = False
        self._refresh()

    # ---------------------------------------------------------------- sampling
    def sample(self, model: str) -> Trace | None:
        """A new trace if this request of ``model`` is sampled, else None."""
        s = self._models.get(model, self._global) if self._models else self._global
        if not s.valid:
            return None
        s.sampled += 1
        if s.sampled % s.rate:
            return None
        if s.count > 0:
            s.count -= 1
            if s.count == 0:
                s.valid = False
                self._refresh()
        return Trace(self, s, next(self._ids))

    def next_id(self) -> int:
        return next(self._ids)

    def _refresh(self) -> None:
        self.on = self._global.valid or any(s.valid for s in self._models.values())

    # -------------------------------------------------------------- collecting
    def finished(self, root: Trace) -> None:
        """A trace tree is complete: collected once the current callback is done (after the
        answer was handed to the edge), so that formatting it never delays the answer."""
        try:
            asyncio.get_running_loop().call_soon(self.collect, root)
        except RuntimeError:  # no loop (tools, unit tests): now
            self.collect(root)

    def collect(self, root: Trace) -> None:
        """A finished trace tree: to OpenTelemetry, or into its setting's file stream."""
        setting = cast(TraceSetting, root.setting)  # this tracer's traces carry its settings
        try:
            if root.model_version < 0:
                return  # the request never reached a model (unknown model): Triton writes none
            if self._otel is not None:
                self._otel.export(root)
                return
            text = format_traces(root.walk(), setting.timestamps)
            if not text:
                return
            setting.stream.append(text)
            setting.collected += 1
            if (setting.count == 0 and setting.collected == setting.sampled) or (
                setting.log_frequency and len(setting.stream) >= setting.log_frequency
            ):
                self._save(setting, indexed=True)
            elif setting.retired:
                self._save(setting, indexed=setting.log_frequency != 0)
        except Exception:  # a trace must never fail a request
            log.exception("writing trace %d failed", root.id)
        finally:
            root.unlink()

    def _save(self, setting: TraceSetting, indexed: bool) -> None:
        stream, setting.stream = setting.stream, []
        if stream and setting.file is not None:
            setting.file.save(stream, indexed)

    def close(self) -> None:
        """At exit: write every trace still held, stop the exporter."""
        for s in (self._global, *self._models.values(), *self._retired):
            if s.stream:
                try:
                    self._save(s, indexed=s.log_frequency != 0)
                except OSError as exc:
                    log.error("cannot write the trace file: %s", exc)
        self._retired.clear()
        if self._otel is not None:
            self._otel.close()

    # ---------------------------------------------------------------- settings
    def _make(
        self,
        level: tuple[str, ...],
        rate: int,
        count: int,
        log_frequency: int,
        specified: frozenset[str],
    ) -> TraceSetting:
        path = self.config.file
        trace_file = None
        if self.mode == "triton":
            trace_file = self._files.get(path)
            if trace_file is None:
                trace_file = self._files[path] = TraceFile(path)
        return TraceSetting(level, rate, count, log_frequency, trace_file, self.mode, specified)

    def settings(self, model: str = "") -> list[tuple[str, Any]]:
        """The setting in force for ``model`` ("" = global) as Triton shows it: (key, value)
        pairs, values strings, the level a list (a key may repeat: ``resource``)."""
        s = self._models.get(model, self._global) if model else self._global
        pairs: list[tuple[str, Any]] = [
            ("trace_level", level_names(s.level)),
            ("trace_rate", str(s.rate)),
            ("trace_count", str(s.count)),
        ]
        if self.mode == "triton":
            pairs += [
                ("log_frequency", str(s.log_frequency)),
                ("trace_file", self.config.file),
                ("trace_mode", "triton"),
            ]
            return pairs
        otel = self.config.otel
        pairs += [("trace_mode", "opentelemetry"), ("url", otel.url)]
        pairs += [("resource", f"{k}={v}") for k, v in otel.resource]
        pairs += [
            ("bsp_max_export_batch_size", str(otel.bsp_max_export_batch_size)),
            ("bsp_schedule_delay", str(otel.bsp_schedule_delay)),
            ("bsp_max_queue_size", str(otel.bsp_max_queue_size)),
        ]
        return pairs

    def update(self, model: str, doc: Any) -> list[tuple[str, Any]]:
        """Apply a trace-extension update (``parse_update``'s wire form) to the global setting
        (``model`` "") or to ``model``'s; answers the new setting."""
        changes = parse_update(doc)
        self._update(model, changes)
        if not model:  # the models mirroring global fields follow
            for name in sorted(self._partial):
                self._update(name, {})
        self._refresh()
        return self.settings(model)

    def _update(self, model: str, changes: dict[str, Any]) -> None:
        if model:
            current = self._models.get(model)
            fallback = self._global
        else:
            current = self._global
            fallback = self._default
        values = {name: fallback.value(name) for name in _FIELD_ATTR}
        specified: set[str] = set()
        for name in _FIELD_ATTR:
            change = changes.get(name)
            if change is CLEAR:
                continue
            if name in changes:
                values[name] = change
                specified.add(name)
            elif current is not None and name in current.specified:
                values[name] = current.value(name)
                specified.add(name)
        if model:
            if not specified:
                old = self._models.pop(model, None)
                self._partial.discard(model)
                if old is not None:
                    self._retire(old)
                return
            if len(specified) == len(_FIELD_ATTR):
                self._partial.discard(model)
            else:
                self._partial.add(model)
        new = self._make(
            values["trace_level"],
            values["trace_rate"],
            values["trace_count"],
            values["log_frequency"],
            frozenset(specified),
        )
        if not new.valid and new.level:
            reason = new.reason() or (
                'trace_count 0 takes no trace (to stop tracing set trace_level to ["OFF"])'
            )
            raise InvalidArgument(f"Attempting to set invalid trace setting :{reason}")
        if model:
            old = self._models.get(model)
            self._models[model] = new
        else:
            old, self._global = self._global, new
        if old is not None:
            self._retire(old)

    def _retire(self, old: TraceSetting) -> None:
        """A replaced setting writes out what it holds; traces still running under it are
        written as they finish."""
        old.valid = False
        old.retired = True
        if old.stream:
            self._save(old, indexed=old.log_frequency != 0)
        self._retired.append(old)
        del self._retired[:-64]  # only recent ones can still have traces running
