"""Schedulers, instance groups, queue policies, statistics and metrics (issue 3) against the
real server."""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import pending, wait_until
from tests.zoo import identity, sleep_model, write_model


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


def _wait_pending(srv, model: str, n: int) -> None:
    wait_until(lambda: pending(srv, model) == n, interval=0.01, what=f"{n} pending on '{model}'")


# A python model that sleeps INPUT0 milliseconds and answers [start, end] of its execute()
# as CLOCK_MONOTONIC nanoseconds (the same clock as the test's time.monotonic_ns()): what the
# server did, and when, recorded by the server side.
# A negative INPUT0 waits instead until the file named by the "gate" parameter exists (the
# test opens it once the server's state says what it waits for); while it waits, the file
# "<gate>.held" exists (an execution has started and holds its instance), and
# "<gate>.held.<pid>" for each worker process (instance) holding one.
STAMP_PY = """
import json
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.gate = params.get("gate", {}).get("string_value", "")

    def execute(self, requests):
        out = []
        for r in requests:
            start = time.monotonic_ns()
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            ms = float(x.reshape(-1)[0])
            if ms < 0:
                open(self.gate + ".held", "a").close()
                open(self.gate + ".held." + str(os.getpid()), "a").close()
            while ms < 0 and not os.path.exists(self.gate):
                time.sleep(0.005)
            time.sleep(max(ms, 0) / 1000.0)
            stamps = np.array([start, time.monotonic_ns()], dtype=np.int64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x),
                                                   pb_utils.Tensor("STAMPS", stamps)]))
        return out
"""


def stamp_model(
    repo: Path,
    name: str,
    count: int = 1,
    max_batch_size: int = 1,
    extra: str = "",
    gate: Path | None = None,
) -> Path:
    """INPUT0 [1] FP32 (ms to sleep; negative: wait for ``gate``) -> OUTPUT0 (the same),
    STAMPS [2] INT64."""
    if gate is not None:
        extra += f'\nparameters {{ key: "gate" value: {{ string_value: "{gate}" }} }}'
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }},
                 {{ name: "STAMPS", data_type: TYPE_INT64, dims: [ 2 ] }} ]
        instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
        {extra}
        """,
        STAMP_PY,
    )


def _stamp_inp(ms: float, batched: bool = True, proto=httpclient):
    shape = [1, 1] if batched else [1]
    i = proto.InferInput("INPUT0", shape, "FP32")
    i.set_data_from_numpy(np.full(shape, ms, np.float32))
    return [i]


def _stamps(result) -> tuple[int, int]:
    start, end = result.as_numpy("STAMPS").reshape(-1).tolist()
    return int(start), int(end)


def _most_at_once(intervals: list[tuple[int, int]]) -> int:
    """The largest number of [start, end) intervals that overlap at one instant."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = most = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


class _Async:
    """Requests sent from threads, one client each (tritonclient.http's async_infer runs on
    gevent greenlets, which do not send while the test waits on server state)."""

    def __init__(self, srv, workers: int = 8) -> None:
        self.srv = srv
        self.pool = ThreadPoolExecutor(workers)

    def async_infer(self, model: str, inputs, **kw) -> Future:
        def call():
            c = httpclient.InferenceServerClient(self.srv.http, network_timeout=60)
            try:
                return c.infer(model, inputs, **kw)
            finally:
                c.close()

        return self.pool.submit(call)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


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
def batch_server(module_repo, module_server):
    repo = module_repo
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
        # an hour's delay: a batch of the preferred size that waited it out would never come
        extra="""dynamic_batching {
        preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 3600000000 }""",
    )
    return module_server(repo)


