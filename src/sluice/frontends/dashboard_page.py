"""The operator's dashboard on the HTTP port: one static page, its script, the vendored
Chart.js (``static/``, licence beside it) and the JSON document the page polls.

Routes (GET only)::

    /dashboard, /dashboard/          the page
    /dashboard/dashboard.js          its script
    /dashboard/chart.umd.min.js      Chart.js (vendored, see static/chart.js-VERSION)
    /dashboard/data                  the JSON the page polls (sluice.dashboard.snapshot)

The page's controls call the ordinary repository API (load, unload, traffic); nothing here
changes state.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from ..errors import NotFound
from ..observability.dashboard import snapshot
from ..service import InferenceService

__all__ = ["STATIC_DIR", "dashboard_route", "is_data_path"]

STATIC_DIR = Path(__file__).resolve().parent / "static"

_FILES = {
    b"": ("dashboard.html", b"text/html; charset=utf-8"),
    b"dashboard.js": ("dashboard.js", b"text/javascript; charset=utf-8"),
    b"chart.umd.min.js": ("chart.umd.min.js", b"text/javascript; charset=utf-8"),
}
_json_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@cache
def _static(name: str) -> bytes:
    return (STATIC_DIR / name).read_bytes()


def is_data_path(parts: list[bytes]) -> bool:
    """``/dashboard/data``: statistics (the rest of /dashboard is static files)."""
    return len(parts) == 3 and parts[2] == b"data"


def dashboard_route(
    service: InferenceService, parts: list[bytes]
) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """``parts``: the path split on ``/`` (``[b"", b"dashboard", ...]``, no trailing "")."""
    leaf = parts[2] if len(parts) == 3 else b"" if len(parts) == 2 else None
    if is_data_path(parts):
        body = _json_dumps(snapshot(service)).encode()
        return 200, body, [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
    if leaf is None or leaf not in _FILES:
        raise NotFound(f"no dashboard file /{b'/'.join(parts[1:]).decode(errors='replace')}")
    name, ctype = _FILES[leaf]
    return 200, _static(name), [(b"content-type", ctype), (b"cache-control", b"no-cache")]
