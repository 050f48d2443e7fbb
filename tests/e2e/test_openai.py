"""The OpenAI-compatible API (``/v1`` on the HTTP port) through OpenAI's own Python client (sync,
async, streaming) and curl, against text models made here (``tests/zoo_llm.py``): a decoupled
model in Triton's vLLM convention, a plain batched one in its TensorRT-LLM convention and an
embedding model, with and without a tokenizer directory made here with ``tokenizers``.

What must hold:
- every client call of docs/openai.md answers what the models say they answer (the
  expectations come from ``zoo_llm.parrot_words`` / ``zoo_llm.embed``, the models' own
  rules), with usage counted as documented (the model's counts, else the tokenizer's, else
  whitespace words) and ``finish_reason`` the model's, else "length" at ``max_tokens``;
- a stream is ``data:`` events in OpenAI's chunk format ending with ``data: [DONE]``;
  ``stream_options.include_usage`` adds the usage chunk; ``n`` choices stream side by side;
- each choice is one inference of the model, counted in its statistics and metrics;
- errors come in OpenAI's shape with the right status, naming the field: an unknown model is
  404 ``model_not_found``, a bad field 400 with ``param``;
- a client that leaves mid-stream cancels the generation: the model sees
  ``is_cancelled()``, the request counts as a failure with reason CANCELED and the model's
  one instance is free for the next request;
- with ``--api-keys-file`` the key is required on ``/v1`` (OpenAI's client sends it as its
  ``api_key``); ``--http-restricted-api=inference:...`` restricts its completions (not its
  model list); a body over ``--http-max-input-size`` is a 413; all in OpenAI's error shape;
- with tracing on, a call is traced on its model with the tensors it sent.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from tests import zoo, zoo_llm
from tests.e2e.helpers import post, request, wait_until

PROMPT = "the quick brown fox jumps over the lazy dog"
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "there"]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {{ eos_token }} "
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)


def _client(srv: Any, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{srv.http}/v1", api_key=key, max_retries=0, timeout=60)


def _async_client(srv: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"http://{srv.http}/v1", api_key="none", max_retries=0, timeout=60
    )


def _metric(srv: Any, name: str, model: str, extra: str = "") -> float:
    code, body = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200
    prefix = f'{name}{{model="{model}",'
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.decode().splitlines()
        if line.startswith(prefix) and extra in line
    )


def _stats(srv: Any, model: str) -> dict[str, Any]:
    code, raw = request(srv, "GET", f"/v2/models/{model}/stats")
    assert code == 200, raw
    return dict(json.loads(raw)["model_stats"][0]["inference_stats"])


def _traces(path: Path) -> dict[int, dict[str, Any]]:
    """A trace file by trace id: model fields, {name: [ns, ...]} stamps (a stream stamps
    INFER_RESPONSE_COMPLETE and HTTP_SEND_* once per event), tensors."""
    traces: dict[int, dict[str, Any]] = {}
    for e in json.loads(path.read_text()):
        t = traces.setdefault(e["id"], {"stamps": {}, "tensors": []})
        if "timestamps" in e:
            for s in e["timestamps"]:
                t["stamps"].setdefault(s["name"], []).append(s["ns"])
        elif "activity" in e:
            t["tensors"].append((e["activity"], e["tensor"]))
        else:
            t.update({k: v for k, v in e.items() if k != "id"})
    return traces


def _text(words: list[str]) -> str:
    return " ".join(words)


@pytest.fixture(scope="module")
def srv(module_server: Any, module_repo: Path) -> Any:
    zoo_llm.parrot(module_repo)
    zoo_llm.parrot(module_repo, "parrot_slow", token_delay_ms=20)
    zoo_llm.parrot_trt(module_repo)
    zoo_llm.embedder(module_repo)
    zoo.identity(module_repo, "identity")
    return module_server(module_repo)


# ------------------------------------------------------------------------------- models
def test_models_list_and_retrieve(srv: Any) -> None:
    client = _client(srv)
    listed = client.models.list()
    assert [m.id for m in listed.data] == [
        "embedder",
        "identity",
        "parrot",
        "parrot_slow",
        "parrot_trt",
    ]
    assert {(m.object, m.owned_by) for m in listed.data} == {("model", "Triton Inference Server")}
    got = client.models.retrieve("parrot")
    assert (got.id, got.object) == ("parrot", "model")
    assert got.created == next(m.created for m in listed.data if m.id == "parrot") > 0
    with pytest.raises(openai.NotFoundError) as exc:
        client.models.retrieve("nope")
    assert exc.value.status_code == 404
    assert exc.value.body == {
        "message": "The model 'nope' does not exist (no model of that name is serving)",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


# ------------------------------------------------------------------------- generation
def test_completion_and_chat_sync(srv: Any) -> None:
    client = _client(srv)
    before = _stats(srv, "parrot")["success"]["count"]
    words, finish = zoo_llm.parrot_words(PROMPT, 12)
    c = client.completions.create(model="parrot", prompt=PROMPT, max_tokens=12)
    assert [(ch.index, ch.text, ch.finish_reason) for ch in c.choices] == [
        (0, _text(words), finish)
    ]
    assert finish == "length"
    assert (c.object, c.model, c.id[:5]) == ("text_completion", "parrot", "cmpl-")
    # the model's own counts: 9 prompt words, 12 generated
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) == (9, 12, 21)
    # echo: the model's text starts with the prompt
    c = client.completions.create(model="parrot", prompt="a b c", max_tokens=2, echo=True)
    assert c.choices[0].text == "a b c a b"
    # chat: the plain template, "<role>: <content>" lines then "assistant:"
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}],
        },
    ]
    prompt = "system: be brief\nuser: hello\nthere\nassistant:"
    words, finish = zoo_llm.parrot_words(prompt, 20)
    r = client.chat.completions.create(model="parrot", messages=messages, max_tokens=20)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert [(ch.message.role, ch.message.content, ch.finish_reason) for ch in r.choices] == [
        ("assistant", _text(words), "length")
    ]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (7, 20)
    # max_completion_tokens wins over max_tokens; --default-max-tokens (16) without either
    r = client.chat.completions.create(
        model="parrot", messages=messages, max_completion_tokens=3, max_tokens=9
    )
    assert r.choices[0].message.content == _text(words[:3])
    r = client.chat.completions.create(model="parrot", messages=messages)
    assert r.usage.completion_tokens == 16
    # every call was one inference of the model
    assert _stats(srv, "parrot")["success"]["count"] == before + 5


def test_chat_stream_with_usage_and_the_raw_chunks(srv: Any) -> None:
    client = _client(srv)
    messages = [{"role": "user", "content": "hello there"}]
    words, _ = zoo_llm.parrot_words("user: hello there\nassistant:", 6)
    stream = client.chat.completions.create(
        model="parrot",
        messages=messages,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"
    # the role first, one chunk per word, the finish, then the usage
    assert (chunks[0].choices[0].delta.role, chunks[0].choices[0].delta.content) == (
        "assistant",
        "",
    )
    deltas = [c.choices[0].delta.content for c in chunks[1:-2]]
    assert deltas == [words[0], *(" " + w for w in words[1:])]
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-2].choices[0].delta.content is None
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (4, 6)
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_stream_through_curl(srv: Any) -> None:
    body = json.dumps({"model": "parrot", "prompt": "a b c", "max_tokens": 4, "stream": True})
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "-N",
            "-i",
            "--max-time",
            "30",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
            f"http://{srv.http}/v1/completions",
        ],
        capture_output=True,
        check=True,
    ).stdout.decode()
    head, _, events = out.partition("\r\n\r\n")
    assert head.splitlines()[0] == "HTTP/1.1 200 OK"
    assert "content-type: text/event-stream; charset=utf-8" in head.lower()
    lines = events.split("\n")
    # every event is one "data: " line and a blank line; the last is [DONE]
    assert lines[-3:] == ["data: [DONE]", "", ""]
    data = [line for line in lines if line]
    assert all(line.startswith("data: ") for line in data)
    docs = [json.loads(line[6:]) for line in data[:-1]]
    assert [(d["choices"][0]["text"], d["choices"][0]["finish_reason"]) for d in docs] == [
        ("a", None),
        (" b", None),
        (" c", None),
        (" a", None),
        ("", "length"),
    ]
    assert {d["object"] for d in docs} == {"text_completion"}
    assert {d["usage"] for d in docs} == {None}


def test_async_client_calls_at_once(srv: Any) -> None:
    async def run() -> list[Any]:
        client = _async_client(srv)
        try:
            plain = client.completions.create(model="parrot", prompt="one two three", max_tokens=5)
            chat = client.chat.completions.create(
                model="parrot", messages=[{"role": "user", "content": "x y"}], max_tokens=3
            )

            async def streamed() -> str:
                stream = await client.completions.create(
                    model="parrot_trt", prompt="p q r", max_tokens=4, stream=True
                )
                return "".join([c.choices[0].text async for c in stream])

            return list(await asyncio.gather(plain, chat, streamed()))
        finally:
            await client.close()

    plain, chat, streamed = asyncio.run(run())
    assert plain.choices[0].text == _text(zoo_llm.parrot_words("one two three", 5)[0])
    assert chat.choices[0].message.content == _text(
        zoo_llm.parrot_words("user: x y\nassistant:", 3)[0]
    )
    # a plain model answers a stream in one chunk
    assert streamed == _text(zoo_llm.parrot_words("p q r", 4)[0])


def test_n_choices_with_seeds_stop_and_statistics(srv: Any) -> None:
    client = _client(srv)
    before = _metric(srv, "nv_inference_request_success", "parrot")
    c = client.completions.create(model="parrot", prompt=PROMPT, max_tokens=5, n=3, seed=1)
    # choice j: seed 1 + j, so each starts one word later
    assert [ch.text for ch in c.choices] == [
        _text(zoo_llm.parrot_words(PROMPT, 5, seed=1 + j)[0]) for j in range(3)
    ]
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (9, 15)
    # three choices, three inferences of the model, in its metrics
    wait_until(
        lambda: _metric(srv, "nv_inference_request_success", "parrot") == before + 3,
        what="three more successes of parrot",
    )
    # stop: the word is not sent and the choice finishes with "stop" (the model's reason)
    c = client.completions.create(model="parrot", prompt=PROMPT, max_tokens=20, stop=["jumps"])
    assert (c.choices[0].text, c.choices[0].finish_reason) == ("the quick brown fox", "stop")
    # n streams side by side, each opened by its role and finished by its reason
    stream = client.chat.completions.create(
        model="parrot",
        messages=[{"role": "user", "content": "a b c"}],
        n=2,
        seed=0,
        max_tokens=3,
        stop="c",
        stream=True,
    )
    texts = ["", ""]
    finishes: list[Any] = [None, None]
    roles = []
    for chunk in stream:
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.index)
            texts[ch.index] += ch.delta.content or ""
            finishes[ch.index] = finishes[ch.index] or ch.finish_reason
    prompt = "user: a b c\nassistant:"
    expected = [zoo_llm.parrot_words(prompt, 3, "c", seed=j) for j in range(2)]
    assert roles == [0, 1]
    assert texts == [_text(w) for w, _ in expected]
    assert finishes == [f for _, f in expected] == ["length", "stop"]


def test_tensorrt_llm_convention_on_a_batched_plain_model(srv: Any) -> None:
    client = _client(srv)
    c = client.completions.create(
        model="parrot_trt", prompt="a b c d", max_tokens=6, n=2, seed=2, temperature=0.5
    )
    assert [ch.text for ch in c.choices] == [
        _text(zoo_llm.parrot_words("a b c d", 6, seed=2 + j)[0]) for j in range(2)
    ]
    # no counts from this model: whitespace words; "length" from the count at max_tokens
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (4, 12)
    assert [ch.finish_reason for ch in c.choices] == ["length", "length"]
    # stop goes to stop_words; a stop finishes with "stop" (fewer words than max_tokens)
    c = client.completions.create(model="parrot_trt", prompt="a b c d", max_tokens=6, stop="c")
    assert (c.choices[0].text, c.choices[0].finish_reason) == ("a b", "stop")
    # a field whose input the model does not declare is refused naming it
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="parrot_trt", prompt="a", presence_penalty=0.5)
    assert exc.value.body["param"] == "presence_penalty"
    assert exc.value.body["message"] == (
        "'presence_penalty' is not supported by model 'parrot_trt': it follows Triton's "
        "TensorRT-LLM convention and declares no input 'presence_penalty'"
    )


def test_embeddings_float_and_base64(srv: Any) -> None:
    client = _client(srv)
    # OpenAI's client asks for base64 unless told and decodes it
    e = client.embeddings.create(model="embedder", input=["hello there", "x"])
    assert [d.embedding for d in e.data] == [zoo_llm.embed(t, 8) for t in ("hello there", "x")]
    assert [d.index for d in e.data] == [0, 1]
    assert (e.usage.prompt_tokens, e.usage.total_tokens) == (3, 3)
    e = client.embeddings.create(
        model="embedder", input="hello there", dimensions=4, encoding_format="float"
    )
    assert e.data[0].embedding == zoo_llm.embed("hello there", 4)
    # the raw base64: little-endian float32
    code, raw = post(
        srv,
        "/v1/embeddings",
        {"model": "embedder", "input": [5, 6, 7], "encoding_format": "base64"},
    )
    assert code == 200, raw
    doc = json.loads(raw)
    vec = np.frombuffer(base64.b64decode(doc["data"][0]["embedding"]), "<f4")
    assert vec.tolist() == zoo_llm.embed([5, 6, 7], 8)
    assert doc["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert (doc["object"], doc["model"], doc["data"][0]["object"]) == (
        "list",
        "embedder",
        "embedding",
    )


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("path", "body", "status", "param", "phrase"),
    [
        (
            "/v1/completions",
            {"model": "nope", "prompt": "x"},
            404,
            "model",
            "The model 'nope' does not exist",
        ),
        (
            "/v1/chat/completions",
            {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
            404,
            "model",
            "The model 'nope'",
        ),
        ("/v1/embeddings", {"model": "nope", "input": "x"}, 404, "model", "The model 'nope'"),
        (
            "/v1/completions",
            {"model": "parrot", "prompt": "x", "temperature": 3},
            400,
            "temperature",
            "'temperature' must be a number from 0 to 2, got 3",
        ),
        (
            "/v1/completions",
            {"model": "parrot", "prompt": "x", "n": 0},
            400,
            "n",
            "'n' must be an integer from 1 to 128, got 0",
        ),
        (
            "/v1/completions",
            {"model": "parrot", "prompt": "x", "max_tokens": "10"},
            400,
            "max_tokens",
            "'max_tokens' must be an integer >= 0",
        ),
        (
            "/v1/completions",
            {"model": "parrot", "prompt": ""},
            400,
            "prompt",
            "'prompt' must be non-empty",
        ),
        (
            "/v1/completions",
            {"model": "parrot", "prompt": "x", "colour": "red"},
            400,
            "colour",
            "unknown field 'colour'",
        ),
        (
            "/v1/completions",
            {"model": "parrot", "prompt": "x", "stream_options": {"include_usage": True}},
            400,
            "stream_options",
            "'stream_options' can only be used when 'stream' is true",
        ),
        ("/v1/completions", {"prompt": "x"}, 400, "model", "'model' is required"),
        (
            "/v1/chat/completions",
            {"model": "parrot", "messages": []},
            400,
            "messages",
            "'messages' must be a non-empty list",
        ),
        (
            "/v1/chat/completions",
            {"model": "parrot", "messages": [{"role": "robot", "content": "x"}]},
            400,
            "messages[0].role",
            "'messages[0].role' must be one of",
        ),
        (
            "/v1/chat/completions",
            {
                "model": "parrot",
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function"}],
            },
            400,
            "tools",
            "'tools': tool calling is not supported",
        ),
        (
            "/v1/chat/completions",
            {"model": "embedder", "messages": [{"role": "user", "content": "x"}]},
            400,
            "model",
            "model 'embedder' cannot generate text",
        ),
        (
            "/v1/chat/completions",
            {"model": "identity", "messages": [{"role": "user", "content": "x"}]},
            400,
            "model",
            "model 'identity' cannot generate text",
        ),
        (
            "/v1/embeddings",
            {"model": "parrot", "input": "x"},
            400,
            "model",
            "model 'parrot' does not answer embeddings",
        ),
        (
            "/v1/embeddings",
            {"model": "embedder", "input": "x", "encoding_format": "hex"},
            400,
            "encoding_format",
            "'encoding_format' must be",
        ),
    ],
)
def test_errors_in_openai_shape_name_the_field(
    srv: Any, path: str, body: dict[str, Any], status: int, param: str, phrase: str
) -> None:
    code, raw = post(srv, path, body)
    assert code == status, raw
    error = json.loads(raw)["error"]
    assert error["param"] == param
    assert error["message"].startswith(phrase), error
    assert error["type"] == "invalid_request_error"
    assert error["code"] == ("model_not_found" if status == 404 else None)


def test_paths_methods_and_bodies_answered_in_openai_shape(srv: Any) -> None:
    code, raw = request(srv, "GET", "/v1/completions")
    assert (code, json.loads(raw)["error"]["message"]) == (
        405,
        "method GET is not allowed on /v1/completions",
    )
    code, raw = post(srv, "/v1/files", {})
    assert (code, json.loads(raw)["error"]["message"]) == (404, "no route for /v1/files")
    code, raw = post(srv, "/v1/chat/completions", b"{not json")
    assert code == 400 and json.loads(raw)["error"]["message"].startswith(
        "failed to parse the chat completion request JSON"
    )
    # the server keeps serving
    assert (
        _client(srv).completions.create(model="parrot", prompt="ok", max_tokens=1).choices[0].text
        == "ok"
    )


# ---------------------------------------------------------------------- cancellation
def test_leaving_mid_stream_cancels_the_generation(srv: Any) -> None:
    client = _client(srv)
    before = _metric(srv, "nv_inference_request_failure", "parrot_slow", 'reason="CANCELED"')
    # 100000 words at 20 ms each: only a cancellation ends this generation in the test's time
    stream = client.chat.completions.create(
        model="parrot_slow",
        messages=[{"role": "user", "content": "a b c"}],
        max_tokens=100000,
        stream=True,
    )
    got = []
    for chunk in stream:
        got.append(chunk.choices[0].delta.content)
        if len(got) == 4:
            break
    stream.close()
    assert got == ["", "user:", " a", " b"]
    wait_until(
        lambda: (
            _metric(srv, "nv_inference_request_failure", "parrot_slow", 'reason="CANCELED"')
            == before + 1
        ),
        what="the stream's request counted as CANCELED",
    )
    wait_until(
        lambda: _metric(srv, "nv_inference_pending_request_count", "parrot_slow") == 0,
        what="no request of parrot_slow pending",
    )
    # the model saw is_cancelled() and returned: its one instance answers the next request
    r = client.chat.completions.create(
        model="parrot_slow", messages=[{"role": "user", "content": "a b c"}], max_tokens=2
    )
    assert r.choices[0].message.content == "user: a"
    assert _stats(srv, "parrot_slow")["fail"]["count"] == 1


# --------------------------------------------------------- tokenizer, keys and trace
@pytest.fixture(scope="module")
def tok_srv(module_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    base = tmp_path_factory.mktemp("openai-tok")
    repo = base / "repo"
    repo.mkdir()
    zoo_llm.parrot(repo)
    zoo_llm.parrot_trt(repo)
    tokdir = zoo_llm.word_tokenizer(base / "tokenizer", WORDS, TEMPLATE)
    keys = base / "keys.txt"
    keys.write_text(
        f"{hashlib.sha256(b'sk-infer').hexdigest()} inference runner\n"
        f"{hashlib.sha256(b'sk-admin').hexdigest()} admin ops\n"
    )
    trace = base / "trace.json"
    srv = module_server(
        repo,
        f"--tokenizer={tokdir}",
        f"--api-keys-file={keys}",
        f"--trace-config=triton,file={trace}",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=level=TENSORS",
        "--trace-config=rate=1",
        "--trace-config=triton,log-frequency=1",
    )
    srv.trace_file = trace
    yield srv


def test_tokenizer_chat_template_and_counts(tok_srv: Any) -> None:
    client = _client(tok_srv, "sk-infer")
    messages = [{"role": "user", "content": "hello there"}]
    # tokenizer_config.json's template, with its special tokens
    prompt = "<s>[user] hello there </s> [assistant]"
    words, _ = zoo_llm.parrot_words(prompt, 7)
    r = client.chat.completions.create(model="parrot", messages=messages, max_tokens=7)
    assert r.choices[0].message.content == _text(words)
    # the model's own counts still win (5 prompt words)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (5, 7)
    # a model without counts: the tokenizer's (it splits punctuation: "hello," is 2 tokens)
    c = client.completions.create(model="parrot_trt", prompt="hello, there", max_tokens=3)
    assert c.choices[0].text == "hello, there hello,"
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (3, 5)
    # 5 tokens from max_tokens 3: "length" at the count
    assert c.choices[0].finish_reason == "length"


def test_api_keys_govern_v1(tok_srv: Any) -> None:
    with pytest.raises(openai.AuthenticationError) as exc:
        _client(tok_srv, "sk-wrong").models.list()
    assert exc.value.status_code == 401
    assert exc.value.body == {
        "message": "invalid API key",
        "type": "authentication_error",
        "param": None,
        "code": None,
    }
    code, raw = post(tok_srv, "/v1/completions", {"model": "parrot", "prompt": "x"})
    assert code == 401
    assert (
        json.loads(raw)["error"]["message"] == "missing API key: send 'Authorization: Bearer <key>'"
    )
    # an inference key may list models and generate; so may an admin key
    for key in ("sk-infer", "sk-admin"):
        client = _client(tok_srv, key)
        assert [m.id for m in client.models.list().data] == ["parrot", "parrot_trt"]
        assert (
            client.completions.create(model="parrot", prompt="k", max_tokens=1).choices[0].text
            == "k"
        )
    # an unknown /v1 path is no endpoint: 404 whoever asks
    code, raw = post(tok_srv, "/v1/nothing", {})
    assert code == 404, raw


def test_a_call_is_traced_on_its_model_with_the_tensors_it_sent(tok_srv: Any) -> None:
    client = _client(tok_srv, "sk-infer")
    seen = set(tok_srv.trace_file.parent.glob("trace.json.*"))
    stream = client.completions.create(
        model="parrot", prompt="a b c", max_tokens=2, seed=5, stop=["z"], stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == _text(
        zoo_llm.parrot_words("a b c", 2, seed=5)[0]
    )

    def new_files() -> list[Path]:
        return sorted(set(tok_srv.trace_file.parent.glob("trace.json.*")) - seen)

    wait_until(lambda: bool(new_files()), what="a trace file for the call")
    (trace,) = [t for f in new_files() for t in _traces(f).values()]
    assert trace["model_name"] == "parrot"
    stamps = trace["stamps"]
    # one INFER_RESPONSE_COMPLETE per response (two words, the final one) and one send per
    # event that carried one (two words, the finish); the role chunk is a completion's none
    assert [len(stamps[n]) for n in ("INFER_RESPONSE_COMPLETE", "HTTP_SEND_START")] == [3, 3]
    chain = [
        *stamps["HTTP_RECV_START"],
        *stamps["HTTP_RECV_END"],
        *stamps["REQUEST_START"],
        *stamps["QUEUE_START"],
        *[
            ns
            for pair in zip(
                stamps["INFER_RESPONSE_COMPLETE"],
                stamps["HTTP_SEND_START"],
                stamps["HTTP_SEND_END"],
                strict=True,
            )
            for ns in pair
        ],
        *stamps["REQUEST_END"],
    ]
    assert chain == sorted(chain)
    inputs = {t["name"]: t for activity, t in trace["tensors"] if activity == "TENSOR_QUEUE_INPUT"}
    assert set(inputs) == {
        "text_input",
        "stream",
        "sampling_parameters",
        "exclude_input_in_output",
        "return_num_input_tokens",
        "return_num_output_tokens",
        "return_finish_reason",
    }
    assert inputs["text_input"]["data"] == '"a b c"'  # Triton's trace writes BYTES quoted
    sent = json.loads(inputs["sampling_parameters"]["data"][1:-1])
    assert sent == {
        "frequency_penalty": 0.0,
        "ignore_eos": False,
        "n": 1,
        "presence_penalty": 0.0,
        "seed": 5,
        "stop": ["z"],
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 2,
    }


def test_restricted_inference_and_the_body_limit_hold_on_v1(
    start_server: Any, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    zoo_llm.parrot(repo)
    srv = start_server(
        repo, "--http-restricted-api=inference:llm-key=s3cret", "--http-max-input-size=2048"
    )
    client = _client(srv)
    # the model list is metadata: open; a completion is inference: restricted, as on /v2
    assert [m.id for m in client.models.list().data] == ["parrot"]
    with pytest.raises(openai.PermissionDeniedError) as exc:
        client.completions.create(model="parrot", prompt="a", max_tokens=1)
    assert exc.value.body == {
        "message": "This API is restricted, expecting header 'llm-key'",
        "type": "permission_error",
        "param": None,
        "code": None,
    }
    allowed = openai.OpenAI(
        base_url=f"http://{srv.http}/v1",
        api_key="none",
        max_retries=0,
        default_headers={"llm-key": "s3cret"},
    )
    assert (
        allowed.completions.create(model="parrot", prompt="a", max_tokens=1).choices[0].text == "a"
    )
    code, raw = post(
        srv,
        "/v1/completions",
        {"model": "parrot", "prompt": "x " * 2000},
        headers={"llm-key": "s3cret"},
    )
    error = json.loads(raw)["error"]
    assert (code, error["type"]) == (413, "invalid_request_error")
    assert error["message"].endswith("raise it with --http-max-input-size")


def test_a_model_error_before_and_during_a_stream(srv: Any) -> None:
    client = _client(srv)
    # not streaming: the model's error is the answer, 500 in OpenAI's shape
    with pytest.raises(openai.InternalServerError) as exc:
        client.completions.create(model="parrot", prompt="a b boom", max_tokens=5)
    assert exc.value.status_code == 500
    assert exc.value.body["type"] == "server_error"
    assert "boom after 2 words" in exc.value.body["message"]
    # streaming: the words before it, then an error event that ends the stream
    got = []
    with pytest.raises(openai.APIError) as exc:
        for chunk in client.completions.create(
            model="parrot", prompt="a b boom", max_tokens=5, stream=True
        ):
            got.append(chunk.choices[0].text)
    assert got == ["a", " b"]
    assert "boom after 2 words" in exc.value.message
    # the raw stream: no [DONE] after the error event
    code, raw = post(
        srv,
        "/v1/completions",
        {"model": "parrot", "prompt": "boom", "max_tokens": 2, "stream": True},
    )
    events = raw.decode().split("\n\n")
    assert code == 200 and events[-1] == ""
    last = json.loads(events[-2][len("data: ") :])
    assert (
        last["error"]["type"] == "server_error" and "boom after 0 words" in last["error"]["message"]
    )
    assert "data: [DONE]" not in events
