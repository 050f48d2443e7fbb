"""The perf tool's libraries (matplotlib, tqdm, hyperframe, hpack) are the ``perf`` extra: the
server imports none of them and serves without them; ``sluice perf`` / ``sluice tune`` without
them exit 2 with one line naming the extra.

Absence is simulated in a fresh interpreter by a ``sitecustomize`` on PYTHONPATH that puts a
finder refusing those modules first on ``sys.meta_path`` (it reaches the model workers too).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.e2e.helpers import infer_fp32
from tests.zoo import identity

EXTRA = ("matplotlib", "tqdm", "hyperframe", "hpack")
BLOCKER = textwrap.dedent(
    f"""
    import sys

    BLOCKED = {EXTRA!r}


    class _Absent:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None


    sys.meta_path.insert(0, _Absent())
    """
)


@pytest.fixture
def without_extra(tmp_path: Path) -> dict[str, str]:
    """The environment of a process in which the perf extra cannot be imported."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def test_the_server_import_graph_has_none_of_the_perf_extra() -> None:
    code = (
        "import sys\n"
        "import sluice.cli, sluice.server\n"
        "import sluice.frontends.http_api, sluice.frontends.grpc_api\n"
        "sluice.cli.build_parser()\n"  # every sub-command's flags, perf and tune included
        f"print(sorted(m for m in {EXTRA!r} if m in sys.modules))\n"
    )
    out = _run(["-c", code], {})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_serve_help_runs_without_the_extra(without_extra: dict[str, str]) -> None:
    out = _run(["-m", "sluice", "serve", "--help"], without_extra)
    assert out.returncode == 0, out.stderr
    assert "--model-repository" in out.stdout


def test_the_server_serves_without_the_extra(
    start_server, tmp_path: Path, without_extra: dict[str, str]
) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    repo.mkdir()
    identity(repo, "identity")
    srv = start_server(repo, env=without_extra)
    code, body = infer_fp32(srv, "identity", 2.5)
    assert code == 200, body
    assert body["outputs"][0]["data"] == [2.5]


@pytest.mark.parametrize("command", ["perf", "tune"])
def test_perf_tools_without_the_extra_name_it(command: str, without_extra: dict[str, str]) -> None:
    extra_flags = ["--latency-budget-ms", "10"] if command == "tune" else []
    out = _run(
        ["-m", "sluice", command, "-m", "m", "-u", "127.0.0.1:1", *extra_flags], without_extra
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines == [
        f"error: sluice {command} needs the perf extra: pip install 'sluice[perf]' "
        "(missing: matplotlib, tqdm, hyperframe, hpack)"
    ]
    assert out.stdout == ""
