"""``EXECUTION_ENV_PATH``: a python model's workers run under an environment of its own.

The environments are real ones built here: ``python -m venv`` of the server's base
interpreter, with a package the server's environment lacks (``envmark``) and numpy reached
through a ``.pth`` file (a directory holding links to the server's numpy: copying 70 MB would
make the test slow, and the worker only needs the import to work). The archive is packed from
a build directory that is then deleted, so a served model proves the environment was
unpacked and pointed at where it is now (``VIRTUAL_ENV``), not where it was built.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient

from tests import zoo
from tests.e2e.helpers import http_client, post, wait_until

ENV_PY = """
import json
import os
import sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        try:
            import envmark
            mark = envmark.VALUE
        except ImportError as exc:
            mark = repr(exc)
        info = {
            "mark": mark,
            "virtual_env": os.environ.get("VIRTUAL_ENV"),
            "path0": os.environ["PATH"].split(os.pathsep)[0],
            "executable": sys.executable,
            "prefix": sys.prefix,
            "pythonhome": os.environ.get("PYTHONHOME"),
            "pid": os.getpid(),
        }
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            info_t = pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=object))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2), info_t]))
        return out
"""


# auto_complete_config runs under the environment too: it adds INFO only if envmark imports
AUTO_PY = (
    ENV_PY
    + """
    @staticmethod
    def auto_complete_config(config):
        import envmark  # only the environment has it

        config.add_output({"name": "INFO", "data_type": "TYPE_STRING", "dims": [1]})
        return config
"""
)


def _config(name: str, env_path: str | None, count: int = 1, info: bool = True) -> str:
    param = (
        f'parameters {{ key: "EXECUTION_ENV_PATH" value {{ string_value: "{env_path}" }} }}'
        if env_path is not None
        else ""
    )
    info_out = ', { name: "INFO", data_type: TYPE_STRING, dims: [ 1 ] }' if info else ""
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 2 ] }} ]
        output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 2 ] }}{info_out} ]
        instance_group [ {{ kind: KIND_CPU, count: {count} }} ]
        {param}
        """


def _base_python() -> str:
    return str(getattr(sys, "_base_executable", None) or sys.executable)


def _venv(path: Path, python: str | None = None, numpy_dir: Path | None = None) -> Path:
    """A real venv (no pip: seconds matter) with ``envmark``; numpy through a .pth file."""
    subprocess.run([python or _base_python(), "-m", "venv", "--without-pip", str(path)], check=True)
    (site,) = path.glob("lib/python3.*/site-packages")
    (site / "envmark").mkdir()
    (site / "envmark" / "__init__.py").write_text('VALUE = "from-the-env"\n')
    if numpy_dir is not None:
        (site / "server_numpy.pth").write_text(f"{numpy_dir}\n")
    return path


def _numpy_dir(base: Path) -> Path:
    """A directory holding only links to the server's numpy (and its bundled libraries)."""
    here = Path(np.__file__).resolve().parent
    d = base / "numpy-only"
    d.mkdir()
    (d / "numpy").symlink_to(here, target_is_directory=True)
    libs = here.parent / "numpy.libs"
    if libs.is_dir():
        (d / "numpy.libs").symlink_to(libs, target_is_directory=True)
    return d


