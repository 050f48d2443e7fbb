"""Per-version load / unload and weighted traffic between versions, on HTTP
and gRPC (both edges), judged from answers, the index, statistics and metrics."""

from __future__ import annotations

import base64
import json
import re
import textwrap
import threading
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import (
    error_text,
    grpc_fp32_inputs,
    grpc_status,
    index_entries,
    infer_fp32,
    post,
    request,
    wait_until,
)
from tests.zoo import version_model_py, versioned_model

ALL = "version_policy: { all {} }"

# Version N answers INPUT0 + N. A negative input holds the request in execute() (after
# writing started-N into the marker directory) until the file "release" exists there.
HOLD_PY = """
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])
        params = json.loads(args["model_config"]).get("parameters", {})
        self.dir = params["marker_dir"]["string_value"]

    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if float(t.flat[0]) < 0:
                open(os.path.join(self.dir, "started-%d" % self.version), "w").close()
                while not os.path.exists(os.path.join(self.dir, "release")):
                    time.sleep(0.01)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t + self.version)]))
        return out
"""


def hold_model(repo: Path, name: str, versions: list[int], marker_dir: Path) -> Path:
    mdir = versioned_model(repo, name, versions, ALL)
    for v in versions:
        (mdir / str(v) / "model.py").write_text(textwrap.dedent(HOLD_PY))
    cfg = mdir / "config.pbtxt"
    cfg.write_text(
        cfg.read_text()
        + f'parameters {{ key: "marker_dir" value {{ string_value: "{marker_dir}" }} }}\n'
    )
    return mdir


# ----------------------------------------------------------------------------- helpers
def states(srv: Any, name: str) -> dict[str, tuple[str, str]]:
    return {
        e["version"]: (e.get("state", ""), e.get("reason", ""))
        for e in index_entries(srv, name)
        if "version" in e
    }


def ready_versions(srv: Any, name: str) -> list[str]:
    return sorted(v for v, (st, _) in states(srv, name).items() if st == "READY")


def answer(srv: Any, name: str, value: float, version: str | None = None) -> float:
    code, out = infer_fp32(srv, name, value, version)
    assert code == 200, out
    return float(out["outputs"][0]["data"][0])


def served_by(srv: Any, name: str, version: str | None = None) -> str:
    code, out = infer_fp32(srv, name, 0.0, version)
    assert code == 200, out
    assert out["model_version"] == str(int(out["outputs"][0]["data"][0])), out
    return str(out["model_version"])


def inference_count(srv: Any, name: str, version: str) -> int:
    code, raw = srv.get(f"/v2/models/{name}/versions/{version}/stats")
    assert code == 200, raw
    (st,) = json.loads(raw)["model_stats"]
    assert st["version"] == version
    return int(st["inference_count"])


def metric(srv: Any, family: str, name: str, version: str) -> float:
    text = srv.get("/metrics", port=srv.metrics_port)[1].decode()
    m = re.search(
        rf'^{family}\{{model="{name}",version="{version}"\}} (\S+)$', text, flags=re.MULTILINE
    )
    assert m is not None, f"no {family} series for {name} version {version}:\n{text}"
    return float(m.group(1))


def traffic(srv: Any, name: str) -> dict[str, Any]:
    code, raw = srv.get(f"/v2/repository/models/{name}/traffic")
    assert code == 200, raw
    return dict(json.loads(raw))


def set_traffic(srv: Any, name: str, weights: Any) -> tuple[int, bytes]:
    return post(srv, f"/v2/repository/models/{name}/traffic", {"weights": weights})


def vload(srv: Any, name: str, version: str, body: Any = None) -> tuple[int, bytes]:
    return post(srv, f"/v2/repository/models/{name}/versions/{version}/load", body)


