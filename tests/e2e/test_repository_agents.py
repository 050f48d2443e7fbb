"""Repository agents: ``model_repository_agents`` in config.pbtxt. The built-in ``checksum``
agent verifies each listed file (``MD5:<path>`` as Triton's checksum agent, ``SHA256:<path>``
too) at every load, with the agent's own refusal texts; an agent sluice does not have is
refused with Triton 2.51's text for a missing agent library (seen with it). The refused
model is UNAVAILABLE with the reason; the others keep serving."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import error_text, grpc_client, grpc_status, index_entries, infer_fp32, post
from tests.e2e.test_lint import lint_json
from tests.zoo import identity


def _agents(model_dir: Path, name: str, params: dict[str, str]) -> None:
    entries = ", ".join(f'{{ key: "{k}" value: "{v}" }}' for k, v in params.items())
    with open(model_dir / "config.pbtxt", "a") as f:
        f.write(
            f'\nmodel_repository_agents {{ agents [ {{ name: "{name}", '
            f"parameters [ {entries} ] }} ] }}\n"
        )


def _digest(path: Path, algorithm: str) -> str:
    return hashlib.new(algorithm, path.read_bytes()).hexdigest()


@pytest.fixture
def agents_server(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    identity(repo, "ok")
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=ok")
    return srv, repo


def _load(srv, name: str) -> tuple[int, str]:
    code, raw = post(srv, f"/v2/repository/models/{name}/load")
    return code, error_text(raw) if code != 200 else ""


def test_matching_md5_and_sha256_load_and_serve(agents_server) -> None:
    srv, repo = agents_server
    mdir = identity(repo, "sum")
    model_py = mdir / "1" / "model.py"
    md5 = _digest(model_py, "md5")
    _agents(
        mdir, "checksum", {"MD5:1/model.py": md5, "sha256:1/model.py": _digest(model_py, "sha256")}
    )
    assert _load(srv, "sum") == (200, "")
    assert infer_fp32(srv, "sum", 2.0)[0] == 200
    # the file changes under the same config: the reload is refused, the old load keeps serving
    model_py.write_text(model_py.read_text() + "\n# changed\n")
    code, text = _load(srv, "sum")
    assert code == 400
    assert text == (
        f"failed to load 'sum': Mismatched MD5 hash for file 1/model.py, expect: {md5}, "
        f"got: {_digest(model_py, 'md5')}"
    )
    assert infer_fp32(srv, "sum", 3.0)[0] == 200


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (
            {"SHA256:1/model.py": "00"},
            "Mismatched SHA256 hash for file 1/model.py, expect: 00, got: {sha256}",
        ),
        (
            {"MD5:1/missing.bin": "00"},
            "failed to open text file for read 1/missing.bin: No such file or directory",
        ),
        ({"SHA1:1/model.py": "00"}, "Unsupported checksum algorithm: SHA1"),
        ({"model.py": "00"}, "failed to parse key: model.py"),
        (
            {"MD5:../ok/1/model.py": "00"},
            "failed to open text file for read ../ok/1/model.py: the path leaves the model "
            "directory",
        ),
    ],
)
def test_checksum_refusals(agents_server, params: dict[str, str], expected: str) -> None:
    srv, repo = agents_server
    mdir = identity(repo, "bad")
    _agents(mdir, "checksum", params)
    code, text = _load(srv, "bad")
    want = "failed to load 'bad': " + expected.format(
        sha256=_digest(mdir / "1" / "model.py", "sha256")
    )
    # the agent's status: INVALID_ARG (400), UNSUPPORTED (501) for the algorithm
    assert (code, text) == (501 if "Unsupported" in expected else 400, want)
    (entry,) = index_entries(srv, "bad")
    assert entry["state"] == "UNAVAILABLE" and expected.split(":")[0] in entry["reason"]
    assert infer_fp32(srv, "ok", 1.0)[0] == 200


def test_unknown_agent_is_refused_with_triton_text(agents_server) -> None:
    srv, repo = agents_server
    _agents(identity(repo, "enc"), "decrypt", {"key": "v"})
    want = (
        "failed to load 'enc': unable to find 'libtritonrepoagent_decrypt.so' for repo agent "
        "'decrypt', searched: /opt/tritonserver/repoagents"
    )
    assert _load(srv, "enc") == (400, want)
    c = grpc_client(srv)
    try:
        with pytest.raises(InferenceServerException) as ei:
            c.load_model("enc")
        assert grpc_status(ei.value) == "StatusCode.INVALID_ARGUMENT"
        assert ei.value.message() == want
    finally:
        c.close()


def test_lint_finds_a_mismatch_and_an_unknown_agent(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    good = identity(repo, "good")
    _agents(good, "checksum", {"MD5:1/model.py": _digest(good / "1" / "model.py", "md5")})
    _agents(identity(repo, "bad"), "checksum", {"SHA256:1/model.py": "00"})
    _agents(identity(repo, "enc"), "decrypt", {"k": "v"})
    rc, found = lint_json(repo)
    assert rc == 1
    got = sorted((f["model"], f["check"], f["message"]) for f in found)
    sha = _digest(repo / "bad" / "1" / "model.py", "sha256")
    assert got == [
        (
            "bad",
            "repo-agent",
            f"Mismatched SHA256 hash for file 1/model.py, expect: 00, got: {sha}: the load fails",
        ),
        (
            "enc",
            "repo-agent",
            "unable to find 'libtritonrepoagent_decrypt.so' for repo agent 'decrypt', searched: "
            "/opt/tritonserver/repoagents: the load fails",
        ),
    ]
