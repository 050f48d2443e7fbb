"""ServerConfig: one frozen object built by the CLI and passed down explicitly.

Nothing in the server reads ``os.environ``; every setting arrives through this object.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["ServerConfig", "ControlMode", "GrpcEdge"]


class ControlMode:
    NONE = "none"
    EXPLICIT = "explicit"
    POLL = "poll"
    ALL = (NONE, EXPLICIT, POLL)


class GrpcEdge:
    """Which gRPC edge serves: the native one (gRPC C++), grpc.aio, or native when built."""

    AUTO = "auto"
    NATIVE = "native"
    AIO = "aio"
    ALL = (AUTO, NATIVE, AIO)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    model_repositories: tuple[Path, ...] = ()
    control_mode: str = ControlMode.NONE
    load_models: tuple[str, ...] = ()
    strict_readiness: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    allow_cpu_metrics: bool = True
    metrics_interval_ms: int = 2000
    repository_poll_secs: float = 15.0
    exit_timeout_secs: float = 30.0
    disable_auto_complete_config: bool = False
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"  # or "ISO8601"
    log_file: str = ""  # "" = stderr
    exit_on_error: bool = True
    backend_config: tuple[tuple[str, str, str], ...] = ()
    grpc_edge: str = GrpcEdge.AUTO
    # gRPC channel arguments from tritonserver's --grpc-* flags (keepalive, connection age),
    # applied by whichever edge serves; only the flags given on the command line.
    grpc_channel_args: tuple[tuple[str, int], ...] = ()
    grpc_infer_allocation_pool_size: int = 8
    # --cache-config local,size=N: bytes of the response cache (0 = none)
    cache_size_bytes: int = 0