def vunload(srv: Any, name: str, version: str, body: Any = None) -> tuple[int, bytes]:
    return post(srv, f"/v2/repository/models/{name}/versions/{version}/unload", body)


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    repo = module_repo
    versioned_model(repo, "v", [1, 2, 3])  # default policy: latest 1 -> version 3
    versioned_model(repo, "t", [1, 2], ALL)
    versioned_model(repo, "ov", [1, 2])
    versioned_model(repo, "grow", [1])
    markers = repo.parent / "markers"
    markers.mkdir()
    hold_model(repo, "hold", [1, 2], markers)
    server = module_server(
        repo, "--model-control-mode=explicit", "--load-model=v", "--load-model=t"
    )
    server.markers = markers  # type: ignore[attr-defined]
    return server


# ----------------------------------------------------------------------------- per version
def test_version_load_adds_and_unload_removes_one_version(srv):
    assert ready_versions(srv, "v") == ["3"]
    code, raw = vload(srv, "v", "1")
    assert (code, raw) == (200, b"")
    assert ready_versions(srv, "v") == ["1", "3"]
    assert answer(srv, "v", 10.0, "1") == 11.0
    assert answer(srv, "v", 10.0, "3") == 13.0
    assert answer(srv, "v", 10.0) == 13.0  # no split: the highest version, as Triton
    meta = json.loads(srv.get("/v2/models/v")[1])
    assert meta["versions"] == ["1", "3"]
    # unload version 3: version 1 keeps serving and is now the highest
    code, raw = vunload(srv, "v", "3")
    assert (code, raw) == (200, b"")
    assert states(srv, "v")["3"] == ("UNAVAILABLE", "unloaded")
    assert ready_versions(srv, "v") == ["1"]
    assert answer(srv, "v", 10.0) == 11.0
    code, out = infer_fp32(srv, "v", 10.0, "3")
    assert code == 404 and "version 3 is not found" in out["error"], out
    # unloading a version that is not serving (but exists) is already done
    assert vunload(srv, "v", "2") == (200, b"")
    # a plain load that changes nothing does nothing: the per-version set stays
    assert post(srv, "/v2/repository/models/v/load") == (200, b"")
    assert ready_versions(srv, "v") == ["1"]
    # the last serving version is not unloaded alone
    code, raw = vunload(srv, "v", "1")
    assert code == 400, raw
    assert "only serving version" in error_text(raw) and "/v2/repository/models/v/unload" in (
        error_text(raw)
    )
    # a whole-model unload, then a plain load: the version_policy again
    assert post(srv, "/v2/repository/models/v/unload") == (200, b"")
    assert post(srv, "/v2/repository/models/v/load") == (200, b"")
    assert ready_versions(srv, "v") == ["3"]


def test_version_load_refresh_keeps_statistics_and_per_version_stats(srv):
    assert vload(srv, "v", "2") == (200, b"")
    before = inference_count(srv, "v", "2")
    assert answer(srv, "v", 1.0, "2") == 3.0
    assert vload(srv, "v", "2") == (200, b"")  # a refresh: reloaded, stats cumulative
    assert answer(srv, "v", 1.0, "2") == 3.0
    assert inference_count(srv, "v", "2") == before + 2
    assert ready_versions(srv, "v") == ["2", "3"]
    assert vunload(srv, "v", "2") == (200, b"")


def test_new_version_directory_loaded_alone_then_plain_loads(srv):
    """A version added to the repository and loaded alone is not undone by a plain load; a
    change elsewhere in the model's files makes the plain load serve the policy again."""
    mdir = srv.repo / "grow"
    assert post(srv, "/v2/repository/models/grow/load") == (200, b"")
    assert ready_versions(srv, "grow") == ["1"]
    (mdir / "2").mkdir()
    (mdir / "2" / "model.py").write_text(textwrap.dedent(version_model_py(2)))
    assert vload(srv, "grow", "2") == (200, b"")
    assert ready_versions(srv, "grow") == ["1", "2"]
    assert post(srv, "/v2/repository/models/grow/load") == (200, b"")  # nothing else changed
    assert ready_versions(srv, "grow") == ["1", "2"]
    assert "nothing changed since it was loaded" in srv.log()
    cfg = mdir / "config.pbtxt"
    cfg.write_text(cfg.read_text() + "\n# edited\n")
    assert post(srv, "/v2/repository/models/grow/load") == (200, b"")  # a real reload
    assert ready_versions(srv, "grow") == ["2"]  # latest 1, the policy
    assert states(srv, "grow")["1"] == ("UNAVAILABLE", "unloaded")
    assert post(srv, "/v2/repository/models/grow/unload") == (200, b"")


