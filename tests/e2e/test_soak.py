"""The soak (``bench/soak.py``), shortened for CI.

Mixed HTTP and gRPC load (tritonclient) with reloads, worker kills and bad requests, then
SIGTERM with requests in flight; the script checks itself and writes its report. Here: ~12 s
of load with a reload every 2 s and a worker kill every 2.5 s (``SOAK_SECONDS`` overrides); by
hand, the default is 10 minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SECONDS = float(os.environ.get("SOAK_SECONDS", "12"))


@pytest.mark.grpc
@pytest.mark.timeout(300)
def test_soak(tmp_path: Path) -> None:
    report_path = tmp_path / "soak.json"
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "soak.py"),
            f"--duration={SECONDS}",
            f"--json={report_path}",
            "--reload-every=2",
            "--kill-every=2.5",
        ],
        capture_output=True,
        timeout=SECONDS + 240,
        cwd=ROOT,
    )
    assert report_path.exists(), out.stdout.decode()[-3000:] + out.stderr.decode()[-3000:]
    report = json.loads(report_path.read_text())
    counts = report["counts"]
    print(json.dumps({k: report[k] for k in ("counts", "first", "last", "drain")}, indent=1))
    failed = {k: v for k, v in report["checks"].items() if not v}
    assert report["ok"] and out.returncode == 0, (failed, report.get("unexpected"))
    # it really did what it says: load on both protocols, reloads and kills while serving (a
    # reload on a busy machine can take seconds, which delays the next), bad requests
    assert counts["http ok"] >= 10 and counts["grpc ok"] >= 10, counts
    assert counts["reloads"] >= 2 and counts["workers killed"] >= 2, counts
    assert counts["bad http answered 4xx"] >= 10, counts
    assert counts["bad grpc answered INVALID_ARGUMENT/NOT_FOUND"] >= 10, counts
    assert report["drain"]["answered_200"] == report["drain"]["in_flight_at_sigterm"] > 0
