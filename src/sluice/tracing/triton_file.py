"""Triton's JSON trace file (``--trace-config triton,file=PATH``).

Rules of this file (the format Triton 2.51 writes, checked on this machine):
- The file is one JSON array of small objects, per trace id: ``{"id":1,"timestamps":[{"name":
  "QUEUE_START","ns":N}]}`` per timestamp, one ``{"id":1,"model_name":"m","model_version":1}``
  (plus ``"request_id"`` when the request has one and ``"parent_id"`` for a child trace) right
  before its REQUEST_START, and ``{"id":1,"activity":"TENSOR_QUEUE_INPUT","tensor":{...}}`` at
  level TENSORS. ``ns`` is the steady clock (CLOCK_MONOTONIC).
- Entries of a trace are written in time order (Triton writes them in the order its threads
  captured them, which puts INFER_RESPONSE_COMPLETE before the compute stamps); traces of one
  tree by id, the parent first (Triton: in hash-map order).
- ``save(indexed=False)`` appends to ``PATH``; unlike Triton (which closes the array only at
  exit), the file is valid JSON after every save, so a server that dies keeps what it wrote.
  ``save(indexed=True)`` writes ``PATH.<n>`` (n = 0, 1, ... per file), each a whole array.
"""

from __future__ import annotations

import json
import os
from operator import itemgetter

from .trace import Trace

__all__ = ["TraceFile", "format_traces"]

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_NS = itemgetter(0)


class TraceFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self.index = 0
        self._started = False

    def save(self, traces: list[str], indexed: bool) -> None:
        """Write formatted traces (``format_traces`` texts)."""
        body = ",".join(traces)
        if indexed:
            name = f"{self.path}.{self.index}"
            self.index += 1
            with open(name, "w", encoding="utf-8") as f:
                f.write(f"[{body}]")
            return
        if not self._started:  # a new file for this run, as Triton truncates it
            with open(self.path, "w", encoding="utf-8") as f:
                f.write(f"[{body}]")
            self._started = True
            return
        with open(self.path, "r+b") as f:  # replace the closing "]" with ",<body>]"
            f.seek(-1, os.SEEK_END)
            f.write(f",{body}]".encode())


def format_traces(traces: list[Trace], timestamps: bool = True) -> str:
    """The file entries of a trace tree (``Trace.walk()``), comma-joined; "" if none."""
    out: list[str] = []
    for t in traces:
        if t.model_version < 0:  # never reached a model (unknown model): Triton writes none
            continue
        model = _model_entry(t)
        if t.tensors:
            out.extend(_with_tensors(t, model, timestamps))
            continue
        if not timestamps:
            out.append(model)
            continue
        head = f'{{"id":{t.id},"timestamps":[{{"name":"'
        for ns, name in sorted(t.stamps, key=_NS):  # stable: equal times keep their order
            if name == "REQUEST_START":
                out.append(model)
            out.append(f'{head}{name}","ns":{ns}}}]}}')
    return ",".join(out)


def _with_tensors(t: Trace, model: str, timestamps: bool) -> list[str]:
    entries: list[tuple[int, int, str]] = []  # (ns, order, json)
    if timestamps:
        head = f'{{"id":{t.id},"timestamps":[{{"name":"'
        for i, (ns, name) in enumerate(t.stamps):
            if name == "REQUEST_START":
                entries.append((ns, 2 * i, model))
            entries.append((ns, 2 * i + 1, f'{head}{name}","ns":{ns}}}]}}'))
    else:
        entries.append((0, 0, model))
    base = 2 * len(t.stamps)
    for i, (ns, activity, name, dt, shape, data) in enumerate(t.tensors or ()):
        tensor = {"name": name, "data": data, "shape": shape, "dtype": dt}
        entries.append((ns, base + i, _dumps({"id": t.id, "activity": activity, "tensor": tensor})))
    entries.sort(key=lambda e: (e[0], e[1]))
    return [e[2] for e in entries]


def _model_entry(t: Trace) -> str:
    text = f'{{"id":{t.id},"model_name":{_dumps(t.model_name)},"model_version":{t.model_version}'
    if t.request_id:
        text += f',"request_id":{_dumps(t.request_id)}'
    if t.parent_id:
        text += f',"parent_id":{t.parent_id}'
    return text + "}"
