"""What ``sluice perf`` sends: the model's inputs, built from its metadata and config, encoded
once with the pure codecs (``sluice.protocol``) into ready-to-write request payloads.

Rules of this file:
- Inputs are generated once and reused, as perf_analyzer does: ``zero`` and ``random`` give one
  payload; a JSON data file gives one payload per batch of entries, sent round-robin.
- Shapes come from the model: with ``max_batch_size > 0`` the batch dimension is ``-b``; any
  other dynamic dimension must be given with ``--shape NAME:d1,d2`` (the error names the input).
- Talking to the server here is plain and blocking (urllib / a sync gRPC stub): this runs
  before and between measurements, never inside one.

Usage::

    target = Target.parse("127.0.0.1:8000", "http")
    model = fetch_model(target, "add_sub")
    steps = build_inputs(model, InputOptions(batch_size=1, data="zero"))
    payloads = encode_payloads(target, model, steps)
"""

from __future__ import annotations

import base64
import json
import math
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..protocol import grpc_codec, http_codec
from ..protocol.datatypes import KSERVE_TO_NUMPY

__all__ = [
    "PerfError",
    "Target",
    "ModelInfo",
    "InputSpec",
    "InputOptions",
    "fetch_model",
    "fetch_server_stats",
    "http_json",
    "version_path",
    "build_inputs",
    "encode_payloads",
]

GRPC_INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"


class PerfError(Exception):
    """A user-facing error of ``sluice perf`` (printed without a traceback, exit 1)."""


@dataclass(frozen=True)
class Target:
    protocol: str  # "http" | "grpc"
    host: str
    port: int
    api_key: str = ""  # sent as 'Authorization: Bearer <key>' when set (--api-key)

    @classmethod
    def parse(cls, url: str | None, protocol: str, api_key: str | None = None) -> Target:
        protocol = protocol.lower()
        if protocol not in ("http", "grpc"):
            raise PerfError(f"-i must be http or grpc, got '{protocol}'")
        if not url:
            url = "localhost:8001" if protocol == "grpc" else "localhost:8000"
        for prefix in ("http://", "grpc://"):
            if url.startswith(prefix):
                url = url[len(prefix) :]
        url = url.rstrip("/")
        host, sep, port = url.rpartition(":")
        if not sep or not port.isdigit():
            raise PerfError(f"-u expects host:port, got '{url}'")
        return cls(protocol, host.strip("[]") or "localhost", int(port), api_key or "")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def http_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def grpc_metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.api_key}")] if self.api_key else []


@dataclass(frozen=True)
class InputSpec:
    name: str
    datatype: str  # KServe name: FP32, BYTES, ...
    dims: tuple[int, ...]  # without the batch dimension; -1 = dynamic


@dataclass
class ModelInfo:
    name: str
    version: str
    max_batch_size: int
    inputs: list[InputSpec]
    outputs: list[str]
    extensions: list[str] = field(default_factory=list)

    @property
    def has_statistics(self) -> bool:
        return "statistics" in self.extensions


@dataclass(frozen=True)
class InputOptions:
    batch_size: int = 1
    data: str = "random"  # zero | random | path to a JSON file
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    string_length: int = 128
    string_data: str | None = None
    seed: int = 0


# --------------------------------------------------------------------------- metadata
def http_json(target: Target, path: str) -> Any:
    url = f"http://{target.address}{path}"
    try:
        req = urllib.request.Request(url, headers=target.http_headers())
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        try:
            body = json.loads(body).get("error", body)
            if isinstance(body, dict):  # OpenAI's error object
                body = body.get("message", body)
        except (ValueError, AttributeError):
            pass
        raise PerfError(f"GET {path} failed with HTTP {e.code}: {body}") from None
    except OSError as e:
        raise PerfError(f"cannot reach the server at {url}: {e}") from None


