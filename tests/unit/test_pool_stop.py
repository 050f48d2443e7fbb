"""Stopping a python model's worker is cancellable: a cancelled stop kills the worker, releases
its shared memory, and then lets the cancellation go on up (a shutdown or an unload that is
itself cancelled must not be turned into a normal return)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import psutil
import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.python.server import PythonInstance

from .test_python_backend import ADD_SUB_CONFIG, make_spec, no_leftovers, run

__all__ = ["no_leftovers"]  # the autouse fixture: no worker process or shm segment left

SLOW_FINALIZE_PY = """
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.dir = os.environ["SLUICE_TEST_GATE_DIR"]

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]

    def finalize(self):
        open(os.path.join(self.dir, "finalizing"), "w").close()
        while not os.path.exists(os.path.join(self.dir, "release")):
            time.sleep(0.01)
"""


@pytest.fixture
def slow_finalize(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelSpec:
    monkeypatch.setenv("SLUICE_TEST_GATE_DIR", str(tmp_path))
    return make_spec(tmp_path, "add_sub", ADD_SUB_CONFIG.format(name="add_sub"), SLOW_FINALIZE_PY)


async def _until(path: Path) -> None:
    async with asyncio.timeout(60):
        while not path.exists():
            await asyncio.sleep(0.01)


def test_cancelled_stop_kills_the_worker_and_is_not_swallowed(
    slow_finalize: ModelSpec, tmp_path: Path
) -> None:
    async def go() -> None:
        inst = PythonInstance(slow_finalize, "add_sub_0")
        await inst.start()
        pid = inst.worker.pid
        assert pid is not None
        stopping = asyncio.ensure_future(inst.stop(grace=600))
        await _until(tmp_path / "finalizing")  # the worker is inside finalize(), held
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping
        assert inst.worker.pid is None
        gone = not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        assert gone, f"worker {pid} still runs after a cancelled stop"
        (tmp_path / "release").touch()

    run(go)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"sl{os.getpid()}_")]
