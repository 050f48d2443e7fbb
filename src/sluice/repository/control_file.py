"""The model control state file (``--model-control-state=PATH``, explicit mode only): what is
loaded, recorded on every change and restored at the next start (Triton forgets it all: its
issue #3471).

Rules of this file:
- The file records the models serving, their serving versions, the whole-model override in
  force (its 'config' and 'file:' contents), the overrides of versions loaded one by one and
  the traffic splits. Nothing else: statistics, instances, readiness are not state.
- It is written after every control call (load, unload, per-version load / unload, traffic)
  and at the end of start-up, only when its contents change, atomically: a temporary file in
  the same directory, fsync, ``os.replace``, fsync of the directory. A reader sees the old or
  the new file, never a part of one; a failed write is logged and leaves the old file.
- At start the file is read before anything listens; a file that is not valid state stops
  the start with its path and what is wrong (starting empty would overwrite the operator's
  record at the first change). A missing file is a first start.
- Restoring is loading: the recorded whole-model load (with its override), then the recorded
  versions loaded / unloaded one by one, then the split. A model (or version) no longer in
  the repositories is a warning and is left out; a load that fails counts as a failed
  start-up load (``--exit-on-error`` decides).

Usage::

    state = ControlState(Path("/var/lib/sluice/state.json"), manager, registry)
    doc = state.read()          # before serving; raises ServerError naming the file
    failed = await state.restore(doc)
    ...
    await state.save()          # after every change
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.registry import ModelRecord, Registry
from ..core.traffic import parse_weights, weights_doc
from ..core.validation import check_model_name
from ..errors import NotFound, ServerError
from . import layout
from .load_book import LoadBook, Override
from .versions import load_version, set_traffic, unload_version

if TYPE_CHECKING:
    from .manager import ModelManager

__all__ = ["ControlState", "ModelState", "FORMAT", "write_atomic"]

log = logging.getLogger("sluice.manager")

FORMAT = 1
_KEY = "sluice_model_control_state"


@dataclass(slots=True)
class ModelState:
    """One model of the file."""

    versions: list[int]
    override: Override | None = None
    version_overrides: dict[int, Override] = field(default_factory=dict)
    traffic: dict[int, int] = field(default_factory=dict)


# ---------------------------------------------------------------------------- encode / decode
def _override_doc(o: Override) -> dict[str, Any]:
    doc: dict[str, Any] = {"config": o.config}
    if o.files:
        doc["files"] = {p: base64.b64encode(b).decode() for p, b in sorted(o.files.items())}
    return doc


def _model_doc(rec: ModelRecord, book: LoadBook | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"versions": sorted(rec.serving)}
    if book is not None and book.override is not None:
        doc["override"] = _override_doc(book.override)
    overrides = {} if book is None else book.version_overrides
    own = {v: o for v, o in overrides.items() if v in rec.serving}
    if own:
        doc["version_overrides"] = {str(v): _override_doc(own[v]) for v in sorted(own)}
    if rec.split is not None:
        doc["traffic"] = weights_doc(rec.split.weights)
    return doc


def snapshot(registry: Registry, books: Mapping[str, LoadBook]) -> dict[str, Any]:
    """What serves in ``registry`` (loaded with the overrides ``books`` record) as the
    file's JSON document."""
    recs = sorted(registry.records(), key=lambda rec: rec.name)
    models = {rec.name: _model_doc(rec, books.get(rec.name)) for rec in recs if rec.serving}
    return {_KEY: FORMAT, "models": models}


class _Bad(Exception):
    pass


def _override(doc: Any, where: str) -> Override:
    if type(doc) is not dict or type(doc.get("config")) is not str:
        raise _Bad(f"{where}: expected an object with a string 'config'")
    files = doc.get("files", {})
    if type(files) is not dict:
        raise _Bad(f"{where}.files: expected an object of path -> base64 contents")
    out: dict[str, bytes] = {}
    for path, b64 in files.items():
        try:
            out[path] = base64.b64decode(str(b64), validate=True)
        except (binascii.Error, ValueError):
            raise _Bad(f"{where}.files['{path}']: not valid base64") from None
    return Override(doc["config"], out)


def _version(text: Any, where: str) -> int:
    s = str(text)
    if type(text) is bool or not s.isdigit() or (s != "0" and s.startswith("0")):
        raise _Bad(f"{where}: '{text}' is not a version number")
    return int(s)


def _model(name: str, doc: Any) -> ModelState:
    where = f"models['{name}']"
    try:
        check_model_name(name)
    except ServerError as exc:
        raise _Bad(f"{where}: {exc}") from None
    if type(doc) is not dict:
        raise _Bad(f"{where}: expected an object")
    versions = doc.get("versions")
    if type(versions) is not list or not versions:
        raise _Bad(f"{where}.versions: expected a non-empty list of version numbers")
    state = ModelState(sorted({_version(v, f"{where}.versions") for v in versions}))
    if "override" in doc:
        state.override = _override(doc["override"], f"{where}.override")
    own = doc.get("version_overrides", {})
    if type(own) is not dict:
        raise _Bad(f"{where}.version_overrides: expected an object of version -> override")
    for v, o in own.items():
        w = f"{where}.version_overrides['{v}']"
        state.version_overrides[_version(v, w)] = _override(o, w)
    try:
        state.traffic = parse_weights(name, doc.get("traffic", {}))
    except ServerError as exc:
        raise _Bad(f"{where}.traffic: {exc}") from None
    return state