def _grpc_call(target: Target, method: str, request: Any) -> dict[str, Any]:
    import grpc
    from google.protobuf import json_format
    from tritonclient.grpc import service_pb2_grpc

    with grpc.insecure_channel(target.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            msg = getattr(stub, method)(request, timeout=30, metadata=target.grpc_metadata())
        except grpc.RpcError as e:
            raise PerfError(
                f"gRPC {method} at {target.address} failed: {e.code().name}: {e.details()}"  # type: ignore[attr-defined]
            ) from None
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def version_path(model: str, version: str) -> str:
    return f"/v2/models/{model}" + (f"/versions/{version}" if version else "")


def fetch_model(target: Target, model: str, version: str = "") -> ModelInfo:
    """Metadata + config of ``model`` (and the server's extensions) over ``target``'s protocol."""
    if target.protocol == "http":
        server = http_json(target, "/v2")
        meta = http_json(target, version_path(model, version))
        config = http_json(target, version_path(model, version) + "/config")
    else:
        from tritonclient.grpc import service_pb2 as pb

        server = _grpc_call(target, "ServerMetadata", pb.ServerMetadataRequest())
        meta = _grpc_call(
            target, "ModelMetadata", pb.ModelMetadataRequest(name=model, version=version)
        )
        config = _grpc_call(
            target, "ModelConfig", pb.ModelConfigRequest(name=model, version=version)
        ).get("config", {})
    mbs = int(config.get("max_batch_size", 0) or 0)
    inputs = []
    for tin in meta.get("inputs", []):
        shape = [int(d) for d in tin.get("shape", [])]
        if mbs > 0 and shape:
            shape = shape[1:]  # the metadata shape starts with the batch dimension (-1)
        inputs.append(InputSpec(tin["name"], tin["datatype"], tuple(shape)))
    outputs = [t["name"] for t in meta.get("outputs", [])]
    return ModelInfo(model, version, mbs, inputs, outputs, list(server.get("extensions", [])))


def fetch_server_stats(target: Target, model: str, version: str = "") -> dict[str, Any]:
    """The statistics-extension document for ``model`` (cumulative counters)."""
    if target.protocol == "http":
        return dict(http_json(target, version_path(model, version) + "/stats"))
    from tritonclient.grpc import service_pb2 as pb

    return _grpc_call(
        target, "ModelStatistics", pb.ModelStatisticsRequest(name=model, version=version)
    )


# --------------------------------------------------------------------------- input data
def _resolve_dims(spec: InputSpec, opts: InputOptions) -> tuple[int, ...]:
    dims = opts.shapes.get(spec.name, spec.dims)
    if any(d < 0 for d in dims):
        raise PerfError(
            f"input '{spec.name}' has a dynamic dimension (shape {list(spec.dims)}); give its "
            f"shape with --shape {spec.name}:"
            + ",".join("1" if d < 0 else str(d) for d in spec.dims)
        )
    return tuple(dims)


def _generate(
    spec: InputSpec, shape: tuple[int, ...], opts: InputOptions, rng: np.random.Generator
) -> np.ndarray:
    count = math.prod(shape)
    if spec.datatype == "BYTES":
        arr = np.empty(count, dtype=np.object_)
        if opts.string_data is not None:
            arr[:] = [opts.string_data.encode()] * count
        elif opts.data == "zero":
            arr[:] = [b"0" * opts.string_length] * count
        else:
            letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)
            arr[:] = [rng.choice(letters, opts.string_length).tobytes() for _ in range(count)]
        return arr.reshape(shape)
    dt = KSERVE_TO_NUMPY.get(spec.datatype)
    if dt is None:
        raise PerfError(f"input '{spec.name}': unsupported datatype {spec.datatype}")
    if opts.data == "zero":
        return np.zeros(shape, dtype=dt)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dt)
    if dt.kind in "iu":
        return rng.integers(0, 100, size=shape).astype(dt)
    return rng.random(size=shape).astype(dt)


