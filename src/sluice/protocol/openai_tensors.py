"""Triton's LLM tensor conventions: an OpenAI request as a model's input tensors, and a model's
response as text and counts, as Triton's OpenAI-compatible front-end maps them
(``python/openai/openai_frontend/engine/utils/triton.py``).

Rules of this file:
- A model's convention is read from its inputs: ``embedding_request`` -> vLLM's embedding
  convention; ``text_input`` with ``sampling_parameters`` -> vLLM's; ``text_input`` alone ->
  TensorRT-LLM's (Triton's choice for every model whose backend is not vllm); neither ->
  None (the model is listed but generates nothing through ``/v1``). Triton decides by the
  backend's name (or its ``--backend`` flag), so a python model written to vLLM's convention
  is served here as Triton serves a vLLM model.
- vLLM: ``text_input``, ``stream``, ``sampling_parameters`` (JSON: the sampling fields with
  Triton's defaults, ``n`` 1 and ``max_tokens`` always), ``exclude_input_in_output`` (not
  echo), ``return_num_input_tokens``/``return_num_output_tokens``/``return_finish_reason``
  (true).
- TensorRT-LLM: ``text_input``, ``stream``, ``max_tokens``, ``stop_words``, ``top_p``,
  ``frequency_penalty``, ``presence_penalty``, ``seed`` (or ``random_seed``),
  ``temperature``, the echo input, ``return_num_input_tokens``/``return_num_output_tokens``.
- An input is sent only when the model declares it; a field the client gave whose input the
  model does not declare is refused naming the field (Triton would fail the request on the
  unexpected input instead). Tensors take the declared datatype and rank (the generate
  extension's rule: leading dimensions of 1).
- Out: ``text_output`` (its elements joined, UTF-8), ``num_input_tokens`` and
  ``num_output_tokens`` (per response; a stream's output counts add up), ``finish_reason``.
  An embedding is ``text_output`` holding a JSON list of numbers (vLLM's).

Usage::

    conv = convention_of(await service.model_metadata("llm"))
    req = generation_request(conv, "llm", "Hello", sampling, max_tokens=16, seed=None,
                             echo=False)
    text, counts = response_text(resp), response_counts(resp)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import Internal
from ..types import InferRequest, InferResponse
from .generate_codec import tensor_from_json
from .openai_schema import FieldError, Sampling

__all__ = [
    "EMBEDDING",
    "TRTLLM",
    "VLLM",
    "Convention",
    "convention_of",
    "embedding_request",
    "embedding_vector",
    "generation_request",
    "response_counts",
    "response_finish",
    "response_text",
]

VLLM = "vLLM"
TRTLLM = "TensorRT-LLM"
EMBEDDING = "vLLM embedding"

_ECHO_INPUTS = ("exclude_input_in_output", "sampling_param_exclude_input_from_output")
# TensorRT-LLM: request field -> the inputs that take it (the first declared one is used)
_TRT_FIELDS = {
    "top_p": ("top_p",),
    "frequency_penalty": ("frequency_penalty",),
    "presence_penalty": ("presence_penalty",),
    "seed": ("seed", "random_seed"),
    "temperature": ("temperature",),
}
_json_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@dataclass(frozen=True, slots=True)
class Convention:
    kind: str
    inputs: Mapping[str, tuple[str, int]]  # declared input -> (KServe datatype, rank)
    echo_input: str | None  # the input that takes "not echo"

    def has(self, name: str) -> bool:
        return name in self.inputs


def convention_of(meta: Mapping[str, Any]) -> Convention | None:
    """The convention of a model from its metadata (``service.model_metadata``)."""
    inputs = {str(t["name"]): (str(t["datatype"]), len(t["shape"])) for t in meta["inputs"]}
    echo = next((n for n in _ECHO_INPUTS if n in inputs), None)
    if "embedding_request" in inputs:
        return Convention(EMBEDDING, inputs, None)
    if "text_input" not in inputs:
        return None
    kind = VLLM if "sampling_parameters" in inputs else TRTLLM
    return Convention(kind, inputs, echo)


class _Builder:
    """The inputs of one request, each given the declared datatype and rank."""

    def __init__(self, conv: Convention) -> None:
        self.conv = conv
        self.arrays: dict[str, np.ndarray] = {}
        self.datatypes: dict[str, str] = {}

    def put(self, name: str, value: Any) -> bool:
        """Set ``name`` if the model declares it; False otherwise."""
        declared = self.conv.inputs.get(name)
        if declared is None:
            return False
        datatype, rank = declared
        self.arrays[name] = tensor_from_json(name, value, datatype, rank)
        self.datatypes[name] = datatype
        return True

    def request(self, model: str) -> InferRequest:
        return InferRequest(model_name=model, inputs=self.arrays, input_datatypes=self.datatypes)


def _refuse(conv: Convention, model: str, field: str, inputs: tuple[str, ...]) -> FieldError:
    names = " or ".join(f"'{n}'" for n in inputs)
    return FieldError(
        field,
        f"'{field}' is not supported by model '{model}': it follows Triton's {conv.kind} "
        f"convention and declares no input {names}",
    )


def generation_request(
    conv: Convention,
    model: str,
    prompt: str,
    s: Sampling,
    *,
    max_tokens: int,
    seed: int | None,
    echo: bool,
) -> InferRequest:
    """One model request for one choice. ``echo``: the completion's (False for chat: the
    prompt is never part of a chat answer); ``seed``: this choice's seed."""
    b = _Builder(conv)
    b.put("text_input", prompt)
    b.put("stream", s.stream)
    if not b.put(conv.echo_input or _ECHO_INPUTS[0], not echo) and echo:
        raise _refuse(conv, model, "echo", _ECHO_INPUTS)
    if conv.kind == VLLM:
        params: dict[str, Any] = {
            "frequency_penalty": s.frequency_penalty,
            "ignore_eos": s.ignore_eos,
            "n": 1,  # one model request per choice
            "presence_penalty": s.presence_penalty,
        }
        if s.min_tokens is not None:
            params["min_tokens"] = s.min_tokens
        if seed is not None:
            params["seed"] = seed
        if s.stop is not None:
            params["stop"] = s.stop if isinstance(s.stop, str) else list(s.stop)
        params["temperature"] = s.temperature
        params["top_p"] = s.top_p
        params["max_tokens"] = max_tokens
        b.put("sampling_parameters", _json_dumps(params))
        b.put("return_finish_reason", True)
    else:
        b.put("max_tokens", max_tokens)
        if s.stop:
            stop = [s.stop] if isinstance(s.stop, str) else list(s.stop)
            if not b.put("stop_words", stop):
                raise _refuse(conv, model, "stop", ("stop_words",))
        for field, names in _TRT_FIELDS.items():
            value = seed if field == "seed" else getattr(s, field)
            if value is None:
                continue
            name = next((n for n in names if conv.has(n)), None)
            if name is not None:
                if field == "seed" and conv.inputs[name][0] == "UINT64":
                    value %= 2**64  # a negative seed as its 64-bit pattern
                b.put(name, value)
            elif field in s.given:
                raise _refuse(conv, model, field, names)
    b.put("return_num_input_tokens", True)
    b.put("return_num_output_tokens", True)
    return b.request(model)