def test_dynamic_batching_combines_requests(tmp_path: Path, start_server):
    """One request holds the only instance (gated); 16 more queue behind it; when the gate
    opens the dynamic batcher takes them as max_batch_size (8) batches: exactly 1 + 8 + 8."""
    repo = tmp_path / "repo"
    repo.mkdir()
    gate = tmp_path / "gate"
    stamp_model(
        repo,
        "batched8",
        max_batch_size=8,
        extra="dynamic_batching { max_queue_delay_microseconds: 2000 }",
        gate=gate,
    )
    srv = start_server(repo)
    sender = _Async(srv, workers=17)
    first = sender.async_infer("batched8", _stamp_inp(-1))
    wait_until(lambda: Path(f"{gate}.held").exists(), what="the first execution to start")
    queued = [sender.async_infer("batched8", _stamp_inp(-2.0 - i)) for i in range(16)]
    _wait_pending(srv, "batched8", 17)  # 1 executing + 16 queued
    gate.touch()
    values = [float(f.result().as_numpy("OUTPUT0")[0, 0]) for f in [first, *queued]]
    sender.close()
    assert values == [-1.0 - i for i in range(17)], "outputs are split back to their requests"
    st = _stats(srv, "batched8")
    assert (st["inference_count"], st["execution_count"]) == (17, 3), st
    got = sorted((b["batch_size"], b["compute_infer"]["count"]) for b in st["batch_stats"])
    assert got == [(1, 1), (8, 2)], st["batch_stats"]


def test_without_batching_each_request_executes_alone(batch_server):
    _fire(batch_server, "unbatched", 40, 16)
    st = _stats(batch_server, "unbatched")
    assert st["inference_count"] == st["execution_count"] == 40
    assert [b["batch_size"] for b in st["batch_stats"]] == [1]


def test_lone_request_waits_about_the_queue_delay(batch_server):
    c = httpclient.InferenceServerClient(batch_server.http)
    c.infer("delayed", _inp(1))  # warm
    before = _stats(batch_server, "delayed")["inference_stats"]
    c.infer("delayed", _inp(1))
    after = _stats(batch_server, "delayed")["inference_stats"]
    c.close()
    # the server's record: one request, held the 300 ms max_queue_delay for a partner. A lone
    # request's window counts from its arrival in the server (the end of its HTTP body), so
    # its queue time (from the enqueue) is the window less the front-end's part; its success
    # time runs from the arrival and holds the whole window.
    assert after["queue"]["count"] == before["queue"]["count"] + 1
    assert after["success"]["count"] == before["success"]["count"] + 1
    waited = after["success"]["ns"] - before["success"]["ns"]
    assert waited >= 0.3e9, waited


def test_preferred_batch_size_runs_at_once(batch_server):
    # a batch of the preferred size goes at once: neither request sits out the hour's delay
    # (the batch of 2 is below max_batch_size 8, so only the preferred size sends it)
    sender = _Async(batch_server, workers=2)
    calls = [sender.async_infer("preferred", _inp(float(v))) for v in (5, 6)]
    wait_until(
        lambda: _stats(batch_server, "preferred")["execution_count"] == 1,
        what="the batch of the preferred size to execute",
    )
    assert [float(f.result().as_numpy("OUTPUT0")[0, 0]) for f in calls] == [5.0, 6.0]
    sender.close()
    st = _stats(batch_server, "preferred")
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in st["batch_stats"]] == [(2, 1)]
    assert st["inference_stats"]["queue"]["count"] == 2


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
    stamp_model(repo, "one", count=1, max_batch_size=0)
    gate = tmp_path / "gate"
    stamp_model(repo, "four", count=4, max_batch_size=0, gate=gate)
    srv = start_server(repo)

    def executions(model: str, n: int, ms: float) -> list[tuple[int, int]]:
        def one(_: int) -> tuple[int, int]:
            c = httpclient.InferenceServerClient(srv.http)
            try:
                return _stamps(c.infer(model, _stamp_inp(ms, batched=False)))
            finally:
                c.close()

        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(one, range(n)))

    # when each execution ran, as the instances recorded it: never two at once on one
    # instance
    assert _most_at_once(executions("one", 6, 100)) == 1
    # four at once on four: four requests held by the gate until all four are in the server;
    # run one after another, the first would hold the gate shut and none would overlap
    sender = _Async(srv, workers=4)
    held = [sender.async_infer("four", _stamp_inp(-1, batched=False)) for _ in range(4)]
    _wait_pending(srv, "four", 4)
    # pending counts a request from its arrival: wait until each of the four instances holds
    # one (an instance still reading its request when the gate opens would start too late)
    wait_until(lambda: len(list(tmp_path.glob("gate.held.*"))) == 4, what="four executions holding")
    gate.touch()
    assert _most_at_once([_stamps(f.result()) for f in held]) == 4
    sender.close()
    assert _stats(srv, "four")["execution_count"] == 4


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
    # 2 s executions: the request behind one is surely still queued after the 100 ms timeout
    sleep_model(
        repo,
        "timed",
        ms=2000,
        max_batch_size=1,
        extra="""dynamic_batching {
        default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100000
                               allow_timeout_override: true } }""",
    )
    stamp_model(
        repo, "prio", extra="dynamic_batching { priority_levels: 2 default_priority_level: 2 }"
    )
    return repo


