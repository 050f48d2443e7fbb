"""``sluice serve`` with tritonserver's flag spellings. Parses argv into a frozen
ServerConfig and hands it to ``server.run``; no logic beyond validation lives here."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from .config import ControlMode, GrpcEdge, RateLimit, ServerConfig

__all__ = ["main", "build_parser", "parse_serve_args", "serve_parser", "serve_config"]

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


def _size(text: str) -> int:
    from .host.sysmem import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    """tritonserver's flags and sluice's own, one group after the other; the order of the
    calls is the order of ``sluice serve --help`` and of the generated flag reference."""
    _add_repository_flags(p)
    _add_endpoint_flags(p)
    _add_metrics_flags(p)
    _add_lifecycle_flags(p)
    _add_model_config_flags(p)
    _add_trace_flags(p)
    _add_memory_flags(p)
    _add_grpc_flags(p)
    _add_security_flags(p)
    _add_openai_flags(p)
    _add_log_flags(p)
    _add_ignored_flags(p)


def _add_repository_flags(p: argparse.ArgumentParser) -> None:
    """Where the models are and who decides what is loaded: start-up, the control API, polling."""
    p.add_argument(
        "--model-repository",
        "--model-store",
        dest="model_repository",
        action="append",
        required=True,
        metavar="PATH",
        help="model repository: a directory, or s3://, gs://, as:// as Triton writes them "
        "(repeatable; docs/object-storage.md)",
    )
    p.add_argument(
        "--repository-cache-dir",
        default="",
        metavar="DIR",
        help="object-storage repositories: where downloaded objects are cached and mirrored "
        "(default: <system temp dir>/sluice-repository-cache-<uid>)",
    )
    p.add_argument(
        "--repository-cache-size",
        type=_size,
        default=0,
        metavar="BYTES",
        help="object-storage repositories: the most the object cache keeps (least recently "
        "used evicted first; files serving models never are; 0 = no limit)",
    )
    p.add_argument(
        "--repository-timeout-secs",
        type=float,
        default=30.0,
        help="object-storage repositories: the most any wait for the store may take "
        "(connecting, listing, a download's answer and each piece of it)",
    )
    p.add_argument(
        "--repository-download-parallel",
        type=int,
        default=8,
        metavar="N",
        help="object-storage repositories: downloads in flight at once per repository",
    )
    p.add_argument(
        "--model-control-mode",
        choices=ControlMode.ALL,
        default=ControlMode.NONE,
        help="none: load every model at start, control API refused; explicit: load "
        "--load-model, then the API; poll: rescan every --repository-poll-secs",
    )
    p.add_argument(
        "--model-config-name",
        default="",
        metavar="NAME",
        help="read each model's configs/NAME.pbtxt in place of config.pbtxt (a model without "
        "one keeps its config.pbtxt)",
    )
    p.add_argument(
        "--model-namespacing",
        type=_bool,
        default=False,
        metavar="BOOL",
        help="a model name may be in several repositories, each its own namespace (a "
        "request for such a name is refused as ambiguous; an ensemble uses its own "
        "repository's)",
    )
    p.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="model to load at start in explicit mode (repeatable; '*' = all, alone)",
    )
    p.add_argument(
        "--model-control-state",
        default="",
        metavar="PATH",
        help="explicit mode: record the loaded models, versions, overrides and traffic splits "
        "in this file on every change, and restore them at start",
    )
    p.add_argument(
        "--strict-readiness",
        type=_bool,
        default=True,
        metavar="BOOL",
        help="ready only when every model asked for is READY (false: ready once serving)",
    )


def _add_endpoint_flags(p: argparse.ArgumentParser) -> None:
    """The front-ends: which are served, their ports and addresses, HTTP's size limits."""
    p.add_argument("--allow-http", type=_bool, default=True, metavar="BOOL", help="serve HTTP")
    p.add_argument("--allow-grpc", type=_bool, default=True, metavar="BOOL", help="serve gRPC")
    p.add_argument("--http-port", type=_port, default=8000, help="HTTP port (0: any free port)")
    p.add_argument("--grpc-port", type=_port, default=8001, help="gRPC port (0: any free port)")
    p.add_argument(
        "--metrics-port", type=_port, default=8002, help="metrics port (0: any free port)"
    )
    p.add_argument(
        "--port-file",
        default="",
        metavar="PATH",
        help="once the front-ends listen, write the ports they bound here as JSON "
        '({"http": N, "grpc": N, "metrics": N}; null where disabled): with port 0 = any free port',
    )
    p.add_argument("--http-address", default="0.0.0.0", help="address HTTP listens on")
    p.add_argument(
        "--http-max-input-size",
        type=_nonneg_int,
        default=64 << 20,
        metavar="BYTES",
        help="the most bytes an HTTP request body may hold (default 64 MiB; 0 = no limit); "
        "a larger one is answered 413",
    )
    p.add_argument(
        "--http-max-header-size",
        type=_nonneg_int,
        default=64 << 10,
        metavar="BYTES",
        help="sluice's: the most bytes of an HTTP request line and headers (default 64 KiB; "
        "0 = no limit); "
        "a larger head is answered 431",
    )
    p.add_argument("--grpc-address", default="0.0.0.0", help="address gRPC listens on")
    p.add_argument(
        "--metrics-address", default=None, help="defaults to --http-address, as in Triton"
    )


