"""Prometheus metrics with Triton's names and labels, read from the statistics objects at
scrape time (the hot path records integers only; nothing here runs per request).

Beyond Triton: latency histograms (``*_duration_histogram_us``) for whole-request, queue and
compute time, so p99 can be computed server-side and aggregated across replicas; per model
``sluice_model_queue_compute_ratio`` (queue over compute time in the last minute, the
autoscaling signal); with the rate limiter, ``sluice_rate_limiter_resource_count`` /
``sluice_rate_limiter_resource_in_use`` per resource and device and
``sluice_rate_limiter_waiting_instances`` per model (Triton exports nothing of its limiter);
``sluice_batch_window_us`` per model version with a latency target (``latency_target_us``):
the dynamic batcher's current window.

As Triton with ``--metrics-config``: the latency summaries (``*_summary_us``,
``summary_latencies=true``), the first-response histogram (``histogram_latencies=true``), no
duration counters (``counter_latencies=false``); with ``--model-namespacing`` every model's
samples carry ``namespace`` (its repository).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import psutil
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ..core.cache import ResponseCache
from ..core.rate_limiter import RateLimiter
from ..core.registry import Registry
from ..core.stats import (
    BUCKETS_US,
    DEFAULT_QUANTILES,
    FIRST_RESPONSE_BUCKETS_MS,
    Histogram,
    LatencySummaries,
    ModelStats,
    Summary,
)

__all__ = ["TritonCollector", "build_registry", "COUNTER_FAMILIES", "exposition"]

_LABELS = ["model", "version"]

# Triton's counters, named without "_total". prometheus_client has no supported way to
# declare such a family "counter" (its text exposition renames a counter to "<name>_total",
# and the samples would then not match the family), so the collector yields them as
# "unknown" and ``exposition`` declares them "counter", as Triton does (text format 0.0.4
# allows any counter name).
COUNTER_FAMILIES = (
    "nv_cache_num_hits_per_model",
    "nv_cache_hit_duration_per_model",
    "nv_cache_num_misses_per_model",
    "nv_cache_miss_duration_per_model",
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)
_TYPE_FIXES = tuple(
    (f"# TYPE {n} untyped\n".encode(), f"# TYPE {n} counter\n".encode()) for n in COUNTER_FAMILIES
)


def _counter(name: str, doc: str) -> Metric:
    assert name in COUNTER_FAMILIES, name
    return Metric(name, doc, "unknown")


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text format 0.0.4, Triton's counters typed "counter"."""
    text = generate_latest(registry)
    for untyped, counter in _TYPE_FIXES:
        text = text.replace(untyped, counter, 1)
    return text


