"""``sluice tune``: try instance counts and dynamic-batching settings against a latency budget.

For each combination of the knobs, the model's running configuration (``GET .../config``) gets
the knobs set, is loaded through the standard load API as a ``config`` override, and is swept with
``sluice perf``'s runner; the table shows throughput, p50/p99 and the server's queue vs compute
time (the statistics extension diffed around each window, as ``sluice perf`` reports them). The
pick is the highest-throughput (combination, concurrency) whose p99 fits the budget.

Rules of this file:
- The model must be loaded; what it runs with before the tune is what gets restored afterwards
  (a load with that JSON as the override: a plain load would keep the tune's override, since a
  load whose files did not change keeps the override in force, on sluice and on Triton), unless
  ``--apply`` (then the pick stays loaded). Restoring happens on every exit path.
- One set of load-generator processes serves the whole grid; a combination the server refuses
  (or that does not come back with the knobs set) is reported and skipped.
- Every level of the range is measured for every combination; only stable levels are
  candidates (as for ``sluice perf``'s budget level), an unstable one is shown as such.
- Exit status: 0 a pick, 1 none fits (the table is still printed) or the server said no,
  2 usage, 3 nothing answered at ``-u``, 130 interrupted.

Usage::

    sluice tune -m resnet50 -u localhost:8000 --latency-budget-ms 50 \\
        --instance-count 1,2,4 --max-queue-delay-us 0,500,2000 --preferred-batch-size 4,8 none \\
        --concurrency-range 1:16:4 -o tuned.pbtxt --plot tune.png
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..perf.cli import add_measurement_flags, measure_options, parse_range
from ..perf.knee import best_within_budget
from ..perf.runner import LevelResult, MeasureOptions, Runner, levels_from_range
from ..perf.workload import (
    ModelInfo,
    PerfError,
    Target,
    build_inputs,
    encode_payloads,
    fetch_model,
)
from .client import (
    OpsClient,
    OpsError,
    ServerSaid,
    UsageError,
    add_server_flags,
    api_key_option,
)
from .model_cmd import config_to_pbtxt
from .table import render

__all__ = [
    "Knobs",
    "add_tune_flags",
    "run_tune",
    "build_grid",
    "apply_knobs",
    "effective_knobs",
    "pick",
]


# --------------------------------------------------------------------------- the grid
@dataclass(frozen=True)
class Knobs:
    """One combination; None leaves the model's own setting."""

    instance_count: int | None = None
    max_queue_delay_us: int | None = None
    preferred_batch_size: tuple[int, ...] | None = None

    def label(self) -> str:
        parts = []
        if self.instance_count is not None:
            parts.append(f"instance_count={self.instance_count}")
        if self.max_queue_delay_us is not None:
            parts.append(f"max_queue_delay_us={self.max_queue_delay_us}")
        if self.preferred_batch_size is not None:
            parts.append(
                "preferred_batch_size=" + (",".join(map(str, self.preferred_batch_size)) or "none")
            )
        return " ".join(parts) or "as configured"


def _int_list(text: str, flag: str, minimum: int) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < minimum:
            raise argparse.ArgumentTypeError(
                f"{flag} takes whole numbers >= {minimum} separated by commas, got '{text}'"
            )
        out.append(int(part))
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"{flag} lists a value twice: '{text}'")
    return out


def _preferred(text: str) -> tuple[int, ...]:
    if text.strip().lower() in ("none", "-", ""):
        return ()
    return tuple(_int_list(text, "--preferred-batch-size", 1))


def build_grid(
    instance_counts: Sequence[int] | None,
    delays_us: Sequence[int] | None,
    preferred: Sequence[tuple[int, ...]] | None,
) -> list[Knobs]:
    """Every combination, in the order given (instance count outermost)."""
    counts: list[int | None] = [*instance_counts] if instance_counts else [None]
    delays: list[int | None] = [*delays_us] if delays_us else [None]
    prefs: list[tuple[int, ...] | None] = [*preferred] if preferred else [None]
    return [Knobs(i, d, p) for i, d, p in itertools.product(counts, delays, prefs)]


