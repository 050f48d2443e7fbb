"""``sluice repo lint PATH...``: flags, output and exit status.

Exit status: 1 when there is an error finding, 0 otherwise (warnings alone pass), 2 for a
usage mistake (a PATH that is not a directory).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..host.sysmem import format_size, machine_memory, parse_size

__all__ = ["add_repo_commands", "run_repo"]


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_repo_commands(repo: argparse.ArgumentParser) -> None:
    sub = repo.add_subparsers(dest="repo_command", required=True)
    lint = sub.add_parser(
        "lint",
        help="find the model repository's pitfalls before a load fails",
        description="Check a model repository: layout, config.pbtxt, model files, batching, "
        "devices, memory, TensorRT plans. One finding per line; exit 1 on errors.",
    )
    lint.add_argument("paths", nargs="+", metavar="PATH", help="model repository (repeatable)")
    lint.add_argument("--format", choices=("text", "json"), default="text")
    lint.add_argument(
        "--latency-budget-ms",
        type=float,
        default=None,
        metavar="MS",
        help="p99 target: a queue delay above half of it warns, at or above it is an error",
    )
    lint.add_argument(
        "--memory",
        type=_size,
        default=None,
        metavar="BYTES",
        help="memory the serving machine has for model instances (K/M/G suffixes; default: "
        "this machine's available memory)",
    )
    gpu = lint.add_mutually_exclusive_group()
    gpu.add_argument(
        "--gpu", dest="gpu", action="store_true", default=None, help="the serving machine has a GPU"
    )
    gpu.add_argument("--no-gpu", dest="gpu", action="store_false", help="it has none")
    lint.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="as sluice serve's flag: configs must be complete",
    )


def run_repo(ns: argparse.Namespace) -> int:
    # the checks import the backends: only when linting, not for every command's parser
    from ..repository.devices import has_gpu
    from .checks import LintOptions, lint_repositories
    from .findings import ERROR, render_json, render_text, summary

    paths = [Path(p) for p in ns.paths]
    for p in paths:
        if not p.is_dir():
            print(f"sluice repo lint: {p} is not a directory", file=sys.stderr)
            return 2
    if ns.memory is not None:
        memory, source = ns.memory, "--memory"
    else:
        mem = machine_memory()
        memory, source = mem.available, f"{mem.where} on this machine"
    options = LintOptions(
        memory=memory,
        memory_source=source,
        gpu=has_gpu() if ns.gpu is None else ns.gpu,
        latency_budget_ms=ns.latency_budget_ms,
        auto_complete=not ns.disable_auto_complete_config,
    )
    findings, models = lint_repositories(paths, options)
    line = summary(findings, models, [str(p) for p in paths])
    if ns.format == "json":
        sys.stdout.write(render_json(findings))
        print(line, file=sys.stderr)
    else:
        sys.stdout.write(render_text(findings))
        print(f"{line} (memory for instances: {format_size(memory)}, {source})")
    return 1 if any(f.severity == ERROR for f in findings) else 0
