"""Weighted traffic split between the versions of one model (canaries).

Rules of this file:
- A split applies only to requests that name no version; a request naming a version always
  gets that version (``Serving.get``).
- The choice is a smooth weighted round robin (the one nginx uses): deterministic, and over
  any run of ``sum(weights)`` requests each version gets exactly its weight (90/10, reduced
  to 9/1, gives 9:1 over every 10 requests), spread evenly rather than in bursts.
- A split names only READY versions when it is set (``parse_weights`` + ``TrafficSplit``); when
  the serving set changes (reload, unload) the split is re-bound to it and versions that left
  are dropped with a warning; a split left with no positive weight is cleared.
- Nothing here runs for a model without a split: the record's ``split`` is None.

Usage::

    split = TrafficSplit("m", parse_weights("m", {"1": 90, "2": 10}), rec.serving)
    sv = split.pick()
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Generic, TypeVar

from ..errors import InvalidArgument

_V = TypeVar("_V")  # what a split picks: the registry's ServingVersion

__all__ = ["TrafficSplit", "parse_weights", "weights_doc"]

log = logging.getLogger("sluice.manager")


def parse_weights(name: str, weights: Any) -> dict[int, int]:
    """``{"1": 90, "2": 10}`` (JSON) -> ``{1: 90, 2: 10}``; raises InvalidArgument naming the
    field. An empty object is valid (it clears the split)."""
    if type(weights) is not dict:
        raise InvalidArgument(
            f"traffic of model '{name}': 'weights' must be a JSON object of version -> weight, "
            'e.g. {"1": 90, "2": 10}'
        )
    out: dict[int, int] = {}
    for key, value in weights.items():
        text = str(key)
        if not text.isdigit() or (text != "0" and text.startswith("0")):
            raise InvalidArgument(
                f"traffic of model '{name}': version '{key}' in 'weights' is not a version "
                "number (a non-negative integer without a leading 0)"
            )
        if type(value) is not int or value < 0:
            raise InvalidArgument(
                f"traffic of model '{name}': the weight of version {key} must be a "
                f"non-negative integer, got {value!r}"
            )
        out[int(text)] = value
    if out and sum(out.values()) <= 0:
        raise InvalidArgument(
            f"traffic of model '{name}': the weights must have a positive sum (all are 0); "
            'send {"weights": {}} to clear the split'
        )
    return out


def weights_doc(weights: dict[int, int]) -> dict[str, int]:
    """The JSON form, versions in numeric order."""
    return {str(v): weights[v] for v in sorted(weights)}


class TrafficSplit(Generic[_V]):
    """The weights of a model's split, bound to the versions serving now."""

    __slots__ = ("name", "weights", "_entries", "_total")

    def __init__(self, name: str, weights: dict[int, int], serving: dict[int, _V]) -> None:
        not_ready = [v for v in sorted(weights) if v not in serving]
        if not_ready:
            raise InvalidArgument(
                f"traffic of model '{name}': version {not_ready[0]} is not READY (serving "
                f"versions: {', '.join(map(str, sorted(serving))) or 'none'}); load it first"
            )
        self.name = name
        self.weights = dict(weights)  # as given: what GET answers and the state file records
        positive = {v: w for v, w in weights.items() if w > 0}
        g = math.gcd(*positive.values())
        # [version, weight, current weight]; reduced by the gcd (90/10 -> 9/1)
        self._entries: list[list[Any]] = [
            [serving[v], w // g, 0] for v, w in sorted(positive.items())
        ]
        self._total = sum(e[1] for e in self._entries)

    def pick(self) -> _V:
        """The next version (smooth weighted round robin)."""
        best = None
        for e in self._entries:
            e[2] += e[1]
            if best is None or e[2] > best[2]:
                best = e
        assert best is not None
        best[2] -= self._total
        sv: _V = best[0]
        return sv

    def rebind(self, serving: dict[int, _V]) -> TrafficSplit[_V] | None:
        """This split over a new serving set (the versions' objects change on reload);
        versions no longer serving are dropped (logged). None when nothing with a positive
        weight is left: requests naming no version then go to the highest version again."""
        if not serving:
            log.info("model '%s': unloaded; its traffic split is cleared", self.name)
            return None
        kept = {v: w for v, w in self.weights.items() if v in serving}
        gone = sorted(v for v in self.weights if v not in serving)
        if gone:
            log.warning(
                "model '%s': version(s) %s left service; dropped from its traffic split %s",
                self.name,
                gone,
                json.dumps(weights_doc(self.weights)),
            )
        if not kept or sum(kept.values()) <= 0:
            if gone:
                log.warning(
                    "model '%s': traffic split cleared (no version with a positive weight "
                    "serves); requests without a version go to the highest version",
                    self.name,
                )
            return None
        return TrafficSplit(self.name, kept, serving)
