"""``sluice perf --service-kind openai`` as a user runs it: a subprocess against a live
``sluice serve`` serving ``tests/zoo_llm.py``'s ``parrot`` (a decoupled python model in Triton's
vLLM convention that streams one response per word), through ``/v1/chat/completions``,
``/v1/completions`` and the generate extension's ``generate_stream``.

What must hold (no timing is judged; windows are counted, not timed, and any spread between
them counts as stable):
- exit 0 and a report with the LLM figures per level: requests/s, output tokens and tokens/s,
  time to first token p50/p90/p99, inter-token latency p50/p99, request latency; the same
  figures in the CSV after perf_analyzer's columns;
- the output tokens it reports are the model's: every request's count is the number of words
  ``zoo_llm.parrot_words`` says the parrot generates for that prompt (from the server's usage
  chunk, from the model's ``num_output_tokens``, or from the events that carried text);
- each request's time to first token is within its latency, so each percentile is too;
- the server's statistics counted exactly the requests sluice perf says it sent, no failure;
- an answer that fails mid-stream (an error event) is a failed request with the model's
  message; a model the API does not serve is one clear line and exit 1.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sluice.perf.llm_workload import generated_prompt
from tests import zoo_llm
from tests.e2e.helpers import wait_until

pytestmark = pytest.mark.timeout(180)

ANY_SPREAD = "100000"
WINDOWS = [
    "--measurement-mode",
    "count_windows",
    "--measurement-request-count",
    "8",
    "-s",
    ANY_SPREAD,
    "-r",
    "3",
    "--no-progress",
]
PROMPT_WORDS, MAX_TOKENS = 6, 9
LLM_COLUMNS = [
    "Output Token Throughput",
    "Output Tokens",
    "Time To First Token p50",
    "Time To First Token p90",
    "Time To First Token p99",
    "Inter Token Latency p50",
    "Inter Token Latency p99",
]


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):  # type: ignore[no-untyped-def]
    zoo_llm.parrot(module_repo)
    return module_server(module_repo)


def perf(srv: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice", "perf", "-m", "parrot", "-u", srv.http, *args],
        capture_output=True,
        text=True,
        timeout=150,
    )


def _stats(srv: Any) -> dict[str, Any]:
    code, raw = srv.get("/v2/models/parrot/stats")
    assert code == 200, raw
    return dict(json.loads(raw)["model_stats"][0]["inference_stats"])


def _counted(srv: Any, before: dict[str, Any], total: int) -> dict[str, Any]:
    """The statistics once the server counted ``total`` successes since ``before`` (a stream's
    last byte may reach the client before its request is counted), checked exact."""

    def done() -> bool:
        return bool(_stats(srv)["success"]["count"] - before["success"]["count"] >= total)

    wait_until(done, what=f"{total} successes counted", describe=lambda: str(_stats(srv)))
    after = _stats(srv)
    assert after["success"]["count"] - before["success"]["count"] == total, (before, after)
    return after


def _levels(stdout: str) -> list[dict[str, Any]]:
    """Each level block's figures, as printed."""
    out = []
    for block in stdout.split("Request concurrency: ")[1:]:
        tokens = re.search(
            r"Output tokens: (\d+) in (\d+) requests \(\S+ per request, min (\d+), max (\d+)\)",
            block,
        )
        assert tokens is not None, block
        ttft = re.search(
            r"Time to first token: p50 (\d+) usec, p90 (\d+) usec, p99 (\d+) usec", block
        )
        itl = re.search(r"Inter-token latency: p50 (\d+) usec, p99 (\d+) usec", block)
        lat = re.search(
            r"Request latency: avg \d+ usec, p50 (\d+) usec, p90 (\d+) usec, p99 (\d+)", block
        )
        sent = re.search(r"Requests sent: (\d+) ", block)
        count = re.search(r"Request count: (\d+)", block)
        assert lat is not None and sent is not None and count is not None, block
        out.append(
            {
                "level": int(block.split("\n", 1)[0]),
                "tokens": int(tokens[1]),
                "requests": int(tokens[2]),
                "min": int(tokens[3]),
                "max": int(tokens[4]),
                "ttft": [int(x) for x in ttft.groups()] if ttft else None,
                "itl": [int(x) for x in itl.groups()] if itl else None,
                "latency": [int(x) for x in lat.groups()],
                "sent": int(sent[1]),
                "count": int(count[1]),
                "block": block,
            }
        )
    return out


def _check_run(
    srv: Any, r: subprocess.CompletedProcess[str], before: dict[str, Any], per_request: int
) -> list[dict[str, Any]]:
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Failed requests" not in r.stdout, r.stdout
    levels = _levels(r.stdout)
    for lv in levels:
        for line in (
            "Request throughput: ",
            "Output token throughput: ",
            "Time to first token: p50 ",
            "Inter-token latency: p50 ",
            "Request latency: avg ",
        ):
            assert line in lv["block"], (line, lv["block"])
        # every request's token count is the model's
        assert lv["requests"] == lv["count"] > 0
        assert (lv["min"], lv["max"]) == (per_request, per_request), lv["block"]
        assert lv["tokens"] == lv["requests"] * per_request
        # a request's first token comes within its latency: so does each percentile
        assert lv["ttft"] is not None and lv["itl"] is not None
        assert all(t <= q for t, q in zip(lv["ttft"], lv["latency"], strict=True)), lv["block"]
    total = int(r.stdout.split("Requests sent in all: ")[1].split()[0])
    assert total == sum(lv["sent"] for lv in levels) > 0
    # the server counted exactly the requests sluice perf sent, each one a success
    after = _counted(srv, before, total)
    assert after["fail"]["count"] == before["fail"]["count"], (before, after)
    return levels


