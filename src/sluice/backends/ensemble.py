"""Ensembles (``platform: "ensemble"``): a pipeline of other models wired by tensor names.

Rules of this file:
- Each step calls its composing model through ``infer``, a callable the model manager gives
  the backend: it validates the request against the composing model's config and submits it
  to that model's own scheduler, so its dynamic batching, queue policies and statistics
  apply exactly as for a client request.
- Steps run in dependency order (computed once at load): a step starts when every
  ensemble tensor in its ``input_map`` exists. Independent requests run concurrently; the
  ensemble's own scheduler only bounds how many are in flight
  (``ensemble_scheduling.max_inflight_requests``, default 64) through as many light instances.
- The ensemble's ``max_batch_size``, inputs and outputs come from its config only.
- ``plan`` checks the wiring against the composing models' configs at load and raises
  InvalidArgument naming the step and tensor.
- A step that fails fails its request only: the client gets the composing model's error
  (its text first, its status) followed by the ensemble, the step's index in the config and
  the composing model; the requests in flight beside it go on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..errors import InvalidArgument, ServerError, restate
from ..protocol.datatypes import numpy_to_kserve
from ..types import InferRequest, InferResponse
from .base import ExecuteResult, ModelInstance, ModelSpec

__all__ = ["EnsembleBackend", "EnsembleInstance", "Step", "plan", "composing_models"]

InferFn = Callable[[InferRequest], Awaitable[InferResponse]]
# (model name, version "") -> config of the serving composing model, or None if not loaded
ConfigFn = Callable[[str, str], "mc.ModelConfig | None"]

DEFAULT_MAX_INFLIGHT = 64


@dataclass(frozen=True, slots=True)
class Step:
    model: str
    version: str  # "" = latest
    inputs: tuple[tuple[str, str], ...]  # (model input, ensemble tensor)
    outputs: tuple[tuple[str, str], ...]  # (model output, ensemble tensor)
    index: int = 0  # its place in ensemble_scheduling.step (errors name it)


def composing_models(config: mc.ModelConfig) -> list[str]:
    return sorted({s.model_name for s in config.ensemble_scheduling.step})


def plan(config: mc.ModelConfig, config_of: ConfigFn) -> list[Step]:
    """The steps in an order where each one's inputs exist before it runs."""
    name = config.name
    steps = list(config.ensemble_scheduling.step)
    if not steps:
        raise InvalidArgument(
            f"failed to load '{name}': an ensemble needs ensemble_scheduling {{ step [...] }}"
        )
    if config.instance_group and any(g.count for g in config.instance_group):
        raise InvalidArgument(f"failed to load '{name}': an ensemble cannot have an instance_group")
    available = {t.name for t in config.input}
    produced_by: dict[str, str] = {}
    pending: list[tuple[int, mc.ModelEnsembling.Step]] = list(enumerate(steps))
    ordered: list[Step] = []
    for i, s in pending:
        if s.model_name == name:
            raise InvalidArgument(f"failed to load '{name}': step {i} names the ensemble itself")
        version = str(s.model_version) if s.model_version > 0 else ""
        cfg = config_of(s.model_name, version)
        if cfg is None:
            raise InvalidArgument(
                f"failed to load '{name}': composing model '{s.model_name}'"
                + (f" version {version}" if version else "")
                + " is not loaded"
            )
        model_inputs = {t.name for t in cfg.input}
        model_outputs = {t.name for t in cfg.output}
        for model_in in s.input_map:
            if model_in not in model_inputs:
                raise InvalidArgument(
                    f"failed to load '{name}': step {i} maps '{model_in}', which is not an input "
                    f"of '{s.model_name}' (its inputs: {sorted(model_inputs)})"
                )
        for model_out, tensor in s.output_map.items():
            if model_out not in model_outputs:
                raise InvalidArgument(
                    f"failed to load '{name}': step {i} maps '{model_out}', which is not an "
                    f"output of '{s.model_name}' (its outputs: {sorted(model_outputs)})"
                )
            if tensor in produced_by or tensor in available:
                raise InvalidArgument(
                    f"failed to load '{name}': ensemble tensor '{tensor}' is produced twice"
                )
            produced_by[tensor] = s.model_name
        if config.max_batch_size > cfg.max_batch_size:
            raise InvalidArgument(
                f"failed to load '{name}': its max_batch_size {config.max_batch_size} exceeds "
                f"that of composing model '{s.model_name}' ({cfg.max_batch_size})"
            )
    for out in config.output:
        if out.name not in produced_by:
            raise InvalidArgument(
                f"failed to load '{name}': ensemble output '{out.name}' is not produced by any step"
            )
    while pending:
        progressed = False
        for item in list(pending):
            i, s = item
            missing = [t for t in s.input_map.values() if t not in available]
            if missing:
                continue
            ordered.append(
                Step(
                    s.model_name,
                    str(s.model_version) if s.model_version > 0 else "",
                    tuple(sorted(s.input_map.items())),
                    tuple(sorted(s.output_map.items())),
                    i,
                )
            )
            available.update(s.output_map.values())
            pending.remove(item)
            progressed = True
        if not progressed:
            i, s = pending[0]
            missing = sorted(t for t in s.input_map.values() if t not in available)
            raise InvalidArgument(
                f"failed to load '{name}': step {i} ('{s.model_name}') needs ensemble tensor(s) "
                f"{missing}, which no ensemble input or earlier step provides"
            )
    return ordered


