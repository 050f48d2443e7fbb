"""``sluice perf``: a perf_analyzer-compatible load tester (closed- and open-loop), with knee
detection, CSV and plots. Entry point: ``sluice.perf.cli.main``.

Rules of this package: its third-party libraries (``EXTRA``: plots, progress bars, HTTP/2
framing for gRPC load) come with the ``perf`` extra (``pip install 'sluice[perf]'``), not with
the server; they are imported only inside the code paths that use them, so that the server
(and ``sluice serve --help``) never loads them. ``sluice perf`` and ``sluice tune`` check
for them first (``missing_extra``) and exit 2 with one line naming the extra.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["EXTRA", "missing_extra", "require_extra"]

EXTRA = ("matplotlib", "tqdm", "hyperframe", "hpack")


def missing_extra() -> list[str]:
    """The modules of ``EXTRA`` that cannot be imported (none are imported here)."""
    out = []
    for name in EXTRA:
        if name in sys.modules:
            found = sys.modules[name] is not None  # None: import blocked
        else:
            try:
                found = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):
                found = False
        if not found:
            out.append(name)
    return out


def require_extra(command: str) -> int:
    """0 when the perf extra is installed; else one line on stderr naming it, and 2 (the exit
    status of a usage error)."""
    missing = missing_extra()
    if not missing:
        return 0
    print(
        f"error: {command} needs the perf extra: pip install 'sluice[perf]' "
        f"(missing: {', '.join(missing)})",
        file=sys.stderr,
    )
    return 2
