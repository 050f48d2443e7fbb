"""Triton's rate limiter (``--rate-limit=execution_count``): model instances execute only
when the resources their ``instance_group.rate_limiter`` asks for are free, across every
model of the server.

Rules of this file (Triton 2.51's ``rate_limiter.cc``, its texts checked on this machine):
- An instance asks for ``resources [{name count global}]``. A resource is per device (the
  instance's device; CPU instances are device 0) unless ``global``, then one pool for the
  whole server. One name may not be both global and per device ("Resource "R" is present as
  both global and device-specific resource in the model configuration.").
- A resource's amount is the largest count any registered instance asks for, unless
  ``--rate-limit-resource=<name>:<count>[:<device>]`` gives any: then every resource is
  that flag's count (a flag without a device counts for every device; for a global resource
  the largest count given for its name on any device; a name given twice keeps the smaller),
  and a resource no flag names has 0. An amount below what an instance asks for fails its
  load: "Resource count for "R" is limited to N which will prevent scheduling of one or more
  model instances, the minimum required count is M".
- An instance with work is *staged*; the staged instance with the lowest
  ``executions x max(priority, 1)`` (so ``priority`` N gets 1/N of the chances of priority 1;
  ties: first staged first) takes its resources as soon as they are all free, for one
  execution, and gives them back when it ends. Only that head is tried: a later staged
  instance does not overtake it even if its own resources are free (Triton's order). Unlike
  Triton, which grants one instance per release, every head that fits is granted.
- ``--rate-limit=off`` (Triton's default) builds no limiter: instances run as soon as they
  are idle, resources and priorities ignored (and not checked at load).
- Triton's statistics and metrics show nothing of the limiter (its backlog counts in the
  pending-request gauge, its wait in queue time); sluice's gauges come from ``snapshot()``.

Usage (one limiter per server; a scheduler registers its instances, asks, releases)::

    limiter = RateLimiter([("R", 1, -1)])
    slots = limiter.register("m", "1", [(0, group.rate_limiter)])  # one per instance
    if limiter.request(slots[0], on_grant):   # True: granted now; else on_grant() later
        ...
    limiter.release(slots[0])                 # after the execution
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument

__all__ = ["RateLimiter", "Slot", "parse_resource_flag", "GLOBAL", "EVERY_DEVICE"]

GLOBAL = -2  # the pool of a global resource
EVERY_DEVICE = -1  # a --rate-limit-resource without a device


def parse_resource_flag(text: str) -> tuple[str, int, int]:
    """``<name>:<count>[:<device>]`` -> (name, count, device; -1 = every device). Raises
    ValueError naming the flag. Triton reads a negative count as a huge one; refused here."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(
            "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
            f"'<resource_name>:<count>'. Got {text}"
        )
    values: list[int] = []
    for what, raw in zip(("count", "device"), parts[1:], strict=False):
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(
                f"--rate-limit-resource {text}: the {what} must be an integer, got '{raw}'"
            ) from None
        if value < 0:
            raise ValueError(f"--rate-limit-resource {text}: the {what} must be >= 0")
        values.append(value)
    return parts[0], values[0], values[1] if len(values) > 1 else EVERY_DEVICE


@dataclass(eq=False)
class Slot:
    """One registered instance: what it asks for, how often it ran, whether it waits."""

    model: str
    version: str
    needs: dict[tuple[int, str], int]  # (device or GLOBAL, resource) -> count
    priority: int
    executions: int = 0
    staged: int = 0  # 0 = not waiting; else the order in which it was staged
    held: bool = False
    on_grant: Callable[[], Any] | None = field(default=None, repr=False)

    @property
    def score(self) -> int:
        return self.executions * max(self.priority, 1)


