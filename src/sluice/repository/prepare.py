"""Preparing one version of a model: its instances created and started (within the memory
limit), its serving version built over them, its warm-up samples run. A function of its
inputs (the spec, the backend, the admission), not of the manager, which decides what to
prepare and swaps the result in (``manager.py``).

Rules of this file:
- Every instance that started is appended to ``started`` as soon as it has, so that the
  caller stops them all if this version (or a later one of the same load) fails.
- A version whose instances fail to start, or whose warm-up fails, fails with Triton's
  "load failed for model '<name>': version <v> is at UNAVAILABLE state: <cause>" (400).
"""

from __future__ import annotations

from ..backends.base import Backend, ModelInstance, ModelSpec
from ..core.rate_limiter import RateLimiter
from ..core.registry import ServingVersion
from ..core.stats import ModelStats
from ..errors import InvalidArgument, NotFound, ServerError
from ..scheduling.serving_version import build as build_version
from .admission import MemoryAdmission
from .warmup import warm_up

__all__ = ["start_version"]


async def start_version(
    spec: ModelSpec,
    backend: Backend,
    admission: MemoryAdmission,
    stats: ModelStats,
    started: list[ModelInstance],
    *,
    generation: int = 0,
    cache: bool = False,
    limiter: RateLimiter | None = None,
    honest_overload: bool = False,
) -> ServingVersion:
    """Start ``spec``'s instances and return the version serving over them, warmed up.
    ``cache``: the server has a response cache (``scheduling.serving_version.build``)."""
    name, v, config = spec.name, spec.version, spec.config
    fname = config.default_model_filename or backend.default_model_filename()
    if fname and not (spec.version_dir / fname).exists():
        raise NotFound(
            f"failed to load '{name}' version {v}: model file {spec.version_dir / fname} not found"
        )
    instances = backend.create_instances(spec)
    # the first instance alone, measured; the rest only if they fit in memory
    results, estimate = await admission.start_instances(name, v, config, instances)
    for inst, res in zip(instances, results, strict=True):
        if not isinstance(res, BaseException):
            started.append(inst)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        # Triton answers 400 for a version that fails to initialize.
        raise InvalidArgument(
            f"load failed for model '{name}': version {v} is at UNAVAILABLE state: {errors[0]}"
        ) from errors[0]
    sv = build_version(
        spec,
        instances,
        stats,
        generation=generation,
        cache=cache,
        limiter=limiter,
        honest_overload=honest_overload,
    )
    sv.memory = estimate * len(instances)  # what on-demand loading counts (``on_demand.py``)
    try:
        await warm_up(sv, instances)  # before READY, on every instance
    except ServerError as exc:
        sv.scheduler.close()  # it never serves: its instances leave the rate limiter
        raise InvalidArgument(
            f"load failed for model '{name}': version {v} is at UNAVAILABLE state: {exc}"
        ) from None
    return sv
