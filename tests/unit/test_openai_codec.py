"""The OpenAI-compatible API's pure parts: request bodies -> types (every mistake a 400 naming
its field), types -> a model's tensors in Triton's vLLM and TensorRT-LLM conventions, the
answers and stream chunks as bytes, and the chat templates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sluice.frontends.openai_chat import ChatFormat
from sluice.protocol import openai_codec as codec
from sluice.protocol.openai_schema import FieldError, parse_chat, parse_completion, parse_embedding
from sluice.protocol.openai_tensors import (
    EMBEDDING,
    TRTLLM,
    VLLM,
    convention_of,
    embedding_request,
    generation_request,
    response_counts,
    response_finish,
    response_text,
)
from sluice.types import InferResponse

VLLM_META = {
    "inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1]},
        {"name": "stream", "datatype": "BOOL", "shape": [1]},
        {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1]},
        {"name": "exclude_input_in_output", "datatype": "BOOL", "shape": [1]},
    ]
}
TRT_META = {
    "inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [-1, 1]},
        {"name": "max_tokens", "datatype": "INT32", "shape": [-1, 1]},
        {"name": "stop_words", "datatype": "BYTES", "shape": [-1, -1]},
        {"name": "random_seed", "datatype": "UINT64", "shape": [-1, 1]},
        {"name": "temperature", "datatype": "FP32", "shape": [-1, 1]},
    ]
}


def _body(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("doc", "param", "message"),
    [
        ({"prompt": "x"}, "model", "'model' is required"),
        ({"model": 3, "prompt": "x"}, "model", "'model' must be a string, got 3"),
        ({"model": "m"}, "prompt", "'prompt' is required"),
        (
            {"model": "m", "prompt": [1, 2]},
            "prompt",
            "'prompt' as token ids is not supported: send text",
        ),
        (
            {"model": "m", "prompt": "x", "top_p": 1.5},
            "top_p",
            "'top_p' must be a number from 0 to 1, got 1.5",
        ),
        ({"model": "m", "prompt": "x", "seed": 2**63}, "seed", "'seed' must be an integer from"),
        (
            {"model": "m", "prompt": "x", "stop": [1]},
            "stop",
            "'stop' must be a string or a list of strings, got [1]",
        ),
        (
            {"model": "m", "prompt": "x", "stream": "yes"},
            "stream",
            "'stream' must be a boolean, got \"yes\"",
        ),
        (
            {"model": "m", "prompt": "x", "stream": True, "stream_options": {"x": 1}},
            "stream_options.x",
            "unknown field 'stream_options.x'",
        ),
        (
            {"model": "m", "prompt": "x", "logprobs": 2},
            "logprobs",
            "'logprobs': logprobs are not supported",
        ),
        (
            {"model": "m", "prompt": "x", "suffix": "y"},
            "suffix",
            "'suffix': suffix is not supported",
        ),
        ({"model": "m", "prompt": "x", "best_of": 2}, "best_of", "'best_of' must be 1"),
        (
            {"model": "m", "prompt": "x", "logit_bias": {"1": 2}},
            "logit_bias",
            "'logit_bias': logit bias is not supported",
        ),
        (
            {"model": "m", "prompt": ["x"] * 3, "n": 50},
            "n",
            "'n' (50) times the number of prompts (3) must be at most 128",
        ),
    ],
)
def test_completion_mistakes_name_their_field(
    doc: dict[str, Any], param: str, message: str
) -> None:
    with pytest.raises(FieldError) as exc:
        parse_completion(_body(doc))
    assert exc.value.param == param
    assert exc.value.message.startswith(message), exc.value.message


def test_completion_defaults_are_triton_s() -> None:
    req = parse_completion(_body({"model": "m", "prompt": ["a", "b"], "user": "u", "seed": -1}))
    s = req.sampling
    assert req.prompts == ("a", "b") and req.echo is False
    assert (s.max_tokens, s.temperature, s.top_p, s.n, s.seed, s.stream) == (
        None,
        1.0,
        1.0,
        1,
        -1,
        False,
    )
    assert s.given == {"model", "prompt", "user", "seed"}
    chat = parse_chat(_body({"model": "m", "messages": [{"role": "user", "content": "x"}]}))
    assert chat.sampling.temperature == 0.7


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ("hi", "messages"),
        ([{"content": "x"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text"),
        ([{"role": "user", "content": "x", "colour": 1}], "messages[0].colour"),
        ([{"role": "assistant", "content": None, "tool_calls": [{}]}], "messages[0].tool_calls"),
    ],
)
def test_chat_message_mistakes_name_their_field(messages: Any, param: str) -> None:
    with pytest.raises(FieldError) as exc:
        parse_chat(_body({"model": "m", "messages": messages}))
    assert exc.value.param == param


def test_chat_keeps_what_a_template_reads() -> None:
    req = parse_chat(
        _body(
            {
                "model": "m",
                "messages": [
                    {"role": "system", "content": "s", "name": "boss"},
                    {"role": "assistant", "content": None},
                    {"role": "user", "content": [{"type": "text", "text": "a"}]},
                ],
                "max_completion_tokens": 4,
                "max_tokens": 9,
                "tool_choice": "none",
                "response_format": {"type": "text"},
            }
        )
    )
    assert req.messages == (
        {"role": "system", "content": "s", "name": "boss"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
    )
    assert req.sampling.max_tokens == 4


def test_embedding_inputs() -> None:
    assert parse_embedding(_body({"model": "m", "input": "a"})).inputs == ("a",)
    assert parse_embedding(_body({"model": "m", "input": [1, 2]})).inputs == ([1, 2],)
    assert parse_embedding(_body({"model": "m", "input": [[1], [2, 3]]})).inputs == ([1], [2, 3])
    for bad, param in (
        ([], "input"),
        ([""], "input"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
    ):
        doc = {"model": "m", **bad} if isinstance(bad, dict) else {"model": "m", "input": bad}
        with pytest.raises(FieldError) as exc:
            parse_embedding(_body(doc))
        assert exc.value.param == param


def test_vllm_tensors() -> None:
    conv = convention_of(VLLM_META)
    assert conv is not None and conv.kind == VLLM
    s = parse_completion(_body({"model": "m", "prompt": "p", "stop": "z", "stream": True})).sampling
    req = generation_request(conv, "m", "hello", s, max_tokens=5, seed=3, echo=False)
    assert req.inputs["text_input"].tolist() == [b"hello"]
    assert req.inputs["stream"].tolist() == [True]
    assert req.inputs["exclude_input_in_output"].tolist() == [True]
    assert json.loads(req.inputs["sampling_parameters"][0]) == {
        "frequency_penalty": 0.0,
        "ignore_eos": False,
        "n": 1,
        "presence_penalty": 0.0,
        "seed": 3,
        "stop": "z",
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 5,
    }
    # inputs the model does not declare are not sent
    assert set(req.inputs) == {
        "text_input",
        "stream",
        "exclude_input_in_output",
        "sampling_parameters",
    }


def test_tensorrt_llm_tensors_and_refusals() -> None:
    conv = convention_of(TRT_META)
    assert conv is not None and conv.kind == TRTLLM
    s = parse_completion(
        _body({"model": "m", "prompt": "p", "stop": ["a", "b"], "seed": 7})
    ).sampling
    req = generation_request(conv, "m", "hi", s, max_tokens=4, seed=7, echo=False)
    assert req.inputs["text_input"].shape == (1, 1)
    assert req.inputs["stop_words"].tolist() == [[b"a", b"b"]]
    assert req.inputs["random_seed"].dtype == np.uint64 and req.inputs["random_seed"].tolist() == [
        [7]
    ]
    assert req.inputs["max_tokens"].tolist() == [[4]]
    negative = generation_request(conv, "m", "hi", s, max_tokens=4, seed=-1, echo=False)
    assert negative.inputs["random_seed"].tolist() == [[2**64 - 1]]
    assert req.inputs["temperature"].tolist() == [[1.0]]  # a default, sent where declared
    assert "top_p" not in req.inputs  # a default, not declared: not sent
    given = parse_completion(_body({"model": "m", "prompt": "p", "top_p": 0.5})).sampling
    with pytest.raises(FieldError) as exc:
        generation_request(conv, "m", "hi", given, max_tokens=4, seed=None, echo=False)
    assert exc.value.param == "top_p"
    with pytest.raises(FieldError) as exc:
        generation_request(conv, "m", "hi", s, max_tokens=4, seed=None, echo=True)
    assert exc.value.param == "echo"


def test_conventions_and_embedding_tensors() -> None:
    assert convention_of({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1]}]}) is None
    conv = convention_of(
        {"inputs": [{"name": "embedding_request", "datatype": "BYTES", "shape": [1]}]}
    )
    assert conv is not None and conv.kind == EMBEDDING
    req = embedding_request(conv, "e", "text", 4)
    assert json.loads(req.inputs["embedding_request"][0]) == {
        "input": "text",
        "pooling_params": {"dimensions": [4]},
    }


def test_reading_responses() -> None:
    resp = InferResponse(
        "m",
        "1",
        outputs={
            "text_output": np.array([b"a", b"b"], dtype=np.object_),
            "num_input_tokens": np.array([3], np.uint32),
            "num_output_tokens": np.array([2], np.int32),
            "finish_reason": np.array([b"length"], dtype=np.object_),
        },
    )
    assert (response_text(resp), response_counts(resp), response_finish(resp)) == (
        "ab",
        (3, 2),
        "length",
    )
    assert (response_text(InferResponse("m", "1")), response_counts(InferResponse("m", "1"))) == (
        "",
        (None, None),
    )


def test_chunks_and_errors_are_openai_s() -> None:
    w = codec.ChunkWriter("chat", "chatcmpl-1", 7, 'm"x')
    events = [w.role(0), w.delta(0, 'say "hi"', None), w.delta(0, "", "stop"), w.usage(2, 1)]
    docs = [json.loads(e[len(b"data: ") : -2]) for e in events]
    assert all(e.startswith(b"data: ") and e.endswith(b"\n\n") for e in events)
    head = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": 'm"x',
        "system_fingerprint": None,
    }
    assert docs[0] == {
        **head,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        "usage": None,
    }
    assert docs[1]["choices"][0]["delta"] == {"content": 'say "hi"'}
    assert docs[2]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert docs[3] == {
        **head,
        "choices": [],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
    }
    c = codec.ChunkWriter("completion", "cmpl-1", 7, "m")
    assert json.loads(c.delta(1, "t", "length")[6:-2])["choices"] == [
        {"index": 1, "text": "t", "logprobs": None, "finish_reason": "length"}
    ]
    for status, kind in (
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "invalid_request_error"),
        (429, "rate_limit_error"),
        (503, "server_error"),
    ):
        assert codec.error_doc(status, "m")["error"]["type"] == kind
    vec = codec.embedding_body(
        "e", [[1.5, -2.0]], "base64", {"prompt_tokens": 1, "total_tokens": 1}
    )
    raw = np.frombuffer(__import__("base64").b64decode(vec["data"][0]["embedding"]), "<f4")
    assert raw.tolist() == [1.5, -2.0]


def test_plain_and_jinja_templates(tmp_path: Path) -> None:
    plain = ChatFormat()
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    assert plain.render(messages) == "system: s\nuser: a\nb\nassistant:"
    assert (plain.count(" a  b\nc "), plain.count("")) == (3, 0)
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}"
        "{% endif %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    chat = ChatFormat.load("", str(template))
    assert chat.render([{"role": "user", "content": "hi"}]) == "<user>hi\n<assistant>"
    with pytest.raises(FieldError) as exc:
        chat.render(messages)
    assert (exc.value.param, exc.value.message) == (
        "messages",
        "the chat template refused the messages: no system",
    )
