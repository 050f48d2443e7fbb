"""The traffic split's choice (smooth weighted round robin) and the control state file's
decoding and atomic write, without a server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluice.core.traffic import TrafficSplit, parse_weights
from sluice.errors import InvalidArgument
from sluice.repository.control_file import _Bad, decode, write_atomic


class _SV:
    def __init__(self, v: int) -> None:
        self.v = v


def _serving(*versions: int) -> dict[int, Any]:
    return {v: _SV(v) for v in versions}


@pytest.mark.parametrize(
    "weights",
    [{1: 90, 2: 10}, {1: 1, 2: 1}, {1: 3, 2: 5, 3: 2}, {1: 0, 2: 7}, {4: 1}, {1: 2, 2: 3}],
)
def test_every_window_of_sum_weights_gets_exact_shares(weights):
    split = TrafficSplit("m", weights, _serving(*weights))
    positive = {v: w for v, w in weights.items() if w > 0}
    total = sum(positive.values())
    picks = [split.pick().v for _ in range(total * 5)]
    for start in range(0, len(picks), total):
        window = picks[start : start + total]
        assert {v: window.count(v) for v in positive} == positive
    assert all(weights[v] > 0 for v in picks)


def test_90_10_reduces_to_9_1_spread_evenly():
    split = TrafficSplit("m", {1: 90, 2: 10}, _serving(1, 2))
    picks = [split.pick().v for _ in range(20)]
    assert picks.count(2) == 2 and picks[:10].count(2) == 1


def test_not_ready_version_is_refused_naming_it():
    with pytest.raises(InvalidArgument, match="version 3 is not READY"):
        TrafficSplit("m", {1: 1, 3: 1}, _serving(1, 2))


def test_rebind_drops_versions_that_left_and_clears_when_none_weighs():
    split = TrafficSplit("m", {1: 3, 2: 1}, _serving(1, 2))
    kept = split.rebind(_serving(1))
    assert kept is not None and kept.weights == {1: 3}
    dark = TrafficSplit("m", {1: 0, 2: 1}, _serving(1, 2))
    assert dark.rebind(_serving(1)) is None
    assert split.rebind({}) is None


@pytest.mark.parametrize(
    ("weights", "text"),
    [
        ({"1": -1}, "non-negative"),
        ({"1": 1.0}, "non-negative integer"),
        ({"1": False}, "non-negative integer"),
        ({"01": 1}, "not a version number"),
        ({"a": 1}, "not a version number"),
        ({"1": 0}, "positive sum"),
        ([1], "must be a JSON object"),
    ],
)
def test_parse_weights_refuses_naming_the_field(weights, text):
    with pytest.raises(InvalidArgument, match=text):
        parse_weights("m", weights)


def test_parse_weights_accepts_empty_and_version_zero():
    assert parse_weights("m", {}) == {}
    assert parse_weights("m", {"0": 1, "2": 0}) == {0: 1, 2: 0}


def test_decode_round_trip_and_errors():
    doc = {
        "sluice_model_control_state": 1,
        "models": {
            "m": {
                "versions": [2, 1],
                "override": {"config": "{}", "files": {"1/model.py": "eA=="}},
                "version_overrides": {"2": {"config": "{}"}},
                "traffic": {"1": 1, "2": 3},
            }
        },
    }
    state = decode(json.dumps(doc))["m"]
    assert state.versions == [1, 2]
    assert state.override is not None and state.override.files == {"1/model.py": b"x"}
    assert state.version_overrides[2].config == "{}"
    assert state.traffic == {1: 1, 2: 3}
    with pytest.raises(_Bad, match=r"models\['m'\].version_overrides\['x'\]"):
        decode(
            json.dumps(
                {
                    "sluice_model_control_state": 1,
                    "models": {"m": {"versions": [1], "version_overrides": {"x": {}}}},
                }
            )
        )
    with pytest.raises(_Bad, match="not a sluice model control state"):
        decode(json.dumps({"sluice_model_control_state": 2, "models": {}}))


def test_write_atomic_replaces_and_leaves_nothing_behind(tmp_path: Path):
    path = tmp_path / "state.json"
    write_atomic(path, b'{"a": 1}')
    path.chmod(0o640)
    write_atomic(path, b'{"a": 2}')
    assert path.read_bytes() == b'{"a": 2}'
    assert path.stat().st_mode & 0o777 == 0o640  # the file keeps its permissions
    with pytest.raises(TypeError, match="a bytes-like object is required, not 'str'"):
        write_atomic(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b'{"a": 2}'  # a failed write leaves the old file
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
