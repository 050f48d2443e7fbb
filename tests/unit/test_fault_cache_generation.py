"""The response cache keys on a version's load generation: a reload's requests never find the
old load's entries, and ``forget`` frees exactly the retired generation's."""

from __future__ import annotations

import numpy as np

from sluice.core.cache import ResponseCache
from sluice.types import InferRequest


def _request(model: str, value: float) -> InferRequest:
    return InferRequest(model, inputs={"INPUT0": np.full(4, value, np.float32)})


def _put(cache: ResponseCache, model: str, value: float, generation: int) -> None:
    key = cache.key(_request(model, value), "1", generation)
    cache.put(key, {"OUTPUT0": np.full(4, value * generation, np.float32)}, {"OUTPUT0": "FP32"})


def test_another_generation_of_the_same_version_misses() -> None:
    cache = ResponseCache(1 << 16)
    _put(cache, "m", 1.0, generation=1)
    assert cache.get(cache.key(_request("m", 1.0), "1", 2)) is None
    hit = cache.get(cache.key(_request("m", 1.0), "1", 1))
    assert hit is not None and hit[0]["OUTPUT0"].tolist() == [1.0] * 4
    assert (cache.hits, cache.misses) == (1, 1)


def test_forget_drops_one_generation_and_frees_its_bytes() -> None:
    cache = ResponseCache(1 << 16)
    for value in (1.0, 2.0):
        _put(cache, "m", value, generation=1)
    _put(cache, "m", 1.0, generation=2)
    _put(cache, "other", 1.0, generation=1)
    used_per_entry = cache.used // 4
    assert cache.forget("m", "1", 1) == 2
    assert (cache.entries, cache.used) == (2, 2 * used_per_entry)
    assert cache.get(cache.key(_request("m", 1.0), "1", 1)) is None
    kept = cache.get(cache.key(_request("m", 1.0), "1", 2))
    assert kept is not None and kept[0]["OUTPUT0"].tolist() == [2.0] * 4  # generation 2's answer
    other = cache.get(cache.key(_request("other", 1.0), "1", 1))
    assert other is not None and other[0]["OUTPUT0"].tolist() == [1.0] * 4
    assert cache.forget("m", "1", 1) == 0
