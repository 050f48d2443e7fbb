"""Hypothesis strategies for malformed inference requests (HTTP bodies and gRPC messages).

Rules of this file:
- Every case starts near a valid ``add_sub`` / ``bytes_id`` request and breaks some of it:
  wrong shapes, datatypes, sizes, lengths, element types, truncations, deep nesting, huge
  declared sizes, inconsistent protobuf fields. A case may come out valid by chance; the
  test then expects a 200 / OK like any client would.
- Cases are plain data (``HttpCase``, ``GrpcCase``) so a failure prints what was sent.
- Used by ``tests/e2e/test_fuzz.py`` and the soak (``bench/soak.py``) for its bad requests.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

__all__ = [
    "HttpCase",
    "GrpcCase",
    "http_cases",
    "grpc_cases",
    "FUZZ_MODELS",
    "BYTES_ID_CONFIG",
    "BYTES_ID_PY",
    "expand",
]

DATATYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
    "BF16",
]
FUZZ_MODELS = ["add_sub", "add_sub", "add_sub", "bytes_id", "no_such_model"]

BYTES_ID_CONFIG = """
name: "bytes_id"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0", data_type: TYPE_STRING, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_STRING, dims: [ -1 ] } ]
"""

BYTES_ID_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t)]))
        return out
"""

_MISSING = object()
_INPUTS = {"add_sub": ["INPUT0", "INPUT1"], "bytes_id": ["INPUT0"], "no_such_model": ["INPUT0"]}


@dataclass(frozen=True)
class HttpCase:
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    what: str

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 300 else self.body[:300] + b"..."
        return f"HttpCase({self.method} {self.path} {self.headers} {body!r} [{self.what}])"


@dataclass(frozen=True)
class GrpcCase:
    method: str
    payload: bytes
    what: str

    def __repr__(self) -> str:
        p = self.payload if len(self.payload) <= 300 else self.payload[:300] + b"..."
        return f"GrpcCase({self.method} {p!r} [{self.what}])"


# --------------------------------------------------------------------------- JSON pieces
# odd JSON values of every type; a fixed pool (cheap to draw) plus a few drawn fresh
_JUNK: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    2**31,
    2**63,
    2**64 + 1,
    -(2**70),
    1.5,
    -0.0,
    1e308,
    float("nan"),
    float("inf"),
    "",
    "x",
    "FP32",
    "INPUT0",
    "\u00e9\u2603",
    "\x00",
    [],
    {},
    [[]],
    [None],
    [1, "a"],
    [-1],
    [2**63],
    [1.5, 2],
    {"a": 1},
    {"binary_data_size": -1},
    {"": [{}]},
    [[[[[[1]]]]]],
]
_text = st.text(alphabet='aZ09 _-/\u00e9\u2603\x00"', max_size=6)
json_values = st.one_of(
    st.sampled_from(_JUNK),
    st.integers(-(2**70), 2**70),
    _text,
    st.lists(st.sampled_from(_JUNK), max_size=3),
    st.dictionaries(_text, st.sampled_from(_JUNK), max_size=2),
)
_ints = st.one_of(
    st.integers(-3, 9), st.integers(-(2**64), 2**64), st.sampled_from([2**31, 2**63 - 1, 2**63])
)


def _text_n(max_size: int) -> st.SearchStrategy[str]:
    return st.text(alphabet='aZ09 _-/\u00e9\u2603\x00"', max_size=max_size)


def _or_junk(strategy: st.SearchStrategy[Any], p_junk: int = 6) -> st.SearchStrategy[Any]:
    """``strategy`` most of the time, else any JSON value or the field left out."""
    return st.integers(0, p_junk).flatmap(
        lambda k: strategy if k > 1 else (json_values if k == 1 else st.just(_MISSING))
    )


