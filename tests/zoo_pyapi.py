"""Toy python models for the custom-metrics and model-loading tests.

``probe``: runs the python statements of its BYTES input ``CODE`` in a namespace that lives
as long as its worker (``S`` is a dict kept between requests, ``pb_utils`` is imported) and
answers ``OUT``: ``repr(R)`` or ``EXC <type name>: <message>``. The tests use it to call the
pb_utils API exactly as a model does and to read its exact errors.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from tests.zoo import write_model

__all__ = ["probe", "run", "custom_lines", "scrape", "PROBE_PY", "loader", "plain"]

PROBE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

S = {}


def run(code):
    g = {"pb_utils": pb_utils, "S": S, "np": np}
    try:
        exec(compile(code, "<probe>", "exec"), g)
        return repr(g.get("R"))
    except BaseException as e:
        return "EXC %s: %s" % (type(e).__name__, e)


class TritonPythonModel:
    def initialize(self, args):
        S["args"] = args
        INIT_CODE

    def execute(self, requests):
        out = []
        for r in requests:
            code = pb_utils.get_input_tensor_by_name(r, "CODE").as_numpy().reshape(-1)[0]
            res = run(code.decode())
            t = pb_utils.Tensor("OUT", np.array([res.encode()], dtype=np.object_))
            out.append(pb_utils.InferenceResponse([t]))
        return out
"""

PROBE_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "CODE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: {count} }} ]
"""

PLAIN_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""

PLAIN_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        INIT_CODE

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]

    FINALIZE
"""


def probe(repo: Path, name: str = "probe", count: int = 1, init_code: str = "pass") -> Path:
    """The probe model (``count`` instances; ``init_code`` runs at the end of initialize)."""
    return write_model(
        repo,
        name,
        PROBE_CONFIG.format(name=name, count=count),
        PROBE_PY.replace("INIT_CODE", init_code),
    )


def plain(repo: Path, name: str, init_code: str = "pass", finalize: str = "") -> Path:
    """An identity model (X -> Y); ``init_code`` runs in initialize, ``finalize`` is the
    body of a finalize method (none when empty)."""
    fin = f"def finalize(self):\n        {finalize}" if finalize else ""
    return write_model(
        repo,
        name,
        PLAIN_CONFIG.format(name=name),
        PLAIN_PY.replace("INIT_CODE", init_code).replace("FINALIZE", fin),
    )


def loader(repo: Path, name: str, target: str, record: Path) -> Path:
    """A model whose initialize loads ``target`` and writes what came of it to ``record``
    (``ok <is_model_ready>`` or ``EXC <type>: <message>``)."""
    code = (
        "try:\n"
        f"            pb_utils.load_model({target!r})\n"
        f"            res = 'ok ' + repr(pb_utils.is_model_ready({target!r}))\n"
        "        except Exception as e:\n"
        "            res = 'EXC %s: %s' % (type(e).__name__, e)\n"
        f"        open({str(record)!r}, 'a').write(res + '\\n')"
    )
    return plain(repo, name, init_code=code)


def run(srv: Any, code: str, model: str = "probe") -> str:
    """Run ``code`` in the probe model; its answer."""
    body = json.dumps(
        {"inputs": [{"name": "CODE", "datatype": "BYTES", "shape": [1], "data": [code]}]}
    ).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{srv.http_port}/v2/models/{model}/infer",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return str(json.loads(resp.read())["outputs"][0]["data"][0])


def scrape(srv: Any) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=30) as r:
        return r.read().decode()


def custom_lines(srv: Any) -> list[str]:
    """The metrics page's lines that are not the server's own (``nv_*``, ``sluice_*``)
    families."""
    own = tuple(f"{p}{n}" for p in ("", "# HELP ", "# TYPE ") for n in ("nv_", "sluice_"))
    return [line for line in scrape(srv).splitlines() if line and not line.startswith(own)]
