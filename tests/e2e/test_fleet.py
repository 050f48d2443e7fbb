"""A fleet on this machine: three sluice replicas behind nginx (deploy/nginx/, HTTP through
proxy_pass and gRPC through grpc_pass) under continuous client load over both protocols.

- a replica given SIGTERM loses no request (readiness off, drain, nginx moves on);
- a replica killed outright fails at most the requests in flight at that moment;
- a replica brought back (same ports) rejoins: its own statistics count new work;
- a repository change (a new version) rolled out replica by replica with `sluice model load`
  keeps serving throughout, and afterwards every answer comes from the new version.

Judged from what the client saw (every failure is kept with its text) and from each
replica's own statistics; nothing waits on wall-clock time but the bounded waits for state.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ROOT, ServerProcess, free_port, server_launcher
from tests.e2e.helpers import index_entries, request, wait_until

pytestmark = [
    pytest.mark.skipif(
        shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(),
        reason="nginx is not installed (scripts/install-system-deps)",
    ),
    # not marked grpc: the fleet runs on the default (native) edge; on grpc.aio one call in
    # ~1,000 was seen CANCELLED at a replica's SIGTERM when the machine was loaded (not
    # reproduced alone), so the aio edge is not claimed for a fleet behind nginx
]

MODEL = "m"
SLEEP_MS = 20
FLAGS = (
    "--model-control-mode=explicit",
    f"--load-model={MODEL}",
    "--exit-timeout-secs=20",
    "--traffic-follows-readiness=true",
)


def _render() -> Callable[..., str]:
    spec = importlib.util.spec_from_file_location("nginx_render", ROOT / "deploy/nginx/render.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.render  # type: ignore[no-any-return]


def _model_py(version: int) -> str:
    """Answers INPUT0 + version after SLEEP_MS, so a response says which version served it
    and requests are in flight long enough to be caught by a signal."""
    return textwrap.dedent(f"""
        import time
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                time.sleep({SLEEP_MS} / 1000.0)
                out = []
                for r in requests:
                    t = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t + {version})]))
                return out
        """)


def _write_version(repo: Path, version: int) -> None:
    mdir = repo / MODEL
    (mdir / str(version)).mkdir(parents=True, exist_ok=True)
    (mdir / str(version) / "model.py").write_text(_model_py(version))
    (mdir / "config.pbtxt").write_text(
        textwrap.dedent(f"""
        name: "{MODEL}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        instance_group [ {{ count: 1, kind: KIND_CPU }} ]
        """)
    )


# --------------------------------------------------------------------------- nginx
class Nginx:
    def __init__(self, workdir: Path, replicas: list[ServerProcess]) -> None:
        self.prefix = workdir / "nginx"
        self.prefix.mkdir()
        # nginx binds its own ports and cannot report them (no port 0): ports free a moment
        # ago may be taken by the time it binds, so a start that fails on a taken port is
        # retried on new ones
        for _ in range(5):
            if self._start(replicas):
                return
        raise RuntimeError(f"nginx found no free ports: {self.log()}")

    def _start(self, replicas: list[ServerProcess]) -> bool:
        self.http_port, self.grpc_port = free_port(), free_port()
        conf = _render()(
            str(self.prefix),
            f"127.0.0.1:{self.http_port}",
            f"127.0.0.1:{self.grpc_port}",
            [("127.0.0.1", r.http_port, r.grpc_port) for r in replicas],
            "1s",
        )
        self.conf = self.prefix / "sluice.conf"
        self.conf.write_text(conf)
        globals_ = "daemon off;" + (" user root;" if os.geteuid() == 0 else "")
        exe = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen(
            [exe, "-p", str(self.prefix), "-c", str(self.conf), "-g", globals_],
            stdout=subprocess.DEVNULL,
            stderr=open(self.prefix / "stderr.log", "wb"),  # noqa: SIM115
            start_new_session=True,
        )
        try:
            for port in (self.http_port, self.grpc_port):
                wait_until(lambda p=port: self._listens(p), 20, 0.05, f"nginx on {port}")
        except RuntimeError:
            if "Address already in use" in self.log():
                (self.prefix / "stderr.log").unlink(missing_ok=True)
                (self.prefix / "error.log").unlink(missing_ok=True)
                return False
            raise
        return True

    def _listens(self, port: int) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"nginx exited: {self.log()}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    def log(self) -> str:
        out = ""
        for name in ("stderr.log", "error.log"):
            path = self.prefix / name
            if path.exists():
                out += path.read_text(errors="replace")
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


# --------------------------------------------------------------------------- client load
class Load:
    """Continuous closed-loop load through nginx: ``http``+``grpc`` threads, each one request
    at a time, bounded by ``limit`` requests in all. Every outcome is kept."""

    def __init__(self, nginx: Nginx, http: int = 2, grpc: int = 2, limit: int = 40_000) -> None:
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.ok = 0
        self.sent = 0
        self.limit = limit
        self.outstanding = 0
        self.failures: list[str] = []
        self.versions: list[tuple[int, int]] = []  # (start sequence number, version)
        url_h = f"127.0.0.1:{nginx.http_port}"
        url_g = f"127.0.0.1:{nginx.grpc_port}"
        self.threads = [
            threading.Thread(target=self._http, args=(url_h,), daemon=True) for _ in range(http)
        ] + [threading.Thread(target=self._grpc, args=(url_g,), daemon=True) for _ in range(grpc)]
        for t in self.threads:
            t.start()

    def _next(self) -> int | None:
        with self.lock:
            if self.stop_event.is_set() or self.sent >= self.limit:
                return None
            self.sent += 1
            self.outstanding += 1
            return self.sent

    def _done(self, seq: int, value: float | None, error: str | None) -> None:
        with self.lock:
            self.outstanding -= 1
            if error is not None:
                self.failures.append(error)
            else:
                assert value is not None
                self.ok += 1
                self.versions.append((seq, round(value - seq)))

    def _http(self, url: str) -> None:
        client = httpclient.InferenceServerClient(url, network_timeout=60)
        try:
            while (seq := self._next()) is not None:
                i = httpclient.InferInput("INPUT0", [1, 1], "FP32")
                i.set_data_from_numpy(np.array([[seq]], dtype=np.float32))
                try:
                    r = client.infer(MODEL, [i])
                    self._done(seq, float(r.as_numpy("OUTPUT0")[0, 0]), None)
                except Exception as exc:  # every failure is kept with its text
                    self._done(seq, None, f"http #{seq}: {exc}")
        finally:
            client.close()

    def _grpc(self, url: str) -> None:
        client = grpcclient.InferenceServerClient(url)
        try:
            while (seq := self._next()) is not None:
                i = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
                i.set_data_from_numpy(np.array([[seq]], dtype=np.float32))
                try:
                    r = client.infer(MODEL, [i], client_timeout=60)
                    self._done(seq, float(r.as_numpy("OUTPUT0")[0, 0]), None)
                except Exception as exc:
                    self._done(seq, None, f"grpc #{seq}: {exc}")
        finally:
            client.close()

    def more(self, n: int, what: str) -> None:
        """Wait until ``n`` more requests have succeeded."""
        target = self.ok + n
        wait_until(lambda: self.ok >= target, 90, 0.02, f"{n} more answers ({what})")

    def close(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(90)


# --------------------------------------------------------------------------- the fleet
def _served(srv: ServerProcess) -> int:
    """Requests this replica has answered successfully (its own statistics)."""
    code, raw = request(srv, "GET", f"/v2/models/{MODEL}/stats")
    if code != 200:
        return 0
    return sum(s["inference_stats"]["success"]["count"] for s in json.loads(raw)["model_stats"])


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[dict[str, Any]]:
    repo = tmp_path / "repo"
    repo.mkdir()
    _write_version(repo, 1)
    state: dict[str, Any] = {"repo": repo}
    with server_launcher() as start:
        state["start"] = start
        # replica 1 is killed outright: what that leaves behind is removed, not reported
        replicas = [start(repo, *FLAGS, ready=False, expect_clean=i != 1) for i in range(3)]
        for r in replicas:
            r.wait_ready()
        state["replicas"] = replicas
        nginx = Nginx(tmp_path, replicas)
        state["nginx"] = nginx
        try:
            yield state
        finally:
            nginx.stop()


def test_fleet_behind_nginx(fleet: dict[str, Any]) -> None:
    replicas: list[ServerProcess] = fleet["replicas"]
    nginx: Nginx = fleet["nginx"]
    start = fleet["start"]
    repo: Path = fleet["repo"]
    ports = [(r.http_port, r.grpc_port, r.metrics_port) for r in replicas]
    load = Load(nginx)
    t0 = time.monotonic()

    def phase(name: str) -> None:
        print(f"{time.monotonic() - t0:6.1f}s {name}: {load.ok} ok, {len(load.failures)} failed")

    try:
        load.more(60, "warm-up")
        assert load.failures == [], load.failures[:5]
        wait_until(lambda: all(_served(r) > 0 for r in replicas), 30, 0.05, "all replicas serve")

        phase("1. SIGTERM")
        # 1. SIGTERM: readiness off, drain, nginx moves on; no request is lost
        assert replicas[0].stop(signal.SIGTERM) == 0, replicas[0].log()
        load.more(60, "after SIGTERM")
        assert load.failures == [], load.failures[:5]

        phase("and it rejoins")
        # ... and it rejoins on the same ports
        replicas[0] = start(repo, *FLAGS, ports=ports[0])
        wait_until(lambda: _served(replicas[0]) > 0, 60, 0.05, "the restarted replica serves")
        load.more(30, "after the rejoin")
        assert load.failures == [], load.failures[:5]

        phase("2. SIGKILL")
        # 2. SIGKILL: only what was in flight at that moment may fail
        with load.lock:
            in_flight = load.outstanding
            before = len(load.failures)
            replicas[1].proc.send_signal(signal.SIGKILL)
        replicas[1].proc.wait(10)
        load.more(60, "after SIGKILL")
        lost = load.failures[before:]
        assert len(lost) <= in_flight, (in_flight, lost)
        killed = replicas[1]
        replicas[1] = start(repo, *FLAGS, ports=ports[1])
        wait_until(lambda: _served(replicas[1]) > 0, 60, 0.05, "the killed replica rejoins")
        killed.stop()  # closes its log; its workers are reaped by the launcher
        load.more(30, "after the second rejoin")
        assert load.failures[before:] == lost, load.failures[before:]
        print(f"SIGKILL: {in_flight} request(s) in flight at the kill, {len(lost)} failed: {lost}")

        phase("3. rollout")
        # 3. rollout of a repository change (version 2), replica by replica
        before = len(load.failures)
        _write_version(repo, 2)
        for r in replicas:
            cli = subprocess.run(
                [sys.executable, "-m", "sluice", "model", "load", MODEL, "-u", r.http],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert cli.returncode == 0, cli.stderr
            assert [
                e.get("version") for e in index_entries(r, MODEL) if e.get("state") == "READY"
            ] == ["2"]
            load.more(20, f"rollout to {r.http}")
        with load.lock:
            rolled_out = load.sent
        load.more(60, "after the rollout")
        assert load.failures[before:] == [], load.failures[before:][:5]
        with load.lock:
            after = {v for seq, v in load.versions if seq > rolled_out}
            seen = {v for _, v in load.versions}
        assert after == {2} and seen == {1, 2}
        phase("rolled out")
    finally:
        load.close()
    assert load.ok > 300
    # nginx itself ran without a fatal error
    assert "[emerg]" not in nginx.log(), nginx.log()[-2000:]
