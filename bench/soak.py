"""Soak: mixed HTTP and gRPC load on a real ``sluice serve`` while models are reloaded, workers
are killed and bad requests are mixed in; then SIGTERM must drain and exit 0 (issue 14, part 7).

    python bench/soak.py                       # 10 minutes
    python bench/soak.py --duration 40 --json soak.json

What it checks (exit status 1 and ``"ok": false`` when any fails):
- every failed request failed because its worker was killed (the error names a worker pid this
  script SIGKILLed), or was a deliberately bad request answered 4xx / a client-error code;
  nothing else fails;
- the server's RSS, open file descriptors, its /dev/shm segments and its worker processes
  stay flat (first sample after warm-up vs the end, with a stated tolerance);
- SIGTERM with requests in flight: every accepted request is answered 200, the server
  exits 0, and no worker process or shared-memory segment is left behind.
The report counts requests sent, answered, failed by cause, reloads, kills and the samples.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repo"

IDENTITY_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t)]))
        return out
"""

SLEEP_PY = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.5)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
            )
            for r in requests
        ]
"""


def _identity_config(name: str, generation: int, count: int = 2) -> dict[str, Any]:
    """The JSON config (a load override) of ``soak_id``; ``generation`` makes each differ."""
    return {
        "name": name,
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "instance_group": [{"count": count, "kind": "KIND_CPU"}],
        "parameters": {"generation": {"string_value": str(generation)}},
    }


def _pbtxt(name: str, body: str) -> str:
    return f'name: "{name}"\nbackend: "python"\n{body}'


def make_repo(base: Path) -> Path:
    repo = base / "repo"
    repo.mkdir()
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    for name, py, body in (
        (
            "soak_id",
            IDENTITY_PY,
            "max_batch_size: 8\n"
            'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
            'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
            "instance_group [ { count: 2, kind: KIND_CPU } ]\n",
        ),
        (
            "soak_sleep",
            SLEEP_PY,
            "max_batch_size: 16\n"
            'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
            "dynamic_batching { max_queue_delay_microseconds: 100000 }\n",
        ),
    ):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(_pbtxt(name, body))
        (repo / name / "1" / "model.py").write_text(py)
    return repo


# --------------------------------------------------------------------------- bad requests
_BAD_HTTP: list[tuple[str, bytes, dict[str, str]]] = [
    ("/v2/models/add_sub/infer", b"[" * 100_000, {}),
    ("/v2/models/add_sub/infer", b'{"inputs":[{"name":"INPUT0","datatype":"FP32"}]}', {}),
    (
        "/v2/models/add_sub/infer",
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],'
        b'"parameters":{"binary_data_size":16}}]}',
        {"Inference-Header-Content-Length": "999"},
    ),
    ("/v2/models/soak_id/infer", b'{"inputs":[{"name":"INPUT0","datatype":"FP32",', {}),
    ("/v2/models/no_such_model/infer", b'{"inputs":[]}', {}),
    ("/v2/models/add_sub/infer", b"\x1f\x8bnot gzip", {"Content-Encoding": "gzip"}),
]


def _bad_grpc_payloads() -> list[tuple[str, bytes]]:
    pb = grpcclient.service_pb2
    msg = pb.ModelInferRequest(model_name="add_sub")
    t = msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    msg.raw_input_contents.append(b"\x00" * 3)  # 3 bytes for 16
    del t
    good = msg.SerializeToString()
    return [
        ("ModelInfer", good),
        ("ModelInfer", good[:-2]),  # truncated
        ("ModelInfer", b"\xff\xff\xff\xff"),
        ("ModelInfer", pb.ModelInferRequest(model_name="nope").SerializeToString()),
    ]


# --------------------------------------------------------------------------- the run
class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.unexpected: list[str] = []
        self.killed: set[int] = set()

    def add(self, key: str, detail: str | None = None) -> None:
        with self.lock:
            self.counts[key] += 1
            if detail is not None and len(self.unexpected) < 50:
                self.unexpected.append(detail)

    def failure(self, proto: str, message: str) -> None:
        """A good request failed: from a killed worker, or unexpected."""
        m = re.search(r"worker process (\d+) was killed by signal SIGKILL", message)
        with self.lock:
            killed = m is not None and int(m.group(1)) in self.killed
        if killed:
            self.add(f"{proto} failed: worker killed")
        else:
            self.add(f"{proto} failed: unexpected", f"{proto}: {message[:300]}")


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="sluice-soak-"))
        self.repo = make_repo(self.tmp)
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        self.tally = Tally()
        self.stop = threading.Event()
        self.samples: list[dict[str, Any]] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.tmp / "server.log"

    # --- server -------------------------------------------------------------------
    def start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "sluice",
            "serve",
            f"--model-repository={self.repo}",
            f"--http-port={self.http}",
            f"--grpc-port={self.grpc}",
            f"--metrics-port={self.metrics}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
            "--model-control-mode=explicit",
            "--load-model=*",
            "--log-warning=false",
            "--log-error=false",
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=5
                ) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server not ready after 120 s")

    def workers(self) -> list[psutil.Process]:
        assert self.proc is not None
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for c in children:
            try:
                # a worker (forked by the fork server, or spawned), not the fork server
                if "spawn_main" in " ".join(c.cmdline()) and c.name() != "sluice-forksrv":
                    out.append(c)
            except psutil.Error:
                pass
        return out

    def shm_segments(self) -> list[str]:
        assert self.proc is not None
        prefix = f"sl{self.proc.pid}_"
        try:
            return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
        except FileNotFoundError:
            return []

    def sample(self) -> dict[str, Any]:
        assert self.proc is not None
        p = psutil.Process(self.proc.pid)
        workers = self.workers()
        rss_workers = 0
        for w in workers:
            try:
                rss_workers += w.memory_info().rss
            except psutil.Error:
                pass
        s = {
            "t": round(time.monotonic() - self.t0, 1),
            "rss_mib": round(p.memory_info().rss / 2**20, 1),
            "workers_rss_mib": round(rss_workers / 2**20, 1),
            "fds": p.num_fds(),
            "shm": len(self.shm_segments()),
            "workers": len(workers),
            "threads": p.num_threads(),
        }
        self.samples.append(s)
        return s

    # --- load ---------------------------------------------------------------------
    def http_load(self, seed: int) -> None:
        rnd = random.Random(seed)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{self.http}", network_timeout=120)
        a = np.ones((1, 4), np.float32)
        while not self.stop.is_set():
            try:
                if rnd.random() < 0.5:
                    ins = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
                    for i in ins:
                        i.set_data_from_numpy(a)
                    r = client.infer("add_sub", ins)
                    ok = np.array_equal(r.as_numpy("OUTPUT0"), a + a)
                else:
                    i = httpclient.InferInput("INPUT0", [1, 3], "FP32")
                    i.set_data_from_numpy(a[:, :3], binary_data=rnd.random() < 0.5)
                    r = client.infer("soak_id", [i])
                    ok = np.array_equal(r.as_numpy("OUTPUT0"), a[:, :3])
                self.tally.add("http ok" if ok else "http wrong answer")
            except InferenceServerException as exc:
                self.tally.failure("http", str(exc))
            except Exception as exc:  # noqa: BLE001 - a dropped connection is a finding
                self.tally.add("http failed: unexpected", f"http: {exc!r}")
                client = httpclient.InferenceServerClient(
                    f"127.0.0.1:{self.http}", network_timeout=120
                )
            self.tally.add("http sent")
        client.close()

    def grpc_load(self, seed: int) -> None:
        rnd = random.Random(seed)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{self.grpc}")
        a = np.full((1, 4), 2.0, np.float32)
        while not self.stop.is_set():
            try:
                if rnd.random() < 0.5:
                    ins = [grpcclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
                    for i in ins:
                        i.set_data_from_numpy(a)
                    r = client.infer("add_sub", ins, client_timeout=120)
                    ok = np.array_equal(r.as_numpy("OUTPUT1"), a - a)
                else:
                    i = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
                    i.set_data_from_numpy(a[:, :2])
                    r = client.infer("soak_id", [i], client_timeout=120)
                    ok = np.array_equal(r.as_numpy("OUTPUT0"), a[:, :2])
                self.tally.add("grpc ok" if ok else "grpc wrong answer")
            except InferenceServerException as exc:
                self.tally.failure("grpc", str(exc))
            self.tally.add("grpc sent")
        client.close()

    def bad_load(self) -> None:
        """Deliberately bad requests, both protocols: each must be a 4xx / client-error code
        naming the problem, and the connection must survive."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http, timeout=60)
        payloads = _bad_grpc_payloads()
        ok_codes = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}
        rnd = random.Random(3)
        with grpc.insecure_channel(f"127.0.0.1:{self.grpc}") as channel:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            while not self.stop.wait(self.args.bad_interval):
                path, body, headers = rnd.choice(_BAD_HTTP)
                try:
                    conn.request("POST", path, body=body, headers=headers)
                    resp = conn.getresponse()
                    text = resp.read()
                    if 400 <= resp.status < 500 and b'"error"' in text:
                        self.tally.add("bad http answered 4xx")
                    else:
                        self.tally.add(
                            "bad http: not a 4xx", f"bad http {resp.status} {text[:200]!r}"
                        )
                except (OSError, http.client.HTTPException) as exc:
                    self.tally.add("bad http: connection lost", f"bad http: {exc!r}")
                    conn = http.client.HTTPConnection("127.0.0.1", self.http, timeout=60)
                _, payload = rnd.choice(payloads)
                try:
                    infer(payload, timeout=60)
                    self.tally.add("bad grpc: answered OK", "bad grpc answered OK")
                except grpc.RpcError as exc:
                    code = exc.code()  # type: ignore[attr-defined]
                    if code in ok_codes:
                        self.tally.add("bad grpc answered INVALID_ARGUMENT/NOT_FOUND")
                    else:
                        self.tally.add("bad grpc: wrong code", f"bad grpc {code}: {exc}")
        conn.close()

    # --- chaos: reloads and kills, one at a time --------------------------------------
    def chaos(self) -> None:
        rnd = random.Random(7)
        generation = 0
        next_reload = time.monotonic() + self.args.reload_every
        next_kill = time.monotonic() + self.args.kill_every
        while not self.stop.wait(0.05):
            now = time.monotonic()
            if now >= next_reload:
                generation += 1
                body = json.dumps(
                    {"parameters": {"config": json.dumps(_identity_config("soak_id", generation))}}
                ).encode()
                req = urllib.request.Request(
                    f"http://127.0.0.1:{self.http}/v2/repository/models/soak_id/load",
                    data=body,
                    method="POST",
                )
                try:
                    with urllib.request.urlopen(req, timeout=120) as r:
                        self.tally.add("reloads" if r.status == 200 else "reload failed")
                except OSError as exc:
                    self.tally.add("reload failed", f"reload: {exc!r}")
                next_reload = time.monotonic() + self.args.reload_every
            elif now >= next_kill:
                victims = [w for w in self.workers() if w.is_running()]
                if victims:
                    victim = rnd.choice(victims)
                    with self.tally.lock:
                        self.tally.killed.add(victim.pid)
                    try:
                        victim.send_signal(signal.SIGKILL)
                        self.tally.add("workers killed")
                    except psutil.Error:
                        pass
                next_kill = time.monotonic() + self.args.kill_every

    # --- end: SIGTERM with requests in flight -------------------------------------------
    def pending(self, model: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=10) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("nv_inference_pending_request_count") and f'model="{model}"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def drain(self) -> dict[str, Any]:
        assert self.proc is not None
        n = self.args.drain_requests
        results: list[int] = []
        lock = threading.Lock()

        def one() -> None:
            body = json.dumps(
                {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}
            ).encode()
            conn = http.client.HTTPConnection("127.0.0.1", self.http, timeout=120)
            try:
                conn.request("POST", "/v2/models/soak_sleep/infer", body=body)
                status = conn.getresponse().status
            except (OSError, http.client.HTTPException):
                status = -1
            with lock:
                results.append(status)

        threads = [threading.Thread(target=one) for _ in range(n)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while self.pending("soak_sleep") < n and time.monotonic() < deadline:
            time.sleep(0.02)  # polling the server's own count of accepted requests
        accepted = self.pending("soak_sleep")
        children = psutil.Process(self.proc.pid).children(recursive=True)
        segments = self.shm_segments()
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(120)
        for t in threads:
            t.join(120)
        _, alive = psutil.wait_procs(children, timeout=10)
        left_shm = [s for s in segments if os.path.exists(f"/dev/shm/{s}")] + self.shm_segments()
        for p in alive:  # never leave them, even when the check fails
            p.kill()
        return {
            "in_flight_at_sigterm": accepted,
            "answered_200": results.count(200),
            "other_answers": sorted(s for s in results if s != 200),
            "exit_code": rc,
            "processes_left": [p.pid for p in alive],
            "shm_left": sorted(set(left_shm)),
        }

    # --- all of it ----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.start()
        self.t0 = time.monotonic()
        initial = self.sample()  # before any load or chaos: the processes and segments to keep
        threads = [
            threading.Thread(target=self.http_load, args=(i,)) for i in range(self.args.http)
        ]
        threads += [
            threading.Thread(target=self.grpc_load, args=(100 + i,)) for i in range(self.args.grpc)
        ]
        threads += [threading.Thread(target=self.bad_load), threading.Thread(target=self.chaos)]
        for t in threads:
            t.start()
        end = self.t0 + self.args.duration
        warm = self.t0 + min(10.0, self.args.duration / 5)
        baseline: dict[str, Any] | None = None
        while time.monotonic() < end:
            time.sleep(min(self.args.sample_every, max(0.0, end - time.monotonic())))
            s = self.sample()
            if baseline is None and time.monotonic() >= warm:
                baseline = s
        self.stop.set()
        for t in threads:
            t.join(180)
        # quiesce: a worker killed in the last seconds is back before the last sample
        expected_workers = initial["workers"]
        deadline = time.monotonic() + 30
        while len(self.workers()) != expected_workers and time.monotonic() < deadline:
            time.sleep(0.1)
        last = self.sample()
        drain = self.drain()
        return self.report(initial, baseline or last, last, drain)

    def report(
        self,
        initial: dict[str, Any],
        first: dict[str, Any],
        last: dict[str, Any],
        drain: dict[str, Any],
    ) -> dict[str, Any]:
        c = self.tally.counts
        checks = {
            "only killed-worker failures": c["http failed: unexpected"] == 0
            and c["grpc failed: unexpected"] == 0
            and c["http wrong answer"] == 0
            and c["grpc wrong answer"] == 0,
            "bad requests all 4xx": c["bad http: not a 4xx"] == 0
            and c["bad http: connection lost"] == 0
            and c["bad grpc: wrong code"] == 0
            and c["bad grpc: answered OK"] == 0,
            "reloads all succeeded": c["reload failed"] == 0,
            "rss flat": last["rss_mib"] - first["rss_mib"] <= self.args.rss_tolerance_mib,
            "fds flat": last["fds"] - first["fds"] <= 16,
            # an input and an output arena per lane of an instance (two lanes: a request is
            # handed to a busy worker), whatever was killed or reloaded
            "shm flat": last["shm"] <= 4 * initial["workers"],
            "processes flat": last["workers"] == initial["workers"],
            "drain: all accepted answered": drain["answered_200"] == self.args.drain_requests
            and drain["in_flight_at_sigterm"] >= self.args.drain_requests,
            "drain: exit 0": drain["exit_code"] == 0,
            "drain: nothing left": not drain["processes_left"] and not drain["shm_left"],
        }
        out = {
            "duration_s": self.args.duration,
            "counts": dict(sorted(c.items())),
            "unexpected": self.tally.unexpected[:20],
            "initial": initial,
            "first": first,
            "last": last,
            "max_rss_mib": max(s["rss_mib"] for s in self.samples),
            "drain": drain,
            "checks": checks,
            "ok": all(checks.values()),
        }
        if out["ok"]:
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            out["server_log"] = str(self.log)
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    p.add_argument("--http", type=int, default=3, help="HTTP client threads")
    p.add_argument("--grpc", type=int, default=3, help="gRPC client threads")
    p.add_argument("--reload-every", type=float, default=4.0, help="seconds between reloads")
    p.add_argument("--kill-every", type=float, default=6.0, help="seconds between worker kills")
    p.add_argument("--bad-interval", type=float, default=0.02, help="seconds between bad requests")
    p.add_argument("--sample-every", type=float, default=2.0)
    p.add_argument("--rss-tolerance-mib", type=float, default=48.0)
    p.add_argument("--drain-requests", type=int, default=8)
    p.add_argument("--json", default="", help="also write the report here")
    args = p.parse_args(argv)
    soak = Soak(args)
    try:
        out = soak.run()
    finally:
        if soak.proc is not None and soak.proc.poll() is None:
            os.killpg(soak.proc.pid, signal.SIGKILL)
            soak.proc.wait(10)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
