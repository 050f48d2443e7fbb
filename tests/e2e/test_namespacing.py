"""``--model-namespacing=true``: the same model name in two repositories, each in its own
namespace, as Triton 2.51 does (seen with it): both load and are listed; a request for the
ambiguous name is refused with Triton's text; an ensemble runs its own repository's model;
metrics carry ``namespace``; a load or unload by the plain name acts on every namespace.
Without the flag the first repository's model wins (logged), as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import (
    error_text,
    grpc_client,
    grpc_status,
    index,
    infer_fp32,
    post,
    wait_until,
)
from tests.zoo import identity, write_model

AMBIGUOUS = (
    "There are 2 identifiers of model 'm' in global map, model namespace must be provided to "
    "resolve ambiguity."
)


def _repos(tmp_path: Path) -> tuple[Path, Path]:
    ra, rb = tmp_path / "ra", tmp_path / "rb"
    identity(ra, "m", max_batch_size=8)
    identity(ra, "u")
    identity(rb, "m", max_batch_size=4)
    write_model(
        rb,
        "ens",
        """
        name: "ens"
        platform: "ensemble"
        max_batch_size: 4
        input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
        output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]
        ensemble_scheduling { step [ { model_name: "m" model_version: -1
          input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
        """,
        None,
    )
    return ra, rb


def _successes(srv) -> dict[tuple[str, str], float]:
    code, body = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("nv_inference_request_success{"):
            labels, _, value = line.partition("} ")
            d = dict(kv.split("=", 1) for kv in labels.split("{", 1)[1].split(","))
            out[(d["model"].strip('"'), d["namespace"].strip('"'))] = float(value)
    return out


@pytest.fixture
def ns_server(tmp_path: Path, start_server):
    ra, rb = _repos(tmp_path)
    srv = start_server(ra, "--model-namespacing=true", f"--model-repository={rb}")
    return srv, ra, rb


def test_both_load_and_the_index_lists_both(ns_server) -> None:
    srv, ra, rb = ns_server
    # Triton's order: by repository, then name; no namespace field
    assert [(e["name"], e["state"]) for e in index(srv)] == [
        ("m", "READY"),
        ("u", "READY"),
        ("ens", "READY"),
        ("m", "READY"),
    ]


def test_ambiguous_name_is_refused_with_triton_text(ns_server) -> None:
    srv, ra, rb = ns_server
    code, raw = post(srv, "/v2/models/m/infer", {"inputs": []})
    assert (code, error_text(raw)) == (400, AMBIGUOUS)
    for path in ("/v2/models/m", "/v2/models/m/config"):
        code, raw = srv.get(path)
        assert (code, error_text(raw)) == (400, AMBIGUOUS), path
    c = grpc_client(srv)
    try:
        with pytest.raises(InferenceServerException) as ei:
            c.get_model_metadata("m")
        assert grpc_status(ei.value) == "StatusCode.INVALID_ARGUMENT"
        assert ei.value.message() == AMBIGUOUS
    finally:
        c.close()
    # readiness and statistics answer as Triton 2.51 does for the ambiguous name
    code, raw = srv.get("/v2/models/m/ready")
    assert (code, error_text(raw)) == (400, "Model version not ready")
    code, raw = srv.get("/v2/models/m/stats")
    assert (code, error_text(raw)) == (400, "requested model 'm' is not available")
    assert infer_fp32(srv, "u", 1.0)[0] == 200  # a name in one repository serves as always


def test_ensemble_runs_its_own_repository_model_and_metrics_name_namespaces(ns_server) -> None:
    srv, ra, rb = ns_server
    code, body = post(
        srv,
        "/v2/models/ens/infer",
        {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [3, 4]}]},
    )
    assert code == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [3.0, 4.0]
    got = _successes(srv)
    assert got[("m", str(rb))] == 1 and got[("m", str(ra))] == 0
    assert got[("ens", str(rb))] == 1 and got[("u", str(ra))] == 0


def test_explicit_load_and_unload_by_plain_name_act_on_every_namespace(
    tmp_path: Path, start_server
) -> None:
    ra, rb = _repos(tmp_path)
    srv = start_server(
        ra, "--model-namespacing=true", f"--model-repository={rb}", "--model-control-mode=explicit"
    )
    assert [e["name"] for e in index(srv)] == ["m", "u", "ens", "m"]
    assert post(srv, "/v2/repository/models/m/load")[0] == 200
    assert [(e["name"], e.get("state")) for e in index(srv)] == [
        ("m", "READY"),
        ("u", None),
        ("ens", None),
        ("m", "READY"),
    ]
    assert post(srv, "/v2/repository/models/m/unload")[0] == 200
    assert [(e["name"], e.get("state")) for e in index(srv)] == [
        ("m", "UNAVAILABLE"),
        ("u", None),
        ("ens", None),
        ("m", "UNAVAILABLE"),
    ]
    # the ensemble's load brings in its own repository's m only
    assert post(srv, "/v2/repository/models/ens/load")[0] == 200
    assert [(e["name"], e.get("state")) for e in index(srv)] == [
        ("m", "UNAVAILABLE"),
        ("u", None),
        ("ens", "READY"),
        ("m", "READY"),
    ]


def test_without_namespacing_the_first_repository_wins(tmp_path: Path, start_server) -> None:
    ra, rb = _repos(tmp_path)
    srv = start_server(ra, f"--model-repository={rb}")
    assert sorted(e["name"] for e in index(srv)) == ["ens", "m", "u"]
    code, raw = srv.get("/v2/models/m/config")
    assert code == 200 and json.loads(raw)["max_batch_size"] == 8
    assert "model 'm' is in more than one repository" in srv.log()


def test_poll_a_name_appearing_in_a_second_repository_gets_two_namespaces(
    tmp_path: Path, start_server
) -> None:
    ra, rb = _repos(tmp_path)
    srv = start_server(
        ra,
        "--model-namespacing=true",
        f"--model-repository={rb}",
        "--model-control-mode=poll",
        "--repository-poll-secs=0.2",
    )
    assert infer_fp32(srv, "u", 1.0)[0] == 200
    identity(rb, "u")
    wait_until(
        lambda: (
            [(e["name"], e.get("state")) for e in index(srv) if e["name"] == "u"]
            == [("u", "READY"), ("u", "READY")]
        ),
        timeout=30,
        what="u loaded in both repositories",
        describe=lambda: str(index(srv)),
    )
    code, raw = post(srv, "/v2/models/u/infer", {"inputs": []})
    assert (code, error_text(raw)) == (400, AMBIGUOUS.replace("'m'", "'u'"))
