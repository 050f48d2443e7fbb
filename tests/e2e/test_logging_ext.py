"""The logging extension and tritonserver's --log-* flags (Triton 2.51's answers checked on
this machine; its 500/503 for client mistakes are 400 here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import error_text, grpc_client, grpc_status, post, request, wait_until
from tests.zoo import identity

DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


def test_logging_settings_read_update_and_take_effect(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    identity(repo, "a")
    identity(repo, "b")
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=a")
    code, raw = request(srv, "GET", "/v2/logging")
    assert code == 200 and json.loads(raw) == DEFAULTS
    assert "logging" in json.loads(srv.get("/v2")[1])["extensions"]
    # log_info false: the next load's info line is not written; true again: it is
    code, raw = post(srv, "/v2/logging", {"log_info": False, "bogus": 1})
    assert code == 200 and json.loads(raw) == {**DEFAULTS, "log_info": False}
    assert post(srv, "/v2/repository/models/b/load")[0] == 200
    assert post(srv, "/v2/logging", {"log_info": True, "log_format": "ISO8601"})[0] == 200
    assert post(srv, "/v2/repository/models/b/unload")[0] == 200
    assert post(srv, "/v2/repository/models/b/load")[0] == 200
    wait_until(lambda: srv.log().count("loaded 'b' version(s) [1]") == 1, what="the info line")
    line = next(x for x in srv.log().splitlines() if "loaded 'b' version(s) [1]" in x)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I sluice.manager\] loaded 'b'", line), line


@pytest.mark.parametrize(
    "body, status, phrase",
    [
        (
            {"log_file": "/tmp/x.log"},
            501,
            "log file location can not be updated through network protocol",
        ),
        ({"log_verbose_level": "x"}, 400, "'log_verbose_level' must be a non-negative integer"),
        ({"log_info": 1}, 400, "'log_info' must be a boolean"),
        ({"log_format": "xml"}, 400, "invalid argument for --log_format, got: xml"),
        ([1], 400, "the logging request JSON must be an object"),
    ],
)
def test_bad_logging_updates_are_refused_naming_the_field(
    tmp_path: Path, start_server, body, status, phrase
):
    repo = tmp_path / "repo"
    repo.mkdir()
    srv = start_server(repo)
    code, raw = post(srv, "/v2/logging", body)
    assert code == status, raw
    assert phrase in error_text(raw)
    assert json.loads(request(srv, "GET", "/v2/logging")[1]) == DEFAULTS


def test_log_file_and_format_flags(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    identity(repo, "a")
    log_file = tmp_path / "sluice.log"
    srv = start_server(repo, f"--log-file={log_file}", "--log-format=ISO8601", "--log-info=true")
    settings = json.loads(request(srv, "GET", "/v2/logging")[1])
    assert settings["log_file"] == str(log_file) and settings["log_format"] == "ISO8601"
    text = log_file.read_text()
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I sluice.manager\] loaded 'a'", text, re.M)


@pytest.mark.grpc
def test_grpc_log_settings(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    repo.mkdir()
    srv = start_server(repo)
    c = grpc_client(srv)
    try:
        got = c.get_log_settings(as_json=True)["settings"]
        assert got["log_info"] == {"bool_param": True}
        assert got["log_format"] == {"string_param": "default"}
        got = c.update_log_settings({"log_verbose_level": 2, "log_warning": False}, as_json=True)
        assert got["settings"]["log_verbose_level"] == {"uint32_param": 2}
        assert got["settings"]["log_warning"] == {"bool_param": False}
        with pytest.raises(InferenceServerException) as info:
            c.update_log_settings({"log_file": "/tmp/x.log"})
        assert grpc_status(info.value) == "StatusCode.UNIMPLEMENTED"
    finally:
        c.close()
    assert json.loads(request(srv, "GET", "/v2/logging")[1])["log_verbose_level"] == 2
