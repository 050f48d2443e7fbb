"""``model_warmup``: samples run on every instance of a version before it is READY.

Rules of this file (Triton 2.51's behaviour, checked on this machine):
- A sample of ``batch_size`` N is N requests (batch dimension 1 each when the model batches)
  executed together as one batch, ``count`` times (0 counts as 1), on each instance directly.
- ``zero_data`` is zeros (BYTES: empty strings); ``random_data`` is random bits (BYTES:
  empty strings, as Triton); ``input_data_file`` names a file in the model's ``warmup/``
  folder holding one request's data (raw, row-major; BYTES as Triton's length-prefixed
  elements), used for each of the N requests.
- Each request is validated against the config like a client's; warm-up requests count in
  the statistics (as in Triton). A sample that fails fails the load:
  ``failed to run warmup sample '<name>': <error>``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import ModelInstance
from ..core.registry import ServingVersion
from ..core.validation import check_request
from ..errors import InvalidArgument, NotFound, ServerError
from ..protocol import bytes_tensor
from ..protocol.datatypes import config_to_kserve, kserve_to_numpy
from ..types import InferRequest

__all__ = ["warm_up"]

_rng = np.random.default_rng()


def _sample_inputs(
    sample: mc.ModelWarmup, model_dir: Path, batching: bool
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    for name, spec in sample.inputs.items():
        datatype = config_to_kserve(mc.DataType.Name(spec.data_type))
        dtype = kserve_to_numpy(datatype)
        shape = ((1,) if batching else ()) + tuple(int(d) for d in spec.dims)
        count = int(np.prod(shape))
        kind = spec.WhichOneof("input_data_type")
        if datatype == "BYTES":
            if kind == "input_data_file":
                raw = _read(model_dir, spec.input_data_file)
                try:
                    arr = bytes_tensor.deserialize(raw, count)
                except ValueError as exc:
                    raise InvalidArgument(
                        f"warmup input '{name}': {spec.input_data_file} does not hold {count} "
                        f"BYTES elements: {exc}"
                    ) from None
            else:  # zero_data and random_data alike, as Triton
                arr = np.full(count, b"", dtype=np.object_)
            arrays[name] = arr.reshape(shape)
        else:
            assert dtype is not None
            nbytes = count * dtype.itemsize
            if kind == "input_data_file":
                raw = _read(model_dir, spec.input_data_file)
                if len(raw) != nbytes:
                    raise InvalidArgument(
                        f"warmup input '{name}': {spec.input_data_file} holds {len(raw)} bytes, "
                        f"the input needs {nbytes} ({datatype} {list(shape)})"
                    )
            elif kind == "random_data":
                raw = _rng.bytes(nbytes)
            else:
                raw = bytes(nbytes)
            arrays[name] = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        datatypes[name] = datatype
    return arrays, datatypes


def _read(model_dir: Path, file: str) -> bytes:
    path = model_dir / "warmup" / file
    if Path(file).is_absolute() or ".." in Path(file).parts:
        raise InvalidArgument(f"warmup input_data_file '{file}' must be a file in {path.parent}")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise NotFound(f"failed to open text file for read {path}: {exc.strerror}") from None


async def warm_up(sv: ServingVersion, instances: list[ModelInstance]) -> None:
    """Run the config's warm-up samples on each instance; raise on the first failure."""
    config = sv.config
    if not config.model_warmup:
        return
    batching = sv.max_batch_size > 0
    stats = sv.stats
    for sample in config.model_warmup:
        arrays, datatypes = _sample_inputs(sample, sv.spec.model_dir, batching)
        n = max(int(sample.batch_size), 1)
        for inst in instances:
            for _ in range(max(int(sample.count), 1)):
                requests = [
                    InferRequest(
                        model_name=sv.spec.name,
                        model_version=sv.version_str,
                        inputs=dict(arrays),
                        input_datatypes=dict(datatypes),
                    )
                    for _ in range(n)
                ]
                t0 = time.monotonic_ns()
                try:
                    for r in requests:
                        check_request(r, sv)
                    result = await inst.execute(requests)
                    errors = [r for r in result.results if isinstance(r, ServerError)]
                    if errors:
                        raise errors[0]
                except ServerError as exc:
                    raise InvalidArgument(
                        f"failed to run warmup sample '{sample.name}': {exc}"
                    ) from None
                elapsed = time.monotonic_ns() - t0
                stats.record_execution(
                    n,
                    n,
                    result.compute_input_ns,
                    result.compute_infer_ns,
                    result.compute_output_ns,
                )
                for _ in range(n):
                    stats.record_queue(0)
                    stats.record_success(elapsed)
