"""Per-version load / unload and the traffic split of a model (Triton can do neither: its
issues #4416, #4638).

Rules of this file:
- A per-version load prepares exactly version v beside the serving versions and swaps it in
  (``ModelManager.load_locked(only=v)``); the other versions are not touched. A serving v is
  reloaded (a refresh: its files are read again); its statistics stay cumulative.
- Without parameters v is loaded the way the model is: with the whole-model override in
  force (its config and files) if there is one, else from the repository. With 'config' (and
  'file:<path>') parameters that override is v's own, kept while v serves.
- A per-version unload takes v out of the serving set at once (new requests no longer find
  it), lets its in-flight requests finish, then stops it; the others keep serving.
- Refused with 400: unloading the last serving version (unload the model instead), and
  unloading a version that has a positive weight in the traffic split (change the split
  first): neither silently moves traffic.
- The serving set made this way lasts through plain loads that change nothing (they do
  nothing); a whole-model load that (re)loads serves the version_policy again with one
  config; a whole-model unload forgets everything, the split included.
- The split is set only over READY versions and changes nothing else; see ``traffic.py``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

from ..core.registry import UNAVAILABLE, UNLOADING, ModelRecord
from ..core.traffic import TrafficSplit, parse_weights, weights_doc
from ..core.validation import check_model_name
from ..errors import VERSION_STRING_ERROR, InvalidArgument, NotFound, ServerError
from . import layout
from .load_book import LoadBook, Override, Signature
from .manager import load_failure, parse_load_params

if TYPE_CHECKING:
    from .manager import ModelManager

__all__ = ["parse_version", "load_version", "unload_version", "get_traffic", "set_traffic"]

log = logging.getLogger("sluice.manager")


def parse_version(name: str, version: Any) -> int:
    """``"2"`` or ``2`` -> 2; anything else is refused naming the model."""
    text = str(version)
    if type(version) is bool or not text.isdigit() or (text != "0" and text.startswith("0")):
        raise InvalidArgument(
            f"{VERSION_STRING_ERROR} '{version}' for model '{name}': a version is a "
            "non-negative integer without a leading 0"
        )
    return int(text)


def _slot(name: str, v: int) -> str:
    return f"{name}/{v}"  # a model name has no '/': never a model's own slot


def _with_version(old: Signature, new: Signature, v: int) -> Signature:
    """``old`` with the entries of version directory ``v`` taken from ``new``: a plain load
    after a per-version load compares everything else."""
    prefix = str(v)

    def inside(path: str) -> bool:
        return path == prefix or path.startswith(prefix + os.sep)

    return tuple(sorted([e for e in old if not inside(e[0])] + [e for e in new if inside(e[0])]))


# ------------------------------------------------------------------------------------- load
async def load_version(
    manager: ModelManager, name: str, version: Any, parameters: dict[str, Any] | None = None
) -> None:
    """Load (or refresh) version ``version`` of ``name`` in addition to the serving ones;
    a failure's message starts with Triton's "failed to load '<name>'"."""
    try:
        check_model_name(name)
        v = parse_version(name, version)
        config_json, files = parse_load_params(name, parameters)
        while True:
            book = manager.book(name)
            rec = manager.record(name)
            async with book.lock:
                if manager.book(name) is not book or manager.registry.get(name) is not rec:
                    continue  # forgotten while we waited for its lock: start again
                try:
                    await _load_locked(manager, rec, book, v, config_json, files)
                except NotFound:
                    manager.forget_if_unknown(rec)
                    raise
                break
    except ServerError as exc:
        raise load_failure(name, exc, f" version {version}") from None
    manager.registry.set_required(name, True)


async def _load_locked(
    manager: ModelManager,
    rec: ModelRecord,
    book: LoadBook,
    v: int,
    config_json: str | None,
    files: dict[str, bytes],
) -> None:
    name = rec.name
    await manager.refresh_remote()  # object-storage repositories: their mirrors up to date
    serving = bool(rec.serving)
    if not serving:  # what an earlier load left is not in force any more
        book.override = None
        book.version_overrides.clear()
    repo_dir = layout.find_model_dir_or_none(manager.repositories, name)
    own = Override(config_json, files) if config_json is not None else None
    why = f"version {v} loaded alone"
    if files:
        model_dir = manager.write_override(name, files, _slot(name, v))
        why += ", own override"
    elif own is None and book.override is not None:
        config_json = book.override.config
        written = manager.override_dir(name) if book.override.files else None
        if written is not None:
            model_dir = written
        else:
            model_dir = repo_dir or layout.find_model_dir(manager.repositories, name)
        why += ", the model's override"
    else:
        # raises Triton's NotFound for a name in no repository
        model_dir = repo_dir or layout.find_model_dir(manager.repositories, name)
        if own is not None:
            why += ", own config override"
    await manager.load_locked(rec, model_dir, config_json, why, only=v)
    if own is not None:
        book.version_overrides[v] = own
    else:
        book.version_overrides.pop(v, None)
        manager.drop_override(_slot(name, v))
    signature = manager.directory_signature(repo_dir) if repo_dir is not None else ()
    if not serving or book.loaded is None:
        # the model is loaded now: a plain load that changes nothing does nothing
        book.loaded = (signature, None)
        book.signature = signature
    elif model_dir == repo_dir:
        loaded_signature, loaded_override = book.loaded
        book.loaded = (_with_version(loaded_signature, signature, v), loaded_override)
        book.signature = _with_version(book.signature, signature, v)


# ----------------------------------------------------------------------------------- unload
async def unload_version(manager: ModelManager, name: str, version: Any) -> None:
    """Unload version ``version`` of ``name``; the other versions keep serving. A version that
    is not serving (but exists) is already unloaded: nothing to do."""
    check_model_name(name)
    v = parse_version(name, version)
    rec = manager.registry.get(name)
    repo_dir = layout.find_model_dir_or_none(manager.repositories, name)
    if rec is None or v not in rec.serving:
        if repo_dir is None and (rec is None or not rec.present):
            raise NotFound(
                f"failed to unload '{name}': model directory not found in any model repository"
            )
        if repo_dir is None or v not in layout.list_versions(repo_dir):
            raise NotFound(
                f"failed to unload '{name}' version {v}: it is not loaded and has no version "
                "directory"
            )
    if rec is None:
        return
    book = manager.book(name)
    async with book.lock:
        sv = rec.serving.get(v)
        if sv is None:
            return
        split = rec.split
        if split is not None and split.weights.get(v, 0) > 0:
            raise InvalidArgument(
                f"failed to unload '{name}' version {v}: it has weight {split.weights[v]} in "
                f"the model's traffic split {json.dumps(weights_doc(split.weights))}; set a split "
                f"without "
                f"it first (POST /v2/repository/models/{name}/traffic)"
            )
        if len(rec.serving) == 1:
            raise InvalidArgument(
                f"failed to unload '{name}' version {v}: it is the model's only serving "
                f"version; unload the model instead (POST /v2/repository/models/{name}/unload)"
            )
        manager.registry.retire(name, v)
        manager.registry.set_state(name, v, UNLOADING)
        await manager.retire([sv])
        manager.registry.set_state(name, v, UNAVAILABLE, "unloaded")
        book.version_overrides.pop(v, None)
        manager.drop_override(_slot(name, v))


# ---------------------------------------------------------------------------------- traffic
def _known(manager: ModelManager, name: str) -> ModelRecord | None:
    check_model_name(name)
    rec = manager.registry.get(name)
    if (rec is None or not rec.present) and layout.find_model_dir_or_none(
        manager.repositories, name
    ) is None:
        raise NotFound(f"Request for unknown model: '{name}' is not found")
    return rec


def get_traffic(manager: ModelManager, name: str) -> dict[str, Any]:
    """``{"model": name, "weights": {"1": 90, "2": 10}}``; empty weights when there is no
    split (requests naming no version go to the highest serving version)."""
    rec = _known(manager, name)
    split = rec.split if rec is not None else None
    return {"model": name, "weights": weights_doc(split.weights) if split is not None else {}}


def set_traffic(manager: ModelManager, name: str, weights: Any) -> dict[str, Any]:
    """Set (``{"1": 90, "2": 10}``) or clear (``{}``) the split; every named version must be
    READY. Returns what ``get_traffic`` answers afterwards."""
    rec = _known(manager, name)
    parsed = parse_weights(name, weights)
    if not parsed:
        if rec is not None and rec.split is not None:
            manager.registry.set_traffic(name, None)
            log.info("model '%s': traffic split cleared", name)
        return get_traffic(manager, name)
    split = TrafficSplit(name, parsed, rec.serving if rec is not None else {})
    manager.registry.set_traffic(name, split)
    log.info("model '%s': traffic split set to %s", name, json.dumps(weights_doc(parsed)))
    return get_traffic(manager, name)
