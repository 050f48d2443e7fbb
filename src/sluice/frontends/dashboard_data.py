"""The dashboard's one JSON document (``GET /dashboard/data``): what serves, in what state,
and the cumulative counters the page turns into rates and percentiles between two polls.

Everything here is read from the objects the statistics extension and the metrics read
(``ModelStats``, the registry of what serves, the control events); nothing is kept for the page.
Counters are cumulative, so the page's rates and percentiles are over its own poll interval.
"""

from __future__ import annotations

import time
from typing import Any

from ..core.stats import BUCKETS_US, ModelStats
from ..service import InferenceService

__all__ = ["snapshot"]


def _instances(service: InferenceService, name: str, version: int) -> int:
    sv = service.registry.serving_version(name, version)
    if sv is None:
        return 0
    return sum(max(g.count, 1) for g in sv.config.instance_group) or 1


def _stats(st: ModelStats) -> dict[str, Any]:
    return {
        "model": st.name,
        "version": st.version,
        "success": st.success.count,
        "fail": st.fail.count,
        "fail_reasons": dict(st.fail_reasons),
        "inference_count": st.inference_count,
        "execution_count": st.execution_count,
        "pending": st.pending,
        "queue_ns": st.queue.ns,
        "queue_count": st.queue.count,
        "compute_ns": st.compute_input.ns + st.compute_infer.ns + st.compute_output.ns,
        "compute_count": st.compute_infer.count,
        "request_hist": list(st.request_hist.counts),
        "batch_sizes": {
            str(size): b.compute_infer.count for size, b in sorted(st.batch_stats.items())
        },
    }


def snapshot(service: InferenceService) -> dict[str, Any]:
    """The document the dashboard polls."""
    models = []
    for row in service.repository_index():
        name = row["name"]
        version = row.get("version", "")
        entry = {
            "name": name,
            "version": version,
            "state": row.get("state", ""),  # "": in the repository, never loaded
            "reason": row.get("reason", ""),
            "instances": _instances(service, name, int(version)) if version.isdigit() else 0,
        }
        models.append(entry)
    traffic: dict[str, dict[str, Any]] = {}
    stats = [_stats(st) for st in service.registry.serving_stats()]
    for rec in service.registry.records():
        if rec.split is not None:
            traffic[rec.name] = service.model_traffic(rec.name).get("weights", {})
    return {
        "time_ms": time.time_ns() // 1_000_000,
        "server": {
            **service.server_metadata(),
            "live": service.live(),
            "ready": service.ready(),
            "control_mode": str(service.config.control_mode),
        },
        "models": models,
        "traffic": traffic,
        "buckets_us": list(BUCKETS_US),
        "stats": stats,
        "events": service.events.recent(),
    }
