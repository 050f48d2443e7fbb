"""ServerConfig: one frozen object built by the CLI and passed down explicitly.

Nothing in the server reads ``os.environ``; every setting arrives through this object.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["ServerConfig", "ControlMode", "GrpcEdge", "Restriction", "TlsFiles"]


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The TLS files of one front-end, as its flags name them (checked and read by
    ``security/tls.py``)."""

    flag: str  # "--grpc" or "--http": names the flags in errors
    cert: str
    key: str
    root: str = ""
    mutual: bool = False

    @classmethod
    def from_flags(
        cls, flag: str, *, use_ssl: bool, mutual: bool, cert: str, key: str, root: str
    ) -> TlsFiles | None:
        """None when TLS is off; ValueError naming the missing flag. As in tritonserver,
        ``-use-ssl-mutual`` turns TLS on by itself."""
        if not use_ssl and not mutual:
            return None
        on = f"{flag}-use-ssl-mutual" if mutual else f"{flag}-use-ssl"
        if not cert:
            raise ValueError(f"{on} needs {flag}-server-cert=PATH (PEM)")
        if not key:
            raise ValueError(f"{on} needs {flag}-server-key=PATH (PEM)")
        if mutual and not root:
            raise ValueError(
                f"{on} needs {flag}-root-cert=PATH: the CA that client certificates must chain to"
            )
        return cls(flag, cert, key, root, mutual)


@dataclass(frozen=True, slots=True)
class Restriction:
    """Triton's ``<apis>:<key>=<value>``: these groups need header ``key`` equal to ``value``
    (``--http-restricted-api`` / ``--grpc-restricted-protocol``, parsed by
    ``security.access.parse_restrictions``)."""

    groups: tuple[str, ...]
    key: str
    value: str


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


class RateLimit:
    """--rate-limit: Triton's rate limiter on (execution_count) or off (the default)."""

    OFF = "off"
    EXECUTION_COUNT = "execution_count"
    ALL = (OFF, EXECUTION_COUNT)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    # local directories and, in their place among them, the mirrors of remote repositories
    model_repositories: tuple[Path, ...] = ()
    # (s3:// gs:// as:// URL as given, its mirror directory): repository/remote/
    remote_repositories: tuple[tuple[str, Path], ...] = ()
    # --repository-cache-dir / --repository-cache-size (bytes, 0 = no limit): the object cache
    repository_cache_dir: str = ""
    repository_cache_size: int = 0
    # --repository-timeout-secs: the most any wait for an object store may take
    repository_timeout_secs: float = 30.0
    # --repository-download-parallel: downloads in flight at once per repository
    repository_download_parallel: int = 8
    control_mode: str = ControlMode.NONE
    # --model-config-name: read <model>/configs/<name>.pbtxt where it exists ("" = config.pbtxt)
    model_config_name: str = ""
    # --model-namespacing: the same model name in several repositories, one per repository
    model_namespacing: bool = False
    load_models: tuple[str, ...] = ()
    # --model-control-state: the file recording loaded models, versions, overrides and traffic
    # splits (explicit mode), restored at start ("" = none)
    model_control_state: str = ""
    strict_readiness: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    # --port-file: the bound ports as JSON, written once the front-ends listen ("" = none)
    port_file: str = ""
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    allow_cpu_metrics: bool = True
    metrics_interval_ms: int = 2000
    # --metrics-config: counter_latencies (the *_duration_us counters), summary_latencies (the
    # *_summary_us summaries) with summary_quantiles ((quantile, error), ...; () = Triton's
    # defaults), histogram_latencies (nv_inference_first_response_histogram_ms)
    counter_latencies: bool = True
    summary_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = ()
    histogram_latencies: bool = False
    repository_poll_secs: float = 15.0
    exit_timeout_secs: float = 30.0
    # behind a proxy without health checks: refuse inference while not ready, gRPC listens
    # only from the end of the start-up loads to SIGTERM (server.py, service.py)
    traffic_follows_readiness: bool = False
    # --server-name: the "name" of GET /v2 and gRPC ServerMetadata. "triton" by default because
    # Triton's own clients and examples check for it; "version" is always sluice's own.
    server_name: str = "triton"
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
    # --grpc-edge-colocate: lone gRPC calls in a row before the native edge's poller and the
    # event loop's thread share one CPU (0: never; `sluice serve` defaults to 64, an
    # embedding program to 0: its own thread is not pinned unless it asks)
    grpc_edge_colocate: int = 0
    # gRPC channel arguments from tritonserver's --grpc-* flags (keepalive, connection age),
    # applied by whichever edge serves; only the flags given on the command line.
    grpc_channel_args: tuple[tuple[str, int], ...] = ()
    grpc_infer_allocation_pool_size: int = 8
    # --cache-config local,size=N: bytes of the response cache (0 = none)
    cache_size_bytes: int = 0
    # --trace-config [<mode>,]<setting>=<value> (and the deprecated --trace-* flags) as
    # (mode, setting, value), validated by the CLI (tracing.parse_trace_flags)
    trace_config: tuple[tuple[str, str, str], ...] = ()
    # --http-max-input-size (tritonserver's): the most bytes an HTTP request body may hold
    # (0 = no limit); --http-max-header-size (sluice's): request line + headers
    http_max_input_size: int = 64 << 20
    http_max_header_size: int = 64 << 10
    # --model-memory-limit: bytes the server and its workers may hold; a load whose instances
    # would go past it (or past the machine's available memory) is refused (0 = no limit)
    model_memory_limit: int = 0
    # --model-load-on-demand: a request for a model that is in the repository but not loaded
    # loads it (the request waits), unloading the least recently used idle models first to
    # stay within --model-memory-limit, else the machine's available memory
    # (repository/on_demand.py); --model-pin: models loaded at start and never evicted
    model_load_on_demand: bool = False
    model_pins: tuple[str, ...] = ()
    # --rate-limit and --rate-limit-resource=<name>:<count>[:<device>] as (name, count,
    # device; -1 = every device): instances execute when their resources are free
    rate_limit: str = RateLimit.OFF
    rate_limit_resources: tuple[tuple[str, int, int], ...] = ()
    # --overload-status: 0 = Triton's answer to a full queue / queue timeout (503,
    # UNAVAILABLE); 429 = 429 with Retry-After, gRPC RESOURCE_EXHAUSTED
    overload_status: int = 0
    # TLS (--http-use-ssl*, --grpc-use-ssl* and their files); None = plain
    http_tls: TlsFiles | None = None
    grpc_tls: TlsFiles | None = None
    # Triton's --http-restricted-api / --grpc-restricted-protocol
    http_restricted: tuple[Restriction, ...] = ()
    grpc_restricted: tuple[Restriction, ...] = ()
    # --api-keys-file: hashed keys with roles, re-read on SIGHUP ("" = no keys)
    api_keys_file: str = ""
    # --audit-log: one JSON line per control action ("" = none)
    audit_log: str = ""
    # the OpenAI-compatible API on the HTTP port (/v1): --openai, --tokenizer (a local
    # tokenizer directory: chat template and token counts; "" = the plain template and
    # whitespace counts), --chat-template (a Jinja file), --default-max-tokens
    openai: bool = True
    tokenizer: str = ""
    chat_template: str = ""
    default_max_tokens: int = 16
