"""OpenTelemetry mode (``--trace-config mode=opentelemetry``): finished traces become spans,
exported by the OpenTelemetry SDK's batch span processor and OTLP/HTTP (protobuf) exporter.

Rules of this file (the spans Triton 2.51 exports, checked on this machine):
- Per trace tree: a root span ``InferRequest`` with the front-end's timestamps as events
  (HTTP_RECV_START ... HTTP_SEND_END, or GRPC_*; INFER_RESPONSE_COMPLETE); per request a span
  named after its model, child of the root (or of its parent request's model span), from
  REQUEST_START to REQUEST_END with the events REQUEST_START, QUEUE_START, REQUEST_END and the
  attributes ``triton.model_name``, ``triton.model_version``, ``triton.trace_id``,
  ``triton.trace_parent_id`` and ``triton.request_id`` (when set); a ``compute`` span, child of
  the model span, with the four COMPUTE_* events. All kind SERVER, scope ``triton-server``.
- Resource: ``service.name=triton-inference-server`` unless ``resource=service.name=...``
  says otherwise, plus every ``resource`` pair.
- Span and event times are wall clock: the steady-clock stamps plus one offset taken at start,
  as Triton does.
- The SDK and exporter are imported only in this mode (``pip install 'sluice[otel]'``; ``make
  install`` has them); without them the server refuses to start, saying so.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..errors import ServerError
from .settings import OtelConfig
from .trace import COMPUTE_STAMPS, FRONTEND_STAMPS, MODEL_STAMPS, Trace

__all__ = ["OtelSink"]

log = logging.getLogger("sluice.tracing")

SCOPE = "triton-server"
DEFAULT_SERVICE = "triton-inference-server"


class OtelSink:
    def __init__(self, config: OtelConfig) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import SpanKind, set_span_in_context
        except ImportError as exc:
            raise ServerError(
                "--trace-config mode=opentelemetry needs the OpenTelemetry SDK and its OTLP/HTTP "
                f"exporter (pip install 'sluice[otel]'): {exc}"
            ) from None

        attributes: dict[str, Any] = {"service.name": DEFAULT_SERVICE}
        attributes.update(dict(config.resource))
        self._provider = TracerProvider(resource=Resource.create(attributes))
        self._provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=config.endpoint),
                max_queue_size=config.bsp_max_queue_size,
                schedule_delay_millis=config.bsp_schedule_delay,
                max_export_batch_size=config.bsp_max_export_batch_size,
            )
        )
        self._tracer = self._provider.get_tracer(SCOPE)
        self._kind = SpanKind.SERVER
        self._in = set_span_in_context
        self._offset = time.time_ns() - time.monotonic_ns()

    def export(self, root: Trace) -> None:
        """Spans for a finished trace tree; the batch processor sends them."""
        if not root.setting.timestamps:
            return  # level TENSORS alone: OpenTelemetry mode has no tensor spans (as Triton)
        off = self._offset
        stamps = sorted(root.stamps)
        front = [(ns, n) for ns, n in stamps if n in FRONTEND_STAMPS]
        first = min((ns for ns, _ in front), default=stamps[0][0] if stamps else 0)
        last = max((ns for ns, _ in front), default=stamps[-1][0] if stamps else first)
        top = self._tracer.start_span("InferRequest", kind=self._kind, start_time=first + off)
        for ns, name in front:
            top.add_event(name, timestamp=ns + off)
        self._model_spans(root, top, off)
        top.end(end_time=last + off)

    def _model_spans(self, t: Trace, parent: Any, off: int) -> None:
        if t.model_version < 0:
            return
        stamps = sorted(t.stamps)
        mine = [(ns, n) for ns, n in stamps if n in MODEL_STAMPS]
        compute = [(ns, n) for ns, n in stamps if n in COMPUTE_STAMPS]
        start = mine[0][0] if mine else (stamps[0][0] if stamps else 0)
        end = mine[-1][0] if mine else start
        attributes: dict[str, Any] = {
            "triton.model_name": t.model_name,
            "triton.model_version": t.model_version,
            "triton.trace_id": t.id,
            "triton.trace_parent_id": t.parent_id,
        }
        if t.request_id:
            attributes["triton.request_id"] = t.request_id
        span = self._tracer.start_span(
            t.model_name,
            context=self._in(parent),
            kind=self._kind,
            start_time=start + off,
            attributes=attributes,
        )
        for ns, name in mine:
            span.add_event(name, timestamp=ns + off)
        if compute:
            c = self._tracer.start_span(
                "compute", context=self._in(span), kind=self._kind, start_time=compute[0][0] + off
            )
            for ns, name in compute:
                c.add_event(name, timestamp=ns + off)
            c.end(end_time=compute[-1][0] + off)
        for kid in t.children:
            self._model_spans(kid, span, off)
        span.end(end_time=end + off)

    def close(self) -> None:
        """Export what is queued (bounded by the exporter's timeout) and stop."""
        try:
            self._provider.shutdown()
        except Exception:  # the receiver may be gone at exit
            log.exception("stopping the OpenTelemetry exporter")
