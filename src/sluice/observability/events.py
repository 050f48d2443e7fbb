"""Recent control events: a small ring buffer of load / unload / traffic outcomes.

The dashboard shows them ("what changed, and did it work"); nothing else depends on them.
Recording is one ``deque.append``; the buffer keeps the last ``capacity`` events.

Usage::

    events = ControlEvents()
    with events.record("load", "resnet", version="2"):
        await manager.load(...)
    events.recent()  # newest first: [{"time_ms":..., "action": "load", "ok": True, ...}]
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ControlEvent", "ControlEvents"]


@dataclass(frozen=True, slots=True)
class ControlEvent:
    time_ms: int
    action: str  # load | unload | traffic
    model: str
    version: str
    ok: bool
    message: str  # the error's text when not ok, else a short note ("" when none)


class ControlEvents:
    def __init__(self, capacity: int = 50) -> None:
        self._events: deque[ControlEvent] = deque(maxlen=capacity)

    def add(
        self, action: str, model: str, version: str = "", ok: bool = True, message: str = ""
    ) -> None:
        self._events.append(
            ControlEvent(time.time_ns() // 1_000_000, action, model, version, ok, message)
        )

    @contextlib.contextmanager
    def record(
        self, action: str, model: str, version: Any = "", message: str = ""
    ) -> Iterator[None]:
        """Record the outcome of the block: ok, or the error's text (which is re-raised)."""
        try:
            yield
        except BaseException as exc:
            self.add(action, model, str(version), False, str(exc) or type(exc).__name__)
            raise
        self.add(action, model, str(version), True, message)

    def recent(self) -> list[dict[str, Any]]:
        """Newest first."""
        return [asdict(e) for e in reversed(self._events)]
