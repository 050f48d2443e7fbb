"""On-demand loading with eviction (``--model-load-on-demand=true``): a request for a model
that is in a repository but serves no version loads it and then runs; when the models would
not fit in the memory budget, the least recently used idle ones are unloaded first.

Rules of this file:
- The request path asks ``wake`` when a model is not serving (``core/serving.py``: inference,
  metadata, config; never readiness or statistics). A model in no repository is not woken:
  the caller answers its own "unknown model" error, as without on-demand loading. A model
  that serves some versions but not the one asked for is not woken either.
- Concurrent requests for the same cold model share one load (one task, ``_loading``). Each
  waits at most its ``timeout`` parameter (microseconds, Triton's) where it has one, then
  fails UNAVAILABLE; a gRPC deadline or a client that goes away cancels its wait, never the
  load. A load that fails answers every waiting request with the load's error (Triton's
  "failed to load '<name>'" text and status). A failure is not remembered: the next request
  tries again.
- Loads on demand run one at a time (``_room``): each one's budget is decided against what
  is loaded when it starts.
- The budget: ``--model-memory-limit``; without it, the machine's available memory minus
  admission's safety margin, plus what the loaded models hold. What a model holds (its
  footprint) is the sum over its serving versions of ``ServingVersion.memory``: admission's
  per-instance estimate (declared with ``sluice_memory_estimate`` or measured) x instances.
- Before a load, the model's footprint is known when it was loaded before (the last load's)
  or declared (``sluice_memory_estimate`` x instances x versions the policy selects); the
  least recently used idle models are unloaded until it fits. A model whose footprint is
  not known yet is loaded, measured, and the least recently used idle others are unloaded
  right after if the total is then over the budget.
- Never evicted: a pinned model (``--model-pin``); a model with requests in flight (queued
  or executing, as ``nv_inference_pending_request_count`` counts them) or with requests
  still waking up from its load; a model being loaded or unloaded; an ensemble (it holds
  no memory of its own). Least recently used is the oldest of (last execution, the
  ``last_inference`` statistic, or the on-demand load when later); a model loaded at start
  or through the API and never run counts from 0.
- When what cannot be evicted leaves no room, the load is refused at once with UNAVAILABLE
  (503) naming the models holding the memory and why (the request does not wait for them
  to become idle); a model larger than the whole budget is refused with INVALID_ARG (400).
- At shutdown (``close``) no load starts any more; the one under way may finish within
  what is left of ``--exit-timeout-secs`` (its requests are in flight), else is cancelled.
- Every load and eviction is logged, written to the audit log (protocol ``on-demand``,
  actions ``load`` and ``evict``, the client whose request caused it where known), added to
  the dashboard's events, counted (``on_demand_metrics.py``) and shown in the index: READY
  with reason "loaded on demand", UNAVAILABLE with reason "evicted: ...".

Usage::

    on_demand = OnDemand(manager, limit=2 << 30, pins=["resnet"])
    serving.on_demand = on_demand          # the request path wakes cold models through it
    await on_demand.wake("bert", "", timeout_us=0)
    await on_demand.close(timeout=30)      # shutdown: no new load; the one under way ends
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..core.registry import READY, UNAVAILABLE, ModelRecord, Registry
from ..errors import InvalidArgument, ServerError, Unavailable, restate
from ..host.sysmem import MachineMemory, format_size, machine_memory
from ..security.access import CALLER
from . import layout
from .admission import declared_estimate, safety_margin
from .manager import ModelManager
from .model_config import read_config

__all__ = ["OnDemand", "Counters", "WaitHistogram", "LOADED_REASON", "EVICTED"]

log = logging.getLogger("sluice.on_demand")

# the index's reason for a version loaded by a request, and the start of an evicted one's
LOADED_REASON = "loaded on demand"
EVICTED = "evicted"
PINNED_REASON = "pinned (never evicted)"

# load wait buckets, in seconds (a python model's load takes ~0.3-2 s)
WAIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(slots=True)
class WaitHistogram:
    """How long requests waited for a model's load on demand (every waiting request, whatever
    the outcome), in the buckets of ``WAIT_BUCKETS``."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS) + 1))
    total: int = 0
    sum_s: float = 0.0

    def observe(self, seconds: float) -> None:
        i = 0
        while i < len(WAIT_BUCKETS) and seconds > WAIT_BUCKETS[i]:
            i += 1
        self.counts[i] += 1
        self.total += 1
        self.sum_s += seconds


