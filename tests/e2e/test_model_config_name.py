"""``--model-config-name=<name>``: each model's ``configs/<name>.pbtxt`` in place of its
config.pbtxt where it has one, else config.pbtxt (as Triton 2.51, checked: a model with neither
loads auto-completed), in every control mode, on reloads, and in ``sluice repo lint``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import error_text, index, post, wait_until
from tests.e2e.test_lint import lint, lint_json
from tests.zoo import IDENTITY_PY, identity, write_model


def _config(srv, name: str) -> dict:
    code, raw = srv.get(f"/v2/models/{name}/config")
    assert code == 200, raw
    return json.loads(raw)


def _alt(model_dir: Path, name: str, max_batch_size: int, tag: str = "alt") -> Path:
    """configs/<tag>.pbtxt of ``model_dir``: the identity model with another batch size."""
    (model_dir / "configs").mkdir(exist_ok=True)
    path = model_dir / "configs" / f"{tag}.pbtxt"
    path.write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
        'parameters { key: "from" value: { string_value: "' + tag + '" } }\n'
    )
    return path


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    _alt(identity(repo, "both"), "both", 4)  # config.pbtxt (8) and configs/alt.pbtxt (4)
    identity(repo, "plain")  # config.pbtxt only: falls back to it
    _alt(identity(repo, "other"), "other", 2, tag="h100")  # another name's file: not read
    write_model(repo, "bare", "", IDENTITY_PY)  # neither: auto-completed
    (repo / "bare" / "config.pbtxt").unlink()
    return repo


def test_named_config_else_config_pbtxt_at_start(tmp_path: Path, start_server) -> None:
    repo = _repo(tmp_path)
    srv = start_server(repo, "--model-config-name=alt")
    both = _config(srv, "both")
    assert both["max_batch_size"] == 4
    assert both["parameters"]["from"]["string_value"] == "alt"
    assert _config(srv, "plain")["max_batch_size"] == 8
    assert _config(srv, "other")["max_batch_size"] == 8
    bare = _config(srv, "bare")
    assert bare["max_batch_size"] == 0 and bare["backend"] == "python"
    assert [(e["name"], e["state"]) for e in index(srv)] == [
        ("bare", "READY"),
        ("both", "READY"),
        ("other", "READY"),
        ("plain", "READY"),
    ]
    assert "configs" not in "".join(ln for ln in srv.log().splitlines() if "ignoring" in ln)


def test_without_the_flag_configs_dir_is_not_read(tmp_path: Path, start_server) -> None:
    srv = start_server(_repo(tmp_path))
    assert _config(srv, "both")["max_batch_size"] == 8
    assert "from" not in _config(srv, "both").get("parameters", {})


def test_explicit_reload_follows_the_named_file(tmp_path: Path, start_server) -> None:
    repo = _repo(tmp_path)
    srv = start_server(repo, "--model-config-name=h100", "--model-control-mode=explicit")
    assert post(srv, "/v2/repository/models/other/load")[0] == 200
    assert _config(srv, "other")["max_batch_size"] == 2
    # a named file appearing for a model that had none: the next load reads it
    assert post(srv, "/v2/repository/models/plain/load")[0] == 200
    assert _config(srv, "plain")["max_batch_size"] == 8
    _alt(repo / "plain", "plain", 3, tag="h100")
    assert post(srv, "/v2/repository/models/plain/load")[0] == 200
    assert _config(srv, "plain")["max_batch_size"] == 3
    # a broken named file: the load fails naming that file; config.pbtxt is not used instead
    (repo / "plain" / "configs" / "h100.pbtxt").write_text("max_batch_size: [\n")
    code, raw = post(srv, "/v2/repository/models/plain/load")
    assert code == 400, raw
    assert f"{repo / 'plain' / 'configs' / 'h100.pbtxt'}:1:" in error_text(raw)
    assert _config(srv, "plain")["max_batch_size"] == 3  # the loaded version keeps serving


def test_poll_picks_up_a_new_named_file(tmp_path: Path, start_server) -> None:
    repo = _repo(tmp_path)
    srv = start_server(
        repo, "--model-config-name=alt", "--model-control-mode=poll", "--repository-poll-secs=0.2"
    )
    assert _config(srv, "plain")["max_batch_size"] == 8
    _alt(repo / "plain", "plain", 5)
    wait_until(
        lambda: _config(srv, "plain")["max_batch_size"] == 5,
        timeout=30,
        what="poll reloads plain with configs/alt.pbtxt",
    )
    (repo / "plain" / "configs" / "alt.pbtxt").unlink()  # gone again: back to config.pbtxt
    wait_until(
        lambda: _config(srv, "plain")["max_batch_size"] == 8,
        timeout=30,
        what="poll reloads plain with config.pbtxt",
    )


@pytest.mark.parametrize("bad", ["../x", "a/b", ".."])
def test_a_name_that_is_not_a_file_name_is_refused(tmp_path: Path, bad: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sluice", "serve", f"--model-repository={tmp_path}"]
        + [f"--model-config-name={bad}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert f"--model-config-name: '{bad}' is not a plain file name" in out.stderr


def test_lint_reads_the_named_config(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _alt(identity(repo, "m"), "m", 4)
    (repo / "m" / "configs" / "alt.pbtxt").write_text('name: "m"\nmax_batch_size: [\n')
    assert lint(repo).returncode == 0  # config.pbtxt is fine
    rc, found = lint_json(repo, "--model-config-name", "alt")
    assert rc == 1
    assert [(f["check"], f["file"], f["line"]) for f in found] == [
        ("config-parse", str(repo / "m" / "configs" / "alt.pbtxt"), 2)
    ]
    assert lint(repo, "--model-config-name", "other").returncode == 0  # falls back
