"""A loaded version's serving form: its config's scheduler over its started instances.

Rules of this file:
- The scheduler follows the config: the sequence batcher when it has ``sequence_batching``,
  else the dynamic batcher (which also serves a model without batching, one request at a time).
- Needs no manager: unit tests build a version from fake instances and serve it.

Usage::

    sv = build(spec, instances, ModelStats("m", "1"), generation=3, cache=True)
    response = await sv.scheduler.submit(request, batch_size, shape_key)
"""

from __future__ import annotations

from ..backends.base import ModelInstance, ModelSpec
from ..core.rate_limiter import RateLimiter
from ..core.registry import ServingVersion, tensor_infos
from ..core.stats import ModelStats
from .scheduler import Scheduler
from .sequence import SequenceScheduler

__all__ = ["build"]


def build(
    spec: ModelSpec,
    instances: list[ModelInstance],
    stats: ModelStats,
    *,
    generation: int = 0,
    cache: bool = False,
    limiter: RateLimiter | None = None,
    honest_overload: bool = False,
) -> ServingVersion:
    """The serving version of ``spec`` over started ``instances``: its scheduler (the
    sequence batcher when the config has one), tensor tables and flags. ``cache``: the
    server has a response cache (the version uses it if its config enables it).
    ``limiter``: the server's rate limiter (``--rate-limit=execution_count``), which the
    instances register with here (InvalidArgument when its resources cannot serve them).
    ``honest_overload``: a full queue or queue timeout answers RESOURCE_EXHAUSTED."""
    config = spec.config
    name, v = spec.name, str(spec.version)
    sequence = config.HasField("sequence_batching")
    scheduler = (
        SequenceScheduler(
            name,
            v,
            config,
            instances,
            stats,
            spec.model_dir,
            limiter=limiter,
            honest_overload=honest_overload,
        )
        if sequence
        else Scheduler(
            name, v, config, instances, stats, limiter=limiter, honest_overload=honest_overload
        )
    )
    inputs = tensor_infos(list(config.input))
    decoupled = config.model_transaction_policy.decoupled
    return ServingVersion(
        spec=spec,
        scheduler=scheduler,
        stats=stats,
        inputs=inputs,
        outputs=tensor_infos(list(config.output)),
        required_inputs=frozenset(n for n, t in inputs.items() if not t.optional),
        max_batch_size=config.max_batch_size,
        version_str=v,
        generation=generation,
        decoupled=decoupled,
        # Triton: only the default and dynamic batchers use the cache
        cached=cache and config.response_cache.enable and not decoupled and not sequence,
    )
