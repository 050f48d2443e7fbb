"""Custom execution environments: ``parameters { key: "EXECUTION_ENV_PATH" ... }``.

A python model may name a Python environment of its own: a conda-pack / venv-pack /
``tar czf`` archive of one, or an unpacked environment directory. Its workers then run under
that environment's interpreter, with its packages.

Rules of this file:
- ``$$TRITON_MODEL_DIRECTORY`` in the path is the model's directory (as Triton; a relative
  path is taken from the working directory, as Triton's ``realpath``). A missing
  path and an environment without ``bin/activate`` refuse the load with Triton's sentences.
- An archive is unpacked once into the cache directory, under the SHA-256 of its bytes: every
  instance, every model naming the same archive, and later server runs use that one copy. A
  lock file serialises the unpacking of one archive across threads and processes; it is
  unpacked into a temporary directory that is renamed into place when complete, so a
  half-unpacked archive (a crash, a full disk) is never used, and is removed by the next
  unpacking of the same archive.
- Archive members that would land outside the target (``..``, absolute names) refuse the
  archive; symlinks to absolute paths stay (a venv's ``bin/python`` points at its base
  interpreter).
- ``bin/activate`` is not run: its effect is reproduced for the worker (``PATH`` starts with
  the environment's ``bin``, ``VIRTUAL_ENV`` (venv) or ``CONDA_PREFIX`` (conda) is the
  environment's real location, ``PYTHONHOME`` is unset) and, as Triton does, the
  environment's ``lib`` leads ``LD_LIBRARY_PATH``. A venv that was packed elsewhere (plain
  ``tar`` or venv-pack) thus points at where it is now, not where it was built.
- The interpreter is asked once per environment (again when its ``bin`` or ``site-packages``
  change) for its version, whether it can import numpy (the worker needs it), and its own
  ``sys.path``: a version older than ``MIN_PYTHON`` or no numpy refuses the load with a
  message naming both versions / the environment. The worker's ``sys.path`` is that ``sys.path`` led by a directory that holds
  only the ``sluice`` package (the environment has no sluice, and must not see the
  server's other packages).
- Stdlib only: the worker process (another interpreter) unpickles what refers to this module.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ENV_PATH_PARAM",
    "MIN_PYTHON",
    "ExecutionEnv",
    "EnvError",
    "default_cache_dir",
    "prepare",
    "resolve_path",
]

ENV_PATH_PARAM = "EXECUTION_ENV_PATH"
MODEL_DIR_KEYWORD = "$$TRITON_MODEL_DIRECTORY"
# The worker's own code uses 3.10 features (dataclass slots, X | Y at run time).
MIN_PYTHON = (3, 10)
_DONE = ".sluice-unpacked"  # written last into a complete unpacking

# What the interpreter of an environment is asked (one line of JSON on stdout).
_PROBE = (
    "import json, sys\n"
    "out = {'version': '.'.join(map(str, sys.version_info[:3])), 'path': sys.path[1:]}\n"
    "if sys.version_info >= (3, 10):\n"
    "    try:\n"
    "        import numpy\n"
    "        out['numpy'] = numpy.__version__\n"
    "    except Exception as exc:\n"
    "        out['numpy_error'] = '%s: %s' % (type(exc).__name__, exc)\n"
    "print(json.dumps(out))\n"
)


class EnvError(Exception):
    """An environment that cannot serve; ``code`` is the Triton error code it fails with."""

    def __init__(self, message: str, code: str = "INTERNAL") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(frozen=True, slots=True)
class ExecutionEnv:
    """A ready environment: how to start a worker under it."""

    root: str  # the (unpacked) environment directory
    python: str  # its interpreter
    version: str  # e.g. "3.11.7"
    set_vars: tuple[tuple[str, str], ...]  # environment variables for the worker
    unset_vars: tuple[str, ...]
    sys_path: tuple[str, ...]  # the worker's sys.path (sluice first)


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/sluice/python-envs`` (``~/.cache/...`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sluice" / "python-envs"


def resolve_path(raw: str, model_dir: Path) -> Path:
    """``EXECUTION_ENV_PATH`` with ``$$TRITON_MODEL_DIRECTORY`` replaced by the model's
    directory (a relative result is taken from the working directory, as Triton's
    ``realpath``)."""
    return Path(raw.replace(MODEL_DIR_KEYWORD, str(model_dir))).absolute()


_ready: dict[str, ExecutionEnv] = {}  # environment directory (+ _signature) -> its probe
_digests: dict[tuple[str, int, int], str] = {}  # (archive, size, mtime_ns) -> sha256
_lock = threading.Lock()
_root_locks: dict[str, threading.Lock] = {}


def prepare(raw: str, model_dir: Path, cache_dir: Path, timeout: float) -> ExecutionEnv:
    """The environment ``raw`` names, unpacked and checked (blocking: unpacking and the
    interpreter's probe take time; call it from a thread). EnvError when it cannot serve."""
    path = resolve_path(raw, model_dir)
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise EnvError(f"Failed to get the canonical path for {path}.") from None
    root = real if real.is_dir() else _unpacked(real, cache_dir)
    activate = root / "bin" / "activate"
    if not activate.is_file():
        raise EnvError(
            f"Path {activate} does not exist. The Python environment should contain an "
            "'activate' script."
        )
    key = _signature(root)
    with _lock:
        known = _ready.get(key)
        root_lock = _root_locks.setdefault(str(root), threading.Lock())
    if known is not None:
        return known
    with root_lock:  # instances starting together ask the interpreter once
        known = _ready.get(key)
        if known is None:
            known = _probe(root, cache_dir, timeout)
            with _lock:
                _ready[key] = known
    return known


def _signature(root: Path) -> str:
    """``root`` and what changes when its interpreter or packages do (the modification
    times of ``bin`` and of each ``site-packages``): a changed environment is asked again."""
    parts = [str(root)]
    for d in (root / "bin", *sorted(root.glob("lib/python3*/site-packages"))):
        with contextlib.suppress(OSError):
            parts.append(f"{d.name}:{d.stat().st_mtime_ns}")
    return "|".join(parts)


# ---- archives ----------------------------------------------------------------------------


def _digest(archive: Path) -> str:
    st = archive.stat()
    key = (str(archive), st.st_size, st.st_mtime_ns)
    with _lock:
        known = _digests.get(key)
    if known is not None:
        return known
    h = hashlib.sha256()
    with archive.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    digest = h.hexdigest()
    with _lock:
        _digests[key] = digest
    return digest


def _unpacked(archive: Path, cache_dir: Path) -> Path:
    """The directory ``archive`` is unpacked in (unpacking it first if nobody has)."""
    digest = _digest(archive)[:32]
    target = cache_dir / digest
    if (target / _DONE).is_file():
        return target
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(cache_dir / f"{digest}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as exc:
        raise EnvError(f"cannot use the environment cache {cache_dir}: {exc}") from None
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # another thread / server may be unpacking it
        if (target / _DONE).is_file():
            return target
        for stale in cache_dir.glob(f".{digest}.*"):  # a predecessor died while unpacking
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists():  # complete-looking but unmarked: never trusted
            shutil.rmtree(target, ignore_errors=True)
        partial = cache_dir / f".{digest}.{os.getpid()}.{threading.get_ident()}"
        partial.mkdir()
        try:
            _extract(archive, partial)
            (partial / _DONE).write_text(str(archive) + "\n", encoding="utf-8")
            os.rename(partial, target)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return target
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)


def _extract(archive: Path, dest: Path) -> None:
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for m in members:
                if os.path.isabs(m.name) or ".." in Path(m.name).parts:
                    raise EnvError(
                        f"failed to unpack the Python execution environment {archive}: member "
                        f"'{m.name}' would land outside the environment"
                    )
            # 'tar' filter: no device files, no setuid bits, no links out of dest by '..';
            # absolute symlinks are kept (a venv's interpreter links to its base one)
            tar.extractall(dest, members=members, filter="tar")
    except EnvError:
        raise
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise EnvError(
            f"failed to unpack the Python execution environment {archive}: {exc}"
        ) from None


# ---- the interpreter -----------------------------------------------------------------------


def _interpreter(root: Path) -> Path:
    for name in ("python3", "python"):
        exe = root / "bin" / name
        if exe.exists():
            return exe
    raise EnvError(f"the Python execution environment {root} has no bin/python3 or bin/python")


def launch_vars(root: Path) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """The variables ``source bin/activate`` would set (and unset) for ``root``, plus
    Triton's ``LD_LIBRARY_PATH``: (set, unset)."""
    env: dict[str, str] = {}
    path = os.environ.get("PATH", "")
    env["PATH"] = f"{root / 'bin'}{os.pathsep + path if path else ''}"
    if (root / "pyvenv.cfg").is_file():
        env["VIRTUAL_ENV"] = str(root)
    if (root / "conda-meta").is_dir():
        env["CONDA_PREFIX"] = str(root)
    ld = os.environ.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = f"{root / 'lib'}{':' + ld if ld else ''}"
    return tuple(env.items()), ("PYTHONHOME",)


def _probe(root: Path, cache_dir: Path, timeout: float) -> ExecutionEnv:
    exe = _interpreter(root)
    set_vars, unset = launch_vars(root)
    env = dict(os.environ)
    env.update(set_vars)
    for name in unset:
        env.pop(name, None)
    try:
        done = subprocess.run(
            [str(exe), "-c", _PROBE],
            env=env,
            capture_output=True,
            timeout=timeout,
            cwd=str(root),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EnvError(
            f"the interpreter of the Python execution environment {root} did not answer "
            f"within stub-timeout-seconds={timeout:g}"
        ) from None
    except OSError as exc:
        raise EnvError(f"cannot run {exe}: {exc}") from None
    try:
        facts = json.loads(done.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        version = str(facts["version"])
    except (ValueError, IndexError, KeyError, TypeError):
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise EnvError(
            f"the interpreter {exe} of the Python execution environment did not start "
            f"(exit code {done.returncode}): {err[-1] if err else 'no output'}"
        ) from None
    ours = ".".join(map(str, sys.version_info[:3]))
    wanted = ".".join(map(str, MIN_PYTHON))
    if tuple(int(p) for p in version.split(".")[:2]) < MIN_PYTHON:
        raise EnvError(
            f"the Python execution environment {root} has Python {version}, which cannot run "
            f"the model worker: it needs Python {wanted} or newer (the server runs Python "
            f"{ours})"
        )
    if "numpy" not in facts:
        raise EnvError(
            f"the Python execution environment {root} (Python {version}) cannot import numpy, "
            f"which the model worker needs: {facts.get('numpy_error', 'not installed')}"
        )
    paths = [p for p in facts.get("path", []) if p and p != str(root)]
    try:
        sluice_dir = _sluice_only_dir(cache_dir)
    except OSError as exc:
        raise EnvError(f"cannot use the environment cache {cache_dir}: {exc}") from None
    return ExecutionEnv(
        root=str(root),
        python=str(exe),
        version=version,
        set_vars=set_vars,
        unset_vars=unset,
        sys_path=(str(sluice_dir), *paths),
    )


def _sluice_only_dir(cache_dir: Path) -> Path:
    """A directory whose only entry is a link to the running server's ``sluice`` package:
    the worker imports sluice from it without seeing the server's other packages."""
    package = Path(__file__).resolve().parents[2]  # .../sluice
    tag = hashlib.sha256(str(package).encode()).hexdigest()[:16]
    home = cache_dir / f"sluice-src-{tag}"
    link = home / "sluice"
    if link.is_symlink() and link.resolve() == package:
        return home
    home.mkdir(parents=True, exist_ok=True)
    temp = home / f".sluice.{os.getpid()}.{threading.get_ident()}"
    with contextlib.suppress(FileNotFoundError):
        temp.unlink()
    temp.symlink_to(package, target_is_directory=True)
    os.replace(temp, link)
    return home
