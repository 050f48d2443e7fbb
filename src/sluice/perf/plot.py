"""``--plot out.png|out.svg|out.html``: throughput and p50/p99 against the load level, with the
knee and the latency-budget level marked (matplotlib, Agg backend; imported only when asked).

Usage::

    write_plot("sweep.png", analysis, opts, budget_ms=50.0, title="add_sub over http")
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

from .report import Analysis
from .runner import MeasureOptions

__all__ = ["write_plot", "new_figure", "save_figure", "PLOT_SIZE_PX"]

PLOT_SIZE_PX = (1200, 900)  # width, height of a PNG
_DPI = 100


def _figure(a: Analysis, o: MeasureOptions, budget_ms: float | None, title: str):  # type: ignore[no-untyped-def]
    fig = new_figure()
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    x = [r.level for r in a.ordered]
    thr = [r.stats.throughput for r in a.ordered]
    p50 = [r.stats.percentile_ns(50) / 1e6 for r in a.ordered]
    p99 = [r.stats.percentile_ns(99) / 1e6 for r in a.ordered]
    xlabel = "concurrency" if o.mode == "concurrency" else "request rate (req/s)"
    ax1.plot(x, thr, "o-", color="tab:blue", label="throughput")
    ax1.set_ylabel("inferences / s")
    ax1.set_title(title)
    ax2.plot(x, p50, "o-", color="tab:green", label="p50")
    ax2.plot(x, p99, "o-", color="tab:red", label="p99")
    ax2.set_ylabel("latency (ms)")
    ax2.set_xlabel(xlabel)
    if a.knee is not None:
        k = a.ordered[a.knee]
        for ax in (ax1, ax2):
            ax.axvline(k.level, color="tab:orange", linestyle="--", label=f"knee ({k.level:g})")
    if budget_ms is not None:
        ax2.axhline(budget_ms, color="gray", linestyle=":", label=f"budget {budget_ms:g} ms")
        if a.budget is not None:
            b = a.ordered[a.budget]
            ax1.plot(
                [b.level],
                [b.stats.throughput],
                "*",
                markersize=16,
                color="tab:purple",
                label=f"best within budget ({b.level:g})",
            )
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best")
    fig.tight_layout()
    return fig


def new_figure():  # type: ignore[no-untyped-def]
    """An empty PLOT_SIZE_PX matplotlib Figure (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(PLOT_SIZE_PX[0] / _DPI, PLOT_SIZE_PX[1] / _DPI), dpi=_DPI)
    return fig


def write_plot(
    path: str, a: Analysis, o: MeasureOptions, budget_ms: float | None = None, title: str = ""
) -> None:
    save_figure(_figure(a, o, budget_ms, title), path, title)


def save_figure(fig, path: str, title: str = "") -> None:  # type: ignore[no-untyped-def]
    """PNG/SVG by the suffix; ``.html``: one page with the PNG inlined."""
    out = Path(path)
    if out.suffix.lower() in (".html", ".htm"):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=_DPI)
        img = base64.b64encode(buf.getvalue()).decode()
        out.write_text(
            "<!doctype html><html><head><meta charset='utf-8'><title>sluice perf</title></head>"
            f"<body><h1>{title}</h1><img alt='sluice perf sweep' src='data:image/png;base64,{img}'>"
            "</body></html>\n"
        )
    else:
        fig.savefig(str(out), dpi=_DPI)
