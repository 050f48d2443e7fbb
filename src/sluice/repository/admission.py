"""Memory-aware admission of a model version's instances (Triton issue #6928: every instance
holds its own copy of the model, so doubling ``instance_group.count`` can end in an OOM kill).

Rules of this file:
- The first instance is started alone and measured: a python instance by its worker
  process tree's resident memory, an in-process runtime (ONNX Runtime, TorchScript, TensorRT)
  by how much the server's own resident memory grew while it started.
- The other ``count - 1`` instances are started only if ``(count - 1) x estimate`` fits in
  what is left: the machine's available memory (``sysmem.machine_memory``: MemAvailable, or a
  cgroup limit) minus a safety margin, and, with ``--model-memory-limit``, that limit minus
  what sluice (the server and its worker processes) holds now. Memory reserved by other loads
  still starting their instances counts as taken.
- A refused load stops the first instance and answers why, naming the estimate, the count,
  what is left and how many instances would fit; the manager turns it into a failed load
  (400 / INVALID_ARGUMENT, as Triton answers a version that fails to initialize). Nothing
  else is touched: the versions already serving keep serving.
- A model may declare what one instance holds instead: the config parameter
  ``sluice_memory_estimate`` (a size, ``K``/``M``/``G``/``T`` suffixes, e.g. ``"512M"``).
  It replaces the measurement (a model whose memory grows after ``initialize``, or one
  whose figure must not depend on the machine); a value that is not a size fails the load.
- The estimate per instance is returned with the outcomes (``Admitted``): the version's
  footprint (estimate x instances) is what on-demand loading counts against its budget.
- Ensembles hold no model and are not measured.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from typing import NamedTuple

import psutil
from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import ModelInstance
from ..errors import InvalidArgument
from ..host.sysmem import MachineMemory, format_size, machine_memory, parse_size, tree_rss

__all__ = ["Admitted", "MemoryAdmission", "declared_estimate", "safety_margin", "ESTIMATE_PARAM"]

log = logging.getLogger("sluice.admission")

# the config parameter declaring what one instance holds (instead of measuring it)
ESTIMATE_PARAM = "sluice_memory_estimate"

_MIN_MARGIN = 128 << 20
_MAX_MARGIN = 1 << 30


def safety_margin(total: int) -> int:
    """What is kept free of model instances: 5% of the memory, at least 128 MiB, at most 1 GiB
    (the server's own buffers, page cache for model files, other processes)."""
    return min(_MAX_MARGIN, max(_MIN_MARGIN, total // 20))


def declared_estimate(config: mc.ModelConfig) -> int | None:
    """The bytes one instance holds as the config declares them (``sluice_memory_estimate``),
    or None; InvalidArgument naming the parameter when it is not a size."""
    if ESTIMATE_PARAM not in config.parameters:
        return None
    raw = config.parameters[ESTIMATE_PARAM].string_value
    try:
        return parse_size(raw)
    except ValueError as exc:
        raise InvalidArgument(
            f"model '{config.name}': parameter '{ESTIMATE_PARAM}' must be a size in bytes "
            f"(e.g. '512M'): {exc}"
        ) from None


class Admitted(NamedTuple):
    """What ``start_instances`` did: per instance None or its exception (as
    ``asyncio.gather(..., return_exceptions=True)``), and the bytes one instance holds
    (declared or measured; 0 for an ensemble or when the first instance failed)."""

    outcomes: list[BaseException | None]
    estimate: int


def _own_rss() -> int:
    try:
        return int(psutil.Process(os.getpid()).memory_info().rss)
    except psutil.Error:
        return 0


class MemoryAdmission:
    """Starts a version's instances, refusing those that would not fit in memory.

    >>> admission = MemoryAdmission(limit=8 << 30)       # --model-memory-limit=8G (0: none)
    >>> admitted = await admission.start_instances("big", 1, config, instances)
    >>> admitted.outcomes   # None or the exception, per instance
    >>> admitted.estimate   # bytes one instance holds (declared or measured)
    """

    def __init__(
        self, limit: int = 0, machine: Callable[[], MachineMemory] = machine_memory
    ) -> None:
        self.limit = limit
        self._machine = machine
        self._reserved = 0  # bytes admitted to loads whose other instances are starting

    async def start_instances(
        self,
        name: str,
        version: int,
        config: mc.ModelConfig,
        instances: Sequence[ModelInstance],
    ) -> Admitted:
        if not instances or config.platform == "ensemble":
            return Admitted(
                _outcomes(
                    await asyncio.gather(*(i.start() for i in instances), return_exceptions=True)
                ),
                0,
            )
        declared = declared_estimate(config)  # a bad value fails before anything starts
        first, rest = instances[0], list(instances[1:])
        own_before = _own_rss()
        (outcome,) = await asyncio.gather(first.start(), return_exceptions=True)
        if isinstance(outcome, BaseException):
            # the others would fail the same way: report the first's error, start nothing more
            await _stop_all(rest)
            return Admitted([outcome] * len(instances), 0)
        estimate = declared if declared is not None else _measure(first, own_before)
        how = "declared" if declared is not None else "measured"
        refusal = self._refusal(name, version, estimate, len(instances), how)
        if refusal is not None:
            log.warning("%s", refusal)
            await _stop_all([first, *rest])
            error = InvalidArgument(refusal)
            return Admitted([error] * len(instances), estimate)
        need = estimate * len(rest)
        self._reserved += need
        try:
            results = await asyncio.gather(*(i.start() for i in rest), return_exceptions=True)
        finally:
            self._reserved -= need
        return Admitted([None, *_outcomes(results)], estimate)

    def _refusal(
        self, name: str, version: int, estimate: int, count: int, how: str = "measured"
    ) -> str | None:
        """None if the other ``count - 1`` instances fit; else why not, in words."""
        mem = self._machine()
        margin = safety_margin(mem.total)
        options = [
            (
                mem.available - margin - self._reserved,
                f"{format_size(mem.available)} available ({mem.where}) minus a "
                f"{format_size(margin)} safety margin",
                "free memory on this machine",
            )
        ]
        if self.limit:
            used = tree_rss()
            options.append(
                (
                    self.limit - used - self._reserved,
                    f"--model-memory-limit {format_size(self.limit)}, sluice holds "
                    f"{format_size(used)}",
                    "raise --model-memory-limit",
                )
            )
        if self._reserved:
            reserved = f"; {format_size(self._reserved)} is reserved by loads in progress"
        else:
            reserved = ""
        left, why, remedy = min(options, key=lambda o: o[0])
        need = estimate * (count - 1)
        log.info(
            "admission: model '%s' version %s: the first instance took %s (%s), %d instance(s) "
            "need about %s; %s left (%s%s)",
            name,
            version,
            format_size(estimate),
            how,
            count,
            format_size(estimate * count),
            format_size(left),
            why,
            reserved,
        )
        head = (
            f"not enough memory for {count} instance{'s' if count > 1 else ''} of model "
            f"'{name}' version {version}: the first instance took {format_size(estimate)} "
            f"({how}), so {count} need about {format_size(estimate * count)}"
        )
        if need <= left:
            return None
        if left < 0:
            return (
                f"{head}; nothing is left: {format_size(-left)} over ({why}{reserved}); "
                f"{remedy} or lower instance_group count"
            )
        fits = 1 + left // estimate
        return (
            f"{head}; the other {count - 1} need {format_size(need)} but {format_size(left)} "
            f"is left ({why}{reserved}); at most {fits} instance{'s' if fits > 1 else ''} fit: "
            f"set instance_group count to {fits} or {remedy}"
        )


def _measure(first: ModelInstance, own_before: int) -> int:
    """Bytes the first instance holds: its worker process tree, or the server's growth."""
    pid = getattr(first, "pid", None)
    if isinstance(pid, int):
        return tree_rss(pid)
    return max(0, _own_rss() - own_before)


async def _stop_all(instances: Sequence[ModelInstance]) -> None:
    await asyncio.gather(*(i.stop() for i in instances), return_exceptions=True)


def _outcomes(results: Sequence[object]) -> list[BaseException | None]:
    return [r if isinstance(r, BaseException) else None for r in results]