class RateLimiter:
    def __init__(self, explicit: Iterable[tuple[str, int, int]] = ()) -> None:
        # (device or EVERY_DEVICE, name) -> count; a name given twice keeps the smaller
        self._explicit: dict[tuple[int, str], int] = {}
        for name, count, device in explicit:
            key = (device, name)
            self._explicit[key] = min(count, self._explicit.get(key, count))
        self._slots: list[Slot] = []
        self._total: dict[tuple[int, str], int] = {}
        self._in_use: dict[tuple[int, str], int] = {}
        self._staged: list[Slot] = []
        self._stage_seq = 0

    # ------------------------------------------------------------ registration
    def register(
        self, model: str, version: str, instances: Iterable[tuple[int, Any]]
    ) -> list[Slot]:
        """Slots for a version's instances, each ``(device, ModelRateLimiter config)``;
        raises InvalidArgument (Triton's texts) when the amounts cannot serve them."""
        slots = []
        for device, cfg in instances:
            needs: dict[tuple[int, str], int] = {}
            for r in cfg.resources if cfg is not None else ():
                # ``global`` is a keyword: the protobuf field is read by name
                where = GLOBAL if getattr(r, "global") else device
                needs[(where, r.name)] = int(r.count)
            slots.append(Slot(model, version, needs, int(cfg.priority) if cfg else 0))
        before = list(self._slots)
        self._slots.extend(slots)
        try:
            self._recompute()
        except InvalidArgument:
            self._slots = before
            self._recompute()
            raise
        return slots

    def unregister(self, slots: Iterable[Slot]) -> None:
        gone = set(map(id, slots))
        self._slots = [s for s in self._slots if id(s) not in gone]
        self._staged = [s for s in self._staged if id(s) not in gone]
        for s in slots:
            if s.held:
                self._give_back(s)
        self._recompute()
        self._attempt()

    def _recompute(self) -> None:
        most: dict[tuple[int, str], int] = {}
        for s in self._slots:
            for key, n in s.needs.items():
                most[key] = max(n, most.get(key, 0))
        global_names = {name for dev, name in most if dev == GLOBAL}
        for dev, name in most:
            if dev != GLOBAL and name in global_names:
                raise InvalidArgument(
                    f'Resource "{name}" is present as both global and device-specific resource '
                    "in the model configuration."
                )
        if self._explicit:
            for (dev, name), need in most.items():
                if dev == GLOBAL:
                    have = max((c for (_, n), c in self._explicit.items() if n == name), default=0)
                else:
                    have = max(
                        self._explicit.get((dev, name), 0),
                        self._explicit.get((EVERY_DEVICE, name), 0),
                    )
                if have < need:
                    raise InvalidArgument(
                        f'Resource count for "{name}" is limited to {have} which will prevent '
                        "scheduling of one or more model instances, the minimum required count "
                        f"is {need}"
                    )
                most[(dev, name)] = have
        self._total = most

    # -------------------------------------------------------------- scheduling
    def request(self, slot: Slot, on_grant: Callable[[], Any]) -> bool:
        """Stage ``slot`` (it has work). True: its resources are taken now. False: it waits,
        and ``on_grant`` is called (soon after, from the event loop) once they are."""
        if slot.held:
            raise RuntimeError(f"instance of '{slot.model}' asked twice for its resources")
        if not slot.staged:
            self._stage_seq += 1
            slot.staged = self._stage_seq
            slot.on_grant = on_grant
            self._staged.append(slot)
        self._attempt(now=slot)
        return slot.held

    def withdraw(self, slot: Slot) -> None:
        """``slot`` no longer has work: leave the staged instances (no effect once granted)."""
        if slot.staged and not slot.held:
            self._staged.remove(slot)
            slot.staged = 0
            slot.on_grant = None
            self._attempt()

    def release(
        self, slot: Slot, executed: bool = True, again: Callable[[], Any] | None = None
    ) -> None:
        """``slot``'s execution ended (``executed``; or its grant went unused): its resources
        are free again, and the next staged instance may take them. ``again``: the instance
        has more work; it is staged anew (with that callback) before the next grant, so it
        competes for what it gave back, as in Triton."""
        if not slot.held:
            return
        if executed:
            slot.executions += 1
        self._give_back(slot)
        if again is not None:
            self._stage_seq += 1
            slot.staged = self._stage_seq
            slot.on_grant = again
            self._staged.append(slot)
        self._attempt()

    def _give_back(self, slot: Slot) -> None:
        slot.held = False
        for key, n in slot.needs.items():
            self._in_use[key] = self._in_use.get(key, 0) - n

    def _fits(self, slot: Slot) -> bool:
        return all(
            self._in_use.get(key, 0) + n <= self._total.get(key, 0) for key, n in slot.needs.items()
        )

    def _attempt(self, now: Slot | None = None) -> None:
        """Grant the head of the staged instances while it fits; ``now`` is the slot being
        asked for (its grant is the caller's answer, not a callback)."""
        while self._staged:
            head = min(self._staged, key=lambda s: (s.score, s.staged))
            if not self._fits(head):
                return
            self._staged.remove(head)
            head.staged = 0
            head.held = True
            for key, n in head.needs.items():
                self._in_use[key] = self._in_use.get(key, 0) + n
            callback, head.on_grant = head.on_grant, None
            if head is not now and callback is not None:
                asyncio.get_running_loop().call_soon(callback)

    # ----------------------------------------------------------------- reading
    def snapshot(self) -> tuple[list[tuple[str, str, int, int]], dict[tuple[str, str], int]]:
        """``([(resource, device, amount, in use)], {(model, version): instances waiting}``
        for the metrics; device is a number, or "global"."""
        resources = [
            (name, "global" if dev == GLOBAL else str(dev), total, self._in_use.get((dev, name), 0))
            for (dev, name), total in sorted(
                self._total.items(), key=lambda kv: (kv[0][1], kv[0][0])
            )
        ]
        waiting: dict[tuple[str, str], int] = {}
        for s in self._slots:
            waiting.setdefault((s.model, s.version), 0)
        for s in self._staged:
            waiting[(s.model, s.version)] = waiting.get((s.model, s.version), 0) + 1
        return resources, waiting