def _deep(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


_shape = st.one_of(
    st.just([1, 4]),
    st.just([4]),
    st.lists(st.integers(-2, 6), max_size=4),
    st.lists(_ints, min_size=1, max_size=4),
)
_element = st.one_of(
    st.integers(-5, 5),
    st.floats(allow_nan=False, width=32),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    _text_n(4),
    st.none(),
)
_data = st.one_of(
    st.lists(st.floats(-10, 10, width=32), min_size=4, max_size=4),
    st.lists(_element, max_size=9),
    st.lists(st.lists(_element, max_size=4), max_size=3),
    st.lists(_text_n(6), min_size=1, max_size=4),
)
_in_params = st.one_of(
    st.just(_MISSING),
    st.fixed_dictionaries({"binary_data_size": _ints}),
    st.fixed_dictionaries(
        {"shared_memory_region": json_values},
        optional={"shared_memory_offset": json_values, "shared_memory_byte_size": json_values},
    ),
    st.dictionaries(
        st.sampled_from(["binary_data_size", "binary_data", "shared_memory_region", "x"]),
        json_values,
        max_size=2,
    ),
)
_req_params = st.one_of(
    st.just(_MISSING),
    st.dictionaries(
        st.sampled_from(
            [
                "binary_data_output",
                "priority",
                "timeout",
                "sequence_id",
                "sequence_start",
                "sequence_end",
                "triton_enable_empty_final_response",
                "x",
            ]
        ),
        json_values,
        max_size=3,
    ),
)


@st.composite
def _input_doc(draw: st.DrawFn, name: str, binary: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": draw(_or_junk(st.sampled_from([name, name, "INPUT0", "", "OTHER"]))),
        "datatype": draw(_or_junk(st.sampled_from(["FP32", "FP32", "BYTES", *DATATYPES]))),
        "shape": draw(_or_junk(_shape)),
    }
    if binary:
        doc["parameters"] = draw(_or_junk(st.fixed_dictionaries({"binary_data_size": _ints})))
    else:
        doc["data"] = draw(_or_junk(_data))
        doc["parameters"] = draw(_in_params)
    return {k: v for k, v in doc.items() if v is not _MISSING}


@st.composite
def _infer_case(draw: st.DrawFn) -> HttpCase:
    model = draw(st.sampled_from(FUZZ_MODELS))
    version = draw(st.sampled_from(["", "", "", "1", "2", "abc", "-1", "99999999999999999999"]))
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    binary = draw(st.booleans())
    inputs = [draw(_input_doc(n, binary)) for n in _INPUTS[model]]
    if draw(st.integers(0, 5)) == 0:
        inputs = draw(st.lists(json_values, max_size=3))
    doc: dict[str, Any] = {"inputs": inputs}
    if draw(st.integers(0, 8)) == 0:
        doc = {"inputs": draw(json_values)}
    for key, strategy in (
        ("id", _text_n(6)),
        ("parameters", _req_params),
        ("outputs", st.lists(st.fixed_dictionaries({"name": _text_n(8)}), max_size=2)),
    ):
        value = draw(st.one_of(st.just(_MISSING), strategy, json_values))
        if value is not _MISSING:
            doc[key] = value
    text = json.dumps(doc)
    headers: list[tuple[str, str]] = []
    what = "json"
    body = text.encode()
    if binary:
        tail = draw(st.binary(max_size=64))
        body += tail
        what = "binary"
        hl = draw(
            st.one_of(
                st.just(str(len(text))),
                st.just(str(len(text))),
                st.integers(-5, len(body) + 5).map(str),
                st.sampled_from(["", "abc", "99999999999999999999", "1e3", "-0"]),
            )
        )
        headers.append(("Inference-Header-Content-Length", hl))
    shape = draw(st.integers(0, 12))
    if shape == 0 and len(body) > 1:  # truncated
        body = body[: draw(st.integers(0, len(body) - 1))]
        what += "+truncated"
    elif shape == 1:  # deep nesting, near and far past any sane limit
        depth = draw(st.sampled_from([50, 500, 990, 1200, 5000, 100_000]))
        where = draw(st.sampled_from(["body", "data", "shape", "params", "inputs"]))
        nested = _deep(depth)
        body = (
            {
                "body": nested,
                "data": '{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],"data":%s}]}',
                "shape": '{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":%s,"data":[1]}]}',
                "params": '{"parameters":{"x":%s},"inputs":[]}',
                "inputs": '{"inputs":%s}',
            }[where]
            .replace("%s", nested)
            .encode()
        )
        what = f"deep-{where}-{depth}"
    elif shape == 2:  # not JSON at all
        body = draw(st.binary(max_size=64))
        what = "garbage"
    elif shape == 3:  # compressed, maybe not really
        enc = draw(st.sampled_from(["gzip", "deflate", "br", "identity"]))
        if draw(st.booleans()):
            body = gzip.compress(body, mtime=0)  # no timestamp: the same bytes every run
        headers.append(("Content-Encoding", enc))
        what += f"+{enc}"
    return HttpCase("POST", path, tuple(headers), body, what)


@st.composite
def _control_case(draw: st.DrawFn) -> HttpCase:
    path = draw(
        st.sampled_from(
            [
                "/v2/repository/index",
                "/v2/repository/models/add_sub/load",
                "/v2/repository/models/no_such_model/load",
                "/v2/repository/models/no_such_model/unload",
                "/v2/systemsharedmemory/region/r0/register",
                "/v2/systemsharedmemory/region/r0/unregister",
                "/v2/trace/setting",
                "/v2/models/add_sub/trace/setting",
                "/v2/logging",
                "/v2/models/add_sub/generate",
                "/v2/models/bytes_id/generate",
                "/v2/models/add_sub/stats",
            ]
        )
    )
    if path.endswith("add_sub/load"):  # never a load that could take add_sub down
        body = b'{"parameters":{"file:1/model.py":"!!notbase64"}}'
    elif path.endswith("/load"):
        body = draw(
            st.one_of(
                st.just(b'{"parameters":{"config":"{not json"}}'),
                st.just(b'{"parameters":{"config":' + _deep(3000).encode() + b"}}"),
                json_values.map(lambda v: json.dumps({"parameters": {"config": v}}).encode()),
            )
        )
    elif path == "/v2/logging":
        body = json.dumps(
            draw(
                st.dictionaries(
                    st.sampled_from(["log_verbose_level", "log_info", "x"]),
                    st.one_of(_text_n(4), st.lists(st.none(), max_size=2), st.floats()),
                )
            )
        ).encode()
    else:
        body = draw(
            st.one_of(
                json_values.map(lambda v: json.dumps(v).encode()),
                st.binary(max_size=32),
                st.sampled_from([1000, 100_000]).map(lambda d: _deep(d).encode()),
            )
        )
    return HttpCase("POST", path, (), body, "control")


def http_cases() -> st.SearchStrategy[HttpCase]:
    return st.one_of(_infer_case(), _infer_case(), _infer_case(), _control_case())


# --------------------------------------------------------------------------- gRPC
_Tensor = pb.ModelInferRequest.InferInputTensor
_OutTensor = pb.ModelInferRequest.InferRequestedOutputTensor


@st.composite
def _param(draw: st.DrawFn, target: Any, key: str) -> None:
    kind = draw(st.sampled_from(["bool", "int64", "string", "double", "uint64"]))
    p = target[key]
    if kind == "bool":
        p.bool_param = draw(st.booleans())
    elif kind == "int64":
        p.int64_param = draw(st.integers(-(2**63), 2**63 - 1))
    elif kind == "uint64":
        p.uint64_param = draw(st.integers(0, 2**64 - 1))
    elif kind == "double":
        p.double_param = draw(st.floats())
    else:
        p.string_param = draw(_text_n(8))


_PARAM_KEYS = st.sampled_from(
    [
        "shared_memory_region",
        "shared_memory_offset",
        "shared_memory_byte_size",
        "binary_data",
        "priority",
        "timeout",
        "sequence_id",
        "sequence_start",
        "x",
    ]
)


@st.composite
def _grpc_input(draw: st.DrawFn, name: str, msg: pb.ModelInferRequest) -> None:
    t = _Tensor(
        name=draw(st.sampled_from([name, name, "INPUT0", "", "OTHER", "\u00e9"])),
        datatype=draw(st.sampled_from(["FP32", "FP32", "BYTES", "", "fp32", *DATATYPES])),
        shape=draw(
            st.one_of(
                st.just([1, 4]),
                st.lists(st.integers(-2, 6), max_size=4),
                st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=3),
            )
        ),
    )
    for key in draw(st.lists(_PARAM_KEYS, max_size=2, unique=True)):
        draw(_param(t.parameters, key))
    field = draw(
        st.sampled_from(
            [
                None,
                None,
                "fp32_contents",
                "int_contents",
                "int64_contents",
                "bytes_contents",
                "bool_contents",
                "uint64_contents",
            ]
        )
    )
    if field is not None:
        values = {
            "fp32_contents": st.floats(width=32),
            "int_contents": st.integers(-(2**31), 2**31 - 1),
            "int64_contents": st.integers(-(2**63), 2**63 - 1),
            "bytes_contents": st.binary(max_size=6),
            "bool_contents": st.booleans(),
            "uint64_contents": st.integers(0, 2**64 - 1),
        }[field]
        getattr(t.contents, field).extend(draw(st.lists(values, max_size=9)))
    msg.inputs.append(t)


