"""``sluice repo lint`` as a process: each of the seed's pitfalls in a generated repository,
found with the model, the file and what to do; exit status 1 on errors, 0 with warnings only,
2 for a path that is not a directory; ``--format json`` for CI; the examples are clean."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.e2e.test_backends_onnxruntime import write_tiny_onnx
from tests.zoo import EXAMPLES, IDENTITY_PY, identity, write_model


def lint(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice", "repo", "lint", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def lint_json(*args: str | Path) -> tuple[int, list[dict[str, Any]]]:
    out = lint(*args, "--format", "json")
    found = json.loads(out.stdout)
    # exit 1 exactly when a finding is an error, 0 otherwise (warnings alone pass)
    errors = any(f["severity"] == "error" for f in found)
    assert out.returncode == (1 if errors else 0), (out.returncode, out.stderr, found)
    return out.returncode, found


def pick(findings: list[dict[str, Any]], model: str, check: str) -> list[dict[str, Any]]:
    return [f for f in findings if f["model"] == model and f["check"] == check]


def config(repo: Path, name: str, text: str) -> None:
    (repo / name).mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(text))


SEED_RESNET = """
name: "resnet50"
platform: "tensorrt_plan"
max_batch_size: 8
input [{ name: "input" data_type: TYPE_FP32 dims: [3, 224, 224] }]
output [{ name: "output" data_type: TYPE_FP32 dims: [1000] }]
instance_group [{ kind: KIND_GPU count: 2 }]
dynamic_batching {
  preferred_batch_size: [4, 8]
  max_queue_delay_microseconds: 2000
}
"""


@pytest.fixture(scope="module")
def pitfalls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One repository holding every pitfall, one model each."""
    repo = tmp_path_factory.mktemp("lint") / "model_repo"
    repo.mkdir()
    # the seed's own mistake: model.plan at the model root, no version directory
    config(repo, "resnet50", SEED_RESNET)
    (repo / "resnet50" / "model.plan").write_bytes(b"ftrt" + bytes(60))
    # version directories that are not numbers, beside a real one / with none at all
    identity(repo, "named_versions")
    (repo / "named_versions" / "v2").mkdir()
    (repo / "named_versions" / "latest").mkdir()
    (repo / "named_versions" / "model.py").write_text(IDENTITY_PY)  # stray root copy
    config(repo, "no_versions", 'backend: "python"\n')
    (repo / "no_versions" / "v1").mkdir()
    # a config that does not parse (line 4, the misspelt field)
    write_model(
        repo,
        "broken",
        """\
        name: "broken"
        backend: "python"
        input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
        output [ { name: "OUTPUT0", data_type: TYPE_FP32, dimz: [ 1 ] } ]
        """,
        IDENTITY_PY,
    )
    # name unlike the directory
    identity(repo, "renamed")
    text = (repo / "renamed" / "config.pbtxt").read_text()
    (repo / "renamed" / "config.pbtxt").write_text(text.replace('"renamed"', '"resnet"'))
    # a missing model file; an unknown backend
    config(repo, "no_file", 'backend: "python"\nmax_batch_size: 0\n')
    (repo / "no_file" / "1").mkdir()
    (repo / "no_file" / "1" / "model.onnx").write_bytes(b"x")
    config(repo, "tf", 'platform: "tensorflow_savedmodel"\n')
    (repo / "tf" / "1" / "model.savedmodel").mkdir(parents=True)
    # dynamic_batching with max_batch_size 0; preferred batch size above max_batch_size
    identity(repo, "nobatch", max_batch_size=0, dims="[ 4 ]", extra="dynamic_batching { }")
    identity(repo, "preferred", extra="dynamic_batching { preferred_batch_size: [ 4, 16 ] }")
    # dims with the batch dimension: exact against an ONNX graph, a heuristic for python
    write_tiny_onnx(repo / "onnx_batch_dims" / "1" / "model.onnx")
    config(
        repo,
        "onnx_batch_dims",
        """
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [ { name: "x", data_type: TYPE_FP32, dims: [ -1, 4 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ 3 ] } ]
        """,
    )
    identity(repo, "py_batch_dims", dims="[ 8, 3, 224, 224 ]")
    # a queue delay that dominates p99
    identity(repo, "slow_queue", extra="dynamic_batching { max_queue_delay_microseconds: 200000 }")
    # KIND_GPU (this machine has none: the test below checks it)
    identity(repo, "gpu_model", extra="instance_group [ { kind: KIND_GPU, count: 1 } ]")
    # instance count x model size above the memory (--memory 1M below)
    write_tiny_onnx(repo / "big" / "1" / "model.onnx", n_in=256, n_out=256)
    config(
        repo,
        "big",
        """
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [ { name: "x", data_type: TYPE_FP32, dims: [ 256 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ 256 ] } ]
        instance_group [ { kind: KIND_CPU, count: 8 } ]
        """,
    )
    # TensorRT plans: an ONNX file renamed, an export with a metadata prefix, a real header
    plan_cfg = SEED_RESNET.replace("KIND_GPU", "KIND_CPU")
    for name, data in (
        ("plan_not_trt", (repo / "big" / "1" / "model.onnx").read_bytes()),
        ("plan_prefixed", struct.pack("<I", 12) + b'{"imgsz": 1}' + b"ftrt" + bytes(60)),
        ("plan_ok_header", b"ftrt" + bytes(60)),
    ):
        config(repo, name, plan_cfg.replace('"resnet50"', f'"{name}"'))
        (repo / name / "1").mkdir()
        (repo / name / "1" / "model.plan").write_bytes(data)
    return repo


