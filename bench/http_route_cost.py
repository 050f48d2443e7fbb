"""The HTTP router's cost per call on the hot path: ``ROUTES.match`` of
``POST /v2/models/<m>[/versions/<v>]/infer`` (the path split included), best of 7 timeit runs.

Usage::

    python bench/http_route_cost.py
"""

from __future__ import annotations

import timeit

from sluice.protocol.http_routes import ROUTES


def main() -> None:
    match = ROUTES.match
    for raw in (b"/v2/models/m/infer", b"/v2/models/m/versions/1/infer", b"/v2/models/m/ready"):
        method = "GET" if raw.endswith(b"ready") else "POST"
        n = 200_000
        best = (
            min(timeit.repeat(lambda m=method, r=raw: match(m, r.split(b"/")), number=n, repeat=7))
            / n
        )
        print(f"{method:4} {raw.decode():32} {best * 1e9:6.0f} ns")


if __name__ == "__main__":
    main()