@dataclass(slots=True)
class Counters:
    """One model's on-demand record (the metrics read it at scrape time)."""

    loads: int = 0  # loads a request caused that succeeded
    load_failures: int = 0
    evictions: int = 0
    wait: WaitHistogram = field(default_factory=WaitHistogram)


class OnDemand:
    """See the rules at the top of the file; one per server, built by ``server.py``."""

    def __init__(
        self,
        manager: ModelManager,
        *,
        limit: int = 0,
        pins: Iterable[str] = (),
        machine: Callable[[], MachineMemory] = machine_memory,
    ) -> None:
        self.manager = manager
        self.registry: Registry = manager.registry
        self.limit = limit  # --model-memory-limit (0: the machine's available memory)
        self.pins = frozenset(pins)
        self.audit: Any = None  # security.audit.AuditLog, set by the server when it has one
        self.events: Any = None  # observability.events.ControlEvents (the dashboard's)
        self._machine = machine
        self._room = asyncio.Lock()  # one load on demand at a time
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._waking: dict[str, int] = {}  # requests waiting for (or resuming from) a load
        self._footprints: dict[str, int] = {}  # bytes at the model's last load
        self._loaded_ms: dict[str, int] = {}  # wall clock of the last load on demand
        self._load_order: dict[str, int] = {}
        self._order = itertools.count(1)
        self.counters: dict[str, Counters] = {}
        self._closed = False

    # ------------------------------------------------------------------ reads
    def counters_of(self, name: str) -> Counters:
        c = self.counters.get(name)
        if c is None:
            c = self.counters[name] = Counters()
        return c

    @staticmethod
    def footprint(rec: ModelRecord) -> int:
        """Bytes the serving versions of ``rec`` hold, as admission estimated them."""
        return sum(sv.memory for sv in rec.serving.values())

    def held(self) -> int:
        """Bytes every serving model holds, as admission estimated them."""
        return sum(self.footprint(rec) for rec in self.registry.records())

    def budget(self) -> tuple[int, str]:
        """(bytes the models may hold in all, the words saying where that comes from)."""
        if self.limit:
            return self.limit, f"--model-memory-limit {format_size(self.limit)}"
        mem = self._machine()
        margin = safety_margin(mem.total)
        held = self.held()
        return max(0, mem.available - margin) + held, (
            f"{format_size(mem.available)} available ({mem.where}) minus a "
            f"{format_size(margin)} safety margin, plus {format_size(held)} the models hold"
        )

    def waiting(self) -> dict[str, int]:
        """Requests waiting now for their model's load on demand, by model."""
        return dict(self._waking)

    def mark_pins(self) -> None:
        """The index reason of the pinned models that serve (loaded at start)."""
        for name in sorted(self.pins):
            rec = self.registry.get(name)
            if rec is None:
                continue
            for v in rec.serving:
                self.registry.set_state(name, v, READY, PINNED_REASON)

    def evicted_reason(self, name: str) -> str:
        """The index reason of ``name`` if its last unload was an eviction and nothing of it
        serves now, else ""."""
        rec = self.registry.get(name)
        if rec is None or rec.serving:
            return ""
        for state, reason in rec.states.values():
            if state == UNAVAILABLE and reason.startswith(EVICTED):
                return reason
        return ""

    # ------------------------------------------------------------------- wake
    async def wake(self, name: str, version: str = "", timeout_us: int = 0) -> bool:
        """Load ``name`` for a request if it is in a repository and serves nothing; False when
        it is not such a model (the caller answers its own error). Raises the load's error,
        UNAVAILABLE when there is no room or ``timeout_us`` (> 0) passes first."""
        rec = self.registry.get(name)
        if self._closed or (rec is not None and rec.serving):
            return False
        if not self.manager.in_repository(name):
            return False
        task = self._loading.get(name)
        if task is None:
            # the task copies this request's context: the audit log names its caller
            task = asyncio.get_running_loop().create_task(self._load(name))
            self._loading[name] = task
            task.add_done_callback(lambda t, n=name: self._load_done(n, t))  # type: ignore[misc]
        self._waking[name] = self._waking.get(name, 0) + 1
        t0 = time.monotonic()
        try:
            if timeout_us > 0:
                try:
                    await asyncio.wait_for(asyncio.shield(task), timeout_us / 1e6)
                except TimeoutError:
                    raise Unavailable(
                        f"Request timeout expired: model '{name}' was still loading on demand "
                        f"after the request's timeout of {timeout_us} us; the load goes on and "
                        "a later request finds it loaded"
                    ) from None
            else:
                await asyncio.shield(task)
        except ServerError as exc:
            raise restate(exc, exc.message) from None  # each waiter its own error object
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if task.cancelled() and not (me is not None and me.cancelling()):
                # the load was stopped (shutdown), not this request
                raise Unavailable(
                    f"Server is shutting down: the load of model '{name}' on demand was stopped"
                ) from None
            raise
        finally:
            left = self._waking[name] - 1
            if left:
                self._waking[name] = left
            else:
                del self._waking[name]
            self.counters_of(name).wait.observe(time.monotonic() - t0)
        return True

    def _load_done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._loading.get(name) is task:
            del self._loading[name]
        if not task.cancelled():
            task.exception()  # retrieved: waiters that went away leave no "never retrieved"

    async def _load(self, name: str) -> None:
        async with self._room:
            rec = self.registry.get(name)
            if rec is not None and rec.serving:
                return  # loaded meanwhile (the API, an ensemble's load)
            if self._closed:
                raise Unavailable("Server is shutting down: model load refused")
            t0 = time.monotonic()
            try:
                need, how = self._need(name)
                await self._make_room(name, need, how)
                await self.manager.load(name)
            except ServerError as exc:
                self.counters_of(name).load_failures += 1
                log.error("on-demand load of model '%s' failed: %s", name, exc)
                self._record("load", name, exc)
                raise
            rec = self.registry.record(name)
            held = self.footprint(rec)
            self._footprints[name] = held
            self._loaded_ms[name] = time.time_ns() // 1_000_000
            self._load_order[name] = next(self._order)
            self.counters_of(name).loads += 1
            reason = PINNED_REASON if name in self.pins else LOADED_REASON
            for v in rec.serving:
                self.registry.set_state(name, v, READY, reason)
            secs = time.monotonic() - t0
            log.info(
                "on-demand: loaded model '%s' version(s) %s for a request in %.2fs (holds about "
                "%s; the models hold %s of a budget of %s)",
                name,
                sorted(rec.serving),
                secs,
                format_size(held),
                format_size(self.held()),
                format_size(self.budget()[0]),
            )
            self._record("load", name, None, memory_bytes=held, seconds=round(secs, 3))
            await self._trim(name)

    def _need(self, name: str) -> tuple[int, str]:
        """(bytes the model will hold, how that is known); (0, "") when it is not known."""
        if name in self._footprints:
            return self._footprints[name], "at its last load"
        model_dir = layout.find_model_dir_or_none(self.manager.repositories, name)
        if model_dir is None:
            return 0, ""
        try:
            config, _present = read_config(model_dir, self.manager.config.model_config_name)
            per = declared_estimate(config)
            if per is None or config.platform == "ensemble":
                return 0, ""
            versions = layout.select_versions(config, layout.list_versions(model_dir, warn=False))
        except ServerError:
            return 0, ""  # the load reports what is wrong with the model
        groups = config.instance_group
        instances = sum(max(int(g.count), 1) for g in groups) if groups else 1
        count = instances * max(len(versions), 1)
        return per * count, f"declared: {format_size(per)} x {count} instance(s)"

    # --------------------------------------------------------------- eviction
    def _last_used(self, rec: ModelRecord) -> tuple[int, int]:
        ran = max((sv.stats.last_inference_ms for sv in rec.serving.values()), default=0)
        return max(ran, self._loaded_ms.get(rec.name, 0)), self._load_order.get(rec.name, 0)

    def _why_kept(self, rec: ModelRecord, loading: str) -> str:
        """Why ``rec`` may not be evicted now ("" if it may)."""
        name = rec.name
        if name == loading:
            return "being loaded"
        if name in self.pins:
            return "pinned"
        if not self.footprint(rec):
            return "holds nothing"
        in_flight = sum(sv.stats.pending for sv in rec.serving.values())
        if in_flight:
            return f"{in_flight} request(s) in flight"
        if name in self._waking:
            return "requests waking up from its load"
        book = self.manager.books.get(name)
        if book is not None and book.lock.locked():
            return "being loaded or unloaded"
        return ""

    def _victim(self, loading: str) -> ModelRecord | None:
        idle = [
            rec
            for rec in self.registry.records()
            if rec.serving and not self._why_kept(rec, loading)
        ]
        return min(idle, key=self._last_used, default=None)

    def _holders(self, loading: str) -> str:
        """The models holding memory and why each stays, for a refusal."""
        held = [
            (self.footprint(rec), rec.name, self._why_kept(rec, loading))
            for rec in self.registry.records()
            if rec.serving and self.footprint(rec)
        ]
        held.sort(key=lambda h: (-h[0], h[1]))
        return ", ".join(f"'{n}' {format_size(b)} ({why})" for b, n, why in held) or "none"

    async def _make_room(self, name: str, need: int, how: str) -> None:
        if need <= 0:
            return
        budget, where = self.budget()
        if need > budget:
            raise InvalidArgument(
                f"failed to load '{name}': it needs about {format_size(need)} ({how}), more "
                f"than the whole budget of {format_size(budget)} ({where}); raise "
                "--model-memory-limit or lower its instance_group count"
            )
        while self.held() + need > budget:
            victim = self._victim(name)
            if victim is None:
                raise Unavailable(
                    f"cannot load model '{name}' on demand now: it needs about "
                    f"{format_size(need)} ({how}) and the models hold "
                    f"{format_size(self.held())} of a budget of {format_size(budget)} "
                    f"({where}); none of them can be evicted: {self._holders(name)}. Retry "
                    "once a model is idle, or unload one"
                )
            await self._evict(victim, name)

    async def _trim(self, loaded: str) -> None:
        """After a load: evict the least recently used idle others while over the budget."""
        budget, where = self.budget()
        while self.held() > budget:
            victim = self._victim(loaded)
            if victim is None:
                log.warning(
                    "on-demand: the models hold %s, over the budget of %s (%s), and none can "
                    "be evicted: %s",
                    format_size(self.held()),
                    format_size(budget),
                    where,
                    self._holders(loaded),
                )
                return
            await self._evict(victim, loaded)

    async def _evict(self, rec: ModelRecord, loading: str) -> None:
        name = rec.name
        freed = self.footprint(rec)
        last, _ = self._last_used(rec)
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last / 1000)) if last else "never"
        reason = (
            f"{EVICTED}: least recently used idle model (last used {when}), unloaded on "
            f"demand to make room for '{loading}'"
        )
        log.info(
            "on-demand: evicting model '%s' (least recently used idle, last used %s; frees "
            "about %s) to load '%s'",
            name,
            when,
            format_size(freed),
            loading,
        )
        try:
            await self.manager.unload(name, exact=True, reason=reason)
        except ServerError as exc:
            self._record("evict", name, exc, for_model=loading)
            raise
        self.counters_of(name).evictions += 1
        self._record("evict", name, None, for_model=loading, freed_bytes=freed)

    # ----------------------------------------------------------------- record
    def _record(self, action: str, name: str, error: BaseException | None, **extra: Any) -> None:
        """The audit log's line and the dashboard's event of one load or eviction."""
        if self.events is not None:
            note = f"on demand, for '{extra['for_model']}'" if "for_model" in extra else "on demand"
            self.events.add(action, name, "", error is None, str(error) if error else note)
        if self.audit is not None:
            key, client = CALLER.get()  # the request that caused it (gRPC, HTTP), if known
            self.audit.write(
                key=key,
                client=client,
                protocol="on-demand",
                action=action,
                model=name,
                outcome="ok" if error is None else f"error: {error}",
                **extra,
            )

    # --------------------------------------------------------------- shutdown
    async def close(self, timeout: float) -> None:
        """Shutdown: no load on demand starts from now on (those waiting for their turn fail
        UNAVAILABLE); the one under way may finish within ``timeout`` seconds (its waiting
        requests are in flight and are then served), else it is cancelled."""
        self._closed = True
        tasks = list(self._loading.values())
        if not tasks:
            return
        _done, left = await asyncio.wait(tasks, timeout=timeout)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
