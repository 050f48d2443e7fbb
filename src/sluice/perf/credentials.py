"""What the client tools (``sluice perf``, ``sluice model``, ``sluice tune``) send as the API key.

Lives in ``perf/``, the lower of the two client packages: ``ops/`` builds on ``perf/``,
never the other way round.
"""

from __future__ import annotations

import os

__all__ = ["api_key_option"]


def api_key_option(flag: str | None) -> str | None:
    """The API key to send: ``--api-key``, else ``$SLUICE_API_KEY``, else none."""
    return flag or os.environ.get("SLUICE_API_KEY") or None
