"""Small text models for the OpenAI-compatible API, written into a repository at test time, and
the functions that say what they answer (the tests compute their expectations with these; the
models run the same source).

- ``parrot``: a decoupled python model in Triton's vLLM convention (``text_input``, ``stream``,
  ``sampling_parameters``, ``exclude_input_in_output``, ``return_num_*``,
  ``return_finish_reason``). It "generates" the prompt's whitespace-separated words over and
  over, starting at word ``seed % len(words)``, up to ``max_tokens`` words or a word that is
  one of ``stop`` (not sent; finish "stop", else "length"). Streaming, one response per word
  (" " before every word but the first), then a final response with ``finish_reason`` and no
  text; not streaming, one final response with the whole text. It answers
  ``num_input_tokens`` (the prompt's words) and ``num_output_tokens`` (the response's words).
  Between words it sleeps ``token_delay_ms`` (a config parameter) and stops, sending only the
  final flag, once its request is cancelled. A word "boom" fails it: an error response
  ("boom after N words") in place of that word (not streaming: of the whole answer).
- ``parrot_trt``: the same words from a plain (not decoupled) python model in Triton's
  TensorRT-LLM convention (``text_input``, ``max_tokens``, ``stop_words``, ``temperature``,
  ``top_p``, ``seed``, ``stream``, ``exclude_input_in_output``), batched (max_batch_size 4);
  it answers ``text_output`` only (no counts, no finish reason).
- ``embedder``: vLLM's embedding convention (``embedding_request`` JSON in, ``text_output``
  JSON list out, ``num_input_tokens``): a seeded vector of ``pooling_params.dimensions[0]``
  (default 8) float32 numbers per input.
"""

from __future__ import annotations

import inspect
import json
import zlib
from pathlib import Path

import numpy as np

from tests.zoo import write_model


def parrot_words(
    prompt: str, max_tokens: int, stop: object = None, seed: object = None
) -> tuple[list[str], str]:
    """The words the parrots answer for ``prompt``, and the finish reason."""
    words = prompt.split()
    stops = {stop} if isinstance(stop, str) else set(stop or ())  # type: ignore[call-overload]
    out: list[str] = []
    start = int(seed or 0) % len(words) if words else 0
    for i in range(max_tokens):
        if not words:
            return out, "stop"
        word = words[(start + i) % len(words)]
        if word in stops:
            return out, "stop"
        out.append(word)
    return out, "length"


def embed(text: object, dimensions: int) -> list[float]:
    """The embedder's vector for one input (a string or a list of token ids)."""
    seed = zlib.crc32(json.dumps(text).encode())
    vector = np.random.default_rng(seed).standard_normal(dimensions).astype(np.float32)
    return [float(x) for x in vector]


# the model files' own copy of the functions above
_HELPERS = "\n\n".join(
    [
        "import json\nimport zlib\nimport numpy as np",
        inspect.getsource(parrot_words),
        inspect.getsource(embed),
    ]
)

PARROT_PY = (
    _HELPERS
    + """

import time
import triton_python_backend_utils as pb_utils


def _get(request, name, default=None):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return default if t is None else t.as_numpy().reshape(-1)[0]


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def _out(text, n_in=None, n_out=None, finish=None):
    tensors = [pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))]
    if n_in is not None:
        tensors.append(pb_utils.Tensor("num_input_tokens", np.array([n_in], np.uint32)))
        tensors.append(pb_utils.Tensor("num_output_tokens", np.array([n_out], np.uint32)))
    if finish is not None:
        tensors.append(pb_utils.Tensor("finish_reason", np.array([finish.encode()], np.object_)))
    return pb_utils.InferenceResponse(tensors)


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        delay = params.get("token_delay_ms", {}).get("string_value", "0")
        self.delay = float(delay) / 1000.0

    def execute(self, requests):
        for request in requests:
            self._one(request)
        return None

    def _one(self, request):
        sender = request.get_response_sender()
        prompt = _text(_get(request, "text_input"))
        stream = bool(_get(request, "stream", False))
        params = json.loads(_text(_get(request, "sampling_parameters", b"{}")))
        echo = not bool(_get(request, "exclude_input_in_output", False))
        counts = bool(_get(request, "return_num_input_tokens", False))
        finish_wanted = bool(_get(request, "return_finish_reason", False))
        words, finish = parrot_words(
            prompt, int(params.get("max_tokens", 16)), params.get("stop"), params.get("seed")
        )
        n_in = len(prompt.split()) if counts else None
        finish = finish if finish_wanted else None
        prefix = prompt + " " if echo else ""
        if "boom" in words:
            failed = pb_utils.InferenceResponse(
                error=pb_utils.TritonError(f"boom after {words.index('boom')} words")
            )
            if not stream:
                sender.send(failed, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
        if not stream:
            text = prefix + " ".join(words)
            sender.send(
                _out(text, n_in, len(words) if counts else None, finish),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            return
        for i, word in enumerate(words):
            if self.delay:
                time.sleep(self.delay)
            if sender.is_cancelled():
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            if word == "boom":
                sender.send(failed, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            text = (prefix if i == 0 else " ") + word
            sender.send(_out(text, n_in, 1 if counts else None))
        sender.send(
            _out("", n_in, 0 if counts else None, finish),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )
"""
)

