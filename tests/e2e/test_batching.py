"""Schedulers, instance groups, queue policies, statistics and metrics (issue 3) against the
real server."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.zoo import identity, sleep_model


def _inp(value: float, proto=httpclient):
    i = proto.InferInput("INPUT0", [1, 1], "FP32")
    i.set_data_from_numpy(np.full((1, 1), value, np.float32))
    return [i]


def _stats(srv, model: str) -> dict:
    c = httpclient.InferenceServerClient(srv.http)
    try:
        return c.get_inference_statistics(model)["model_stats"][0]
    finally:
        c.close()


def _fire(srv, model: str, n: int, concurrency: int) -> list[float]:
    def one(i: int) -> float:
        c = httpclient.InferenceServerClient(srv.http)
        try:
            r = c.infer(model, _inp(float(i)))
            return float(r.as_numpy("OUTPUT0")[0, 0])
        finally:
            c.close()

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(n)))


@pytest.fixture(scope="module")
def batch_server(tmp_path_factory, request):
    from tests.conftest import ServerProcess

    repo = tmp_path_factory.mktemp("batching") / "repo"
    repo.mkdir()
    sleep_model(
        repo, "batched", ms=20, extra="dynamic_batching { max_queue_delay_microseconds: 2000 }"
    )
    sleep_model(repo, "unbatched", ms=5)
    identity(
        repo,
        "delayed",
        dims="[ 1 ]",
        extra="dynamic_batching { max_queue_delay_microseconds: 300000 }",
    )
    identity(
        repo,
        "preferred",
        dims="[ 1 ]",
        extra="""dynamic_batching {
        preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 3000000 }""",
    )
    srv = ServerProcess(repo)
    srv.wait_ready()
    yield srv
    srv.stop()


def test_dynamic_batching_combines_requests(batch_server):
    values = _fire(batch_server, "batched", 160, 16)
    assert values == [float(i) for i in range(160)], "outputs are split back to their requests"
    st = _stats(batch_server, "batched")
    assert st["inference_count"] == 160
    assert st["execution_count"] <= st["inference_count"] / 4, st
    sizes = {b["batch_size"] for b in st["batch_stats"]}
    assert max(sizes) > 1 and max(sizes) <= 8


def test_without_batching_each_request_executes_alone(batch_server):
    _fire(batch_server, "unbatched", 40, 16)
    st = _stats(batch_server, "unbatched")
    assert st["inference_count"] == st["execution_count"] == 40
    assert [b["batch_size"] for b in st["batch_stats"]] == [1]


def test_lone_request_waits_about_the_queue_delay(batch_server):
    c = httpclient.InferenceServerClient(batch_server.http)
    c.infer("delayed", _inp(1))  # warm
    t0 = time.monotonic()
    c.infer("delayed", _inp(1))
    elapsed = time.monotonic() - t0
    c.close()
    assert 0.25 <= elapsed < 0.6, elapsed


def test_preferred_batch_size_runs_at_once(batch_server):
    t0 = time.monotonic()
    _fire(batch_server, "preferred", 2, 2)
    assert time.monotonic() - t0 < 1.5  # far below the 3 s queue delay
    st = _stats(batch_server, "preferred")
    assert [b["batch_size"] for b in st["batch_stats"]] == [2]


def test_batch_dimension_above_one_batches_and_splits_exactly(batch_server):
    def one(i: int) -> np.ndarray:
        c = httpclient.InferenceServerClient(batch_server.http)
        try:
            x = np.arange(3, dtype=np.float32).reshape(3, 1) + 10 * i
            inp = httpclient.InferInput("INPUT0", [3, 1], "FP32")
            inp.set_data_from_numpy(x)
            return c.infer("batched", [inp]).as_numpy("OUTPUT0")
        finally:
            c.close()

    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, range(16)))
    for i, out in enumerate(outs):
        assert out.shape == (3, 1)
        assert out.reshape(-1).tolist() == [10 * i, 10 * i + 1, 10 * i + 2]


def test_metrics_equal_statistics_and_carry_triton_names(batch_server):
    _fire(batch_server, "unbatched", 10, 2)
    st = _stats(batch_server, "unbatched")
    code, body = batch_server.get("/metrics", port=batch_server.metrics_port)
    text = body.decode()
    assert code == 200

    def value(name: str, model: str = "unbatched", extra: str = "") -> float:
        m = re.search(rf'^{name}{{model="{model}"{extra},version="1"}} (\S+)$', text, re.M)
        assert m, f"{name} missing"
        return float(m.group(1))

    assert value("nv_inference_request_success") == st["inference_stats"]["success"]["count"]
    assert value("nv_inference_count") == st["inference_count"]
    assert value("nv_inference_exec_count") == st["execution_count"]
    assert value("nv_inference_queue_duration_us") == st["inference_stats"]["queue"]["ns"] // 1000
    assert value("nv_inference_compute_infer_duration_us") == (
        st["inference_stats"]["compute_infer"]["ns"] // 1000
    )
    assert re.search(
        r'nv_inference_request_failure\{model="unbatched",reason="BACKEND",version="1"\} 0', text
    )
    for name in (
        "nv_inference_request_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_pending_request_count",
        "nv_model_load_duration_secs",
    ):
        value(name)
    for name in ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"):
        assert re.search(rf"^{name} \S+$", text, re.M), name
    assert re.search(
        r'nv_inference_request_duration_histogram_us_bucket\{le="\+Inf",model="unbatched",version="1"\}',
        text,
    )
    assert "# TYPE nv_inference_request_success counter" in text


def test_instance_count_runs_concurrently(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    repo.mkdir()
    sleep_model(repo, "one", ms=50, count=1, max_batch_size=0)
    sleep_model(repo, "four", ms=50, count=4, max_batch_size=0)
    # max_batch_size 0: dims [1] means requests carry shape [1]
    srv = start_server(repo)

    def rate(model: str) -> float:
        def one(_: int) -> None:
            c = httpclient.InferenceServerClient(srv.http)
            try:
                i = httpclient.InferInput("INPUT0", [1], "FP32")
                i.set_data_from_numpy(np.ones(1, np.float32))
                c.infer(model, [i])
            finally:
                c.close()

        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(24)))
        return 24 / (time.monotonic() - t0)

    r1, r4 = rate("one"), rate("four")
    assert r4 > 2.8 * r1, (r1, r4)


def _queue_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    sleep_model(
        repo,
        "queued",
        ms=400,
        max_batch_size=1,
        extra="""dynamic_batching {
        default_queue_policy { max_queue_size: 2 } }""",
    )
    sleep_model(
        repo,
        "timed",
        ms=400,
        max_batch_size=1,
        extra="""dynamic_batching {
        default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100000
                               allow_timeout_override: true } }""",
    )
    sleep_model(
        repo,
        "prio",
        ms=150,
        max_batch_size=1,
        extra="""dynamic_batching {
        priority_levels: 2 default_priority_level: 2 }""",
    )
    return repo


def test_queue_policies_and_priorities(tmp_path: Path, start_server):
    srv = start_server(_queue_repo(tmp_path))
    client = httpclient.InferenceServerClient(srv.http, concurrency=8)

    # full queue: refused at once with 503 naming the model and the limit
    busy = [client.async_infer("queued", _inp(i)) for i in range(3)]  # 1 running + 2 queued
    time.sleep(0.15)
    t0 = time.monotonic()
    with pytest.raises(InferenceServerException) as e:
        client.infer("queued", _inp(9))
    assert time.monotonic() - t0 < 0.2
    assert e.value.status() == "503"
    assert "queued" in e.value.message() and "max_queue_size 2" in e.value.message()
    for f in busy:
        f.get_result()
    g = grpcclient.InferenceServerClient(srv.grpc)
    busy = [client.async_infer("queued", _inp(i)) for i in range(3)]
    time.sleep(0.15)
    with pytest.raises(InferenceServerException) as e:
        g.infer("queued", _inp(9, grpcclient))
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    for f in busy:
        f.get_result()

    # queue timeout: the second request waits > 100 ms behind a 400 ms execution -> rejected
    first = client.async_infer("timed", _inp(1))
    time.sleep(0.05)
    with pytest.raises(InferenceServerException) as e:
        client.infer("timed", _inp(2))
    assert e.value.status() == "503" and "timeout" in e.value.message().lower()
    first.get_result()
    # a per-request timeout may only lower it: 10 s asked, 100 ms applies
    first = client.async_infer("timed", _inp(1))
    time.sleep(0.05)
    with pytest.raises(InferenceServerException):
        client.infer("timed", _inp(2), timeout=10_000_000)
    first.get_result()

    # priorities: with the instance busy, level-1 requests run before earlier level-2 ones
    order: list[float] = []
    lock = threading.Lock()

    def run(value: float, priority: int) -> None:
        c = httpclient.InferenceServerClient(srv.http)
        try:
            c.infer("prio", _inp(value), priority=priority)
            with lock:
                order.append(value)
        finally:
            c.close()

    blocker = threading.Thread(target=run, args=(0.0, 0))
    blocker.start()
    time.sleep(0.05)
    threads = []
    for v, p in ((1.0, 2), (2.0, 2), (3.0, 1), (4.0, 1)):
        t = threading.Thread(target=run, args=(v, p))
        t.start()
        threads.append(t)
        time.sleep(0.02)
    for t in [blocker, *threads]:
        t.join(10)
    assert order[0] == 0.0
    assert set(order[1:3]) == {3.0, 4.0}, order
    client.close()
    g.close()


def test_delay_timeout_action_serves_expired_requests_last(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    repo.mkdir()
    sleep_model(
        repo,
        "delayq",
        ms=600,
        max_batch_size=1,
        extra="""dynamic_batching {
        default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 400000 } }""",
    )
    srv = start_server(repo)
    order: list[float] = []
    lock = threading.Lock()

    def run(value: float) -> None:
        c = httpclient.InferenceServerClient(srv.http, network_timeout=30)
        try:
            c.infer("delayq", _inp(value))
            with lock:
                order.append(value)
        finally:
            c.close()

    threads = []
    t0 = time.monotonic()
    for value, at in ((0.0, 0.0), (1.0, 0.05), (2.0, 0.40)):
        time.sleep(max(0.0, at - (time.monotonic() - t0)))
        t = threading.Thread(target=run, args=(value,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(15)
    # 1.0 waited past its 400 ms timeout behind the blocker: DELAY keeps it (no error) but
    # serves it after 2.0, which was still within its timeout when the instance freed up.
    assert order == [0.0, 2.0, 1.0], order


VARSLEEP_PY = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            time.sleep(float(x.reshape(-1)[0]) / 1000.0)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


@pytest.mark.parametrize("preserve", [True, False])
def test_preserve_ordering_across_instances(tmp_path: Path, start_server, preserve: bool):
    from tests.zoo import write_model

    repo = tmp_path / "repo"
    write_model(
        repo,
        "varsleep",
        f"""
        name: "varsleep"
        backend: "python"
        max_batch_size: 1
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        instance_group [ {{ count: 2, kind: KIND_CPU }} ]
        dynamic_batching {{ preserve_ordering: {str(preserve).lower()} }}
        """,
        VARSLEEP_PY,
    )
    srv = start_server(repo)
    done: dict[float, float] = {}  # sleep ms -> seconds from the first request to its answer
    t0 = time.monotonic()

    def run(ms: float) -> None:
        c = httpclient.InferenceServerClient(srv.http)
        try:
            c.infer("varsleep", _inp(ms))
            done[ms] = time.monotonic() - t0
        finally:
            c.close()

    slow = threading.Thread(target=run, args=(600.0,))
    slow.start()
    time.sleep(0.1)
    fast = threading.Thread(target=run, args=(20.0,))
    fast.start()
    slow.join(10)
    fast.join(10)
    # timings, not the order the two client threads record in: with preserve_ordering the
    # server sends the held answer right after the slow one, and either thread may wake first
    if preserve:  # the fast answer is held until the slow one is out
        assert done[20.0] >= 0.55, done
    else:  # it goes out as soon as it is ready, long before the slow one
        assert done[20.0] < done[600.0] - 0.2, done


def test_instance_kinds_and_several_groups(tmp_path: Path, start_server):
    """KIND_AUTO and KIND_MODEL run on the CPU; several groups add up; KIND_GPU on a machine
    without a GPU fails the load with a reason that says so (visible in the index too)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    sleep_model(repo, "groups", ms=1, max_batch_size=0).joinpath("config.pbtxt").write_text(
        (repo / "groups" / "config.pbtxt")
        .read_text()
        .replace(
            "instance_group [ { count: 1, kind: KIND_CPU } ]",
            "instance_group [ { count: 2, kind: KIND_AUTO }, { count: 1, kind: KIND_MODEL } ]",
        )
    )
    sleep_model(repo, "gpu", ms=1, max_batch_size=0).joinpath("config.pbtxt").write_text(
        (repo / "gpu" / "config.pbtxt").read_text().replace("KIND_CPU", "KIND_GPU")
    )
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=groups")
    before = len(srv.snapshot_children())
    client = httpclient.InferenceServerClient(srv.http)
    cfg = client.get_model_config("groups")
    assert [(g["count"], g["kind"]) for g in cfg["instance_group"]] == [
        (2, "KIND_CPU"),
        (1, "KIND_MODEL"),
    ]
    i = httpclient.InferInput("INPUT0", [1], "FP32")
    i.set_data_from_numpy(np.ones(1, np.float32))
    assert client.infer("groups", [i]).as_numpy("OUTPUT0").tolist() == [1.0]
    assert before >= 3  # three worker processes (plus multiprocessing's resource tracker)
    import os

    if os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has a GPU")
    with pytest.raises(InferenceServerException) as e:
        client.load_model("gpu")
    assert e.value.status() == "400" and "KIND_GPU" in e.value.message()
    assert "no GPU" in e.value.message()
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["gpu"]["state"] == "UNAVAILABLE" and "KIND_GPU" in index["gpu"]["reason"]
    client.close()
