"""Python-backend stand-ins for the models that Triton's client examples expect.

The examples of the Triton client repository talk to models named ``simple`` (INT32 add/sub,
16 elements, max_batch_size 8), ``simple_string`` (the same on BYTES holding decimal
numbers), ``simple_int8``, ``simple_identity`` (BYTES identity), ``simple_sequence``
(a sequence's first request answers its value + 1) and ``repeat_int32`` (decoupled: one response per element).
These are written here from what the examples send and check, as python models.
"""

from __future__ import annotations

from pathlib import Path

from tests.zoo import write_model

__all__ = ["write_example_models", "add_sub_config", "ADD_SUB_PY", "EXAMPLE_MODELS"]

ADD_SUB_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


def _numbers(t):
    return np.array([int(x) for x in t.flat], dtype=np.int64).reshape(t.shape)


def _text(a):
    return np.array([str(int(x)).encode() for x in a.flat], dtype=object).reshape(a.shape)


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            if a.dtype == object:
                x, y = _numbers(a), _numbers(b)
                s, d = _text(x + y), _text(x - y)
            else:
                s, d = a + b, a - b
            out.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", s), pb_utils.Tensor("OUTPUT1", d)]
                )
            )
        return out
"""

IDENTITY_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
            )
            for r in requests
        ]
"""

# What the examples check of simple_sequence: the first request of a sequence answers its
# value + 1, the others their value. It also counts the requests of each live sequence (id int
# or string) and fails a request that arrives for a sequence it never saw start.
SEQUENCE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = {}

    def execute(self, requests):
        out = []
        for r in requests:
            cid = r.correlation_id()
            start = pb_utils.get_input_tensor_by_name(r, "START").as_numpy().item()
            end = pb_utils.get_input_tensor_by_name(r, "END").as_numpy().item()
            value = int(pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy().item())
            if not start and cid not in self.seen:
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"sequence {cid!r} was not started here")))
                continue
            self.seen[cid] = 1 if start else self.seen[cid] + 1
            if end:
                self.seen.pop(cid)
            out.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT", np.array([[value + (1 if start else 0)]], dtype=np.int32))]
                )
            )
        return out
"""

# Decoupled: IN holds values; one response per value (OUT, IDX), then the final flag alone.
# DELAY and WAIT (the examples send them) are accepted and not acted on.
REPEAT_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        assert pb_utils.using_decoupled_model_transaction_policy(auto_complete_model_config.as_dict())
        return auto_complete_model_config

    def initialize(self, args):
        import json
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(
            json.loads(args["model_config"])
        )

    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().reshape(-1)
            for i, v in enumerate(values):
                sender.send(
                    pb_utils.InferenceResponse(
                        [
                            pb_utils.Tensor("OUT", np.array([v], dtype=np.int32)),
                            pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32)),
                        ]
                    )
                )
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def add_sub_config(name: str, data_type: str) -> str:
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [
          {{ name: "INPUT0" data_type: {data_type} dims: [ 16 ] }},
          {{ name: "INPUT1" data_type: {data_type} dims: [ 16 ] }}
        ]
        output [
          {{ name: "OUTPUT0" data_type: {data_type} dims: [ 16 ] }},
          {{ name: "OUTPUT1" data_type: {data_type} dims: [ 16 ] }}
        ]
    """


SEQUENCE_CONFIG = """
    name: "simple_sequence"
    backend: "python"
    max_batch_size: 8
    sequence_batching {
      max_sequence_idle_microseconds: 5000000
      control_input [
        { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
        { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }
      ]
    }
    input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

REPEAT_CONFIG = """
    name: "repeat_int32"
    backend: "python"
    max_batch_size: 0
    model_transaction_policy { decoupled: true }
    input [
      { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
      { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
      { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
    ]
    output [
      { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
      { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
    ]
"""

EXAMPLE_MODELS = (
    "simple",
    "simple_string",
    "simple_int8",
    "simple_identity",
    "simple_sequence",
    "repeat_int32",
)


def write_example_models(repo: Path, names: tuple[str, ...] = EXAMPLE_MODELS) -> None:
    """Write the chosen example models into ``repo``."""
    for name in names:
        if name == "simple":
            write_model(repo, name, add_sub_config(name, "TYPE_INT32"), ADD_SUB_PY)
        elif name == "simple_string":
            write_model(repo, name, add_sub_config(name, "TYPE_STRING"), ADD_SUB_PY)
        elif name == "simple_int8":
            write_model(repo, name, add_sub_config(name, "TYPE_INT8"), ADD_SUB_PY)
        elif name == "simple_identity":
            config = """
                name: "simple_identity"
                backend: "python"
                max_batch_size: 8
                input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
                output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
            """
            write_model(repo, name, config, IDENTITY_PY)
        elif name == "simple_sequence":
            write_model(repo, name, SEQUENCE_CONFIG, SEQUENCE_PY)
        elif name == "repeat_int32":
            write_model(repo, name, REPEAT_CONFIG, REPEAT_PY)
        else:
            raise ValueError(f"no example model named {name!r}")
