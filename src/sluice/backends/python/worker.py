"""The worker process: loads one Triton python model instance and serves execute calls.

Rules of this file:
- A plain blocking loop: receive a message, answer it. No asyncio, no threads, nothing about
  HTTP or gRPC.
- Top-level imports stay light (no numpy): the thread-count variables in ``WorkerSetup.env``
  are set before numpy (and so OpenBLAS / OpenMP) is first imported. (A worker forked by the
  fork server, ``zygote.py``, finds numpy imported there with the default variables: only
  workers with those are forked.)
- A model's failure never kills the loop: an exception in ``execute`` becomes an error for
  every request of that batch; a bad response becomes an error for its request.
- A model's ``is_ready()`` runs on a thread of its own (started only for models that define
  it), so a readiness check is answered while ``execute`` runs, as in Triton's stub. Its
  answer must be a bool (``async def`` too); anything else, or an exception, is not ready,
  with why.
- The loop ends on ``Stop`` (after ``finalize``) or when the server's end of the pipe closes
  (the server died): then the worker removes its shared-memory segments and exits.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from types import ModuleType
from typing import Any

from ...host.gcsettings import tune_gc
from .messages import (
    OK,
    RESCHEDULED,
    WITHDRAWN,
    AutoCompleteReply,
    Execute,
    ExecuteReply,
    InitFailed,
    Ready,
    ReadyAnswer,
    ResultRef,
    Stop,
    Stopped,
    TensorRef,
    WorkerSetup,
    encode,
)
from .runtime import KSERVE_BY_CODE as _KSERVE_BY_CODE
from .runtime import Channel, Runtime

__all__ = ["worker_main", "load_pb_utils", "format_failure"]

_RESCHEDULE = 2  # pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
_PB_UTILS_FILE = Path(__file__).resolve().parent / "pb_utils.py"


def load_pb_utils() -> ModuleType:
    """Import our ``triton_python_backend_utils`` under that exact top-level name.

    Loaded by path so the worker does not import ``sluice.backends`` (and the protobuf / grpc
    modules the server side pulls in there).
    """
    existing = sys.modules.get("triton_python_backend_utils")
    if existing is not None:
        return existing
    spec = importlib.util.spec_from_file_location("triton_python_backend_utils", _PB_UTILS_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["triton_python_backend_utils"] = module
    sys.modules["sluice.backends.python.pb_utils"] = module
    spec.loader.exec_module(module)
    return module


def format_failure(exc: BaseException, model_file: str) -> str:
    """``<last traceback line> (<file>:<line> in <function>)`` naming the model's frame."""
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename == model_file:
            where = f" ({frame.filename}:{frame.lineno} in {frame.name})"
            break
    if not where and isinstance(exc, SyntaxError) and exc.filename:
        where = f" ({exc.filename}:{exc.lineno})"
    return last + where


