"""TLS for the HTTP and gRPC front-ends (``--grpc-use-ssl*`` as tritonserver spells them,
and the same shape for HTTP, which Triton lacks).

A ``TlsFiles`` names the server's certificate and key (PEM), the root certificate that client
certificates must chain to, and whether a client certificate is required (mutual TLS). It is
checked at start: a file that cannot be read, or a key that does not match, stops the server
with one line naming the flag.

Usage::

    tls = TlsFiles.from_flags("--grpc", use_ssl=True, mutual=False, cert=c, key=k, root="")
    key_pem, cert_pem, root_pem, mutual = tls.pems()   # for gRPC
    uvicorn_options = tls.uvicorn_options()            # for HTTP
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

__all__ = ["TlsFiles"]


@dataclass(frozen=True, slots=True)
class TlsFiles:
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

    def _read(self, what: str, path: str) -> str:
        try:
            with open(path, encoding="ascii") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{self.flag}-{what}={path}: cannot read it: {exc}") from None

    def pems(self) -> tuple[str, str, str, bool]:
        """(key, certificate, root certificate, mutual) as PEM text, checked with ``ssl``."""
        self.context()
        return (
            self._read("server-key", self.key),
            self._read("server-cert", self.cert),
            self._read("root-cert", self.root) if self.root else "",
            self.mutual,
        )

    def context(self) -> ssl.SSLContext:
        """The server-side SSLContext (also the check that the files hold what they should)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"{self.flag}-server-cert={self.cert} / {self.flag}-server-key={self.key}: "
                f"not a usable certificate and key: {exc}"
            ) from None
        if self.root:
            try:
                ctx.load_verify_locations(self.root)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(
                    f"{self.flag}-root-cert={self.root}: not a usable certificate: {exc}"
                ) from None
        ctx.verify_mode = ssl.CERT_REQUIRED if self.mutual else ssl.CERT_NONE
        return ctx

    def uvicorn_options(self) -> dict[str, object]:
        self.context()
        out: dict[str, object] = {"ssl_certfile": self.cert, "ssl_keyfile": self.key}
        if self.root:
            out["ssl_ca_certs"] = self.root
        out["ssl_cert_reqs"] = int(ssl.CERT_REQUIRED if self.mutual else ssl.CERT_NONE)
        return out
