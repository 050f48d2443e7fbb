"""Unloading one python instance never removes another instance's shared memory.

Every python instance names its segments with a per-server serial (``sl<pid>_<serial>...``)
and removes them on stop by that prefix. Instance 1's prefix used to be a prefix of
instances 10-19's names, so unloading (or reloading) a model whose instance was number 1
unlinked the input arena of instance 1x while it served: its worker could not attach and
died on every request, restarted, and died again (found by ``bench/chaos.py``: a reload
under traffic left a model failing every request with "worker process N exited with code 1").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests import zoo
from tests.e2e.helpers import infer_fp32, post


def test_unloading_instance_1_leaves_instance_10_serving(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    zoo.identity(repo, "first", dims="[ 1 ]", extra="instance_group [ { count: 1 } ]")
    # instances 2-9 (only to advance the serial), then 'tenth' is instance 10
    zoo.identity(repo, "filler", dims="[ 1 ]", extra="instance_group [ { count: 8 } ]")
    zoo.identity(repo, "tenth", dims="[ 1 ]", extra="instance_group [ { count: 1 } ]")
    srv = start_server(repo, "--model-control-mode=explicit")
    for name in ("first", "filler", "tenth"):  # one at a time: the serials follow this order
        code, raw = post(srv, f"/v2/repository/models/{name}/load")
        assert code == 200, raw
    segments = {Path(p).name for p in srv.leftover_segments()}
    code, doc = infer_fp32(srv, "tenth", 5.0)  # its input arena exists from here on
    assert code == 200 and doc["outputs"][0]["data"] == [5.0], doc
    tenth = {Path(p).name for p in srv.leftover_segments()} - segments
    assert tenth, "the request created no segment"

    code, raw = post(srv, "/v2/repository/models/first/unload")
    assert code == 200, raw
    assert tenth <= {Path(p).name for p in srv.leftover_segments()}
    for x in (6.0, 7.0, 8.0):
        code, doc = infer_fp32(srv, "tenth", x)
        assert code == 200 and doc["outputs"][0]["data"] == [x], doc
    code, raw = srv.get("/v2/models/tenth/stats")
    stats = json.loads(raw)["model_stats"][0]["inference_stats"]
    assert (stats["success"]["count"], stats["fail"]["count"]) == (4, 0)
    assert "exited with code" not in srv.log()