def test_every_pitfall_found_with_model_file_and_advice(pitfalls: Path) -> None:
    if Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has a GPU: KIND_GPU is not a finding here")
    rc, found = lint_json(pitfalls, "--memory", "1M")
    assert rc == 1
    models = {f["model"] for f in found}
    assert "add_sub" not in models

    (root,) = pick(found, "resnet50", "model-at-root")
    assert root["severity"] == "error"
    assert root["file"] == str(pitfalls / "resnet50" / "model.plan")
    assert (
        f"mv {pitfalls / 'resnet50' / 'model.plan'} {pitfalls / 'resnet50' / '1'}"
        in (root["message"])
    )
    (gpu,) = pick(found, "resnet50", "kind-gpu")
    assert gpu["severity"] == "error" and "KIND_CPU" in gpu["message"]

    named = pick(found, "named_versions", "version-dirs")
    assert {Path(f["file"]).name for f in named} == {"v2", "latest"}
    assert all(f["severity"] == "warning" and "rename" in f["message"] for f in named)
    (stray,) = pick(found, "named_versions", "model-at-root")
    assert stray["severity"] == "warning" and "never loaded" in stray["message"]
    none = pick(found, "no_versions", "version-dirs")
    assert {f["severity"] for f in none} == {"warning", "error"}
    assert any("no version directory" in f["message"] for f in none)

    (parse,) = pick(found, "broken", "config-parse")
    assert parse["severity"] == "error"
    assert parse["file"] == str(pitfalls / "broken" / "config.pbtxt")
    assert parse["line"] == 4 and parse["column"] > 0
    assert '"dimz"' in parse["message"]

    (name,) = pick(found, "renamed", "name")
    assert "directory name must equal model name" in name["message"]  # Triton's phrase
    assert 'set name: "renamed"' in name["message"]

    (missing,) = pick(found, "no_file", "model-file")
    assert missing["file"] == str(pitfalls / "no_file" / "1" / "model.py")
    assert "model.onnx" in missing["message"] and "default_model_filename" in missing["message"]
    (backend,) = pick(found, "tf", "backend")
    assert "unknown backend 'tensorflow'" in backend["message"]

    (nobatch,) = pick(found, "nobatch", "dynamic-batching")
    assert nobatch["severity"] == "warning" and "max_batch_size: 0" in nobatch["message"]
    (preferred,) = pick(found, "preferred", "dynamic-batching")
    assert preferred["severity"] == "error"
    assert "dynamic batching preferred size must be <= max batch size" in preferred["message"]

    (exact,) = pick(found, "onnx_batch_dims", "dims-batch")
    assert exact["severity"] == "error"
    assert "[N, 4]" in exact["message"] and "write dims: [4]" in exact["message"]
    guesses = pick(found, "py_batch_dims", "dims-batch")  # INPUT0 and OUTPUT0
    assert len(guesses) == 2
    for guess in guesses:
        assert guess["severity"] == "warning" and "write dims: [3, 224, 224]" in guess["message"]

    (delay,) = pick(found, "slow_queue", "queue-delay")
    assert delay["severity"] == "warning" and "200 ms" in delay["message"]
    (kind,) = pick(found, "gpu_model", "kind-gpu")
    assert kind["severity"] == "error"

    (mem,) = pick(found, "big", "memory")
    assert mem["severity"] == "error"
    assert "8 instance(s)" in mem["message"] and "--memory" in mem["message"]

    (not_trt,) = pick(found, "plan_not_trt", "tensorrt-plan")
    assert not_trt["severity"] == "error" and "'ftrt'" in not_trt["message"]
    (prefixed,) = pick(found, "plan_prefixed", "tensorrt-plan")
    assert prefixed["severity"] == "error" and "strip the first 16 bytes" in prefixed["message"]
    (unchecked,) = pick(found, "plan_ok_header", "tensorrt-plan")
    assert unchecked["severity"] == "warning" and "not checked here" in unchecked["message"]


