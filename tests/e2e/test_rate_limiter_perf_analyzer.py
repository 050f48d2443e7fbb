"""The rate limiter under NVIDIA's perf_analyzer: two models whose one instance each asks for
the whole of resource R (count 1), both loaded by their own perf_analyzer at concurrency 4
at the same time. Each execution records its [start, end] on the machine's monotonic clock
(``span_recording_model``): laid on one time line, no execution of one model overlaps one of
the other, and the two alternate (both were loaded together). perf_analyzer exits 0 and the
server counted every request (statistics: successes = executions = recorded spans, no
failure, nothing left pending). Bounded in count: windows of 40 requests, at most 5 of them
per perf_analyzer."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from tests.e2e.helpers import pending, perf_analyzer, wait_until
from tests.zoo import read_spans, span_recording_model

R1 = 'rate_limiter { resources [ { name: "R" count: 1 } ] }'
BOUNDS = [
    "--concurrency-range",
    "4",
    "--measurement-mode",
    "count_windows",
    "--measurement-request-count",
    "40",
    "--max-trials",
    "5",
    "--stability-percentage",
    "99999",
]


def _stats(srv: Any, model: str) -> dict[str, Any]:
    code, raw = srv.get(f"/v2/models/{model}/stats")
    assert code == 200, raw
    return dict(json.loads(raw)["model_stats"][0])


def test_two_models_sharing_one_r_never_execute_at_once(tmp_path: Path, start_server: Any) -> None:
    pa = perf_analyzer()
    repo = tmp_path / "repo"
    gate = tmp_path / "gate"
    for name in "ab":
        span_recording_model(
            repo, name, tmp_path / f"spans_{name}", sleep_ms=1, gate=gate, instance_extra=R1
        )
    srv = start_server(repo, "--rate-limit=execution_count", "--rate-limit-resource=R:1")
    procs = {
        name: subprocess.Popen(
            [pa, "-m", name, "-i", "http", "-u", srv.http, "--input-data", "zero", *BOUNDS],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in "ab"
    }
    try:
        # every execution waits at the gate until both perf_analyzers have requests in the
        # server: from then on both models are loaded together
        wait_until(
            lambda: pending(srv, "a") > 0 and pending(srv, "b") > 0,
            timeout=60,
            what="both models with requests pending",
        )
        gate.touch()
        outs = {name: p.communicate(timeout=100)[0] for name, p in procs.items()}
    finally:
        gate.touch()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for name, p in procs.items():
        assert p.returncode == 0, outs[name]
    wait_until(lambda: pending(srv, "a") == pending(srv, "b") == 0, what="nothing pending")

    line: list[tuple[int, int, str]] = []
    for name in "ab":
        spans = read_spans(tmp_path / f"spans_{name}")
        stats = _stats(srv, name)
        inf = stats["inference_stats"]
        measured = [int(n) for n in re.findall(r"^    Request count: (\d+)$", outs[name], re.M)]
        assert len(measured) == 1 and measured[0] >= 40, outs[name]
        # every request perf_analyzer sent was counted, executed once, and recorded
        assert inf["fail"]["count"] == 0, stats
        assert inf["success"]["count"] == stats["execution_count"] == len(spans), (
            stats,
            len(spans),
        )
        assert inf["success"]["count"] >= measured[0], (stats, measured)
        line += [(start, end, name) for start, end in spans]

    line.sort()
    for before, after in zip(line, line[1:], strict=False):
        assert after[0] >= before[1], f"executions overlap: {before} and {after}"
    switches = sum(1 for x, y in zip(line, line[1:], strict=False) if x[2] != y[2])
    # both models had work the whole time one of them did (the limiter grants the instance
    # with fewer executions first): their executions alternate, not one model's run after
    # the other's
    assert switches >= 40, switches
