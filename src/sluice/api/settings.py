"""``Server(**settings)``: keyword arguments named as ``sluice serve``'s flags, onto the same
ServerConfig the CLI builds.

Rules of this file:
- A setting is a flag's name in snake_case (``model_control_mode`` for
  ``--model-control-mode``); a few of Triton's in-process ``Options`` names are accepted for
  the flags they mean (``startup_models`` for ``load_model``, ...: ``TRITON_NAMES``).
- The settings become a command line that ``cli.serve_config`` parses: every value is checked
  exactly as the flag is, and a mistake raises ``InvalidArgumentError`` with the CLI's words.
  An unknown name raises ``TypeError``, as any function given an unexpected keyword does.
- Values: ``None`` is "not given"; a bool is ``true``/``false`` (for the switch
  ``disable_auto_complete_config``, True gives it); a list or tuple gives a repeatable flag
  once per item; a dict gives ``<key>,<setting>=<value>`` items (``backend_config``,
  ``cache_config``); anything else is passed as ``str(value)`` (paths, numbers).
- One default differs from ``sluice serve``'s: ``grpc_edge_colocate`` is 0 unless given (the
  server's loop may be the caller's own, whose thread the native gRPC edge would otherwise
  hold to one CPU at low load).
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Mapping
from typing import Any

from ..cli import serve_config, serve_parser
from ..config import ServerConfig
from .errors import InvalidArgumentError

__all__ = ["config_from_settings", "TRITON_NAMES"]

# tritonserver.Options field -> the sluice setting (flag) it means
TRITON_NAMES = {
    "startup_models": "load_model",
    "server_id": "server_name",
    "exit_timeout": "exit_timeout_secs",
    "log_warn": "log_warning",
    "metrics": "allow_metrics",
    "cpu_metrics": "allow_cpu_metrics",
    "gpu_metrics": "allow_gpu_metrics",
    "metrics_interval": "metrics_interval_ms",
    "rate_limiter_mode": "rate_limit",
    "pinned_memory_pool_size": "pinned_memory_pool_byte_size",
    "repo_agent_directory": "repoagent_directory",
    "backend_configuration": "backend_config",
}


def _flags() -> dict[str, argparse.Action]:
    """setting name -> its action, for every option string of ``sluice serve``."""
    out: dict[str, argparse.Action] = {}
    for action in serve_parser()._actions:
        for option in action.option_strings:
            out[option[2:].replace("-", "_")] = action
    return out


def _items(name: str, value: Any) -> list[str]:
    if isinstance(value, Mapping):  # {"python": {"shm-default-byte-size": "1048576"}}
        items = []
        for key, settings in value.items():
            if not isinstance(settings, Mapping):
                raise InvalidArgumentError(
                    f"setting '{name}': a dict maps a name to a dict of settings, e.g. "
                    f"{{'python': {{'shm-default-byte-size': '1048576'}}}}; got {value!r}"
                )
            items += [f"{key},{k}={_text(v)}" for k, v in settings.items()]
        return items
    if isinstance(value, list | tuple):
        return [_text(v) for v in value]
    return [_text(value)]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def config_from_settings(settings: Mapping[str, Any]) -> ServerConfig:
    """The ServerConfig of ``sluice serve`` given these settings as flags."""
    flags = _flags()
    argv: list[str] = []
    seen: dict[str, str] = {}
    for given, value in settings.items():
        name = TRITON_NAMES.get(given, given)
        action = flags.get(name)
        if action is None:
            known = sorted({*flags, *TRITON_NAMES})
            close = difflib.get_close_matches(given, known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise TypeError(
                f"Server() got an unexpected keyword argument '{given}'{hint}: the settings "
                "are sluice serve's flags in snake_case (docs/inprocess.md)"
            )
        if action.dest in seen:
            raise TypeError(
                f"Server() got '{given}' and '{seen[action.dest]}', which set the same flag "
                f"{action.option_strings[0]}"
            )
        seen[action.dest] = given
        if value is None:
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"setting '{given}' ({flag}): expected True or False")
            if value:
                argv.append(flag)
            continue
        items = _items(given, value)
        if not isinstance(action, argparse._AppendAction) and len(items) != 1:
            raise InvalidArgumentError(f"setting '{given}' ({flag}) takes one value, got {value!r}")
        argv += [f"{flag}={item}" for item in items]
    if "grpc_edge_colocate" not in seen:  # the loop may be the caller's: not pinned unasked
        argv.append("--grpc-edge-colocate=0")
    try:
        return serve_config(argv)
    except ValueError as exc:
        raise InvalidArgumentError(f"Server settings: {exc}") from None