PARROT_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "stream", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "sampling_parameters", data_type: TYPE_STRING, dims: [ 1 ], optional: true }},
  {{ name: "exclude_input_in_output", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "return_num_input_tokens", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "return_num_output_tokens", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "return_finish_reason", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }}
]
output [
  {{ name: "text_output", data_type: TYPE_STRING, dims: [ -1 ] }},
  {{ name: "num_input_tokens", data_type: TYPE_UINT32, dims: [ 1 ] }},
  {{ name: "num_output_tokens", data_type: TYPE_UINT32, dims: [ 1 ] }},
  {{ name: "finish_reason", data_type: TYPE_STRING, dims: [ 1 ] }}
]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
parameters {{ key: "token_delay_ms" value: {{ string_value: "{delay}" }} }}
"""

PARROT_TRT_PY = (
    _HELPERS
    + """

import triton_python_backend_utils as pb_utils


def _get(request, name, default=None):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return default if t is None else t.as_numpy().reshape(-1)


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            prompt = _get(request, "text_input")[0].decode()
            stops = _get(request, "stop_words")
            stops = [s.decode() for s in stops] if stops is not None else None
            seed = _get(request, "seed")
            words, _ = parrot_words(
                prompt,
                int(_get(request, "max_tokens")[0]),
                stops,
                int(seed[0]) if seed is not None else None,
            )
            exclude = _get(request, "exclude_input_in_output")
            echo = exclude is not None and not bool(exclude[0])
            text = (prompt + " " if echo else "") + " ".join(words)
            arr = np.array([[text.encode()]], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", arr)]))
        return out
"""
)

PARROT_TRT_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
dynamic_batching {{ }}
input [
  {{ name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "max_tokens", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "stop_words", data_type: TYPE_STRING, dims: [ -1 ], optional: true }},
  {{ name: "temperature", data_type: TYPE_FP32, dims: [ 1 ], optional: true }},
  {{ name: "top_p", data_type: TYPE_FP32, dims: [ 1 ], optional: true }},
  {{ name: "seed", data_type: TYPE_UINT64, dims: [ 1 ], optional: true }},
  {{ name: "stream", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "exclude_input_in_output", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }}
]
output [ {{ name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""

EMBEDDER_PY = (
    _HELPERS
    + """

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "embedding_request").as_numpy()
            doc = json.loads(raw.reshape(-1)[0].decode())
            dims = (doc.get("pooling_params", {}).get("dimensions") or [8])[0]
            item = doc["input"]
            n = len(item) if isinstance(item, list) else len(item.split())
            vector = json.dumps(embed(item, dims))
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", np.array([vector.encode()], dtype=np.object_)),
                pb_utils.Tensor("num_input_tokens", np.array([n], np.uint32)),
            ]))
        return out
"""
)

EMBEDDER_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [
  {{ name: "embedding_request", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "return_num_input_tokens", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "return_num_output_tokens", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }}
]
output [
  {{ name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "num_input_tokens", data_type: TYPE_UINT32, dims: [ 1 ] }}
]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""


def parrot(repo: Path, name: str = "parrot", token_delay_ms: float = 0) -> Path:
    return write_model(repo, name, PARROT_CONFIG.format(name=name, delay=token_delay_ms), PARROT_PY)


def parrot_trt(repo: Path, name: str = "parrot_trt") -> Path:
    return write_model(repo, name, PARROT_TRT_CONFIG.format(name=name), PARROT_TRT_PY)


def embedder(repo: Path, name: str = "embedder") -> Path:
    return write_model(repo, name, EMBEDDER_CONFIG.format(name=name), EMBEDDER_PY)


def word_tokenizer(directory: Path, words: list[str], chat_template: str) -> Path:
    """A word-level tokenizer saved as Hugging Face saves one (tokenizer.json,
    tokenizer_config.json with ``chat_template``), made here with the tokenizers library:
    words split on whitespace and punctuation (``Whitespace``), unknown ones ``[UNK]``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    directory.mkdir(parents=True, exist_ok=True)
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": {"content": "</s>", "lstrip": False, "rstrip": False},
        "chat_template": chat_template,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory
