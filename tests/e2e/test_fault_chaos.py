"""A short chaos run: HTTP and gRPC clients while workers are SIGKILLed and models reloaded.

The same core as ``bench/chaos.py`` (which runs it for a minute and prints the figures),
here for ~10 s against the suite's server fixture. Every request is answered exactly once,
with its own value (the request id is the input) or an error naming a worker this run
killed; the statistics count exactly what the clients saw; every reload succeeds or fails
naming a killed worker; and once the run settles the server holds no more processes, shared
memory or file descriptors than at the baseline. The fixture's teardown then checks exit 0
after SIGTERM, no traceback, no worker or segment left behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bench.chaos import SERVER_FLAGS, Target, print_report, run, write_models

pytestmark = pytest.mark.grpc


def test_a_short_chaos_run_keeps_every_invariant(tmp_path: Path, start_server: Any) -> None:
    repo = write_models(tmp_path / "repo")
    srv = start_server(repo, *SERVER_FLAGS)
    rep = run(
        Target(srv.proc.pid, srv.http, srv.grpc, repo),
        duration=10.0,
        max_requests=4000,
        http_threads=2,
        grpc_threads=2,
        kill_every=0.4,
        reload_every=1.5,
        seed=3,
    )
    print_report(rep)
    assert rep.violations == []
    assert rep.kills >= 1 and sum(rep.reloads.values()) >= 1, (rep.kills, rep.reloads)
    assert rep.requests == sum(rep.outcomes.values()) > 0
    assert set(rep.outcomes) <= {"http ok", "http killed", "grpc ok", "grpc killed"}
    for name, row in rep.per_model.items():
        assert (row["stats success"], row["stats fail"]) == (
            row["client ok"],
            row["client failed"],
        ), name
    assert rep.before is not None and rep.after is not None
    assert rep.after.children == rep.before.children