@pytest.mark.grpc
def test_queue_policies_and_priorities(tmp_path: Path, start_server):
    srv = start_server(_queue_repo(tmp_path))
    client = httpclient.InferenceServerClient(srv.http)
    sender = _Async(srv)

    # full queue: refused at once with 503 naming the model and the limit
    busy = [sender.async_infer("queued", _inp(i)) for i in range(3)]
    _wait_pending(srv, "queued", 3)  # 1 running + 2 queued
    with pytest.raises(InferenceServerException) as e:
        client.infer("queued", _inp(9))
    assert e.value.status() == "503"
    assert "queued" in e.value.message() and "max_queue_size 2" in e.value.message()
    for f in busy:
        f.result()
    g = grpcclient.InferenceServerClient(srv.grpc)
    busy = [sender.async_infer("queued", _inp(i)) for i in range(3)]
    _wait_pending(srv, "queued", 3)
    with pytest.raises(InferenceServerException) as e:
        g.infer("queued", _inp(9, grpcclient))
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert "max_queue_size 2" in e.value.message()
    for f in busy:
        f.result()
    # the refused requests never reached the model
    assert _stats(srv, "queued")["inference_count"] == 6

    # queue timeout: the second request waits > 100 ms behind a 2 s execution -> rejected
    first = sender.async_infer("timed", _inp(1))
    _wait_pending(srv, "timed", 1)
    with pytest.raises(InferenceServerException) as e:
        client.infer("timed", _inp(2))
    assert e.value.status() == "503" and "timeout" in e.value.message().lower()
    first.result()
    # a per-request timeout may only lower it: 10 s asked, 100 ms applies
    first = sender.async_infer("timed", _inp(1))
    _wait_pending(srv, "timed", 1)
    with pytest.raises(InferenceServerException) as e:
        client.infer("timed", _inp(2), timeout=10_000_000)
    assert e.value.status() == "503" and "timeout" in e.value.message().lower()
    first.result()
    assert _stats(srv, "timed")["inference_count"] == 2

    # priorities: with the instance busy, level-1 requests run before earlier level-2 ones.
    # Each request is in the queue (the pending gauge says so) before the next is sent.
    blocker = sender.async_infer("prio", _stamp_inp(1500))
    _wait_pending(srv, "prio", 1)
    queued = []
    for n, (ms, priority) in enumerate(((11, 2), (12, 2), (13, 1), (14, 1)), start=2):
        queued.append((ms, sender.async_infer("prio", _stamp_inp(ms), priority=priority)))
        _wait_pending(srv, "prio", n)
    blocker_start, _ = _stamps(blocker.result())
    started = {ms: _stamps(f.result())[0] for ms, f in queued}
    order = sorted(started, key=started.__getitem__)
    assert blocker_start < min(started.values())
    assert set(order[:2]) == {13, 14} and set(order[2:]) == {11, 12}, started
    client.close()
    sender.close()
    g.close()


