"""The tracer without a server: flag parsing, Triton's update rules (per-model fields over
mirrored global ones, clearing), sampling, and the trace file's write rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sluice.errors import InvalidArgument, Unsupported
from sluice.tracing import Tracer, parse_trace_flags, split_flag
from sluice.tracing.trace import tensor_text


def tracer(tmp_path: Path, *flags: str) -> Tracer:
    items = [split_flag(f) for f in (f"triton,file={tmp_path / 't.json'}", *flags)]
    return Tracer(parse_trace_flags(items))


def ids(path: Path) -> list[str]:
    """The request ids of the traces in a trace file, in order."""
    return [e["request_id"] for e in json.loads(path.read_text()) if "model_name" in e]


def as_dict(pairs: list) -> dict:
    return dict(pairs)


def run_request(t: Tracer, model: str, rid: str = "") -> bool:
    """One request through the tracer as a front-end and the serving path would."""
    trace = t.sample(model)
    if trace is None:
        return False
    trace.start(model, rid)
    trace.model_version = 1
    trace.stamp("QUEUE_START")
    trace.end()
    trace.finish()
    return True


def test_flags_and_defaults(tmp_path: Path) -> None:
    s = as_dict(Tracer().settings())
    assert s == {
        "trace_level": ["OFF"],
        "trace_rate": "1000",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": "",
        "trace_mode": "triton",
    }
    cfg = parse_trace_flags(
        [split_flag(x) for x in ("level=tensors", "level=TIMESTAMPS", "rate=5", "count=3")]
    )
    assert cfg.level == ("TIMESTAMPS", "TENSORS") and cfg.rate == 5 and cfg.count == 3
    assert parse_trace_flags([split_flag("level=TIMESTAMPS"), split_flag("level=OFF")]).level == ()
    with pytest.raises(ValueError, match="format is"):
        split_flag("triton,file")
    with pytest.raises(ValueError, match="unknown global trace setting 'file'"):
        parse_trace_flags([split_flag("file=/tmp/x")])
    otel = parse_trace_flags([split_flag("opentelemetry,url=h:4318/v1/traces")]).otel
    assert otel.endpoint == "http://h:4318/v1/traces"


def test_model_settings_mirror_the_global_ones_until_cleared(tmp_path: Path) -> None:
    t = tracer(tmp_path, "level=TIMESTAMPS", "rate=1")
    assert as_dict(t.update("m", {"trace_rate": "3"}))["trace_rate"] == "3"
    t.update("", {"trace_count": "7", "trace_rate": "5"})
    m = as_dict(t.settings("m"))
    assert (m["trace_rate"], m["trace_count"]) == ("3", "7")  # own rate, the global count
    assert as_dict(t.settings("other"))["trace_rate"] == "5"
    # clearing the model's only field: it uses the global setting again
    assert as_dict(t.update("m", {"trace_rate": None}))["trace_rate"] == "5"
    # clearing a global field: back to the start-up value
    assert as_dict(t.update("", {"trace_rate": None}))["trace_rate"] == "1"
    # an empty level list changes nothing; OFF turns it off
    assert as_dict(t.update("", {"trace_level": []}))["trace_level"] == ["TIMESTAMPS"]
    assert as_dict(t.update("", {"trace_level": ["OFF"]}))["trace_level"] == ["OFF"]
    assert not t.on
    assert as_dict(t.update("m", {"trace_level": ["timestamps"]}))["trace_level"] == ["TIMESTAMPS"]
    assert t.on  # a model's own setting can trace while the global one is off


def test_update_errors(tmp_path: Path) -> None:
    t = tracer(tmp_path, "level=TIMESTAMPS")
    with pytest.raises(Unsupported, match="trace file location"):
        t.update("", {"trace_file": "/x"})
    with pytest.raises(InvalidArgument, match="sample rate must be non-zero"):
        t.update("", {"trace_rate": "0"})
    with pytest.raises(InvalidArgument, match="out of range \\[ -1, 2147483647 \\]"):
        t.update("", {"trace_count": "99999999999"})
    # without a file nothing can be traced, and Triton refuses every update saying so
    with pytest.raises(InvalidArgument, match="trace file name is not given"):
        Tracer(parse_trace_flags([split_flag("level=TIMESTAMPS")])).update("", {})
    # OFF is always allowed
    assert as_dict(Tracer().update("", {"trace_rate": "0"}))["trace_rate"] == "0"


def test_rate_count_and_the_files(tmp_path: Path) -> None:
    t = tracer(tmp_path, "level=TIMESTAMPS", "rate=2", "count=2")
    taken = [run_request(t, "m", f"r{k}") for k in range(6)]
    assert taken == [False, True, False, True, False, False]
    assert as_dict(t.settings())["trace_count"] == "0" and not t.on
    assert not (tmp_path / "t.json").exists()  # rate 2: written at exit
    t.close()
    assert ids(tmp_path / "t.json") == ["r1", "r3"]


def test_log_frequency_indexes_and_a_file_valid_after_each_save(tmp_path: Path) -> None:
    t = tracer(tmp_path, "level=TIMESTAMPS", "rate=1", "triton,log-frequency=2")
    for k in range(3):
        run_request(t, "m", f"r{k}")
    assert ids(tmp_path / "t.json.0") == ["r0", "r1"]
    # an update retires the setting: what it holds goes to the next index file
    t.update("", {"trace_rate": "1"})
    assert ids(tmp_path / "t.json.1") == ["r2"]
    t2 = tracer(tmp_path / "x", "level=TIMESTAMPS", "rate=1")
    (tmp_path / "x").mkdir()
    for k in range(2):
        run_request(t2, "m", f"a{k}")
        t2.update("", {})  # retired: appended to the main file, which stays valid JSON
        assert ids(tmp_path / "x" / "t.json") == [f"a{i}" for i in range(k + 1)]


def test_tensor_text_as_triton_prints_it() -> None:
    assert tensor_text(np.array([[1.0, 0.5, 1e6]], np.float32), "FP32") == "1,0.5,1e+06"
    assert tensor_text(np.array([3, -4], np.int64), "INT64") == "3,-4"
    assert tensor_text(np.array([True, False]), "BOOL") == "1,0"
    assert tensor_text(np.array([b"ab", b"c"], dtype=object), "BYTES") == '"ab","c"'
    assert tensor_text(np.zeros(2, np.float16), "FP16") == ""
