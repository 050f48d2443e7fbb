"""Implicit state (``sequence_batching { state [...] }``): the server, not the model, keeps
each sequence's state tensors between its requests.

Rules of this file (Triton 2.51: its documentation, its core's sequence batcher, and its
load errors checked on this machine with the python backend):
- Each ``state`` names a model input (``input_name``) the server feeds and a model output
  (``output_name``) the server keeps. Neither is a client tensor: a client that sends the
  state input is refused like any unknown input, and may ask for the state output only when
  the config's ``output`` section lists it too (then it is also returned).
- The first request of a sequence, and every request with the START flag, gets the initial
  state: ``initial_state`` (``zero_data``, or ``data_file`` read row-major from
  ``<model>/initial_state/<data_file>``: raw little-endian values; TYPE_STRING as
  length-prefixed elements), shape [1] + its dims when the model batches. Without
  ``initial_state`` the shape is the state's dims with every -1 read as 1, and the data
  zeros (Triton leaves it uninitialised: a model must not read it on START; its documented
  pattern masks it with the START control).
- Request i+1 of a sequence gets request i's output state, whatever its shape (variable
  dims may change from one request to the next). A request that fails leaves the state
  as it was. The state is dropped when the sequence ends (END) or is released for
  idleness; a new sequence with the same id starts from the initial state.
- Batching: each request of a batch carries its own sequence's state, so the batch's state
  input is the states concatenated along the batch dimension and the output state is split
  back per request (by the backend, like any tensor).
- Only backends that hand the output state back keep it: onnxruntime here. The python
  backend gets the state input but never updates it (as in Triton, whose python backend
  has no state API); the other native backends refuse such a config at load.
- ``use_same_buffer_for_input_output`` and ``use_growable_memory`` choose Triton's
  (GPU) buffers; they change nothing here and are accepted.

Usage (the sequence scheduler)::

    states = implicit_state(config, model_dir, model, version)   # None: no ``state``
    held = None                                 # per sequence; reset to None on START
    states.feed(held, request)                  # before execution
    held = states.take(held, response)          # after a successful execution
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..errors import InvalidArgument, Unsupported
from ..protocol.bytes_tensor import deserialize
from ..protocol.datatypes import config_to_kserve, kserve_to_numpy
from ..types import InferRequest, InferResponse

__all__ = ["ImplicitState", "implicit_state", "INITIAL_STATE_DIR"]

log = logging.getLogger("sluice.sequence")

INITIAL_STATE_DIR = "initial_state"  # under the model directory, next to the versions
_UPDATING_BACKENDS = frozenset({"onnxruntime"})
_FEED_ONLY_BACKENDS = frozenset({"python"})


@dataclass(frozen=True, slots=True)
class _State:
    input_name: str
    output_name: str
    initial: np.ndarray  # read-only; with the batch dimension when the model batches


class ImplicitState:
    """The states of one model version: what to feed each request, what to keep."""

    __slots__ = ("_states", "_update", "_hidden")

    def __init__(self, states: list[_State], update: bool, client_outputs: set[str]) -> None:
        self._states = tuple(states)
        self._update = update
        # state outputs that the config's ``output`` does not list: never sent to a client
        self._hidden = frozenset(s.output_name for s in states) - client_outputs

    @property
    def updates(self) -> bool:
        return self._update

    def feed(self, held: dict[str, np.ndarray] | None, request: InferRequest) -> None:
        """Set each state input of ``request``: the sequence's held state, else the initial."""
        inputs = request.inputs
        for s in self._states:
            inputs[s.input_name] = held.get(s.input_name, s.initial) if held else s.initial

    def shapes(self, held: dict[str, np.ndarray] | None) -> tuple[tuple[int, ...], ...]:
        """The state shapes the next request of a sequence gets (requests batch together
        only when these match)."""
        return tuple(
            (held.get(s.input_name, s.initial) if held else s.initial).shape for s in self._states
        )

    def take(
        self, held: dict[str, np.ndarray] | None, response: InferResponse
    ) -> dict[str, np.ndarray] | None:
        """The sequence's state after ``response``; removes the state outputs that are not
        client outputs from the response."""
        outs = response.outputs
        hidden = self._hidden
        if not self._update:
            for name in hidden:
                outs.pop(name, None)
            return held
        new = dict(held) if held else {}
        for s in self._states:
            arr = outs.pop(s.output_name, None) if s.output_name in hidden else None
            if arr is None:
                arr = outs.get(s.output_name)
            if arr is not None:
                new[s.input_name] = arr
        return new


