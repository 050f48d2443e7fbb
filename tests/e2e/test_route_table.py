"""Access control and the audit log classify a request by the route that serves it (one table):
a path the router serves is never classified as another API group, or left out of the audit
log, because it is spelled with an empty version or a trailing slash."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.helpers import error_text, fp32_infer_body, post, request, wait_until
from tests.zoo import identity

RESTRICTED = "This API is restricted, expecting header 'admin-key'"
KEY = {"admin-key": "secret"}


def test_restricted_groups_hold_on_every_spelling_of_a_path(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    repo.mkdir()
    identity(repo, "identity")
    srv = start_server(repo, "--http-restricted-api=inference,statistics:admin-key=secret")
    infer = "/v2/models/identity/versions//infer"  # an empty version: the latest
    for method, path, body in (
        ("POST", infer, fp32_infer_body(1.5)),
        ("GET", "/v2/models/identity/versions//stats", None),
        ("GET", "/dashboard/data/", None),
    ):
        code, raw = request(srv, method, path, body)
        assert (code, json.loads(raw)) == (403, {"error": RESTRICTED}), (path, raw)
        code, raw = request(srv, method, path, body, headers=KEY)
        assert code == 200, (path, raw)
    code, raw = post(srv, infer, fp32_infer_body(1.5), headers=KEY)
    assert json.loads(raw)["outputs"][0]["data"] == [1.5]
    # the model's statistics counted the two inferences that were let through, no more
    code, raw = request(srv, "GET", "/v2/models/identity/stats", headers=KEY)
    assert code == 200, raw
    assert json.loads(raw)["model_stats"][0]["inference_stats"]["success"]["count"] == 2


def test_every_control_action_served_is_audited(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    repo.mkdir()
    identity(repo, "identity")
    audit = tmp_path / "audit.jsonl"
    srv = start_server(
        repo, "--model-control-mode=explicit", "--load-model=identity", f"--audit-log={audit}"
    )
    # a load of the model named "" (an empty segment): refused, and audited as a load
    code, raw = post(srv, "/v2/repository/models//load")
    assert code == 400, raw
    refusal = error_text(raw)
    # an unload spelled with a trailing slash: audited as the model's unload
    code, raw = post(srv, "/v2/repository/models/identity/unload/")
    assert code == 200, raw
    # a line is written once the answer is sent: wait for both
    wait_until(lambda: len(audit.read_text().splitlines()) >= 2, what="two audit lines")
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert sorted((x["action"], x["model"], x["version"], x["outcome"]) for x in lines) == [
        ("load", "", "", f"error: {refusal}"),
        ("unload", "identity", "", "ok"),
    ]
