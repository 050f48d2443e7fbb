"""``sluice model list|load|unload|stats|config|traffic`` as an operator runs it: a subprocess
against a live ``sluice serve`` (explicit mode), judged from exit codes, output and what the
server reports afterwards (index, config, statistics) through its own API."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tests.conftest import refused_address
from tests.e2e.helpers import index_entries, infer_fp32, request
from tests.zoo import broken_config, copy_example, identity, init_fail_model, versioned_model

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):  # type: ignore[no-untyped-def]
    copy_example(module_repo, "add_sub")
    identity(module_repo, "ident", dims="[ 1 ]")
    versioned_model(module_repo, "dual", [1, 2])  # default policy: only the latest (2)
    init_fail_model(module_repo, "init_fail")
    broken_config(module_repo, "broken")
    return module_server(
        module_repo,
        "--model-control-mode=explicit",
        "--load-model=add_sub",
        "--load-model=ident",
        "--load-model=dual",
    )


def sluice(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def model(srv: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return sluice("model", *args, "-u", srv.http)


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return r.stdout


def table(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.strip().splitlines()]


def server_config(srv: Any, name: str) -> dict[str, Any]:
    code, raw = request(srv, "GET", f"/v2/models/{name}/config")
    assert code == 200, raw
    return dict(json.loads(raw))


# --------------------------------------------------------------------------- list
def test_list_table_and_json(srv) -> None:  # type: ignore[no-untyped-def]
    rows = table(ok(model(srv, "list")))
    assert rows[0] == ["MODEL", "VERSION", "STATE", "REASON"]
    by_name = {(r[0], r[1]): r for r in rows[1:]}
    assert by_name[("add_sub", "1")][2] == "READY"
    assert by_name[("dual", "2")][2] == "READY"
    assert ("broken", "-") in by_name  # never loaded: no version, no state (as in the index)
    doc = json.loads(ok(model(srv, "list", "--format", "json")))
    assert {"name": "add_sub", "version": "1", "state": "READY"} in doc
    ready = json.loads(ok(model(srv, "list", "--ready", "--format", "json")))
    assert ready and all(e["state"] == "READY" for e in ready)
    assert "broken" not in {e["name"] for e in ready}


def test_list_shows_the_reason_of_a_failed_load(srv) -> None:  # type: ignore[no-untyped-def]
    r = model(srv, "load", "init_fail")
    assert r.returncode == 1, r
    assert r.stdout == ""
    assert "init exploded" in r.stderr and r.stderr.startswith("error: ")
    out = ok(model(srv, "list"))
    line = next(ln for ln in out.splitlines() if ln.startswith("init_fail "))
    assert "UNAVAILABLE" in line and "init exploded" in line


# --------------------------------------------------------------------------- load / unload
def test_load_unknown_model_exit_1_with_the_servers_text(srv) -> None:  # type: ignore[no-untyped-def]
    code, raw = request(srv, "POST", "/v2/repository/models/no_such_model/load")
    server_text = json.loads(raw)["error"]
    r = model(srv, "load", "no_such_model")
    assert r.returncode == 1
    assert r.stderr.strip() == f"error: {server_text}"


def test_load_with_config_file_pbtxt_and_json_then_unload(srv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pbtxt = tmp_path / "ident.pbtxt"
    pbtxt.write_text(
        'name: "ident"\nbackend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        "instance_group [ { count: 2, kind: KIND_CPU } ]\n"
    )
    out = ok(model(srv, "load", "ident", "--config", str(pbtxt)))
    assert "loaded 'ident'" in out
    cfg = server_config(srv, "ident")
    assert cfg["max_batch_size"] == 4
    assert [g["count"] for g in cfg["instance_group"]] == [2]

    as_json = tmp_path / "ident.json"
    as_json.write_text(json.dumps({**cfg, "max_batch_size": 2}))
    ok(model(srv, "load", "ident", "--config", str(as_json)))
    assert server_config(srv, "ident")["max_batch_size"] == 2
    assert infer_fp32(srv, "ident", 3.0)[0] == 200

    assert "unloaded 'ident'" in ok(model(srv, "unload", "ident"))
    assert [e.get("state") for e in index_entries(srv, "ident")] == ["UNAVAILABLE"]
    ok(model(srv, "load", "ident"))  # plain load: back from the files
    assert server_config(srv, "ident")["max_batch_size"] == 8


def test_load_bad_config_file_is_usage_exit_2(srv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.pbtxt"
    bad.write_text('name: "ident"\nmax_batch_sise: 4\n')
    r = model(srv, "load", "ident", "--config", str(bad))
    assert r.returncode == 2
    assert "max_batch_sise" in r.stderr and str(bad) in r.stderr
    r = model(srv, "load", "ident", "--config", str(tmp_path / "missing.pbtxt"))
    assert r.returncode == 2 and "cannot read" in r.stderr


# --------------------------------------------------------------------------- stats / config
def test_stats_table_and_json_match_the_server(srv) -> None:  # type: ignore[no-untyped-def]
    before = json.loads(request(srv, "GET", "/v2/models/dual/stats")[1])["model_stats"]
    for v in range(5):
        assert infer_fp32(srv, "dual", float(v))[0] == 200
    doc = json.loads(ok(model(srv, "stats", "dual", "--format", "json")))
    ms = doc["model_stats"]
    assert [(m["name"], m["version"]) for m in ms] == [("dual", "2")]
    count = ms[0]["inference_count"]
    assert count == sum(m["inference_count"] for m in before) + 5, (before, ms)
    rows = table(ok(model(srv, "stats", "dual")))
    assert rows[0] == [
        "MODEL",
        "VERSION",
        "INFERENCES",
        "EXECUTIONS",
        "AVG_BATCH",
        "SUCCESS",
        "FAIL",
        "QUEUE_US",
        "COMPUTE_US",
    ]
    row = rows[1]
    assert row[:3] == ["dual", "2", str(count)]
    assert int(row[5]) == ms[0]["inference_stats"]["success"]["count"]
    assert row[6] == "0"
    assert int(row[8]) > 0  # compute time per request, in usec
    every = table(ok(model(srv, "stats")))
    served = json.loads(request(srv, "GET", "/v2/models/stats")[1])["model_stats"]
    assert sorted((r[0], r[1]) for r in every[1:]) == sorted(
        (m["name"], m["version"]) for m in served
    )
    assert {"add_sub", "dual"} <= {r[0] for r in every[1:]}


def test_stats_of_a_model_not_loaded_exit_1(srv) -> None:  # type: ignore[no-untyped-def]
    r = model(srv, "stats", "broken")
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "broken" in r.stderr


def test_config_json_and_pbtxt(srv) -> None:  # type: ignore[no-untyped-def]
    cfg = json.loads(ok(model(srv, "config", "add_sub")))
    assert cfg == server_config(srv, "add_sub")
    text = ok(model(srv, "config", "add_sub", "--pbtxt"))
    msg = text_format.Parse(text, mc.ModelConfig())
    assert msg.name == "add_sub" and msg.max_batch_size == 8
    assert [i.name for i in msg.input] == ["INPUT0", "INPUT1"]
    assert msg.HasField("dynamic_batching")


# --------------------------------------------------------------------------- versions, traffic
def test_versions_and_traffic(srv) -> None:  # type: ignore[no-untyped-def]
    assert "loaded 'dual' version 1" in ok(model(srv, "load", "dual", "--version", "1"))
    states = {e["version"]: e["state"] for e in index_entries(srv, "dual")}
    assert states == {"1": "READY", "2": "READY"}

    rows = table(ok(model(srv, "traffic", "dual", "1=90", "2=10")))
    assert rows == [["VERSION", "WEIGHT", "SHARE"], ["1", "90", "90.0%"], ["2", "10", "10.0%"]]
    doc = json.loads(ok(model(srv, "traffic", "dual", "--format", "json")))
    assert doc == {"model": "dual", "weights": {"1": 90, "2": 10}}
    code, raw = request(srv, "GET", "/v2/repository/models/dual/traffic")
    assert json.loads(raw) == doc

    # the server refuses to unload a version that still takes traffic: exit 1, its text
    r = model(srv, "unload", "dual", "--version", "2")
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "2" in r.stderr
    assert {e["version"]: e["state"] for e in index_entries(srv, "dual")}["2"] == "READY"

    out = ok(model(srv, "traffic", "dual", "--clear"))
    assert out.startswith("no traffic split for 'dual'")
    assert json.loads(request(srv, "GET", "/v2/repository/models/dual/traffic")[1]) == {
        "model": "dual",
        "weights": {},
    }
    assert "unloaded 'dual' version 2" in ok(model(srv, "unload", "dual", "--version", "2"))
    states = {e["version"]: e["state"] for e in index_entries(srv, "dual")}
    assert states["1"] == "READY" and states["2"] == "UNAVAILABLE"
    assert infer_fp32(srv, "dual", 1.0)[1]["outputs"][0]["data"] == [2.0]  # version 1: +1


def test_traffic_usage_errors_exit_2(srv) -> None:  # type: ignore[no-untyped-def]
    for bad in (["1=abc"], ["one=5"], ["1=5", "1=6"], ["--clear", "1=5"]):
        r = model(srv, "traffic", "dual", *bad)
        assert r.returncode == 2, (bad, r)
        assert "error: " in r.stderr  # ours, or argparse's usage line + error
    r = model(srv, "unload", "dual", "--version", "1", "--unload-dependents")
    assert r.returncode == 2


def test_traffic_over_a_version_not_serving_exit_1(srv) -> None:  # type: ignore[no-untyped-def]
    r = model(srv, "traffic", "add_sub", "1=50", "7=50")
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "7" in r.stderr


# --------------------------------------------------------------------------- connection, usage
def test_connection_refused_exit_3_names_the_url() -> None:
    with refused_address() as url:
        for args in (["model", "list"], ["model", "stats", "x"], ["model", "unload", "x"]):
            r = sluice(*args, "-u", url)
            assert r.returncode == 3, r
            assert r.stderr.startswith(f"error: cannot connect to {url}")
            assert r.stdout == ""


def test_usage_errors_exit_2() -> None:
    assert sluice("model").returncode == 2
    assert sluice("model", "frobnicate").returncode == 2
    r = sluice("model", "list", "-u", "no-port-here")
    assert r.returncode == 2 and "HOST:PORT" in r.stderr
