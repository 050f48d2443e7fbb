"""Datatype names: KServe v2 strings, Triton config enums (``TYPE_FP32``) and numpy dtypes."""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgument

__all__ = [
    "KSERVE_TO_NUMPY",
    "NUMPY_TO_KSERVE",
    "config_to_kserve",
    "numpy_to_kserve",
    "tensor_datatype",
    "kserve_to_numpy",
]

KSERVE_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

NUMPY_TO_KSERVE: dict[np.dtype, str] = {v: k for k, v in KSERVE_TO_NUMPY.items()}
# numpy string dtypes map to BYTES as well
_BYTES_KINDS = ("O", "S", "U")


def config_to_kserve(data_type: str) -> str:
    """``TYPE_FP32`` -> ``FP32``; ``TYPE_STRING`` -> ``BYTES``."""
    name = data_type[5:] if data_type.startswith("TYPE_") else data_type
    return "BYTES" if name == "STRING" else name


def numpy_to_kserve(dtype: np.dtype) -> str | None:
    if dtype.kind in _BYTES_KINDS:
        return "BYTES"
    return NUMPY_TO_KSERVE.get(dtype)


def tensor_datatype(kind: str, name: str, arr: np.ndarray, given: str | None) -> str:
    """The KServe datatype a tensor goes out with: ``given`` (what the model or client said),
    else its numpy dtype's; ``kind`` ('input'/'output') names it in the error."""
    datatype = given or numpy_to_kserve(arr.dtype)
    if datatype is None:
        raise InvalidArgument(f"{kind} '{name}': numpy dtype {arr.dtype} has no KServe datatype")
    return datatype


def kserve_to_numpy(datatype: str) -> np.dtype | None:
    return KSERVE_TO_NUMPY.get(datatype)