def check_knobs(config: dict[str, Any], grid: Sequence[Knobs]) -> None:
    """UsageError when a knob cannot apply to this model (before anything is loaded)."""
    batching = any(
        k.max_queue_delay_us is not None or k.preferred_batch_size is not None for k in grid
    )
    if not batching:
        return
    mbs = int(config.get("max_batch_size", 0) or 0)
    name = config.get("name", "the model")
    if mbs <= 0:
        raise UsageError(
            f"'{name}' has max_batch_size 0: --max-queue-delay-us / --preferred-batch-size need "
            "a model that batches"
        )
    if config.get("sequence_batching"):
        raise UsageError(
            f"'{name}' uses sequence batching: --max-queue-delay-us / --preferred-batch-size set "
            "dynamic batching, which a model cannot have at the same time"
        )
    for k in grid:
        for size in k.preferred_batch_size or ():
            if size > mbs:
                raise UsageError(
                    f"--preferred-batch-size {size} is above '{name}' max_batch_size {mbs}"
                )


def apply_knobs(config: dict[str, Any], k: Knobs) -> dict[str, Any]:
    """A copy of ``config`` with the knobs set: every instance group gets the count; dynamic
    batching (created when missing) gets the delay and the preferred sizes."""
    new = copy.deepcopy(config)
    if k.instance_count is not None:
        groups = new.get("instance_group") or []
        if groups:
            for g in groups:
                g["count"] = k.instance_count
        else:
            new["instance_group"] = [{"count": k.instance_count}]
    if k.max_queue_delay_us is not None or k.preferred_batch_size is not None:
        db = new.get("dynamic_batching") or {}
        if k.max_queue_delay_us is not None:
            db["max_queue_delay_microseconds"] = k.max_queue_delay_us
        if k.preferred_batch_size is not None:
            db["preferred_batch_size"] = list(k.preferred_batch_size)
        new["dynamic_batching"] = db
    return new


def effective_knobs(config: dict[str, Any]) -> tuple[str, str, str]:
    """(instances, delay, preferred) as a config states them, for the table."""
    groups = config.get("instance_group") or []
    count = ",".join(str(int(g.get("count", 1) or 1)) for g in groups) or "-"
    db = config.get("dynamic_batching")
    if db is None:
        return count, "-", "-"
    delay = str(int(db.get("max_queue_delay_microseconds", 0) or 0))
    pref = ",".join(str(int(s)) for s in db.get("preferred_batch_size") or []) or "none"
    return count, delay, pref


def _mismatch(want: Knobs, got: dict[str, Any]) -> str | None:
    """How the configuration the server reports differs from the knobs (None: it matches)."""
    count, delay, pref = effective_knobs(got)
    if want.instance_count is not None and any(
        int(g.get("count", 1) or 1) != want.instance_count for g in got.get("instance_group") or []
    ):
        return f"instance_group count is {count}"
    if want.max_queue_delay_us is not None and delay != str(want.max_queue_delay_us):
        return f"max_queue_delay_microseconds is {delay}"
    if want.preferred_batch_size is not None:
        sizes = ",".join(map(str, want.preferred_batch_size)) or "none"
        if pref != sizes:
            return f"preferred_batch_size is {pref}"
    return None


# --------------------------------------------------------------------------- outcomes
@dataclass
class Combo:
    knobs: Knobs
    config: dict[str, Any]  # as the server reported it once loaded (or as sent, on error)
    levels: list[LevelResult] = field(default_factory=list)
    error: str | None = None


@dataclass
class Point:
    combo: int
    result: LevelResult

    @property
    def throughput(self) -> float:
        return self.result.stats.throughput

    def p_ms(self, p: float) -> float:
        return self.result.stats.percentile_ns(p) / 1e6


def pick(combos: Sequence[Combo], budget_ms: float) -> tuple[list[Point], int | None]:
    """The stable points of every combination (in order) and the index of the pick among them
    (perf's budget rule: highest throughput with p99 <= budget, the earlier on a tie)."""
    points = [Point(i, r) for i, c in enumerate(combos) for r in c.levels if r.stable]
    best = best_within_budget(
        [p.throughput for p in points], [p.p_ms(99) for p in points], budget_ms
    )
    return points, best


def _server_parts(r: LevelResult) -> tuple[str, str, str]:
    """Average queue and compute time per request (usec) and the average batch, server side."""
    s = r.stats.server
    if s is None or not s.success_count:
        return "-", "-", "-"
    compute = s.compute_input_ns + s.compute_infer_ns + s.compute_output_ns
    batch = f"{s.inference_count / s.execution_count:.2f}" if s.execution_count else "-"
    return f"{s.avg_us(s.queue_ns):.0f}", f"{s.avg_us(compute):.0f}", batch


TABLE_HEADERS = [
    "",
    "INSTANCES",
    "DELAY_US",
    "PREFERRED",
    "CONC",
    "INFER/S",
    "P50_MS",
    "P99_MS",
    "QUEUE_US",
    "COMPUTE_US",
    "AVG_BATCH",
    "FITS",
]


