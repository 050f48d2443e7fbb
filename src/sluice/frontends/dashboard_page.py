"""The operator's dashboard on the HTTP port: one static page, its script, the vendored
Chart.js (``static/``, licence beside it) and the JSON document the page polls.

Routes (GET only; in ``protocol.http_routes``)::

    /dashboard, /dashboard/          the page
    /dashboard/dashboard.js          its script
    /dashboard/chart.umd.min.js      Chart.js (vendored, see static/chart.js-VERSION)
    /dashboard/data                  the JSON the page polls (dashboard_data.snapshot)

The page's controls call the ordinary repository API (load, unload, traffic); nothing here
changes state.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from ..errors import NotFound
from ..service import InferenceService
from .dashboard_data import snapshot

__all__ = ["STATIC_DIR", "dashboard_data", "dashboard_file"]

STATIC_DIR = Path(__file__).resolve().parent / "static"

_FILES = {
    "": ("dashboard.html", b"text/html; charset=utf-8"),
    "dashboard.js": ("dashboard.js", b"text/javascript; charset=utf-8"),
    "chart.umd.min.js": ("chart.umd.min.js", b"text/javascript; charset=utf-8"),
}
_json_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@cache
def _static(name: str) -> bytes:
    return (STATIC_DIR / name).read_bytes()


def dashboard_data(service: InferenceService) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """``/dashboard/data``: the JSON the page polls."""
    body = _json_dumps(snapshot(service)).encode()
    return 200, body, [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]


def dashboard_file(leaf: str) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """``/dashboard/<leaf>`` (``""``: the page itself); NotFound for any other file."""
    found = _FILES.get(leaf)
    if found is None:
        raise NotFound(f"no dashboard file /dashboard/{leaf}")
    name, ctype = found
    return 200, _static(name), [(b"content-type", ctype), (b"cache-control", b"no-cache")]
