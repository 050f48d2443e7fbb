"""Servers under benchmark: free loopback ports, a server process in its own session that is
stopped by its PID, the ``sluice serve`` and real Triton command lines the bench scripts
share, what a server says it served and the CPU its process tree used, and one
load-generator run read from its CSV.

Imported by the scripts in this folder (``python bench/<script>.py`` puts it on ``sys.path``).
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One server process (its own session, output to ``log``), with its HTTP and gRPC ports;
    ``env`` is added to this process's environment."""

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        http: int,
        grpc: int,
        log: Path,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name, self.http, self.grpc = name, http, grpc
        self.metrics = 0  # the metrics port, where the starter knows it
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            list(cmd),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
            env={**os.environ, **env} if env else None,
        )

    def wait_ready(self, path: str = "/v2/health/ready", timeout: float = 180) -> None:
        """Until ``GET path`` answers 200; raises if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            try:
                url = f"http://127.0.0.1:{self.http}{path}"
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{self.name} not ready after {timeout}s")

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL to its group after 30 s; then whatever its group left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        try:  # children left in its process group (python-backend stubs)
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.log.close()


def start_sluice(
    repo: Path,
    log: Path,
    *extra: str,
    prefix: Sequence[str] = (),
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    program: Sequence[str] = (sys.executable, "-m", "sluice"),
    name: str = "sluice",
) -> Server:
    """``sluice serve`` on ``repo``, all three endpoints on free loopback ports; ``prefix`` goes
    before the command (``taskset -c 0``), ``extra`` after it (``--load-model=...``), ``env``
    into its environment; ``program`` is what runs ``serve`` (e.g. a bootstrap that patches
    sluice first)."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    cmd = [
        *prefix,
        *program,
        "serve",
        f"--model-repository={repo}",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        *extra,
    ]
    srv = Server(name, cmd, http, grpc, log, cwd, env)
    srv.metrics = metrics
    return srv


def served(srv: Server, model: str) -> int:
    """The successful requests ``model`` has counted (its statistics, every version)."""
    url = f"http://127.0.0.1:{srv.http}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        return int(json.loads(r.read())["model_stats"][0]["inference_stats"]["success"]["count"])


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and all its descendants: python workers, also
    those a fork server started (they are its children, not the server's)."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return total
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def csv_run(
    cmd: Sequence[str], out: Path, what: str, timeout: float = 120
) -> dict[str, str] | None:
    """Run a perf_analyzer-style command that writes its CSV (``-f``) to ``out``; the first
    row, or None (said on stderr, with ``what``) when it timed out, failed or wrote none."""
    out.unlink(missing_ok=True)
    try:
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  {what}: timed out", file=sys.stderr)
        return None
    if r.returncode != 0 or not out.exists():
        tail = (r.stdout + r.stderr)[-300:].strip()
        print(f"  {what} failed rc={r.returncode}: {tail}", file=sys.stderr)
        return None
    with out.open() as f:
        return next(csv.DictReader(f), None)


PEERS_DIR = Path(os.environ.get("PEERS_DIR", "/tmp/peers"))
PERF_ANALYZER = Path(os.environ.get("PERF_ANALYZER", PEERS_DIR / "bin" / "perf_analyzer"))


def start_triton(repo: Path, log: Path, env: Mapping[str, str] | None = None) -> Server:
    """Real Triton 2.51 (bench-peers' ``setup.sh`` installs it in ``$PEERS_DIR``) on ``repo``,
    all three endpoints on free loopback ports, CPU only, as bench-peers' ``run.sh`` starts it."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    cmd = [
        str(PEERS_DIR / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--allow-gpu-metrics=false",
        "--pinned-memory-pool-byte-size=0",
        "--cuda-memory-pool-byte-size=0:0",
        "--exit-timeout-secs=10",
    ]
    return Server("triton", cmd, http, grpc, log, env=env)