def _import_model(setup: WorkerSetup) -> Any:
    # Triton's stub imports model.py with its version directory importable, so helper
    # modules next to model.py resolve.
    if setup.version_dir not in sys.path:
        sys.path.insert(0, setup.version_dir)
    spec = importlib.util.spec_from_file_location("model", setup.model_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {setup.model_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    cls = getattr(module, "TritonPythonModel", None)
    if cls is None:
        raise AttributeError(f"{setup.model_file} does not define class TritonPythonModel")
    return cls


def worker_main(rx: Connection, tx: Connection, setup: WorkerSetup) -> None:
    """Entry point of the worker process (spawned, or forked by the fork server): ``rx``
    brings messages, ``tx`` takes replies.

    Two one-way pipes rather than one duplex socketpair: a pipe round trip is ~10-20 us
    cheaper (measured with uvloop on the 2-core dev box).
    """
    for key, value in setup.env:
        os.environ[key] = value
    # The server handles Ctrl-C and stops workers in order; a stray SIGINT from the
    # terminal's process group must not kill models mid-batch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # pb_utils.Logger lines join the server's log (the worker shares its stderr)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname).1s %(name)s] %(message)s"
    )
    pb_utils = load_pb_utils()
    if setup.mode == "auto_complete":
        _auto_complete(tx, setup, pb_utils)
        return
    _Worker(rx, tx, setup, pb_utils).run()


def _auto_complete(conn: Connection, setup: WorkerSetup, pb_utils: ModuleType) -> None:
    import json

    pb_utils._PHASE = "auto_complete_config"  # type: ignore[attr-defined]
    try:
        cls = _import_model(setup)
        cfg = pb_utils.ModelConfig(setup.config_json)
        fn = getattr(cls, "auto_complete_config", None)
        if fn is not None:
            result = fn(cfg)
            if result is not None:
                cfg = result
        conn.send_bytes(encode(AutoCompleteReply(0, json.dumps(cfg.as_dict()))))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the server
        traceback.print_exc()
        conn.send_bytes(encode(InitFailed(0, format_failure(exc, setup.model_file))))
    finally:
        conn.close()


class _Worker:
    def __init__(
        self, rx: Connection, tx: Connection, setup: WorkerSetup, pb_utils: ModuleType
    ) -> None:
        import json

        from .shm import ArenaReader, ArenaWriter

        self.channel = Channel(rx, tx)
        self.rx = rx
        self.tx = tx
        self.setup = setup
        self.pb = pb_utils
        # One (input reader, output writer) pair per lane of Execute (a batch handed over
        # while the one before runs uses the other lane: its outputs must not overwrite those
        # the server has not copied yet). An arena is made at its first write.
        # The pid keeps a restarted worker's names apart from a dead predecessor's.
        self.readers = (ArenaReader(), ArenaReader())
        self.writers = tuple(
            ArenaWriter(
                setup.shm_prefix,
                f"o{os.getpid()}_{lane}_",
                setup.shm_default_byte_size,
                setup.shm_growth_byte_size,
            )
            for lane in (0, 1)
        )
        self.model: Any = None
        self.orphaned = False
        # KServe datatype <-> Triton data type code (pb_utils.Tensor.triton_dtype()).
        self._code_of = {name: code for code, name in enumerate(_KSERVE_BY_CODE) if code}
        config = json.loads(setup.config_json)
        self.decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled"))
        self.runtime = Runtime(self.channel, pb_utils, setup.shm_prefix, self.decoupled)
        pb_utils._RUNTIME = self.runtime  # type: ignore[attr-defined]
        self.runtime.instance_name = setup.instance_name
        pb_utils.Logger._log = logging.getLogger(f"sluice.model.{setup.model_name}")
        self._aloop: Any = None  # an event loop for ``async def execute``, made on first use
        self._checked_fn: Any = None  # the execute function last asked whether it is async
        self._is_async = False

    def run(self) -> None:
        setup = self.setup
        try:
            cls = _import_model(setup)
            self.model = cls()
            init = getattr(self.model, "initialize", None)
            if init is not None:
                init(
                    {
                        "model_config": setup.config_json,
                        "model_instance_kind": setup.instance_kind,
                        "model_instance_name": setup.instance_name,
                        "model_instance_device_id": str(setup.device_id),
                        "model_repository": setup.model_dir,
                        "model_version": str(setup.model_version),
                        "model_name": setup.model_name,
                    }
                )
        except BaseException as exc:  # noqa: BLE001 - reported to the server, then exit
            traceback.print_exc()
            self.channel.send(InitFailed(0, format_failure(exc, setup.model_file)))
            self._cleanup()
            return
        tune_gc()  # the model as initialized is frozen; requests collect less often
        has_is_ready = callable(getattr(self.model, "is_ready", None))
        self.channel.send(Ready(0, os.getpid(), has_is_ready))
        if has_is_ready:
            import threading

            threading.Thread(
                target=self._readiness_loop, name="sluice-is-ready", daemon=True
            ).start()
        try:
            self._loop()
        finally:
            self._cleanup()

    def _loop(self) -> None:
        next_command, send = self.channel.next_command, self.channel.send
        while True:
            try:
                msg = next_command()
            except EOFError:
                # The server is gone: nobody will send Stop. Finalize and leave.
                self.orphaned = True
                self._finalize()
                return
            if type(msg) is Execute:
                reply = self._execute(msg)
                try:
                    send(reply)
                except OSError:  # BrokenPipeError: the server died while this one ran
                    self.orphaned = True
                    self._finalize()
                    return
            elif type(msg) is Stop:
                self._finalize()
                send(Stopped(msg.id))
                return

    def _readiness_loop(self) -> None:
        """Answer the server's readiness checks with the model's ``is_ready()``."""
        loop: Any = None  # an event loop for ``async def is_ready``, this thread's own
        while True:
            try:
                check = self.channel.next_check()
            except EOFError:
                return
            ready, error = False, ""
            try:
                result = self.model.is_ready()
                if inspect.isawaitable(result):
                    if loop is None:
                        import asyncio

                        loop = asyncio.new_event_loop()
                    result = loop.run_until_complete(result)
                if type(result) is bool:
                    ready = result
                else:
                    error = "is_ready() must return a boolean value"
            except Exception as exc:
                error = format_failure(exc, self.setup.model_file)
            if error:
                print(f"model '{self.setup.model_name}' is_ready(): {error}", file=sys.stderr)
            try:
                self.channel.send(ReadyAnswer(check.id, ready, error))
            except OSError:
                return

    def _call_execute(self, requests: list[Any]) -> Any:
        execute = self.model.execute
        fn = getattr(execute, "__func__", execute)
        if fn is not self._checked_fn:  # asked once per function, not per batch
            self._checked_fn = fn
            self._is_async = inspect.iscoroutinefunction(execute)
        if self._is_async:
            if self._aloop is None:
                import asyncio

                self._aloop = asyncio.new_event_loop()
            return self._aloop.run_until_complete(execute(requests))
        return execute(requests)

    def _finalize(self) -> None:
        fin = getattr(self.model, "finalize", None)
        self.pb._PHASE = "finalize"  # type: ignore[attr-defined]  # no model loading API now
        if fin is not None:
            try:
                fin()
            except Exception:
                traceback.print_exc()

    def _cleanup(self) -> None:
        from .shm import unlink_prefix

        for writer in self.writers:
            writer.close()
        for reader in self.readers:
            reader.close()
        self.runtime.close()  # custom metric cells
        if self.orphaned:
            unlink_prefix(self.setup.shm_prefix)
        for conn in (self.rx, self.tx):
            try:
                conn.close()
            except OSError:
                pass

    def _execute(self, msg: Execute) -> ExecuteReply:
        """One batch: its requests read from the arena, the model's execute() called, its
        responses checked and their outputs written into this worker's arena. The reply's
        three durations are those of the reading, of execute() and of the writing."""
        pb = self.pb
        if msg.behind and self._withdrawn(msg):
            return ExecuteReply(msg.id, "", ((WITHDRAWN, None),) * len(msg.requests), 0, 0, 0)
        clock = time.perf_counter_ns
        t0 = clock()
        requests = self._read_requests(msg)
        t1 = clock()
        n = len(requests)
        failed: str | None = None
        responses: Any = None
        try:
            responses = self._call_execute(requests)
        except Exception as exc:
            traceback.print_exc()
            failed = str(exc) or type(exc).__name__
        t2 = clock()
        if self.decoupled and failed is None:
            # responses went (or will go) through the senders; execute() returns None
            ok = (OK, ())
            again = (RESCHEDULED, None)
            flags = [r._release_flags for r in requests]
            done = tuple(again if f == _RESCHEDULE else ok for f in flags)
            return ExecuteReply(msg.id, "", done, t1 - t0, t2 - t1, 0)
        held = self.runtime.held
        if responses is None and held and failed is None:
            # a non-decoupled model that answered through its response senders
            responses = [held.pop((msg.id, i), None) for i in range(n)]
        if failed is None and (type(responses) is not list or len(responses) != n):
            failed = _response_list_error(responses, n)
        if failed is None and self.runtime.rescheduled:
            self.runtime.rescheduled = False
            failed = _rescheduled_error(requests, responses)
        if failed is not None:
            err = (pb.TritonError.INTERNAL, failed)
            return ExecuteReply(msg.id, "", (err,) * n, t1 - t0, t2 - t1, 0)

        results, counts, to_write, resp_params = self._collect_outputs(requests, responses)
        refs: tuple[TensorRef, ...] = ()
        writer = self.writers[msg.lane]
        if to_write:
            try:
                refs = writer.write(to_write)
            except Exception as exc:
                traceback.print_exc()
                err = (pb.TritonError.INTERNAL, f"cannot return outputs: {exc}")
                return ExecuteReply(msg.id, "", (err,) * n, t1 - t0, t2 - t1, clock() - t2)
        pos = 0
        for i, k in enumerate(counts):
            if k >= 0:
                results[i] = (OK, refs[pos : pos + k])
                pos += k
        t3 = clock()
        return ExecuteReply(
            msg.id,
            writer.name if to_write else "",
            tuple(results),
            t1 - t0,
            t2 - t1,
            t3 - t2,
            tuple(resp_params),
        )

    def _withdrawn(self, msg: Execute) -> bool:
        """Whether every request of ``msg`` (sent while another batch ran) was cancelled
        before it could start: the Cancel messages that arrived meanwhile are read first.
        What is known of this batch and of earlier ones is forgotten then (a non-decoupled
        model's cancellations matter only here)."""
        channel = self.channel
        if channel.has_input():
            channel.poll()
        cancelled = channel.cancelled
        if not cancelled:
            return False
        n = len(msg.requests)
        gone = all((msg.id, i) in cancelled for i in range(n))
        for key in [k for k in cancelled if k[0] <= msg.id]:
            cancelled.discard(key)
        return gone

    def _read_requests(self, msg: Execute) -> list[Any]:
        """The batch's pb_utils.InferenceRequest objects, their input tensors views on the
        server's arena (attached here); each carries (execute id, index) for its sender."""
        make_tensor = self.pb.Tensor._make
        make_request = self.pb.InferenceRequest._make
        code_of = self._code_of
        reader = self.readers[msg.lane]
        view = reader.view
        model_name = self.setup.model_name
        model_version = self.setup.model_version
        reader.attach(msg.arena)
        requests = []
        exec_id = msg.id
        for i, (rid, inputs, outputs, params) in enumerate(msg.requests):
            tensors = []
            for ref in inputs:  # (a loop: a comprehension is a function call per request)
                tensors.append(make_tensor(ref[0], view(ref), code_of[ref[1]]))
            requests.append(
                make_request(
                    rid, tensors, list(outputs), params, model_name, model_version, (exec_id, i)
                )
            )
        return requests

    def _collect_outputs(
        self, requests: list[Any], responses: Sequence[Any]
    ) -> tuple[list[ResultRef], list[int], list[tuple[str, Any, str]], list[str]]:
        """Each response's result: an error (the model's, or a malformed response's; count
        -1) or OK with the count of its outputs, in order, in ``to_write`` (only the outputs
        its request asked for, where it named any); the response parameters (JSON), only
        when a model set any."""
        pb = self.pb
        kserve_by_code = _KSERVE_BY_CODE
        n = len(requests)
        results: list[ResultRef] = []
        to_write: list[tuple[str, Any, str]] = []
        counts: list[int] = []
        resp_params: list[str] = []
        for req, resp in zip(requests, responses):  # noqa: B905 - lengths checked before
            if not isinstance(resp, pb.InferenceResponse):
                if resp is None and req._release_flags == _RESCHEDULE:
                    results.append((RESCHEDULED, None))
                    counts.append(-1)
                    continue
                results.append(
                    (
                        pb.TritonError.INTERNAL,
                        f"expected an InferenceResponse, got {type(resp).__name__}",
                    )
                )
                counts.append(-1)
                continue
            error = resp._error
            if error is not None:
                code = error.code() if hasattr(error, "code") else pb.TritonError.INTERNAL
                text = error.message() if hasattr(error, "message") else str(error)
                results.append((int(code), str(text)))
                counts.append(-1)
                continue
            wanted = req._requested_output_names
            k = 0
            try:
                for t in resp._output_tensors:
                    name = t._name
                    if wanted and name not in wanted:
                        continue
                    to_write.append((name, t._array, kserve_by_code[t._triton_dtype]))
                    k += 1
            except (AttributeError, TypeError, IndexError) as exc:
                del to_write[len(to_write) - k :]
                results.append((pb.TritonError.INTERNAL, f"bad output tensor: {exc}"))
                counts.append(-1)
                continue
            results.append((OK, None))
            counts.append(k)
            if resp._parameters != "{}":
                if not resp_params:
                    resp_params = ["{}"] * n
                resp_params[len(counts) - 1] = resp._parameters
        return results, counts, to_write, resp_params


def _rescheduled_error(requests: list[Any], responses: Sequence[Any]) -> str | None:
    """Triton's text (its typo included) when a request released with
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE has a response in execute()'s list: it must be
    None there. It fails the whole batch, as in Triton."""
    for req, resp in zip(requests, responses):  # noqa: B905 - lengths checked before
        if resp is not None and req._release_flags == _RESCHEDULE:
            return (
                "Expected a None object in the execute function return list for reschduled"
                f" request, found type '{type(resp)}'."
            )
    return None


def _response_list_error(responses: Any, n: int) -> str | None:
    """Why what execute() returned for ``n`` requests is not their responses, or None."""
    if not isinstance(responses, list | tuple):
        return (
            "python model execute() must return a list of InferenceResponse,"
            f" got {type(responses).__name__}"
        )
    if len(responses) != n:
        return (
            "Number of InferenceResponse objects do not match the number of"
            f" InferenceRequest objects. InferenceRequest(s) size is:{n}, and"
            f" InferenceResponse(s) size is:{len(responses)}"
        )
    return None
