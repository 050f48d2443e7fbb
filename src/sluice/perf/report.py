"""What ``sluice perf`` prints and writes: perf_analyzer's console blocks and CSV, then the knee
and the latency-budget level.

Rules of this file:
- Same words, units (usec) and column names as perf_analyzer, so scripts that parse its output
  parse ours; anything sluice adds comes after perf_analyzer's lines (or in ``--verbose-csv``).
- CSV rows are sorted by throughput, as perf_analyzer sorts them.
- The LLM mode (``--service-kind openai``) keeps perf_analyzer's blocks (a request is one
  inference) and adds its own after them: requests/s, output tokens and tokens/s, time to
  first token (p50/p90/p99), inter-token latency (p50/p99) and request latency, in usec
  like the rest; its CSV columns come after perf_analyzer's.

Usage::

    print(level_block(result, opts, "http"))
    write_csv("out.csv", results, opts)
    print(summary(results, opts, knee_threshold=0.05, budget_ms=None))
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass

from .knee import best_within_budget, find_knee
from .llm_workload import LlmOptions
from .runner import LevelResult, MeasureOptions
from .stats import WindowStats, percentile_of

__all__ = [
    "CSV_COLUMNS",
    "level_block",
    "settings_block",
    "summary",
    "write_csv",
    "Analysis",
    "analyse",
]

CSV_COLUMNS = [
    "Concurrency",
    "Inferences/Second",
    "Client Send",
    "Network+Server Send/Recv",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "Client Recv",
    "p50 latency",
    "p90 latency",
    "p95 latency",
    "p99 latency",
]
VERBOSE_COLUMNS = [
    "Avg latency",
    "request/response",
    "response wait",
    "Request count",
    "Errors",
    "Delayed requests",
    "Generator CPU %",
]
LLM_COLUMNS = [
    "Output Token Throughput",
    "Output Tokens",
    "Time To First Token p50",
    "Time To First Token p90",
    "Time To First Token p99",
    "Inter Token Latency p50",
    "Inter Token Latency p99",
]


def _us(ns: float) -> int:
    return int(round(ns / 1000.0))


def _level_name(o: MeasureOptions) -> str:
    return "Concurrency" if o.mode == "concurrency" else "Request Rate"


def _level_value(level: float, o: MeasureOptions) -> str:
    return str(int(level)) if o.mode == "concurrency" else f"{level:g}"


def settings_block(
    o: MeasureOptions, protocol: str, sync: bool, llm: LlmOptions | None = None
) -> str:
    lines = [
        "*** Measurement Settings ***",
        f"  Batch size: {o.batch_size}",
        "  Service Kind: " + ("Triton" if llm is None else "OPENAI"),
    ]
    if llm is not None:
        lines.append(f"  Endpoint: {llm.endpoint.label}")
        lines.append(f"  Streaming: {'yes' if llm.streaming else 'no'}")
    if o.measurement_mode == "count_windows":
        lines.append('  Using "count_windows" mode for stabilization')
        lines.append(f"  Minimum number of samples in each window: {o.request_count}")
    else:
        lines.append('  Using "time_windows" mode for stabilization')
        lines.append(f"  Measurement window: {o.interval_ms} msec")
    lines.append(f"  Latency limit: {o.latency_threshold_ms:g} msec")
    if o.mode == "concurrency":
        lines.append(
            f"  Concurrency limit: {int(o.end if o.end > 0 else o.start)} concurrent requests"
        )
        lines.append(f"  Using {'synchronous' if sync else 'asynchronous'} calls for inference")
    else:
        lines.append(
            f"  Request Rate limit: {o.end if o.end > 0 else o.start:g} requests per seconds"
        )
        lines.append(f"  Using {o.distribution} distribution on request generation")
    if o.percentile is not None:
        lines.append(f"  Stabilizing using p{o.percentile:g} latency")
    else:
        lines.append("  Stabilizing using average latency")
    lines.append(f"  Protocol: {protocol}")
    return "\n".join(lines)


def _server_parts(s: WindowStats) -> tuple[int, int, int, int, int, int]:
    """Per-request averages (usec): request, overhead, queue, compute input/infer/output."""
    sv = s.server
    if sv is None or not sv.success_count:
        return (0, 0, 0, 0, 0, 0)
    n = sv.success_count
    return (
        _us(sv.request_ns / n),
        _us(sv.overhead_ns / n),
        _us(sv.queue_ns / n),
        _us(sv.compute_input_ns / n),
        _us(sv.compute_infer_ns / n),
        _us(sv.compute_output_ns / n),
    )


def _llm_lines(s: WindowStats) -> list[str]:
    n = s.tokens.size
    per = (
        f"{s.output_tokens / n:.6g} per request, min {int(s.tokens.min())}, "
        f"max {int(s.tokens.max())}"
        if n
        else "no request completed"
    )
    lines = [
        "  LLM: ",
        f"    Request throughput: {s.request_rate:.6g} requests/sec",
        f"    Output tokens: {s.output_tokens} in {n} requests ({per})",
        f"    Output token throughput: {s.token_throughput:.6g} tokens/sec",
    ]
    if s.ttft_ns.size:
        t = [_us(percentile_of(s.ttft_ns, p)) for p in (50, 90, 99)]
        lines.append(f"    Time to first token: p50 {t[0]} usec, p90 {t[1]} usec, p99 {t[2]} usec")
    else:
        lines.append("    Time to first token: not measured (no answer was streamed)")
    if s.itl_ns.size:
        i = [_us(percentile_of(s.itl_ns, p)) for p in (50, 99)]
        lines.append(f"    Inter-token latency: p50 {i[0]} usec, p99 {i[1]} usec")
    else:
        lines.append("    Inter-token latency: not measured (no streamed answer of 2 tokens)")
    lat = [_us(s.percentile_ns(p)) for p in (50, 90, 99)]
    lines.append(
        f"    Request latency: avg {_us(s.avg_latency_ns)} usec, p50 {lat[0]} usec, "
        f"p90 {lat[1]} usec, p99 {lat[2]} usec"
    )
    return lines


def level_block(r: LevelResult, o: MeasureOptions, protocol: str, llm: bool = False) -> str:
    s = r.stats
    pct = s.percentiles_ns()
    lines = []
    if o.mode == "concurrency":
        lines.append(f"Request concurrency: {int(r.level)}")
    else:
        lines.append(f"Request Rate: {r.level:g} inference requests per seconds")
    lines += [
        "  Client: ",
        f"    Request count: {s.count}",
        f"    Throughput: {s.throughput:.6g} infer/sec",
    ]
    if o.mode == "rate":
        lines.append(f"    Avg client overhead: {r.gen_cpu_pct:.2f}%")
    lines.append(
        f"    Avg latency: {_us(s.avg_latency_ns)} usec (standard deviation {_us(s.std_latency_ns)} usec)"
    )
    for p, v in pct.items():
        lines.append(f"    p{p} latency: {_us(v)} usec")
    avg, send, recv = _us(s.avg_latency_ns), _us(s.send_ns), _us(s.recv_ns)
    if protocol == "grpc":
        lines.append(
            f"    Avg gRPC time: {avg} usec ((un)marshal request/response {send + recv} usec + "
            f"response wait {max(0, avg - send - recv)} usec)"
        )
    else:
        lines.append(
            f"    Avg HTTP time: {avg} usec (send/recv {send + recv} usec + response wait "
            f"{max(0, avg - send - recv)} usec)"
        )
    if s.server is not None:
        req, ovh, q, ci, cinf, co = _server_parts(s)
        lines += [
            "  Server: ",
            f"    Inference count: {s.server.inference_count}",
            f"    Execution count: {s.server.execution_count}",
            f"    Successful request count: {s.server.success_count}",
            f"    Avg request latency: {req} usec (overhead {ovh} usec + queue {q} usec + "
            f"compute input {ci} usec + compute infer {cinf} usec + compute output {co} usec)",
        ]
    if s.errors:
        lines.append(f"  Failed requests: {s.errors}")
    if llm:
        lines += _llm_lines(s)
    if o.mode == "rate" and s.late:
        lines.append(
            "[WARNING] Perf Analyzer was not able to keep up with the desired request rate. "
            f"{r.delayed_pct:.2f}% of the requests were delayed. "
        )
    lines.append(
        f"  Load generator: {r.workers} process(es), {r.gen_cpu_pct:.1f}% CPU of one core "
        f"(busiest {r.gen_busiest_pct:.1f}%), {r.trials} window(s)"
        + ("" if r.stable else ", NOT STABLE")
    )
    lines.append(
        f"  Requests sent: {r.issued} (the whole level: warm-up, windows and the requests in "
        "flight at their edges)"
    )
    if r.gen_busiest_pct > 75.0:
        lines.append(
            "  [WARNING] a load-generator process was over 75% busy: the generator may limit "
            "these figures (raise --workers)"
        )
    return "\n".join(lines)


def _csv_row(r: LevelResult, o: MeasureOptions, verbose: bool, llm: bool) -> list[str]:
    s = r.stats
    avg, send, recv = _us(s.avg_latency_ns), _us(s.send_ns), _us(s.recv_ns)
    _, _, q, ci, cinf, co = _server_parts(s)
    network = max(0, avg - send - recv - q - ci - cinf - co)
    pct = s.percentiles_ns()
    row = [
        _level_value(r.level, o),
        f"{s.throughput:.6g}",
        str(send),
        str(network),
        str(q),
        str(ci),
        str(cinf),
        str(co),
        str(recv),
        *(str(_us(pct[p])) for p in (50, 90, 95, 99)),
    ]
    if verbose:
        row += [
            str(avg),
            str(send + recv),
            str(max(0, avg - send - recv)),
            str(s.count),
            str(s.errors),
            str(s.late),
            f"{r.gen_cpu_pct:.1f}",
        ]
    if llm:
        row += [
            f"{s.token_throughput:.6g}",
            str(s.output_tokens),
            *(str(_us(percentile_of(s.ttft_ns, p))) for p in (50, 90, 99)),
            *(str(_us(percentile_of(s.itl_ns, p))) for p in (50, 99)),
        ]
    return row


def write_csv(
    path: str,
    results: Sequence[LevelResult],
    o: MeasureOptions,
    verbose: bool = False,
    llm: bool = False,
) -> None:
    header = [_level_name(o), *CSV_COLUMNS[1:]] + (VERBOSE_COLUMNS if verbose else [])
    header += LLM_COLUMNS if llm else []
    rows = sorted((r for r in results if r.stable), key=lambda r: r.stats.throughput)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        for r in rows:
            w.writerow(_csv_row(r, o, verbose, llm))


@dataclass
class Analysis:
    ordered: list[LevelResult]
    knee: int | None
    budget: int | None


def analyse(
    results: Sequence[LevelResult], knee_threshold: float, budget_ms: float | None
) -> Analysis:
    """Knee and budget level over the stable levels, in level order."""
    by_level: dict[float, LevelResult] = {}
    for r in results:
        if r.stable:
            by_level[r.level] = r  # a level measured twice (binary search) keeps the last
    ordered = [by_level[k] for k in sorted(by_level)]
    thr = [r.stats.throughput for r in ordered]
    p99 = [r.stats.percentile_ns(99) / 1e6 for r in ordered]
    knee = find_knee([r.level for r in ordered], thr, p99, knee_threshold) if ordered else None
    budget = best_within_budget(thr, p99, budget_ms) if budget_ms is not None and ordered else None
    return Analysis(ordered, knee, budget)


def _describe(r: LevelResult, o: MeasureOptions) -> str:
    what = "concurrency" if o.mode == "concurrency" else "request rate"
    return (
        f"{what} {_level_value(r.level, o)} ({r.stats.throughput:.6g} infer/sec, "
        f"p50 {r.stats.percentile_ns(50) / 1e6:.2f} ms, p99 {r.stats.percentile_ns(99) / 1e6:.2f} ms)"
    )


def summary(
    results: Sequence[LevelResult],
    o: MeasureOptions,
    a: Analysis,
    knee_threshold: float,
    budget_ms: float | None,
    llm: bool = False,
) -> str:
    lat_word = f"p{o.percentile:g} latency" if o.percentile is not None else "latency"
    lines = [
        "Inferences/Second vs. Client "
        + ("p" + f"{o.percentile:g}" if o.percentile is not None else "Average")
        + " Batch Latency"
    ]
    for r in results:
        if not r.stable:
            continue
        lat = (
            r.stats.percentile_ns(o.percentile)
            if o.percentile is not None
            else r.stats.avg_latency_ns
        )
        if o.mode == "concurrency":
            lines.append(
                f"Concurrency: {int(r.level)}, throughput: {r.stats.throughput:.6g} infer/sec, "
                f"{lat_word} {_us(lat)} usec"
            )
        else:
            lines.append(
                f"Request Rate: {r.level:g}, throughput: {r.stats.throughput:.6g} infer/sec, "
                f"{lat_word} {_us(lat)} usec"
            )
    if llm:
        lines += [
            "",
            "LLM: requests/sec, output tokens/sec, time to first token, inter-token latency",
        ]
        for r in results:
            if not r.stable:
                continue
            s = r.stats
            what = "Concurrency" if o.mode == "concurrency" else "Request Rate"
            line = (
                f"{what}: {_level_value(r.level, o)}, {s.request_rate:.6g} requests/sec, "
                f"{s.token_throughput:.6g} output tokens/sec"
            )
            for name, values in (("TTFT", s.ttft_ns), ("ITL", s.itl_ns)):
                if values.size:
                    line += (
                        f", {name} p50 {_us(percentile_of(values, 50))} usec "
                        f"p99 {_us(percentile_of(values, 99))} usec"
                    )
            lines.append(line)
    lines += ["", f"Requests sent in all: {sum(r.issued for r in results)}", ""]
    pct = knee_threshold * 100
    if len(a.ordered) < 2:
        lines.append("Knee: needs at least two levels")
    elif a.knee is None:
        lines.append(
            f"Knee: not reached (throughput still grew by {pct:g}% or more per step, or p99 did "
            "not rise); extend the range"
        )
    else:
        lines.append(
            f"Knee: {_describe(a.ordered[a.knee], o)}; beyond it throughput grows less than "
            f"{pct:g}% per step while p99 rises"
        )
    if budget_ms is not None:
        if a.budget is None:
            lines.append(f"Latency budget {budget_ms:g} ms: no level kept p99 within it")
        else:
            lines.append(
                f"Latency budget {budget_ms:g} ms: best is {_describe(a.ordered[a.budget], o)}"
            )
    return "\n".join(lines)