def _add_metrics_flags(p: argparse.ArgumentParser) -> None:
    """The Prometheus endpoint and what it exports."""
    p.add_argument(
        "--allow-metrics", type=_bool, default=True, metavar="BOOL", help="serve /metrics"
    )
    p.add_argument(
        "--metrics-config",
        action="append",
        default=[],
        metavar="SETTING=VALUE",
        help="as tritonserver (repeatable): summary_latencies=true adds the *_summary_us "
        "summaries, summary_quantiles=0.5:0.05,0.9:0.01 their quantiles, "
        "counter_latencies=false drops the *_duration_us counters, histogram_latencies=true the first-response histogram",
    )
    p.add_argument(
        "--allow-cpu-metrics",
        type=_bool,
        default=True,
        metavar="BOOL",
        help="export the CPU utilisation and memory gauges",
    )
    p.add_argument(
        "--allow-gpu-metrics",
        type=_bool,
        default=False,
        metavar="BOOL",
        help="accepted for compatibility; sluice exports no GPU metrics",
    )
    p.add_argument(
        "--metrics-interval-ms",
        type=int,
        default=2000,
        help="accepted; gauges are computed at scrape time",
    )


def _add_lifecycle_flags(p: argparse.ArgumentParser) -> None:
    """Polling, shutdown, readiness towards a proxy and the name the server reports."""
    p.add_argument(
        "--repository-poll-secs", type=float, default=15.0, help="poll mode: rescan interval"
    )
    p.add_argument(
        "--exit-timeout-secs",
        type=float,
        default=30.0,
        help="at shutdown, how long in-flight requests may take before they are failed",
    )
    p.add_argument(
        "--traffic-follows-readiness",
        type=_bool,
        default=False,
        metavar="BOOL",
        help="for replicas behind a proxy without health checks (nginx): inference is refused "
        "(503 / UNAVAILABLE) while the server is not ready, gRPC listens only once the "
        "start-up models are loaded and stops taking calls at SIGTERM (GOAWAY), so that the "
        "proxy passes such requests to another replica; in-flight calls still finish",
    )
    p.add_argument(
        "--server-name",
        default="triton",
        help="the name reported by GET /v2 and gRPC ServerMetadata (default 'triton', which "
        "Triton's clients check for; the reported version is always sluice's own)",
    )