def decode(text: str) -> dict[str, ModelState]:
    """The file's text -> model name -> its state; raises ``_Bad`` saying what is wrong."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise _Bad(f"not valid JSON: {exc}") from None
    if type(doc) is not dict or doc.get(_KEY) != FORMAT:
        raise _Bad(f'not a sluice model control state (expected {{"{_KEY}": {FORMAT}, ...}})')
    models = doc.get("models")
    if type(models) is not dict:
        raise _Bad("'models': expected an object of model name -> state")
    return {name: _model(name, m) for name, m in models.items()}


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data``: never a half-written file, even on a crash."""
    try:
        mode = os.stat(path).st_mode & 0o777  # the file keeps its permissions
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # the temporary file goes; the old file stays as it was
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _params(o: Override | None) -> dict[str, Any] | None:
    if o is None:
        return None
    return {"config": o.config, **{f"file:{p}": b for p, b in o.files.items()}}


# ------------------------------------------------------------------------------ the state
class ControlState:
    """The state file of one server: read and restored at start, saved on every change."""

    def __init__(self, path: Path, manager: ModelManager, registry: Registry) -> None:
        self.path = path
        self.manager = manager  # restoring is loading
        self.registry = registry  # what is recorded is what serves
        self._lock = asyncio.Lock()
        self._last: bytes | None = None

    def read(self) -> dict[str, ModelState] | None:
        """The recorded state (None: no file yet). Raises ServerError naming the file when
        it cannot be used, or when its directory cannot take the file."""
        where = f"--model-control-state {self.path}"
        parent = self.path.parent
        if not parent.is_dir():
            raise ServerError(f"{where}: directory {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ServerError(f"{where}: directory {parent} is not writable")
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            log.info("%s: no state recorded yet (first start); it will be written", where)
            return None
        except OSError as exc:
            raise ServerError(f"{where}: cannot read it: {exc}") from None
        try:
            state = decode(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ServerError(f"{where}: not valid UTF-8: {exc}") from None
        except _Bad as exc:
            raise ServerError(
                f"{where}: the file is not a valid state ({exc}); fix it or move it away "
                "(the server then starts with no recorded state)"
            ) from None
        self._last = raw
        return state

    async def save(self) -> None:
        """Write the current state if it changed (atomically; a failure is logged)."""
        async with self._lock:
            data = (
                json.dumps(snapshot(self.registry, self.manager.books), indent=1) + "\n"
            ).encode()
            if data == self._last:
                return
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, write_atomic, self.path, data
                )
            except OSError as exc:
                log.error(
                    "--model-control-state %s: cannot write the state (the change is in force "
                    "but not recorded): %s",
                    self.path,
                    exc,
                )
                return
            self._last = data

    # ------------------------------------------------------------------------- restore
    async def restore(self, state: dict[str, ModelState]) -> list[str]:
        """Load what ``state`` records; returns the names that failed (not those no longer
        in the repositories: they are warned about and left out)."""
        ensembles = [n for n, m in state.items() if self._is_ensemble(n, m)]
        plain = [n for n in state if n not in ensembles]
        results = await asyncio.gather(*(self._restore(n, state[n]) for n in plain))
        results += await asyncio.gather(*(self._restore(n, state[n]) for n in ensembles))
        restored = [n for n, ok in zip(plain + ensembles, results, strict=True) if ok]
        if restored:
            log.info("restored from %s: %s", self.path, ", ".join(restored))
        return [n for n, ok in zip(plain + ensembles, results, strict=True) if ok is False]

    def _is_ensemble(self, name: str, m: ModelState) -> bool:
        if m.override is not None:
            try:
                return bool(json.loads(m.override.config).get("platform") == "ensemble")
            except (ValueError, AttributeError):
                return False
        return self.manager.is_ensemble(name)

    async def _restore(self, name: str, m: ModelState) -> bool | None:
        """True: restored; None: left out (no longer there); False: failed. A model without a
        whole-model override is restored by loading its recorded versions one by one (no
        version the policy selects is loaded only to be unloaded again)."""
        manager = self.manager
        try:
            if m.override is not None:
                await manager.load(name, _params(m.override))
            elif not all(
                v in m.version_overrides and m.version_overrides[v].files for v in m.versions
            ):
                layout.find_model_dir(manager.repositories, name)  # NotFound if gone
        except NotFound as exc:
            log.warning("%s records model '%s', which is not restored: %s", self.path, name, exc)
            return None
        except ServerError as exc:
            log.error("%s: failed to restore model '%s': %s", self.path, name, exc)
            return False
        ok = True
        for v in m.versions:
            own = m.version_overrides.get(v)
            if v in self.registry.versions(name) and own is None:
                continue
            try:
                await load_version(manager, name, v, _params(own))
            except NotFound as exc:
                log.warning("%s: version %d of '%s' is not restored: %s", self.path, v, name, exc)
            except ServerError as exc:
                log.error("%s: failed to restore '%s' version %d: %s", self.path, name, v, exc)
                ok = False
        rec = self.registry.get(name)
        if rec is None or not rec.serving:
            return False if not ok else None
        for v in sorted(set(rec.serving) - set(m.versions)):
            if len(rec.serving) > 1:
                await unload_version(manager, name, v)
        weights = {v: w for v, w in m.traffic.items() if v in rec.serving}
        if weights != m.traffic:
            log.warning(
                "%s: traffic split of '%s' %s restored without the version(s) not serving",
                self.path,
                name,
                json.dumps(weights_doc(m.traffic)),
            )
        if weights and sum(weights.values()) > 0:
            set_traffic(manager, name, weights_doc(weights))
        return ok
