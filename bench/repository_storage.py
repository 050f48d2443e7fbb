"""A model repository in S3: time to READY and bytes downloaded, sluice against real Triton.

    .venv/bin/python bench/repository_storage.py [--mb 100] [--rounds 3] [--no-triton]

One python model (``big``: ``model.py`` and a ``--mb`` MB ``weights.bin`` of seeded random
float32s, which ``initialize`` reads whole; generated at run time) in a bucket of moto's S3
server (``tests/stores.py``). Each server is started with ``--model-control-mode=explicit
--load-model=big`` on ``s3://127.0.0.1:PORT/models/repo`` and measured in three cases:

- cold: a fresh start, an empty ``--repository-cache-dir``;
- warm: stopped and started again on the same cache (sluice: a cache hit);
- changed: while it runs, ``config.pbtxt`` is changed in the bucket (a parameter's value) and
  the model loaded again through ``POST /v2/repository/models/big/load``.

The time is from starting the process (cold, warm) or sending the load (changed) until the
model answers ready (cold, warm) or the load answers 200 (changed). For reference, "local" is
the same start on the model in a local directory. Each READY model is asked
once to infer and must answer with its weights' values, and after a change it must report the
new configuration. The bytes are counted twice: by a relay between the server and moto that
counts what moto sent (HTTP bodies and headers; the same measure for both servers), and, for
sluice, by its ``sluice_repository_download_bytes_total`` counter. Each round runs both servers,
alternating which goes first; the summary gives the medians. Triton (2.51, from the
nvidia-pytriton wheel: ``../shared/bench-peers/setup.sh``) has no download cache; it is
skipped with a message where it is not installed, and sluice is skipped where it has no
object-storage repositories (no ``--repository-cache-dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from tests.stores import S3Server  # noqa: E402

from servers import Server, free_port  # noqa: E402

PEERS_DIR = Path(os.environ.get("PEERS_DIR", "/tmp/peers"))
TRITONSERVER = PEERS_DIR / "bin" / "tritonserver"
MODEL = "big"
SEED = 7
READY_TIMEOUT_S = 300.0

CONFIG = """name: "big"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "revision" value {{ string_value: "{revision}" }} }}
"""

MODEL_PY = '''import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 + the first four weights; initialize reads the whole weights file."""

    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "weights.bin")
        self.weights = np.fromfile(path, dtype=np.float32)

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = (x + self.weights[:4]).astype(np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return out
'''


class CountingRelay:
    """A TCP relay from 127.0.0.1:``port`` to 127.0.0.1:``target`` that counts the bytes the
    target sends back (what a server downloaded, whatever its client library)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.down = 0
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while data := src.recv(1 << 20):
                dst.sendall(data)
                if count:
                    with self._lock:
                        self.down += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            for s in self._conns:
                s.close()


def size(n: float) -> str:
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def http(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=READY_TIMEOUT_S) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def wait_model_ready(srv: Server, t0: float) -> float:
    deadline = t0 + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if srv.proc.poll() is not None:
            raise RuntimeError(f"{srv.name} exited with {srv.proc.returncode}")
        if http(srv.http, "GET", f"/v2/models/{MODEL}/ready")[0] == 200:
            return time.monotonic() - t0
        time.sleep(0.05)
    raise TimeoutError(f"{srv.name}: {MODEL} not ready within {READY_TIMEOUT_S} s")


def check_serving(srv: Server, weights: np.ndarray, revision: int) -> None:
    """One inference with the expected answer, and the expected configuration."""
    x = [1.0, 2.0, 3.0, 4.0]
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": x}]}
    status, data = http(srv.http, "POST", f"/v2/models/{MODEL}/infer", json.dumps(body).encode())
    assert status == 200, (srv.name, status, data[:300])
    got = np.array(json.loads(data)["outputs"][0]["data"], np.float32)
    assert np.array_equal(got, np.array(x, np.float32) + weights[:4]), (srv.name, got)
    status, data = http(srv.http, "GET", f"/v2/models/{MODEL}/config")
    params = json.loads(data).get("parameters", {})
    assert params.get("revision", {}).get("string_value") == str(revision), (srv.name, params)


def sluice_downloaded(metrics_port: int) -> int | None:
    status, data = http(metrics_port, "GET", "/metrics")
    m = re.search(
        rb'^sluice_repository_download_bytes_total\{scheme="s3"\} ([0-9.e+]+)$', data, re.M
    )
    return int(float(m.group(1))) if status == 200 and m else None


def sluice_supports_s3() -> str | None:
    """None when this sluice serves object-storage repositories, else why not."""
    r = subprocess.run(
        [sys.executable, "-m", "sluice", "serve", "--help"], capture_output=True, text=True
    )
    if "--repository-cache-dir" not in r.stdout:
        return "this sluice has no object-storage repositories (no --repository-cache-dir)"
    try:
        import obstore  # noqa: F401
    except ImportError:
        return "obstore is not installed (pip install '.[storage]')"
    return None


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.revision = 1
        self.results: dict[tuple[str, str], list[tuple[float, int, int | None]]] = {}

    def setup(self) -> None:
        self.local = self.work / "local"  # the same model on disk: the floor
        local = self.local / MODEL
        (local / "1").mkdir(parents=True)
        n = self.args.mb * (1 << 20) // 4
        self.weights = np.random.default_rng(SEED).random(n, dtype=np.float32)
        self.weights.tofile(local / "1" / "weights.bin")
        (local / "1" / "model.py").write_text(MODEL_PY)
        (local / "config.pbtxt").write_text(CONFIG.format(revision=self.revision))
        self.s3 = S3Server(self.work / "s3").start()
        self.s3.upload_tree(local, f"repo/{MODEL}")
        self.relay = CountingRelay(self.s3.port)
        # the servers reach moto through the relay: the same bucket, a port that counts
        self.url = f"s3://127.0.0.1:{self.relay.port}/{self.s3.bucket}/repo"
        # both servers read the store's credentials from the environment they inherit
        os.environ.update(self.s3.env())

    def close(self) -> None:
        self.relay.close()
        self.s3.stop()

    def start(self, kind: str, cache: Path, repo: str = "") -> tuple[Server, int]:
        """The server on the bucket (or ``repo``), explicit mode, ``big`` loaded; and its
        metrics port."""
        http_port, grpc_port, metrics = free_port(), free_port(), free_port()
        if kind == "sluice":
            cmd = [sys.executable, "-m", "sluice", "serve", f"--repository-cache-dir={cache}"]
        else:  # Triton has no download cache
            cmd = [str(TRITONSERVER)]
        cmd += [
            f"--model-repository={repo or self.url}",
            "--model-control-mode=explicit",
            f"--load-model={MODEL}",
            f"--http-port={http_port}",
            f"--grpc-port={grpc_port}",
            f"--metrics-port={metrics}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
        ]
        return Server(kind, cmd, http_port, grpc_port, self.work / f"{kind}.log"), metrics

    def record(self, kind: str, case: str, secs: float, down: int, counted: int | None) -> None:
        self.results.setdefault((kind, case), []).append((secs, down, counted))
        extra = "" if counted is None else f", sluice counted {size(counted)}"
        print(
            f"  {kind:<7} {case:<8} {secs:7.2f} s  {size(down)} from the store{extra}",
            file=sys.stderr,
        )

    def run_server(self, kind: str) -> None:
        cache = self.work / f"cache-{kind}"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        for case in ("local", "cold", "warm"):
            before = self.relay.down
            t0 = time.monotonic()
            srv, metrics = self.start(kind, cache, str(self.local) if case == "local" else "")
            try:
                secs = wait_model_ready(srv, t0)
                down = self.relay.down - before
                counted = sluice_downloaded(metrics) if kind == "sluice" else None
                check_serving(srv, self.weights, 1 if case == "local" else self.revision)
                self.record(kind, case, secs, down, counted)
                if case == "warm":
                    self.change(kind, srv, metrics, counted)
            finally:
                srv.stop()

    def change(self, kind: str, srv: Server, metrics: int, counted_before: int | None) -> None:
        self.revision += 1
        self.s3.put(f"repo/{MODEL}/config.pbtxt", CONFIG.format(revision=self.revision).encode())
        before = self.relay.down
        t0 = time.monotonic()
        status, data = http(srv.http, "POST", f"/v2/repository/models/{MODEL}/load", b"")
        secs = time.monotonic() - t0
        assert status == 200, (kind, status, data[:300])
        down = self.relay.down - before
        counted = None
        if kind == "sluice":
            after = sluice_downloaded(metrics)
            counted = None if after is None or counted_before is None else after - counted_before
        check_serving(srv, self.weights, self.revision)
        self.record(kind, "changed", secs, down, counted)

    def summary(self) -> str:
        lines = [
            f"| server | case | time to READY, s (median of {self.args.rounds}) "
            "| downloaded from the store (relay) | sluice's counter |",
            "| --- | --- | --- | --- | --- |",
        ]
        for (kind, case), rows in self.results.items():
            secs = statistics.median(r[0] for r in rows)
            down = statistics.median(r[1] for r in rows)
            counted = [r[2] for r in rows if r[2] is not None]
            c = size(statistics.median(counted)) if counted else "-"
            lines.append(
                f"| {kind} | {case} | {secs:.2f} ({min(r[0] for r in rows):.2f}-"
                f"{max(r[0] for r in rows):.2f}) | {size(down)} | {c} |"
            )
        return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=100, help="size of the model's weights file")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-triton", action="store_true")
    args = p.parse_args()
    kinds = []
    why = sluice_supports_s3()
    if why:
        print(f"sluice skipped: {why}", file=sys.stderr)
    else:
        kinds.append("sluice")
    if args.no_triton:
        pass
    elif not TRITONSERVER.exists():
        print(
            f"Triton skipped: no {TRITONSERVER} (../shared/bench-peers/setup.sh)", file=sys.stderr
        )
    else:
        kinds.append("triton")
    if not kinds:
        print("nothing to measure", file=sys.stderr)
        return
    with tempfile.TemporaryDirectory(prefix="repo-storage-") as d:
        bench = Bench(args, Path(d))
        bench.setup()
        try:
            for r in range(args.rounds):
                print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
                for kind in kinds if r % 2 == 0 else kinds[::-1]:
                    bench.run_server(kind)
        finally:
            bench.close()
        print(bench.summary())


if __name__ == "__main__":
    main()
