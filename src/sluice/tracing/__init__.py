"""Triton's trace extension: settings, sampling, per-request timestamps, and the sinks
(Triton's JSON trace file, OpenTelemetry). See ``tracer.py`` for the rules."""

from __future__ import annotations

from .settings import OtelConfig, TraceConfig, parse_trace_flags, split_flag
from .trace import Trace
from .tracer import Tracer, TraceSetting

__all__ = [
    "OtelConfig",
    "Trace",
    "TraceConfig",
    "TraceSetting",
    "Tracer",
    "parse_trace_flags",
    "split_flag",
]
