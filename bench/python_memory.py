"""Start-up time and memory of N python models (one instance each): sluice against real Triton.

    python bench/python_memory.py                        # N = 10 and 100, both servers
    python bench/python_memory.py --counts 100 --servers sluice --sluice-flag \\
        --backend-config=python,worker-start=spawn      # the old start, for comparison
    python bench/python_memory.py --json out.json

For each N it writes a repository of N copies of a small numpy model (``add_sub``: OUTPUT0 =
INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, FP32 [4], dynamic batching, one KIND_CPU
instance), then starts each server on it in turn (one at a time: they would share the
machine's memory and CPU) with ``--model-control-mode=explicit --load-model=*``, and measures:

- READY: seconds from the server's start until ``/v2/health/ready`` answers 200 (both
  servers are strict: every loaded model ready) and the repository index lists all N models
  READY;
- PSS: the sum of ``Pss`` in ``/proc/<pid>/smaps_rollup`` over the server and every process
  under it (workers, Triton's stubs, sluice's fork server and multiprocessing's resource
  tracker), read ``--settle`` seconds after READY, then again after one request to every
  model (a model that served has touched more of its pages);
- CPU s to READY: user + system seconds of that process tree until READY (what the start
  costs, whatever else the machine runs meanwhile);
- per instance: PSS / N, and the ratio sluice / Triton of each figure.

Every server it starts it stops by its PID (SIGTERM, then SIGKILL to its process group after
30 s). Needs ``/tmp/peers`` (``/work/shared/bench-peers/setup.sh``) for Triton.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import tritonclient.http as httpclient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import Server, free_port, start_sluice  # noqa: E402
from vs_triton import peers_numpy  # noqa: E402

PEERS_DIR = Path(os.environ.get("PEERS_DIR", "/tmp/peers"))
TRITON = PEERS_DIR / "bin" / "tritonserver"

MODEL_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                        pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32)),
                    ]
                )
            )
        return responses
"""

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 8
input [
  {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }},
  {{ name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }}
]
output [
  {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }},
  {{ name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] }}
]
dynamic_batching {{ max_queue_delay_microseconds: 500 }}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""