@pytest.mark.parametrize(
    ("path", "code", "text"),
    [
        ("/v2/repository/models/v/versions/9/load", 404, "failed to load 'v' version 9"),
        ("/v2/repository/models/v/versions/9/unload", 404, "failed to unload 'v' version 9"),
        ("/v2/repository/models/nope/versions/1/load", 404, "failed to load 'nope'"),
        ("/v2/repository/models/nope/versions/1/unload", 404, "failed to unload 'nope'"),
        (
            "/v2/repository/models/v/versions/x/load",
            400,
            "failed to get model version from specified version string 'x'",
        ),
        (
            "/v2/repository/models/v/versions/01/unload",
            400,
            "failed to get model version from specified version string '01'",
        ),
        ("/v2/repository/models/..%2fv/versions/1/load", 400, "invalid model name"),
    ],
)
def test_version_control_errors(srv, path, code, text):
    got, raw = post(srv, path)
    assert got == code, raw
    assert text in error_text(raw), raw
    assert ready_versions(srv, "v") == ["3"]
    assert not index_entries(srv, "nope")


def test_version_load_parameters_are_checked(srv):
    code, raw = vload(srv, "v", "1", {"parameters": {"confg": "{}"}})
    assert code == 400 and "unknown load parameter(s) ['confg']" in error_text(raw), raw
    code, raw = vunload(srv, "v", "3", {"parameters": {"unload_dependents": True}})
    assert code == 400 and "'unload_dependents'" in error_text(raw), raw
    assert request(srv, "GET", "/v2/repository/models/v/versions/1/load")[0] == 405


def test_version_load_with_its_own_override(srv):
    """A config (and files) given to a per-version load apply to that version alone."""
    cfg = {
        "name": "ov",
        "backend": "python",
        "max_batch_size": 2,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
    }
    model_py = textwrap.dedent(version_model_py(20)).encode()
    assert post(srv, "/v2/repository/models/ov/load") == (200, b"")  # version 2 from the files
    code, raw = vload(
        srv,
        "ov",
        "1",
        {
            "parameters": {
                "config": json.dumps(cfg),
                "file:1/model.py": base64.b64encode(model_py).decode(),
            }
        },
    )
    assert (code, raw) == (200, b""), raw
    assert answer(srv, "ov", 1.0, "1") == 21.0  # the override's file
    assert answer(srv, "ov", 1.0, "2") == 3.0  # the repository's
    assert json.loads(srv.get("/v2/models/ov/versions/1/config")[1])["max_batch_size"] == 2
    assert json.loads(srv.get("/v2/models/ov/versions/2/config")[1])["max_batch_size"] == 8
    assert "+ 1)" in (srv.repo / "ov" / "1" / "model.py").read_text()  # untouched
    # a plain per-version load loads it the model's way again (the repository's files)
    assert vload(srv, "ov", "1") == (200, b"")
    assert answer(srv, "ov", 1.0, "1") == 2.0
    assert post(srv, "/v2/repository/models/ov/unload") == (200, b"")


