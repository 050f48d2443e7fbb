"""Toy python models that call other models (BLS) or stream responses (decoupled)."""

from __future__ import annotations

from pathlib import Path

from tests.zoo import write_model

ADD_IO = """
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
        { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""

# OUTPUT0 = add_sub(INPUT0, INPUT1).OUTPUT0 through BLS; the request's parameters choose the
# target ("target", default add_sub) and a BLS timeout ("timeout_us"); a failed call fails
# the request with the BLS error's message.
BLS_PY = """
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            params = json.loads(request.parameters())
            call = pb_utils.InferenceRequest(
                model_name=params.get("target", "add_sub"),
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")],
                requested_output_names=["OUTPUT0"],
                timeout=int(params.get("timeout_us", 0)),
            )
            resp = call.exec()
            if resp.has_error():
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("BLS failed: " + resp.error().message())))
                continue
            t = pb_utils.get_output_tensor_by_name(resp, "OUTPUT0")
            pb_utils.Logger.log_info(f"bls called add_sub for {request.request_id()}")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t.as_numpy())]))
        return out
"""

# async execute: two BLS calls in flight at once, OUTPUT0 = (a + b) + (a + b)
BLS_ASYNC_PY = """
import asyncio
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                      pb_utils.get_input_tensor_by_name(request, "INPUT1")]
            calls = [pb_utils.InferenceRequest(model_name="add_sub", inputs=inputs,
                                               requested_output_names=["OUTPUT0"])
                     for _ in range(2)]
            r1, r2 = await asyncio.gather(*(c.async_exec() for c in calls))
            total = sum(pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy()
                        for r in (r1, r2))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)]))
        return out
"""

# OUT = the N responses of "repeat" (decoupled BLS), collected into one tensor
BLS_DECOUPLED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="repeat", inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                requested_output_names=["OUT"])
            values = []
            for resp in call.exec(decoupled=True):
                if resp.has_error():
                    raise pb_utils.TritonModelException(resp.error().message())
                t = pb_utils.get_output_tensor_by_name(resp, "OUT")
                if t is not None:
                    values.append(int(t.as_numpy()[0]))
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array(values or [-1], dtype=np.int32))]))
        return out
"""

# OUTPUT0 = identity(INPUT0) through BLS, any size (large tensors travel in shared memory)
BLS_BIG_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="identity", inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0")],
                requested_output_names=["OUTPUT0"])
            resp = call.exec()
            if resp.has_error():
                raise pb_utils.TritonModelException(resp.error().message())
            t = pb_utils.get_output_tensor_by_name(resp, "OUTPUT0")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t.as_numpy() * 2)]))
        return out
"""

# decoupled: IN=n -> n responses OUT=[i] from execute (or from a thread: "thread" in the
# request parameters), then the final flag alone; n == 99 sends an error response midway,
# n == 666 kills the worker after one response
REPEAT_PY = """
import json
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            if json.loads(request.parameters()).get("thread"):
                threading.Thread(target=self._send, args=(sender, n)).start()
            else:
                self._send(sender, n)
        return None

    def _send(self, sender, n):
        if n == 666:  # one response, then the worker dies
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([0], dtype=np.int32))]))
            import os
            os._exit(1)
        for i in range(min(n, 5) if n == 99 else n):
            if n == 99 and i == 2:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("bad step 2")))
                continue
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# decoupled: one response per word of text_input; "marker" in the parameters: send words
# slowly until the client goes away, then write that file
TEXT_STREAM_PY = """
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            words = text.reshape(-1)[0].decode().split()
            sender = request.get_response_sender()
            marker = json.loads(request.parameters()).get("marker")
            if marker:
                for i in range(400):
                    if sender.is_cancelled():
                        open(marker, "w").write(str(i))
                        break
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor(
                        "text_output", np.array([b"tick"], dtype=np.object_))]))
                    time.sleep(0.05)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for w in words:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor(
                    "text_output", np.array([w.encode()], dtype=np.object_))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# request parameters back as response parameters (InferenceResponse(parameters=...), which
# Triton 2.51's python backend does not have yet), plus the request API's views of them
PARAMS_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            params = json.loads(request.parameters())
            params["requested"] = ",".join(request.requested_output_names())
            params["flags"] = request.flags()
            params["correlation_id"] = request.correlation_id()
            t = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", t.as_numpy())], parameters=params))
        return out
"""

# not decoupled: text_output = text_input upper-cased, count = its length
ECHO_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            t = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", np.array([t[0].upper()], dtype=np.object_)),
                pb_utils.Tensor("count", np.array([len(t[0])], dtype=np.int32))]))
        return out
"""


def bls(repo: Path, name: str = "bls_add", source: str = BLS_PY) -> Path:
    return write_model(
        repo, name, f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n{ADD_IO}', source
    )


def bls_decoupled(repo: Path, name: str = "bls_repeat") -> Path:
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }} ]
        output [ {{ name: "OUT", data_type: TYPE_INT32, dims: [ -1 ] }} ]
        """,
        BLS_DECOUPLED_PY,
    )


def repeat(repo: Path, name: str = "repeat") -> Path:
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        model_transaction_policy {{ decoupled: true }}
        input [ {{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }} ]
        output [ {{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
        """,
        REPEAT_PY,
    )


def text_stream(repo: Path, name: str = "text_stream") -> Path:
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        model_transaction_policy {{ decoupled: true }}
        input [ {{ name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] }} ]
        output [ {{ name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] }} ]
        """,
        TEXT_STREAM_PY,
    )


def echo(repo: Path, name: str = "echo") -> Path:
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] }},
                {{ name: "n", data_type: TYPE_INT32, dims: [ 1 ], optional: true }} ]
        output [ {{ name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] }},
                 {{ name: "count", data_type: TYPE_INT32, dims: [ 1 ] }} ]
        """,
        ECHO_PY,
    )
