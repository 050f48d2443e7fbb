"""What a response-cache lookup costs per request (hashing the inputs + the LRU lookup),
against copying the same input bytes once (the floor any request pays), in one run.

    .venv/bin/python bench/cache_lookup.py [--n 20000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sluice.core.cache import ResponseCache
from sluice.types import InferRequest


def per_op_us(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=20000)
    args = p.parse_args()
    cache = ResponseCache(1 << 30)
    print(f"{'inputs':<28} {'lookup us':>10} {'copy us':>9} {'lookup/copy':>12}")
    for label, arrays in (
        (
            "add_sub (2 x FP32[1,4])",
            {"INPUT0": np.ones((1, 4), np.float32), "INPUT1": np.ones((1, 4), np.float32)},
        ),
        ("602 KB (FP32[1,3,224,224])", {"INPUT0": np.ones((1, 3, 224, 224), np.float32)}),
    ):
        req = InferRequest("m", inputs=arrays, input_datatypes=dict.fromkeys(arrays, "FP32"))
        key = cache.key(req, "1")
        cache.put(key, {"OUT": arrays["INPUT0"]}, {"OUT": "FP32"})
        n = args.n if arrays["INPUT0"].nbytes < 1e5 else max(args.n // 50, 100)
        lookup = per_op_us(lambda: cache.get(cache.key(req, "1")), n)  # noqa: B023
        copy = per_op_us(lambda: [a.copy() for a in arrays.values()], n)  # noqa: B023
        print(f"{label:<28} {lookup:>10.2f} {copy:>9.2f} {lookup / copy:>11.1f}x")


if __name__ == "__main__":
    main()