def embedding_request(
    conv: Convention, model: str, item: str | list[int], dimensions: int | None
) -> InferRequest:
    """One model request for one input (vLLM's embedding convention)."""
    b = _Builder(conv)
    pooling = {"dimensions": [dimensions]} if dimensions is not None else {}
    b.put("embedding_request", _json_dumps({"input": item, "pooling_params": pooling}))
    b.put("return_num_input_tokens", True)
    b.put("return_num_output_tokens", True)
    return b.request(model)


def _strings(arr: np.ndarray) -> list[str]:
    return [
        x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)
        for x in arr.reshape(-1).tolist()
    ]


def response_text(resp: InferResponse) -> str:
    """``text_output``'s elements joined ("" when the response has none)."""
    arr = resp.outputs.get("text_output")
    if arr is None:
        return ""
    items = _strings(arr)
    return items[0] if len(items) == 1 else "".join(items)


def _count(resp: InferResponse, name: str) -> int | None:
    arr = resp.outputs.get(name)
    if arr is None or arr.size == 0 or arr.dtype.kind not in "iu":
        return None
    return int(arr.reshape(-1)[0])


def response_counts(resp: InferResponse) -> tuple[int | None, int | None]:
    """(``num_input_tokens``, ``num_output_tokens``) where the model answered them."""
    return _count(resp, "num_input_tokens"), _count(resp, "num_output_tokens")


def response_finish(resp: InferResponse) -> str | None:
    """The model's ``finish_reason`` ("stop", "length"), where it answered one."""
    arr = resp.outputs.get("finish_reason")
    if arr is None or arr.size == 0:
        return None
    reason = _strings(arr)[0]
    return reason if reason in ("stop", "length") else None


def embedding_vector(text: str, model: str) -> list[float]:
    """The embedding a model answered in ``text_output`` (a JSON list of numbers); Internal
    when it is not one."""
    try:
        vector = json.loads(text)
    except ValueError:
        vector = None
    if type(vector) is not list or not all(type(x) in (int, float) for x in vector):
        raise Internal(
            f"model '{model}' answered an embedding request without a JSON list of numbers "
            f"in 'text_output' (vLLM's embedding convention): {text[:80]!r}"
        )
    return [float(x) for x in vector]