def test_chat_completions_streaming(srv: Any, tmp_path: Path) -> None:
    out = tmp_path / "chat.csv"
    before = _stats(srv)
    r = perf(
        srv,
        "--service-kind",
        "openai",
        "--endpoint",
        "v1/chat/completions",
        "--streaming",
        "--synthetic-input-tokens-mean",
        str(PROMPT_WORDS),
        "--output-tokens-mean",
        str(MAX_TOKENS),
        "--concurrency-range",
        "1:2",
        "-f",
        str(out),
        *WINDOWS,
    )
    # the chat as the server renders it without a template, and what the parrot says to it
    chat = f"user: {generated_prompt(PROMPT_WORDS)}\nassistant:"
    words, _ = zoo_llm.parrot_words(chat, MAX_TOKENS)
    levels = _check_run(srv, r, before, len(words))
    assert [lv["level"] for lv in levels] == [1, 2]
    assert "Service Kind: OPENAI" in r.stdout and "Endpoint: v1/chat/completions" in r.stdout
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[-len(LLM_COLUMNS) :] == LLM_COLUMNS
    by_level = {int(row["Concurrency"]): row for row in rows}
    for lv in levels:
        row = by_level[lv["level"]]
        assert int(row["Output Tokens"]) == lv["tokens"]
        assert int(row["Time To First Token p50"]) == lv["ttft"][0]
        assert int(row["Inter Token Latency p99"]) == lv["itl"][1]


def test_generate_stream_beside_it(srv: Any) -> None:
    before = _stats(srv)
    r = perf(
        srv,
        "--service-kind",
        "openai",
        "--endpoint",
        "v2/models/parrot/generate_stream",
        "--streaming",
        "--synthetic-input-tokens-mean",
        str(PROMPT_WORDS),
        "--output-tokens-mean",
        str(MAX_TOKENS),
        "--concurrency-range",
        "2",
        *WINDOWS,
    )
    # what /v1/completions would send the model: the prompt itself
    words, _ = zoo_llm.parrot_words(generated_prompt(PROMPT_WORDS), MAX_TOKENS)
    _check_run(srv, r, before, len(words))
    assert "Endpoint: v2/models/parrot/generate_stream" in r.stdout


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("v1/completions", {"model": "parrot", "prompt": "one two three halt four"}),
        (
            "v2/models/parrot/generate_stream",
            {"text_input": "one two three halt four", "exclude_input_in_output": True},
        ),
    ],
)
def test_bodies_from_input_data_count_the_models_words(
    srv: Any, tmp_path: Path, endpoint: str, body: dict[str, Any]
) -> None:
    # the parrot stops before "halt": fewer words than max_tokens, and no usage chunk asked
    # for, so the count is the events that carried text
    if endpoint.startswith("v1"):
        body = {**body, "max_tokens": 10, "stop": ["halt"]}
    else:
        body = {**body, "sampling_parameters": json.dumps({"max_tokens": 10, "stop": ["halt"]})}
    data = tmp_path / "bodies.json"
    data.write_text(json.dumps({"data": [{"payload": [body]}]}))
    words, finish = zoo_llm.parrot_words("one two three halt four", 10, ["halt"])
    assert (len(words), finish) == (3, "stop")
    before = _stats(srv)
    r = perf(
        srv,
        "--service-kind",
        "openai",
        "--endpoint",
        endpoint,
        "--streaming",
        "--input-data",
        str(data),
        *WINDOWS,
    )
    _check_run(srv, r, before, len(words))


def test_a_non_streamed_answer_counts_tokens_without_a_first_token(
    srv: Any, tmp_path: Path
) -> None:
    data = tmp_path / "chat.json"
    body = {"model": "parrot", "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 5}
    data.write_text(json.dumps({"data": [{"payload": [body]}]}))
    before = _stats(srv)
    r = perf(
        srv,
        "--service-kind",
        "openai",
        "--endpoint",
        "v1/chat/completions",
        "--input-data",
        str(data),
        *WINDOWS,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Streaming: no" in r.stdout
    (lv,) = _levels(r.stdout)
    words, _ = zoo_llm.parrot_words("user: a b c\nassistant:", 5)
    assert (lv["min"], lv["max"]) == (len(words), len(words))  # the usage of each answer
    assert lv["ttft"] is None and "Time to first token: not measured" in lv["block"]
    _counted(srv, before, int(r.stdout.split("Requests sent in all: ")[1].split()[0]))


def test_an_error_mid_stream_fails_the_request_with_the_models_message(
    srv: Any, tmp_path: Path
) -> None:
    data = tmp_path / "boom.json"
    body = {"model": "parrot", "prompt": "a b boom", "max_tokens": 5}
    data.write_text(json.dumps({"data": [{"payload": [body]}]}))
    before = _stats(srv)
    r = perf(
        srv,
        "--service-kind",
        "openai",
        "--endpoint",
        "v1/completions",
        "--streaming",
        "--input-data",
        str(data),
        *WINDOWS,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "every request failed at concurrency 1: error event: boom after 2 words" in r.stderr
    wait_until(lambda: _stats(srv)["fail"]["count"] > before["fail"]["count"], what="failures")
    assert _stats(srv)["success"]["count"] == before["success"]["count"]


def test_a_model_the_api_does_not_serve_is_one_line(srv: Any) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice",
            "perf",
            "-m",
            "nosuch",
            "-u",
            srv.http,
            "--service-kind",
            "openai",
            "--endpoint",
            "v1/chat/completions",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"error: model 'nosuch' is not served through the OpenAI API at {srv.http}: "
        "GET /v1/models/nosuch failed with HTTP 404: The model 'nosuch' does not exist "
        "(no model of that name is serving)"
    ]
