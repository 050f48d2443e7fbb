"""Model and version records held by the manager, and the state names of the index."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import ModelSpec
from ..protocol.datatypes import config_to_kserve, kserve_to_numpy
from ..scheduling.scheduler import Scheduler
from .stats import ModelStats
from .traffic import TrafficSplit

__all__ = [
    "READY",
    "UNAVAILABLE",
    "LOADING",
    "UNLOADING",
    "TensorInfo",
    "ServingVersion",
    "ModelRecord",
    "Override",
]

# (path, mtime_ns, size) of every entry under a model's directory
Signature = tuple[tuple[str, int, int], ...]

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
UNLOADING = "UNLOADING"


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    datatype: str  # KServe spelling
    dtype: np.dtype | None
    dims: tuple[int, ...]
    optional: bool = False


def tensor_infos(tensors: list[mc.ModelInput] | list[mc.ModelOutput]) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    for t in tensors:
        if t.name in out:  # declared twice: the first declaration counts (config warns)
            continue
        dt = config_to_kserve(mc.DataType.Name(t.data_type))
        out[t.name] = TensorInfo(
            t.name,
            dt,
            kserve_to_numpy(dt),
            tuple(int(d) for d in t.dims),
            bool(getattr(t, "optional", False)),
        )
    return out


@dataclass(slots=True)
class ServingVersion:
    """A loaded version: its config, scheduler and statistics. Immutable once serving."""

    spec: ModelSpec
    scheduler: Scheduler
    stats: ModelStats
    inputs: dict[str, TensorInfo]
    outputs: dict[str, TensorInfo]
    required_inputs: frozenset[str]
    max_batch_size: int
    version_str: str
    decoupled: bool = False  # model_transaction_policy { decoupled: true }
    cached: bool = False  # response_cache { enable: true } and a server cache
    # unique per load of this version (the manager counts): the response cache keys on it,
    # so files changed under the same version number never answer from the old load's entries
    generation: int = 0

    @property
    def config(self) -> mc.ModelConfig:
        return self.spec.config


@dataclass(frozen=True, slots=True)
class Override:
    """The 'config' (and 'file:<path>' contents) a load carried; kept while it is in force so
    that the control state can record it (``repository/control_file.py``)."""

    config: str
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass(slots=True)
class ModelRecord:
    name: str
    serving: dict[int, ServingVersion] = field(default_factory=dict)
    # version (or -1 = the model as a whole) -> (state, reason), for the index
    states: dict[int, tuple[str, str]] = field(default_factory=dict)
    latest: ServingVersion | None = None  # highest serving version
    required: bool = False  # counts for strict readiness
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # kept across reloads so statistics stay cumulative, as in Triton
    stats: dict[int, ModelStats] = field(default_factory=dict)
    # what the model's directory looked like at the last load attempt (poll mode compares)
    signature: Signature = ()
    # (directory signature, override key) of what serves now: a load reloads only if changed
    loaded: tuple[Signature, tuple[object, ...] | None] | None = None
    dependents: set[str] = field(default_factory=set)
    # the whole-model load's override in force (None: the repository's files), and the
    # overrides of versions loaded one by one (``versions.py``); meaningful while serving
    override: Override | None = None
    version_overrides: dict[int, Override] = field(default_factory=dict)
    # weighted split of requests that name no version (``traffic.py``); None: the latest
    split: TrafficSplit[ServingVersion] | None = None

    def set_serving(self, serving: dict[int, ServingVersion]) -> None:
        self.serving = serving
        self.latest = serving[max(serving)] if serving else None
        if self.split is not None:
            self.split = self.split.rebind(serving)

    @property
    def ready(self) -> bool:
        return bool(self.serving)

    @property
    def present(self) -> bool:
        """Serving, or on its way in or out: listed in the index even without a directory."""
        return bool(self.serving) or any(
            state in (LOADING, UNLOADING) for state, _ in self.states.values()
        )
