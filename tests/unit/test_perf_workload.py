"""Inputs built from model metadata (no server): batch dims, shapes, BYTES, JSON data forms."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sluice.perf.workload import (
    InputOptions,
    InputSpec,
    ModelInfo,
    PerfError,
    Target,
    build_inputs,
    encode_payloads,
)
from sluice.protocol.http_codec import decode_infer_request

ADD_SUB = ModelInfo(
    "add_sub",
    "",
    8,
    [InputSpec("INPUT0", "FP32", (4,)), InputSpec("INPUT1", "FP32", (4,))],
    ["OUTPUT0"],
)


def test_zero_inputs_get_the_batch_dimension() -> None:
    (step,) = build_inputs(ADD_SUB, InputOptions(batch_size=3, data="zero"))
    assert step["INPUT0"].shape == (3, 4) and not step["INPUT0"].any()
    assert step["INPUT1"].dtype == np.float32


def test_dynamic_dim_error_names_the_input() -> None:
    m = ModelInfo("dyn", "", 0, [InputSpec("IN", "INT32", (-1, 3))], [])
    with pytest.raises(PerfError, match=r"input 'IN'.*--shape IN:1,3"):
        build_inputs(m, InputOptions(data="random"))
    (step,) = build_inputs(m, InputOptions(data="random", shapes={"IN": (5, 3)}))
    assert step["IN"].shape == (5, 3) and step["IN"].dtype == np.int32


def test_batch_limits() -> None:
    with pytest.raises(PerfError, match="max_batch_size"):
        build_inputs(ADD_SUB, InputOptions(batch_size=9, data="zero"))
    nobatch = ModelInfo("n", "", 0, [InputSpec("X", "FP32", (1,))], [])
    with pytest.raises(PerfError, match="does not support batching"):
        build_inputs(nobatch, InputOptions(batch_size=2, data="zero"))


def test_bytes_inputs_use_string_length() -> None:
    m = ModelInfo("t", "", 4, [InputSpec("TEXT", "BYTES", (2,))], [])
    (step,) = build_inputs(m, InputOptions(data="random", string_length=7))
    assert step["TEXT"].shape == (1, 2) and all(len(x) == 7 for x in step["TEXT"].ravel())


def test_json_data_forms_round_robin_batches(tmp_path: Path) -> None:
    data = tmp_path / "d.json"
    data.write_text(
        json.dumps(
            {
                "data": [
                    {"INPUT0": [1, 2, 3, 4], "INPUT1": {"content": [0, 0, 0, 0], "shape": [4]}},
                    {"INPUT0": [[5, 6], [7, 8]], "INPUT1": {"content": [1, 1, 1, 1]}},
                    {"INPUT0": [9, 9, 9, 9], "INPUT1": [2, 2, 2, 2]},
                ]
            }
        )
    )
    steps = build_inputs(ADD_SUB, InputOptions(batch_size=2, data=str(data)))
    assert len(steps) == 3  # 3 entries, 2 per request: 6 entries round-robin
    assert steps[0]["INPUT0"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert steps[1]["INPUT0"][1].tolist() == [1, 2, 3, 4]
    with pytest.raises(PerfError, match="no value for input 'INPUT1'"):
        data.write_text(json.dumps({"data": [{"INPUT0": [1, 2, 3, 4]}]}))
        build_inputs(ADD_SUB, InputOptions(data=str(data)))


def test_http_payload_decodes_with_the_server_codec() -> None:
    steps = build_inputs(ADD_SUB, InputOptions(batch_size=2, data="random"))
    (raw,) = encode_payloads(Target.parse("127.0.0.1:8000", "http"), ADD_SUB, steps)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v2/models/add_sub/infer HTTP/1.1"
    hdr = dict(ln.split(": ", 1) for ln in lines[1:])
    assert int(hdr["Content-Length"]) == len(body)
    req = decode_infer_request(body, "add_sub", "", int(hdr["Inference-Header-Content-Length"]))
    np.testing.assert_array_equal(req.inputs["INPUT0"], steps[0]["INPUT0"])


def test_target_parse() -> None:
    assert Target.parse(None, "grpc").port == 8001
    assert Target.parse("http://h:9000/", "http").address == "h:9000"
    with pytest.raises(PerfError) as info:
        Target.parse("nohost", "http")
    assert str(info.value) == "-u expects host:port, got 'nohost'"


def test_directory_data_one_file_per_input(tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    (d / "INPUT0").write_bytes(np.array([1, 2, 3, 4], dtype=np.float32).tobytes())
    (d / "INPUT1").write_bytes(np.array([5, 6, 7, 8], dtype=np.float32).tobytes())
    (step,) = build_inputs(ADD_SUB, InputOptions(batch_size=2, data=str(d)))
    assert step["INPUT0"].shape == (2, 4) and step["INPUT0"][1].tolist() == [1, 2, 3, 4]
    assert step["INPUT1"].dtype == np.float32 and step["INPUT1"][0].tolist() == [5, 6, 7, 8]

    text = ModelInfo("t", "", 0, [InputSpec("TEXT", "BYTES", (-1,))], [])
    (d / "TEXT").write_text("hello\nsluice\n")
    (step,) = build_inputs(text, InputOptions(data=str(d)))
    assert step["TEXT"].tolist() == [b"hello", b"sluice"]

    (d / "INPUT1").write_bytes(b"\x00" * 10)  # 2.5 floats
    with pytest.raises(PerfError, match=r"INPUT1: 10 bytes is not a whole number of FP32"):
        build_inputs(ADD_SUB, InputOptions(data=str(d)))
    (d / "INPUT1").unlink()
    with pytest.raises(PerfError, match=r"no data file for input 'INPUT1'"):
        build_inputs(ADD_SUB, InputOptions(data=str(d)))
