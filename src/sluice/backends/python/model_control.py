"""The model loading API from a python model: ``pb_utils.load_model`` / ``unload_model`` /
``is_model_ready`` on the server side.

Rules of this file:
- A call takes the repository API's own path (``InferenceService.load_model`` /
  ``unload_model``): the explicit-mode check and its words, the load book's locks, memory
  admission, the control-state file; and, with ``--audit-log``, one audit line (protocol
  ``python``, client ``model '<caller>'``).
- A call that would wait for itself is refused before it can deadlock: a model loading or
  unloading itself; from ``initialize``, a model whose load already waits (through other
  initialize calls) for the caller's own load; from ``execute``, the unload of a model
  whose request waits (BLS) on this one.
- ``is_model_ready`` reads the registry, then asks the model's own ``is_ready()`` where it
  has one (as the readiness endpoints do): Triton's answer, and Triton's words for a version
  that is not a number.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ...errors import InvalidArgument, ServerError
from .messages import ModelControlCall

__all__ = ["ModelController", "parse_version"]

log = logging.getLogger("sluice.model_control")


def parse_version(text: str) -> str:
    """A version string as Triton's python backend reads it ("" = any); Triton's words for
    one that is not a non-negative integer."""
    if not text:
        return ""
    try:
        version = int(text)
    except ValueError:
        raise InvalidArgument(
            f"failed to get model version from specified version string '{text}' "
            "(details: stol), version should be an integral value > 0"
        ) from None
    if version < 0:
        raise InvalidArgument(
            f"failed to get model version from specified version string '{text}', "
            "version should be an integral value > 0"
        )
    return str(version)


class ModelController:
    """One per server (``Serving.model_control``, set by ``InferenceService``)."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.audit: Any = None  # security.audit.AuditLog, set by the server when it has one
        # model whose initialize waits -> the models it waits for (load or unload)
        self._waits: dict[str, dict[str, int]] = {}

    def _reaches(self, start: str, goal: str) -> list[str] | None:
        """A chain of waiting initializes from ``start`` to ``goal``, or None."""
        seen: set[str] = set()
        stack: list[list[str]] = [[start]]
        while stack:
            path = stack.pop()
            if path[-1] == goal:
                return path
            for nxt in self._waits.get(path[-1], {}):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append([*path, nxt])
        return None

    def _check_wait(
        self, caller: str, target: str, initializing: bool, callers: tuple[str, ...], op: str
    ) -> None:
        verb = "load" if op == "load" else "unload"
        if target == caller:
            raise InvalidArgument(
                f"model '{caller}' cannot {verb} itself: the {verb} would wait for the "
                "call that asks for it"
            )
        chain = self._reaches(target, caller)
        if chain is not None:
            raise InvalidArgument(
                f"model {verb} cycle refused: the load of '{target}' waits for the load of "
                f"'{caller}' already ({' -> '.join([caller, *chain])}); the {verb} would wait "
                "for itself"
            )
        if not initializing and op == "unload" and target in callers:
            raise InvalidArgument(
                f"model '{caller}' cannot unload '{target}': a request of '{target}' waits "
                f"for this one ({' -> '.join(callers)}); the unload would wait for itself"
            )

    async def call(
        self, caller: str, initializing: bool, callers: tuple[str, ...], msg: ModelControlCall
    ) -> tuple[str, bool]:
        """(error text or "", readiness) for one call of model ``caller``."""
        service = self.service
        try:
            if msg.op == "ready":
                version = parse_version(msg.version)
                try:
                    return "", bool(await service.model_ready_checked(msg.model, version))
                except ServerError:
                    return "", False  # a name that cannot be a model is not ready
            if msg.op not in ("load", "unload"):
                raise InvalidArgument(f"unknown model control call '{msg.op}'")
            service._check_control()  # Triton's words before anything else
            self._check_wait(caller, msg.model, initializing, callers, msg.op)
        except ServerError as exc:
            if msg.op != "ready":
                self._audit(caller, msg, exc)
            return str(exc), False
        waits = self._waits.setdefault(caller, {}) if initializing else None
        if waits is not None:
            waits[msg.model] = waits.get(msg.model, 0) + 1
        error: BaseException | None = None
        try:
            if msg.op == "load":
                params: dict[str, Any] = {}
                if msg.config:
                    params["config"] = msg.config
                for path, data in msg.files:
                    params[path] = data
                job = service.load_model(msg.model, params or None)
            else:
                job = service.unload_model(
                    msg.model, {"unload_dependents": True} if msg.unload_dependents else None
                )
            # shielded: a caller that stops meanwhile does not cut a load or unload in half
            await asyncio.shield(job)
        except ServerError as exc:
            error = exc
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the model, logged here
            log.exception("%s of '%s' asked by model '%s' failed", msg.op, msg.model, caller)
            error = exc
        finally:
            if waits is not None:
                waits[msg.model] -= 1
                if not waits[msg.model]:
                    del waits[msg.model]
                if not waits:
                    self._waits.pop(caller, None)
        self._audit(caller, msg, error)
        return (str(error) if error is not None else ""), False

    def _audit(self, caller: str, msg: ModelControlCall, error: BaseException | None) -> None:
        if self.audit is None:
            return
        self.audit.write_result(
            error,
            key="",
            client=f"model '{caller}'",
            protocol="python",
            action=msg.op,
            model=msg.model,
        )
