"""Metrics of on-demand loading (sluice's own families; Triton has no such feature), read
from ``OnDemand`` at scrape time:

- ``sluice_model_on_demand_loads_total{model}``: loads a request caused that succeeded
  (concurrent requests for one cold model count one load);
- ``sluice_model_on_demand_load_failures_total{model}``: such loads that failed;
- ``sluice_model_evictions_total{model}``: unloads that made room for another model;
- ``sluice_model_load_wait_seconds{model}`` (histogram): how long requests waited for the
  model's load on demand, each waiting request once, whatever the outcome;
- ``sluice_model_load_waiting_requests{model}``: requests waiting now for the model's load;
- ``sluice_model_memory_bytes{model}``: what each serving model holds as admission
  estimated it (declared or measured per instance x instances), the figure the budget counts;
- ``sluice_model_memory_held_bytes`` / ``sluice_model_memory_budget_bytes``: their sum, and
  the budget (``--model-memory-limit``, else available memory minus a margin plus the sum).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from . import layout
from .on_demand import WAIT_BUCKETS, OnDemand

__all__ = ["OnDemandCollector"]


class OnDemandCollector(Collector):
    def __init__(self, on_demand: OnDemand) -> None:
        self.on_demand = on_demand

    def collect(self) -> Iterator[Metric]:
        od = self.on_demand
        loads = CounterMetricFamily(
            "sluice_model_on_demand_loads",
            "Loads of a model caused by a request for it while it was not loaded",
            labels=["model"],
        )
        failures = CounterMetricFamily(
            "sluice_model_on_demand_load_failures",
            "Loads on demand that failed (each answered its waiting requests with the error)",
            labels=["model"],
        )
        evictions = CounterMetricFamily(
            "sluice_model_evictions",
            "Unloads of a least recently used idle model to make room for another's load",
            labels=["model"],
        )
        wait = HistogramMetricFamily(
            "sluice_model_load_wait_seconds",
            "Time requests waited for their model's load on demand, in seconds",
            labels=["model"],
        )
        for name, c in sorted(od.counters.items()):
            label = [layout.display_name(name)]
            loads.add_metric(label, c.loads)
            failures.add_metric(label, c.load_failures)
            evictions.add_metric(label, c.evictions)
            acc = 0
            buckets: list[tuple[str, float]] = []
            for bound, n in zip(WAIT_BUCKETS, c.wait.counts, strict=False):
                acc += n
                buckets.append((repr(float(bound)), acc))
            buckets.append(("+Inf", c.wait.total))
            wait.add_metric(label, buckets, c.wait.sum_s)
        waiting = GaugeMetricFamily(
            "sluice_model_load_waiting_requests",
            "Requests waiting now for their model's load on demand",
            labels=["model"],
        )
        for name, n in sorted(od.waiting().items()):
            waiting.add_metric([layout.display_name(name)], float(n))
        memory = GaugeMetricFamily(
            "sluice_model_memory_bytes",
            "Bytes a serving model holds as admission estimated them (declared or measured "
            "per instance, times instances): what on-demand loading counts in its budget",
            labels=["model"],
        )
        for rec in od.registry.records():
            if rec.serving:
                memory.add_metric([layout.display_name(rec.name)], float(od.footprint(rec)))
        held = GaugeMetricFamily(
            "sluice_model_memory_held_bytes",
            "Sum of sluice_model_memory_bytes over the serving models",
        )
        held.add_metric([], float(od.held()))
        budget = GaugeMetricFamily(
            "sluice_model_memory_budget_bytes",
            "What the models may hold in all before on-demand loading evicts: "
            "--model-memory-limit, else the available memory minus a margin plus what they hold",
        )
        budget.add_metric([], float(od.budget()[0]))
        yield from (loads, failures, evictions, wait, waiting, memory, held, budget)