@st.composite
def _grpc_infer(draw: st.DrawFn) -> GrpcCase:
    model = draw(st.sampled_from([*FUZZ_MODELS, ""]))
    msg = pb.ModelInferRequest(
        model_name=model,
        model_version=draw(st.sampled_from(["", "", "1", "2", "x", "-1", "99999999999999999999"])),
        id=draw(_text_n(4)),
    )
    for name in _INPUTS.get(model, ["INPUT0"])[: draw(st.integers(0, 3))] or []:
        draw(_grpc_input(name, msg))
    if draw(st.booleans()):
        msg.raw_input_contents.extend(
            draw(
                st.lists(
                    st.one_of(
                        st.binary(min_size=16, max_size=16),
                        st.binary(max_size=40),
                        st.just(b"\x05\x00\x00\x00hello"),
                        st.just(b"\xff\xff\xff\x7fx"),
                    ),
                    max_size=3,
                )
            )
        )
    for _ in range(draw(st.integers(0, 2))):
        out = _OutTensor(name=draw(st.sampled_from(["OUTPUT0", "OUTPUT1", "", "NOPE"])))
        for key in draw(st.lists(_PARAM_KEYS, max_size=2, unique=True)):
            draw(_param(out.parameters, key))
        msg.outputs.append(out)
    for key in draw(st.lists(_PARAM_KEYS, max_size=2, unique=True)):
        draw(_param(msg.parameters, key))
    payload = msg.SerializeToString(deterministic=True)
    what = "message"
    corrupt = draw(st.integers(0, 6))
    if corrupt == 0 and payload:
        payload = payload[: draw(st.integers(0, len(payload) - 1))]
        what = "truncated"
    elif corrupt == 1:
        payload = draw(st.binary(max_size=48))
        what = "garbage"
    elif corrupt == 2 and payload:
        i = draw(st.integers(0, len(payload) - 1))
        payload = payload[:i] + bytes([payload[i] ^ draw(st.integers(1, 255))]) + payload[i + 1 :]
        what = "bitflip"
    elif corrupt == 3:  # a huge declared length for a field that is not there
        payload = payload + b"\x3a\xff\xff\xff\xff\x0f"
        what = "huge-length"
    return GrpcCase("ModelInfer", payload, what)


