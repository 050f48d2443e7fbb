"""Fixtures that start the real ``sluice serve`` as a process on 127.0.0.1."""

from __future__ import annotations

import contextlib
import glob
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A port that was free a moment ago, for an address that nothing should listen on. The
    launcher never uses it: servers bind port 0 and report what they got (``--port-file``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_serial = itertools.count()
TRACEBACK = "Traceback (most recent call last)"
# a python model's file: <model>/<version>/model.py (in a repository, or a load's file override)
MODEL_FILE = re.compile(r"/\d+/model\.py$")
# a log record of the server or a worker ("2026-12-02 06:58:32,038 I sluice] ..."): the workers
# write to the same file, so one may land in the middle of another process's traceback
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+ [A-Z] ")


class ServerProcess:
    """``sluice serve`` in a child process on 127.0.0.1; stopped by its PID.

    The server binds port 0 for HTTP, gRPC and metrics and writes the ports it got to a
    ``--port-file``; ``http_port``/``grpc_port``/``metrics_port`` (and ``http``, ``grpc``,
    ``metrics``) wait for that file. ``ports=(h, g, m)`` asks for fixed ports instead."""

    def __init__(
        self,
        repo: Path,
        *flags: str,
        env: dict[str, str] | None = None,
        ports: tuple[int, int, int] | None = None,
    ) -> None:
        self.repo = repo
        n = f"{os.getpid()}-{next(_serial)}"
        self.log_path = repo.parent / f"server-{n}.log"
        self.port_file = repo.parent / f"server-{n}.ports.json"
        self._ports: dict[str, int | None] | None = None
        if ports is not None:
            self._ports = dict(zip(("http", "grpc", "metrics"), ports, strict=True))
        h, g, m = ports or (0, 0, 0)
        self.cmd = [
            sys.executable,
            "-m",
            "sluice",
            "serve",
            f"--model-repository={repo}",
            f"--http-port={h}",
            f"--grpc-port={g}",
            f"--metrics-port={m}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
            f"--port-file={self.port_file}",
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

    # ------------------------------------------------------------------ ports
    def ports(self, timeout: float = 60.0) -> dict[str, int | None]:
        """The bound ports, from the port file (waits until the server has written it)."""
        deadline = time.monotonic() + timeout
        while self._ports is None:
            try:
                self._ports = json.loads(self.port_file.read_text())
                break
            except (OSError, ValueError):  # not there yet (it is replaced atomically)
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode} before it listened:\n{self.log()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"server wrote no port file in {timeout}s:\n{self.log()}")
            time.sleep(0.02)
        return self._ports

    def _port(self, which: str) -> int:
        port = self.ports()[which]
        if port is None:
            raise RuntimeError(f"this server has no {which} endpoint (--allow-{which}=false)")
        return int(port)

    @property
    def http_port(self) -> int:
        return self._port("http")

    @property
    def grpc_port(self) -> int:
        return self._port("grpc")

    @property
    def metrics_port(self) -> int:
        return self._port("metrics")

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics(self) -> str:
        return f"127.0.0.1:{self.metrics_port}"

    # ------------------------------------------------------------------ state
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
        if self.ports(timeout)["http"] is None:
            return  # no HTTP: the port file is written once the other front-ends listen
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

    def _ready(self) -> bool:
        if self.ports()["http"] is not None:
            return self.get("/v2/health/ready")[0] == 200
        import tritonclient.grpc as grpcclient  # no HTTP (--allow-http=false): ask over gRPC

        c = grpcclient.InferenceServerClient(self.grpc)
        try:
            return bool(c.is_server_ready())
        except Exception:  # noqa: BLE001 - not answering yet
            return False
        finally:
            c.close()

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.wait_live(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._ready():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited:\n{self.log()}")
            time.sleep(0.05)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log()}")

    def workers(self) -> list[psutil.Process]:
        """The python-model worker processes under the server, alive: not multiprocessing's
        resource tracker, not the fork server that forks them (``python_processes``)."""
        return python_processes(self.proc.pid)[0]

    def fork_server(self) -> psutil.Process | None:
        """The python backend's fork server (the workers' parent), if one runs."""
        return python_processes(self.proc.pid)[1]

    def snapshot_children(self) -> list[psutil.Process]:
        try:
            found = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            found = []
        known = {p.pid for p in self.children}
        self.children = [p for p in self.children if p.is_running()] + [
            p for p in found if p.pid not in known
        ]
        return found

    # ------------------------------------------------------------------ stop
    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the server and wait for it; returns its exit status (-9 if it had to be
        killed after ``timeout``)."""
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

    def session_members(self) -> list[psutil.Process]:
        """Processes still in the server's session (it is started in a new one): its workers,
        also any that lost their parent."""
        members = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if p.pid != self.proc.pid and os.getsid(p.pid) == self.proc.pid:
                    members.append(p)
        return members

    def leftover_children(self) -> list[psutil.Process]:
        """Workers (seen as children, or still in the server's session) alive 5 s from now.
        A zombie is dead: once the server has exited its children are reaped by whoever
        adopts them (multiprocessing's resource tracker exits after the server, always an
        orphan), which in a container can take a while; waiting for that reaping cost ~1.5 s
        per server stop."""
        known = {p.pid for p in self.children}
        alive = self.children + [p for p in self.session_members() if p.pid not in known]
        deadline = time.monotonic() + 5.0
        while True:
            alive = [p for p in alive if _running(p)]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.02)

    def leftover_segments(self) -> list[str]:
        """Shared-memory segments this server's python-model instances created (named
        ``sl<server pid>_...``) that are still there."""
        return sorted(glob.glob(f"/dev/shm/sl{self.proc.pid}_*"))

    def server_tracebacks(self) -> list[str]:
        """Tracebacks in the log that are the server's own: one with a frame in a model
        repository is a python model's error, reported as Triton reports it (not a finding)."""
        repos = [
            str(Path(f.split("=", 1)[1]).resolve())
            for f in self.cmd
            if f.startswith("--model-repository=")
        ]
        found = []
        lines = self.log().splitlines()
        for i, line in enumerate(lines):
            if TRACEBACK not in line:
                continue
            block = [line]
            for follow in lines[i + 1 :]:
                if LOG_RECORD.match(follow):
                    continue  # another process's log line, written into the middle of it
                if not follow.startswith(" "):
                    block.append(follow)  # the exception line
                    break
                block.append(follow)
            frames = [b.split('"')[1] for b in block if b.lstrip().startswith('File "')]
            model_frame = any(
                str(Path(f).resolve()).startswith(r) or MODEL_FILE.search(f)
                for f in frames
                for r in repos
            )
            if not model_frame:
                found.append("\n".join(block))
        return found

    def teardown_problems(self, stopped_here: bool, rc: int) -> list[str]:
        """What a clean stop must not show; every leftover found is removed."""
        problems = []
        if stopped_here and rc != 0:
            problems.append(f"exit status {rc} after SIGTERM (expected 0)")
        for tb in self.server_tracebacks():
            problems.append(f"a traceback in the server log:\n{tb}")
        alive = self.leftover_children()
        if alive:
            problems.append(f"worker processes left behind: {[p.pid for p in alive]}")
            for p in alive:
                with contextlib.suppress(psutil.Error):
                    p.kill()
        segments = self.leftover_segments()
        if segments:
            problems.append(f"shared-memory segments left behind: {segments}")
            for path in segments:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        return problems


FORK_SERVER_NAME = "sluice-forksrv"  # its process name (sluice.backends.python.zygote.NAME)


def python_processes(pid: int) -> tuple[list[psutil.Process], psutil.Process | None]:
    """Under process ``pid``: the python-model workers alive (forked by the fork server or
    spawned), and the fork server (None when none runs)."""
    workers, fork_server = [], None
    try:
        below = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return [], None
    for p in below:
        with contextlib.suppress(psutil.Error):
            if not _running(p):
                continue
            if p.name() == FORK_SERVER_NAME:
                fork_server = p
            elif "resource_tracker" not in " ".join(p.cmdline()):
                workers.append(p)
    return workers, fork_server


def _running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (the same process: psutil checks its start time)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@contextlib.contextmanager
def server_launcher() -> Iterator:
    """``start(repo, *flags, ready=True, expect_clean=True)`` starts a ServerProcess. When the
    context ends every server still running gets SIGTERM and must exit 0; every server (also
    those a test stopped itself) must leave no traceback in its log, no worker process and no
    shared-memory segment behind. ``expect_clean=False`` is for a test that makes the server
    fail on purpose: leftovers are still removed, but not reported."""
    started: list[tuple[ServerProcess, bool]] = []

    def start(
        repo: Path, *flags: str, ready: bool = True, expect_clean: bool = True, **kw: object
    ) -> ServerProcess:
        srv = ServerProcess(repo, *flags, **kw)  # type: ignore[arg-type]
        started.append((srv, expect_clean))
        if ready:
            srv.wait_ready()
        else:
            srv.wait_live()
        srv.snapshot_children()
        return srv

    try:
        yield start
    finally:
        report = []
        for srv, expect_clean in started:
            running = srv.proc.poll() is None
            rc = srv.stop()
            problems = srv.teardown_problems(running, rc)
            if problems and expect_clean:
                report.append(f"server {' '.join(srv.cmd[4:])}:\n  " + "\n  ".join(problems))
        if report:
            raise AssertionError("unclean server teardown:\n" + "\n".join(report))


@pytest.fixture
def start_server() -> Iterator:
    with server_launcher() as start:
        yield start


@contextlib.contextmanager
def refused_address() -> Iterator[str]:
    """``127.0.0.1:<port>`` where every connection is refused while the context lasts: the port
    is bound here (nothing else can take it meanwhile) and never listened on. For tests of a
    client facing a server that is not there, instead of a port found free that another
    process may bind before the client connects."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"
