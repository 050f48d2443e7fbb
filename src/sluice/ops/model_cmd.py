"""``sluice model list|load|unload|stats|config|traffic``: the operator's commands over a running
server's repository API (sluice or Triton).

Rules of this file:
- Exit status: 0 done, 1 the server said no (its error text on stderr), 2 usage, 3 nothing
  answered at ``-u`` (the message names the URL). Results go to stdout, errors to stderr.
- ``--format json`` prints the server's own documents (one JSON value) for scripts; the default
  is a table meant for people.

Usage::

    sluice model list -u localhost:8000
    sluice model load add_sub --config tuned.pbtxt
    sluice model unload add_sub --version 2
    sluice model stats add_sub --format json
    sluice model traffic add_sub 1=90 2=10
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .client import OpsClient, OpsError, UsageError, add_server_flags, api_key_option
from .table import render

__all__ = ["add_model_parser", "run_model", "config_to_pbtxt", "read_config_file"]


def _common(p: argparse.ArgumentParser, fmt: bool = True) -> None:
    add_server_flags(p)
    if fmt:
        p.add_argument(
            "--format", choices=["table", "json"], default="table", help="output (default table)"
        )


def add_model_parser(sub: Any) -> None:
    """Adds ``model`` and its subcommands to ``sub`` (an argparse subparsers action)."""
    model = sub.add_parser(
        "model", help="list, load, unload, inspect a running server's models (repository API)"
    )
    msub = model.add_subparsers(dest="model_command", required=True, metavar="COMMAND")

    p = msub.add_parser("list", help="every model in the repositories: versions, states, reasons")
    _common(p)
    p.add_argument("--ready", action="store_true", help="only versions that are READY")

    p = msub.add_parser("load", help="load or reload a model (or one version)")
    _common(p, fmt=False)
    p.add_argument("model")
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="use this configuration instead of the repository's (config.pbtxt or JSON)",
    )
    p.add_argument("--version", default=None, help="load only this version (sluice)")

    p = msub.add_parser("unload", help="unload a model (or one version)")
    _common(p, fmt=False)
    p.add_argument("model")
    p.add_argument("--version", default=None, help="unload only this version (sluice)")
    p.add_argument(
        "--unload-dependents", action="store_true", help="also unload the models loaded with it"
    )

    p = msub.add_parser("stats", help="per-version counts and average queue/compute times")
    _common(p)
    p.add_argument("model", nargs="?", default="", help="default: every loaded model")
    p.add_argument("--version", default="")

    p = msub.add_parser("config", help="the configuration the server runs a model with")
    _common(p, fmt=False)
    p.add_argument("model")
    p.add_argument("--version", default="")
    p.add_argument("--pbtxt", action="store_true", help="as config.pbtxt text instead of JSON")

    p = msub.add_parser(
        "traffic", help="show or set the split of unversioned requests over versions (sluice)"
    )
    _common(p)
    p.add_argument("model")
    p.add_argument("weights", nargs="*", metavar="VERSION=WEIGHT", help="e.g. 1=90 2=10")
    p.add_argument("--clear", action="store_true", help="remove the split")


# --------------------------------------------------------------------------- config text
def config_to_pbtxt(config: dict[str, Any]) -> str:
    """A server's JSON model configuration as config.pbtxt text (Triton's ModelConfig message,
    printed by protobuf's text_format)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2 as mc

    msg = mc.ModelConfig()
    try:
        json_format.ParseDict(config, msg)
    except json_format.ParseError as exc:
        # a newer server may print fields this client's ModelConfig does not know yet
        print(f"warning: {exc}; printing the fields this client knows", file=sys.stderr)
        msg = mc.ModelConfig()
        json_format.ParseDict(config, msg, ignore_unknown_fields=True)
    return str(text_format.MessageToString(msg))


def read_config_file(path: str) -> dict[str, Any]:
    """A configuration file for ``--config``: JSON (a ModelConfig object) or config.pbtxt text."""
    from ..errors import InvalidArgument
    from ..protocol.config_json import config_to_json_dict
    from ..repository.model_config import parse_config_text

    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config: cannot read {path}: {exc}") from None
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"--config: {path} is not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise UsageError(f"--config: {path} must hold a JSON object")
        return doc
    try:
        return config_to_json_dict(parse_config_text(text, path))
    except InvalidArgument as exc:
        raise UsageError(f"--config: {exc}") from None


# --------------------------------------------------------------------------- commands
def _dash(value: Any) -> str:
    return "-" if value in (None, "") else str(value)


def _list(api: OpsClient, ns: argparse.Namespace) -> None:
    rows = api.index()
    if ns.ready:
        rows = [r for r in rows if r.get("state") == "READY"]
    if ns.format == "json":
        print(json.dumps(rows, indent=2))
        return
    table = [
        [r.get("name", ""), _dash(r.get("version")), _dash(r.get("state")), r.get("reason", "")]
        for r in sorted(rows, key=lambda r: (r.get("name", ""), _version_key(r.get("version"))))
    ]
    print(render(["MODEL", "VERSION", "STATE", "REASON"], table))