def test_version_unload_drains_in_flight_while_the_other_version_serves(srv):
    markers: Path = srv.markers
    assert post(srv, "/v2/repository/models/hold/load") == (200, b"")
    assert ready_versions(srv, "hold") == ["1", "2"]
    held: dict[str, Any] = {}
    unloaded: dict[str, Any] = {}

    def hold() -> None:
        held["result"] = infer_fp32(srv, "hold", -1.0, "2", timeout=60)

    def unload() -> None:
        unloaded["result"] = vunload(srv, "hold", "2")

    t_hold = threading.Thread(target=hold)
    t_hold.start()
    wait_until(lambda: (markers / "started-2").exists(), what="the held request in execute()")
    t_unload = threading.Thread(target=unload)
    t_unload.start()
    try:
        wait_until(
            lambda: states(srv, "hold").get("2", ("", ""))[0] == "UNLOADING",
            what="version 2 UNLOADING (draining)",
        )
        # while version 2 drains: version 1 answers, with and without a version
        assert answer(srv, "hold", 5.0, "1") == 6.0
        assert answer(srv, "hold", 5.0) == 6.0
        code, out = infer_fp32(srv, "hold", 5.0, "2")  # no new request reaches version 2
        assert code == 404, out
        assert "result" not in held and "result" not in unloaded
    finally:
        (markers / "release").touch()
        t_hold.join(60)
        t_unload.join(60)
    code, out = held["result"]
    assert code == 200 and out["outputs"][0]["data"] == [1.0], out  # -1 + 2: it finished
    assert unloaded["result"] == (200, b"")
    assert states(srv, "hold")["2"] == ("UNAVAILABLE", "unloaded")
    assert ready_versions(srv, "hold") == ["1"]
    assert post(srv, "/v2/repository/models/hold/unload") == (200, b"")


# ----------------------------------------------------------------------------- traffic
def test_traffic_split_90_10_judged_from_statistics_and_metrics(srv):
    assert ready_versions(srv, "t") == ["1", "2"]
    assert traffic(srv, "t") == {"model": "t", "weights": {}}
    before = {v: inference_count(srv, "t", v) for v in ("1", "2")}
    code, raw = set_traffic(srv, "t", {"2": 10, "1": 90})
    assert code == 200, raw
    assert json.loads(raw) == {"model": "t", "weights": {"1": 90, "2": 10}}
    assert traffic(srv, "t") == {"model": "t", "weights": {"1": 90, "2": 10}}
    seen = [served_by(srv, "t") for _ in range(10)]
    assert sorted(seen) == ["1"] * 9 + ["2"], seen  # exactly 9:1 over 10 requests
    seen += [served_by(srv, "t") for _ in range(10)]
    assert seen.count("2") == 2, seen
    after = {v: inference_count(srv, "t", v) for v in ("1", "2")}
    assert (after["1"] - before["1"], after["2"] - before["2"]) == (18, 2)
    # both versions have their own series, agreeing with the statistics
    for v in ("1", "2"):
        assert metric(srv, "nv_inference_request_success", "t", v) == after[v]
        assert metric(srv, "nv_inference_count", "t", v) == after[v]
    # a request naming a version always gets it, whatever the split
    assert [served_by(srv, "t", "2") for _ in range(5)] == ["2"] * 5
    assert inference_count(srv, "t", "2") == after["2"] + 5
    # gRPC inference follows the same split
    assert set_traffic(srv, "t", {"1": 1, "2": 3})[0] == 200
    c = grpcclient.InferenceServerClient(srv.grpc)
    try:
        got = [c.infer("t", grpc_fp32_inputs(0.0)).get_response().model_version for _ in range(8)]
    finally:
        c.close()
    assert sorted(got) == ["1"] * 2 + ["2"] * 6, got
    # cleared: the highest version again
    code, raw = set_traffic(srv, "t", {})
    assert code == 200 and json.loads(raw) == {"model": "t", "weights": {}}, raw
    assert {served_by(srv, "t") for _ in range(4)} == {"2"}