class TritonCollector(Collector):
    def __init__(
        self,
        models: Registry,
        cache: ResponseCache | None = None,
        cpu_metrics: bool = True,
        limiter: RateLimiter | None = None,
        counter_latencies: bool = True,
        summary_quantiles: tuple[tuple[float, float], ...] = (),
    ) -> None:
        self.models = models
        # --metrics-config counter_latencies=false: no *_duration_us counters (as Triton)
        self.counter_latencies = counter_latencies
        self.quantiles = summary_quantiles or DEFAULT_QUANTILES
        self.cache = cache
        self.limiter = limiter
        self.cpu_metrics = cpu_metrics
        self._proc = psutil.Process()
        psutil.cpu_percent(interval=None)  # prime the utilisation counter

    def _stats(self) -> Iterator[ModelStats]:
        yield from self.models.serving_stats()

    def _cache_metrics(self) -> Iterator[Metric]:
        """Triton's response-cache families: per model (for models that use the cache) and
        for the cache as a whole (only when the server has one)."""
        cache = self.cache
        if cache is None:
            return
        per_model = {
            "nv_cache_num_hits_per_model": _counter(
                "nv_cache_num_hits_per_model", "Number of cache hits per model"
            ),
            "nv_cache_hit_duration_per_model": _counter(
                "nv_cache_hit_duration_per_model",
                "Total cache hit duration per model, in microseconds",
            ),
            "nv_cache_num_misses_per_model": _counter(
                "nv_cache_num_misses_per_model", "Number of cache misses per model"
            ),
            "nv_cache_miss_duration_per_model": _counter(
                "nv_cache_miss_duration_per_model",
                "Total cache miss (insert+lookup) duration per model, in microseconds",
            ),
        }
        for rec in self.models.records():
            for v, sv in sorted(rec.serving.items()):
                if not sv.cached:
                    continue
                st, lv = sv.stats, {"model": rec.name, "version": str(v)}
                values = (
                    st.cache_hit.count,
                    st.cache_hit.ns // 1000,
                    st.cache_miss.count,
                    st.cache_miss.ns // 1000,
                )
                for (name, fam), count in zip(per_model.items(), values, strict=True):
                    fam.add_sample(name, lv, count)
        yield from per_model.values()
        gauges: tuple[tuple[str, str, float], ...] = (
            ("nv_cache_util", "Cache utilization [0.0 - 1.0]", cache.used / max(cache.size, 1)),
            ("nv_cache_num_entries", "Number of responses stored in response cache", cache.entries),
            ("nv_cache_num_hits", "Number of cache hits in response cache", cache.hits),
            ("nv_cache_num_misses", "Number of cache misses in response cache", cache.misses),
            (
                "nv_cache_num_lookups",
                "Number of cache lookups in response cache",
                cache.hits + cache.misses,
            ),
            (
                "nv_cache_num_evictions",
                "Number of cache evictions in response cache",
                cache.evictions,
            ),
        )
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(value))
            yield g

    def _limiter_metrics(self) -> Iterator[Metric]:
        if self.limiter is not None:
            yield from _limiter_gauges(self.limiter)

    def collect(self) -> Iterator[Metric]:
        yield from self._model_metrics()
        yield from self._cache_metrics()
        yield from self._limiter_metrics()
        if self.cpu_metrics:
            yield from _cpu_metrics()

    def _model_metrics(self) -> Iterator[Metric]:
        """Triton's per-model families (success, failure by reason, the counters of
        ``_MODEL_COUNTERS``, pending requests, load time), then sluice's histograms; one
        sample per serving model version in each."""
        stats = list(self._stats())
        # --model-namespacing: every model's samples carry its repository, as Triton's
        label_names = (
            ["model", "namespace", "version"] if any(st.namespace for st in stats) else _LABELS
        )
        success = _counter(
            "nv_inference_request_success",
            "Number of successful inference requests, all batch sizes",
        )
        failure = _counter(
            "nv_inference_request_failure", "Number of failed inference requests, all batch sizes"
        )
        counters = [
            (_counter(name, doc), name, value)
            for name, doc, value in _MODEL_COUNTERS
            if self.counter_latencies or not name.endswith("_duration_us")
        ]
        pending = GaugeMetricFamily(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.",
            labels=label_names,
        )
        load = GaugeMetricFamily(
            "nv_model_load_duration_secs", "Model load time in seconds", labels=label_names
        )
        ratio = GaugeMetricFamily(
            "sluice_model_queue_compute_ratio",
            "Queue time over compute (infer) time in the last minute: "
            "rate(nv_inference_queue_duration_us[1m]) / "
            "clamp_min(rate(nv_inference_compute_infer_duration_us[1m]), 1)",
            labels=label_names,
        )
        window = GaugeMetricFamily(
            "sluice_batch_window_us",
            "The dynamic batcher's current window (max queue delay) in microseconds, steered "
            "by the model's latency_target_us",
            labels=label_names,
        )
        any_window = False
        hists = [
            (HistogramMetricFamily(name, doc, labels=label_names), of)
            for name, doc, of in _HISTOGRAMS
        ]
        first = HistogramMetricFamily(
            "nv_inference_first_response_histogram_ms",
            "Duration from request to first response in milliseconds",
            labels=label_names,
        )
        any_first = False
        summaries = [(Metric(name, doc, "summary"), name, of) for name, doc, of in _SUMMARIES]
        any_summaries = False
        for st in stats:
            lv = {"model": st.name, "version": st.version}
            labels = [st.name, st.version]
            if len(label_names) == 3:
                lv = {"model": st.name, "namespace": st.namespace, "version": st.version}
                labels = [st.name, st.namespace, st.version]
            success.add_sample("nv_inference_request_success", lv, st.success.count)
            for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
                failure.add_sample(
                    "nv_inference_request_failure",
                    {**lv, "reason": reason},
                    st.fail_reasons.get(reason, 0),
                )
            for family, name, value in counters:
                family.add_sample(name, lv, value(st))
            pending.add_metric(labels, st.pending)
            load.add_metric(labels, st.load_duration_secs)
            ratio.add_metric(labels, st.queue_compute_ratio())
            if st.batch_window_us is not None:
                any_window = True
                window.add_metric(labels, st.batch_window_us)
            for hist_family, of in hists:
                hist = of(st)
                hist_family.add_metric(labels, _buckets(hist), hist.sum_us)
            if st.first_response is not None:
                any_first = True
                fr = st.first_response
                first.add_metric(labels, _first_buckets(fr.counts, fr.total), fr.sum_ms)
            if st.summaries is not None:
                any_summaries = True
                for summary_family, name, of_summary in summaries:
                    _add_summary(summary_family, name, lv, of_summary(st.summaries), self.quantiles)
        yield success
        yield failure
        for family, _, _ in counters:
            yield family
        yield from (pending, load, ratio)
        if any_window:
            yield window
        if any_first:
            yield first
        if any_summaries:
            for summary_family, _, _ in summaries:
                yield summary_family
        for hist_family, _ in hists:
            yield hist_family


# Triton's per-model counters after success and failure, in the order they are exposed:
# (name, help, value of a model version's statistics). Durations are in microseconds.
_MODEL_COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], int]], ...] = (
    (
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        lambda st: st.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        lambda st: st.execution_count,
    ),
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        lambda st: (st.success.ns + st.fail.ns) // 1000,
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        lambda st: st.queue.ns // 1000,
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        lambda st: st.compute_input.ns // 1000,
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        lambda st: st.compute_infer.ns // 1000,
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        lambda st: st.compute_output.ns // 1000,
    ),
)