def test_text_format_one_line_per_finding(pitfalls: Path) -> None:
    out = lint(pitfalls, "--memory", "64G")
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    summary = lines[-1]
    assert "model(s)" in summary and "error" in summary and "warning" in summary
    body = lines[:-1]
    assert all(line.split(" ", 1)[0] in ("ERROR", "WARNING") for line in body)
    errors = [line for line in body if line.startswith("ERROR")]
    assert body[: len(errors)] == errors  # errors first
    # one line per finding: the same findings as the JSON format, severity by severity
    _, found = lint_json(pitfalls, "--memory", "64G")
    assert len(errors) == sum(f["severity"] == "error" for f in found)
    assert len(body) - len(errors) == sum(f["severity"] == "warning" for f in found)
    conf = pitfalls / "broken" / "config.pbtxt"
    assert any(line.startswith(f"ERROR broken {conf}:4:") for line in body)
    assert f"WARNING slow_queue {pitfalls / 'slow_queue' / 'config.pbtxt'}: " in out.stdout
    assert not any(" big " in line and "memory" in line for line in body)  # 64G: it fits


def test_latency_budget_turns_the_queue_delay_into_an_error(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    identity(repo, "m", extra="dynamic_batching { max_queue_delay_microseconds: 6000 }")
    assert lint(repo).returncode == 0  # 6 ms: below the default 10 ms
    rc, found = lint_json(repo, "--latency-budget-ms", "10")
    assert rc == 0 and [f["severity"] for f in found] == ["warning"]
    rc, found = lint_json(repo, "--latency-budget-ms", "5")
    assert rc == 1 and found[0]["check"] == "queue-delay"
    assert "at most 2500" in found[0]["message"]


def test_warnings_alone_exit_0_and_gpu_flag(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    identity(repo, "m", extra="instance_group [ { kind: KIND_GPU, count: 1 } ]")
    (repo / "m" / "old").mkdir()
    out = lint(repo, "--gpu")
    assert out.returncode == 0, out.stdout
    assert out.stdout.startswith(f"WARNING m {repo / 'm' / 'old'}: ")
    assert "0 errors, 1 warning" in out.stdout
    assert lint(repo, "--no-gpu").returncode == 1


def test_auto_complete_and_disable(tmp_path: Path) -> None:
    """A graph-only ONNX model lints clean (auto-complete fills the config, as at load);
    with --disable-auto-complete-config the missing inputs are an error, as at load."""
    repo = tmp_path / "repo"
    write_tiny_onnx(repo / "auto" / "1" / "model.onnx")
    assert lint(repo).returncode == 0
    rc, found = lint_json(repo, "--disable-auto-complete-config")
    assert rc == 1 and found[0]["check"] == "config-vs-model"
    assert "does not declare" in found[0]["message"]


def test_json_shape_and_bad_path(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    identity(repo, "m", max_batch_size=0, dims="[ 4 ]", extra="dynamic_batching { }")
    out = lint(repo, "--format", "json")
    assert out.returncode == 0
    (finding,) = json.loads(out.stdout)
    assert set(finding) == {"severity", "model", "file", "message", "check", "line", "column"}
    assert finding["severity"] == "warning" and finding["model"] == "m"
    assert "1 model(s), 0 errors, 1 warning" in out.stderr
    bad = lint(tmp_path / "nope")
    assert bad.returncode == 2 and "is not a directory" in bad.stderr


def test_examples_repository_is_clean() -> None:
    if (
        not (EXAMPLES / "resnet50" / "1" / "model.onnx").exists()
        or not (EXAMPLES / "torch_linear" / "1" / "model.pt").exists()
    ):
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_models.py")], check=True)
    out = lint(EXAMPLES)
    assert out.returncode == 0, out.stdout
    assert out.stdout.splitlines()[0].endswith("no findings") or "no findings" in out.stdout
    rc, found = lint_json(EXAMPLES)
    assert rc == 0 and found == []