def test_traffic_zero_weight_keeps_a_loaded_version_dark(srv):
    assert set_traffic(srv, "t", {"1": 0, "2": 5})[0] == 200
    assert {served_by(srv, "t") for _ in range(6)} == {"2"}
    assert traffic(srv, "t")["weights"] == {"1": 0, "2": 5}
    assert set_traffic(srv, "t", {})[0] == 200


@pytest.mark.parametrize(
    ("body", "code", "text"),
    [
        ({"weights": {"1": 50, "3": 50}}, 400, "version 3 is not READY"),
        ({"weights": {"1": -1, "2": 5}}, 400, "weight of version 1 must be a non-negative"),
        ({"weights": {"1": 1.5}}, 400, "weight of version 1 must be a non-negative integer"),
        ({"weights": {"1": True}}, 400, "weight of version 1"),
        ({"weights": {"1": 0, "2": 0}}, 400, "positive sum"),
        ({"weights": {"x": 1}}, 400, "version 'x' in 'weights'"),
        ({"weights": [1, 2]}, 400, "'weights' must be a JSON object"),
        ({"weight": {"1": 1}}, 400, "with 'weights'"),
        ("not json", 400, "failed to parse the traffic request JSON"),
    ],
)
def test_traffic_refuses_bad_splits_naming_the_field(srv, body, code, text):
    got, raw = post(srv, "/v2/repository/models/t/traffic", body)
    assert got == code, raw
    assert text in error_text(raw), raw
    assert traffic(srv, "t")["weights"] == {}


def test_traffic_of_unknown_or_unloaded_models(srv):
    code, raw = srv.get("/v2/repository/models/nope/traffic")
    assert code == 404 and "'nope'" in error_text(raw), raw
    code, raw = set_traffic(srv, "nope", {"1": 1})
    assert code == 404, raw
    # known but not loaded: no split; setting one names the version that is not READY
    assert traffic(srv, "hold") == {"model": "hold", "weights": {}}
    code, raw = set_traffic(srv, "hold", {"1": 1})
    assert code == 400 and "version 1 is not READY" in error_text(raw), raw
    assert request(srv, "PUT", "/v2/repository/models/t/traffic")[0] == 405


def test_unloading_a_version_in_the_split_is_refused_naming_the_split(srv):
    assert set_traffic(srv, "t", {"1": 90, "2": 10})[0] == 200
    code, raw = vunload(srv, "t", "2")
    assert code == 400, raw
    assert "weight 10 in the model's traffic split" in error_text(raw), raw
    assert '{"1": 90, "2": 10}' in error_text(raw), raw
    assert ready_versions(srv, "t") == ["1", "2"]
    # take it out of the split first, then it unloads; the split keeps the rest
    assert set_traffic(srv, "t", {"1": 100, "2": 0})[0] == 200
    assert vunload(srv, "t", "2") == (200, b"")
    assert traffic(srv, "t")["weights"] == {"1": 100}
    assert {served_by(srv, "t") for _ in range(3)} == {"1"}
    # a whole-model unload forgets the split
    assert post(srv, "/v2/repository/models/t/unload") == (200, b"")
    assert traffic(srv, "t")["weights"] == {}
    assert post(srv, "/v2/repository/models/t/load") == (200, b"")
    assert ready_versions(srv, "t") == ["1", "2"]


# ----------------------------------------------------------------------------- gRPC
@pytest.fixture(scope="module")
def grpc_srv(module_server, tmp_path_factory):
    """On the run's gRPC edge: native, then grpc.aio when scripts/run-tests runs the tests
    marked grpc again."""
    repo = tmp_path_factory.mktemp("grpc") / "repo"
    versioned_model(repo, "g", [1, 2, 3])
    return module_server(repo, "--model-control-mode=explicit", "--load-model=g")


def _traffic_call(channel: grpc.Channel, doc: Any) -> dict[str, Any]:
    call = channel.unary_unary("/sluice.Operations/ModelTraffic")
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return dict(json.loads(call(raw, timeout=30)))


