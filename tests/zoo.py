"""A zoo of toy Triton python-backend models, written into a temporary repository by tests."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "model_repo"


def copy_example(repo: Path, name: str) -> Path:
    shutil.copytree(EXAMPLES / name, repo / name)
    return repo / name


def write_model(repo: Path, name: str, config: str, model_py: str | None, version: int = 1) -> Path:
    mdir = repo / name
    (mdir / str(version)).mkdir(parents=True, exist_ok=True)
    (mdir / "config.pbtxt").write_text(textwrap.dedent(config))
    if model_py is not None:
        (mdir / str(version) / "model.py").write_text(textwrap.dedent(model_py))
    return mdir


IDENTITY_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t.as_numpy())]))
        return out
"""


def identity(
    repo: Path,
    name: str = "identity",
    dtype: str = "TYPE_FP32",
    dims: str = "[ -1 ]",
    max_batch_size: int = 8,
    extra: str = "",
) -> Path:
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT0", data_type: {dtype}, dims: {dims} }} ]
        output [ {{ name: "OUTPUT0", data_type: {dtype}, dims: {dims} }} ]
        {extra}
        """,
        IDENTITY_PY,
    )


SLEEP_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        import json
        params = json.loads(args["model_config"]).get("parameters", {})
        self.ms = float(params.get("sleep_ms", {}).get("string_value", "50"))

    def execute(self, requests):
        time.sleep(self.ms / 1000.0)
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t)]))
        return out
"""


def sleep_model(
    repo: Path,
    name: str = "sleep",
    ms: int = 50,
    count: int = 1,
    max_batch_size: int = 8,
    extra: str = "",
) -> Path:
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
        parameters {{ key: "sleep_ms" value: {{ string_value: "{ms}" }} }}
        {extra}
        """,
        SLEEP_PY,
    )


# Holds every execute until the file named by its "gate" parameter exists (the test creates
# it once the server's state says what it waits for): no timing involved.
GATE_PY = """
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        import json
        self.gate = json.loads(args["model_config"])["parameters"]["gate"]["string_value"]

    def execute(self, requests):
        while not os.path.exists(self.gate):
            time.sleep(0.005)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy())])
            for r in requests]
"""


def gated_model(
    repo: Path, name: str, gate: Path, max_batch_size: int = 0, extra: str = ""
) -> Path:
    """An FP32 [1] echo (INPUT -> OUTPUT) on one instance that waits for ``gate``."""
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        {extra}
        input [ {{ name: "INPUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        instance_group [ {{ count: 1, kind: KIND_CPU }} ]
        parameters {{ key: "gate" value: {{ string_value: "{gate}" }} }}
        """,
        GATE_PY,
    )


FAIL_PY = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            v = float(x.reshape(-1)[0])
            if v == 13:
                raise ValueError("unlucky input 13")
            if v == 666:
                os._exit(3)
            if v < 0:
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input not allowed")))
                continue
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


def fail_model(repo: Path, name: str = "faulty") -> Path:
    """INPUT0 == 13 raises, == 666 kills the worker, < 0 returns a per-request error."""
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        """,
        FAIL_PY,
    )


def broken_config(repo: Path, name: str = "broken") -> Path:
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dimz: [ 1 ] }} ]
        """,
        IDENTITY_PY,
    )


# --- helpers added for tests/e2e (append only) ---------------------------------------------

SLOW_INIT_PY = """
import json
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        time.sleep(float(params.get("init_sleep_s", {}).get("string_value", "2")))

    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t)]))
        return out
"""


def slow_init_model(
    repo: Path, name: str = "slow_init", init_s: float = 2.0, max_batch_size: int = 8
) -> Path:
    """Identity FP32 [1] model whose initialize() sleeps ``init_s`` seconds."""
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        parameters {{ key: "init_sleep_s" value: {{ string_value: "{init_s}" }} }}
        """,
        SLOW_INIT_PY,
    )


INIT_FAIL_PY = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("init exploded")

    def execute(self, requests):
        return []
"""


def init_fail_model(repo: Path, name: str = "init_fail") -> Path:
    """A model whose initialize() raises ``RuntimeError("init exploded")``."""
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        """,
        INIT_FAIL_PY,
    )


# A model that reads a file beside its model.py (offset.txt in its version directory, as
# Triton's python models read their own files) and answers INPUT0 + that offset (FP32).
READS_OFFSET_PY = """
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        here = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(here, "offset.txt")) as f:
            self.offset = float(f.read())

    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t + self.offset)]))
        return out
