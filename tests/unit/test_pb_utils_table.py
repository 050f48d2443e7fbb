"""The python-backend page's table of ``pb_utils`` names cannot drift from the module: every
public name of sluice's ``pb_utils`` and every public method of its classes is in it."""

from __future__ import annotations

import re
from pathlib import Path

from sluice.backends.python import pb_utils

PAGE = Path(__file__).resolve().parents[2] / "docs" / "python-backend.md"


def _table() -> str:
    text = PAGE.read_text()
    start = text.index("## Every `pb_utils` name, and its status")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _mentioned(table: str) -> set[str]:
    """Every identifier inside backticks in the table (``Tensor.as_numpy()`` gives both
    ``Tensor`` and ``as_numpy``)."""
    names: set[str] = set()
    for code in re.findall(r"`([^`]+)`", table):
        names.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code))
    return names


def test_every_public_name_of_pb_utils_is_in_the_table() -> None:
    mentioned = _mentioned(_table())
    missing = [n for n in pb_utils.__all__ if n not in mentioned]
    assert missing == []


def test_every_public_method_of_its_classes_is_in_the_table() -> None:
    mentioned = _mentioned(_table())
    missing = []
    for name in pb_utils.__all__:
        obj = getattr(pb_utils, name)
        if not isinstance(obj, type):
            continue
        # its own attributes and those of its sluice bases, not Python's (Exception, enum)
        own = {a for c in obj.__mro__ if c.__module__.startswith("sluice.") for a in vars(c)}
        for attr in sorted(own):
            if not attr.startswith("_") and attr not in mentioned:
                missing.append(f"{name}.{attr}")
    assert missing == []
