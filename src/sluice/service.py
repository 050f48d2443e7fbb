"""InferenceService: the one API both front-ends call (health, metadata, infer, repository
control, statistics). Front-ends only translate wire formats to these calls and map
``ServerError.status`` to their own codes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from . import SERVER_NAME, __version__
from .config import ControlMode, ServerConfig
from .errors import Internal, InvalidArgument, ServerError, Unavailable
from .protocol.datatypes import numpy_to_kserve
from .repository.layout import check_model_name
from .repository.manager import ModelManager
from .repository.states import ServingVersion, TensorInfo
from .types import InferRequest, InferResponse
from .validation import check_request

__all__ = ["InferenceService", "EXTENSIONS"]

EXTENSIONS = [
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
]


def _int_param(params: dict[str, Any], key: str) -> int:
    value = params.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidArgument(f"request parameter '{key}' must be an integer")
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(
            f"request parameter '{key}' must be an integer, got '{value}'"
        ) from None


class InferenceService:
    def __init__(self, config: ServerConfig, manager: ModelManager) -> None:
        self.config = config
        self.manager = manager
        self._accepting = True
        self._inflight = 0
        self._idle: asyncio.Event | None = None

    # --- lifecycle ------------------------------------------------------------
    def stop_accepting(self) -> None:
        """Readiness turns false and new inference is refused, on every front-end at once."""
        self._accepting = False

    # --- health ---------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self._accepting and self.manager.server_ready()

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}

    # --- models ---------------------------------------------------------------
    def model_ready(self, name: str, version: str = "") -> bool:
        check_model_name(name)
        if version and not version.isdigit():
            raise InvalidArgument(f"invalid version '{version}' for model '{name}'")
        return self._accepting and self.manager.is_ready(name, version)

    def _serving(self, name: str, version: str) -> ServingVersion:
        check_model_name(name)
        return self.manager.get_serving(name, version)

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        sv = self._serving(name, version)
        rec = self.manager.records[name]
        cfg = sv.config
        batch = (-1,) if sv.max_batch_size > 0 else ()

        def tensors(infos: dict[str, TensorInfo]) -> list[dict[str, Any]]:
            return [
                {"name": t.name, "datatype": t.datatype, "shape": [*batch, *t.dims]}
                for t in infos.values()
            ]

        return {
            "name": name,
            "versions": [str(v) for v in sorted(rec.serving)],
            "platform": cfg.platform or cfg.backend,
            "inputs": tensors(sv.inputs),
            "outputs": tensors(sv.outputs),
        }

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self._serving(name, version).config

    async def infer(self, request: InferRequest) -> InferResponse:
        arrival = request.arrival_ns or time.monotonic_ns()
        if not self._accepting:
            raise Unavailable("Server is shutting down: new inference requests are refused")
        sv = self._serving(request.model_name, request.model_version)
        stats = sv.stats
        # Client mistakes are refused before the model sees them and, as in Triton, are not
        # counted as inference failures.
        try:
            batch, key = check_request(request, sv)
        except InvalidArgument as exc:
            exc.message = f"[request id: {request.id or '<id_unknown>'}] {exc.message}"
            raise
        params = request.parameters
        priority = _int_param(params, "priority") if params else 0
        timeout = _int_param(params, "timeout") if params else 0
        try:
            self._inflight += 1
            try:
                response = await sv.scheduler.submit(request, batch, key, priority, timeout)
            finally:
                self._inflight -= 1
                if self._idle is not None and self._inflight == 0:
                    self._idle.set()
        except ServerError as exc:
            stats.record_failure(
                time.monotonic_ns() - arrival,
                "REJECTED" if isinstance(exc, Unavailable) else "BACKEND",
            )
            raise
        response.model_name = request.model_name
        response.model_version = sv.version_str
        if not response.id:
            response.id = request.id
        wanted = request.outputs
        if wanted:
            outs = response.outputs
            missing = [o.name for o in wanted if o.name not in outs]
            if missing:
                stats.record_failure(time.monotonic_ns() - arrival, "BACKEND")
                raise Internal(  # the model's fault, not the client's
                    f"model '{request.model_name}' did not produce requested output(s) {missing}"
                )
            response.outputs = {o.name: outs[o.name] for o in wanted}
        dts = response.output_datatypes
        for out_name, arr in response.outputs.items():
            if out_name not in dts:
                dts[out_name] = _datatype_of(out_name, arr, sv)
        stats.record_success(time.monotonic_ns() - arrival)
        return response

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no inference is in flight (front-end side)."""
        if self._inflight == 0:
            return True
        self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    # --- repository -----------------------------------------------------------
    def _check_control(self) -> None:
        mode = self.config.control_mode
        if mode != ControlMode.EXPLICIT:
            # Triton's status (503) and words, plus the mode actually in force.
            raise Unavailable(
                "explicit model load / unload is not allowed if polling is enabled "
                f"(--model-control-mode={mode}; use --model-control-mode=explicit)"
            )

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return self.manager.index(ready_only)

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        check_model_name(name)
        self._check_control()
        if not self._accepting:
            raise Unavailable("Server is shutting down: model load refused")
        await self.manager.load(name, parameters)

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        check_model_name(name)
        self._check_control()
        dependents = bool((parameters or {}).get("unload_dependents", False))
        await self.manager.unload(name, dependents)

    # --- statistics -----------------------------------------------------------
    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        if not name:
            stats = [
                st.as_dict()
                for rec in self.manager.records.values()
                for v, st in sorted(rec.stats.items())
                if v in rec.serving
            ]
            return {"model_stats": stats}
        check_model_name(name)
        try:
            sv = self.manager.get_serving(name, version)
        except ServerError:
            if version:
                raise InvalidArgument(
                    f"requested model version is not available for model '{name}'"
                ) from None
            raise InvalidArgument(f"requested model '{name}' is not available") from None
        if version:
            return {"model_stats": [sv.stats.as_dict()]}
        rec = self.manager.records[name]
        return {"model_stats": [rec.stats[v].as_dict() for v in sorted(rec.serving)]}


def _datatype_of(name: str, arr: np.ndarray, sv: ServingVersion) -> str:
    info = sv.outputs.get(name)
    if info is not None and (
        arr.dtype == info.dtype or (info.datatype == "BYTES" and arr.dtype.kind in "OSU")
    ):
        return info.datatype
    dt = numpy_to_kserve(arr.dtype)
    if dt is None:
        raise InvalidArgument(f"output '{name}' has unsupported numpy dtype {arr.dtype}")
    return dt