def _version_key(v: Any) -> tuple[int, str]:
    s = "" if v is None else str(v)
    return (int(s), "") if s.isdigit() else (-1, s)


def _load(api: OpsClient, ns: argparse.Namespace) -> None:
    config = read_config_file(ns.config) if ns.config else None
    if ns.version is not None:
        api.load_version(ns.model, ns.version, config)
        print(f"loaded '{ns.model}' version {ns.version}")
    else:
        api.load(ns.model, config)
        print(
            f"loaded '{ns.model}'" + (f" with the configuration in {ns.config}" if config else "")
        )


def _unload(api: OpsClient, ns: argparse.Namespace) -> None:
    if ns.version is not None:
        if ns.unload_dependents:
            raise UsageError("--unload-dependents applies to a whole model, not to --version")
        api.unload_version(ns.model, ns.version)
        print(f"unloaded '{ns.model}' version {ns.version}")
    else:
        api.unload(ns.model, ns.unload_dependents)
        print(f"unloaded '{ns.model}'")


def _avg_us(d: dict[str, Any] | None) -> str:
    d = d or {}
    n, ns_ = int(d.get("count", 0) or 0), int(d.get("ns", 0) or 0)
    return f"{ns_ / n / 1000:.0f}" if n else "-"


def stats_rows(doc: dict[str, Any]) -> list[list[Any]]:
    """One row per model version of a statistics document: counts and per-request averages."""
    rows = []
    for ms in doc.get("model_stats", []):
        inf = ms.get("inference_stats") or {}
        infers = int(ms.get("inference_count", 0) or 0)
        execs = int(ms.get("execution_count", 0) or 0)
        ci = inf.get("compute_infer") or {}
        n = int(ci.get("count", 0) or 0)
        compute = sum(
            int((inf.get(k) or {}).get("ns", 0) or 0)
            for k in ("compute_input", "compute_infer", "compute_output")
        )
        rows.append(
            [
                ms.get("name", ""),
                _dash(ms.get("version")),
                infers,
                execs,
                f"{infers / execs:.2f}" if execs else "-",
                int((inf.get("success") or {}).get("count", 0) or 0),
                int((inf.get("fail") or {}).get("count", 0) or 0),
                _avg_us(inf.get("queue")),
                f"{compute / n / 1000:.0f}" if n else "-",
            ]
        )
    rows.sort(key=lambda r: (r[0], _version_key(r[1])))
    return rows


STATS_HEADERS = [
    "MODEL",
    "VERSION",
    "INFERENCES",
    "EXECUTIONS",
    "AVG_BATCH",
    "SUCCESS",
    "FAIL",
    "QUEUE_US",
    "COMPUTE_US",
]


def _stats(api: OpsClient, ns: argparse.Namespace) -> None:
    if ns.version and not ns.model:
        raise UsageError("--version needs a model")
    doc = api.stats(ns.model, ns.version)
    if ns.format == "json":
        print(json.dumps(doc, indent=2))
        return
    print(render(STATS_HEADERS, stats_rows(doc), numeric=set(range(2, 9))))


def _config(api: OpsClient, ns: argparse.Namespace) -> None:
    cfg = api.config(ns.model, ns.version)
    if ns.pbtxt:
        sys.stdout.write(config_to_pbtxt(cfg))
    else:
        print(json.dumps(cfg, indent=2))


def _parse_weights(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        version, sep, weight = item.partition("=")
        if not sep or not version.strip().isdigit() or not weight.strip().isdigit():
            raise UsageError(f"traffic weights are VERSION=WEIGHT (whole numbers), got '{item}'")
        if version.strip() in out:
            raise UsageError(f"version {version.strip()} is given twice")
        out[version.strip()] = int(weight)
    return out


def _traffic(api: OpsClient, ns: argparse.Namespace) -> None:
    if ns.clear and ns.weights:
        raise UsageError("--clear takes no VERSION=WEIGHT")
    if ns.clear:
        doc = api.set_traffic(ns.model, {})
    elif ns.weights:
        doc = api.set_traffic(ns.model, _parse_weights(ns.weights))
    else:
        doc = api.traffic(ns.model)
    if ns.format == "json":
        print(json.dumps(doc, indent=2))
        return
    weights = {str(k): int(v) for k, v in (doc.get("weights") or {}).items()}
    if not weights:
        print(f"no traffic split for '{ns.model}': requests without a version follow its policy")
        return
    total = sum(weights.values())
    rows = [
        [v, w, f"{100.0 * w / total:.1f}%" if total else "-"]
        for v, w in sorted(weights.items(), key=lambda kv: _version_key(kv[0]))
    ]
    print(render(["VERSION", "WEIGHT", "SHARE"], rows, numeric={1, 2}))


_COMMANDS = {
    "list": _list,
    "load": _load,
    "unload": _unload,
    "stats": _stats,
    "config": _config,
    "traffic": _traffic,
}


def run_model(ns: argparse.Namespace) -> int:
    try:
        with OpsClient.connect(ns.url, api_key=api_key_option(ns.api_key)) as api:
            _COMMANDS[ns.model_command](api, ns)
    except OpsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
