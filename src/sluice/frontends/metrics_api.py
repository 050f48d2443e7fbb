"""The metrics port: ``GET /metrics`` in Prometheus text format (prometheus_client)."""

from __future__ import annotations

from typing import Any

from prometheus_client import make_asgi_app

from ..metrics import build_registry
from ..repository.manager import ModelManager

__all__ = ["metrics_app"]


def metrics_app(manager: ModelManager, cpu_metrics: bool = True) -> Any:
    return make_asgi_app(registry=build_registry(manager, cpu_metrics))