def _add_model_config_flags(p: argparse.ArgumentParser) -> None:
    """How model configs are completed, backend settings, and failed loads at start."""
    p.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="configs must be complete: nothing is filled in from the model file",
    )
    p.add_argument(
        "--strict-model-config",
        type=_bool,
        default=None,
        metavar="BOOL",
        help="deprecated: true means --disable-auto-complete-config",
    )
    p.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="<backend>,<setting>=<value>",
        help="backend settings (repeatable); default-max-batch-size=N is the max_batch_size "
        "auto-complete gives a batchable ONNX model; python,shm-default-byte-size / "
        "shm-growth-byte-size / shm-region-prefix-name / stub-timeout-seconds as Triton's, "
        "python,execution-env-cache=DIR where EXECUTION_ENV_PATH archives are unpacked",
    )
    p.add_argument(
        "--exit-on-error",
        type=_bool,
        default=True,
        metavar="BOOL",
        help="exit if a model fails to load at start (as tritonserver)",
    )


def _add_trace_flags(p: argparse.ArgumentParser) -> None:
    """Tracing: --trace-config and tritonserver's deprecated --trace-* spellings of it."""
    p.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[<mode>,]<setting>=<value>",
        help="tracing (Triton's trace extension): level=TIMESTAMPS, rate=N, count=N, "
        "mode=triton|opentelemetry, triton,file=PATH, triton,log-frequency=N, "
        "opentelemetry,url=URL, opentelemetry,resource=K=V, opentelemetry,bsp_*=N",
    )
    # tritonserver's deprecated spellings of --trace-config
    p.add_argument("--trace-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--trace-level", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--trace-rate", default=None, help=argparse.SUPPRESS)
    p.add_argument("--trace-count", default=None, help=argparse.SUPPRESS)
    p.add_argument("--trace-log-frequency", default=None, help=argparse.SUPPRESS)


def _add_memory_flags(p: argparse.ArgumentParser) -> None:
    """The response cache and the memory limit of loads."""
    p.add_argument(
        "--cache-config",
        action="append",
        default=[],
        metavar="<cache>,<key>=<value>",
        help="the response cache: local,size=<bytes> (models opt in with response_cache)",
    )
    p.add_argument(
        "--model-memory-limit",
        type=_size,
        default=0,
        metavar="BYTES",
        help="memory the server and its workers may hold (K/M/G suffixes); a load whose "
        "instances would not fit is refused (the machine's available memory is always checked)",
    )
    p.add_argument(
        "--model-load-on-demand",
        type=_bool,
        default=False,
        metavar="BOOL",
        help="a request for a model that is in the repository but not loaded loads it and "
        "then runs; the least recently used idle models are unloaded first when the models "
        "would not fit in --model-memory-limit (else the machine's available memory). "
        "Control modes none (then only pinned models load at start) and explicit",
    )
    p.add_argument(
        "--model-pin",
        action="append",
        default=[],
        metavar="NAME",
        help="with --model-load-on-demand: this model loads at start and is never evicted "
        "(repeatable)",
    )
    p.add_argument(
        "--rate-limit",
        type=str.lower,
        choices=RateLimit.ALL,
        default=RateLimit.OFF,
        help="Triton's rate limiter. With execution_count an instance executes only once the "
        "resources its instance_group's rate_limiter asks for are free, instances chosen by "
        "executions x priority; with off (the default, as Triton's) as soon as it is idle",
    )
    p.add_argument(
        "--rate-limit-resource",
        action="append",
        default=[],
        metavar="<name>:<count>[:<device>]",
        help="with --rate-limit=execution_count: how much of a resource there is (repeatable; "
        "without a device, on every device); by default the most any instance asks for",
    )
    p.add_argument(
        "--overload-status",
        type=_overload_status,
        default=0,
        metavar="triton|429",
        help="sluice's: how a full queue (max_queue_size) or a queue timeout is answered: "
        "triton (the default: 503 / UNAVAILABLE, Triton's text) or 429 (429 with a Retry-After "
        "header estimated from the queue's drain rate; gRPC RESOURCE_EXHAUSTED)",
    )


def _add_openai_flags(p: argparse.ArgumentParser) -> None:
    """The OpenAI-compatible API on the HTTP port (/v1): chat template, token counts, defaults
    (Triton's OpenAI front-end's flags)."""
    p.add_argument(
        "--openai",
        type=_bool,
        default=True,
        metavar="BOOL",
        help="serve the OpenAI-compatible API (/v1/models, /v1/completions, "
        "/v1/chat/completions, /v1/embeddings) on the HTTP port",
    )
    p.add_argument(
        "--tokenizer",
        default="",
        metavar="DIR",
        help="a local tokenizer directory (tokenizer.json, tokenizer_config.json): its chat "
        "template renders chat messages and it counts usage tokens; without it, the plain "
        "template and whitespace-separated words (needs the openai extra; nothing downloaded)",
    )
    p.add_argument(
        "--chat-template",
        default="",
        metavar="FILE",
        help="a Jinja chat template file, used instead of the tokenizer's",
    )
    p.add_argument(
        "--default-max-tokens",
        type=_nonneg_int,
        default=16,
        metavar="N",
        help="the max_tokens of an OpenAI request that gives none (Triton's default: 16)",
    )


def _add_log_flags(p: argparse.ArgumentParser) -> None:
    """Logging: levels, timestamp format, destination."""
    p.add_argument("--log-verbose", type=int, default=0, help="debug logging when > 0")
    p.add_argument("--log-info", type=_bool, default=True, metavar="BOOL", help="log info lines")
    p.add_argument("--log-warning", type=_bool, default=True, metavar="BOOL", help="log warnings")
    p.add_argument("--log-error", type=_bool, default=True, metavar="BOOL", help="log errors")
    p.add_argument(
        "--log-format",
        choices=("default", "ISO8601"),
        default="default",
        help="the timestamp format of log lines",
    )
    p.add_argument("--log-file", default="", help="append the log to this file (default stderr)")


def _add_ignored_flags(p: argparse.ArgumentParser) -> None:
    """tritonserver's GPU and build-layout flags: accepted so that tritonserver command lines
    run unchanged, hidden from --help, no effect on CPU."""
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


def _overload_status(text: str) -> int:
    low = text.strip().lower()
    if low == "triton":
        return 0
    if low == "429":
        return 429
    raise argparse.ArgumentTypeError(f"expected triton or 429, got '{text}'")


def _rate_limit_resources(
    items: list[str], parser: argparse.ArgumentParser
) -> tuple[tuple[str, int, int], ...]:
    from .core.rate_limiter import parse_resource_flag

    try:
        return tuple(parse_resource_flag(item) for item in items)
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def _add_security_flags(p: argparse.ArgumentParser) -> None:
    """TLS (tritonserver's --grpc-* spellings, and the same shape for HTTP), Triton's
    restricted APIs, sluice's API keys and audit log (security/: access.py, keys.py, audit.py)."""
    for proto in ("grpc", "http"):
        p.add_argument(
            f"--{proto}-use-ssl", type=_bool, default=False, metavar="BOOL", help=f"TLS on {proto}"
        )
        p.add_argument(
            f"--{proto}-use-ssl-mutual",
            type=_bool,
            default=False,
            metavar="BOOL",
            help=f"TLS with client certificates (signed by --{proto}-root-cert); implies "
            f"--{proto}-use-ssl",
        )
        p.add_argument(
            f"--{proto}-server-cert", default="", metavar="PEM", help="the server certificate"
        )
        p.add_argument(f"--{proto}-server-key", default="", metavar="PEM", help="its private key")
        p.add_argument(
            f"--{proto}-root-cert", default="", metavar="PEM", help="CA of client certificates"
        )
    p.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="<apis>:<key>=<value>",
        help="these APIs need header <key>: <value> (health, metadata, inference, "
        "shared-memory, model-config, model-repository, statistics, trace, logging)",
    )
    p.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="<protocols>:<key>=<value>",
        help="these protocols need metadata triton-grpc-protocol-<key>: <value>",
    )
    p.add_argument(
        "--api-keys-file",
        default="",
        metavar="PATH",
        help="API keys: '<sha256 hex> <role> <name>' per line (roles: inference, admin); "
        "requests then need 'Authorization: Bearer <key>'; re-read on SIGHUP",
    )
    p.add_argument(
        "--audit-log",
        default="",
        metavar="PATH",
        help="append one JSON line per control action (load, unload, traffic, shared memory, "
        "log/trace settings)",
    )


