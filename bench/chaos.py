"""Chaos run: clients on HTTP and gRPC while worker processes are SIGKILLed and models reloaded.

    python bench/chaos.py                           # 60 s, 4 HTTP + 4 gRPC client threads
    python bench/chaos.py --duration 20 --max-requests 2000 --json chaos.json

It starts a real ``sluice serve`` (explicit model control, loopback only) on a repository of
small python models (batched and not, several instances each), runs client threads on both
protocols, and meanwhile kills random worker processes (under the server, found with
psutil, SIGKILL by PID) and reloads random models (a file in the model's directory changes,
then ``POST /v2/repository/models/<m>/load``). At the end it checks, and exits 1 when any
check fails:

- every request was answered exactly once: with 200 and ITS OWN value (the request id is the
  input; each model answers a known function of it), or with an error that names a worker
  process this run killed; any other error, a wrong value, a hang (no answer within the
  client timeout) or a dropped connection is a violation;
- the server's statistics agree with the clients: per model, success and failure counts
  grew by exactly what the clients saw (sluice keeps a version's statistics across a reload;
  each reload is bracketed by two readings, and a count that went down is a violation);
- every reload answered 200, or failed with an error naming a killed worker;
- nothing leaks: once the run settles, the server's open fds, its /dev/shm segments
  (``sl<server pid>_*``, none naming a dead worker) and its child processes are back to the
  baseline taken after warm-up; RSS before and after is printed.

The core (``write_models``, ``SERVER_FLAGS``, ``run``) is shared with the test suite
(``tests/e2e/test_fault_chaos.py`` runs a short version against its own server fixture).
Everything it starts it stops by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

__all__ = ["MODELS", "SERVER_FLAGS", "Target", "Report", "write_models", "run", "print_report"]

# x -> f(x) for each model; x is the request id (exact in FP32 below 2**22)
MODEL_PY = """
import json
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.mul = float(params["mul"]["string_value"])
        self.add = float(params["add"]["string_value"])
        self.sleep = float(params["sleep_ms"]["string_value"]) / 1000.0

    def execute(self, requests):
        if self.sleep:
            time.sleep(self.sleep)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", x * self.mul + self.add)]))
        return out
"""


@dataclass(frozen=True)
class Model:
    name: str
    max_batch_size: int
    instances: int
    mul: float
    add: float
    sleep_ms: float
    batching: bool

    def expected(self, x: float) -> float:
        return x * self.mul + self.add

    def config(self) -> str:
        dyn = "dynamic_batching { max_queue_delay_microseconds: 2000 }" if self.batching else ""
        return textwrap.dedent(f"""
            name: "{self.name}"
            backend: "python"
            max_batch_size: {self.max_batch_size}
            input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
            output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
            instance_group [ {{ count: {self.instances}, kind: KIND_CPU }} ]
            {dyn}
            parameters {{ key: "mul" value {{ string_value: "{self.mul}" }} }}
            parameters {{ key: "add" value {{ string_value: "{self.add}" }} }}
            parameters {{ key: "sleep_ms" value {{ string_value: "{self.sleep_ms}" }} }}
            """)


MODELS = (
    Model("chaos_batched", 8, 2, 2.0, 1.0, 2.0, True),
    Model("chaos_plain", 0, 3, 1.0, 7.0, 1.0, False),
    Model("chaos_slow", 4, 2, -1.0, 0.0, 15.0, True),
)
SERVER_FLAGS = ("--model-control-mode=explicit", "--load-model=*")
# the error of a request whose worker died under it: names the worker's PID
KILLED = re.compile(r"worker process (\d+) was killed by signal SIGKILL")


def write_models(repo: Path) -> Path:
    """The chaos models as a model repository at ``repo``."""
    for m in MODELS:
        (repo / m.name / "1").mkdir(parents=True, exist_ok=True)
        (repo / m.name / "config.pbtxt").write_text(m.config())
        (repo / m.name / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY))
    return repo


@dataclass(frozen=True)
class Target:
    """A running server: its PID, ``host:port`` addresses and model repository."""

    pid: int
    http: str
    grpc: str
    repo: Path


@dataclass
class Resources:
    fds: int
    shm: list[str]
    children: int
    rss_mib: float
    # what the fds point at ("socket:[...]" shortened to "socket"), for naming a leak
    fd_kinds: dict[str, int] = field(default_factory=dict)

    def row(self) -> str:
        return f"fds={self.fds} shm={len(self.shm)} children={self.children} rss={self.rss_mib}MiB"


@dataclass
class Report:
    requests: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # "http ok", "grpc killed", ...
    per_model: dict[str, dict[str, int]] = field(default_factory=dict)
    kills: int = 0
    reloads: Counter[str] = field(default_factory=Counter)
    before: Resources | None = None
    after: Resources | None = None
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations


# ---------------------------------------------------------------------------- server state


def _http_json(base: str, path: str, body: Any = None, timeout: float = 120.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://{base}{path}", data=data, method="POST" if data else "GET"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode(errors="replace")


def stats(target: Target) -> dict[str, tuple[int, int]]:
    """(success, fail) per model, summed over its versions."""
    out = {}
    for m in MODELS:
        code, doc = _http_json(target.http, f"/v2/models/{m.name}/stats")
        if code != 200:
            raise RuntimeError(f"stats of {m.name}: {code} {doc}")
        ok = sum(int(s["inference_stats"]["success"]["count"]) for s in doc["model_stats"])
        fail = sum(int(s["inference_stats"]["fail"]["count"]) for s in doc["model_stats"])
        out[m.name] = (ok, fail)
    return out


FORK_SERVER_NAME = "sluice-forksrv"  # the fork server's process name (its workers' parent)


def workers(pid: int) -> list[psutil.Process]:
    """The server's python-model worker processes (forked by the fork server, or spawned;
    not the fork server itself, not the resource tracker)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for c in children:
        with contextlib.suppress(psutil.Error):
            if (
                "spawn_main" in " ".join(c.cmdline())
                and c.name() != FORK_SERVER_NAME
                and c.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(c)
    return found


def resources(pid: int) -> Resources:
    p = psutil.Process(pid)
    children = [
        c for c in p.children(recursive=True) if _alive(c)
    ]  # zombies count as gone: reaped by whoever adopts them
    return Resources(
        fds=p.num_fds(),
        shm=sorted(os.path.basename(s) for s in glob.glob(f"/dev/shm/sl{pid}_*")),
        children=len(children),
        rss_mib=round(p.memory_info().rss / 2**20, 1),
        fd_kinds=_fd_kinds(pid),
    )


def _fd_kinds(pid: int) -> dict[str, int]:
    kinds: Counter[str] = Counter()
    for fd in glob.glob(f"/proc/{pid}/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("/dev/shm/"):  # a segment: counted by whether it still exists
            target = target if target.endswith(" (deleted)") else "/dev/shm"
        elif not target.startswith("/"):
            target = re.sub(r"[:\[].*", "", target)  # socket:[123] -> socket
        kinds[target] += 1
    return dict(kinds)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def orphan_segments(pid: int, shm: list[str]) -> list[str]:
    """Output segments (``sl<pid>_<n>_o<worker pid>_<k>``) of a worker that is not running."""
    live = {w.pid for w in workers(pid)}
    out = []
    for name in shm:
        m = re.match(rf"sl{pid}_\d+_o(\d+)_", name)
        if m and int(m.group(1)) not in live:
            out.append(name)
    return out


def _leaks(target: Target, before: Resources, before_workers: int) -> list[str]:
    """What the server holds beyond the baseline. Arenas are created on an instance's first
    request, so segments are judged by owner, not count: at most one input arena per lane of
    an instance (two lanes: a request handed to a busy python worker), output arenas only of
    running workers, no one-shot (``x``) segment; each
    segment the server maps holds two open fds (the segment's and the mmap's duplicate), so
    fds are compared net of those."""
    now = resources(target.pid)
    out = []
    n_workers = len(workers(target.pid))
    if now.children != before.children or n_workers != before_workers:
        out.append(
            f"child processes: {before.children} before, {now.children} after "
            f"(workers {before_workers} / {n_workers})"
        )
    instances = sum(m.instances for m in MODELS)
    inputs = [s for s in now.shm if re.match(rf"sl{target.pid}_\d+_i", s)]
    if len(inputs) > 2 * instances:
        out.append(f"{len(inputs)} input arenas for {instances} instances: {inputs}")
    orphans = orphan_segments(target.pid, now.shm)
    if orphans:
        out.append(f"shm segments of dead workers: {orphans}")
    oneshot = [s for s in now.shm if re.match(rf"sl{target.pid}_\d+_x", s)]
    if oneshot:
        out.append(f"one-shot segments left: {oneshot}")
    net_before, net_now = before.fds - 2 * len(before.shm), now.fds - 2 * len(now.shm)
    if net_now > net_before:
        grown = {
            k: f"{before.fd_kinds.get(k, 0)} -> {n}"
            for k, n in sorted(now.fd_kinds.items())
            if n > before.fd_kinds.get(k, 0)
        }
        out.append(
            f"open fds (net of shm segments): {net_before} before, {net_now} after "
            f"({before.fds} / {now.fds} in all; grown: {grown})"
        )
    return out


def wait_for(pred: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


# ---------------------------------------------------------------------------- the run


class _Run:
    def __init__(self, target: Target, seed: int, client_timeout: float) -> None:
        self.t = target
        self.seed = seed
        self.client_timeout = client_timeout
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self.stop = threading.Event()
        self.killed: set[int] = set()
        self.report = Report()
        self.answers: dict[int, str] = {}  # request id -> outcome (exactly one each)
        self.client_counts = {m.name: Counter[str]() for m in MODELS}
        self.stats_readings: list[tuple[str, dict[str, tuple[int, int]]]] = []

    # ---- clients ---------------------------------------------------------------------
    def record(self, rid: int, proto: str, model: str, kind: str, detail: str) -> None:
        with self.lock:
            if rid in self.answers:
                self.report.violations.append(f"request {rid} answered twice ({detail})")
            self.answers[rid] = kind
            self.report.outcomes[f"{proto} {kind}"] += 1
            self.client_counts[model]["ok" if kind in ("ok", "wrong value") else "fail"] += 1
            if kind not in ("ok", "killed"):
                self.report.violations.append(f"{proto} request {rid} to {model}: {detail}")

    def classify_error(self, msg: str) -> str:
        m = KILLED.search(msg)
        if m is None:
            return "error"
        with self.lock:
            return "killed" if int(m.group(1)) in self.killed else "error (unknown worker)"

    def client(self, proto: str, idx: int, budget: int) -> None:
        rnd = random.Random(self.seed * 1000 + idx)
        timeout = self.client_timeout
        c: Any
        if proto == "http":
            c = httpclient.InferenceServerClient(
                self.t.http, connection_timeout=timeout, network_timeout=timeout
            )
        else:
            c = grpcclient.InferenceServerClient(self.t.grpc)
        mod: Any = httpclient if proto == "http" else grpcclient
        try:
            while not self.stop.is_set():
                rid = next(self.ids)
                if rid > budget:
                    self.stop.set()
                    break
                model = rnd.choice(MODELS)
                inp = mod.InferInput("INPUT0", [1, 1] if model.max_batch_size else [1], "FP32")
                x = np.full(inp.shape(), float(rid), np.float32)
                inp.set_data_from_numpy(x)
                try:
                    if proto == "http":
                        res = c.infer(model.name, [inp])
                    else:
                        res = c.infer(model.name, [inp], client_timeout=timeout)
                    y = float(res.as_numpy("OUTPUT0").reshape(-1)[0])
                    if y == model.expected(float(rid)):
                        self.record(rid, proto, model.name, "ok", "")
                    else:
                        self.record(rid, proto, model.name, "wrong value", f"got {y}")
                except InferenceServerException as e:
                    text = f"{e.status()} {e.message()}"
                    self.record(rid, proto, model.name, self.classify_error(text), text)
                except Exception as e:  # noqa: BLE001 - transport: a hang or a dropped link
                    self.record(rid, proto, model.name, "transport", f"{type(e).__name__}: {e}")
        finally:
            c.close()

    # ---- chaos -------------------------------------------------------------------------
    def chaos(self, kill_every: float, reload_every: float) -> None:
        rnd = random.Random(self.seed)
        generation = 0
        next_kill = time.monotonic() + kill_every
        next_reload = time.monotonic() + reload_every
        while not self.stop.wait(0.02):
            now = time.monotonic()
            if now >= next_reload:
                generation += 1
                self.reload(rnd.choice(MODELS).name, generation)
                next_reload = time.monotonic() + reload_every * rnd.uniform(0.5, 1.5)
            elif now >= next_kill:
                victims = workers(self.t.pid)
                if victims:
                    v = rnd.choice(victims)
                    with self.lock:
                        self.killed.add(v.pid)  # before the kill: its error may come at once
                    with contextlib.suppress(psutil.Error):
                        v.send_signal(signal.SIGKILL)
                        self.report.kills += 1
                next_kill = time.monotonic() + kill_every * rnd.uniform(0.5, 1.5)

    def reload(self, model: str, generation: int) -> None:
        """A file in the model's directory changes, then load: the model is reloaded (new
        instances beside the old, swapped in; the old drain)."""
        (self.t.repo / model / "generation.txt").write_text(str(generation))
        self.stats_readings.append((f"before reload {generation}", stats(self.t)))
        code, doc = _http_json(self.t.http, f"/v2/repository/models/{model}/load", {})
        self.stats_readings.append((f"after reload {generation}", stats(self.t)))
        if code == 200:
            self.report.reloads["ok"] += 1
            return
        text = str(doc.get("error") if isinstance(doc, dict) else doc)
        kind = self.classify_error(text)
        if kind == "killed":
            self.report.reloads["failed: a worker it started was killed"] += 1
        else:
            self.report.reloads["failed"] += 1
            self.report.violations.append(f"reload of {model}: {code} {text}")

    # ---- checks ------------------------------------------------------------------------
    def check_stats(self, before: dict[str, tuple[int, int]]) -> None:
        after = stats(self.t)
        readings = [("start", before), *self.stats_readings, ("end", after)]
        for (w0, r0), (w1, r1) in itertools.pairwise(readings):
            for name in r0:
                if r1[name][0] < r0[name][0] or r1[name][1] < r0[name][1]:
                    self.report.violations.append(
                        f"statistics of {name} went down between '{w0}' {r0[name]} and "
                        f"'{w1}' {r1[name]}"
                    )
        for m in MODELS:
            seen = self.client_counts[m.name]
            ok, fail = after[m.name][0] - before[m.name][0], after[m.name][1] - before[m.name][1]
            self.report.per_model[m.name] = {
                "client ok": seen["ok"],
                "client failed": seen["fail"],
                "stats success": ok,
                "stats fail": fail,
            }
            if (ok, fail) != (seen["ok"], seen["fail"]):
                self.report.violations.append(
                    f"statistics of {m.name} counted {ok} successes / {fail} failures; the "
                    f"clients saw {seen['ok']} / {seen['fail']}"
                )


def run(
    target: Target,
    duration: float,
    max_requests: int,
    http_threads: int = 4,
    grpc_threads: int = 4,
    kill_every: float = 0.5,
    reload_every: float = 2.0,
    seed: int = 1,
    client_timeout: float = 60.0,
    settle_timeout: float = 60.0,
) -> Report:
    """Traffic, kills and reloads against ``target`` for ``duration`` seconds or
    ``max_requests`` requests, whichever comes first; then the checks. The server must be
    serving ``MODELS`` (``write_models`` + ``SERVER_FLAGS``)."""
    r = _Run(target, seed, client_timeout)
    rep = r.report
    # warm-up on both protocols, then the baseline
    for proto in ("http", "grpc"):
        warm = _Run(target, seed, client_timeout)
        warm.client(proto, 0, 3 * len(MODELS))
        rep.violations += [f"warm-up: {v}" for v in warm.report.violations]
    rep.before = resources(target.pid)
    before_workers = len(workers(target.pid))
    stats0 = stats(target)
    t0 = time.monotonic()
    threads = [
        threading.Thread(target=r.client, args=(proto, i, max_requests), daemon=True)
        for i, proto in enumerate(["http"] * http_threads + ["grpc"] * grpc_threads)
    ]
    chaos = threading.Thread(target=r.chaos, args=(kill_every, reload_every), daemon=True)
    for t in [*threads, chaos]:
        t.start()
    r.stop.wait(duration)
    r.stop.set()
    for t in [*threads, chaos]:
        t.join(client_timeout + 30)
    rep.seconds = round(time.monotonic() - t0, 1)
    hung = [t.name for t in [*threads, chaos] if t.is_alive()]
    if hung:
        rep.violations.append(f"threads still waiting for an answer: {hung}")
    rep.requests = len(r.answers)
    sent = min(max_requests, next(r.ids) - 1)
    if rep.requests != sent - len(hung):
        rep.violations.append(f"{sent} requests sent, {rep.requests} answered")
    r.check_stats(stats0)

    # settle: every instance has its worker again, nothing left of the dead ones
    wait_for(lambda: not _leaks(target, rep.before, before_workers), settle_timeout)  # type: ignore[arg-type]
    rep.after = resources(target.pid)
    # a leak is what stays: the fd count and the segment list are two reads, and a segment
    # made or removed between them (a worker finishing its start) skews one sample by one
    leaks = _leaks(target, rep.before, before_workers)  # type: ignore[arg-type]
    if leaks:
        time.sleep(1.0)
        leaks = _leaks(target, rep.before, before_workers)  # type: ignore[arg-type]
    rep.violations += leaks
    return rep


def print_report(rep: Report, out: Any = sys.stdout) -> None:
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(
        f"chaos run: {rep.requests} requests in {rep.seconds}s, {rep.kills} workers killed, "
        f"{sum(rep.reloads.values())} reloads"
    )
    p(f"  {'outcome':<34}{'count':>8}")
    for k, n in sorted(rep.outcomes.items()):
        p(f"  {k:<34}{n:>8}")
    for k, n in sorted(rep.reloads.items()):
        p(f"  {'reload ' + k:<34}{n:>8}")
    p(f"  {'model':<16}{'client ok':>10}{'client fail':>12}{'stats ok':>10}{'stats fail':>11}")
    for name, row in rep.per_model.items():
        p(
            f"  {name:<16}{row['client ok']:>10}{row['client failed']:>12}"
            f"{row['stats success']:>10}{row['stats fail']:>11}"
        )
    if rep.before and rep.after:
        p(f"  before: {rep.before.row()}")
        p(f"  after:  {rep.after.row()}")
    p(f"  violations: {len(rep.violations)}")
    for v in rep.violations[:20]:
        p(f"    {v}")


# ---------------------------------------------------------------------------- the script


def _start_server(repo: Path, log: Path, port_file: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "sluice",
        "serve",
        f"--model-repository={repo}",
        "--http-port=0",
        "--grpc-port=0",
        "--metrics-port=0",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        f"--port-file={port_file}",
        *SERVER_FLAGS,
    ]
    return subprocess.Popen(
        cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--max-requests", type=int, default=200_000)
    ap.add_argument("--http-threads", type=int, default=4)
    ap.add_argument("--grpc-threads", type=int, default=4)
    ap.add_argument("--kill-every", type=float, default=0.5, help="seconds between kills (mean)")
    ap.add_argument("--reload-every", type=float, default=2.0, help="seconds between reloads")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the report here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sluice-chaos-"))
    repo = write_models(tmp / "repo")
    log, port_file = tmp / "server.log", tmp / "ports.json"
    proc = _start_server(repo, log, port_file)
    rc = 1
    try:
        if not wait_for(lambda: port_file.exists() or proc.poll() is not None, 120):
            raise RuntimeError("no port file after 120 s")
        ports = json.loads(port_file.read_text())
        target = Target(proc.pid, f"127.0.0.1:{ports['http']}", f"127.0.0.1:{ports['grpc']}", repo)

        def ready() -> bool:
            with contextlib.suppress(OSError):
                return _http_json(target.http, "/v2/health/ready", timeout=5)[0] == 200
            return False

        if not wait_for(ready, 120):
            raise RuntimeError(f"server not ready: {log.read_text()[-2000:]}")
        rep = run(
            target,
            args.duration,
            args.max_requests,
            args.http_threads,
            args.grpc_threads,
            args.kill_every,
            args.reload_every,
            args.seed,
        )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
    left = sorted(glob.glob(f"/dev/shm/sl{proc.pid}_*"))
    if proc.returncode != 0:
        rep.violations.append(f"server exit status {proc.returncode} after SIGTERM")
    if left:
        rep.violations.append(f"shm segments left after exit: {left}")
        for s in left:
            with contextlib.suppress(OSError):
                os.unlink(s)
    if "Traceback" in log.read_text(errors="replace"):
        rep.violations.append(f"a traceback in the server log ({log})")
    print_report(rep)
    print(f"  server log: {log}")
    if args.json:
        doc = {
            "ok": rep.ok,
            "requests": rep.requests,
            "seconds": rep.seconds,
            "outcomes": dict(rep.outcomes),
            "kills": rep.kills,
            "reloads": dict(rep.reloads),
            "per_model": rep.per_model,
            "before": vars(rep.before) if rep.before else None,
            "after": vars(rep.after) if rep.after else None,
            "violations": rep.violations,
        }
        args.json.write_text(json.dumps(doc, indent=2))
    rc = 0 if rep.ok else 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
