"""The python backend's settings: ``--backend-config=python,<key>=<value>`` and the model
``parameters`` Triton's python backend reads itself.

Rules of this file:
- Triton's keys are accepted with Triton's checks and Triton's error sentences (a python
  model's load fails with them, as in Triton, whose backend reads them when its first model
  loads): ``shm-default-byte-size`` (at least 1 MiB; Triton's sentence says 4 MiBs),
  ``shm-growth-byte-size`` and ``stub-timeout-seconds`` (positive), ``shm-region-prefix-name``
  (not empty); a value that is not a number fails as Triton's does (``stol``).
- What each means here: the shared-memory arenas of a worker start at
  ``shm-default-byte-size`` and grow in multiples of ``shm-growth-byte-size``; every
  segment's name starts with ``shm-region-prefix-name``; ``stub-timeout-seconds`` bounds how
  long an execution environment's interpreter may take to start and answer.
- sluice's own keys: ``execution-env-cache=DIR``, where archives named by
  ``EXECUTION_ENV_PATH`` are unpacked (default ``~/.cache/sluice/python-envs``), and
  ``worker-start=forkserver|spawn``: how a model's workers start (``forkserver``, the default
  on Linux: forked from one pre-warmed process, ``forkserver.py``; ``spawn``: each a fresh
  interpreter, the default elsewhere). Another value refuses the load, naming both.
- A worker's thread-count variables (``THREAD_VARS``) are 1 unless the model's
  ``parameters`` set them; only workers with the defaults can be forked (numpy read them
  when the fork server imported it).
- Other keys are ignored, as Triton ignores keys it does not know.
- ``FORCE_CPU_ONLY_INPUT_TENSORS`` (model parameter) is ``yes`` or ``no``; inputs are always
  in CPU memory here, so both serve alike; another value refuses the load (Triton's text).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InvalidArgument, Unsupported
from .environments import default_cache_dir

__all__ = [
    "PythonSettings",
    "python_settings",
    "check_model_parameters",
    "worker_env",
    "DEFAULT_SHM_PREFIX",
    "DEFAULT_WORKER_ENV",
    "THREAD_VARS",
    "WORKER_STARTS",
]

MIB = 1 << 20
DEFAULT_SHM_PREFIX = "sl"
DEFAULT_STUB_TIMEOUT = 30.0  # Triton's default
ARENA_STEP = 1 << 16  # arenas grow in 64 KiB steps unless shm-growth-byte-size says
WORKER_STARTS = ("forkserver", "spawn")
DEFAULT_WORKER_START = "forkserver" if sys.platform.startswith("linux") else "spawn"
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
DEFAULT_WORKER_ENV = tuple((var, "1") for var in THREAD_VARS)


@dataclass(frozen=True, slots=True)
class PythonSettings:
    shm_default_byte_size: int = MIB
    shm_growth_byte_size: int = ARENA_STEP
    stub_timeout: float = DEFAULT_STUB_TIMEOUT
    shm_prefix: str = DEFAULT_SHM_PREFIX
    env_cache: Path | None = None  # None: default_cache_dir()
    worker_start: str = DEFAULT_WORKER_START

    @property
    def cache_dir(self) -> Path:
        return self.env_cache if self.env_cache is not None else default_cache_dir()


def _number(settings: dict[str, str], key: str) -> int | None:
    raw = settings.get(key)
    if raw is None:
        return None
    try:
        # std::stol: leading blanks and a sign, then digits; anything after them is ignored
        text = raw.lstrip()
        end = 1 if text[:1] in "+-" else 0
        while end < len(text) and text[end].isdigit():
            end += 1
        return int(text[:end])
    except ValueError:
        raise InvalidArgument("stol") from None


def python_settings(settings: dict[str, str]) -> PythonSettings:
    """The python backend's settings from ``--backend-config`` (InvalidArgument as Triton)."""
    out: dict[str, Any] = {}
    growth = _number(settings, "shm-growth-byte-size")
    if growth is not None:
        if growth <= 0:
            raise InvalidArgument("shm-growth-byte-size can't be smaller than or equal to zero.")
        out["shm_growth_byte_size"] = growth
    default = _number(settings, "shm-default-byte-size")
    if default is not None:
        if default < MIB:
            raise InvalidArgument("shm-default-byte-size can't be smaller than 4 MiBs")
        out["shm_default_byte_size"] = default
    prefix = settings.get("shm-region-prefix-name")
    if prefix is not None:
        if not prefix:
            raise InvalidArgument("shm-region-prefix-name must at least contain one character.")
        if "/" in prefix:
            raise InvalidArgument(
                f"shm-region-prefix-name '{prefix}' must not contain '/' (it starts the names "
                "of shared-memory segments)"
            )
        out["shm_prefix"] = prefix
    timeout = _number(settings, "stub-timeout-seconds")
    if timeout is not None:
        if timeout <= 0:
            raise InvalidArgument("stub-timeout-seconds can't be smaller than or equal to zero.")
        out["stub_timeout"] = float(timeout)
    cache = settings.get("execution-env-cache")
    if cache:
        out["env_cache"] = Path(cache).expanduser()
    start = settings.get("worker-start")
    if start is not None:
        if start not in WORKER_STARTS:
            raise InvalidArgument(
                f"worker-start '{start}' is not one of: {', '.join(WORKER_STARTS)}"
            )
        out["worker_start"] = start
    return PythonSettings(**out)


def worker_env(config: Any) -> tuple[tuple[str, str], ...]:
    """Thread counts for a model's workers: 1 unless its ``parameters`` say otherwise."""
    params = config.parameters
    return tuple((var, params[var].string_value if var in params else "1") for var in THREAD_VARS)


def check_model_parameters(config: Any) -> None:
    """``FORCE_CPU_ONLY_INPUT_TENSORS`` must be ``yes`` or ``no`` (Triton's check)."""
    params = config.parameters
    if "FORCE_CPU_ONLY_INPUT_TENSORS" in params:
        value = params["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value
        if value not in ("yes", "no"):
            raise Unsupported(f"Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: {value}'")
