"""The LLM mode of ``sluice perf`` without a server: server-sent events cut anywhere, what an
answer's events say (text, tokens, errors), the LLM figures of a window, the endpoints and
the request bodies, and the flags that do not go together."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sluice.perf.cli import add_perf_flags, llm_options
from sluice.perf.llm_events import StreamTally
from sluice.perf.llm_workload import (
    Endpoint,
    LlmOptions,
    build_bodies,
    encode_requests,
    generated_prompt,
)
from sluice.perf.stats import Samples, merge_windows, percentile_of, summarize_window
from sluice.perf.workload import PerfError, Target
from sluice.protocol.generate_codec import decode_generate_request
from sluice.protocol.sse import SseDecoder

# --------------------------------------------------------------------------- SSE


def test_sse_events_survive_any_cut() -> None:
    stream = (
        b": a comment\r\n"
        b"event: message\r\ndata: one\r\n\r\n"
        b"data: two\ndata:  lines\n\n"
        b"id: 7\n\n"  # no data: no event
        b"data:{}\r\rdata: [DONE]\n\n"
    )
    want = [b"one", b"two\n lines", b"{}", b"[DONE]"]
    whole = SseDecoder().feed(stream)
    assert whole == want
    for cut in range(1, len(stream)):
        d = SseDecoder()
        assert d.feed(stream[:cut]) + d.feed(stream[cut:]) == want, cut
    d = SseDecoder()
    assert [e for i in range(len(stream)) for e in d.feed(stream[i : i + 1])] == want


def test_sse_reset_drops_a_half_event() -> None:
    d = SseDecoder()
    assert d.feed(b"data: half") == []
    d.reset()
    assert d.feed(b"data: whole\n\n") == [b"whole"]


# --------------------------------------------------------------------------- events


def chat_chunk(content: str | None, usage: dict | None = None) -> bytes:
    choices = [] if content is None else [{"index": 0, "delta": {"content": content}}]
    return json.dumps(
        {"object": "chat.completion.chunk", "choices": choices, "usage": usage}
    ).encode()


def test_chat_stream_counts_text_events_and_prefers_the_usage() -> None:
    t = StreamTally("chat")
    assert t.event(chat_chunk("")) is False  # the role chunk
    assert t.event(chat_chunk("Hi")) is True
    assert t.event(chat_chunk(" there")) is True
    assert t.tokens == 2 and t.error is None
    assert t.event(chat_chunk(None, {"prompt_tokens": 3, "completion_tokens": 5})) is False
    assert t.event(b"[DONE]") is False
    assert t.tokens == 5  # the server's count
    t.reset()
    assert (t.tokens, t.error) == (0, None)


def test_completions_and_generate_events() -> None:
    c = StreamTally("completions")
    assert c.event(b'{"choices": [{"index": 0, "text": "a"}]}') is True
    assert c.event(b'{"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}') is False
    assert c.tokens == 1
    g = StreamTally("generate")
    assert g.event(b'{"text_output": "one", "num_output_tokens": 1}') is True
    assert g.event(b'{"text_output": ["", " two"], "num_output_tokens": [2]}') is True
    assert g.event(b'{"text_output": "", "num_output_tokens": 0}') is False
    assert (g.text_events, g.tokens) == (2, 3)
    plain = StreamTally("generate")
    assert plain.event(b'{"text_output": "x"}') and plain.tokens == 1


def test_error_events_and_non_json_fail_the_answer() -> None:
    t = StreamTally("chat")
    t.event(chat_chunk("a"))
    t.event(b'{"error": {"message": "boom after 1 words", "type": "server_error"}}')
    assert t.error == "error event: boom after 1 words"
    g = StreamTally("generate")
    g.event(b'{"error": "boom"}')
    assert g.error == "error event: boom"
    bad = StreamTally("completions")
    bad.event(b"not json")
    assert bad.error is not None and "not a JSON object" in bad.error


def test_whole_answers() -> None:
    chat = StreamTally("chat")
    chat.whole(
        b'{"choices": [{"message": {"role": "assistant", "content": "a b"}}], '
        b'"usage": {"prompt_tokens": 2, "completion_tokens": 2}}'
    )
    assert chat.tokens == 2
    gen = StreamTally("generate")
    gen.whole(b'{"text_output": "a b c"}')
    assert gen.tokens == 1  # no count from the model: one answer with text
    with pytest.raises(ValueError, match="unknown"):
        StreamTally("embeddings")


# --------------------------------------------------------------------------- figures


def test_window_llm_figures() -> None:
    # start, end, send, recv, ok, late, first, tokens
    rows = np.array(
        [
            [0, 100, 0, 0, 1, 0, 40, 7],  # TTFT 40, ITL (100 - 40) / 6 = 10
            [10, 60, 0, 0, 1, 0, 30, 1],  # TTFT 20, one token: no ITL
            [20, 90, 0, 0, 1, 0, 0, 4],  # not streamed: tokens only
            [30, 80, 0, 0, 0, 0, 0, 0],  # failed
        ],
        dtype=np.int64,
    )
    w = summarize_window(Samples.from_matrix(rows), 0, 1000)
    assert w.tokens.tolist() == [7, 1, 4] and w.output_tokens == 12
    assert w.ttft_ns.tolist() == [40, 20]
    assert w.itl_ns.tolist() == [10.0]
    assert w.token_throughput == pytest.approx(12 / 1000e-9)
    m = merge_windows([w, w])
    assert m.output_tokens == 24 and m.ttft_ns.size == 4 and m.itl_ns.size == 2
    assert percentile_of(np.array([5, 1, 3]), 50) == 3.0 and percentile_of(np.zeros(0), 99) == 0


# --------------------------------------------------------------------------- workload


def test_endpoints() -> None:
    assert Endpoint.parse("v1/chat/completions", "m") == Endpoint("/v1/chat/completions", "chat")
    assert Endpoint.parse("/v1/completions/", "m").kind == "completions"
    e = Endpoint.parse("v2/models/{MODEL_NAME}/versions/2/generate_stream", "llm")
    assert (e.path, e.kind, e.version) == (
        "/v2/models/llm/versions/2/generate_stream",
        "generate",
        "2",
    )
    with pytest.raises(PerfError, match="names model 'other'"):
        Endpoint.parse("v2/models/other/generate_stream", "llm")
    with pytest.raises(PerfError, match="expected v1/chat/completions"):
        Endpoint.parse("v1/embeddings", "llm")
    with pytest.raises(PerfError, match="needs --endpoint"):
        Endpoint.parse(None, "llm")


def test_generated_openai_bodies() -> None:
    prompt = generated_prompt(9)
    assert len(prompt.split()) == 9 and prompt == generated_prompt(9)
    opts = LlmOptions(Endpoint.parse("v1/chat/completions", "m"), True, 9, 5)
    (body,) = build_bodies(opts, "m", None)
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    opts = LlmOptions(Endpoint.parse("v1/completions", "m"), False, 9, 5)
    (body,) = build_bodies(opts, "m", None)
    assert body == {"model": "m", "prompt": prompt, "max_tokens": 5, "stream": False}


VLLM_META = {
    "name": "llm",
    "inputs": [
        {"name": n, "datatype": d, "shape": [1]}
        for n, d in [
            ("text_input", "BYTES"),
            ("stream", "BOOL"),
            ("sampling_parameters", "BYTES"),
            ("exclude_input_in_output", "BOOL"),
            ("return_num_output_tokens", "BOOL"),
        ]
    ],
}


def test_generated_generate_body_is_what_completions_sends_the_model() -> None:
    opts = LlmOptions(Endpoint.parse("v2/models/llm/generate_stream", "llm"), True, 4, 7)
    (body,) = build_bodies(opts, "llm", VLLM_META)
    assert body["text_input"] == generated_prompt(4)
    assert body["stream"] is True and body["exclude_input_in_output"] is True
    assert body["return_num_output_tokens"] is True
    assert json.loads(body["sampling_parameters"])["max_tokens"] == 7
    # the server reads it back into the model's tensors
    req = decode_generate_request(json.dumps(body).encode(), "llm", "", VLLM_META["inputs"])
    assert req.inputs["text_input"].reshape(-1)[0] == generated_prompt(4).encode()
    with pytest.raises(PerfError, match="no text-generation convention"):
        build_bodies(opts, "llm", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]})


def test_bodies_from_perf_analyzers_input_data(tmp_path: Path) -> None:
    f = tmp_path / "in.json"
    f.write_text(
        json.dumps(
            {
                "data": [
                    {"payload": [{"model": "m", "prompt": "a"}]},
                    {"payload": [{"model": "m", "prompt": "b", "stream": False}]},
                ]
            }
        )
    )
    opts = LlmOptions(Endpoint.parse("v1/completions", "m"), True, data=str(f))
    assert [(b["prompt"], b["stream"]) for b in build_bodies(opts, "m", None)] == [
        ("a", True),
        ("b", True),
    ]
    f.write_text(json.dumps({"data": [{"prompt": "a"}]}))
    with pytest.raises(PerfError, match=r"data\[0\] needs 'payload'"):
        build_bodies(opts, "m", None)


def test_requests_are_whole_http_requests() -> None:
    target = Target.parse("127.0.0.1:8000", "http", "k3y")
    (raw,) = encode_requests(target, Endpoint.parse("v1/completions", "m"), [{"prompt": "é"}])
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/completions HTTP/1.1"
    assert b"Authorization: Bearer k3y" in lines
    assert f"Content-Length: {len(body)}".encode() in lines
    assert json.loads(body) == {"prompt": "é"}


# --------------------------------------------------------------------------- flags


def _ns(*argv: str):  # type: ignore[no-untyped-def]
    import argparse

    p = argparse.ArgumentParser()
    add_perf_flags(p)
    return p.parse_args(["-m", "llm", *argv])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--streaming"], "only with --service-kind openai"),
        (["--output-tokens-mean", "4"], "only with --service-kind openai"),
        (
            ["--service-kind", "openai", "--endpoint", "v1/completions", "-i", "grpc"],
            "-i must be http",
        ),
        (
            ["--service-kind", "openai", "--endpoint", "v1/completions", "-b", "2"],
            "describe tensors",
        ),
        (
            ["--service-kind", "openai", "--endpoint", "v1/completions", "--input-data", "zero"],
            "JSON file",
        ),
        (
            [
                "--service-kind",
                "openai",
                "--endpoint",
                "v1/completions",
                "--input-data",
                "x.json",
                "--output-tokens-mean",
                "3",
            ],
            "write the prompt and max_tokens",
        ),
    ],
)
def test_flags_that_do_not_go_together(argv: list[str], message: str) -> None:
    with pytest.raises(PerfError, match=message):
        llm_options(_ns(*argv))


def test_llm_options_defaults() -> None:
    assert llm_options(_ns()) is None
    o = llm_options(
        _ns("--service-kind", "openai", "--endpoint", "v1/chat/completions", "--streaming")
    )
    assert o == LlmOptions(Endpoint("/v1/chat/completions", "chat"), True, 100, 16, None)
