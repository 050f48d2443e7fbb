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
import binascii
import hashlib
import itertools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import ModelInstance, ModelSpec, backend_for
from ..backends.ensemble import EnsembleBackend, composing_models
from ..config import ControlMode, ServerConfig
from ..core.registry import (
    LOADING,
    READY,
    UNAVAILABLE,
    UNLOADING,
    ModelRecord,
    Registry,
    ServingVersion,
)
from ..core.serving import Serving
from ..core.stats import FirstResponseHistogram, LatencySummaries, ModelStats
from ..core.validation import check_model_name
from ..errors import InvalidArgument, NotFound, ServerError, Unavailable, Unsupported
from ..types import InferRequest, InferResponse
from . import layout
from .admission import MemoryAdmission
from .agents import run_agents
from .devices import check_devices
from .load_book import LoadBook, Override, Signature
from .model_config import config_path, normalise, parse_config_json, read_config, validate
from .prepare import start_version
from .remote import RemoteRepositories

__all__ = ["ModelManager", "parse_load_params", "load_failure"]


def load_failure(name: str, exc: ServerError, what: str = "") -> ServerError:
    """``exc`` with its message led by Triton's phrase "failed to load '<name>'" (clients
    and Triton's own examples match on it), the precise cause after it; same status."""
    prefix = f"failed to load '{name}'"
    # an instance that failed to start already carries Triton's phrase for that case
    if not exc.message.startswith((prefix, f"load failed for model '{name}'")):
        exc.message = f"{prefix}{what}: {exc.message}"
        exc.args = (exc.message,)
    return exc


log = logging.getLogger("sluice.manager")

# the reason a READY version shows in the index after a reload of its model failed
RELOAD_FAILED = "serving the last good load; a reload failed"


def _file_bytes(name: str, key: str, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(
            f"failed to load '{name}': parameter '{key}' is not valid base64"
        ) from None


def parse_load_params(
    name: str, parameters: dict[str, Any] | None
) -> tuple[str | None, dict[str, bytes]]:
    """A load's parameters -> (the 'config' JSON or None, {path: contents} of 'file:<path>')."""
    params = parameters or {}
    unknown = sorted(k for k in params if k != "config" and not k.startswith("file:"))
    if unknown:
        raise InvalidArgument(
            f"failed to load '{name}': unknown load parameter(s) {unknown}; accepted: "
            "'config' (a JSON model configuration) and 'file:<path>' (file contents)"
        )
    config_json = params.get("config")
    files = {k[5:]: _file_bytes(name, k, v) for k, v in params.items() if k.startswith("file:")}
    if files and not config_json:
        raise InvalidArgument(
            f"failed to load '{name}': file override parameters ('file:...') require the "
            "'config' parameter"
        )
    if config_json is not None and not isinstance(config_json, str):
        raise InvalidArgument(
            f"failed to load '{name}': the 'config' parameter must be a string holding a "
            "JSON model configuration"
        )
    return config_json, files


def _override_key(config_json: str | None, files: dict[str, bytes]) -> tuple[object, ...] | None:
    """What makes two overrides the same: the config as a message (not its spelling) and
    the files' contents."""
    if config_json is None:
        return None
    try:
        config = parse_config_json(config_json).SerializeToString(deterministic=True)
    except ServerError:
        config = config_json.encode()  # fails the load later, with the parse error
    digests = tuple(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items()))
    return (config, digests)


def _changed_paths(
    old: tuple[tuple[str, int, int], ...], new: tuple[tuple[str, int, int], ...]
) -> list[str]:
    before = {path: rest for path, *rest in old}
    after = {path: rest for path, *rest in new}
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