@st.composite
def _grpc_other(draw: st.DrawFn) -> GrpcCase:
    method, msg = draw(
        st.sampled_from(
            [
                ("ModelMetadata", pb.ModelMetadataRequest),
                ("ModelConfig", pb.ModelConfigRequest),
                ("ModelReady", pb.ModelReadyRequest),
                ("ModelStatistics", pb.ModelStatisticsRequest),
            ]
        )
    )
    m = msg(
        name=draw(st.sampled_from([*FUZZ_MODELS, "", "a/b"])),
        version=draw(st.sampled_from(["", "1", "x", "-7", "99999999999999999999"])),
    )
    payload = m.SerializeToString(deterministic=True)
    if draw(st.booleans()):
        payload = draw(st.binary(max_size=24))
    return GrpcCase(method, payload, "other")


def grpc_cases() -> st.SearchStrategy[GrpcCase]:
    return st.one_of(_grpc_infer(), _grpc_infer(), _grpc_infer(), _grpc_other())


# --------------------------------------------------------------------------- variants
# Hypothesis draws a few structured cases per example (above: slow to draw, rich in
# structure); each is then varied cheaply with the example's own seeded ``random.Random``
# (``st.randoms()``), so that 10,000 requests cost seconds to make, not minutes.
_NUMBER = re.compile(rb"-?\d+")
_DATATYPE = re.compile(rb'"(%s)"' % b"|".join(d.encode() for d in DATATYPES))
_ODD_NUMBERS = [b"0", b"-1", b"3", b"4", b"16", b"2147483648", b"9223372036854775808", b"1e400"]