@pytest.mark.grpc
def test_grpc_version_control_and_traffic(grpc_srv):
    srv = grpc_srv
    with grpc.insecure_channel(srv.grpc) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        # RepositoryModelLoad / Unload with the parameter "version" (int64 or string)
        req = pb.RepositoryModelLoadRequest(model_name="g")
        req.parameters["version"].int64_param = 1
        stub.RepositoryModelLoad(req, timeout=60)
        req = pb.RepositoryModelLoadRequest(model_name="g")
        req.parameters["version"].string_param = "2"
        stub.RepositoryModelLoad(req, timeout=60)
        assert ready_versions(srv, "g") == ["1", "2", "3"]
        ureq = pb.RepositoryModelUnloadRequest(model_name="g")
        ureq.parameters["version"].int64_param = 3
        ureq.parameters["unload_dependents"].bool_param = False  # as tritonclient sends it
        stub.RepositoryModelUnload(ureq, timeout=60)
        assert ready_versions(srv, "g") == ["1", "2"]
        assert states(srv, "g")["3"] == ("UNAVAILABLE", "unloaded")
        req = pb.RepositoryModelLoadRequest(model_name="g")
        req.parameters["version"].int64_param = 7
        with pytest.raises(grpc.RpcError) as ei:
            stub.RepositoryModelLoad(req, timeout=60)
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND
        assert "failed to load 'g' version 7" in str(ei.value.details())
        # traffic through sluice.Operations/ModelTraffic (JSON in, JSON out)
        assert _traffic_call(channel, {"model": "g"}) == {"model": "g", "weights": {}}
        out = _traffic_call(channel, {"model": "g", "weights": {"1": 3, "2": 1}})
        assert out == {"model": "g", "weights": {"1": 3, "2": 1}}
        assert traffic(srv, "g") == out  # the same split on HTTP
        c = grpcclient.InferenceServerClient(srv.grpc)
        try:
            got = [c.infer("g", grpc_fp32_inputs(0.0)).as_numpy("OUTPUT0") for _ in range(8)]
            pinned = c.infer("g", grpc_fp32_inputs(0.0), model_version="2")
        finally:
            c.close()
        values = sorted(float(np.asarray(a).flat[0]) for a in got)
        assert values == [1.0] * 6 + [2.0] * 2, values
        assert pinned.get_response().model_version == "2"
        for doc, code, text in (
            (b"{nope", grpc.StatusCode.INVALID_ARGUMENT, "failed to parse the ModelTraffic"),
            ({"weights": {}}, grpc.StatusCode.INVALID_ARGUMENT, "string 'model'"),
            ({"model": "g", "weights": {"3": 1}}, grpc.StatusCode.INVALID_ARGUMENT, "version 3"),
            ({"model": "nope"}, grpc.StatusCode.NOT_FOUND, "'nope'"),
        ):
            with pytest.raises(grpc.RpcError) as ei:
                _traffic_call(channel, doc)
            assert ei.value.code() == code, (doc, ei.value)
            assert text in str(ei.value.details()), (doc, ei.value.details())
        # the split refuses the unload of a version it sends traffic to
        ureq = pb.RepositoryModelUnloadRequest(model_name="g")
        ureq.parameters["version"].string_param = "2"
        with pytest.raises(grpc.RpcError) as ei:
            stub.RepositoryModelUnload(ureq, timeout=60)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "traffic split" in str(ei.value.details())
        assert _traffic_call(channel, {"model": "g", "weights": {}})["weights"] == {}
    # tritonclient's own unload keeps working (whole model)
    c = grpcclient.InferenceServerClient(srv.grpc)
    try:
        c.unload_model("g")
        with pytest.raises(InferenceServerException) as e2:
            c.infer("g", grpc_fp32_inputs(0.0))
        assert grpc_status(e2.value) == "StatusCode.NOT_FOUND"
    finally:
        c.close()
