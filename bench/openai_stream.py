"""Streaming tokens through the OpenAI-compatible API beside Triton's generate_stream, one model,
both measured by ``sluice perf --service-kind openai``.

    .venv/bin/python bench/openai_stream.py [--tokens 128] [--prompt-words 9] [--concurrency 1 8]
                                            [--requests 16] [--rounds 3] [--delay-ms 0]

One ``sluice serve`` serves ``tests/zoo_llm.py``'s ``parrot`` (a decoupled python model in
Triton's vLLM convention: one response per word, ``--delay-ms`` between words, one instance).
For each round, concurrency ``c`` and endpoint (the two alternate within a round), one
``sluice perf -m parrot --service-kind openai --streaming --concurrency-range c`` run with
``--endpoint v1/chat/completions`` or ``--endpoint v2/models/parrot/generate_stream``: a
generated prompt of ``--prompt-words`` words and ``max_tokens`` ``--tokens`` (the generate
request is the one ``/v1/completions`` would send the model, so both ask for ``--tokens``
words), count windows of ``--requests`` requests (3 windows, any spread counted stable).
Reported per endpoint and concurrency, medians over the rounds, from sluice perf's CSV:
requests/s, output tokens/s, time to first token p50/p90/p99, inter-token latency p50/p99
((latency - TTFT) / (tokens - 1), genai-perf's definition; at c > 1 the client's reads bunch
events together, so read it at c=1), request latency p50; and the server's CPU per token:
the server process's user+system CPU over the run / the words of every request sluice perf
sent (psutil), and its python worker's: what each endpoint costs the server, which the
wall-clock figures on a busy machine only estimate.
The model generates one request's words before the next request's, so at c > 1 a request's
TTFT includes the streams queued before it, on both endpoints alike.
Bounded: each sluice perf run ends after its 3 windows or 120 s, whichever comes first.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from tests import zoo_llm  # noqa: E402

from servers import start_sluice  # noqa: E402

ENDPOINTS = {
    "openai": "v1/chat/completions",
    "generate_stream": "v2/models/parrot/generate_stream",
}
RUN_LIMIT_S = 120.0
FIGURES = (
    "req_s",
    "tok_s",
    "ttft_p50",
    "ttft_p90",
    "ttft_p99",
    "itl_p50",
    "itl_p99",
    "lat_p50",
    "server_us",
    "worker_us",
)


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


def _perf(
    port: int, endpoint: str, c: int, args: argparse.Namespace, out: Path
) -> tuple[dict[str, str], int]:
    """One sluice perf run: its CSV row and the requests it sent in all."""
    cmd = [
        sys.executable,
        "-m",
        "sluice",
        "perf",
        "-m",
        "parrot",
        "-u",
        f"127.0.0.1:{port}",
        "--service-kind",
        "openai",
        "--endpoint",
        endpoint,
        "--streaming",
        "--synthetic-input-tokens-mean",
        str(args.prompt_words),
        "--output-tokens-mean",
        str(args.tokens),
        "--concurrency-range",
        str(c),
        "--measurement-mode",
        "count_windows",
        "--measurement-request-count",
        str(args.requests),
        "-s",
        "100000",
        "-r",
        "3",
        "--no-progress",
        "--verbose-csv",
        "-f",
        str(out),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_LIMIT_S)
    if r.returncode != 0:
        raise RuntimeError(f"sluice perf {endpoint} c={c}: rc={r.returncode}: {r.stderr[-500:]}")
    with out.open() as f:
        row = next(csv.DictReader(f))
    sent = int(r.stdout.split("Requests sent in all: ")[1].split()[0])
    return row, sent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=128, help="max_tokens: words per stream")
    ap.add_argument("--prompt-words", type=int, default=9)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--requests", type=int, default=16, help="per measurement window")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="the model's pause per word")
    args = ap.parse_args()
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        zoo_llm.parrot(repo, token_delay_ms=args.delay_ms)
        srv = start_sluice(repo, Path(tmp) / "sluice.log")
        try:
            srv.wait_ready()
            proc = psutil.Process(srv.proc.pid)
            for r in range(args.rounds):
                for c in args.concurrency:
                    order = list(ENDPOINTS) if r % 2 == 0 else list(reversed(ENDPOINTS))
                    for kind in order:
                        main0, kids0 = _cpu(proc)
                        row, sent = _perf(srv.http, ENDPOINTS[kind], c, args, Path(tmp) / "o.csv")
                        main1, kids1 = _cpu(proc)
                        per_request = int(row["Output Tokens"]) / int(row["Request count"])
                        words = sent * per_request
                        out = {
                            "req_s": float(row["Inferences/Second"]),
                            "tok_s": float(row["Output Token Throughput"]),
                            "ttft_p50": int(row["Time To First Token p50"]) / 1e3,
                            "ttft_p90": int(row["Time To First Token p90"]) / 1e3,
                            "ttft_p99": int(row["Time To First Token p99"]) / 1e3,
                            "itl_p50": int(row["Inter Token Latency p50"]) / 1e3,
                            "itl_p99": int(row["Inter Token Latency p99"]) / 1e3,
                            "lat_p50": int(row["p50 latency"]) / 1e3,
                            "server_us": (main1 - main0) / words * 1e6,
                            "worker_us": (kids1 - kids0) / words * 1e6,
                        }
                        results.setdefault((kind, c), []).append(out)
                        print(f"round {r} c={c} {kind}: {out}", file=sys.stderr)
        finally:
            srv.stop()
    print(
        f"parrot, {args.tokens} words per stream from a {args.prompt_words}-word prompt, model "
        f"pause {args.delay_ms:g} ms/word, windows of {args.requests} requests, {args.rounds} "
        "rounds (medians); measured by sluice perf --service-kind openai --streaming"
    )
    print(
        "| endpoint | c | requests/s | output tokens/s | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms "
        "| ITL p50 ms | ITL p99 ms | latency p50 ms | server CPU us/token | worker CPU us/token |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (kind, c), runs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        med = {k: statistics.median(x[k] for x in runs) for k in FIGURES}
        print(
            f"| {kind} | {c} | {med['req_s']:.1f} | {med['tok_s']:.0f} | {med['ttft_p50']:.2f} "
            f"| {med['ttft_p90']:.2f} | {med['ttft_p99']:.2f} | {med['itl_p50']:.3f} "
            f"| {med['itl_p99']:.3f} | {med['lat_p50']:.2f} | {med['server_us']:.1f} "
            f"| {med['worker_us']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