def _security(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, object]:
    from .config import TlsFiles
    from .security.access import parse_restrictions

    out: dict[str, object] = {}
    try:
        for proto in ("grpc", "http"):
            out[f"{proto}_tls"] = TlsFiles.from_flags(
                f"--{proto}",
                use_ssl=getattr(ns, f"{proto}_use_ssl"),
                mutual=getattr(ns, f"{proto}_use_ssl_mutual"),
                cert=getattr(ns, f"{proto}_server_cert"),
                key=getattr(ns, f"{proto}_server_key"),
                root=getattr(ns, f"{proto}_root_cert"),
            )
        out["http_restricted"] = parse_restrictions(
            ns.http_restricted_api, "--http-restricted-api", "api"
        )
        out["grpc_restricted"] = parse_restrictions(
            ns.grpc_restricted_protocol, "--grpc-restricted-protocol", "protocol"
        )
    except ValueError as exc:
        parser.error(str(exc))
    out["api_keys_file"] = ns.api_keys_file
    out["audit_log"] = ns.audit_log
    return out


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
    p.add_argument(
        "--grpc-edge-colocate",
        type=_nonneg_int,
        default=64,
        metavar="CALLS",
        help="native gRPC edge: after this many calls in a row that each arrive with no other "
        "in flight (messages under 64 KB), its poller thread and the event loop's share one CPU, "
        "until a call overlaps another or a message is larger (0: never; default 64)",
    )
    for flag, (arg, kind) in GRPC_CHANNEL_FLAGS.items():
        p.add_argument(
            flag,
            type=_bool if kind == "bool" else _nonneg_int,
            default=None,
            metavar="BOOL" if kind == "bool" else "N",
            help=f"sets the gRPC channel argument {arg}, as Triton does",
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
    from .ops.model_cmd import add_model_parser
    from .ops.tune import add_tune_flags

    add_model_parser(sub)
    tune = sub.add_parser(
        "tune", help="try instance counts / dynamic batching against a p99 budget"
    )
    add_tune_flags(tune)
    from .lint.cli import add_repo_commands

    add_repo_commands(sub.add_parser("repo", help="model repository tools: repo lint PATH"))
    from .security.keys import add_keys_parser

    add_keys_parser(sub)
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


# --metrics-config settings tritonserver 2.51 reads; any other is refused (Triton would
# ignore it silently, so a misspelt setting would turn nothing on)
_METRICS_SETTINGS = (
    "counter_latencies",
    "histogram_latencies",
    "summary_latencies",
    "summary_quantiles",
)


def _metrics_config(items: list[str], parser: argparse.ArgumentParser) -> dict[str, Any]:
    """``--metrics-config`` items -> the ServerConfig fields they set. Triton's format
    message for a malformed item; the booleans are "true"/"false" as Triton compares them."""
    out: dict[str, Any] = {}
    for item in items:
        setting, eq, value = item.partition("=")
        if not eq or not setting or not value or "," in setting:
            parser.error(f"--metrics-config option format is <setting>=<value>. Got {item}")
        if setting not in _METRICS_SETTINGS:
            parser.error(
                f"--metrics-config: unknown setting '{setting}' (known: "
                f"{', '.join(_METRICS_SETTINGS)})"
            )
        if setting == "summary_quantiles":
            out[setting] = _quantiles(value, parser)
        elif value not in ("true", "false"):
            parser.error(f"--metrics-config {setting}: expected true or false, got '{value}'")
        else:
            out[setting] = value == "true"
    return out


def _quantiles(value: str, parser: argparse.ArgumentParser) -> tuple[tuple[float, float], ...]:
    """``0.5:0.05,0.9:0.01`` -> ((0.5, 0.05), (0.9, 0.01)): each quantile and its allowed
    error in [0, 1]."""
    pairs: list[tuple[float, float]] = []
    for pair in value.split(","):
        q, colon, err = pair.partition(":")
        try:
            quantile, error = float(q), float(err)
        except ValueError:
            quantile = error = -1.0
        if not colon or not (0.0 <= quantile <= 1.0 and 0.0 <= error <= 1.0):
            parser.error(
                f"--metrics-config summary_quantiles: '{pair}' is not <quantile>:<error> "
                "(both in [0, 1], e.g. 0.5:0.05)"
            )
        pairs.append((quantile, error))
    return tuple(pairs)


class _RaisingParser(argparse.ArgumentParser):
    """A parser whose every refusal raises ValueError with argparse's (or the CLI's) message
    instead of printing it and exiting."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def serve_parser() -> argparse.ArgumentParser:
    """``sluice serve``'s flags alone, on a parser that raises ValueError where the CLI would
    exit (no abbreviations, no --help)."""
    parser = _RaisingParser(prog="sluice serve", add_help=False, allow_abbrev=False)
    _add_serve_flags(parser)
    return parser


def serve_config(argv: list[str]) -> ServerConfig:
    """The ServerConfig that ``sluice serve <argv>`` runs with, each mistake raised as
    ValueError with the message the CLI prints: the in-process API's settings
    (``sluice.api``) go through here, so they are checked exactly as the flags are."""
    parser = serve_parser()
    return _to_config(parser.parse_args(argv), parser)


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
    if ns.model_control_state and ns.model_control_mode != ControlMode.EXPLICIT:
        parser.error(
            "--model-control-state requires --model-control-mode=explicit (in the other modes "
            "the repository, not the API, decides what is loaded)"
        )
    pins = _pins(ns, parser)
    disable_ac = ns.disable_auto_complete_config or bool(ns.strict_model_config)
    if ns.grpc_edge not in GrpcEdge.ALL:
        parser.error(
            f"SLUICE_GRPC_EDGE / --grpc-edge: expected one of {', '.join(GrpcEdge.ALL)}, "
            f"got '{ns.grpc_edge}'"
        )
    from .errors import ServerError
    from .repository.model_config import check_config_name
    from .repository.remote import default_cache_dir, plan_repositories

    cache_dir = ns.repository_cache_dir or default_cache_dir()
    try:
        repositories, remotes = plan_repositories(ns.model_repository, cache_dir, os.environ)
    except ServerError as exc:
        parser.error(f"--model-repository: {exc}")
    if ns.repository_timeout_secs <= 0:
        parser.error("--repository-timeout-secs must be > 0")
    try:
        check_config_name(ns.model_config_name)
    except ValueError as exc:
        parser.error(str(exc))
    if ns.repository_download_parallel < 1:
        parser.error("--repository-download-parallel must be >= 1")
    return ServerConfig(
        model_repositories=repositories,
        remote_repositories=remotes,
        repository_cache_dir=cache_dir,
        repository_cache_size=ns.repository_cache_size,
        repository_timeout_secs=ns.repository_timeout_secs,
        repository_download_parallel=ns.repository_download_parallel,
        **_metrics_config(ns.metrics_config, parser),
        control_mode=ns.model_control_mode,
        model_config_name=ns.model_config_name,
        model_namespacing=ns.model_namespacing,
        load_models=loads,
        model_control_state=ns.model_control_state,
        strict_readiness=ns.strict_readiness,
        allow_http=ns.allow_http,
        allow_grpc=ns.allow_grpc,
        http_address=ns.http_address,
        http_max_input_size=ns.http_max_input_size,
        http_max_header_size=ns.http_max_header_size,
        http_port=ns.http_port,
        grpc_address=ns.grpc_address,
        grpc_port=ns.grpc_port,
        metrics_address=ns.metrics_address or ns.http_address,
        metrics_port=ns.metrics_port,
        port_file=ns.port_file,
        allow_metrics=ns.allow_metrics,
        allow_cpu_metrics=ns.allow_cpu_metrics,
        metrics_interval_ms=ns.metrics_interval_ms,
        repository_poll_secs=ns.repository_poll_secs,
        exit_timeout_secs=ns.exit_timeout_secs,
        traffic_follows_readiness=ns.traffic_follows_readiness,
        server_name=ns.server_name,
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
        grpc_edge_colocate=ns.grpc_edge_colocate,
        grpc_channel_args=_grpc_channel_args(ns),
        grpc_infer_allocation_pool_size=ns.grpc_infer_allocation_pool_size,
        cache_size_bytes=_cache_size(ns.cache_config, parser),
        trace_config=_trace_config(ns, parser),
        model_memory_limit=ns.model_memory_limit,
        model_load_on_demand=ns.model_load_on_demand,
        model_pins=pins,
        rate_limit=ns.rate_limit,
        rate_limit_resources=_rate_limit_resources(ns.rate_limit_resource, parser),
        overload_status=ns.overload_status,
        openai=ns.openai,
        tokenizer=ns.tokenizer,
        chat_template=ns.chat_template,
        default_max_tokens=ns.default_max_tokens,
        **_security(ns, parser),  # type: ignore[arg-type]
    )


def _pins(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, ...]:
    """--model-pin names, checked: they need --model-load-on-demand, which needs a mode where
    the API or requests (not the repository poll) decide what is loaded."""
    from .core.validation import check_model_name
    from .errors import ServerError

    if ns.model_load_on_demand and ns.model_control_mode == ControlMode.POLL:
        parser.error(
            "--model-load-on-demand requires --model-control-mode=none or explicit (in poll "
            "mode the repository's contents decide what is loaded, and an evicted model "
            "would not come back until its files change)"
        )
    if ns.model_pin and not ns.model_load_on_demand:
        parser.error("--model-pin requires --model-load-on-demand=true")
    pins: list[str] = []
    for name in ns.model_pin:
        try:
            check_model_name(name)
        except ServerError as exc:
            parser.error(f"--model-pin: {exc}")
        if name not in pins:
            pins.append(name)
    return tuple(pins)


def _trace_config(
    ns: argparse.Namespace, parser: argparse.ArgumentParser
) -> tuple[tuple[str, str, str], ...]:
    """--trace-config items (and the deprecated --trace-* flags, which come first, so that
    --trace-config wins) as (mode, setting, value), checked once here."""
    from .tracing import parse_trace_flags, split_flag

    items: list[tuple[str, str, str]] = []
    if ns.trace_file is not None:
        items.append(("triton", "file", ns.trace_file))
    items += [("", "level", v) for v in ns.trace_level]
    for key, value in (
        ("rate", ns.trace_rate),
        ("count", ns.trace_count),
        ("log-frequency", ns.trace_log_frequency),
    ):
        if value is not None:
            items.append(("triton" if key == "log-frequency" else "", key, value))
    try:
        items += [split_flag(item) for item in ns.trace_config]
        parse_trace_flags(items)
    except ValueError as exc:
        parser.error(str(exc))
    return tuple(items)


def _cache_size(items: list[str], parser: argparse.ArgumentParser) -> int:
    from .core.cache import parse_cache_config

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
        # python models' fork server: its imports go on while the server's do
        from .backends.python.forkserver import prestart_for

        prestart_for(config)
        from .server import run

        return run(config)
    if ns.command == "perf":
        from .perf.cli import run_perf

        return run_perf(ns)
    if ns.command == "model":
        from .ops.model_cmd import run_model

        return run_model(ns)
    if ns.command == "tune":
        from .ops.tune import run_tune

        return run_tune(ns)
    if ns.command == "repo":
        from .lint.cli import run_repo

        return run_repo(ns)
    if ns.command == "keys":
        from .security.keys import run_keys

        return run_keys(ns)
    parser.error(f"unknown command {ns.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