# sluice's latency histograms: (name, help, the histogram of a model version's statistics).
_HISTOGRAMS: tuple[tuple[str, str, Callable[[ModelStats], Histogram]], ...] = (
    (
        "nv_inference_request_duration_histogram_us",
        "Histogram of whole-request durations in microseconds (server side)",
        lambda st: st.request_hist,
    ),
    (
        "nv_inference_queue_duration_histogram_us",
        "Histogram of queue durations in microseconds",
        lambda st: st.queue_hist,
    ),
    (
        "nv_inference_compute_duration_histogram_us",
        "Histogram of compute (input + infer + output) durations in microseconds",
        lambda st: st.compute_hist,
    ),
)


# Triton's latency summaries (--metrics-config summary_latencies=true), in its order and with
# its help texts: (name, help, the summary of a version's LatencySummaries)
_SUMMARIES: tuple[tuple[str, str, Callable[[LatencySummaries], Summary]], ...] = (
    (
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds (includes cached requests)",
        lambda s: s.request,
    ),
    (
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
        lambda s: s.queue,
    ),
    (
        "nv_inference_compute_input_summary_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        lambda s: s.compute_input,
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        lambda s: s.compute_infer,
    ),
    (
        "nv_inference_compute_output_summary_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        lambda s: s.compute_output,
    ),
)


def _add_summary(
    family: Metric,
    name: str,
    labels: dict[str, str],
    summary: Summary,
    quantiles: tuple[tuple[float, float], ...],
) -> None:
    """``_count``, ``_sum``, then one sample per quantile (label ``quantile`` last), in
    Triton's order."""
    family.add_sample(f"{name}_count", labels, summary.count)
    family.add_sample(f"{name}_sum", labels, summary.sum_us)
    for q, value in summary.quantiles(quantiles):
        family.add_sample(name, {**labels, "quantile": f"{q:g}"}, value)


def _first_buckets(counts: list[int], total: int) -> list[tuple[str, float]]:
    """Cumulative buckets of the first-response histogram, bounds written as Triton's."""
    out: list[tuple[str, float]] = []
    acc = 0
    for bound, n in zip(FIRST_RESPONSE_BUCKETS_MS, counts, strict=False):
        acc += n
        out.append((str(bound), acc))
    out.append(("+Inf", total))
    return out


def _cpu_metrics() -> Iterator[Metric]:
    """The host's CPU utilisation (since the previous scrape) and memory, as Triton names them."""
    util = GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]")
    util.add_metric([], psutil.cpu_percent(interval=None) / 100.0)
    vm = psutil.virtual_memory()
    total = GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes")
    total.add_metric([], float(vm.total))
    used = GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes")
    used.add_metric([], float(vm.total - vm.available))
    yield from (util, total, used)


def _limiter_gauges(limiter: RateLimiter) -> Iterator[Metric]:
    resources, waiting = limiter.snapshot()
    labels = ["resource", "device"]
    count = GaugeMetricFamily(
        "sluice_rate_limiter_resource_count",
        "How much of a rate-limiter resource there is (--rate-limit-resource, else the most "
        'any instance asks for); device "global" for a global resource',
        labels=labels,
    )
    in_use = GaugeMetricFamily(
        "sluice_rate_limiter_resource_in_use",
        "How much of a rate-limiter resource executing instances hold",
        labels=labels,
    )
    for name, device, total, used in resources:
        count.add_metric([name, device], total)
        in_use.add_metric([name, device], used)
    staged = GaugeMetricFamily(
        "sluice_rate_limiter_waiting_instances",
        "Instances of a model with a batch ready, waiting for the rate limiter to grant their "
        "resources",
        labels=_LABELS,
    )
    for (model, version), n in sorted(waiting.items()):
        staged.add_metric([model, version], n)
    yield from (count, in_use, staged)


def _buckets(hist: Histogram) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    acc = 0
    for bound, n in zip(BUCKETS_US, hist.counts, strict=False):
        acc += n
        out.append((repr(float(bound)), acc))
    out.append(("+Inf", hist.total))
    return out


def build_registry(
    models: Registry,
    cache: ResponseCache | None = None,
    cpu_metrics: bool = True,
    extra: Sequence[Collector] = (),
    limiter: RateLimiter | None = None,
    counter_latencies: bool = True,
    summary_quantiles: tuple[tuple[float, float], ...] = (),
) -> CollectorRegistry:
    """The Prometheus registry of the models serving in ``models`` (and ``cache``, and the
    rate ``limiter``), plus ``extra`` (the object-storage repositories' counters, on-demand
    loading's, where there are any)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        TritonCollector(models, cache, cpu_metrics, limiter, counter_latencies, summary_quantiles)
    )
    for collector in extra:
        registry.register(collector)
    return registry