def test_delay_timeout_action_serves_expired_requests_last(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    repo.mkdir()
    gate = tmp_path / "gate"
    stamp_model(
        repo,
        "delayq",
        extra="""dynamic_batching {
        default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 2500000 } }""",
        gate=gate,
    )
    srv = start_server(repo)
    client = _Async(srv)
    # a blocker held by the gate; A queued behind it and left past its 2.5 s timeout; then
    # B queued (B is within its timeout when the gate opens)
    blocker = client.async_infer("delayq", _stamp_inp(-1))
    _wait_pending(srv, "delayq", 1)
    a = client.async_infer("delayq", _stamp_inp(1))
    _wait_pending(srv, "delayq", 2)
    queued = time.monotonic()  # A was in the queue by now: its timeout passes 2.5 s later
    wait_until(lambda: time.monotonic() - queued > 2.6, timeout=10, what="A's timeout")
    b = client.async_infer("delayq", _stamp_inp(2))
    _wait_pending(srv, "delayq", 3)
    gate.touch()
    _, blocker_end = _stamps(blocker.result())
    a_start, _ = _stamps(a.result())
    b_start, _ = _stamps(b.result())
    # DELAY keeps the expired A (no error) but serves it after B, still within its timeout
    assert blocker_end <= b_start < a_start, (blocker_end, a_start, b_start)
    assert _stats(srv, "delayq")["inference_stats"]["fail"]["count"] == 0
    client.close()


@pytest.mark.parametrize("preserve", [True, False])
def test_preserve_ordering_across_instances(tmp_path: Path, start_server, preserve: bool):
    repo = tmp_path / "repo"
    gate = tmp_path / "gate"
    stamp_model(
        repo,
        "varsleep",
        count=2,
        extra=f"dynamic_batching {{ preserve_ordering: {str(preserve).lower()} }}",
        gate=gate,
    )
    srv = start_server(repo)
    client = _Async(srv)
    slow = client.async_infer("varsleep", _stamp_inp(-1))  # held by the gate
    _wait_pending(srv, "varsleep", 1)  # the slow one is in before the fast one
    fast = client.async_infer("varsleep", _stamp_inp(20))
    try:
        # the fast request ran on the other instance and finished while the slow one waits
        wait_until(
            lambda: _stats(srv, "varsleep")["execution_count"] == 1, what="the fast execution"
        )
        if preserve:
            # its answer is held until the slow one is out: still pending, not answered
            assert pending(srv, "varsleep") == 2 and not fast.done()
        else:
            # its answer went out at once, while the slow one still waits
            fast_start, fast_end = _stamps(fast.result(timeout=30))
            assert pending(srv, "varsleep") == 1
    finally:
        gate.touch()
    fast_start, fast_end = _stamps(fast.result())
    fast_answered = time.monotonic_ns()
    slow_start, slow_end = _stamps(slow.result())
    client.close()
    # (their start order is the two workers' wake-up order, a race under load: not judged)
    assert fast_end < slow_end
    if preserve:
        assert fast_answered >= slow_end, (fast_answered, slow_end)


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
    children = srv.snapshot_children()
    client = httpclient.InferenceServerClient(srv.http)
    cfg = client.get_model_config("groups")
    assert [(g["count"], g["kind"]) for g in cfg["instance_group"]] == [
        (2, "KIND_CPU"),
        (1, "KIND_MODEL"),
    ]
    i = httpclient.InferInput("INPUT0", [1], "FP32")
    i.set_data_from_numpy(np.ones(1, np.float32))
    assert client.infer("groups", [i]).as_numpy("OUTPUT0").tolist() == [1.0]
    # one worker process per instance: 2 + 1, all forked by the fork server; and
    # multiprocessing's resource tracker
    workers, fork_server = srv.workers(), srv.fork_server()
    assert fork_server is not None and len(workers) == 3, children
    assert {p.ppid() for p in workers} == {fork_server.pid}, (workers, fork_server)
    trackers = [p for p in children if "resource_tracker" in " ".join(p.cmdline())]
    assert (len(trackers), len(children)) == (1, 5), children

    if os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has a GPU")
    with pytest.raises(InferenceServerException) as e:
        client.load_model("gpu")
    assert e.value.status() == "400" and "KIND_GPU" in e.value.message()
    assert "no GPU" in e.value.message()
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["gpu"]["state"] == "UNAVAILABLE" and "KIND_GPU" in index["gpu"]["reason"]
    client.close()