def write_repo(root: Path, n: int) -> Path:
    repo = root / f"repo{n}"
    for i in range(1, n + 1):
        d = repo / f"pm{i}"
        (d / "1").mkdir(parents=True)
        (d / "1" / "model.py").write_text(MODEL_PY)
        (d / "config.pbtxt").write_text(CONFIG.format(name=f"pm{i}"))
    return repo


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def pss_kib(pid: int) -> int:
    """``Pss`` of one process (KiB); 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_pss(pid: int) -> dict[str, Any]:
    """PSS (MiB) of the server and of everything under it, by kind of process."""
    kinds: dict[str, list[float]] = {}
    for p in tree(pid):
        try:
            name = p.name()
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if p.pid == pid:
            kind = "server"
        elif name == "sluice-forksrv":
            kind = "fork server"
        elif "resource_tracker" in cmd:
            kind = "resource tracker"
        else:
            kind = "workers"
        kinds.setdefault(kind, []).append(pss_kib(p.pid) / 1024)
    total = sum(sum(v) for v in kinds.values())
    return {
        "total_mib": round(total, 1),
        "processes": sum(len(v) for v in kinds.values()),
        "by_kind": {k: {"n": len(v), "mib": round(sum(v), 1)} for k, v in kinds.items()},
    }


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) the server and everything under it have used, those
    processes that have exited and been reaped included."""
    total = 0.0
    for p in tree(pid):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def all_ready(port: int, n: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as r:
            if r.status != 200:
                return False
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v2/repository/index", data=b"{}", method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            index = json.loads(r.read())
    except OSError:
        return False
    return sum(1 for m in index if m.get("state") == "READY") == n


def infer_each(port: int, n: int) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    for i in range(1, n + 1):
        inputs = [httpclient.InferInput("INPUT0", [1, 4], "FP32")]
        inputs.append(httpclient.InferInput("INPUT1", [1, 4], "FP32"))
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        out = client.infer(f"pm{i}", inputs).as_numpy("OUTPUT0")
        assert out.tolist() == [[0.0, 2.0, 4.0, 6.0]], out
    client.close()


def start_triton(repo: Path, log: Path) -> Server:
    http, grpc, metrics = free_port(), free_port(), free_port()
    cmd = [
        str(TRITON),
        f"--model-repository={repo}",
        "--model-control-mode=explicit",
        "--load-model=*",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
    ]
    return Server("triton", cmd, http, grpc, log)


def measure(name: str, repo: Path, n: int, args: argparse.Namespace, work: Path) -> dict:
    log = work / f"{name}-{n}.log"
    t0 = time.monotonic()
    if name == "sluice":
        flags = ["--model-control-mode=explicit", "--load-model=*", *args.sluice_flag]
        numpy_dir = peers_numpy(work / "numpy")  # Triton's stub's numpy, as vs_triton
        env = {"PYTHONPATH": str(numpy_dir)} if numpy_dir else None
        srv = start_sluice(repo, log, *flags, env=env)
    else:
        srv = start_triton(repo, log)
    try:
        deadline = t0 + args.timeout
        while not all_ready(srv.http, n):
            if srv.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {srv.proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: {n} models not READY after {args.timeout}s")
            time.sleep(0.05)
        ready_s = time.monotonic() - t0
        cpu_s = tree_cpu(srv.proc.pid)
        time.sleep(args.settle)
        idle = tree_pss(srv.proc.pid)
        infer_each(srv.http, n)
        time.sleep(args.settle)
        served = tree_pss(srv.proc.pid)
    finally:
        srv.stop()
    return {
        "server": name,
        "n": n,
        "ready_s": round(ready_s, 2),
        "cpu_s": round(cpu_s, 2),
        "idle": idle,
        "served": served,
    }


def table(rows: list[dict]) -> str:
    out = [
        "| N | server | READY s | CPU s to READY | PSS MB (ready) | per instance "
        "| PSS MB (after 1 request each) | per instance | processes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["server"], r["n"]): r for r in rows}
    for r in rows:
        n = r["n"]
        out.append(
            f"| {n} | {r['server']} | {r['ready_s']:.1f} | {r['cpu_s']:.1f} | "
            f"{r['idle']['total_mib']:,.0f} | "
            f"{r['idle']['total_mib'] / n:.1f} | {r['served']['total_mib']:,.0f} | "
            f"{r['served']['total_mib'] / n:.1f} | {r['served']['processes']} |"
        )
    for n in sorted({r["n"] for r in rows}):
        s, t = by.get(("sluice", n)), by.get(("triton", n))
        if s and t:
            out.append(
                f"| {n} | **sluice / Triton** | {s['ready_s'] / t['ready_s']:.2f} | "
                f"{s['cpu_s'] / t['cpu_s']:.2f} | "
                f"{s['idle']['total_mib'] / t['idle']['total_mib']:.2f} | | "
                f"{s['served']['total_mib'] / t['served']['total_mib']:.2f} | | |"
            )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="10,100", help="numbers of models (comma-separated)")
    ap.add_argument("--servers", default="sluice,triton")
    ap.add_argument("--sluice-flag", action="append", default=[], help="extra sluice flag")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds before reading PSS")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to READY at most")
    ap.add_argument("--json", type=Path, help="write the measurements here")
    args = ap.parse_args()
    servers = args.servers.split(",")
    if "triton" in servers and not TRITON.exists():
        print(f"no {TRITON}: run /work/shared/bench-peers/setup.sh", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="python-memory-") as tmp:
        work = Path(tmp)
        for n in (int(c) for c in args.counts.split(",")):
            repo = write_repo(work, n)
            for name in servers:
                row = measure(name, repo, n, args, work)
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(textwrap.dedent(table(rows)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