class ModelManager:
    """Loads, unloads and polls; the one writer of ``registry`` (through its write methods).
    ``serving`` is the request path over the same registry: ensemble steps and BLS calls of
    the versions loaded here go through it."""

    def __init__(
        self,
        config: ServerConfig,
        registry: Registry,
        serving: Serving,
        remotes: RemoteRepositories | None = None,
    ) -> None:
        self.config = config
        # object-storage repositories: their mirrors are among ``repositories`` and are
        # refreshed before each scan (start, poll tick, index, load)
        self.remotes = remotes
        self.repositories = tuple(Path(p).resolve() for p in config.model_repositories)
        self.registry = registry
        # the one request path (clients, ensemble steps, BLS)
        self.serving = serving
        self.admission = MemoryAdmission(config.model_memory_limit)
        self._override_dirs: dict[str, Path] = {}
        self._poll_task: asyncio.Task[None] | None = None
        self.startup_done = False
        # ensemble name -> its composing models (an ensemble is ready only while they are)
        self._ensembles: dict[str, list[str]] = {}
        # one number per load of a version (``ServingVersion.generation``, the cache key's)
        self._generations = itertools.count(1)
        # each model's book of loads (lock, signature, overrides), beside its registry record
        self._books: dict[str, LoadBook] = {}

    # ---------------------------------------------------------------- lookups
    def list_models(self) -> dict[str, Path]:
        """Model key -> directory across the repositories (qualified keys for a name in
        several of them under --model-namespacing: ``layout``)."""
        return layout.list_models(self.repositories, self.config.model_namespacing)

    def keys_of(self, name: str) -> list[str]:
        """The keys a plain name stands for: itself, or under --model-namespacing each
        repository's model of that name (Triton loads and unloads them all)."""
        if not self.config.model_namespacing or layout.is_qualified(name):
            return [name]
        keys = [k for k in self.list_models() if layout.display_name(k) == name]
        keys += [
            r.name
            for r in self.registry.records()
            if layout.is_qualified(r.name)
            and layout.display_name(r.name) == name
            and r.name not in keys
        ]
        return keys if len(keys) > 1 or (keys and keys[0] != name) else [name]

    def namespace_of(self, key: str) -> str:
        """The repository of a model (Triton's ``namespace`` label under namespacing)."""
        if layout.is_qualified(key):
            return str(Path(key).parent)
        found = layout.find_model_dir_or_none(self.repositories, key)
        return str(found.parent) if found is not None else ""

    def record(self, name: str) -> ModelRecord:
        """The registry's record of ``name`` (made if there is none)."""
        return self.registry.record(name)

    @property
    def books(self) -> Mapping[str, LoadBook]:
        """Every model's book of loads, by name (read-only)."""
        return self._books

    def book(self, name: str) -> LoadBook:
        """The book of ``name``'s loads (made if there is none): its ``lock`` serialises
        them. Made and forgotten together with the registry's record."""
        book = self._books.get(name)
        if book is None:
            self.registry.record(name)
            book = self._books[name] = LoadBook()
        return book

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.serving.get(name, version)
        except ServerError:
            return False
        return all(self.is_ready(m) for m in self._ensembles.get(name, ()))

    def server_ready(self) -> bool:
        if not self.startup_done:
            return False
        if not self.config.strict_readiness:
            return True
        return all(
            rec.ready and self.is_ready(rec.name) for rec in self.registry.records() if rec.required
        )

    def all_serving(self) -> Iterable[ServingVersion]:
        return self.registry.all_serving()

    # ---------------------------------------------------------------- remotes
    async def refresh_remote(self) -> None:
        """Bring the mirrors of the object-storage repositories up to date (nothing without
        any); RepositoryError (HTTP 400) naming each URL that failed."""
        if self.remotes:
            await self.remotes.refresh()

    async def refresh_remote_logged(self, why: str) -> bool:
        """``refresh_remote``, a failure logged (what serves keeps serving); True if it
        worked."""
        try:
            await self.refresh_remote()
        except ServerError as exc:
            log.error("%s: %s", why, exc)
            return False
        return True

    # ----------------------------------------------------------------- index
    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model in the repositories, plus models still loaded (or loading) whose
        directory is gone or that came from file overrides, as Triton lists them. A failed
        load of a name that is in no repository leaves nothing here."""
        names = set(self.list_models())
        names.update(rec.name for rec in self.registry.records() if rec.present)
        out: list[dict[str, str]] = []
        order = sorted(names)
        if self.config.model_namespacing:  # by repository, then name, as Triton lists them
            order.sort(key=lambda k: (self.namespace_of(k), layout.display_name(k)))
        for name in order:
            rec = self.registry.get(name)
            if rec is None or (not rec.states and not rec.serving):
                if not ready_only:
                    # known on disk, never loaded (as Triton)
                    out.append({"name": layout.display_name(name)})
                continue
            for v, (state, reason) in sorted(rec.states.items()):
                if ready_only and state != READY:
                    continue
                entry = {"name": layout.display_name(name)}
                if v >= 0:
                    entry["version"] = str(v)
                entry["state"] = state
                if reason:
                    entry["reason"] = reason
                out.append(entry)
        return out

    def in_repository(self, key: str) -> bool:
        """A repository holds the model of this key (under namespacing the key must be the
        one the scan gives now: a name that gained or lost a second repository changes)."""
        if self.config.model_namespacing:
            return key in self.list_models()
        return layout.find_model_dir_or_none(self.repositories, key) is not None

    def forget_if_unknown(self, rec: ModelRecord) -> None:
        """Drop the record of a name that serves nothing and is in no repository, so that
        loads of made-up names cannot grow the index or the server's memory."""
        if (
            self.registry.get(rec.name) is rec
            and not rec.present
            and not (rec.name in self._books and self._books[rec.name].dependents)
            and rec.name not in self._ensembles
            and not self.in_repository(rec.name)
        ):
            self.registry.forget(rec.name)
            self._books.pop(rec.name, None)

    # ------------------------------------------------------------------ start
    async def startup(self) -> list[str]:
        """Load what the control mode says; returns the names that failed. The server
        sets ``startup_done`` (readiness) once it has also recorded the control state."""
        mode = self.config.control_mode
        if mode == ControlMode.EXPLICIT:
            names = list(self.config.load_models)
            if names == ["*"]:
                names = list(self.list_models())
        elif self.config.model_load_on_demand:
            names = []  # mode none, on demand: requests load the models (pinned ones below)
        else:
            names = list(self.list_models())
        names += [n for n in self.config.model_pins if n not in names]
        # ensembles after the models they compose (they check those at load)
        ensembles = [n for n in names if self.is_ensemble(n)]
        plain = [n for n in names if n not in ensembles]
        results = await asyncio.gather(*(self._startup_load(n) for n in plain))
        results += await asyncio.gather(*(self._startup_load(n) for n in ensembles))
        names = plain + ensembles
        if mode == ControlMode.POLL:
            self._poll_task = asyncio.get_running_loop().create_task(self._poll_loop())
        return [n for n, ok in zip(names, results, strict=True) if not ok]

    def is_ensemble(self, name: str) -> bool:
        try:
            config, _present = read_config(
                layout.find_model_dir(self.repositories, name), self.config.model_config_name
            )
        except ServerError:
            return False
        return config.platform == "ensemble"

    async def _startup_load(self, name: str) -> bool:
        self.registry.set_required(name, True)
        try:
            await self.load(name, refresh=False)  # the server refreshed before the start
            return True
        except ServerError as exc:
            log.error("%s", load_failure(name, exc))
            return False

    # ------------------------------------------------------------------- load
    async def load(
        self, name: str, parameters: dict[str, Any] | None = None, refresh: bool = True
    ) -> None:
        """Load ``name``, or reload it if its files or the override changed since it was
        loaded. A load of a serving model whose directory and override are unchanged does
        nothing (as Triton): a plain load keeps an override given earlier in force. Every
        failure's message starts with Triton's "failed to load '<name>'"."""
        if not layout.is_qualified(name):
            try:
                check_model_name(name)
            except ServerError as exc:
                raise load_failure(name, exc) from None
            keys = self.keys_of(name)
            if keys != [name]:  # namespacing: every repository's model of that name
                results = await asyncio.gather(
                    *(self.load(k, parameters, refresh) for k in keys), return_exceptions=True
                )
                for r in results:
                    if isinstance(r, BaseException):
                        raise r
                return
        shown = layout.display_name(name)
        try:
            config_json, files = parse_load_params(shown, parameters)
            override = _override_key(config_json, files)
            while True:
                book = self.book(name)
                rec = self.record(name)
                async with book.lock:
                    if self._books.get(name) is not book or self.registry.get(name) is not rec:
                        continue  # forgotten while we waited for its lock: start again
                    try:
                        await self._load_if_changed(
                            rec, book, config_json, files, override, refresh
                        )
                    except NotFound:
                        self.forget_if_unknown(rec)
                        raise
                    break
        except ServerError as exc:
            raise load_failure(shown, exc) from None
        self.registry.set_required(name, True)

    async def _load_if_changed(
        self,
        rec: ModelRecord,
        book: LoadBook,
        config_json: str | None,
        files: dict[str, bytes],
        override: tuple[object, ...] | None,
        refresh: bool = True,
    ) -> None:
        name = rec.name
        if refresh and self.remotes:
            try:
                await self.refresh_remote()
            except ServerError as exc:
                self._record_failure(rec, exc)
                raise
        repo_dir = layout.find_model_dir_or_none(self.repositories, name)
        if repo_dir is None and not files:
            layout.find_model_dir(self.repositories, name)  # raises Triton's NotFound
        signature = self.directory_signature(repo_dir) if repo_dir is not None else ()
        why = "first load"
        if rec.serving and book.loaded is not None:
            loaded_signature, loaded_override = book.loaded
            changed = _changed_paths(loaded_signature, signature)
            if not changed and (override is None or override == loaded_override):
                book.signature = signature
                log.info(
                    "load '%s': nothing changed since it was loaded (files%s); not reloaded, "
                    "version(s) %s keep serving",
                    name,
                    ", override" if loaded_override is not None else "",
                    sorted(rec.serving),
                )
                return
            if changed:
                why = "changed: " + ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
                if override is None and loaded_override is not None:
                    why += "; the earlier 'config' override is dropped (loading the files)"
            else:
                why = "new override"
        elif override is not None:
            why = "override"
        book.signature = signature
        try:
            model_dir = self.write_override(name, files) if files else repo_dir
            assert model_dir is not None
            await self.load_locked(rec, model_dir, config_json, why)
        except ServerError as exc:
            self._record_failure(rec, exc)
            raise
        book.loaded = (signature, override)
        # a whole-model load serves the version_policy with one config: per-version loads reset
        book.override = Override(config_json, files) if config_json is not None else None
        book.version_overrides.clear()

    def _record_failure(self, rec: ModelRecord, exc: ServerError) -> None:
        """The index's reason for a failed (re)load of ``rec``."""
        name = rec.name
        for v in rec.serving:
            # what was loaded before keeps serving: its entry says why the files now on
            # disk do not (a poll retries only once they change again)
            if rec.states.get(v, (READY, ""))[0] == READY:
                self.registry.set_state(name, v, READY, f"{RELOAD_FAILED}: {exc}")
        if not rec.serving and not any(
            state == UNAVAILABLE and reason == str(exc) for state, reason in rec.states.values()
        ):
            # failed before any version was tried (config, files): the model as a whole
            kept = {v: st for v, st in rec.states.items() if v in rec.serving}
            self.registry.set_states(name, {**kept, -1: (UNAVAILABLE, str(exc))})

    def write_override(self, name: str, files: dict[str, bytes], slot: str = "") -> Path:
        """The override files as a model directory; ``slot`` (default: the model's name) keys
        the directory replaced by the next override of the same slot."""
        slot = slot or name
        root = Path(tempfile.mkdtemp(prefix="sluice-override-"))
        model_dir = root / name
        model_dir.mkdir()
        for rel, data in files.items():
            parts = Path(rel).parts
            if not parts or any(p in ("", ".", "..") for p in parts) or Path(rel).is_absolute():
                shutil.rmtree(root, ignore_errors=True)
                raise InvalidArgument(f"invalid file override path 'file:{rel}' for model '{name}'")
            target = model_dir.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        self.drop_override(slot)
        self._override_dirs[slot] = root
        return model_dir

    def override_dir(self, slot: str) -> Path | None:
        """The model directory the override of ``slot`` wrote (``write_override``), if any."""
        root = self._override_dirs.get(slot)
        return root / slot.split("/")[0] if root is not None else None

    def drop_override(self, slot: str) -> None:
        """Delete the override files of ``slot`` (nothing if there are none)."""
        old = self._override_dirs.pop(slot, None)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _read_config(
        self, model_dir: Path, config_json: str | None, versions: list[int]
    ) -> mc.ModelConfig:
        source = str(config_path(model_dir, self.config.model_config_name))
        if config_json:
            source = "the 'config' parameter of the load"
            config = parse_config_json(config_json)
        else:
            config, _present = read_config(model_dir, self.config.model_config_name)
        config = normalise(config, model_dir, versions, source)
        self._warn(config.name or model_dir.name, validate(config, source))
        return config

    @staticmethod
    def _warn(name: str, warnings: list[str]) -> None:
        for text in warnings:
            log.warning("model '%s': %s", name, text)

    async def load_locked(
        self,
        rec: ModelRecord,
        model_dir: Path,
        config_json: str | None,
        why: str,
        only: int | None = None,
    ) -> None:
        """Prepare the versions the version_policy selects and swap them in for the serving
        set; with ``only``, prepare just that version and swap it in beside the others
        (a per-version load, ``versions.py``)."""
        name = rec.name
        shown = layout.display_name(name)  # the model's name (``name`` may be a qualified key)
        t0 = time.monotonic()
        versions = layout.list_versions(model_dir)
        config = self._read_config(model_dir, config_json, versions)
        await run_agents(config, model_dir)  # checksum: the files are the ones expected
        backend = backend_for(config)
        composing: list[str] = []
        if config.platform == "ensemble":
            steps = self._step_keys(name, composing_models(config))
            composing = sorted(set(steps.values()))
            await self._ensure_loaded(name, composing)
            backend = self._ensemble_backend(steps)
        if backend is None:
            raise Unsupported(
                f"failed to load '{shown}': unsupported backend '{config.backend or config.platform}'"
                " (supported: python, onnxruntime, pytorch, tensorrt, ensemble)"
            )
        if not versions:
            raise NotFound(
                f"failed to load '{shown}': no version directory found in {model_dir} "
                "(versions are numeric directories such as 1/)"
            )
        if only is None:
            selected = layout.select_versions(config, versions)
        elif only in versions:
            selected = [only]
        else:
            raise NotFound(
                f"failed to load '{shown}' version {only}: no version directory "
                f"{model_dir / str(only)} (versions: {', '.join(map(str, versions))})"
            )
        settings = {k: v for b, k, v in self.config.backend_config if b in ("", config.backend)}
        if backend is not None and not self.config.disable_auto_complete_config:
            probe = ModelSpec(
                shown,
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
            validate(
                config,
                f"{config_path(model_dir, self.config.model_config_name)} (after auto-complete)",
            )
        self._check_devices(name, config)
        for v in selected:
            if v not in rec.serving:
                self.registry.set_state(name, v, LOADING)
        self.registry.drop_state(name, -1)
        new: dict[int, ServingVersion] = {}
        started: list[ModelInstance] = []
        try:
            for v in selected:
                spec = ModelSpec(
                    shown,
                    v,
                    model_dir,
                    model_dir / str(v),
                    config,
                    model_dir.parent,
                    settings,
                    serving=self.serving,
                )
                # cumulative across reloads: the registry keeps them when it is published
                stats = rec.stats.get(v) or ModelStats(
                    shown,
                    str(v),
                    namespace=self.namespace_of(name) if self.config.model_namespacing else "",
                    summaries=LatencySummaries() if self.config.summary_latencies else None,
                    first_response=(
                        FirstResponseHistogram() if self.config.histogram_latencies else None
                    ),
                )
                new[v] = await start_version(
                    spec,
                    backend,
                    self.admission,
                    stats,
                    started,
                    generation=next(self._generations),
                    cache=self.serving.cache is not None,
                    limiter=self.serving.limiter,
                    honest_overload=self.serving.honest_overload,
                )
        except BaseException as exc:
            await asyncio.gather(*(i.stop() for i in started), return_exceptions=True)
            for v in selected:
                if v not in rec.serving:
                    self.registry.set_state(name, v, UNAVAILABLE, str(exc))
            raise
        await self._swap_in(rec, new, only, composing, time.monotonic() - t0, why)

    async def _swap_in(
        self,
        rec: ModelRecord,
        new: dict[int, ServingVersion],
        only: int | None,
        composing: list[str],
        load_secs: float,
        why: str,
    ) -> None:
        """Publish the prepared versions (beside the others with ``only``) in one swap, then
        retire the versions they replace: drained, then stopped."""
        name = rec.name
        for sv in new.values():
            sv.stats.load_duration_secs = load_secs
        old = rec.serving
        if only is not None:  # the other versions keep serving
            new = {**old, **new}
            old = {only: old[only]} if only in old else {}
        self.registry.publish(name, new)  # the atomic swap
        self._ensembles.pop(name, None)
        if composing:
            self._ensembles[name] = composing
            for m in composing:
                self.book(m).dependents.add(name)
        if only is None:
            self.registry.set_states(name, {v: (READY, "") for v in new})
        else:
            self.registry.set_state(name, only, READY)
        retiring = list(old.values())
        for sv in retiring:
            if sv.spec.version not in new:
                self.registry.set_state(name, sv.spec.version, UNLOADING)
        await self.retire(retiring)
        for sv in retiring:
            if sv.spec.version not in new:
                self.registry.set_state(name, sv.spec.version, UNAVAILABLE, "unloaded")
        log.info(
            "%s '%s' version(s) %s in %.2fs (%s)",
            "reloaded" if retiring else "loaded",
            name,
            sorted(new) if only is None else [only],
            load_secs,
            why,
        )

    # -------------------------------------------------------------- ensembles
    def _step_keys(self, ensemble: str, steps: list[str]) -> dict[str, str]:
        """Step model name -> the key it runs: under --model-namespacing the model of that
        name in the ensemble's own repository where there is one (Triton looks there first),
        else the plain name (ambiguous if several other repositories have it)."""
        if not self.config.model_namespacing:
            return {m: m for m in steps}
        repo = self.namespace_of(ensemble)
        present = self.list_models()
        out: dict[str, str] = {}
        for m in steps:
            own = str(Path(repo) / m)
            out[m] = own if repo and own in present else m
        return out

    def _ensemble_backend(self, steps: dict[str, str]) -> EnsembleBackend:
        """The ensemble backend, its steps' names mapped to their keys (``_step_keys``)."""
        if all(k == m for m, k in steps.items()):
            return EnsembleBackend(self.serving.infer, self._serving_config)
        serving = self.serving

        async def infer(request: InferRequest) -> InferResponse:
            request.model_name = steps.get(request.model_name, request.model_name)
            return await serving.infer(request)

        def config_of(name: str, version: str) -> mc.ModelConfig | None:
            return self._serving_config(steps.get(name, name), version)

        return EnsembleBackend(infer, config_of)

    async def _ensure_loaded(self, ensemble: str, models: list[str]) -> None:
        """Load the composing models that are not serving (as Triton does in explicit mode);
        a failure fails the ensemble's load naming the composing model."""
        shown = layout.display_name(ensemble)
        for m in models:
            if m == ensemble:
                raise InvalidArgument(f"failed to load '{shown}': it names itself as a step")
            rec = self.record(m)
            if rec.serving:
                continue
            async with self.book(m).lock:  # wait out a load of it already under way
                serving = bool(rec.serving)
            if serving:
                continue
            try:
                await self.load(m, refresh=False)  # the ensemble's load refreshed
            except ServerError as exc:
                raise type(exc)(
                    f"failed to load '{shown}': composing model "
                    f"'{layout.display_name(m)}' failed to load: {exc}",
                    exc.status,
                ) from None

    def _serving_config(self, name: str, version: str) -> mc.ModelConfig | None:
        try:
            return self.serving.get(name, version).config
        except ServerError:
            return None

    def _check_devices(self, name: str, config: mc.ModelConfig) -> None:
        check_devices(name, config)

    async def retire(self, versions: list[ServingVersion]) -> None:
        async def one(sv: ServingVersion) -> None:
            await sv.scheduler.drain()
            await sv.scheduler.stop()
            cache = self.serving.cache
            if sv.cached and cache is not None:  # its entries can never be asked for again
                cache.forget(sv.spec.name, sv.version_str, sv.generation)

        await asyncio.gather(*(one(sv) for sv in versions))

    # ----------------------------------------------------------------- unload
    async def unload(
        self,
        name: str,
        unload_dependents: bool = False,
        exact: bool = False,
        reason: str = "unloaded",
    ) -> None:
        """Unload ``name``: a client's name (every namespace's model of it), or with
        ``exact`` the one key (the poll's, a dependent's, an eviction's). ``reason`` is what
        the index says of its versions afterwards."""
        if not layout.is_qualified(name):
            check_model_name(name)
            keys = [name] if exact else self.keys_of(name)
            if keys != [name]:  # namespacing: every repository's model of that name
                for k in keys:
                    await self.unload(k, unload_dependents, reason=reason)
                return
        rec = self.registry.get(name)
        if rec is None:
            # Triton answers success for a model it does not know; so do we.
            return
        book = self.book(name)
        async with book.lock:
            old = list(rec.serving.values())
            self.registry.publish(name, {})
            book.loaded = None
            for sv in old:
                self.registry.set_state(name, sv.spec.version, UNLOADING)
            self.registry.set_required(name, False)
            await self.retire(old)
            for sv in old:
                self.registry.set_state(name, sv.spec.version, UNAVAILABLE, reason)
        for m in self._ensembles.pop(name, ()):
            composing = self._books.get(m)
            if composing is not None:
                composing.dependents.discard(name)
        if unload_dependents:
            for dep in sorted(book.dependents):
                await self.unload(dep, exact=True)

    async def shutdown(self, timeout: float, exit_timeout: float | None = None) -> bool:
        """Drain every serving version (up to ``timeout``: what is left of ``exit_timeout``,
        the flag named in the error of what did not finish), then stop all. True if drained."""
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
                f"--exit-timeout-secs={timeout if exit_timeout is None else exit_timeout:g}"
            )
            for sv in serving:
                sv.scheduler.fail_queued(err)
        for rec in self.registry.records():
            self.registry.publish(rec.name, {})
        grace = None if drained else 0.0
        await asyncio.gather(*(sv.scheduler.stop(grace) for sv in serving), return_exceptions=True)
        for root in self._override_dirs.values():
            shutil.rmtree(root, ignore_errors=True)
        return drained

    # ------------------------------------------------------------------- poll
    @staticmethod
    def directory_signature(model_dir: Path) -> Signature:
        """(path, mtime, size) of everything under the model's directory: a load reloads, and
        a poll loads, only when this changed (Triton compares modification times too)."""
        sig: list[tuple[str, int, int]] = []
        for dirpath, dirnames, filenames in os.walk(model_dir, followlinks=True):
            # bytecode caches are written by the models themselves; a directory counts by
            # name only (its mtime moves when such a cache appears)
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            rel = os.path.relpath(dirpath, model_dir)
            sig.extend((os.path.normpath(os.path.join(rel, d)), 0, 0) for d in dirnames)
            for f in filenames:
                try:
                    st = os.stat(os.path.join(dirpath, f))
                except OSError:
                    continue
                sig.append((os.path.normpath(os.path.join(rel, f)), st.st_mtime_ns, st.st_size))
        return tuple(sorted(sig))

    async def poll_once(self) -> None:
        # a failed refresh leaves the mirrors as they were: the scan below finds no change
        await self.refresh_remote_logged("poll")
        present = self.list_models()
        for name, model_dir in present.items():
            book = self._books.get(name)
            if book is not None and book.signature == self.directory_signature(model_dir):
                continue  # loaded (or failed) with exactly these files
            self.registry.set_required(name, True)
            try:
                await self.load(name, refresh=False)
            except ServerError as exc:
                log.error("poll: %s", exc)
        for rec in self.registry.records():
            name = rec.name
            if name in present:
                continue
            if rec.serving:
                log.info("poll: model '%s' was removed from the repository; unloading", name)
                await self.unload(name, exact=True)
            now = self.registry.get(name)
            if now is not None and not now.present:
                self.forget_if_unknown(now)

    async def _poll_loop(self) -> None:
        for name, model_dir in self.list_models().items():
            self.book(name).signature = self.directory_signature(model_dir)
        while True:
            await asyncio.sleep(self.config.repository_poll_secs)
            try:
                await self.poll_once()
            except Exception:
                log.exception("repository poll failed")
