"""Triton's rate limiter on the real server (``--rate-limit=execution_count``): two python
models whose one instance each asks for resource R=1. Each execution writes a mark and then
waits for its model's gate file, so what ran, and when, is what the models recorded; what
waits is what the server reports (the pending gauge, sluice's limiter gauges). Checked
against Triton 2.51 on this machine: with R:1 the second model's request stays pending until
the first finishes; a load asking for more than the flag gives fails with the text below."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient

from tests.e2e.helpers import error_text, index_entries, pending, post, wait_until
from tests.zoo import marking_gated_model

R1 = 'rate_limiter { resources [ { name: "R" count: 1 } ] }'


def _limited(repo: Path, name: str, base: Path, resources: str = R1) -> None:
    model = marking_gated_model(repo, name, base / f"gate_{name}", base / f"marks_{name}")
    cfg = model / "config.pbtxt"
    text = cfg.read_text()
    old = "instance_group [ { count: 1, kind: KIND_CPU } ]"
    assert old in text
    cfg.write_text(
        text.replace(old, f"instance_group [ {{ count: 1, kind: KIND_CPU {resources} }} ]")
    )


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("a", "b"):
        _limited(repo, name, tmp_path)
    _limited(repo, "c", tmp_path, 'rate_limiter { resources [ { name: "R" count: 2 } ] }')
    return repo


def _metrics(srv: Any) -> dict[str, float]:
    code, body = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("sluice_rate_limiter_"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _in_use(srv: Any) -> float:
    return _metrics(srv)['sluice_rate_limiter_resource_in_use{device="0",resource="R"}']


def _waiting(srv: Any, model: str) -> float:
    return _metrics(srv).get(
        f'sluice_rate_limiter_waiting_instances{{model="{model}",version="1"}}', 0.0
    )


def _marks(base: Path, name: str) -> int:
    return len(list((base / f"marks_{name}").iterdir()))


def _inp() -> list[httpclient.InferInput]:
    i = httpclient.InferInput("INPUT0", [1, 1], "FP32")
    i.set_data_from_numpy(np.ones((1, 1), np.float32))
    return [i]


class _Sender:
    """Requests sent from threads, one client each (tritonclient.http's async_infer runs on
    gevent greenlets, which do not send while the test waits on server state)."""

    def __init__(self, srv: Any) -> None:
        self.srv = srv
        self.pool = ThreadPoolExecutor(4)

    def send(self, model: str) -> Future[list[list[float]]]:
        def call() -> list[list[float]]:
            c = httpclient.InferenceServerClient(self.srv.http, network_timeout=60)
            try:
                return c.infer(model, _inp()).as_numpy("OUTPUT0").tolist()
            finally:
                c.close()

        return self.pool.submit(call)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def _finish(base: Path, sender: _Sender) -> None:
    """Open every gate (also when the test failed half way), then wait for the answers."""
    for name in "abc":
        (base / f"gate_{name}").touch()
    sender.close()


def _start(start_server: Any, tmp_path: Path, count: int) -> Any:
    return start_server(
        _repo(tmp_path),
        "--model-control-mode=explicit",
        "--load-model=a",
        "--load-model=b",
        "--rate-limit=execution_count",
        f"--rate-limit-resource=R:{count}",
    )


def test_one_r_runs_one_model_at_a_time(tmp_path: Path, start_server: Any) -> None:
    srv = _start(start_server, tmp_path, 1)
    client = httpclient.InferenceServerClient(srv.http)
    sender = _Sender(srv)
    try:
        assert _metrics(srv) == {
            'sluice_rate_limiter_resource_count{device="0",resource="R"}': 1.0,
            'sluice_rate_limiter_resource_in_use{device="0",resource="R"}': 0.0,
            'sluice_rate_limiter_waiting_instances{model="a",version="1"}': 0.0,
            'sluice_rate_limiter_waiting_instances{model="b",version="1"}': 0.0,
        }
        held_a = sender.send("a")
        wait_until(lambda: _marks(tmp_path, "a") == 1, what="a executing")
        assert _in_use(srv) == 1
        held_b = sender.send("b")
        # b's request is in the server, its instance waits for R: queued, not executing
        wait_until(lambda: _waiting(srv, "b") == 1, what="b waiting for R")
        assert pending(srv, "b") == 1 and _marks(tmp_path, "b") == 0
        (tmp_path / "gate_a").touch()
        assert held_a.result() == [[1.0]]
        # a gave R back: b executes (its gate still shut), holding R
        wait_until(lambda: _marks(tmp_path, "b") == 1, what="b executing")
        assert _waiting(srv, "b") == 0 and _in_use(srv) == 1
        (tmp_path / "gate_b").touch()
        assert held_b.result() == [[1.0]]
        assert _in_use(srv) == 0
        # Triton's statistics have no limiter fields; b's wait is in its queue time
        stats = client.get_inference_statistics("b")["model_stats"][0]
        assert stats["execution_count"] == 1 and stats["inference_stats"]["queue"]["count"] == 1

        # a model asking for more R than the flag gives fails to load, in Triton's words
        code, body = post(srv, "/v2/repository/models/c/load")
        text = (
            "load failed for model 'c': version 1 is at UNAVAILABLE state: Invalid argument: "
            'Resource count for "R" is limited to 1 which will prevent scheduling of one or more '
            "model instances, the minimum required count is 2"
        )
        assert (code, error_text(body)) == (400, text)
        (entry,) = index_entries(srv, "c")
        assert entry["state"] == "UNAVAILABLE" and entry["reason"] == text
        # and leaves the others as they were
        assert _metrics(srv)['sluice_rate_limiter_resource_count{device="0",resource="R"}'] == 1
        assert srv.get("/v2/models/a/ready")[0] == 200
    finally:
        _finish(tmp_path, sender)
        client.close()


def test_two_r_run_both_models_at_once(tmp_path: Path, start_server: Any) -> None:
    srv = _start(start_server, tmp_path, 2)
    sender = _Sender(srv)
    try:
        held = [sender.send(name) for name in ("a", "b")]
        # both inside execute at the same time, their gates shut
        wait_until(
            lambda: _marks(tmp_path, "a") == _marks(tmp_path, "b") == 1, what="both executing"
        )
        assert _in_use(srv) == 2
        # without a flag for it, R would be what c asks for; with R:2 it loads
        assert post(srv, "/v2/repository/models/c/load")[0] == 200
        (tmp_path / "gate_a").touch()
        (tmp_path / "gate_b").touch()
        for h in held:
            assert h.result() == [[1.0]]
    finally:
        _finish(tmp_path, sender)


def test_off_by_default_ignores_resources(tmp_path: Path, start_server: Any) -> None:
    # R:1 given, c asks for 2: ignored (not even checked), as in Triton
    srv = start_server(_repo(tmp_path), "--rate-limit-resource=R:1")
    sender = _Sender(srv)
    try:
        held = [sender.send(name) for name in ("a", "b", "c")]
        wait_until(lambda: [_marks(tmp_path, n) for n in "abc"] == [1, 1, 1], what="all executing")
        assert _metrics(srv) == {}  # no limiter, no limiter gauges
        for name in "abc":
            (tmp_path / f"gate_{name}").touch()
        for h in held:
            h.result()
    finally:
        _finish(tmp_path, sender)
