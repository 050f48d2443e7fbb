"""Tensors in and out of the in-process API.

Rules of this file:
- An input may be a numpy array, anything numpy can make one of (a list, a scalar), or any
  object with ``__dlpack__`` whose memory is on the CPU (a torch, jax or cupy-on-host tensor):
  ``numpy.from_dlpack`` takes it without a copy. A tensor on a GPU is refused (this server
  has no GPU memory to take it to), naming the input.
- Strings go in as BYTES: numpy ``str``/``bytes`` arrays and object arrays of ``str`` become
  object arrays of ``bytes``, the form every backend gets (``types.py``).
- An output is a ``Tensor``: a numpy array (no copy) with the two reading methods of Triton's
  ``tritonserver.Tensor`` that numpy lacks (``to_bytes_array``, ``to_string_array``). numpy's
  own ``__dlpack__`` makes ``numpy.from_dlpack(output)`` and ``torch.from_dlpack(output)``
  work as with Triton's tensors.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from ..protocol.datatypes import numpy_to_kserve

__all__ = ["Tensor", "as_input"]

_OBJECT = np.dtype(np.object_)


class Tensor(np.ndarray):
    """An output tensor: a numpy array that also answers Triton's ``Tensor`` readers.

    >>> out = response.outputs["OUTPUT0"]   # a Tensor, i.e. a numpy.ndarray
    >>> numpy.from_dlpack(out)               # as with tritonserver
    >>> response.outputs["text"].to_string_array()
    """

    def __array_wrap__(self, arr: Any, context: Any = None, return_scalar: bool = False) -> Any:
        # arithmetic on an output gives a plain array (and a 0-d result a scalar)
        if return_scalar and arr.ndim == 0:
            return arr[()]
        return np.asarray(arr)

    def to_bytes_array(self) -> np.ndarray:
        """A BYTES tensor as an object array of ``bytes`` (as ``tritonserver.Tensor``)."""
        if self.dtype == _OBJECT:
            return self.view(np.ndarray)
        return np.asarray(self).astype(_OBJECT)

    def to_string_array(self) -> np.ndarray:
        """A BYTES tensor as an object array of ``str`` (UTF-8 decoded)."""
        flat = [x.decode() if isinstance(x, bytes) else str(x) for x in self.to_bytes_array().flat]
        out = np.empty(len(flat), dtype=_OBJECT)
        out[:] = flat
        return out.reshape(self.shape)

    def to_host(self) -> Tensor:
        """Itself: every tensor of this server is in host memory."""
        return self

    @staticmethod
    def from_dlpack(obj: Any) -> np.ndarray:
        """An input from a DLPack producer on the CPU, without a copy."""
        return _from_dlpack("tensor", obj)

    @staticmethod
    def from_bytes_array(array: Any) -> np.ndarray:
        """An input from ``bytes`` (or ``str``) elements: an object array of ``bytes``."""
        return _to_bytes(np.asarray(array, dtype=_OBJECT))

    @staticmethod
    def from_string_array(array: Any) -> np.ndarray:
        """An input from ``str`` elements: an object array of UTF-8 ``bytes``."""
        return _to_bytes(np.asarray(array, dtype=_OBJECT))


def _from_dlpack(name: str, obj: Any) -> np.ndarray:
    try:
        return np.from_dlpack(obj)
    except (BufferError, RuntimeError, TypeError, ValueError) as exc:
        device = ""
        with contextlib.suppress(Exception):
            device = f" (device {tuple(obj.__dlpack_device__())})"
        raise InvalidArgument(
            f"input '{name}': numpy cannot take this DLPack tensor{device}: {exc}; only "
            "tensors in CPU memory are accepted"
        ) from None


def _to_bytes(arr: np.ndarray) -> np.ndarray:
    """An object array of ``bytes`` from one of ``str``/``bytes`` elements (``str``: UTF-8)."""
    if arr.dtype.kind == "O" and all(type(x) is bytes for x in arr.flat):
        return arr
    flat = [x if type(x) is bytes else _encode(x) for x in arr.flat]
    out = np.empty(len(flat), dtype=_OBJECT)
    out[:] = flat
    return out.reshape(arr.shape)


def _encode(item: Any) -> bytes:
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, bytes | bytearray | memoryview | np.bytes_):
        return bytes(item)
    return str(item).encode()


def as_input(name: str, value: Any) -> tuple[np.ndarray, str]:
    """``value`` as the array the server takes, and its KServe datatype."""
    if isinstance(value, np.ndarray):
        arr = value
    elif hasattr(value, "__dlpack__"):
        arr = _from_dlpack(name, value)
    else:
        arr = np.asarray(value)
    kind = arr.dtype.kind
    if kind in "OSU":
        return _to_bytes(arr), "BYTES"
    datatype = numpy_to_kserve(arr.dtype)
    if datatype is None:
        raise InvalidArgument(f"input '{name}': numpy dtype {arr.dtype} has no Triton datatype")
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr, datatype
