"""ModelManager: what is loaded, and the load / unload / reload procedures.

Rules of this file:
- One lock per model serialises its loads and unloads; different models load in parallel.
- A (re)load prepares every selected version beside what is serving and swaps the serving
  set in one assignment only when all of them started. On any failure the new instances are
  stopped, the old ones keep serving, and the error (file, line, field where known) is both
  raised and kept as the reason shown in the repository index.
- A version leaving service is first removed from the serving set (new requests no longer
  find it), then drained (its in-flight requests finish), then stopped.
- Nothing outside the model repositories is read: names are checked before any path is built.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import ModelInstance, ModelSpec, backend_for
from ..backends.ensemble import EnsembleBackend, composing_models
from ..config import ControlMode, ServerConfig
from ..errors import InvalidArgument, NotFound, ServerError, Unavailable, Unsupported
from ..scheduling.scheduler import Scheduler
from ..stats import ModelStats
from ..types import InferRequest, InferResponse
from ..validation import check_request
from . import layout
from .model_config import normalise, parse_config_json, read_config, validate
from .states import (
    LOADING,
    READY,
    UNAVAILABLE,
    UNLOADING,
    ModelRecord,
    ServingVersion,
    tensor_infos,
)

__all__ = ["ModelManager"]

log = logging.getLogger("sluice.manager")


def _has_gpu() -> bool:
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


class ModelManager:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.repositories = tuple(Path(p).resolve() for p in config.model_repositories)
        self.records: dict[str, ModelRecord] = {}
        self._override_dirs: dict[str, Path] = {}
        self._poll_task: asyncio.Task[None] | None = None
        self.startup_done = False
        # ensemble name -> its composing models (an ensemble is ready only while they are)
        self._ensembles: dict[str, list[str]] = {}

    # ---------------------------------------------------------------- lookups
    def record(self, name: str) -> ModelRecord:
        rec = self.records.get(name)
        if rec is None:
            rec = self.records[name] = ModelRecord(name)
        return rec

    def get_serving(self, name: str, version: str = "") -> ServingVersion:
        """The version that serves ``name``/``version``; raises NotFound with Triton's texts
        (plus the state and reason when the model is known but not serving)."""
        rec = self.records.get(name)
        if version:
            try:
                v = int(version)
            except ValueError:
                raise InvalidArgument(
                    f"invalid version '{version}' for model '{name}': a version is a number"
                ) from None
            if rec is not None:
                sv = rec.serving.get(v)
                if sv is not None:
                    return sv
                if rec.serving:
                    raise NotFound(
                        f"Request for unknown model: '{name}' version {version} is not "
                        f"found (serving versions: "
                        f"{', '.join(map(str, sorted(rec.serving)))})"
                    )
        elif rec is not None and rec.latest is not None:
            return rec.latest
        raise self._not_serving(name)

    def _not_serving(self, name: str) -> ServerError:
        layout.check_model_name(name)
        rec = self.records.get(name)
        if rec is not None and rec.states:
            state, reason = rec.states.get(-1) or next(iter(rec.states.values()))
            detail = f"; state {state}" + (f": {reason}" if reason else "")
            return NotFound(
                f"Request for unknown model: '{name}' has no available versions{detail}"
            )
        return NotFound(f"Request for unknown model: '{name}' is not found")

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.get_serving(name, version)
        except ServerError:
            return False
        return all(self.is_ready(m) for m in self._ensembles.get(name, ()))

    def server_ready(self) -> bool:
        if not self.startup_done:
            return False
        if not self.config.strict_readiness:
            return True
        return all(
            rec.ready and self.is_ready(rec.name) for rec in self.records.values() if rec.required
        )

    def all_serving(self) -> Iterable[ServingVersion]:
        for rec in list(self.records.values()):
            yield from rec.serving.values()

    # ----------------------------------------------------------------- index
    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        names = set(layout.list_models(self.repositories)) | set(self.records)
        out: list[dict[str, str]] = []
        for name in sorted(names):
            rec = self.records.get(name)
            if rec is None or (not rec.states and not rec.serving):
                if not ready_only:
                    out.append({"name": name})  # known on disk, never loaded (as Triton)
                continue
            for v, (state, reason) in sorted(rec.states.items()):
                if ready_only and state != READY:
                    continue
                entry = {"name": name}
                if v >= 0:
                    entry["version"] = str(v)
                entry["state"] = state
                if reason:
                    entry["reason"] = reason
                out.append(entry)
        return out

    # ------------------------------------------------------------------ start
    async def startup(self) -> list[str]:
        """Load what the control mode says; returns the names that failed."""
        mode = self.config.control_mode
        if mode == ControlMode.EXPLICIT:
            names = list(self.config.load_models)
            if names == ["*"]:
                names = list(layout.list_models(self.repositories))
        else:
            names = list(layout.list_models(self.repositories))
        # ensembles after the models they compose (they check those at load)
        ensembles = [n for n in names if self._is_ensemble(n)]
        plain = [n for n in names if n not in ensembles]
        results = await asyncio.gather(*(self._startup_load(n) for n in plain))
        results += await asyncio.gather(*(self._startup_load(n) for n in ensembles))
        names = plain + ensembles
        self.startup_done = True
        if mode == ControlMode.POLL:
            self._poll_task = asyncio.get_running_loop().create_task(self._poll_loop())
        return [n for n, ok in zip(names, results, strict=True) if not ok]

    def _is_ensemble(self, name: str) -> bool:
        try:
            config, _present = read_config(layout.find_model_dir(self.repositories, name))
        except ServerError:
            return False
        return config.platform == "ensemble"

    async def _startup_load(self, name: str) -> bool:
        self.record(name).required = True
        try:
            await self.load(name)
            return True
        except ServerError as exc:
            log.error("failed to load '%s': %s", name, exc)
            return False

    # ------------------------------------------------------------------- load
    async def load(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        layout.check_model_name(name)
        params = parameters or {}
        config_json = params.get("config")
        files = {k[5:]: v for k, v in params.items() if k.startswith("file:")}
        if files and not config_json:
            raise InvalidArgument(
                f"failed to load '{name}': file override parameters ('file:...') require the "
                "'config' parameter"
            )
        unknown = [k for k in params if k != "config" and not k.startswith("file:")]
        if unknown:
            log.warning("load '%s': ignoring unknown parameter(s) %s", name, unknown)
        rec = self.record(name)
        async with rec.lock:
            try:
                model_dir = (
                    self._write_override(name, files)
                    if files
                    else layout.find_model_dir(self.repositories, name)
                )
                await self._load_locked(rec, model_dir, config_json)
            except ServerError as exc:
                if not rec.serving and not any(
                    state == UNAVAILABLE and reason == str(exc)
                    for state, reason in rec.states.values()
                ):
                    # failed before any version was tried (config, files): the model as a whole
                    rec.states = {v: st for v, st in rec.states.items() if v in rec.serving}
                    rec.states[-1] = (UNAVAILABLE, str(exc))
                raise
        rec.required = True

    def _write_override(self, name: str, files: dict[str, Any]) -> Path:
        root = Path(tempfile.mkdtemp(prefix="sluice-override-"))
        model_dir = root / name
        model_dir.mkdir()
        for rel, content in files.items():
            parts = Path(rel).parts
            if not parts or any(p in ("", ".", "..") for p in parts) or Path(rel).is_absolute():
                shutil.rmtree(root, ignore_errors=True)
                raise InvalidArgument(f"invalid file override path 'file:{rel}' for model '{name}'")
            data = content if isinstance(content, bytes) else base64.b64decode(str(content))
            target = model_dir.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        old = self._override_dirs.pop(name, None)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self._override_dirs[name] = root
        return model_dir

    def _read_config(
        self, model_dir: Path, config_json: str | None, versions: list[int]
    ) -> mc.ModelConfig:
        source = str(model_dir / "config.pbtxt")
        if config_json:
            config = parse_config_json(config_json)
            source = "'config' parameter"
        else:
            config, _present = read_config(model_dir)
        config = normalise(config, model_dir, versions)
        validate(config, source)
        return config

    async def _load_locked(
        self, rec: ModelRecord, model_dir: Path, config_json: str | None
    ) -> None:
        name = rec.name
        t0 = time.monotonic()
        versions = layout.list_versions(model_dir)
        config = self._read_config(model_dir, config_json, versions)
        backend = backend_for(config)
        composing: list[str] = []
        if config.platform == "ensemble":
            composing = composing_models(config)
            await self._ensure_loaded(name, composing)
            backend = EnsembleBackend(self.infer_composing, self._serving_config)
        if backend is None:
            raise Unsupported(
                f"failed to load '{name}': unsupported backend '{config.backend or config.platform}'"
                " (supported: python, onnxruntime, pytorch, tensorrt, ensemble)"
            )
        if not versions:
            raise NotFound(
                f"failed to load '{name}': no version directory found in {model_dir} "
                "(versions are numeric directories such as 1/)"
            )
        selected = layout.select_versions(config, versions)
        settings = {k: v for b, k, v in self.config.backend_config if b in ("", config.backend)}
        if backend is not None and not self.config.disable_auto_complete_config:
            probe = ModelSpec(
                name,
                selected[-1],
                model_dir,
                model_dir / str(selected[-1]),
                config,
                model_dir.parent,
                settings,
            )
            config = await asyncio.get_running_loop().run_in_executor(
                None, backend.auto_complete, probe
            )
            validate(config, str(model_dir / "config.pbtxt"))
        self._check_devices(name, config)
        for v in selected:
            if v not in rec.serving:
                rec.states[v] = (LOADING, "")
        rec.states.pop(-1, None)
        new: dict[int, ServingVersion] = {}
        started: list[ModelInstance] = []
        try:
            for v in selected:
                spec = ModelSpec(
                    name, v, model_dir, model_dir / str(v), config, model_dir.parent, settings
                )
                fname = config.default_model_filename or (
                    backend.default_model_filename() if backend else ""
                )
                if fname and not (spec.version_dir / fname).exists():
                    raise NotFound(
                        f"failed to load '{name}' version {v}: model file "
                        f"{spec.version_dir / fname} not found"
                    )
                instances = backend.create_instances(spec) if backend else []
                results = await asyncio.gather(
                    *(i.start() for i in instances), return_exceptions=True
                )
                for inst, res in zip(instances, results, strict=True):
                    if not isinstance(res, BaseException):
                        started.append(inst)
                errors = [r for r in results if isinstance(r, BaseException)]
                if errors:
                    # Triton answers 400 for a version that fails to initialize.
                    raise InvalidArgument(
                        f"load failed for model '{name}': version {v} is at "
                        f"UNAVAILABLE state: {errors[0]}"
                    ) from errors[0]
                stats = rec.stats.get(v) or ModelStats(name, str(v))
                rec.stats[v] = stats
                scheduler = Scheduler(name, str(v), config, instances, stats)
                inputs = tensor_infos(list(config.input))
                new[v] = ServingVersion(
                    spec=spec,
                    scheduler=scheduler,
                    stats=stats,
                    inputs=inputs,
                    outputs=tensor_infos(list(config.output)),
                    required_inputs=frozenset(n for n, t in inputs.items() if not t.optional),
                    max_batch_size=config.max_batch_size,
                    version_str=str(v),
                )
        except BaseException as exc:
            await asyncio.gather(*(i.stop() for i in started), return_exceptions=True)
            for v in selected:
                if v not in rec.serving:
                    rec.states[v] = (UNAVAILABLE, str(exc))
            raise
        load_secs = time.monotonic() - t0
        for sv in new.values():
            sv.stats.load_duration_secs = load_secs
        old = rec.serving
        rec.set_serving(new)  # the atomic swap
        self._ensembles.pop(name, None)
        if composing:
            self._ensembles[name] = composing
            for m in composing:
                self.record(m).dependents.add(name)
        rec.states = {v: (READY, "") for v in new}
        retiring = list(old.values())
        for sv in retiring:
            if sv.spec.version not in new:
                rec.states[sv.spec.version] = (UNLOADING, "")
        await self._retire(retiring)
        for sv in retiring:
            if sv.spec.version not in new:
                rec.states[sv.spec.version] = (UNAVAILABLE, "unloaded")
        log.info("loaded '%s' version(s) %s in %.2fs", name, sorted(new), load_secs)

    # -------------------------------------------------------------- ensembles
    async def _ensure_loaded(self, ensemble: str, models: list[str]) -> None:
        """Load the composing models that are not serving (as Triton does in explicit mode);
        a failure fails the ensemble's load naming the composing model."""
        for m in models:
            if m == ensemble:
                raise InvalidArgument(f"failed to load '{ensemble}': it names itself as a step")
            rec = self.record(m)
            if rec.serving:
                continue
            async with rec.lock:  # wait out a load of it already under way
                serving = bool(rec.serving)
            if serving:
                continue
            try:
                await self.load(m)
            except ServerError as exc:
                raise type(exc)(
                    f"failed to load '{ensemble}': composing model '{m}' failed to load: {exc}",
                    exc.status,
                ) from None

    def _serving_config(self, name: str, version: str) -> mc.ModelConfig | None:
        try:
            return self.get_serving(name, version).config
        except ServerError:
            return None

    async def infer_composing(self, request: InferRequest) -> InferResponse:
        """An ensemble step: the service's path (validation, the model's own scheduler,
        its statistics) without the front-end."""
        arrival = time.monotonic_ns()
        sv = self.get_serving(request.model_name, request.model_version)
        batch, key = check_request(request, sv)
        try:
            response = await sv.scheduler.submit(request, batch, key)
        except ServerError as exc:
            sv.stats.record_failure(
                time.monotonic_ns() - arrival,
                "REJECTED" if isinstance(exc, Unavailable) else "BACKEND",
            )
            raise
        sv.stats.record_success(time.monotonic_ns() - arrival)
        return response

    def _check_devices(self, name: str, config: mc.ModelConfig) -> None:
        for group in config.instance_group:
            if group.kind == mc.ModelInstanceGroup.KIND_GPU and not _has_gpu():
                raise InvalidArgument(
                    f"failed to load '{name}': instance_group '{group.name}' asks for KIND_GPU but "
                    "this machine has no GPU; use KIND_CPU (or KIND_AUTO)"
                )

    async def _retire(self, versions: list[ServingVersion]) -> None:
        async def one(sv: ServingVersion) -> None:
            await sv.scheduler.drain()
            await sv.scheduler.stop()

        await asyncio.gather(*(one(sv) for sv in versions))

    # ----------------------------------------------------------------- unload
    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        layout.check_model_name(name)
        rec = self.records.get(name)
        if rec is None:
            # Triton answers success for a model it does not know; so do we.
            return
        async with rec.lock:
            old = list(rec.serving.values())
            rec.set_serving({})
            for sv in old:
                rec.states[sv.spec.version] = (UNLOADING, "")
            rec.required = False
            await self._retire(old)
            for sv in old:
                rec.states[sv.spec.version] = (UNAVAILABLE, "unloaded")
        for m in self._ensembles.pop(name, ()):
            if m in self.records:
                self.records[m].dependents.discard(name)
        if unload_dependents:
            for dep in sorted(rec.dependents):
                await self.unload(dep)

    async def shutdown(self, timeout: float) -> bool:
        """Drain every serving version (up to ``timeout``), then stop all. True if drained."""
        if self._poll_task is not None:
            self._poll_task.cancel()
        serving = list(self.all_serving())
        drained = True
        try:
            await asyncio.wait_for(
                asyncio.gather(*(sv.scheduler.drain() for sv in serving)), timeout=timeout
            )
        except TimeoutError:
            drained = False
            err = Unavailable(
                "Server is shutting down: request did not finish within "
                f"--exit-timeout-secs={timeout:g}"
            )
            for sv in serving:
                sv.scheduler.fail_queued(err)
        for rec in self.records.values():
            rec.set_serving({})
        grace = None if drained else 0.0
        await asyncio.gather(*(sv.scheduler.stop(grace) for sv in serving), return_exceptions=True)
        for root in self._override_dirs.values():
            shutil.rmtree(root, ignore_errors=True)
        return drained

    # ------------------------------------------------------------------- poll
    def _signature(self, model_dir: Path) -> tuple[object, ...]:
        sig: list[object] = []
        try:
            for entry in sorted(os.scandir(model_dir), key=lambda e: e.name):
                st = entry.stat()
                sig.append((entry.name, st.st_mtime_ns, st.st_size))
                if entry.is_dir():
                    for sub in sorted(os.scandir(entry.path), key=lambda e: e.name):
                        sst = sub.stat()
                        sig.append((entry.name, sub.name, sst.st_mtime_ns, sst.st_size))
        except OSError:
            return ()
        return tuple(sig)

    async def poll_once(self) -> None:
        present = layout.list_models(self.repositories)
        for name, model_dir in present.items():
            sig = self._signature(model_dir)
            rec = self.records.get(name)
            if rec is not None and rec.signature == sig:
                continue
            self.record(name).signature = sig
            self.record(name).required = True
            try:
                await self.load(name)
            except ServerError as exc:
                log.error("poll: failed to load '%s': %s", name, exc)
        for name in list(self.records):
            if name not in present and self.records[name].serving:
                log.info("poll: model '%s' was removed from the repository; unloading", name)
                await self.unload(name)

    async def _poll_loop(self) -> None:
        for name, model_dir in layout.list_models(self.repositories).items():
            self.record(name).signature = self._signature(model_dir)
        while True:
            await asyncio.sleep(self.config.repository_poll_secs)
            try:
                await self.poll_once()
            except Exception:
                log.exception("repository poll failed")
