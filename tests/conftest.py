"""Fixtures that start the real ``sluice serve`` as a process on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``sluice serve`` in a child process; stopped by its PID."""

    def __init__(
        self,
        repo: Path,
        *flags: str,
        env: dict[str, str] | None = None,
        ports: tuple[int, int, int] | None = None,
    ) -> None:
        self.repo = repo
        self.http_port, self.grpc_port, self.metrics_port = ports or (
            free_port(),
            free_port(),
            free_port(),
        )
        self.http = f"127.0.0.1:{self.http_port}"
        self.grpc = f"127.0.0.1:{self.grpc_port}"
        self.metrics = f"127.0.0.1:{self.metrics_port}"
        self.log_path = repo.parent / f"server-{self.http_port}.log"
        self.cmd = [
            sys.executable,
            "-m",
            "sluice",
            "serve",
            f"--model-repository={repo}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
            *flags,
        ]
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self.children: list[psutil.Process] = []

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str, port: int | None = None) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{port or self.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def wait_live(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if self.get("/v2/health/live")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server not live after {timeout}s:\n{self.log()}")

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.wait_live(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.get("/v2/health/ready")[0] == 200:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited:\n{self.log()}")
            time.sleep(0.05)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log()}")

    def snapshot_children(self) -> list[psutil.Process]:
        try:
            self.children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            self.children = []
        return self.children

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        self.snapshot_children()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()
        return int(self.proc.returncode)

    def leftover_children(self) -> list[psutil.Process]:
        gone, alive = psutil.wait_procs(self.children, timeout=5)
        return alive


@contextlib.contextmanager
def server_launcher() -> Iterator:
    """``start(repo, *flags, ready=True)`` starts a ServerProcess; all of them are stopped by
    PID (and any worker left behind is killed) when the context ends."""
    started: list[ServerProcess] = []

    def start(repo: Path, *flags: str, ready: bool = True, **kw: object) -> ServerProcess:
        srv = ServerProcess(repo, *flags, **kw)  # type: ignore[arg-type]
        started.append(srv)
        if ready:
            srv.wait_ready()
        else:
            srv.wait_live()
        return srv

    try:
        yield start
    finally:
        for srv in started:
            srv.stop()
            for child in srv.leftover_children():
                child.kill()


@pytest.fixture
def start_server() -> Iterator:
    with server_launcher() as start:
        yield start
