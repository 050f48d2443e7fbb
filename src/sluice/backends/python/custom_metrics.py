"""The metric families that python models declare (``pb_utils.MetricFamily``), shown on the
metrics port after the server's own families, as Triton shows them.

Rules of this file:
- A family is known by its name across all models and workers: declaring it again with the
  same kind gives the same family (the first description stays), with another kind is an
  error (Triton's words). A series is a family plus a label set; two ``Metric`` objects with
  the same labels, in one worker or in several, are the same series.
- Workers write every series into shared-memory cells with no message per call
  (``backends/python/metric_cells.py``); at scrape time a counter or histogram sums the
  cells of every worker that holds it plus ``base`` (what workers that left had counted).
- A gauge's cells per worker are (value, time of its last ``set``; 0: never set). Its value:
  the value of the worker that set it last, plus the values of the workers that only ever
  added to it. Exact for one writer, for many that only add (an in-flight count), and for
  many that only set (the last set wins, as in Triton); where workers mix ``set`` and
  ``increment`` on one series, another worker's increments made before a set are not
  undone by it (Triton applies every call in one order: a race in either server).
- What a model declared goes with its last instance: a series with no owner (python model
  instance) left disappears, and a family with no series is not shown (Triton shows no
  family without metrics). While others hold a series, what a departed owner counted stays
  in it: a counter never goes down.
- Nothing here runs per request; ``render`` runs per scrape.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "COUNTER",
    "GAUGE",
    "HISTOGRAM",
    "KIND_NAMES",
    "RESERVED_PREFIX",
    "CustomMetrics",
    "MetricError",
    "Cells",
    "format_value",
    "cell_count",
]

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2  # Triton's MetricKind values
KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}
RESERVED_PREFIX = "nv_"  # the server's own families

# Prometheus' data model: metric and label names. Label names starting "__" are reserved.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")

Labels = tuple[tuple[str, str], ...]  # sorted by name, as Prometheus client libraries keep them
# (cells, index): a worker's shared cells (a memoryview of doubles) and where a series starts
Cells = tuple[memoryview, int]


class MetricError(Exception):
    """A declaration refused, in Triton's (prometheus-cpp's) words."""


@dataclass
class _Series:
    labels: Labels
    buckets: tuple[float, ...]  # histograms only
    gauge: bool = False
    owners: set[Hashable] = field(default_factory=set)
    cells: dict[Hashable, Cells] = field(default_factory=dict)  # counters and histograms
    # counters: [total]; histograms: per-bucket counts (the last is +Inf), then the sum;
    # what workers that left had written. Gauges: their (value, set time) pairs.
    base: list[float] = field(default_factory=list)
    gone: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class _Family:
    name: str
    description: str
    kind: int
    series: dict[Labels, _Series] = field(default_factory=dict)
    owners: set[Hashable] = field(default_factory=set)


def format_value(v: float) -> str:
    """A sample value as Triton writes it: ``4``, ``5.5``, ``1e+20``, ``+Inf``."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(v: str) -> str:
    # The text format's escapes (Triton writes HELP raw: a newline in a description breaks
    # its exposition for every parser; here it is written as \n).
    return v.replace("\\", "\\\\").replace("\n", "\\n")


def _labels_text(labels: Labels, extra: str = "") -> str:
    parts = [f'{k}="{_escape_label(v)}"' for k, v in labels]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def cell_count(kind: int, buckets: Sequence[float]) -> int:
    """How many cells a series takes in a worker's block."""
    if kind == HISTOGRAM:
        return len(buckets) + 2  # one count per bucket, +Inf, the sum
    return 2 if kind == GAUGE else 1  # a gauge: value, time of the last set


