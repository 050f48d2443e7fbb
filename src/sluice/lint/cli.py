"""``sluice repo lint PATH...``: flags, output and exit status.

Exit status: 1 when there is an error finding, 0 otherwise (warnings alone pass), 2 for a
usage mistake (a PATH that is not a directory, a repository in object storage that cannot
be read).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import ServerError
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
    lint.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="model repository: a directory or an s3://, gs://, as:// URL (repeatable)",
    )
    lint.add_argument("--format", choices=("text", "json"), default="text")
    lint.add_argument(
        "--repository-cache-dir",
        default="",
        metavar="DIR",
        help="s3://, gs://, as:// repositories: where objects are cached and mirrored (as "
        "sluice serve's flag)",
    )
    lint.add_argument(
        "--repository-timeout-secs",
        type=float,
        default=30.0,
        help="s3://, gs://, as:// repositories: the most listing and downloading may take",
    )
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
    lint.add_argument(
        "--model-config-name",
        default="",
        metavar="NAME",
        help="as sluice serve's flag: check each model's configs/NAME.pbtxt where it has one",
    )


def _local_paths(ns: argparse.Namespace) -> tuple[list[Path], dict[str, str]]:
    """The directories to lint: an s3:// gs:// as:// repository is first mirrored (as the
    server mirrors it, through the same cache); also {mirror directory: URL} for output."""
    import asyncio
    import os

    from ..repository.remote import (
        RemoteRepositories,
        default_cache_dir,
        is_remote,
        plan_repositories,
    )

    cache_dir = ns.repository_cache_dir or default_cache_dir()
    paths, remotes = plan_repositories(list(ns.paths), cache_dir, os.environ)
    if remotes:
        repos = RemoteRepositories(remotes, cache_dir, 0, ns.repository_timeout_secs, 8, os.environ)
        asyncio.run(repos.refresh())
    shown = {str(mirror): given for given, mirror in remotes if is_remote(given)}
    return list(paths), shown


def _as_given(text: str, shown: dict[str, str]) -> str:
    """Mirror directories written back as the URLs the user gave."""
    for mirror, url in shown.items():
        text = text.replace(mirror, url.rstrip("/"))
    return text


def run_repo(ns: argparse.Namespace) -> int:
    # the checks import the backends: only when linting, not for every command's parser
    from ..repository.devices import has_gpu
    from .checks import LintOptions, lint_repositories
    from .findings import ERROR, render_json, render_text, summary

    try:
        paths, shown = _local_paths(ns)
    except ServerError as exc:
        print(f"sluice repo lint: {exc}", file=sys.stderr)
        return 2
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
        config_name=ns.model_config_name,
    )
    findings, models = lint_repositories(paths, options)
    line = _as_given(summary(findings, models, [str(p) for p in paths]), shown)
    if ns.format == "json":
        sys.stdout.write(_as_given(render_json(findings), shown))
        print(line, file=sys.stderr)
    else:
        sys.stdout.write(_as_given(render_text(findings), shown))
        print(f"{line} (memory for instances: {format_size(memory)}, {source})")
    return 1 if any(f.severity == ERROR for f in findings) else 0
