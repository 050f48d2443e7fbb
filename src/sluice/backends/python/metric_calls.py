"""Custom metrics on the server side: the ``MetricCall`` messages of one python model instance.

Rules of this file:
- The instance is the owner of what its worker declares in the server's ``CustomMetrics``
  (``custom_metrics.py``): its worker restarts keep it (``worker_gone`` folds
  what the dead worker counted), its stop takes it away (``close``).
- Calls are handled at once, in the event loop (no task: nothing here waits). There are
  few: a family or series declared, a ``value()`` asked; counting goes through the cells.
- A refused call is a ``MetricReply`` with the refusal's text; the model gets Triton's
  ``TritonModelException`` around it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from .custom_metrics import CustomMetrics, MetricError
from .messages import MetricCall, MetricReply
from .metric_cells import MappedBlocks
from .shm import unlink_segment

__all__ = ["MetricCalls"]

log = logging.getLogger("sluice.custom_metrics")


class MetricCalls:
    """``MetricCalls(registry, owner, reply)``: ``handle(msg)`` for each MetricCall."""

    def __init__(
        self, registry: CustomMetrics | None, owner: object, reply: Callable[[Any], bool]
    ) -> None:
        self._registry = registry
        self._owner = owner
        self._reply = reply
        self._blocks = MappedBlocks()
        self._block_names: set[str] = set()

    def handle(self, msg: MetricCall) -> None:
        try:
            value, buckets = self._apply(msg)
        except MetricError as exc:
            self._reply(MetricReply(msg.id, str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - a bad message must not stop the loop
            log.exception("custom metric call %s failed", msg.op)
            self._reply(MetricReply(msg.id, f"custom metric call failed: {exc}"))
            return
        self._reply(MetricReply(msg.id, "", value, buckets))

    def _apply(self, msg: MetricCall) -> tuple[float, tuple[float, ...]]:
        reg = self._registry
        if reg is None:
            raise MetricError("custom metrics are not available in this server")
        op, args = msg.op, msg.args
        if op == "family":
            name, description, kind = args
            reg.declare_family(self._owner, name, description, kind)
            return 0.0, ()
        if op == "metric":
            family, text, bounds, block, at = args
            labels = _labels(text)
            buckets = reg.declare_series(self._owner, family, labels, bounds)
            cells = self._blocks.view(block)
            self._block_names.add(block)
            reg.attach(self._owner, family, reg.check_labels(labels), (cells, at))
            return 0.0, buckets
        if op == "value":
            return reg.value(args[0], reg.check_labels(_labels(args[1]))), ()
        raise MetricError(f"unknown custom metric call '{op}'")

    def worker_gone(self) -> None:
        """The worker died (or is stopping): keep what it counted, unmap its cells."""
        if self._registry is not None:
            self._registry.fold(self._owner)
        self._unmap()

    def close(self) -> None:
        """The instance stopped: its series and families go (unless others hold them)."""
        if self._registry is not None:
            self._registry.drop(self._owner)
        self._unmap()

    def _unmap(self) -> None:
        self._blocks.close()
        for name in self._block_names:
            unlink_segment(name)
        self._block_names = set()


def _labels(text: str) -> dict[str, Any]:
    labels = json.loads(text)
    if not isinstance(labels, dict):
        raise MetricError("Failed to create metric. Labels must be a dictionary.")
    return labels
