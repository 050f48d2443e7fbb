"""The seed page's perf_analyzer command, run with NVIDIA's own perf_analyzer (from the
tritonclient 2.40.0 wheel; scripts/install-perf-analyzer, part of ``make test``) against
``sluice serve``: over gRPC as the seed writes it, over HTTP, with system shared memory and with
gRPC streaming. Windows are bounded (time windows of 300 ms, at most 5 per level, any spread
counts as stable: -s 99999, so 3 windows do) so that a run takes seconds on a busy machine; what is judged is the exit
status and what the server recorded, not the throughput perf_analyzer measured."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import perf_analyzer
from tests.zoo import copy_example

# the seed: perf_analyzer -m resnet50 -i grpc -u localhost:8001 --concurrency-range 1:32
#           --input-data zero
# here: add_sub (resnet50 on a 2-core CPU would make this a benchmark), levels 1 to 4
SEED = (
    "perf_analyzer -m add_sub -i grpc -u localhost:8001 --concurrency-range 1:4 --input-data zero"
)
BOUNDS = ["--measurement-interval", "300", "--max-trials", "5", "--stability-percentage", "99999"]


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path) -> Any:
    copy_example(module_repo, "add_sub")
    return module_server(
        module_repo,
        "--model-control-mode=explicit",
        "--load-model=add_sub",
        "--strict-readiness=true",
    )


def _stats(srv: Any) -> dict[str, Any]:
    code, raw = srv.get("/v2/models/add_sub/stats")
    assert code == 200, raw
    return dict(json.loads(raw)["model_stats"][0]["inference_stats"])


def _run(srv: Any, seed: str, *extra: str) -> subprocess.CompletedProcess[str]:
    args = seed.split()
    assert args[0] == "perf_analyzer"
    url = args.index("-u") + 1
    proto = args[args.index("-i") + 1] if "-i" in args else "http"
    args[url] = srv.grpc if proto == "grpc" else srv.http
    return subprocess.run(
        [perf_analyzer(), *args[1:], *BOUNDS, *extra],
        capture_output=True,
        text=True,
        timeout=180,
    )


def _check(srv: Any, seed: str, *extra: str) -> str:
    before = _stats(srv)
    r = _run(srv, seed, *extra)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    levels = [int(c) for c in re.findall(r"^Request concurrency: (\d+)$", r.stdout, re.M)]
    assert levels == [1, 2, 3, 4], out
    measured = [int(n) for n in re.findall(r"^    Request count: (\d+)$", r.stdout, re.M)]
    assert len(measured) == 4 and all(n > 0 for n in measured), out
    # perf_analyzer read the server's statistics (its "Server:" block per level)
    assert r.stdout.count("  Server: ") == 4 and "Inference count:" in r.stdout, out
    after = _stats(srv)
    # the server counted at least every request perf_analyzer measured, and none failed
    assert after["fail"]["count"] == before["fail"]["count"], (before, after)
    assert after["success"]["count"] - before["success"]["count"] >= sum(measured), (
        before,
        after,
        measured,
    )
    return out


@pytest.mark.grpc
def test_seed_perf_analyzer_grpc(srv: Any) -> None:
    _check(srv, SEED)


def test_seed_perf_analyzer_http(srv: Any) -> None:
    _check(srv, SEED.replace("-i grpc -u localhost:8001", "-i http -u localhost:8000"))


@pytest.mark.parametrize("proto", [pytest.param("grpc", marks=pytest.mark.grpc), "http"])
def test_seed_perf_analyzer_system_shared_memory(srv: Any, proto: str) -> None:
    port = 8001 if proto == "grpc" else 8000
    seed = SEED.replace("-i grpc -u localhost:8001", f"-i {proto} -u localhost:{port}")
    _check(srv, seed, "--shared-memory", "system")
    # perf_analyzer unregisters its regions at the end: nothing is left registered
    code, raw = srv.get("/v2/systemsharedmemory/status")
    assert code == 200 and json.loads(raw) == [], raw


@pytest.mark.grpc
def test_seed_perf_analyzer_grpc_streaming(srv: Any) -> None:
    _check(srv, SEED, "--streaming")
