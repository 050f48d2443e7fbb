"""What the native backends (onnxruntime, torchscript, tensorrt) share: Triton's instance
naming, and turning a scheduler batch into one tensor per input and back into one response
per request.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..errors import ServerError
from ..types import InferRequest, InferResponse
from .base import ModelSpec

__all__ = ["instance_names", "concat_inputs", "split_outputs", "batch_sizes", "responses"]


def instance_names(config: mc.ModelConfig) -> list[tuple[str, str, int]]:
    """``(instance name, kind, device id)`` per instance, named as Triton names them.

    A group is called ``<group name>`` or ``<model>_<group index>``; its instances are
    ``<group>_<i>`` when the group has more than one, else just ``<group>``.
    """
    groups = list(config.instance_group)
    out: list[tuple[str, str, int]] = []
    if not groups:
        return [(f"{config.name}_0", "CPU", 0)]
    for gi, group in enumerate(groups):
        gname = group.name or f"{config.name}_{gi}"
        kind_name = mc.ModelInstanceGroup.Kind.Name(group.kind)
        kind = kind_name.removeprefix("KIND_")
        if kind == "AUTO":
            kind = "CPU"
        devices = list(group.gpus) if kind == "GPU" and group.gpus else [0]
        count = max(int(group.count), 1)
        total = count * len(devices)
        i = 0
        for device in devices:
            for _ in range(count):
                name = f"{gname}_{i}" if total > 1 else gname
                out.append((name, kind, int(device)))
                i += 1
    return out


def concat_inputs(requests: Sequence[InferRequest], names: Sequence[str]) -> dict[str, np.ndarray]:
    """The batch's inputs: each request's array as is for one request, else concatenated on
    axis 0 (the scheduler only batches requests whose non-batch shapes match)."""
    if len(requests) == 1:
        return {n: requests[0].inputs[n] for n in names if n in requests[0].inputs}
    return {
        n: np.concatenate([r.inputs[n] for r in requests], axis=0)
        for n in names
        if n in requests[0].inputs
    }


def split_outputs(
    outputs: dict[str, np.ndarray], sizes: Sequence[int]
) -> list[dict[str, np.ndarray]]:
    """Split batched outputs back by each request's batch size (views, no copies)."""
    if len(sizes) == 1:
        return [outputs]
    bounds = np.cumsum(sizes)[:-1]
    per: list[dict[str, np.ndarray]] = [{} for _ in sizes]
    for name, arr in outputs.items():
        for i, part in enumerate(np.split(arr, bounds, axis=0)):
            per[i][name] = part
    return per


def batch_sizes(requests: Sequence[InferRequest], batching: bool) -> list[int]:
    if not batching:
        return [1] * len(requests)
    out = []
    for r in requests:
        first = next(iter(r.inputs.values()), None)
        out.append(int(first.shape[0]) if first is not None and first.ndim else 1)
    return out


def responses(
    spec: ModelSpec,
    requests: Sequence[InferRequest],
    outputs: dict[str, np.ndarray],
    batching: bool,
) -> list[InferResponse | ServerError]:
    """One response per request, holding its slice of the batch's outputs."""
    version = str(spec.version)
    parts = split_outputs(outputs, batch_sizes(requests, batching))
    return [
        InferResponse(spec.name, version, r.id, part)
        for r, part in zip(requests, parts, strict=True)
    ]
