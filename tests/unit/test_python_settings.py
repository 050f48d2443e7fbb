"""``--backend-config=python,...`` keys and ``FORCE_CPU_ONLY_INPUT_TENSORS``: Triton's checks
and sentences (checked against real Triton 2.51's load errors)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from sluice.backends.python.settings import (
    DEFAULT_WORKER_ENV,
    PythonSettings,
    check_model_parameters,
    python_settings,
    worker_env,
)
from sluice.errors import InvalidArgument, Status, Unsupported


def test_defaults() -> None:
    s = python_settings({})
    assert s == PythonSettings()
    assert (s.shm_default_byte_size, s.shm_growth_byte_size, s.stub_timeout) == (
        1 << 20,
        1 << 16,
        30.0,
    )
    assert s.shm_prefix == "sl"
    assert s.worker_start == ("forkserver" if sys.platform.startswith("linux") else "spawn")


def test_values_are_read() -> None:
    s = python_settings(
        {
            "shm-default-byte-size": "4194304",
            "shm-growth-byte-size": "2097152",
            "stub-timeout-seconds": "7",
            "shm-region-prefix-name": "blue_",
            "execution-env-cache": "/tmp/envs",
            "worker-start": "spawn",
            "thread-pool-size": "4",  # Triton's, meaningless here: ignored
            "no-such-key": "1",  # Triton ignores keys it does not know
        }
    )
    assert s.shm_default_byte_size == 4 << 20
    assert s.shm_growth_byte_size == 2 << 20
    assert s.stub_timeout == 7.0
    assert s.shm_prefix == "blue_"
    assert s.cache_dir == Path("/tmp/envs")
    assert s.worker_start == "spawn"
    assert python_settings({"worker-start": "forkserver"}).worker_start == "forkserver"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "stub-timeout-seconds",
            "0",
            "stub-timeout-seconds can't be smaller than or equal to zero.",
        ),
        ("stub-timeout-seconds", "abc", "stol"),
        ("shm-default-byte-size", "100", "shm-default-byte-size can't be smaller than 4 MiBs"),
        (
            "shm-growth-byte-size",
            "0",
            "shm-growth-byte-size can't be smaller than or equal to zero.",
        ),
        (
            "shm-growth-byte-size",
            "-5",
            "shm-growth-byte-size can't be smaller than or equal to zero.",
        ),
        (
            "shm-region-prefix-name",
            "",
            "shm-region-prefix-name must at least contain one character.",
        ),
        (
            "shm-region-prefix-name",
            "a/b",
            "shm-region-prefix-name 'a/b' must not contain '/' (it starts the names of "
            "shared-memory segments)",
        ),
        ("worker-start", "fork", "worker-start 'fork' is not one of: forkserver, spawn"),
    ],
)
def test_bad_values(key: str, value: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        python_settings({key: value})
    assert info.value.message == message
    assert info.value.status is Status.INVALID_ARG


def test_numbers_read_like_stol() -> None:
    # std::stol reads leading digits and ignores the rest, as Triton does
    assert python_settings({"stub-timeout-seconds": " 12s"}).stub_timeout == 12.0


def _config(value: str | None) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name="m", backend="python")
    if value is not None:
        cfg.parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value = value
    return cfg


def test_force_cpu_only_input_tensors() -> None:
    for ok in (None, "yes", "no"):
        check_model_parameters(_config(ok))
    with pytest.raises(Unsupported) as info:
        check_model_parameters(_config("YES"))
    assert info.value.message == "Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: YES'"


def test_worker_env_thread_counts() -> None:
    cfg = mc.ModelConfig(name="m", backend="python")
    assert worker_env(cfg) == DEFAULT_WORKER_ENV
    assert dict(DEFAULT_WORKER_ENV) == {
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    cfg.parameters["OMP_NUM_THREADS"].string_value = "4"
    assert dict(worker_env(cfg))["OMP_NUM_THREADS"] == "4"