def table(combos: Sequence[Combo], budget_ms: float, best: Point | None) -> str:
    rows: list[list[Any]] = []
    for i, c in enumerate(combos):
        count, delay, pref = effective_knobs(c.config)
        if c.error is not None:
            rows.append(["", count, delay, pref, "-", "-", "-", "-", "-", "-", "-", c.error])
            continue
        for r in c.levels:
            s = r.stats
            p99 = s.percentile_ns(99) / 1e6
            q, comp, batch = _server_parts(r)
            fits = "unstable" if not r.stable else ("yes" if p99 <= budget_ms else "no")
            mark = "*" if best is not None and best.combo == i and best.result is r else ""
            rows.append(
                [
                    mark,
                    count,
                    delay,
                    pref,
                    int(r.level),
                    f"{s.throughput:.1f}",
                    f"{s.percentile_ns(50) / 1e6:.2f}",
                    f"{p99:.2f}",
                    q,
                    comp,
                    batch,
                    fits,
                ]
            )
    return render(TABLE_HEADERS, rows, numeric=set(range(1, 11)))


def _point_doc(c: Combo, r: LevelResult, budget_ms: float) -> dict[str, Any]:
    s = r.stats
    srv = s.server
    doc: dict[str, Any] = {
        "concurrency": int(r.level),
        "throughput": s.throughput,
        "p50_ms": s.percentile_ns(50) / 1e6,
        "p99_ms": s.percentile_ns(99) / 1e6,
        "stable": r.stable,
        "fits": r.stable and s.percentile_ns(99) / 1e6 <= budget_ms,
    }
    if srv is not None and srv.success_count:
        doc["queue_us"] = srv.avg_us(srv.queue_ns)
        doc["compute_us"] = srv.avg_us(
            srv.compute_input_ns + srv.compute_infer_ns + srv.compute_output_ns
        )
        doc["avg_batch"] = (
            srv.inference_count / srv.execution_count if srv.execution_count else None
        )
    return doc


def _knobs_doc(c: Combo) -> dict[str, Any]:
    count, delay, pref = effective_knobs(c.config)
    return {"instance_count": count, "max_queue_delay_us": delay, "preferred_batch_size": pref}


def report_doc(
    model: str,
    combos: Sequence[Combo],
    budget_ms: float,
    best: Point | None,
    outcome: str,
) -> dict[str, Any]:
    return {
        "model": model,
        "latency_budget_ms": budget_ms,
        "combinations": [
            {
                **_knobs_doc(c),
                "error": c.error,
                "levels": [_point_doc(c, r, budget_ms) for r in c.levels],
            }
            for c in combos
        ],
        "best": None
        if best is None
        else {
            **_knobs_doc(combos[best.combo]),
            **_point_doc(combos[best.combo], best.result, budget_ms),
        },
        "afterwards": outcome,
    }


def write_tune_plot(
    path: str, combos: Sequence[Combo], budget_ms: float, best: Point | None, title: str
) -> None:
    """Throughput against p99, one line per combination (points labelled with the concurrency),
    the budget as a vertical line and the pick starred."""
    from ..perf.plot import new_figure, save_figure

    fig = new_figure()
    ax = fig.subplots(1, 1)
    for c in combos:
        stable = [r for r in c.levels if r.stable]
        if not stable:
            continue
        count, delay, pref = effective_knobs(c.config)
        x = [r.stats.percentile_ns(99) / 1e6 for r in stable]
        y = [r.stats.throughput for r in stable]
        line = ax.plot(x, y, "o-", label=f"instances {count}, delay {delay} us, preferred {pref}")
        for r, xi, yi in zip(stable, x, y, strict=True):
            ax.annotate(
                f"c{int(r.level)}",
                (xi, yi),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=8,
                color=line[0].get_color(),
            )
    ax.axvline(budget_ms, color="gray", linestyle=":", label=f"p99 budget {budget_ms:g} ms")
    if best is not None:
        ax.plot(
            [best.p_ms(99)],
            [best.throughput],
            "*",
            markersize=18,
            color="tab:purple",
            label="pick",
        )
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel("inferences / s")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, title)