def _vary_bytes(data: bytes, rnd: random.Random) -> bytes:
    if not data:
        return bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 9)))
    k = rnd.randrange(5)
    i = rnd.randrange(len(data))
    if k == 0:  # truncate
        return data[:i]
    if k == 1:  # flip a byte
        return data[:i] + bytes([data[i] ^ rnd.randrange(1, 256)]) + data[i + 1 :]
    if k == 2:  # repeat a slice
        j = rnd.randrange(i, len(data) + 1)
        return data[:j] + data[i:j] + data[j:]
    if k == 3:  # cut a slice out
        j = rnd.randrange(i, len(data) + 1)
        return data[:i] + data[j:]
    return data + bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 17)))


def _vary_http(case: HttpCase, rnd: random.Random) -> HttpCase:
    body, headers = case.body, list(case.headers)
    k = rnd.randrange(6)
    if k == 0:  # one number in the JSON (a shape, a size, a datum) made odd
        spans = [m.span() for m in _NUMBER.finditer(body[:4096])]
        if spans:
            a, b = rnd.choice(spans)
            body = body[:a] + rnd.choice(_ODD_NUMBERS) + body[b:]
    elif k == 1:  # one datatype swapped for another
        spans = [m.span(1) for m in _DATATYPE.finditer(body[:4096])]
        if spans:
            a, b = rnd.choice(spans)
            body = body[:a] + rnd.choice(DATATYPES).encode() + body[b:]
    elif k == 2:  # the declared JSON length off by a little or a lot
        n = len(body) if not headers else rnd.randrange(-3, len(body) + 3)
        headers = [h for h in headers if h[0] != "Inference-Header-Content-Length"]
        headers.append(("Inference-Header-Content-Length", str(n + rnd.choice([0, -1, 1, 10**6]))))
    else:
        body = _vary_bytes(body, rnd)
    return HttpCase(case.method, case.path, tuple(headers), body, case.what + "+varied")


def _vary_grpc(case: GrpcCase, rnd: random.Random) -> GrpcCase:
    if case.method == "ModelInfer" and rnd.randrange(2):
        try:
            msg = pb.ModelInferRequest.FromString(case.payload)
        except Exception:  # noqa: BLE001 - already broken: vary the bytes instead
            msg = None
        if msg is not None:
            k = rnd.randrange(5)
            if k == 0 and msg.inputs:
                t = rnd.choice(msg.inputs)
                t.shape.append(rnd.choice([0, -1, 3, 2**40, 2**62]))
            elif k == 1 and msg.inputs:
                rnd.choice(msg.inputs).datatype = rnd.choice([*DATATYPES, "", "int"])
            elif k == 2:
                msg.raw_input_contents.append(bytes(rnd.randrange(256) for _ in range(16)))
            elif k == 3 and msg.raw_input_contents:
                del msg.raw_input_contents[rnd.randrange(len(msg.raw_input_contents))]
            else:
                msg.inputs.add(name=rnd.choice(["INPUT0", "INPUT1", "X"]), datatype="FP32")
            return GrpcCase(
                case.method, msg.SerializeToString(deterministic=True), case.what + "+field"
            )
    return GrpcCase(case.method, _vary_bytes(case.payload, rnd), case.what + "+bytes")


def expand(cases: list[Any], rnd: random.Random, total: int) -> list[Any]:
    """``cases`` followed by variants of them, ``total`` in all."""
    vary = _vary_http if isinstance(cases[0], HttpCase) else _vary_grpc
    out = list(cases)
    while len(out) < total:
        out.append(vary(rnd.choice(cases), rnd))
    return out
