"""``sluice serve`` with tritonserver's flag spellings. Parses argv into a frozen
ServerConfig and hands it to ``server.run``; no logic beyond validation lives here."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .config import ControlMode, GrpcEdge, ServerConfig

__all__ = ["main", "build_parser", "parse_serve_args"]

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got '{text}'") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range: {value}")
    return value


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model-repository",
        "--model-store",
        dest="model_repository",
        action="append",
        required=True,
        metavar="PATH",
        help="model repository path (repeatable)",
    )
    p.add_argument("--model-control-mode", choices=ControlMode.ALL, default=ControlMode.NONE)
    p.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="model to load at start in explicit mode (repeatable; '*' = all, alone)",
    )
    p.add_argument("--strict-readiness", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--allow-http", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--allow-grpc", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--http-port", type=_port, default=8000)
    p.add_argument("--grpc-port", type=_port, default=8001)
    p.add_argument("--metrics-port", type=_port, default=8002)
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument(
        "--metrics-address", default=None, help="defaults to --http-address, as in Triton"
    )
    p.add_argument("--allow-metrics", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--allow-cpu-metrics", type=_bool, default=True, metavar="BOOL")
    p.add_argument(
        "--allow-gpu-metrics",
        type=_bool,
        default=False,
        metavar="BOOL",
        help="accepted for compatibility; sluice exports no GPU metrics",
    )
    p.add_argument("--metrics-interval-ms", type=int, default=2000)
    p.add_argument("--repository-poll-secs", type=float, default=15.0)
    p.add_argument("--exit-timeout-secs", type=float, default=30.0)
    p.add_argument("--disable-auto-complete-config", action="store_true")
    p.add_argument(
        "--strict-model-config",
        type=_bool,
        default=None,
        metavar="BOOL",
        help="deprecated: true means --disable-auto-complete-config",
    )
    p.add_argument(
        "--backend-config", action="append", default=[], metavar="<backend>,<setting>=<value>"
    )
    p.add_argument(
        "--exit-on-error",
        type=_bool,
        default=True,
        metavar="BOOL",
        help="exit if a model fails to load at start (as tritonserver)",
    )
    p.add_argument(
        "--cache-config",
        action="append",
        default=[],
        metavar="<cache>,<key>=<value>",
        help="the response cache: local,size=<bytes> (models opt in with response_cache)",
    )
    _add_grpc_flags(p)
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument("--log-info", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--log-warning", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--log-error", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--log-format", choices=("default", "ISO8601"), default="default")
    p.add_argument("--log-file", default="", help="append the log to this file (default stderr)")
    # Accepted so that tritonserver command lines run unchanged; no effect on CPU.
    for flag in (
        "--pinned-memory-pool-byte-size",
        "--cuda-memory-pool-byte-size",
        "--min-supported-compute-capability",
        "--model-load-thread-count",
        "--id",
        "--buffer-manager-thread-count",
        "--backend-directory",
        "--repoagent-directory",
        "--cache-directory",
    ):
        p.add_argument(flag, default=None, help=argparse.SUPPRESS)


# tritonserver's gRPC tuning flags -> (gRPC channel argument, value type). Triton applies
# them as these channel arguments; so do both of sluice's gRPC edges.
GRPC_CHANNEL_FLAGS: dict[str, tuple[str, str]] = {
    "--grpc-keepalive-time": ("grpc.keepalive_time_ms", "int"),
    "--grpc-keepalive-timeout": ("grpc.keepalive_timeout_ms", "int"),
    "--grpc-keepalive-permit-without-calls": ("grpc.keepalive_permit_without_calls", "bool"),
    "--grpc-http2-max-pings-without-data": ("grpc.http2.max_pings_without_data", "int"),
    "--grpc-http2-min-recv-ping-interval-without-data": (
        "grpc.http2.min_ping_interval_without_data_ms",
        "int",
    ),
    "--grpc-http2-max-ping-strikes": ("grpc.http2.max_ping_strikes", "int"),
    "--grpc-max-connection-age": ("grpc.max_connection_age_ms", "int"),
    "--grpc-max-connection-age-grace": ("grpc.max_connection_age_grace_ms", "int"),
}


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def _add_grpc_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--grpc-edge",
        choices=GrpcEdge.ALL,
        # The one setting read from the environment, at parse time: lets a test run choose
        # the edge for every server it starts. The flag wins over it.
        default=os.environ.get("SLUICE_GRPC_EDGE") or GrpcEdge.AUTO,
        help="gRPC edge: native (gRPC C++ extension), aio (grpc.aio), auto (native when built); "
        "default from $SLUICE_GRPC_EDGE, else auto",
    )
    for flag, (_, kind) in GRPC_CHANNEL_FLAGS.items():
        p.add_argument(
            flag,
            type=_bool if kind == "bool" else _nonneg_int,
            default=None,
            metavar="BOOL" if kind == "bool" else "N",
        )
    p.add_argument(
        "--grpc-infer-allocation-pool-size",
        type=_nonneg_int,
        default=8,
        metavar="N",
        help="accepted for compatibility (Triton's response-buffer pool); no effect here",
    )


def _grpc_channel_args(ns: argparse.Namespace) -> tuple[tuple[str, int], ...]:
    out = []
    for flag, (arg, _) in GRPC_CHANNEL_FLAGS.items():
        value = getattr(ns, flag[2:].replace("-", "_"))
        if value is not None:
            out.append((arg, int(value)))
    return tuple(out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice", description="Triton-compatible inference server"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the server (tritonserver's flags)")
    _add_serve_flags(serve)
    perf = sub.add_parser("perf", help="load-test a server (perf_analyzer's flags)")
    from .perf.cli import add_perf_flags

    add_perf_flags(perf)
    return parser


def _backend_config(
    items: list[str], parser: argparse.ArgumentParser
) -> tuple[tuple[str, str, str], ...]:
    """``<backend>,<setting>=<value>`` or, for every backend, ``<setting>=<value>``."""
    out = []
    for item in items:
        backend, sep, rest = item.partition(",")
        if not sep:
            backend, rest = "", item
        key, eq, value = rest.partition("=")
        if not eq or not key:
            parser.error(f"--backend-config expects [<backend>,]<setting>=<value>, got '{item}'")
        out.append((backend, key, value))
    return tuple(out)


def parse_serve_args(argv: list[str]) -> ServerConfig:
    parser = build_parser()
    ns = parser.parse_args(["serve", *argv])
    return _to_config(ns, parser)


def _to_config(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> ServerConfig:
    loads = tuple(ns.load_model)
    if "*" in loads and len(loads) > 1:
        parser.error("--load-model=* must be the only --load-model")
    if loads and ns.model_control_mode != ControlMode.EXPLICIT:
        parser.error("--load-model requires --model-control-mode=explicit")
    disable_ac = ns.disable_auto_complete_config or bool(ns.strict_model_config)
    if ns.grpc_edge not in GrpcEdge.ALL:
        parser.error(
            f"SLUICE_GRPC_EDGE / --grpc-edge: expected one of {', '.join(GrpcEdge.ALL)}, "
            f"got '{ns.grpc_edge}'"
        )
    return ServerConfig(
        model_repositories=tuple(Path(p) for p in ns.model_repository),
        control_mode=ns.model_control_mode,
        load_models=loads,
        strict_readiness=ns.strict_readiness,
        allow_http=ns.allow_http,
        allow_grpc=ns.allow_grpc,
        http_address=ns.http_address,
        http_port=ns.http_port,
        grpc_address=ns.grpc_address,
        grpc_port=ns.grpc_port,
        metrics_address=ns.metrics_address or ns.http_address,
        metrics_port=ns.metrics_port,
        allow_metrics=ns.allow_metrics,
        allow_cpu_metrics=ns.allow_cpu_metrics,
        metrics_interval_ms=ns.metrics_interval_ms,
        repository_poll_secs=ns.repository_poll_secs,
        exit_timeout_secs=ns.exit_timeout_secs,
        disable_auto_complete_config=disable_ac,
        log_verbose=ns.log_verbose,
        log_info=ns.log_info,
        log_warning=ns.log_warning,
        log_error=ns.log_error,
        log_format=ns.log_format,
        log_file=ns.log_file,
        exit_on_error=ns.exit_on_error,
        backend_config=_backend_config(ns.backend_config, parser),
        grpc_edge=ns.grpc_edge,
        grpc_channel_args=_grpc_channel_args(ns),
        grpc_infer_allocation_pool_size=ns.grpc_infer_allocation_pool_size,
        cache_size_bytes=_cache_size(ns.cache_config, parser),
    )


def _cache_size(items: list[str], parser: argparse.ArgumentParser) -> int:
    from .cache import parse_cache_config

    try:
        return parse_cache_config(items)
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    ns = parser.parse_args(args)
    if ns.command == "serve":
        config = _to_config(ns, parser)
        from .server import run

        return run(config)
    if ns.command == "perf":
        from .perf.cli import run_perf

        return run_perf(ns)
    parser.error(f"unknown command {ns.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
