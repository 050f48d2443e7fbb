"""The example repository's BLS pipeline and decoupled streamer, as the README calls them."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tests.e2e.helpers import http_client
from tests.zoo import copy_example

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(1, 3, 1, 1) * 255.0
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(1, 3, 1, 1) * 255.0


def test_bls_classify_and_text_streamer(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    for name in ("resnet50", "bls_classify", "text_streamer"):
        copy_example(repo, name)
    srv = start_server(
        repo,
        "--model-control-mode=explicit",
        "--load-model=resnet50",
        "--load-model=bls_classify",
        "--load-model=text_streamer",
    )
    image = np.random.default_rng(7).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
    c = http_client(srv, timeout=120)
    try:
        i = httpclient.InferInput("IMAGE", list(image.shape), "UINT8")
        i.set_data_from_numpy(image)
        r = c.infer("bls_classify", [i])
        # the same image through resnet50 directly: BLS must give its top-1
        chw = np.ascontiguousarray((image.transpose(0, 3, 1, 2) - MEAN) / STD, np.float32)
        j = httpclient.InferInput("input", list(chw.shape), "FP32")
        j.set_data_from_numpy(chw)
        logits = c.infer("resnet50", [j]).as_numpy("output")
    finally:
        c.close()
    assert r.as_numpy("CLASS").reshape(-1).tolist() == logits.argmax(axis=1).tolist()
    scores = r.as_numpy("SCORE").reshape(-1)
    assert ((scores > 0) & (scores <= 1)).all()
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=60)
    try:
        body = {"text_input": "one word at a time", "delay_ms": 1}
        conn.request("POST", "/v2/models/text_streamer/generate_stream", json.dumps(body))
        resp = conn.getresponse()
        text = resp.read().decode()
    finally:
        conn.close()
    assert resp.status == 200
    events = [json.loads(e[len("data: ") :]) for e in text.split("\n\n") if e]
    assert [e["text_output"] for e in events] == ["one", "word", "at", "a", "time"]


def test_streamer_threads_under_concurrent_streams_lose_nothing(tmp_path: Path, start_server):
    """Sender threads polling is_cancelled() while the next requests arrive: every stream
    completes (a reader that filed an Execute without waking the main loop hung the worker)."""
    import threading

    repo = tmp_path / "repo"
    copy_example(repo, "text_streamer")
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=text_streamer")
    done: list[int] = []

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
        try:
            for _ in range(40):
                body = json.dumps({"text_input": "a b c d e f"})
                conn.request("POST", "/v2/models/text_streamer/generate_stream", body)
                text = conn.getresponse().read().decode()
                done.append(text.count("data: "))
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert done == [6] * 160
