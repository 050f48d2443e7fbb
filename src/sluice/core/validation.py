"""Checks of an inference request against the model's config: input names, datatypes,
shapes (the batch dimension is not in ``dims``), batch size, requested outputs.

Returns what the scheduler needs: the request's batch size and the key of its non-batch
shapes (requests batch together only when those match).
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgument
from ..types import InferRequest
from .registry import ServingVersion

__all__ = ["check_model_name", "check_request"]


def check_model_name(name: str) -> str:
    """Return ``name`` if it is a legal model name, else raise InvalidArgument."""
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\x00" in name
        or name.startswith(".")
    ):
        raise InvalidArgument(
            f"invalid model name '{name}': a model name must be a plain directory name "
            "in the model repository"
        )
    return name


def _shape_str(dims: Any) -> str:
    return "[" + ",".join(str(int(d)) for d in dims) + "]"


def _unexpected_input(in_name: str, req: InferRequest, sv: ServingVersion) -> InvalidArgument:
    """Triton's phrase first (clients match on it), then what the model expects and lacks."""
    missing = sorted(sv.required_inputs.difference(req.inputs))
    lacking = f"; missing required input(s) {missing}" if missing else ""
    return InvalidArgument(
        f"unexpected inference input '{in_name}' for model '{sv.spec.name}'; expected inputs: "
        f"{sorted(sv.inputs)}{lacking}"
    )


def check_request(req: InferRequest, sv: ServingVersion) -> tuple[int, tuple[Any, ...]]:
    name = sv.spec.name
    inputs = req.inputs
    expected = sv.inputs
    if len(inputs) < len(sv.required_inputs) or not sv.required_inputs.issubset(inputs):
        for in_name in inputs:
            if in_name not in expected:
                raise _unexpected_input(in_name, req, sv)
        missing = sorted(sv.required_inputs.difference(inputs))
        n_req, n_all = len(sv.required_inputs), len(expected)
        wanted = (
            f"{n_req} inputs" if n_req == n_all else f"number of inputs between {n_req} and {n_all}"
        )
        raise InvalidArgument(
            f"expected {wanted} but got {len(inputs)} inputs for model "
            f"'{name}'. Got input(s) {sorted(inputs)}, but missing required input(s) "
            f"{missing}. Please provide all required input(s)."
        )
    batching = sv.max_batch_size > 0
    batch = 1
    key: list[Any] = []
    first = True
    for in_name, arr in inputs.items():
        info = expected.get(in_name)
        if info is None:
            raise _unexpected_input(in_name, req, sv)
        wire = req.input_datatypes.get(in_name)
        if wire is not None and wire != info.datatype:
            raise InvalidArgument(
                f"inference input '{in_name}' data-type is '{wire}', but model '{name}' "
                f"expects '{info.datatype}'"
            )
        shape = arr.shape
        dims = info.dims
        if batching:
            if len(shape) != len(dims) + 1:
                raise InvalidArgument(
                    f"unexpected shape for input '{in_name}' for model '{name}'. Expected "
                    f"{_shape_str((-1, *dims))}, got {_shape_str(shape)} (the first dimension is "
                    f"the batch size, max_batch_size {sv.max_batch_size})"
                )
            b = shape[0]
            if first:
                batch = b
                first = False
            elif b != batch:
                raise InvalidArgument(
                    f"input '{in_name}' has batch size {b} but other inputs of the request have "
                    f"batch size {batch}; all inputs must share the batch dimension"
                )
            rest = shape[1:]
        else:
            rest = shape
        if len(rest) != len(dims) or any(
            d != -1 and d != s for d, s in zip(dims, rest, strict=True)
        ):
            expect = (-1, *dims) if batching else dims
            raise InvalidArgument(
                f"unexpected shape for input '{in_name}' for model '{name}'. Expected "
                f"{_shape_str(expect)}, got {_shape_str(shape)}"
            )
        key.append(rest)
    if batching:
        if batch < 1:
            raise InvalidArgument(
                f"inference request batch-size must be >= 1 for '{name}', got {batch}"
            )
        if batch > sv.max_batch_size:
            raise InvalidArgument(
                f"inference request batch-size must be <= {sv.max_batch_size} for '{name}', "
                f"got {batch}"
            )
    if req.outputs and sv.outputs:
        for out in req.outputs:
            if out.name not in sv.outputs:
                raise InvalidArgument(
                    f"unexpected inference output '{out.name}' for model '{name}'; outputs: "
                    f"{sorted(sv.outputs)}"
                )
    return batch, tuple(key)
