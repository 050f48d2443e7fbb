"""InferenceService: the one API both front-ends call (health, metadata, infer, repository
control, statistics). Front-ends only translate wire formats to these calls and map
``ServerError.status`` to their own codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from . import __version__
from .backends.python.model_control import ModelController
from .config import ControlMode, ServerConfig
from .core.registry import Registry, ServingVersion, TensorInfo
from .core.serving import Serving
from .core.shared_memory import SharedMemoryRegistry
from .core.validation import check_model_name
from .errors import InvalidArgument, ServerError, Unavailable, bad_version
from .observability.events import ControlEvents
from .observability.logsettings import LogSettings
from .protocol.datatypes import kserve_to_numpy
from .repository import versions
from .repository.control_file import ControlState
from .repository.manager import ModelManager
from .repository.on_demand import OnDemand
from .tracing import Tracer, parse_trace_flags
from .types import InferRequest, InferResponse

__all__ = ["InferenceService", "EXTENSIONS"]

log = logging.getLogger("sluice.manager")

EXTENSIONS = [
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "system_shared_memory",
    "trace",
    "logging",
]


_NOT_READY = "Server is not ready: inference is refused until it is (--traffic-follows-readiness)"


class InferenceService:
    def __init__(
        self,
        config: ServerConfig,
        manager: ModelManager,
        registry: Registry,
        serving: Serving,
        logs: LogSettings | None = None,
    ) -> None:
        self.config = config
        self.manager = manager  # load / unload / readiness
        self.registry = registry  # what serves (read only)
        self.shm = SharedMemoryRegistry()  # the system shared memory extension
        # the settings that the server's log handler filters with (logging extension)
        self.logs = logs or LogSettings(log_verbose_level=config.log_verbose)
        self.serving = serving
        # pb_utils.load_model / unload_model / is_model_ready in python models: this API
        serving.model_control = ModelController(self)
        # --model-control-state: recorded after every control call, restored at start
        self.control_state = (
            ControlState(Path(config.model_control_state), manager, registry)
            if config.model_control_state
            else None
        )
        # the trace extension: settings, sampling, the trace file / OpenTelemetry exporter
        self.tracer = Tracer(parse_trace_flags(config.trace_config))
        self._accepting = True
        self._inflight = 0
        self.events = ControlEvents()  # recent load/unload/traffic outcomes (dashboard)
        # --traffic-follows-readiness: no inference while not ready (a proxy goes elsewhere)
        self._gated = config.traffic_follows_readiness
        self._idle: asyncio.Event | None = None
        # --model-load-on-demand (repository/on_demand.py; set by server.build): requests load
        # the models they ask for; None when off
        self.on_demand: OnDemand | None = None

    # --- lifecycle ------------------------------------------------------------
    def stop_accepting(self) -> None:
        """Readiness turns false and new inference is refused, on every front-end at once."""
        self._accepting = False

    # --- health ---------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self._accepting and self.manager.server_ready()

    async def ready_checked(self) -> bool:
        """``ready()``, and with strict readiness every required model's own check too
        (python's ``is_ready``), as later Triton releases ask every ready model's instances
        from the server readiness endpoints."""
        if not self.ready():
            return False
        if not self.config.strict_readiness:
            return True
        versions = [
            sv for rec in self.registry.records() if rec.required for sv in rec.serving.values()
        ]
        return await self.serving.versions_ready(versions)

    def server_metadata(self) -> dict[str, Any]:
        return {
            "name": self.config.server_name,
            "version": __version__,
            "extensions": list(EXTENSIONS),
        }

    # --- models ---------------------------------------------------------------
    def model_ready(self, name: str, version: str = "") -> bool:
        check_model_name(name)
        if version and not version.isdigit():
            raise bad_version(name, version)
        return self._accepting and self.manager.is_ready(name, version)

    async def model_ready_checked(self, name: str, version: str = "") -> bool:
        """``model_ready()``, then the model's own check (python's ``is_ready``): the
        model readiness endpoints (HTTP ``/v2/models/<m>[/versions/<v>]/ready``, gRPC
        ModelReady)."""
        if not self.model_ready(name, version):
            return False
        try:
            sv = self.serving.get(name, version)
        except ServerError:
            return False
        return await self.serving.versions_ready([sv])

    def not_ready_reason(self, name: str) -> str:
        """Why a model that is not ready is not, where sluice knows more than "not ready":
        an eviction by on-demand loading (its index reason), else ""."""
        od = self.on_demand
        return od.evicted_reason(name) if od is not None else ""

    async def _serving(self, name: str, version: str) -> ServingVersion:
        """The version serving ``name``; with on-demand loading, loaded first if the model
        serves nothing (metadata and config are the first calls of many clients)."""
        check_model_name(name)
        return await self.serving.get_or_wake(name, version)

    async def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        sv = await self._serving(name, version)
        cfg = sv.config
        batch = (-1,) if sv.max_batch_size > 0 else ()

        def tensors(infos: dict[str, TensorInfo]) -> list[dict[str, Any]]:
            return [
                {"name": t.name, "datatype": t.datatype, "shape": [*batch, *t.dims]}
                for t in infos.values()
            ]

        return {
            "name": name,
            "versions": [str(v) for v in self.registry.versions(name)],
            "platform": cfg.platform or cfg.backend,
            "inputs": tensors(sv.inputs),
            "outputs": tensors(sv.outputs),
        }

    def served_models(self) -> list[tuple[str, int]]:
        """The models serving now, by name, each with the load time (whole seconds since the
        epoch) of the version a request naming none gets: the OpenAI-compatible model list."""
        return sorted(
            (rec.name, int(rec.latest.loaded_at))
            for rec in self.registry.records()
            if rec.latest is not None
        )

    async def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return (await self._serving(name, version)).config

    async def is_decoupled(self, name: str, version: str = "") -> bool:
        """Whether ``name``/``version`` answers a request with 0..N responses
        (``infer_stream``) rather than exactly one (``infer``); a model that is not serving
        raises as ``infer`` would (Triton's "Request for unknown model" texts)."""
        return (await self._serving(name, version)).decoupled

    def _admit(self, admitted: bool) -> None:
        """Refuse inference once the server is stopping (or, with
        --traffic-follows-readiness, not ready). ``admitted``: the front-end's transport
        already took the call as the server's own gate (gRPC under
        --traffic-follows-readiness stops taking calls at SIGTERM; one it took before is
        in flight, and refusing it would hand its client an error a proxy cannot pass on)."""
        if admitted:
            return
        if not self._accepting:
            raise Unavailable("Server is shutting down: new inference requests are refused")
        if self._gated and not self.manager.server_ready():
            raise Unavailable(_NOT_READY)

    async def infer(
        self,
        request: InferRequest,
        *,
        protocol: str = "",
        single: bool = False,
        admitted: bool = False,
    ) -> InferResponse:
        """One response (``serving.Serving.infer``); ``protocol`` ("HTTP end point",
        "ModelInfer RPC") words the refusal of a decoupled model as Triton does;
        ``admitted`` as in ``_admit``."""
        self._admit(admitted)
        if request.shm_inputs:
            self._read_shm_inputs(request)
        if request.shm_outputs:
            # copied before the request counts as a success: a region too small is a failure
            request.deliver = partial(self._write_shm_outputs, request)
        self._inflight += 1
        try:
            response = await self.serving.infer(request, protocol=protocol, single=single)
        finally:
            self._left()
        if request.deliver is not None:  # a path that counts no success of its own
            request.deliver = None
            self._write_shm_outputs(request, response)
        return response

    def _read_shm_inputs(self, request: InferRequest) -> None:
        assert request.shm_inputs is not None
        for name, (region, offset, size, datatype, shape) in request.shm_inputs.items():
            dtype = kserve_to_numpy(datatype)
            assert dtype is not None
            request.inputs[name] = self.shm.read(
                region, offset, size, dtype, shape, name, request.model_name
            )

    def _write_shm_outputs(self, request: InferRequest, response: InferResponse) -> None:
        """Outputs asked for in shared memory are copied into their region; the encoders then
        say where instead of sending the bytes."""
        assert request.outputs is not None
        for spec in request.outputs:
            if spec.name not in request.shm_outputs or spec.name not in response.outputs:
                continue
            p = spec.parameters
            written = self.shm.write(
                p["shared_memory_region"],
                p.get("shared_memory_offset", 0),
                p.get("shared_memory_byte_size", 0),
                response.outputs[spec.name],
                spec.name,
            )
            p["shared_memory_byte_size"] = written

    async def infer_stream(
        self, request: InferRequest, *, admitted: bool = False
    ) -> AsyncIterator[InferResponse]:
        """0..N responses of a decoupled model (exactly one otherwise); the last is final."""
        self._admit(admitted)
        self._inflight += 1
        try:
            async for response in self.serving.infer_stream(request):
                yield response
        finally:
            self._left()

    @property
    def inflight(self) -> int:
        """Inference requests in flight through this service, every front-end's."""
        return self._inflight

    def _left(self) -> None:
        self._inflight -= 1
        if self._idle is not None and self._inflight == 0:
            self._idle.set()

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

    async def refresh_repositories(self) -> None:
        """Object-storage repositories: mirrors brought up to date before the index is read
        (a failure is logged; the index then shows the last good listing)."""
        await self.manager.refresh_remote_logged("repository index")

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return self.manager.index(ready_only)

    @contextlib.contextmanager
    def _loading(self, name: str, version: Any = "") -> Iterator[None]:
        """A load's outcome in the control events; a failure also in the log, as Triton
        logs a failed load (the client has it in its answer; the operator, here)."""
        with self.events.record("load", name, version):
            try:
                yield
            except ServerError as exc:
                log.error("%s", exc)
                raise

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """A whole-model load; with the parameter "version" (gRPC's way), that version alone."""
        if parameters and "version" in parameters:
            rest = {k: v for k, v in parameters.items() if k != "version"}
            await self.load_model_version(name, parameters["version"], rest or None)
            return
        with self._loading(name):
            check_model_name(name)
            self._check_control()
            if not self._accepting:
                raise Unavailable("Server is shutting down: model load refused")
            try:
                await self.manager.load(name, parameters)
            finally:
                await self.control_state_changed()

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """A whole-model unload; with the parameter "version", that version alone."""
        params = parameters or {}
        if "version" in params:
            if params.get("unload_dependents", False):
                raise InvalidArgument(
                    f"failed to unload '{name}': 'unload_dependents' does not apply to the "
                    "unload of one version"
                )
            await self.unload_model_version(name, params["version"])
            return
        with self.events.record("unload", name):
            check_model_name(name)
            self._check_control()
            dependents = bool(params.get("unload_dependents", False))
            try:
                await self.manager.unload(name, dependents)
            finally:
                await self.control_state_changed()

    async def load_model_version(
        self, name: str, version: Any, parameters: dict[str, Any] | None = None
    ) -> None:
        """Load (or refresh) one version beside the serving ones (``repository/versions.py``)."""
        with self._loading(name, version):
            check_model_name(name)
            self._check_control()
            if not self._accepting:
                raise Unavailable("Server is shutting down: model load refused")
            try:
                await versions.load_version(self.manager, name, version, parameters)
            finally:
                await self.control_state_changed()

    async def unload_model_version(self, name: str, version: Any) -> None:
        """Unload one version; the others keep serving."""
        with self.events.record("unload", name, version):
            check_model_name(name)
            self._check_control()
            try:
                await versions.unload_version(self.manager, name, version)
            finally:
                await self.control_state_changed()

    def model_traffic(self, name: str) -> dict[str, Any]:
        """``{"model": m, "weights": {"1": 90, "2": 10}}`` (empty: no split)."""
        return versions.get_traffic(self.manager, name)

    async def set_model_traffic(self, name: str, doc: Any) -> dict[str, Any]:
        """Set or clear (``{"weights": {}}``) the split of requests naming no version."""
        if type(doc) is not dict or "weights" not in doc:
            raise InvalidArgument(
                f"traffic of model '{name}': the request must be a JSON object with 'weights', "
                'e.g. {"weights": {"1": 90, "2": 10}}'
            )
        with self.events.record("traffic", name, message=json.dumps(doc["weights"], default=str)):
            try:
                return versions.set_traffic(self.manager, name, doc["weights"])
            finally:
                await self.control_state_changed()

    async def control_state_changed(self) -> None:
        """Record the control state (``--model-control-state``) if it changed; not once
        shutdown has begun (the models are then being unloaded, which is not a change to
        remember)."""
        if self.control_state is not None and self._accepting:
            await self.control_state.save()

    # --- system shared memory extension ---------------------------------------
    def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.shm.register(name, key, offset, byte_size)

    def shm_unregister(self, name: str = "") -> None:
        self.shm.unregister(name)

    def shm_status(self, name: str = "") -> list[dict[str, Any]]:
        return self.shm.status(name)

    # --- logging extension ----------------------------------------------------
    def log_settings(self) -> dict[str, Any]:
        return self.logs.as_dict()

    def update_log_settings(self, doc: Any) -> dict[str, Any]:
        return self.logs.update(doc)

    # --- trace extension ------------------------------------------------------
    def trace_settings(self, model: str = "") -> list[tuple[str, Any]]:
        """The trace setting in force for ``model`` ("" = global) as (key, value) pairs (a key
        may repeat: OpenTelemetry ``resource``)."""
        self._check_traced_model(model)
        return self.tracer.settings(model)

    def update_trace_settings(self, model: str, doc: Any) -> list[tuple[str, Any]]:
        """Apply an update (Triton's wire form: strings, a list for ``trace_level``, None to
        clear) to the global setting or ``model``'s; answers the new setting."""
        self._check_traced_model(model)
        return self.tracer.update(model, doc)

    def _check_traced_model(self, model: str) -> None:
        if not model:
            return
        check_model_name(model)
        if not self.registry.versions(model):  # Triton's words (and 400) for a model not loaded
            raise InvalidArgument(f"Request for unknown model : {model}")

    # --- statistics -----------------------------------------------------------
    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        if not name:
            return {"model_stats": [st.as_dict() for st in self.registry.serving_stats()]}
        check_model_name(name)
        if version and not version.isdigit():
            raise bad_version(name, version)
        try:
            sv = self.serving.get(name, version)
        except ServerError:
            if version:
                raise InvalidArgument(
                    f"requested model version is not available for model '{name}'"
                ) from None
            raise InvalidArgument(f"requested model '{name}' is not available") from None
        if version:
            return {"model_stats": [sv.stats.as_dict()]}
        return {"model_stats": [st.as_dict() for st in self.registry.serving_stats(name)]}