class CustomMetrics:
    """Every custom metric family of one server.

    ``owner`` is any hashable naming one python model instance (its worker restarts keep the
    owner; ``fold`` keeps what the dead worker had counted).
    """

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}

    # ---------------------------------------------------------------- declarations
    def declare_family(self, owner: Hashable, name: str, description: str, kind: int) -> None:
        if kind not in KIND_NAMES:
            raise MetricError("Unsupported kind passed to MetricFamily constructor.")
        if not _METRIC_NAME.match(name):
            raise MetricError("Invalid metric name")
        if name.startswith(RESERVED_PREFIX):
            # Triton would merge a same-kind family into its own: here they stay apart
            raise MetricError(
                f"Family name already exists: names starting with '{RESERVED_PREFIX}' are "
                "the server's own metric families"
            )
        fam = self._families.get(name)
        if fam is None:
            fam = self._families[name] = _Family(name, description, kind)
        elif fam.kind != kind:
            raise MetricError("Family name already exists with different type")
        fam.owners.add(owner)

    def declare_series(
        self, owner: Hashable, family: str, labels: dict[str, str], buckets: Sequence[float]
    ) -> tuple[float, ...]:
        """Add ``owner`` to the series (made if new); the series' buckets (a series keeps the
        buckets of its first declaration, as Triton's)."""
        fam = self._families.get(family)
        if fam is None or owner not in fam.owners:
            raise MetricError(f"metric family '{family}' is not declared")
        key = self.check_labels(labels)
        series = fam.series.get(key)
        if series is None:
            bounds = tuple(float(b) for b in buckets) if fam.kind == HISTOGRAM else ()
            if any(b >= c for b, c in zip(bounds, bounds[1:], strict=False)):
                raise MetricError("Bucket Boundaries must be strictly sorted")
            series = fam.series[key] = _Series(
                key, bounds, base=[0.0] * cell_count(fam.kind, bounds), gauge=fam.kind == GAUGE
            )
        series.owners.add(owner)
        return series.buckets

    @staticmethod
    def check_labels(labels: dict[str, str]) -> Labels:
        for k, v in labels.items():
            if not isinstance(v, str):
                raise MetricError("attempt to access JSON non-string as string")
            if not isinstance(k, str) or not _LABEL_NAME.match(k) or k.startswith("__"):
                raise MetricError("Invalid label name")
        return tuple(sorted(labels.items()))

    def attach(self, owner: Hashable, family: str, labels: Labels, cells: Cells) -> None:
        """Where ``owner``'s worker writes the series."""
        self._series(family, labels).cells[owner] = cells

    # ---------------------------------------------------------------- values
    def _series(self, family: str, labels: Labels) -> _Series:
        fam = self._families.get(family)
        series = fam.series.get(labels) if fam is not None else None
        if series is None:
            raise MetricError(f"metric {family}{_labels_text(labels)} is not declared")
        return series

    def value(self, family: str, labels: Labels) -> float:
        """A counter's or gauge's value over every worker (``Metric.value()``)."""
        return self._totals(self._series(family, labels))[0]

    @staticmethod
    def _totals(series: _Series) -> list[float]:
        if series.gauge:
            pairs = [(c[at], c[at + 1]) for c, at in series.cells.values()] + series.gone
            setters = [p for p in pairs if p[1] > 0]
            added = sum(v for v, stamp in pairs if stamp == 0)
            return [max(setters, key=lambda p: p[1])[0] + added if setters else added]
        out = list(series.base)
        n = len(out)
        for cells, at in series.cells.values():
            for i in range(n):
                out[i] += cells[at + i]
        return out

    # ---------------------------------------------------------------- owners leaving
    def fold(self, owner: Hashable) -> None:
        """``owner``'s worker died: what it counted stays (a counter never goes down); its
        replacement attaches fresh cells when the model declares its metrics again."""
        for fam in self._families.values():
            for series in fam.series.values():
                got = series.cells.pop(owner, None)
                if got is not None:
                    self._keep(series, got)

    @staticmethod
    def _keep(series: _Series, got: Cells) -> None:
        """What a worker that leaves had written stays in the series."""
        cells, at = got
        if series.gauge:
            series.gone.append((cells[at], cells[at + 1]))
            return
        for i in range(len(series.base)):
            series.base[i] += cells[at + i]

    def drop(self, owner: Hashable) -> None:
        """``owner`` stopped (its model was unloaded): its series and families go with it
        unless another owner holds them (a shared counter then keeps its total: it never
        goes down)."""
        for name in list(self._families):
            fam = self._families[name]
            fam.owners.discard(owner)
            for key in list(fam.series):
                series = fam.series[key]
                got = series.cells.pop(owner, None)
                if got is not None:  # what it counted stays while others hold the series
                    self._keep(series, got)
                series.owners.discard(owner)
                if not series.owners:
                    del fam.series[key]
            if not fam.owners:
                del self._families[name]

    # ---------------------------------------------------------------- exposition
    def render(self) -> str:
        """The families in the Prometheus text format, by name; a family without series is
        left out. Histograms as Triton writes them: ``_count``, ``_sum``, then the buckets."""
        lines: list[str] = []
        for name in sorted(self._families):
            fam = self._families[name]
            if not fam.series:
                continue
            lines.append(f"# HELP {name} {_escape_help(fam.description)}")
            lines.append(f"# TYPE {name} {KIND_NAMES[fam.kind]}")
            for series in fam.series.values():
                totals = self._totals(series)
                labels = series.labels
                if fam.kind != HISTOGRAM:
                    lines.append(f"{name}{_labels_text(labels)} {format_value(totals[0])}")
                    continue
                counts, total_sum = totals[:-1], totals[-1]
                lines.append(f"{name}_count{_labels_text(labels)} {format_value(sum(counts))}")
                lines.append(f"{name}_sum{_labels_text(labels)} {format_value(total_sum)}")
                acc = 0.0
                bounds = [format_value(b) for b in series.buckets] + ["+Inf"]
                for bound, n in zip(bounds, counts, strict=True):
                    acc += n
                    le = f'le="{bound}"'
                    lines.append(f"{name}_bucket{_labels_text(labels, le)} {format_value(acc)}")
        return "\n".join(lines) + "\n" if lines else ""
