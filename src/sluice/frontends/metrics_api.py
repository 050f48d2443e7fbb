"""The metrics port: ``GET /metrics`` in the Prometheus text format 0.0.4, as Triton serves it
(its counters typed ``counter`` under their own names; see ``metrics.exposition``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from ..backends.python.custom_metrics import CustomMetrics
from ..core.cache import ResponseCache
from ..core.rate_limiter import RateLimiter
from ..core.registry import Registry
from ..observability.metrics import build_registry, exposition

__all__ = ["metrics_app"]

_Send = Callable[[dict[str, Any]], Awaitable[None]]


def metrics_app(
    models: Registry,
    cache: ResponseCache | None = None,
    cpu_metrics: bool = True,
    custom: CustomMetrics | None = None,
    extra: Sequence[Collector] = (),
    limiter: RateLimiter | None = None,
    counter_latencies: bool = True,
    summary_quantiles: tuple[tuple[float, float], ...] = (),
) -> Any:
    """The metrics port's ASGI app: the server's families (the rate ``limiter``'s, and
    ``extra``'s, e.g. the object-store repositories' counters), then the python models' own
    (``pb_utils.MetricFamily``), as Triton lists them after its own. ``extra``: the
    repository's own collectors (object-storage counters, on-demand loading)."""
    registry = build_registry(
        models, cache, cpu_metrics, extra, limiter, counter_latencies, summary_quantiles
    )
    text_headers = [(b"content-type", CONTENT_TYPE_LATEST.encode())]

    async def app(scope: dict[str, Any], receive: Any, send: _Send) -> None:
        if scope["type"] != "http":  # lifespan: nothing to set up
            return
        if scope["path"] != "/metrics":
            status, headers, body = 404, [(b"content-type", b"text/plain")], b"Not Found\n"
        elif scope["method"] not in ("GET", "HEAD"):
            status, headers, body = 405, [(b"allow", b"GET, HEAD")], b""
        else:
            body = exposition(registry)
            if custom is not None:
                body += custom.render().encode()
            status, headers = 200, text_headers
            if scope["method"] == "HEAD":
                body = b""
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app
