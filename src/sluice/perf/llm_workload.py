"""What ``sluice perf --service-kind openai`` sends: LLM requests to an OpenAI-compatible
endpoint (``v1/chat/completions``, ``v1/completions``) or to Triton's generate extension
(``v2/models/<m>/generate_stream``, ``.../generate``), encoded once into ready-to-write
HTTP/1.1 requests.

Rules of this file:
- The endpoint is perf_analyzer's ``--endpoint`` (a path, with or without its leading ``/``;
  genai-perf's ``{MODEL_NAME}`` stands for ``-m``); a generate path must name ``-m``'s model.
- Bodies come from ``--input-data FILE.json`` in perf_analyzer's OpenAI form
  (``{"data": [{"payload": [{...}]}, ...]}``, each payload object one request body, sent
  round-robin) or are generated: a prompt of ``prompt_words`` words (genai-perf's
  ``--synthetic-input-tokens-mean``; the words are the same on every run) and ``max_tokens``
  (``--output-tokens-mean``). A generated streaming OpenAI request asks for the usage chunk
  (``stream_options.include_usage``), so output tokens are the server's count.
- A generated generate-extension request is what ``/v1/completions`` would send the model
  for the same prompt (``protocol.openai_tensors``, the server's own mapping, from the model's
  metadata): the side by side of the two endpoints then asks for the same generations.
- ``streaming`` (perf_analyzer's ``--streaming``) sets ``"stream": true`` in every body: the
  OpenAI request's field, the generate extension's ``stream`` input. Without it a file's
  bodies go as written.
- Talking to the server here is plain and blocking (``workload.http_json``), before the
  measurement.

Usage::

    opts = LlmOptions(Endpoint.parse("v1/chat/completions", "llm"), streaming=True)
    model, meta = fetch_llm_model(target, "llm", opts.endpoint)
    payloads = encode_requests(target, opts.endpoint, build_bodies(opts, "llm", meta))
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..errors import InvalidArgument
from ..protocol.generate_codec import generate_body
from ..protocol.openai_schema import parse_completion
from ..protocol.openai_tensors import EMBEDDING, convention_of, generation_request
from .workload import ModelInfo, PerfError, Target, http_json, version_path

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_PROMPT_WORDS",
    "Endpoint",
    "LlmOptions",
    "build_bodies",
    "encode_requests",
    "fetch_llm_model",
    "generated_prompt",
    "load_bodies",
]

DEFAULT_PROMPT_WORDS = 100
DEFAULT_MAX_TOKENS = 16  # Triton's --default-max-tokens
_GENERATE = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/(generate|generate_stream)$")
_TEXT = (
    "the quick brown fox jumps over a lazy dog while seven bright stars glow above quiet hills "
    "and rivers carry cold water past old stone bridges toward distant towns where people "
    "gather at markets to trade bread fruit cloth and stories"
)
_WORDS = _TEXT.split()


@dataclass(frozen=True)
class Endpoint:
    path: str  # with its leading "/"
    kind: str  # chat | completions | generate
    version: str = ""  # a generate path's model version

    @property
    def label(self) -> str:
        return self.path.lstrip("/")

    @classmethod
    def parse(cls, text: str | None, model: str) -> Endpoint:
        if not text:
            raise PerfError(
                "--service-kind openai needs --endpoint: v1/chat/completions, v1/completions "
                f"or v2/models/{model}/generate_stream"
            )
        path = "/" + text.strip().replace("{MODEL_NAME}", model).lstrip("/").rstrip("/")
        if path == "/v1/chat/completions":
            return cls(path, "chat")
        if path == "/v1/completions":
            return cls(path, "completions")
        m = _GENERATE.match(path)
        if m is None:
            raise PerfError(
                f"--endpoint {text}: expected v1/chat/completions, v1/completions, "
                f"v2/models/{model}/generate_stream or v2/models/{model}/generate"
            )
        if m.group(1) != model:
            raise PerfError(
                f"--endpoint {text} names model '{m.group(1)}', but -m is '{model}' (the "
                "server statistics read are -m's)"
            )
        return cls(path, "generate", m.group(2) or "")


@dataclass(frozen=True)
class LlmOptions:
    endpoint: Endpoint
    streaming: bool
    prompt_words: int = DEFAULT_PROMPT_WORDS
    max_tokens: int = DEFAULT_MAX_TOKENS
    data: str | None = None  # a JSON file of request bodies


# --------------------------------------------------------------------------- the model
def fetch_llm_model(
    target: Target, model: str, endpoint: Endpoint
) -> tuple[ModelInfo, dict[str, Any] | None]:
    """The model as the runner needs it (its statistics read where the server lists the
    extension: an OpenAI-only server has none) and, for a generate endpoint, its metadata."""
    extensions: list[str] = []
    try:
        extensions = list(http_json(target, "/v2").get("extensions", []))
    except PerfError:
        pass  # no KServe API beside the OpenAI one: no server-side figures
    meta: dict[str, Any] | None = None
    if endpoint.kind == "generate":
        meta = dict(http_json(target, version_path(model, endpoint.version)))
    else:
        try:
            http_json(target, f"/v1/models/{quote(model, safe='')}")
        except PerfError as e:
            raise PerfError(
                f"model '{model}' is not served through the OpenAI API at {target.address}: {e}"
            ) from None
    return ModelInfo(model, endpoint.version, 0, [], [], extensions), meta


# --------------------------------------------------------------------------- bodies
def generated_prompt(words: int) -> str:
    """``words`` words, the same on every run."""
    rng = random.Random(0)
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def load_bodies(path: Path) -> list[dict[str, Any]]:
    """perf_analyzer's OpenAI input data: ``{"data": [{"payload": [{...}, ...]}, ...]}``."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PerfError(f"--input-data {path}: cannot read JSON: {e}") from None
    entries = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise PerfError(f'--input-data {path}: expected {{"data": [{{"payload": [{{...}}]}}]}}')
    bodies = []
    for i, entry in enumerate(entries):
        payload = entry.get("payload") if isinstance(entry, dict) else None
        if not isinstance(payload, list) or not payload:
            raise PerfError(
                f"--input-data {path}: data[{i}] needs 'payload', a list of request bodies"
            )
        for j, body in enumerate(payload):
            if not isinstance(body, dict):
                raise PerfError(
                    f"--input-data {path}: data[{i}].payload[{j}] must be a JSON object"
                )
            bodies.append(body)
    return bodies


