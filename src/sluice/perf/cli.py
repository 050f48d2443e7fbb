"""``sluice perf``: perf_analyzer's flags, parsed into the options of the runner, the workload
and the report. No measurement logic lives here.

Usage::

    sluice perf -m add_sub -u 127.0.0.1:8000 --concurrency-range 1:32:2 -p 2000 -f out.csv \\
        --latency-budget-ms 20 --plot sweep.png
    sluice perf -m llm --service-kind openai --endpoint v1/chat/completions --streaming \\
        --synthetic-input-tokens-mean 200 --output-tokens-mean 128 --concurrency-range 1:8:2
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .knee import DEFAULT_KNEE_THRESHOLD
from .llm_workload import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_PROMPT_WORDS,
    Endpoint,
    LlmOptions,
    build_bodies,
    encode_requests,
    fetch_llm_model,
)
from .runner import LevelResult, MeasureOptions, Runner, sweep
from .stats import WindowStats
from .workload import InputOptions, PerfError, Target, build_inputs, encode_payloads, fetch_model

__all__ = [
    "add_perf_flags",
    "add_measurement_flags",
    "measure_options",
    "llm_options",
    "parse_range",
    "run_perf",
    "main",
]


def parse_range(text: str) -> tuple[float, float, float | None]:
    parts = text.split(":")
    if not 1 <= len(parts) <= 3:
        raise argparse.ArgumentTypeError(f"expected start[:end[:step]], got '{text}'")
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers in start[:end[:step]], got '{text}'"
        ) from None
    start = nums[0]
    end = nums[1] if len(nums) > 1 else start
    step = nums[2] if len(nums) > 2 else None
    return start, end, step


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition(":")
    try:
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(f"--shape expects NAME:d1,d2,... got '{text}'")
    return name, shape


def add_perf_flags(p: argparse.ArgumentParser) -> None:
    """perf_analyzer's spellings (short options included), plus sluice's knee/plot flags."""
    p.add_argument("-m", "--model-name", dest="model", required=True)
    p.add_argument("-x", "--model-version", dest="version", default="")
    p.add_argument(
        "-u", "--url", default=None, help="host:port (default localhost:8000, or :8001 for grpc)"
    )
    p.add_argument("-i", "--protocol", default="http", type=str.lower, choices=["http", "grpc"])
    load = p.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency-range", type=parse_range, default=None, metavar="START:END:STEP"
    )
    load.add_argument(
        "--request-rate-range", type=parse_range, default=None, metavar="START:END:STEP"
    )
    p.add_argument("--request-distribution", choices=["constant", "poisson"], default="constant")
    add_measurement_flags(p)
    p.add_argument("-l", "--latency-threshold", type=float, default=0.0, metavar="MS")
    p.add_argument("--binary-search", action="store_true")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("-a", "--async", dest="use_async", action="store_true")
    mode.add_argument("--sync", dest="use_sync", action="store_true")
    p.add_argument("-f", "--latency-report-file", dest="csv", default=None, metavar="FILE.csv")
    p.add_argument("--verbose-csv", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--max-threads", type=int, default=None, help="accepted for compatibility")
    p.add_argument(
        "--service-kind",
        default="triton",
        choices=["triton", "openai"],
        help="openai: LLM requests to --endpoint (an OpenAI-compatible API or Triton's "
        "generate extension), with time to first token and tokens/s",
    )
    p.add_argument(
        "--endpoint",
        default=None,
        metavar="PATH",
        help="with --service-kind openai: v1/chat/completions, v1/completions, "
        "v2/models/<m>/generate_stream or v2/models/<m>/generate",
    )
    p.add_argument(
        "--streaming",
        action="store_true",
        help='with --service-kind openai: ask for streamed answers ("stream": true)',
    )
    p.add_argument(
        "--synthetic-input-tokens-mean",
        type=int,
        default=None,
        metavar="N",
        help=f"with --service-kind openai: a generated prompt of N words "
        f"(default {DEFAULT_PROMPT_WORDS})",
    )
    p.add_argument(
        "--output-tokens-mean",
        type=int,
        default=None,
        metavar="N",
        help=f"with --service-kind openai: max_tokens of the generated requests "
        f"(default {DEFAULT_MAX_TOKENS})",
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="sent as 'Authorization: Bearer KEY' (default $SLUICE_API_KEY)",
    )
    # sluice's own
    p.add_argument(
        "--knee-threshold",
        type=float,
        default=DEFAULT_KNEE_THRESHOLD * 100,
        metavar="PCT",
        help="knee: throughput grows less than this %% per step (default 5)",
    )
    p.add_argument(
        "--latency-budget-ms",
        type=float,
        default=None,
        metavar="MS",
        help="also report the highest-throughput level whose p99 stays within MS",
    )
    p.add_argument("--plot", action="append", default=[], metavar="FILE.png|.svg|.html")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def add_measurement_flags(p: argparse.ArgumentParser) -> None:
    """What a request carries and how a level is measured: the flags ``sluice tune`` shares."""
    p.add_argument("-b", "--batch-size", type=int, default=1)
    p.add_argument(
        "--input-data",
        action="append",
        default=[],
        help="zero, random (default), a JSON data file or a directory of one file per input",
    )
    p.add_argument("--shape", type=_shape, action="append", default=[], metavar="NAME:D1,D2")
    p.add_argument("--string-length", type=int, default=128)
    p.add_argument("--string-data", default=None)
    p.add_argument("-p", "--measurement-interval", type=int, default=5000, metavar="MS")
    p.add_argument(
        "--measurement-mode", choices=["time_windows", "count_windows"], default="time_windows"
    )
    p.add_argument("--measurement-request-count", type=int, default=50)
    p.add_argument("-s", "--stability-percentage", type=float, default=10.0)
    p.add_argument("-r", "--max-trials", type=int, default=10)
    p.add_argument("--percentile", type=float, default=-1, help="pN latency for stability and -l")
    p.add_argument(
        "--workers", type=int, default=0, help="load-generator processes (default: automatic)"
    )


def measure_options(ns: argparse.Namespace) -> tuple[MeasureOptions, InputOptions]:
    """The runner's and the workload's options from parsed flags (PerfError when invalid)."""
    if ns.request_rate_range is not None:
        mode, (start, end, step) = "rate", ns.request_rate_range
        step = step if step is not None else 1.0
        if start <= 0:
            raise PerfError("--request-rate-range start must be above 0")
    else:
        mode, (start, end, step) = "concurrency", ns.concurrency_range or (1.0, 1.0, None)
        step = step if step is not None else 1.0
        if start < 1 or start != int(start) or end != int(end) or step != int(step):
            raise PerfError("--concurrency-range takes whole numbers and starts at 1 or more")
    if ns.measurement_interval <= 0 or ns.measurement_request_count <= 0 or ns.max_trials <= 0:
        raise PerfError("-p, --measurement-request-count and -r must be positive")
    data = ns.input_data[-1] if ns.input_data else "random"
    mo = MeasureOptions(
        mode=mode,
        start=start,
        end=end,
        step=step,
        distribution=ns.request_distribution,
        measurement_mode=ns.measurement_mode,
        interval_ms=ns.measurement_interval,
        request_count=ns.measurement_request_count,
        stability_pct=ns.stability_percentage,
        max_trials=ns.max_trials,
        percentile=None if ns.percentile is None or ns.percentile < 0 else ns.percentile,
        latency_threshold_ms=ns.latency_threshold,
        binary_search=ns.binary_search,
        batch_size=ns.batch_size,
        workers=ns.workers,
    )
    io = InputOptions(
        batch_size=ns.batch_size,
        data=data,
        shapes=dict(ns.shape),
        string_length=ns.string_length,
        string_data=ns.string_data,
    )
    return mo, io


def llm_options(ns: argparse.Namespace) -> LlmOptions | None:
    """The LLM mode's options (None with --service-kind triton); PerfError for flags that do
    not go together."""
    llm_flags = {
        "--endpoint": ns.endpoint is not None,
        "--streaming": ns.streaming,
        "--synthetic-input-tokens-mean": ns.synthetic_input_tokens_mean is not None,
        "--output-tokens-mean": ns.output_tokens_mean is not None,
    }
    if ns.service_kind != "openai":
        given = [flag for flag, on in llm_flags.items() if on]
        if given:
            raise PerfError(f"{', '.join(given)}: only with --service-kind openai")
        return None
    if ns.protocol != "http":
        raise PerfError("--service-kind openai speaks HTTP: -i must be http")
    if ns.batch_size != 1 or ns.shape or ns.string_data is not None:
        raise PerfError(
            "-b, --shape and --string-data describe tensors: not with --service-kind openai"
        )
    data = ns.input_data[-1] if ns.input_data else None
    if data is not None:
        if data in ("zero", "random") or not data.endswith(".json"):
            raise PerfError(
                "--service-kind openai: --input-data is a JSON file of request bodies "
                '({"data": [{"payload": [{...}]}]}), or leave it out for a generated prompt'
            )
        if ns.synthetic_input_tokens_mean is not None or ns.output_tokens_mean is not None:
            raise PerfError(
                "--synthetic-input-tokens-mean and --output-tokens-mean shape the generated "
                "prompt: with --input-data, write the prompt and max_tokens in its bodies"
            )
    return LlmOptions(
        endpoint=Endpoint.parse(ns.endpoint, ns.model),
        streaming=ns.streaming,
        prompt_words=ns.synthetic_input_tokens_mean or DEFAULT_PROMPT_WORDS,
        max_tokens=ns.output_tokens_mean or DEFAULT_MAX_TOKENS,
        data=data,
    )


class _Progress:
    """A tqdm bar on stderr (only on a terminal); per-level blocks go through tqdm.write so the
    bar never garbles them, and it is closed before the final table."""

    def __init__(self, total: int | None, enabled: bool) -> None:
        self.bar: Any = None
        if enabled:
            from tqdm import tqdm  # the perf extra (checked by run_perf)

            self.bar = tqdm(
                total=total,
                unit="level",
                file=sys.stderr,
                disable=None,
                dynamic_ncols=True,
                leave=False,
            )
        self.level: float | None = None

    def window(self, level: float, trial: int, w: WindowStats | None) -> None:
        if self.bar is None:
            return
        if w is not None:
            self.bar.set_postfix_str(
                f"level {level:g} window {trial}: {w.throughput:.1f} infer/s, "
                f"p99 {w.percentile_ns(99) / 1e6:.2f} ms",
                refresh=True,
            )

    def level_done(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stdout)
            self.bar.update(1)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _ReportingRunner(Runner):
    def __init__(self, *a: Any, on_level: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.on_level = on_level

    def measure(self, level: float) -> LevelResult:
        r = super().measure(level)
        self.on_level(r)
        return r


def run_perf(ns: argparse.Namespace) -> int:
    from . import report, require_extra

    if code := require_extra("sluice perf"):
        return code

    try:
        llm = llm_options(ns)
        if llm is not None:
            ns.input_data = []  # the bodies file is the LLM workload's, not the tensors'
        mo, io = measure_options(ns)
        from .credentials import api_key_option

        target = Target.parse(ns.url, ns.protocol, api_key_option(ns.api_key))
        if llm is None:
            model = fetch_model(target, ns.model, ns.version)
            payloads = encode_payloads(target, model, build_inputs(model, io))
        else:
            model, meta = fetch_llm_model(target, ns.model, llm.endpoint)
            bodies = build_bodies(llm, ns.model, meta)
            payloads = encode_requests(target, llm.endpoint, bodies)
    except PerfError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(report.settings_block(mo, target.protocol, sync=not ns.use_async, llm=llm), flush=True)
    print(flush=True)
    total = None
    if not mo.binary_search and mo.end > 0:
        from .runner import levels_from_range

        total = len(levels_from_range(mo.start, mo.end, mo.step, mo.mode == "concurrency"))
    progress = _Progress(total, enabled=not ns.no_progress)

    def on_level(r: LevelResult) -> None:
        progress.level_done(report.level_block(r, mo, target.protocol, llm=llm is not None) + "\n")

    results: list[LevelResult] = []
    code = 0
    try:
        with _ReportingRunner(
            target,
            model,
            payloads,
            mo,
            progress=progress.window,
            on_level=on_level,
            llm=llm.endpoint.kind if llm is not None else "",
        ) as runner:
            try:
                results = sweep(runner, mo)
            finally:
                warnings = list(runner.warnings)
    except PerfError as e:
        progress.close()
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.close()
        print("interrupted", file=sys.stderr)
        return 130
    progress.close()
    for w in warnings:
        print(f"[WARNING] {w}", file=sys.stderr)
    bad = [r for r in results if not r.stable]
    for r in bad:
        what = "concurrency" if mo.mode == "concurrency" else "request rate"
        print(
            f"Failed to obtain stable measurement within {mo.max_trials} measurement windows for "
            f"{what} {r.level:g}. Please try to increase the --measurement-interval.",
            file=sys.stderr,
        )
        code = 2
    threshold = ns.knee_threshold / 100.0
    analysis = report.analyse(results, threshold, ns.latency_budget_ms)
    print(
        report.summary(results, mo, analysis, threshold, ns.latency_budget_ms, llm=llm is not None),
        flush=True,
    )
    if ns.csv:
        report.write_csv(ns.csv, results, mo, verbose=ns.verbose_csv, llm=llm is not None)
    for path in ns.plot:
        from .plot import write_plot

        title = f"{model.name} over {target.protocol} ({target.address})"
        write_plot(path, analysis, mo, ns.latency_budget_ms, title)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sluice perf", description="perf_analyzer-compatible load tester"
    )
    add_perf_flags(parser)
    return run_perf(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