def _pack(env_dir: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(env_dir, arcname=".")
    return archive


def _info(srv: Any, model: str) -> dict[str, Any]:
    client = http_client(srv)
    i = httpclient.InferInput("IN", [2], "FP32")
    i.set_data_from_numpy(np.array([1.5, 2.0], np.float32))
    r = client.infer(model, [i])
    np.testing.assert_array_equal(r.as_numpy("OUT"), np.array([3.0, 4.0], np.float32))
    client.close()
    return dict(json.loads(r.as_numpy("INFO")[0]))


def _unpacked_dirs(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.is_dir() and not p.name.startswith("sluice-src"))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("envs")
    numpy_dir = _numpy_dir(base)
    build = _venv(base / "build" / "venv", numpy_dir=numpy_dir)
    archive = _pack(build, base / "env.tar.gz")
    subprocess.run(["rm", "-rf", str(base / "build")], check=True)  # only the archive is left
    return {
        "base": base,
        "numpy_dir": numpy_dir,
        "archive": archive,
        "dir_env": _venv(base / "unpacked-venv", numpy_dir=numpy_dir),
        "no_numpy": _venv(base / "no-numpy-venv"),
    }


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, built: dict[str, Path]) -> Path:
    repo = tmp_path_factory.mktemp("env-repo") / "repo"
    repo.mkdir()
    # three models, four instances, one archive (two copies of it): unpacked once
    mdir = zoo.write_model(
        repo, "env_tar", _config("env_tar", "$$TRITON_MODEL_DIRECTORY/env.tar.gz", 2), ENV_PY
    )
    (mdir / "env.tar.gz").write_bytes(built["archive"].read_bytes())
    zoo.write_model(repo, "env_tar_b", _config("env_tar_b", str(built["archive"])), ENV_PY)
    zoo.write_model(repo, "env_dir", _config("env_dir", str(built["dir_env"])), ENV_PY)
    zoo.write_model(repo, "plain", _config("plain", None), ENV_PY)
    zoo.write_model(
        repo, "env_auto", _config("env_auto", str(built["archive"]), info=False), AUTO_PY
    )
    return repo


def _serve(start: Any, repo: Path, cache: Path, *models: str) -> Any:
    return start(
        repo,
        "--model-control-mode=explicit",
        *(f"--load-model={m}" for m in models),
        f"--backend-config=python,execution-env-cache={cache}",
    )