"""


def version_model_py(version: int) -> str:
    """Adds ``version`` to INPUT0 (FP32), so a response tells which version served it."""
    return f"""
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t + {version})]))
        return out
"""


def versioned_model(repo: Path, name: str, versions: list[int], policy: str = "") -> Path:
    """FP32 [1] model with one dir per version; version N answers INPUT0 + N."""
    mdir = repo / name
    for v in versions:
        (mdir / str(v)).mkdir(parents=True, exist_ok=True)
        (mdir / str(v) / "model.py").write_text(textwrap.dedent(version_model_py(v)))
    (mdir / "config.pbtxt").write_text(
        textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        {policy}
        """)
    )
    return mdir


def fail_model_batched(repo: Path, name: str = "faulty_batched", delay_us: int = 300000) -> Path:
    """``fail_model`` with dynamic batching: concurrent requests reach execute() together."""
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
        """,
        FAIL_PY,
    )


# Each execute first writes "<marks>/entered-<worker pid>-<n>", then waits for the file "gate":
# a test sees which instances are inside execute at the same time from the files alone.
MARK_GATE_PY = """
import itertools
import json
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.gate = params["gate"]["string_value"]
        self.marks = params["marks"]["string_value"]
        self.n = itertools.count()

    def execute(self, requests):
        name = "entered-%d-%d" % (os.getpid(), next(self.n))
        open(os.path.join(self.marks, name), "w").close()
        while not os.path.exists(self.gate):
            time.sleep(0.005)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""


def marking_gated_model(repo: Path, name: str, gate: Path, marks: Path, count: int = 1) -> Path:
    """An FP32 [1] echo (INPUT0 -> OUTPUT0, max_batch_size 8, no dynamic batching) on ``count``
    instances: each execute writes ``marks/entered-<pid>-<n>``, then waits for ``gate``."""
    marks.mkdir(parents=True, exist_ok=True)
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
        parameters {{ key: "gate" value: {{ string_value: "{gate}" }} }}
        parameters {{ key: "marks" value: {{ string_value: "{marks}" }} }}
        """,
        MARK_GATE_PY,
    )


# Each execute appends "<start ns> <end ns>\n" (CLOCK_MONOTONIC, one clock for every process of
# the machine) to the file named by its "spans" parameter, so the executions of several models
# can be laid on one time line; it holds until its "gate" file exists (when one is named), then
# sleeps "sleep_ms".
SPANS_PY = """
import json
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.ms = float(params["sleep_ms"]["string_value"])
        self.gate = params["gate"]["string_value"]
        self.fd = os.open(params["spans"]["string_value"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def execute(self, requests):
        start = time.monotonic_ns()
        while self.gate and not os.path.exists(self.gate):
            time.sleep(0.002)
        time.sleep(self.ms / 1000.0)
        out = [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
        os.write(self.fd, f"{start} {time.monotonic_ns()}\\n".encode())
        return out

    def finalize(self):
        os.close(self.fd)
"""


def span_recording_model(
    repo: Path,
    name: str,
    spans: Path,
    sleep_ms: float = 1.0,
    gate: Path | None = None,
    instance_extra: str = "",
) -> Path:
    """An FP32 [1] echo (max_batch_size 0: one request per execution) on one CPU instance that
    records each execution's [start, end] in ``spans`` (see SPANS_PY); ``instance_extra`` goes
    into its instance group (``rate_limiter { ... }``)."""
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        instance_group [ {{ count: 1, kind: KIND_CPU {instance_extra} }} ]
        parameters {{ key: "sleep_ms" value: {{ string_value: "{sleep_ms}" }} }}
        parameters {{ key: "gate" value: {{ string_value: "{gate or ""}" }} }}
        parameters {{ key: "spans" value: {{ string_value: "{spans}" }} }}
        """,
        SPANS_PY,
    )


def read_spans(path: Path) -> list[tuple[int, int]]:
    """The [start, end] pairs a span-recording model wrote, in order."""
    if not path.exists():
        return []
    return [(int(a), int(b)) for a, b in (line.split() for line in path.read_text().splitlines())]
