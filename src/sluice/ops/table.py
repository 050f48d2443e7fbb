"""Plain-text tables for the operator's commands: left-aligned text, right-aligned numbers,
two spaces between columns, a header line, nothing else (easy on eyes, ``awk`` and ``column``).

Usage::

    print(render(["MODEL", "VERSION"], [["add_sub", "1"]], numeric={1}))
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

__all__ = ["render"]


def render(
    headers: Sequence[str], rows: Sequence[Sequence[object]], numeric: Collection[int] = ()
) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [
            c.rjust(widths[i]) if i in numeric else c.ljust(widths[i]) for i, c in enumerate(r)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)
