"""The response cache: ``--cache-config local,size=N`` and ``response_cache { enable: true }``,
as real Triton 2.51 answers (checked on this machine: hits count as successes but not as
inferences; cache_hit / cache_miss in the statistics; nv_cache_* metrics)."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.helpers import grpc_client, post
from tests.zoo import copy_example


def _body(a: list[float], outputs: list[str] | None = None) -> dict:
    body: dict = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": a},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]},
        ]
    }
    if outputs:
        body["outputs"] = [{"name": n} for n in outputs]
    return body


def _stats(srv, model: str) -> dict:
    return json.loads(srv.get(f"/v2/models/{model}/stats")[1])["model_stats"][0]


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    for name in ("cached", "plain"):
        mdir = copy_example(module_repo, "add_sub")
        mdir = mdir.rename(module_repo / name)
        cfg = (mdir / "config.pbtxt").read_text().replace('name: "add_sub"', f'name: "{name}"')
        if name == "cached":
            cfg += "\nresponse_cache { enable: true }\n"
        (mdir / "config.pbtxt").write_text(cfg)
    # two add_sub entries fit (each: outputs 2 x 16 bytes + inputs 2 x 16 bytes), a third
    # evicts the oldest
    return module_server(module_repo, "--cache-config=local,size=128")


@pytest.mark.grpc
def test_identical_requests_are_answered_from_the_cache(srv):
    outs = []
    for _ in range(3):
        code, raw = post(srv, "/v2/models/cached/infer", _body([1, 2, 3, 4]))
        assert code == 200, raw
        outs.append(json.loads(raw)["outputs"])
    assert outs[0] == outs[1] == outs[2]
    assert outs[0][0]["data"] == [2.0, 3.0, 4.0, 5.0]
    st = _stats(srv, "cached")
    inf = st["inference_stats"]
    assert (inf["cache_hit"]["count"], inf["cache_miss"]["count"]) == (2, 1)
    assert inf["success"]["count"] == 3
    assert st["inference_count"] == 1 and st["execution_count"] == 1  # the model ran once
    # a hit answers only the outputs asked for (Triton 2.51 sends all of them: a bug)
    code, raw = post(srv, "/v2/models/cached/infer", _body([1, 2, 3, 4], ["OUTPUT1"]))
    assert code == 200 and [o["name"] for o in json.loads(raw)["outputs"]] == ["OUTPUT1"]
    # gRPC finds what HTTP stored: same key
    c = grpc_client(srv)
    try:
        inputs = []
        for name, arr in (("INPUT0", [1, 2, 3, 4]), ("INPUT1", [1, 1, 1, 1])):
            i = grpcclient.InferInput(name, [1, 4], "FP32")
            i.set_data_from_numpy(np.array([arr], dtype=np.float32))
            inputs.append(i)
        r = c.infer("cached", inputs)
    finally:
        c.close()
    assert r.as_numpy("OUTPUT0").tolist() == [[2.0, 3.0, 4.0, 5.0]]
    assert _stats(srv, "cached")["inference_stats"]["cache_hit"]["count"] == 4
    # a model without response_cache never uses it
    for _ in range(2):
        assert post(srv, "/v2/models/plain/infer", _body([1, 2, 3, 4]))[0] == 200
    st = _stats(srv, "plain")
    assert st["inference_count"] == 2 and st["inference_stats"]["cache_hit"]["count"] == 0


def test_least_recently_used_response_leaves_first(srv):
    def run(a: float) -> None:
        assert post(srv, "/v2/models/cached/infer", _body([a, a, a, a]))[0] == 200

    before = _stats(srv, "cached")["inference_stats"]
    for a in (10, 20, 30):  # three misses: 10 is evicted (two fit)
        run(a)
    run(20)  # hit
    run(10)  # miss again (evicted), evicts 30
    run(20)  # still there
    after = _stats(srv, "cached")["inference_stats"]
    hits = after["cache_hit"]["count"] - before["cache_hit"]["count"]
    misses = after["cache_miss"]["count"] - before["cache_miss"]["count"]
    assert (hits, misses) == (2, 4)


@pytest.mark.grpc
def test_a_streams_requests_are_answered_from_the_cache(srv):
    # ModelStreamInfer on a model that is not decoupled goes through the cache too, as in
    # Triton's core (2.51 on this machine: one miss, two hits, one execution for three
    # identical requests on one stream; it answered the first with "response output count
    # mismatch", sluice answers all three)
    before = _stats(srv, "cached")
    answers: queue.Queue = queue.Queue()
    c = grpc_client(srv)
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for _ in range(3):
            inputs = []
            for name, arr in (("INPUT0", [60, 61, 62, 63]), ("INPUT1", [1, 1, 1, 1])):
                i = grpcclient.InferInput(name, [1, 4], "FP32")
                i.set_data_from_numpy(np.array([arr], dtype=np.float32))
                inputs.append(i)
            c.async_stream_infer("cached", inputs, request_id="s")
            result, error = answers.get(timeout=30)
            assert error is None, error
            assert result.as_numpy("OUTPUT0").tolist() == [[61.0, 62.0, 63.0, 64.0]]
            assert result.as_numpy("OUTPUT1").tolist() == [[59.0, 60.0, 61.0, 62.0]]
            assert result.get_response().id == "s"
    finally:
        c.stop_stream()
        c.close()
    after = _stats(srv, "cached")
    b, a = before["inference_stats"], after["inference_stats"]
    assert a["cache_hit"]["count"] - b["cache_hit"]["count"] == 2
    assert a["cache_miss"]["count"] - b["cache_miss"]["count"] == 1
    assert a["success"]["count"] - b["success"]["count"] == 3
    assert after["execution_count"] - before["execution_count"] == 1


def test_cache_metrics_as_triton_names_them(srv):
    # its own traffic (the test holds alone): two new entries, a hit on each, and the model
    # without response_cache served once
    before = _stats(srv, "cached")["inference_stats"]
    for a in (40, 50, 40, 50):
        assert post(srv, "/v2/models/cached/infer", _body([a, a, a, a]))[0] == 200
    assert post(srv, "/v2/models/plain/infer", _body([40, 40, 40, 40]))[0] == 200
    text = srv.get("/metrics", port=srv.metrics_port)[1].decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model"):
        assert f"# TYPE {name} counter\n" in text
        models = {s.labels["model"] for s in fams[name].samples}
        assert models == {"cached"}, (name, models)
    hits = {s.labels["model"]: s.value for s in fams["nv_cache_num_hits_per_model"].samples}
    misses = {s.labels["model"]: s.value for s in fams["nv_cache_num_misses_per_model"].samples}
    inf = _stats(srv, "cached")["inference_stats"]
    assert hits["cached"] == inf["cache_hit"]["count"], (hits, inf)
    assert misses["cached"] == inf["cache_miss"]["count"], (misses, inf)
    assert inf["cache_hit"]["count"] - before["cache_hit"]["count"] == 2, (before, inf)
    assert inf["cache_miss"]["count"] - before["cache_miss"]["count"] == 2, (before, inf)
    # the two newest entries, 64 bytes each, fill the 128-byte cache
    assert fams["nv_cache_num_entries"].samples[0].value == 2
    assert fams["nv_cache_util"].samples[0].value == 1.0


def test_bad_cache_config_is_a_one_line_error(tmp_path: Path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice",
            "serve",
            f"--model-repository={tmp_path}",
            "--cache-config=redis,host=x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "cache 'redis' is not supported (only 'local')" in proc.stderr
