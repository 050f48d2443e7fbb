#!/usr/bin/env python3
"""Write an nginx config for sluice replicas from sluice.conf.template.

    deploy/nginx/render.py --prefix /var/lib/sluice-nginx --http-listen 0.0.0.0:8000 \
        --grpc-listen 0.0.0.0:8001 --replica 10.0.0.1:8000,8001 --replica 10.0.0.2:8000,8001 \
        > sluice.conf
    nginx -p /var/lib/sluice-nginx -c $PWD/sluice.conf

Each ``--replica`` is ``HOST:HTTP_PORT,GRPC_PORT``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "sluice.conf.template"


def render(
    prefix: str,
    http_listen: str,
    grpc_listen: str,
    replicas: list[tuple[str, int, int]],
    fail_timeout: str = "2s",
) -> str:
    """The config text; ``replicas`` are (host, http_port, grpc_port)."""

    def servers(index: int) -> str:
        return "\n".join(
            f"        server {r[0]}:{r[index]} max_fails=1 fail_timeout={fail_timeout};"
            for r in replicas
        )

    return (
        TEMPLATE.read_text()
        .replace("@PREFIX@", prefix)
        .replace("@HTTP_LISTEN@", http_listen)
        .replace("@GRPC_LISTEN@", grpc_listen)
        .replace("@HTTP_UPSTREAMS@", servers(1))
        .replace("@GRPC_UPSTREAMS@", servers(2))
    )


def _replica(text: str) -> tuple[str, int, int]:
    host, _, ports = text.rpartition(":")
    http, _, grpc = ports.partition(",")
    if not host or not http.isdigit() or not grpc.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:HTTP_PORT,GRPC_PORT, got '{text}'")
    return host, int(http), int(grpc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prefix", required=True)
    p.add_argument("--http-listen", default="0.0.0.0:8000")
    p.add_argument("--grpc-listen", default="0.0.0.0:8001")
    p.add_argument("--replica", type=_replica, action="append", required=True)
    p.add_argument("--fail-timeout", default="2s")
    ns = p.parse_args(argv)
    sys.stdout.write(render(ns.prefix, ns.http_listen, ns.grpc_listen, ns.replica, ns.fail_timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