def _json_value(spec: InputSpec, value: Any, opts: InputOptions) -> np.ndarray:
    """One JSON data entry for ``spec``: a (nested) list, {"content": ..., "shape": ...} or
    {"b64": ...} (raw bytes of the tensor), as perf_analyzer reads them."""
    shape: tuple[int, ...] | None = None
    if isinstance(value, dict):
        if "shape" in value:
            shape = tuple(int(d) for d in value["shape"])
        if "b64" in value:
            raw = base64.b64decode(value["b64"])
            if spec.datatype == "BYTES":
                arr = np.array([raw], dtype=np.object_)
            else:
                arr = np.frombuffer(raw, dtype=KSERVE_TO_NUMPY[spec.datatype]).copy()
            return arr.reshape(shape or _resolve_dims(spec, opts))
        if "content" not in value:
            raise PerfError(
                f"input '{spec.name}': a JSON data entry object needs 'content' or 'b64'"
            )
        value = value["content"]
    flat = np.asarray(value, dtype=object).reshape(-1).tolist()
    if shape is None:
        dims = opts.shapes.get(spec.name, spec.dims)
        if any(d < 0 for d in dims):
            if sum(1 for d in dims if d < 0) == 1:  # infer the one dynamic dimension
                known = math.prod(d for d in dims if d >= 0)
                dims = tuple(len(flat) // max(known, 1) if d < 0 else d for d in dims)
            else:
                dims = _resolve_dims(spec, opts)
        shape = tuple(dims)
    if math.prod(shape) != len(flat):
        raise PerfError(
            f"input '{spec.name}': JSON data has {len(flat)} elements but shape {list(shape)} "
            f"needs {math.prod(shape)}"
        )
    if spec.datatype == "BYTES":
        arr = np.empty(len(flat), dtype=np.object_)
        arr[:] = [v.encode() if isinstance(v, str) else bytes(v) for v in flat]
        return arr.reshape(shape)
    return np.array(flat, dtype=KSERVE_TO_NUMPY[spec.datatype]).reshape(shape)


def _load_json_steps(
    path: Path, model: ModelInfo, opts: InputOptions
) -> list[dict[str, np.ndarray]]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PerfError(f"--input-data {path}: cannot read JSON: {e}") from None
    entries = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise PerfError(f'--input-data {path}: expected {{"data": [{{"INPUT": [...]}}, ...]}}')
    steps = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise PerfError(f"--input-data {path}: data[{i}] must be an object of inputs")
        step = {}
        for spec in model.inputs:
            if spec.name not in entry:
                raise PerfError(
                    f"--input-data {path}: data[{i}] has no value for input '{spec.name}'"
                )
            step[spec.name] = _json_value(spec, entry[spec.name], opts)
        steps.append(step)
    return steps


def _load_dir_step(path: Path, model: ModelInfo, opts: InputOptions) -> dict[str, np.ndarray]:
    """perf_analyzer's directory form: one file per input, named after it; raw little-endian
    tensor bytes, or for BYTES inputs one element per line."""
    step = {}
    for spec in model.inputs:
        f = path / spec.name
        try:
            raw = f.read_bytes()
        except OSError as e:
            raise PerfError(
                f"--input-data {path}: no data file for input '{spec.name}' ({e.strerror})"
            ) from None
        if spec.datatype == "BYTES":
            values: list[Any] = raw.decode(errors="replace").splitlines()
        else:
            dt = KSERVE_TO_NUMPY.get(spec.datatype)
            if dt is None:
                raise PerfError(f"input '{spec.name}': unsupported datatype {spec.datatype}")
            if len(raw) % dt.itemsize:
                raise PerfError(
                    f"--input-data {f}: {len(raw)} bytes is not a whole number of "
                    f"{spec.datatype} elements ({dt.itemsize} bytes each)"
                )
            values = np.frombuffer(raw, dtype=dt).tolist()
        step[spec.name] = _json_value(spec, values, opts)
    return step


def build_inputs(model: ModelInfo, opts: InputOptions) -> list[dict[str, np.ndarray]]:
    """One dict of full request tensors (batch dimension included) per payload."""
    b = opts.batch_size
    if b < 1:
        raise PerfError("-b must be at least 1")
    if model.max_batch_size == 0 and b > 1:
        raise PerfError(
            f"model '{model.name}' does not support batching (max_batch_size 0); -b must be 1"
        )
    if model.max_batch_size > 0 and b > model.max_batch_size:
        raise PerfError(
            f"-b {b} is above model '{model.name}''s max_batch_size {model.max_batch_size}"
        )
    unknown = set(opts.shapes) - {s.name for s in model.inputs}
    if unknown:
        raise PerfError(f"--shape names unknown input(s): {', '.join(sorted(unknown))}")
    batched = model.max_batch_size > 0

    if opts.data in ("zero", "random"):
        rng = np.random.default_rng(opts.seed)
        step = {}
        for spec in model.inputs:
            dims = _resolve_dims(spec, opts)
            one = _generate(spec, dims, opts, rng)
            step[spec.name] = np.stack([one] * b) if batched else one
        return [step]

    src = Path(opts.data)
    if src.is_dir():
        entries = [_load_dir_step(src, model, opts)]
    else:
        entries = _load_json_steps(src, model, opts)
    if not batched:
        return entries
    # each entry is one batch element; a request takes b consecutive entries (round-robin)
    n = len(entries)
    out = []
    for start in range(0, n * b if n % b else n, b):
        out.append(
            {
                spec.name: np.stack([entries[(start + k) % n][spec.name] for k in range(b)])
                for spec in model.inputs
            }
        )
    return out


# --------------------------------------------------------------------------- payloads
def _http_request(
    target: Target, model: ModelInfo, inputs: Mapping[str, np.ndarray], dtypes: Mapping[str, str]
) -> bytes:
    body, header_length = http_codec.encode_infer_request(inputs, binary=True, datatypes=dtypes)
    path = version_path(model.name, model.version) + "/infer"
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {target.address}",
        f"Content-Length: {len(body)}",
    ]
    if target.api_key:
        lines.append(f"Authorization: Bearer {target.api_key}")
    if header_length is None:
        lines.append("Content-Type: application/json")
    else:
        lines.append("Content-Type: application/octet-stream")
        lines.append(f"Inference-Header-Content-Length: {header_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def encode_payloads(
    target: Target, model: ModelInfo, steps: Sequence[Mapping[str, np.ndarray]]
) -> list[bytes]:
    """Wire-ready payloads: a full HTTP/1.1 request (binary tensor extension) or a serialized
    ``ModelInferRequest``."""
    dtypes = {s.name: s.datatype for s in model.inputs}
    if target.protocol == "http":
        return [_http_request(target, model, step, dtypes) for step in steps]
    return [
        grpc_codec.encode_infer_request(
            model.name, step, model_version=model.version, datatypes=dtypes
        ).SerializeToString()
        for step in steps
    ]