# --------------------------------------------------------------------------- the run
def add_tune_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model-name", dest="model", required=True)
    p.add_argument(
        "-x", "--model-version", dest="version", default="", help="version the sweep sends to"
    )
    add_server_flags(p, key="an admin key, ")
    p.add_argument(
        "--latency-budget-ms", type=float, required=True, metavar="MS", help="the p99 target"
    )
    p.add_argument(
        "--instance-count",
        type=lambda t: _int_list(t, "--instance-count", 1),
        default=None,
        metavar="N,N,...",
        help="instance counts to try (default: keep the model's)",
    )
    p.add_argument(
        "--max-queue-delay-us",
        type=lambda t: _int_list(t, "--max-queue-delay-us", 0),
        default=None,
        metavar="US,US,...",
        help="dynamic batching max_queue_delay_microseconds to try",
    )
    p.add_argument(
        "--preferred-batch-size",
        type=_preferred,
        nargs="+",
        action="extend",
        default=None,
        metavar="SIZES",
        help="preferred_batch_size lists to try, each comma-separated ('4,8 8 none')",
    )
    p.add_argument(
        "--concurrency-range",
        type=parse_range,
        default=None,
        metavar="START:END:STEP",
        help="concurrency levels of each sweep (default 1)",
    )
    add_measurement_flags(p)
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write the pick as pbtxt")
    p.add_argument("--apply", action="store_true", help="leave the pick loaded (default: restore)")
    p.add_argument("--plot", default=None, metavar="FILE.png|.svg|.html")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument(
        "--load-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds to wait for each load to be ready (default 300)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    # perf's options that a tune does not vary
    p.set_defaults(
        request_rate_range=None,
        request_distribution="constant",
        latency_threshold=0.0,
        binary_search=False,
    )


class _LevelRunner(Runner):
    """Runner that reports each level as it is measured."""

    def __init__(self, *a: Any, on_level: Callable[[LevelResult], None], **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.on_level = on_level

    def measure(self, level: float) -> LevelResult:
        r = super().measure(level)
        self.on_level(r)
        return r


class _Tuner:
    def __init__(
        self,
        api: OpsClient,
        ns: argparse.Namespace,
        original: dict[str, Any],
        grid: list[Knobs],
        mo: MeasureOptions,
    ) -> None:
        self.api, self.ns, self.original, self.grid, self.mo = api, ns, original, grid, mo
        self.combos: list[Combo] = []
        self.levels = levels_from_range(mo.start, mo.end, mo.step, integer=True)
        self.loaded: dict[str, Any] | None = None  # the override in force, if not the original

    def say(self, text: str) -> None:
        if not self.ns.quiet:
            print(text, file=sys.stderr, flush=True)

    def load(self, config: dict[str, Any]) -> dict[str, Any]:
        """Load ``config`` as the override, wait until ready; the config the server reports."""
        self.loaded = config
        self.api.load(self.ns.model, config)
        deadline = time.monotonic() + self.ns.load_timeout
        while not self.api.is_ready(self.ns.model, self.ns.version):
            if time.monotonic() > deadline:
                raise ServerSaid(
                    f"'{self.ns.model}' was not ready {self.ns.load_timeout:g} s after its load"
                )
            time.sleep(0.05)
        return self.api.config(self.ns.model)

    def sweep_all(self, target: Target, model: ModelInfo, payloads: list[bytes]) -> None:
        n = len(self.grid)

        def on_level(r: LevelResult) -> None:
            s = r.stats
            self.say(
                f"  concurrency {int(r.level)}: {s.throughput:.1f} infer/s, p50 "
                f"{s.percentile_ns(50) / 1e6:.2f} ms, p99 {s.percentile_ns(99) / 1e6:.2f} ms"
                + ("" if r.stable else " (not stable)")
            )

        with _LevelRunner(target, model, payloads, self.mo, on_level=on_level) as runner:
            for i, knobs in enumerate(self.grid, 1):
                want = apply_knobs(self.original, knobs)
                self.say(f"[{i}/{n}] {knobs.label()}: loading")
                try:
                    got = self.load(want)
                except ServerSaid as exc:
                    self.say(f"  refused: {exc}")
                    self.combos.append(Combo(knobs, want, error=f"load failed: {exc}"))
                    continue
                wrong = _mismatch(knobs, got)
                if wrong is not None:
                    msg = f"the server did not apply the knobs ({wrong})"
                    self.say(f"  {msg}")
                    self.combos.append(Combo(knobs, got, error=msg))
                    continue
                combo = Combo(knobs, got)
                self.combos.append(combo)
                try:
                    # every level, even past an unstable one (where perf's sweep stops): the
                    # grid is compared level by level, and an unstable level only drops out
                    for level in self.levels:
                        combo.levels.append(runner.measure(level))
                except PerfError as exc:
                    combo.error = f"sweep failed: {exc}"
                    self.say(f"  {combo.error}")

    def finish(self, best: Point | None) -> str:
        """Apply the pick or restore the original; returns what was done, in words."""
        if self.ns.apply and best is not None:
            self.load(apply_knobs(self.original, self.combos[best.combo].knobs))
            return "applied"
        if self.loaded is None:
            return "unchanged"
        self.load(self.original)
        self.loaded = None
        return "restored"


def _restore_quietly(tuner: _Tuner) -> str:
    """Restore on an error path; the error that caused it stays the one reported."""
    if tuner.loaded is None:
        return "unchanged"
    try:
        tuner.load(tuner.original)
        tuner.loaded = None
        return "restored"
    except OpsError as exc:
        print(
            f"error: could not restore the original configuration of '{tuner.ns.model}': {exc}",
            file=sys.stderr,
        )
        return "not restored"


def run_tune(ns: argparse.Namespace) -> int:
    from ..perf import require_extra

    if code := require_extra("sluice tune"):
        return code
    budget = ns.latency_budget_ms
    try:
        if not budget > 0:
            raise UsageError("--latency-budget-ms must be above 0")
        try:
            mo, io = measure_options(ns)
        except PerfError as exc:
            raise UsageError(str(exc)) from None
        if mo.end < mo.start:
            raise UsageError("--concurrency-range needs an end at or above its start")
        grid = build_grid(ns.instance_count, ns.max_queue_delay_us, ns.preferred_batch_size)
        api = OpsClient.connect(
            ns.url, timeout=max(120.0, ns.load_timeout), api_key=api_key_option(ns.api_key)
        )
    except OpsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    with api:
        try:
            original = api.config(ns.model)
            check_knobs(original, grid)
            target = Target.parse(api.url, "http", api_key_option(ns.api_key))
            try:
                model = fetch_model(target, ns.model, ns.version)
                payloads = encode_payloads(target, model, build_inputs(model, io))
            except PerfError as exc:
                raise ServerSaid(str(exc)) from None
        except OpsError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.exit_code
        tuner = _Tuner(api, ns, original, grid, mo)
        try:
            tuner.sweep_all(target, model, payloads)
            points, best_i = pick(tuner.combos, budget)
            best = points[best_i] if best_i is not None else None
            outcome = tuner.finish(best)
        except KeyboardInterrupt:
            _restore_quietly(tuner)
            print("interrupted", file=sys.stderr)
            return 130
        except (OpsError, PerfError) as exc:
            after = _restore_quietly(tuner)
            print(f"error: {exc} (configuration {after})", file=sys.stderr)
            return exc.exit_code if isinstance(exc, OpsError) else 1
    return _report(ns, tuner.combos, budget, best, outcome)


def _report(
    ns: argparse.Namespace,
    combos: list[Combo],
    budget: float,
    best: Point | None,
    outcome: str,
) -> int:
    if ns.format == "json":
        print(json.dumps(report_doc(ns.model, combos, budget, best, outcome), indent=2))
    else:
        print(table(combos, budget, best))
        print()
        if best is None:
            print(f"No combination kept p99 within {budget:g} ms.")
        else:
            count, delay, pref = effective_knobs(combos[best.combo].config)
            print(
                f"Best within p99 <= {budget:g} ms: instance_count {count}, "
                f"max_queue_delay_us {delay}, preferred_batch_size {pref} at concurrency "
                f"{int(best.result.level)}: {best.throughput:.1f} infer/s, "
                f"p50 {best.p_ms(50):.2f} ms, p99 {best.p_ms(99):.2f} ms"
            )
        unstable = sum(1 for c in combos for r in c.levels if not r.stable)
        if unstable:
            print(
                f"{unstable} level(s) did not stabilise within -r {ns.max_trials} windows and "
                "were not candidates (raise -p/--measurement-interval, -r or -s)."
            )
        words = {
            "applied": f"'{ns.model}' now runs the pick (--apply).",
            "restored": f"'{ns.model}' runs its original configuration again.",
            "unchanged": f"'{ns.model}' was left as it was.",
        }
        print(words.get(outcome, outcome))
    if ns.output:
        if best is None:
            print(f"error: nothing to write to {ns.output}: no combination fits", file=sys.stderr)
        else:
            Path(ns.output).write_text(config_to_pbtxt(combos[best.combo].config))
            if ns.format != "json":
                print(f"wrote {ns.output}")
    if ns.plot:
        write_tune_plot(
            ns.plot, combos, budget, best, f"{ns.model}: throughput vs p99 per configuration"
        )
        if ns.format != "json":
            print(f"wrote {ns.plot}")
    return 0 if best is not None else 1