class EnsembleInstance:
    """A slot for one in-flight ensemble request (the scheduler gives it one at a time)."""

    def __init__(self, spec: ModelSpec, name: str, steps: list[Step], infer: InferFn) -> None:
        self.name = name
        self.spec = spec
        self._steps = steps
        self._infer = infer
        self._outputs = [t.name for t in spec.config.output]

    async def start(self) -> None:
        return None

    async def execute(self, requests: list[InferRequest]) -> ExecuteResult:
        t0 = time.perf_counter_ns()
        results = await asyncio.gather(*(self._one(r) for r in requests), return_exceptions=True)
        out: list[InferResponse | ServerError] = []
        for r in results:
            if isinstance(r, ServerError | InferResponse):
                out.append(r)
            else:
                out.append(ServerError(f"ensemble '{self.spec.name}' failed: {r}"))
        return ExecuteResult(out, compute_infer_ns=time.perf_counter_ns() - t0)

    async def _one(self, request: InferRequest) -> InferResponse:
        tensors: dict[str, np.ndarray] = dict(request.inputs)
        for step in self._steps:
            inputs = {model_in: tensors[t] for model_in, t in step.inputs}
            datatypes = {k: dt for k, v in inputs.items() if (dt := numpy_to_kserve(v.dtype))}
            sub = InferRequest(step.model, step.version, request.id, inputs, datatypes)
            if request.trace is not None:  # a child trace per composing request, as Triton
                sub.trace = request.trace.child()
            try:
                response = await self._infer(sub)
            except ServerError as exc:
                # the composing model's own text first (Triton passes it through unchanged),
                # then where it failed; its status stays the client's status
                where = f"composing model '{step.model}'" + (
                    f" version {step.version}" if step.version else ""
                )
                raise restate(
                    exc, f"{exc} (in ensemble '{self.spec.name}', step {step.index}: {where})"
                ) from None
            for model_out, t in step.outputs:
                tensors[t] = response.outputs[model_out]
        return InferResponse(
            self.spec.name,
            str(self.spec.version),
            request.id,
            {n: tensors[n] for n in self._outputs},
        )

    async def stop(self, grace: float | None = None) -> None:
        return None


class EnsembleBackend:
    """Built by the model manager (it needs ``infer`` and ``config_of``), not by the registry."""

    name = "ensemble"

    def __init__(self, infer: InferFn, config_of: ConfigFn) -> None:
        self._infer = infer
        self._config_of = config_of

    def default_model_filename(self) -> str:
        return ""  # an ensemble has only an (empty) version directory

    def auto_complete(self, spec: ModelSpec) -> mc.ModelConfig:
        return spec.config

    def create_instances(self, spec: ModelSpec) -> list[ModelInstance]:
        steps = plan(spec.config, self._config_of)
        n = spec.config.ensemble_scheduling.max_inflight_requests or DEFAULT_MAX_INFLIGHT
        return [
            EnsembleInstance(spec, f"{spec.name}_{i}", steps, self._infer) for i in range(int(n))
        ]
