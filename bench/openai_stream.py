"""Streaming tokens through the OpenAI-compatible API against Triton's generate_stream, one model.

    .venv/bin/python bench/openai_stream.py [--tokens 128] [--concurrency 1 8] [--requests 24]
                                            [--rounds 3] [--delay-ms 0]

One ``sluice serve`` serves ``tests/zoo_llm.py``'s ``parrot`` (a decoupled python model in
Triton's vLLM convention: one response per word, ``--delay-ms`` between words). The same
generations (``--tokens`` words from the same prompt) are asked for through
``POST /v1/chat/completions`` with ``"stream": true`` and through
``POST /v2/models/parrot/generate_stream``, by ``c`` clients at once, each sending
``--requests`` requests one after the other; the two endpoints alternate within each of
``--rounds`` rounds. The clients are plain asyncio HTTP/1.1 connections (one per client,
kept alive) that read the server-sent events as they arrive, so both endpoints pay the same
client cost. Reported per endpoint and concurrency, medians over the rounds:
- TTFT: from sending the request to the first event carrying a word (ms, p50 and p90);
- inter-token ms: time from the first word to the last / words after the first (p50 of the
  streams; at c > 1 the client's reads bunch events together, so read it at c=1);
- tokens/s per stream: words / time from sending to the last word (p50 of the streams);
- tokens/s in all: every word of the round / the round's wall time;
- server CPU per token: the server process's user+system CPU over the round / its words
  (psutil), and its python worker's: what each endpoint costs the server, which the
  wall-clock figures on a busy machine only estimate.
The model has one instance and generates one request's words before the next request's, so
at c > 1 a request's TTFT includes the streams queued before it, on both endpoints alike.
Bounded: each (endpoint, c, round) ends after its requests or 60 s, whichever comes first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from tests import zoo_llm  # noqa: E402

from servers import start_sluice  # noqa: E402

PROMPT = "the quick brown fox jumps over the lazy dog"
ROUND_LIMIT_S = 60.0


def _bodies(tokens: int) -> dict[str, tuple[str, bytes]]:
    chat = {
        "model": "parrot",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "stream": True,
    }
    # what the OpenAI mapping sends the model, given to generate_stream directly
    prompt = f"user: {PROMPT}\nassistant:"
    params = {
        "frequency_penalty": 0.0,
        "ignore_eos": False,
        "n": 1,
        "presence_penalty": 0.0,
        "temperature": 0.7,
        "top_p": 1.0,
        "max_tokens": tokens,
    }
    generate = {
        "text_input": prompt,
        "stream": True,
        "sampling_parameters": json.dumps(params),
        "exclude_input_in_output": True,
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
        "return_finish_reason": True,
    }
    return {
        "openai": ("/v1/chat/completions", json.dumps(chat).encode()),
        "generate_stream": ("/v2/models/parrot/generate_stream", json.dumps(generate).encode()),
    }


def _word(kind: str, data: bytes) -> bool:
    """Does this event carry a word?"""
    if data == b"[DONE]":
        return False
    doc = json.loads(data)
    if kind == "openai":
        return bool(doc["choices"] and doc["choices"][0]["delta"].get("content"))
    return bool(doc.get("text_output"))


class _Conn:
    """One kept-alive HTTP/1.1 connection that streams chunked server-sent events."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def stream(self, kind: str, path: str, body: bytes) -> tuple[float, list[float]]:
        """(send time, arrival time of each event carrying a word)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        sent = time.perf_counter()
        self.writer.write(head + body)
        status = await self.reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"{path}: {status!r}")
        while (await self.reader.readline()) not in (b"\r\n", b""):
            pass
        words: list[float] = []
        buf = b""
        while True:
            size = int((await self.reader.readline()).strip(), 16)
            chunk = await self.reader.readexactly(size + 2)
            if size == 0:
                return sent, words
            now = time.perf_counter()
            buf += chunk[:-2]
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if event.startswith(b"data: ") and _word(kind, event[6:]):
                    words.append(now)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def _round(port: int, kind: str, path: str, body: bytes, c: int, n: int) -> dict[str, float]:
    ttft: list[float] = []
    gaps: list[float] = []
    rates: list[float] = []
    words = 0
    deadline = time.perf_counter() + ROUND_LIMIT_S

    async def client() -> None:
        nonlocal words
        conn = _Conn(port)
        try:
            for _ in range(n):
                if time.perf_counter() > deadline:
                    return
                sent, stamps = await conn.stream(kind, path, body)
                ttft.append(stamps[0] - sent)
                if len(stamps) > 1:
                    gaps.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
                rates.append(len(stamps) / (stamps[-1] - sent))
                words += len(stamps)
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(c)))
    wall = time.perf_counter() - t0
    q = statistics.quantiles(ttft, n=10) if len(ttft) > 1 else [ttft[0]] * 9
    return {
        "ttft_p50_ms": statistics.median(ttft) * 1e3,
        "ttft_p90_ms": q[8] * 1e3,
        "itl_ms": statistics.median(gaps) * 1e3,
        "stream_tok_s": statistics.median(rates),
        "total_tok_s": words / wall,
        "requests": len(ttft),
        "words": words,
    }


def _cpu(proc: psutil.Process) -> tuple[float, float]:
    """(the server process's CPU seconds, its children's)."""
    t = proc.cpu_times()
    kids = 0.0
    for child in proc.children(recursive=True):
        try:
            c = child.cpu_times()
        except psutil.Error:
            continue
        kids += c.user + c.system
    return t.user + t.system, kids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--requests", type=int, default=24, help="per client and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="the model's pause per word")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        zoo_llm.parrot(repo, token_delay_ms=args.delay_ms)
        srv = start_sluice(repo, Path(tmp) / "sluice.log")
        try:
            srv.wait_ready()
            proc = psutil.Process(srv.proc.pid)
            bodies = _bodies(args.tokens)
            results: dict[tuple[str, int], list[dict[str, float]]] = {}
            for r in range(args.rounds):
                for c in args.concurrency:
                    order = list(bodies) if r % 2 == 0 else list(reversed(bodies))
                    for kind in order:
                        path, body = bodies[kind]
                        main0, kids0 = _cpu(proc)
                        out = asyncio.run(_round(srv.http, kind, path, body, c, args.requests))
                        main1, kids1 = _cpu(proc)
                        words = out["words"]
                        out["server_us"] = (main1 - main0) / words * 1e6
                        out["worker_us"] = (kids1 - kids0) / words * 1e6
                        results.setdefault((kind, c), []).append(out)
                        print(f"round {r} c={c} {kind}: {out}", file=sys.stderr)
        finally:
            srv.stop()
    print(
        f"parrot, {args.tokens} words per stream, model pause {args.delay_ms:g} ms/word, "
        f"{args.requests} requests per client, {args.rounds} rounds (medians)"
    )
    print(
        "| endpoint | c | TTFT p50 ms | TTFT p90 ms | inter-token ms | tokens/s per stream "
        "| tokens/s in all | server CPU us/token | worker CPU us/token |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (kind, c), runs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(x[key] for x in runs)

        print(
            f"| {kind} | {c} | {med('ttft_p50_ms'):.2f} | {med('ttft_p90_ms'):.2f} | "
            f"{med('itl_ms'):.3f} | {med('stream_tok_s'):.0f} | {med('total_tok_s'):.0f} | "
            f"{med('server_us'):.1f} | {med('worker_us'):.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