def implicit_state(
    config: mc.ModelConfig, model_dir: Path | None, model: str, version: str
) -> ImplicitState | None:
    """Check the config's ``state`` entries and build their initial states (None when the
    config has none). Raises InvalidArgument with Triton's text for a bad entry."""
    entries = list(config.sequence_batching.state)
    if not entries:
        return None

    def refuse(text: str) -> InvalidArgument:
        return InvalidArgument(
            f"load failed for model '{model}': version {version} is at UNAVAILABLE state: "
            f"Invalid argument: {text}"
        )

    backend = config.backend or config.platform
    if backend not in _UPDATING_BACKENDS | _FEED_ONLY_BACKENDS:
        raise Unsupported(
            f"load failed for model '{model}': implicit state (sequence_batching.state) is "
            f"supported for onnxruntime models only (and fed, never updated, to python "
            f"models as Triton does), not for backend '{backend}'"
        )
    batch_dim = [1] if config.max_batch_size > 0 else []
    states: list[_State] = []
    seen_in: set[str] = set()
    seen_out: set[str] = set()
    for st in entries:
        name = st.input_name
        if not name or not st.output_name:
            raise refuse(
                "sequence_batching state needs both 'input_name' and 'output_name' "
                f"(got input_name '{name}', output_name '{st.output_name}')"
            )
        if st.data_type == mc.TYPE_INVALID:
            raise refuse(f"sequence_batching state '{name}' has no 'data_type'")
        if any(d == 0 or d < -1 for d in st.dims):
            raise refuse(
                f"sequence_batching state '{name}' has invalid dims {list(st.dims)}: each must "
                "be -1 or positive"
            )
        if len(st.initial_state) > 1:
            raise refuse(
                f"initial_state field for state input '{name}' must contain exactly one or "
                f"zero element. Found '{len(st.initial_state)}' elements."
            )
        if st.initial_state and name in seen_in:
            raise refuse(f"State input name '{name}' specified more than once.")
        if st.use_growable_memory:
            log.warning(
                "model '%s': state '%s' sets use_growable_memory, a GPU buffer option (Triton "
                "sets the state up only on KIND_GPU instances, with "
                "use_same_buffer_for_input_output); ignored here",
                model,
                name,
            )
        dtype = _numpy_dtype(st.data_type)
        if dtype is None:
            raise refuse(
                f"sequence_batching state '{name}' has data_type "
                f"{mc.DataType.Name(st.data_type)}, which sluice cannot hold"
            )
        if st.initial_state:
            initial = _initial_data(st, st.initial_state[0], model_dir, batch_dim, dtype, refuse)
        else:
            shape = batch_dim + [d if d > 0 else 1 for d in st.dims]
            initial = (
                np.full(shape, b"", dtype=object) if dtype.kind == "O" else np.zeros(shape, dtype)
            )
        if name in seen_in or st.output_name in seen_out:
            which = "input_name" if name in seen_in else "output_name"
            log.warning(
                "model '%s': duplicate '%s' in the state configuration: '%s'; this state "
                "configuration is ignored (as Triton does)",
                model,
                which,
                name if which == "input_name" else st.output_name,
            )
            continue
        seen_in.add(name)
        seen_out.add(st.output_name)
        initial.flags.writeable = False
        states.append(_State(name, st.output_name, initial))
    update = backend in _UPDATING_BACKENDS
    return ImplicitState(states, update, {t.name for t in config.output})


def _numpy_dtype(data_type: int) -> np.dtype | None:
    return kserve_to_numpy(config_to_kserve(mc.DataType.Name(data_type)))


def _initial_data(
    st: mc.ModelSequenceBatching.State,
    init: mc.ModelSequenceBatching.InitialState,
    model_dir: Path | None,
    batch_dim: list[int],
    dtype: np.dtype,
    refuse: Any,
) -> np.ndarray:
    name = st.input_name
    if init.data_type != st.data_type:
        raise refuse(
            f"The data type used for 'initial_state' field of state '{name}' does not match "
            "the state data type."
        )
    if not init.name:
        raise refuse(f"Field 'name' must be set when using initial_state for state input '{name}'.")
    if len(init.dims) != len(st.dims):
        raise refuse(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' "
            f"dimensions for state input '{name}'. {len(init.dims)} != {len(st.dims)}"
        )
    for d, sd in zip(init.dims, st.dims, strict=True):
        if d == -1:
            raise refuse(
                f"'initial_state' field for state input name '{name}' contains variable dimensions."
            )
        if sd != -1 and d != sd:
            raise refuse(
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim "
                f"description. {d} != {sd}"
            )
    if any(d <= 0 for d in init.dims):
        raise refuse(f"'initial_state' of state input '{name}' has invalid dims {list(init.dims)}")
    shape = batch_dim + list(init.dims)
    count = int(np.prod(init.dims, dtype=np.int64)) if init.dims else 1
    case = init.WhichOneof("state_data")
    if case == "zero_data":
        if dtype.kind == "O":
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, dtype)
    if case != "data_file":
        raise refuse(f"initial_state setting expects state'{name}' to have state_data set")
    path = (model_dir or Path(".")) / INITIAL_STATE_DIR / init.data_file
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise refuse(f"failed to open text file for read {path}: {exc.strerror or exc}") from None
    if dtype.kind == "O":
        try:
            return deserialize(raw, count).reshape(shape)
        except ValueError as exc:
            raise refuse(
                f"initial_state data file {init.data_file} for state input '{name}' does not "
                f"hold {count} length-prefixed element(s): {exc}"
            ) from None
    need = count * dtype.itemsize
    if len(raw) < need:
        raise refuse(
            f"initial_state setting expects {need} bytes, but the data provided from "
            f"{init.data_file} only has {len(raw)} bytes."
        )
    return np.frombuffer(raw[:need], dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)