def _openai_body(kind: str, model: str, prompt: str, opts: LlmOptions) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body["max_tokens"] = opts.max_tokens
    body["stream"] = opts.streaming
    if opts.streaming:
        body["stream_options"] = {"include_usage": True}
    return body


def _generate_body(
    model: str, meta: Mapping[str, Any] | None, prompt: str, opts: LlmOptions
) -> dict[str, Any]:
    conv = convention_of(meta) if meta is not None else None
    if conv is None or conv.kind == EMBEDDING:
        raise PerfError(
            f"model '{model}' follows no text-generation convention (it declares no "
            "'text_input'): give the generate request bodies with --input-data FILE.json"
        )
    # what /v1/completions sends the model for the same prompt and max_tokens
    completion = json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": opts.max_tokens, "stream": opts.streaming}
    ).encode()
    try:
        sampling = parse_completion(completion).sampling
        request = generation_request(
            conv, model, prompt, sampling, max_tokens=opts.max_tokens, seed=None, echo=False
        )
    except InvalidArgument as e:
        raise PerfError(f"model '{model}': {e}") from None
    return generate_body(request)


def build_bodies(
    opts: LlmOptions, model: str, meta: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    if opts.data is not None:
        bodies = load_bodies(Path(opts.data))
        if opts.streaming:
            bodies = [{**b, "stream": True} for b in bodies]
        return bodies
    if opts.prompt_words < 1 or opts.max_tokens < 1:
        raise PerfError("--synthetic-input-tokens-mean and --output-tokens-mean must be 1 or more")
    prompt = generated_prompt(opts.prompt_words)
    kind = opts.endpoint.kind
    if kind == "generate":
        return [_generate_body(model, meta, prompt, opts)]
    return [_openai_body(kind, model, prompt, opts)]


# --------------------------------------------------------------------------- requests
def encode_requests(
    target: Target, endpoint: Endpoint, bodies: Sequence[Mapping[str, Any]]
) -> list[bytes]:
    """Whole HTTP/1.1 requests (header block + JSON body), one per body."""
    out = []
    for doc in bodies:
        body = json.dumps(doc, separators=(",", ":")).encode()
        lines = [
            f"POST {endpoint.path} HTTP/1.1",
            f"Host: {target.address}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
        ]
        if target.api_key:
            lines.append(f"Authorization: Bearer {target.api_key}")
        out.append(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    return out
