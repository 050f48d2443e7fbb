"""Latency-target batching (``parameters { key: "latency_target_us" ... }``) against the real
server: the window the batcher uses is the gauge ``sluice_batch_window_us``, moved by what the
server measured, and batches grow under concurrent tritonclient load (statistics'
``batch_stats``). Nothing here asserts a time: a model that sleeps 30 ms is over a 10 ms
target on any machine, and one that sleeps 2 ms leaves a 200 ms target its headroom."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests import zoo
from tests.e2e.helpers import http_client, post

GROW_TARGET_US = 200_000  # aim 160 ms; the first growth step is 160 / 32 = 5 ms


def _target(us: int | str) -> str:
    return f'parameters {{ key: "latency_target_us" value {{ string_value: "{us}" }} }}'


@pytest.fixture(scope="module")
def server(module_server: Any, module_repo: Path) -> Any:
    zoo.sleep_model(
        module_repo,
        "slo_grow",
        ms=2,
        max_batch_size=32,
        extra="dynamic_batching { }\n" + _target(GROW_TARGET_US),
    )
    zoo.sleep_model(
        module_repo,
        "slo_shrink",
        ms=30,
        extra="dynamic_batching { max_queue_delay_microseconds: 4000 }\n" + _target(10_000),
    )
    zoo.sleep_model(
        module_repo, "fixed", ms=2, extra="dynamic_batching { max_queue_delay_microseconds: 100 }"
    )
    zoo.sleep_model(
        module_repo, "bad_target", ms=2, extra="dynamic_batching { }\n" + _target("20ms")
    )
    return module_server(
        module_repo,
        "--model-control-mode=explicit",
        "--load-model=slo_grow",
        "--load-model=slo_shrink",
        "--load-model=fixed",
    )


def _windows(srv: Any) -> dict[str, float]:
    """``sluice_batch_window_us`` by model, as the metrics endpoint shows it now."""
    code, body = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200, body[:200]
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("sluice_batch_window_us{"):
            labels, value = line.rsplit(" ", 1)
            model = labels.split('model="', 1)[1].split('"', 1)[0]
            assert 'version="1"' in labels, line
            out[model] = float(value)
    return out


def _infer(client: Any, model: str, value: float) -> list[list[float]]:
    inp = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    inp.set_data_from_numpy(np.full((1, 1), value, np.float32))
    out = client.infer(model, [inp]).as_numpy("OUTPUT0")
    assert out is not None
    return out.tolist()


def test_the_gauge_shows_the_window_of_models_with_a_target_only(server: Any) -> None:
    code, body = server.get("/metrics", port=server.metrics_port)
    text = body.decode()
    assert "# TYPE sluice_batch_window_us gauge" in text
    windows = _windows(server)
    assert "fixed" not in windows  # no target: Triton's window, no sample
    # the window each starts from (no request yet): the config's max_queue_delay, 0 unset
    assert windows == {"slo_grow": 0.0, "slo_shrink": 4000.0}


def test_compute_beyond_the_target_takes_the_window_to_zero(server: Any) -> None:
    assert _windows(server)["slo_shrink"] == 4000.0
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        # each waits its 4 ms window, then computes 30 ms: two over the 10 ms target end the
        # controller's epoch (p99 of 100 allows one)
        assert _infer(client, "slo_shrink", 1) == [[1.0]]
        assert _windows(server)["slo_shrink"] == 4000.0
        assert _infer(client, "slo_shrink", 2) == [[2.0]]
        assert _windows(server)["slo_shrink"] == 0.0  # steered before the answer was sent
        assert _infer(client, "slo_shrink", 3) == [[3.0]]
        assert _windows(server)["slo_shrink"] == 0.0
    finally:
        client.close()


def test_concurrent_load_grows_the_window_and_the_batches(server: Any) -> None:
    clients, per_client = 8, 60

    def one_client(k: int) -> list[float]:
        client = grpcclient.InferenceServerClient(server.grpc)
        try:
            return [_infer(client, "slo_grow", k * 1000 + i)[0][0] for i in range(per_client)]
        finally:
            client.close()

    assert _windows(server)["slo_grow"] == 0.0
    with ThreadPoolExecutor(clients) as pool:
        got = list(pool.map(one_client, range(clients)))
    # each client got its own rows back, in its order
    assert got == [[float(k * 1000 + i) for i in range(per_client)] for k in range(clients)]
    window = _windows(server)["slo_grow"]
    # the requests arrived while others were queued or executing, far under the target:
    # the window grew from 0, within the budget (aim 160 ms - an execution of >= 2 ms)
    assert 0.0 < window <= 0.8 * GROW_TARGET_US - 2000
    http = http_client(server)
    try:
        stats = http.get_inference_statistics("slo_grow")["model_stats"][0]
    finally:
        http.close()
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    assert sum(size * n for size, n in sizes.items()) == clients * per_client
    assert int(stats["inference_count"]) == clients * per_client
    assert int(stats["execution_count"]) < clients * per_client
    assert max(sizes) > 1, sizes


def test_a_target_that_is_not_a_positive_integer_refuses_the_load(server: Any) -> None:
    code, raw = post(server, "/v2/repository/models/bad_target/load")
    assert code == 400, raw
    error = json.loads(raw)["error"]
    assert error.endswith(
        "parameter 'latency_target_us' must be a positive integer number of microseconds "
        "(the p99 target), got '20ms'"
    ), error
    assert "bad_target" in error and "config.pbtxt" in error
    # the models loaded serve on
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        assert _infer(client, "fixed", 5) == [[5.0]]
    finally:
        client.close()
