"""The TorchScript backend (``platform: "pytorch_libtorch"`` / ``backend: "pytorch"``, ``model.pt``).

Rules of this file:
- torch is imported when the first instance starts, never at import time; without it the
  load fails with "the pytorch backend needs torch: pip install sluice[torch]".
- One ``torch.jit.load``-ed module per instance, run under ``torch.inference_mode`` on the
  instance's own thread (torch releases the GIL inside ops). torch's intra-op thread count is
  process-wide: it is set once, from ``parameters { key: "intra_op_thread_count" }`` or the
  cores shared out between the instances of the first model loaded.
- Inputs map to ``forward()`` as Triton's libtorch backend does: config names equal to the
  argument names go by keyword; ``<name>__<index>`` names go by index; otherwise config
  order. Outputs: a tensor is the first output; a tuple/list maps by ``__<index>`` (or config
  order); a dict maps by key.
- TorchScript carries no dims or data types, so there is no auto-complete: the config must
  declare inputs and outputs (as in Triton).
- Batches are concatenated / split like the onnxruntime backend's.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..errors import Internal, InvalidArgument, NotFound, ServerError
from ..types import InferRequest
from .base import ExecuteResult, ModelInstance, ModelSpec, register_backend
from .batching import concat_inputs, instance_names, responses
from .onnxruntime import default_intra_threads, thread_param

__all__ = ["TorchScriptBackend", "TorchScriptInstance", "import_torch", "forward_binding"]

_INDEXED = re.compile(r"^(.*)__(\d+)$")
_threads_set = False


def import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise InvalidArgument(
            "the pytorch backend needs torch: pip install sluice[torch]"
        ) from None
    return torch


def _index(name: str) -> int | None:
    m = _INDEXED.match(name)
    return int(m.group(2)) if m else None


def forward_binding(config_names: list[str], arg_names: list[str]) -> tuple[str, list[str]]:
    """How config inputs reach ``forward()``: ("kw", names), or ("pos", names in arg order)."""
    if arg_names and set(config_names) <= set(arg_names):
        return "kw", list(config_names)
    indexed = [(_index(n), n) for n in config_names]
    if all(i is not None for i, _ in indexed):
        return "pos", [n for _, n in sorted(indexed, key=lambda p: p[0] or 0)]
    return "pos", list(config_names)


def _forward_args(module: Any) -> list[str]:
    """Argument names of ``forward`` (without ``self``)."""
    try:
        schema = module.forward.schema
        return [a.name for a in schema.arguments][1:]
    except Exception:
        with contextlib.suppress(Exception):
            return [p for p in inspect.signature(module.forward).parameters if p != "self"]
    return []


def _model_path(spec: ModelSpec) -> Path:
    return spec.version_dir / (spec.config.default_model_filename or "model.pt")


class TorchScriptInstance:
    def __init__(self, spec: ModelSpec, name: str) -> None:
        self.name = name
        self.spec = spec
        cfg = spec.config
        self._inputs = [t.name for t in cfg.input]
        self._outputs = [t.name for t in cfg.output]
        self._batching = cfg.max_batch_size > 0
        self._threads = thread_param(cfg, "intra_op_thread_count") or default_intra_threads(cfg)
        self._module: Any = None
        self._torch: Any = None
        self._mode = "pos"
        self._order: list[str] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"torch-{name}")

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._load)

    def _load(self) -> None:
        global _threads_set
        cfg = self.spec.config
        torch = import_torch()
        if not _threads_set:
            torch.set_num_threads(self._threads)
            with contextlib.suppress(RuntimeError):  # only settable before first use
                torch.set_num_interop_threads(1)
            _threads_set = True
        if not cfg.input or not cfg.output:
            raise InvalidArgument(
                f"failed to load '{cfg.name}': a pytorch model's config must declare its inputs "
                "and outputs (TorchScript carries no shapes or data types to auto-complete from)"
            )
        path = _model_path(self.spec)
        if not path.is_file():
            raise NotFound(f"failed to load '{cfg.name}': model file {path} not found")
        try:
            with warnings.catch_warnings():  # torch 2.x deprecates TorchScript loudly
                warnings.simplefilter("ignore", DeprecationWarning)
                module = torch.jit.load(str(path), map_location="cpu")
        except Exception as exc:
            raise InvalidArgument(
                f"failed to load '{cfg.name}': torch.jit.load cannot read {path}: {exc}"
            ) from None
        module.eval()
        args = _forward_args(module)
        self._mode, self._order = forward_binding(self._inputs, args)
        if args and len(self._inputs) > len(args):
            raise InvalidArgument(
                f"failed to load '{cfg.name}': the config declares {len(self._inputs)} inputs "
                f"but forward() takes {len(args)} ({args})"
            )
        self._module = module
        self._torch = torch

    async def execute(self, requests: list[InferRequest]) -> ExecuteResult:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._run, requests)

    def _outputs_of(self, result: Any) -> dict[str, np.ndarray]:
        torch = self._torch
        names = self._outputs
        if isinstance(result, torch.Tensor):
            return {names[0]: result.detach().cpu().numpy()}
        if isinstance(result, dict):
            return {n: result[n].detach().cpu().numpy() for n in names if n in result}
        seq = list(result)
        out: dict[str, np.ndarray] = {}
        for pos, n in enumerate(names):
            i = _index(n)
            i = pos if i is None else i
            if i >= len(seq):
                raise Internal(
                    f"model '{self.spec.name}' returned {len(seq)} outputs; none for '{n}'"
                )
            out[n] = seq[i].detach().cpu().numpy()
        return out

    def _run(self, requests: list[InferRequest]) -> ExecuteResult:
        torch = self._torch
        clock = time.perf_counter_ns
        t0 = clock()
        feed = {
            k: torch.from_numpy(np.ascontiguousarray(v))
            for k, v in concat_inputs(requests, self._inputs).items()
        }
        t1 = clock()
        try:
            with torch.inference_mode():
                if self._mode == "kw":
                    result = self._module(**feed)
                else:
                    result = self._module(*(feed[n] for n in self._order))
            outs = self._outputs_of(result)
        except ServerError:
            raise
        except Exception as exc:
            raise Internal(f"pytorch model '{self.spec.name}' failed: {exc}") from None
        t2 = clock()
        results = responses(self.spec, requests, outs, self._batching)
        return ExecuteResult(results, t1 - t0, t2 - t1, clock() - t2)

    async def stop(self, grace: float | None = None) -> None:
        self._module = None
        with contextlib.suppress(Exception):
            self._pool.shutdown(wait=False)


class TorchScriptBackend:
    """``platform: "pytorch_libtorch"``: TorchScript modules (``torch.jit.save``)."""

    name = "pytorch"

    def default_model_filename(self) -> str:
        return "model.pt"

    def auto_complete(self, spec: ModelSpec) -> mc.ModelConfig:
        return spec.config  # nothing to read shapes from; see the rules above

    def create_instances(self, spec: ModelSpec) -> list[ModelInstance]:
        return [TorchScriptInstance(spec, n) for n, _kind, _dev in instance_names(spec.config)]


register_backend(["pytorch", "pytorch_libtorch"], TorchScriptBackend)
