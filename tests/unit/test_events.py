"""The control-event ring buffer the dashboard shows."""

from __future__ import annotations

import pytest

from sluice.errors import NotFound
from sluice.observability.events import ControlEvents


def test_records_outcomes_newest_first_and_keeps_the_last_n() -> None:
    events = ControlEvents(capacity=3)
    with events.record("load", "a", version=2):
        pass
    with pytest.raises(NotFound), events.record("unload", "b"):
        raise NotFound("model 'b' is not loaded")
    for i in range(3):
        events.add("traffic", f"m{i}", message='{"1":100}')
    recent = events.recent()
    assert [e["model"] for e in recent] == ["m2", "m1", "m0"]  # capacity 3, newest first
    events = ControlEvents()
    with events.record("load", "a", version=2):
        pass
    with pytest.raises(NotFound), events.record("unload", "b"):
        raise NotFound("model 'b' is not loaded")
    first, second = events.recent()[1], events.recent()[0]
    assert (first["action"], first["model"], first["version"], first["ok"]) == (
        "load",
        "a",
        "2",
        True,
    )
    assert second["ok"] is False and second["message"] == "model 'b' is not loaded"
    assert first["time_ms"] <= second["time_ms"]