def test_archive_unpacked_once_and_reused_across_restarts(
    start_server: Any, repo: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    srv = _serve(start_server, repo, cache, "env_tar", "env_tar_b", "env_dir", "plain", "env_auto")
    (unpacked,) = _unpacked_dirs(cache)  # 3 instances of 2 models loaded together: one copy
    assert not list(cache.glob(".*.*")), list(cache.iterdir())  # no partial unpacking left
    for model in ("env_tar", "env_tar_b"):
        info = _info(srv, model)
        assert info["mark"] == "from-the-env"
        # activate's effect, for where the environment is now (it was built elsewhere)
        assert info["virtual_env"] == str(unpacked)
        assert info["path0"] == str(unpacked / "bin")
        assert info["prefix"] == str(unpacked)
        assert info["executable"] == str(unpacked / "bin" / "python3")
        assert info["pythonhome"] is None
    # auto_complete_config ran under the environment (it imports envmark to add INFO)
    assert _info(srv, "env_auto")["virtual_env"] == str(unpacked)
    # a worker that dies is replaced under the same environment
    before = _info(srv, "env_tar_b")
    os.kill(before["pid"], signal.SIGKILL)
    wait_until(lambda: not psutil.pid_exists(before["pid"]), what="the worker to die")
    after_kill = _info(srv, "env_tar_b")
    assert after_kill["pid"] != before["pid"]
    assert after_kill["virtual_env"] == str(unpacked)
    assert after_kill["mark"] == "from-the-env"
    marker = unpacked / ".sluice-unpacked"
    first = marker.stat()
    assert srv.stop() == 0

    again = _serve(start_server, repo, cache, "env_tar")
    assert _unpacked_dirs(cache) == [unpacked]
    after = marker.stat()  # the same copy, not unpacked again
    assert (after.st_ino, after.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    assert _info(again, "env_tar")["virtual_env"] == str(unpacked)


def test_directory_environment_is_used_in_place(
    start_server: Any, repo: Path, built: dict[str, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    srv = _serve(start_server, repo, cache, "env_dir", "plain")
    info = _info(srv, "env_dir")
    env_dir = built["dir_env"].resolve()
    assert info["mark"] == "from-the-env"
    assert info["virtual_env"] == str(env_dir)
    assert info["prefix"] == str(env_dir)
    assert not cache.exists() or _unpacked_dirs(cache) == []  # nothing unpacked for it
    # a model without EXECUTION_ENV_PATH runs under the server's own interpreter
    plain = _info(srv, "plain")
    assert plain["mark"] == "ModuleNotFoundError(\"No module named 'envmark'\")"
    assert plain["prefix"] == sys.prefix


def test_half_unpacked_leftover_is_never_used(
    start_server: Any, repo: Path, built: dict[str, Path], tmp_path: Path
) -> None:
    import hashlib

    cache = tmp_path / "cache"
    digest = hashlib.sha256(built["archive"].read_bytes()).hexdigest()[:32]
    # what a server killed while unpacking leaves: a partial copy, and one already renamed
    # into place without its completion marker
    stale = cache / f".{digest}.999.1"
    (stale / "bin").mkdir(parents=True)
    (cache / digest / "bin").mkdir(parents=True)
    (cache / digest / "bin" / "python3").write_text("#!/bin/sh\nexit 3\n")
    srv = _serve(start_server, repo, cache, "env_tar_b")
    assert _info(srv, "env_tar_b")["virtual_env"] == str(cache / digest)
    assert not stale.exists()
    assert (cache / digest / ".sluice-unpacked").is_file()


def _refused(start: Any, tmp_path: Path, env_path: str, *flags: str) -> tuple[int, str]:
    repo = tmp_path / "repo"
    zoo.write_model(repo, "bad_env", _config("bad_env", env_path), ENV_PY)
    zoo.write_model(repo, "plain", _config("plain", None), ENV_PY)
    srv = start(repo, "--model-control-mode=explicit", "--load-model=plain", *flags)
    code, raw = post(srv, "/v2/repository/models/bad_env/load")
    assert _info(srv, "plain")["mark"].startswith("ModuleNotFoundError")  # still serving
    return code, json.loads(raw)["error"]


def test_missing_environment_path(start_server: Any, tmp_path: Path) -> None:
    code, error = _refused(start_server, tmp_path, "$$TRITON_MODEL_DIRECTORY/nope.tar.gz")
    assert code == 400
    missing = tmp_path / "repo" / "bad_env" / "nope.tar.gz"
    assert error == (
        f"load failed for model 'bad_env': version 1 is at UNAVAILABLE state: Failed to get "
        f"the canonical path for {missing}. (python model 'bad_env', EXECUTION_ENV_PATH "
        "'$$TRITON_MODEL_DIRECTORY/nope.tar.gz')"
    )


def test_environment_without_activate(start_server: Any, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    (bare / "bin").mkdir(parents=True)
    code, error = _refused(start_server, tmp_path, str(bare))
    assert code == 400
    assert error.endswith(
        f"Path {bare}/bin/activate does not exist. The Python environment should contain an "
        f"'activate' script. (python model 'bad_env', EXECUTION_ENV_PATH '{bare}')"
    ), error


def test_environment_without_numpy(
    start_server: Any, tmp_path: Path, built: dict[str, Path]
) -> None:
    env = built["no_numpy"].resolve()
    code, error = _refused(start_server, tmp_path, str(env))
    assert code == 400
    version = ".".join(map(str, sys.version_info[:3]))
    assert error.endswith(
        f"the Python execution environment {env} (Python {version}) cannot import numpy, "
        "which the model worker needs: ModuleNotFoundError: No module named 'numpy' "
        f"(python model 'bad_env', EXECUTION_ENV_PATH '{env}')"
    ), error


def _old_python() -> str | None:
    """An interpreter too old for the worker (< 3.10), if this machine has one."""
    roots = [Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"]
    for root in roots:
        for exe in sorted(root.glob("3.[6-9].*/bin/python3")):
            return str(exe)
    for name in ("python3.9", "python3.8", "python3.7"):
        for d in os.environ.get("PATH", "").split(os.pathsep):
            exe = Path(d) / name
            if exe.is_file() and "shims" not in d:
                return str(exe)
    return None


def test_python_too_old_for_the_worker(start_server: Any, tmp_path: Path) -> None:
    old = _old_python()
    if old is None:
        pytest.skip("no Python older than 3.10 on this machine")
    env = _venv(tmp_path / "old-venv", python=old).resolve()
    found = subprocess.run(
        [str(env / "bin" / "python3"), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    code, error = _refused(start_server, tmp_path, str(env))
    assert code == 400
    ours = ".".join(map(str, sys.version_info[:3]))
    assert error.endswith(
        f"the Python execution environment {env} has Python {found}, which cannot run the "
        f"model worker: it needs Python 3.10 or newer (the server runs Python {ours}) "
        f"(python model 'bad_env', EXECUTION_ENV_PATH '{env}')"
    ), error


def test_corrupt_archive(start_server: Any, tmp_path: Path, built: dict[str, Path]) -> None:
    bad = tmp_path / "broken.tar.gz"
    bad.write_bytes(built["archive"].read_bytes()[:4096])  # cut short
    cache = tmp_path / "cache"
    code, error = _refused(
        start_server, tmp_path, str(bad), f"--backend-config=python,execution-env-cache={cache}"
    )
    assert code == 400
    assert f"failed to unpack the Python execution environment {bad}: " in error, error
    assert [p.name for p in cache.iterdir() if p.is_dir()] == []  # nothing half-unpacked kept


def test_stub_timeout_bounds_the_environment_interpreter(
    start_server: Any, tmp_path: Path, built: dict[str, Path]
) -> None:
    slow = _venv(tmp_path / "slow-venv", numpy_dir=built["numpy_dir"]).resolve()
    (site,) = slow.glob("lib/python3.*/site-packages")
    (site / "sitecustomize.py").write_text("import time\ntime.sleep(30)\n")  # a hung start
    code, error = _refused(
        start_server, tmp_path, str(slow), "--backend-config=python,stub-timeout-seconds=1"
    )
    assert code == 400
    assert error.endswith(
        f"the interpreter of the Python execution environment {slow} did not answer within "
        f"stub-timeout-seconds=1 (python model 'bad_env', EXECUTION_ENV_PATH '{slow}')"
    ), error


def test_two_servers_share_one_unpacking(
    start_server: Any, repo: Path, built: dict[str, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "shared-cache"
    flags = (
        "--model-control-mode=explicit",
        "--load-model=env_tar_b",
        f"--backend-config=python,execution-env-cache={cache}",
    )
    # both start before either is ready: their loads race for the same archive
    first = start_server(repo, *flags, ready=False)
    second = start_server(repo, *flags, ready=False)
    first.wait_ready()
    second.wait_ready()
    (unpacked,) = _unpacked_dirs(cache)
    assert _info(first, "env_tar_b")["virtual_env"] == str(unpacked)
    assert _info(second, "env_tar_b")["virtual_env"] == str(unpacked)
    assert not list(cache.glob(".*.*"))


def test_a_changed_archive_is_unpacked_anew_on_reload(
    start_server: Any, built: dict[str, Path], tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    mdir = zoo.write_model(
        repo, "swap", _config("swap", "$$TRITON_MODEL_DIRECTORY/env.tar.gz"), ENV_PY
    )
    (mdir / "env.tar.gz").write_bytes(built["archive"].read_bytes())
    cache = tmp_path / "cache"
    srv = _serve(start_server, repo, cache, "swap")
    old = _info(srv, "swap")
    assert old["mark"] == "from-the-env"

    other = _venv(tmp_path / "build2", numpy_dir=built["numpy_dir"])
    (site,) = other.glob("lib/python3.*/site-packages")
    (site / "envmark" / "__init__.py").write_text('VALUE = "second edition"\n')
    _pack(other, mdir / "env.tar.gz")
    code, raw = post(srv, "/v2/repository/models/swap/load")
    assert code == 200, raw
    new = _info(srv, "swap")
    assert new["mark"] == "second edition"
    assert new["virtual_env"] != old["virtual_env"]
    assert sorted(str(p) for p in _unpacked_dirs(cache)) == sorted(
        [old["virtual_env"], new["virtual_env"]]
    )
