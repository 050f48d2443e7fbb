"""TLS for the HTTP and gRPC front-ends (``--grpc-use-ssl*`` as tritonserver spells them,
and the same shape for HTTP, which Triton lacks).

A ``TlsFiles`` (``config.py``) names the server's certificate and key (PEM), the root certificate that client
certificates must chain to, and whether a client certificate is required (mutual TLS). It is
checked at start: a file that cannot be read, or a key that does not match, stops the server
with one line naming the flag.

Usage::

    tls = TlsFiles.from_flags("--grpc", use_ssl=True, mutual=False, cert=c, key=k, root="")
    key_pem, cert_pem, root_pem, mutual = pems(tls)   # for gRPC
    options = uvicorn_options(tls)                    # for HTTP
"""

from __future__ import annotations

import ssl

from ..config import TlsFiles

__all__ = ["context", "pems", "uvicorn_options"]


def _read(tls: TlsFiles, what: str, path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{tls.flag}-{what}={path}: cannot read it: {exc}") from None


def pems(tls: TlsFiles) -> tuple[str, str, str, bool]:
    """(key, certificate, root certificate, mutual) as PEM text, checked with ``ssl``."""
    context(tls)
    return (
        _read(tls, "server-key", tls.key),
        _read(tls, "server-cert", tls.cert),
        _read(tls, "root-cert", tls.root) if tls.root else "",
        tls.mutual,
    )


def context(tls: TlsFiles) -> ssl.SSLContext:
    """The server-side SSLContext (also the check that the files hold what they should)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(tls.cert, tls.key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"{tls.flag}-server-cert={tls.cert} / {tls.flag}-server-key={tls.key}: "
            f"not a usable certificate and key: {exc}"
        ) from None
    if tls.root:
        try:
            ctx.load_verify_locations(tls.root)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"{tls.flag}-root-cert={tls.root}: not a usable certificate: {exc}"
            ) from None
    ctx.verify_mode = ssl.CERT_REQUIRED if tls.mutual else ssl.CERT_NONE
    return ctx


def uvicorn_options(tls: TlsFiles) -> dict[str, object]:
    context(tls)
    out: dict[str, object] = {"ssl_certfile": tls.cert, "ssl_keyfile": tls.key}
    if tls.root:
        out["ssl_ca_certs"] = tls.root
    out["ssl_cert_reqs"] = int(ssl.CERT_REQUIRED if tls.mutual else ssl.CERT_NONE)
    return out
