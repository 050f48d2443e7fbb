"""``sluice tune`` against a live ``sluice serve``, on a model whose cost is known.

The model sleeps T = 50 ms per execution whatever the batch size (max_batch_size B = 8, dynamic
batching on). The grid is instance count {1, 4} x max_queue_delay {0, 200 ms}, swept at
concurrency 4 and 32, with a p99 budget of 150 ms (3T). What the physics of that model decides,
whatever the machine's load (noise only ever adds latency and removes throughput):

* One instance at concurrency 32 serves at most B per T = 160 infer/s, so by Little's law a
  request takes on average at least 32 / 160 per s = 200 ms = 4T: over budget, always.
* A 200 ms delay at concurrency 4 can never fill a batch of 8, so every batch waits the full
  delay: p99 >= 200 ms + T: over budget, always (and the batches hold all 4 requests).
* Four instances at concurrency 32 keep up to 4 batches of 8 in flight: about 4B/T = 640
  infer/s at ~T (measured ~480-600 infer/s, p99 65-105 ms on 2 busy cores). Even at half that
  throughput and twice that p99 they stay the best point within budget, 2x above anything at
  concurrency 4 (at most 4/T = 80 infer/s) and anything with one instance.

So whenever a 4-instance point at concurrency 32 fits the budget (by Little's law it then
serves at least 32 / 150 ms = 213 infer/s, above anything at concurrency 4), the pick is one of
them; a machine busy enough to push their p99 over the budget leaves the pick elsewhere, so the
test checks the pick is the one the reported figures imply (the highest throughput within the
budget) and the 4-instance rule when it applies. Which delay wins there is not decided by the
model: the delay keeps batches whole (measured ~600 vs ~480 infer/s for delay 0,
whose batches fragment as clients come back one by one) but that margin is well under 2x, so
the test does not bet on it; it checks that the delay was applied (full batches of 8 at
concurrency 32, whole batches of 4 waiting 200 ms at concurrency 4) from the server's own
statistics, as the tuner reports them.

Each test uses its own copy of the model so they do not depend on one another's outcome.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tests.conftest import refused_address
from tests.e2e.helpers import request
from tests.zoo import sleep_model

pytestmark = pytest.mark.timeout(240)

T_MS = 50
B = 8
BUDGET_MS = 150
DELAY_US = 200_000
# any spread between windows counts as stable (a 1000x band): a stalled window on a busy
# machine must not drop a level; the figures are judged, not how steady the machine was
FAST = ["-p", "500", "-s", "100000", "-r", "6", "--input-data", "zero", "--quiet"]


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):  # type: ignore[no-untyped-def]
    for name in ("cost", "cost_apply", "cost_none"):
        sleep_model(
            module_repo, name, ms=T_MS, count=1, max_batch_size=B, extra="dynamic_batching { }"
        )
    sleep_model(module_repo, "nobatch", ms=1, count=1, max_batch_size=0)
    return module_server(
        module_repo,
        "--model-control-mode=explicit",
        *(f"--load-model={m}" for m in ("cost", "cost_apply", "cost_none", "nobatch")),
    )


def tune(srv: Any, *args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice", "tune", "-u", srv.http, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def server_config(srv: Any, name: str) -> dict[str, Any]:
    code, raw = request(srv, "GET", f"/v2/models/{name}/config")
    assert code == 200, raw
    return dict(json.loads(raw))


def knobs(cfg: dict[str, Any]) -> tuple[list[int], int]:
    counts = [int(g["count"]) for g in cfg["instance_group"]]
    return counts, int(cfg["dynamic_batching"].get("max_queue_delay_microseconds", 0))


def test_tune_picks_four_instances_at_high_concurrency_and_restores(srv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    before = server_config(srv, "cost")
    assert knobs(before) == ([1], 0)
    out, png = tmp_path / "tuned.pbtxt", tmp_path / "tune.png"
    r = tune(
        srv,
        "-m",
        "cost",
        "--latency-budget-ms",
        str(BUDGET_MS),
        "--instance-count",
        "1,4",
        "--max-queue-delay-us",
        f"0,{DELAY_US}",
        "--concurrency-range",
        "4:32:28",
        *FAST,
        "--format",
        "json",
        "-o",
        str(out),
        "--plot",
        str(png),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    combos = doc["combinations"]
    assert [(c["instance_count"], c["max_queue_delay_us"]) for c in combos] == [
        ("1", "0"),
        ("1", str(DELAY_US)),
        ("4", "0"),
        ("4", str(DELAY_US)),
    ]
    assert all(c["error"] is None for c in combos), combos
    assert all([lv["concurrency"] for lv in c["levels"]] == [4, 32] for c in combos)
    level = {
        (c["instance_count"], c["max_queue_delay_us"], lv["concurrency"]): lv
        for c in combos
        for lv in c["levels"]
    }

    best = doc["best"]
    assert best is not None, r.stderr
    assert best["p99_ms"] <= BUDGET_MS and best["fits"]
    # the pick is the highest throughput within the budget (the earlier point on a tie)
    fitting = [lv for c in combos for lv in c["levels"] if lv["fits"]]
    assert all(lv["p99_ms"] <= BUDGET_MS for lv in fitting), fitting
    top = max(lv["throughput"] for lv in fitting)
    assert best["throughput"] == top, (best, fitting)
    if any(level[("4", d, 32)]["fits"] for d in ("0", str(DELAY_US))):
        assert (best["instance_count"], best["concurrency"]) == ("4", 32), best

    for delay in ("0", str(DELAY_US)):
        one = level[("1", delay, 32)]
        assert one["throughput"] <= 1.15 * B * 1000 / T_MS, one
        assert not one["fits"] and one["p99_ms"] > BUDGET_MS, one
    for count in ("1", "4"):
        waited = level[(count, str(DELAY_US), 4)]
        assert waited["p99_ms"] >= DELAY_US / 1000, waited
        assert not waited["fits"]
        assert waited["avg_batch"] >= 3.0, waited  # the 4 requests waited together
        assert level[(count, str(DELAY_US), 32)]["avg_batch"] >= 7.5  # full batches
        assert "queue_us" in level[(count, "0", 32)]  # the server's side was diffed

    # the original configuration is back, the pick is in the file, the plot was drawn
    assert doc["afterwards"] == "restored"
    assert knobs(server_config(srv, "cost")) == ([1], 0)
    written = text_format.Parse(out.read_text(), mc.ModelConfig())
    assert written.name == "cost"
    assert [g.count for g in written.instance_group] == [4]
    assert written.dynamic_batching.max_queue_delay_microseconds == int(best["max_queue_delay_us"])
    from PIL import Image

    from sluice.perf.plot import PLOT_SIZE_PX

    with Image.open(png) as im:
        assert im.size == PLOT_SIZE_PX


def test_apply_leaves_the_pick_loaded(srv) -> None:  # type: ignore[no-untyped-def]
    r = tune(
        srv,
        "-m",
        "cost_apply",
        "--latency-budget-ms",
        "1000",
        "--instance-count",
        "2",
        "--concurrency-range",
        "1:1",
        *FAST,
        "--apply",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == [
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
    assert lines[1].split()[:2] == ["*", "2"] and lines[1].split()[-1] == "yes"
    assert any(ln.startswith("Best within p99 <= 1000 ms: instance_count 2") for ln in lines)
    assert "'cost_apply' now runs the pick (--apply)." in lines
    assert knobs(server_config(srv, "cost_apply")) == ([2], 0)


def test_nothing_fits_exit_1_table_printed_and_restored(srv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # every execution sleeps 50 ms: no p99 can be within 5 ms
    out = tmp_path / "never.pbtxt"
    r = tune(
        srv,
        "-m",
        "cost_none",
        "--latency-budget-ms",
        "5",
        "--max-queue-delay-us",
        "1000",
        "--concurrency-range",
        "1:1",
        *FAST,
        "-o",
        str(out),
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines()[0].split()[0] == "INSTANCES"
    row = r.stdout.splitlines()[1].split()
    assert row[:3] == ["1", "1000", "8"] and row[-1] == "no"
    assert "No combination kept p99 within 5 ms." in r.stdout
    assert "'cost_none' runs its original configuration again." in r.stdout
    assert "nothing to write" in r.stderr and not out.exists()
    assert knobs(server_config(srv, "cost_none")) == ([1], 0)


def test_errors_and_exit_codes(srv) -> None:  # type: ignore[no-untyped-def]
    base = ["--latency-budget-ms", "10", "--concurrency-range", "1:1", *FAST]
    r = tune(srv, "-m", "no_such_model", *base)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "no_such_model" in r.stderr
    r = tune(srv, "-m", "nobatch", "--max-queue-delay-us", "100", *base)
    assert r.returncode == 2 and "max_batch_size 0" in r.stderr
    r = tune(srv, "-m", "cost", "--preferred-batch-size", "4,16", *base)
    assert r.returncode == 2 and "above 'cost' max_batch_size 8" in r.stderr
    r = tune(srv, "-m", "cost", "--latency-budget-ms", "10", "--concurrency-range", "4:1")
    assert r.returncode == 2
    assert tune(srv, "-m", "cost", "--instance-count", "0", *base).returncode == 2
    with refused_address() as url:
        r = subprocess.run(
            [sys.executable, "-m", "sluice", "tune", "-m", "cost", "-u", url, *base],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 3 and r.stderr.startswith(f"error: cannot connect to {url}")
    # nothing above changed the model
    assert knobs(server_config(srv, "cost")) == ([1], 0)
