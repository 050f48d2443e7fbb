"""API keys with roles (``--api-keys-file``): sluice's own, beyond Triton.

The file holds one key per line, never the key itself::

    # sha256 of the key                                               role       name
    9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  inference  ci-runner
    sha256:60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752  admin  ops

Roles: ``inference`` may use health, metadata, model-config (read only), inference and
statistics; ``admin`` every API.
A presented key is hashed and compared with every stored hash in constant time
(``hmac.compare_digest``, no early exit), so neither the key nor its position leaks through
timing. ``sluice keys new --role R --name N`` prints a fresh key (stdout, once) and the line
to add to the file (stderr); ``sluice keys hash --role R --name N`` reads a key from stdin.

Usage::

    ring = KeyRing.load(Path("keys.txt"))   # KeyFileError names the file and line
    key = ring.find(token)                  # ApiKey or None
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ROLES",
    "ApiKey",
    "KeyRing",
    "KeyFileError",
    "hash_key",
    "new_key",
    "add_keys_parser",
    "run_keys",
]

ROLES: dict[str, frozenset[str]] = {
    # model-config (read only) too: perf_analyzer and most clients read the config first
    "inference": frozenset({"health", "metadata", "model-config", "inference", "statistics"}),
    "admin": frozenset(
        {
            "health",
            "metadata",
            "inference",
            "shared-memory",
            "model-config",
            "model-repository",
            "statistics",
            "trace",
            "logging",
        }
    ),
}


class KeyFileError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class ApiKey:
    digest: bytes  # sha256 of the key
    role: str
    name: str
    groups: frozenset[str]


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return "sk-" + secrets.token_urlsafe(32)


def _parse_line(line: str, where: str) -> ApiKey:
    fields = line.split()
    if len(fields) != 3:
        raise KeyFileError(
            f"{where}: expected '<sha256 hex> <role> <name>', got {len(fields)} field(s)"
        )
    digest, role, name = fields
    if digest.lower().startswith("sha256:"):
        digest = digest[len("sha256:") :]
    try:
        raw = bytes.fromhex(digest)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise KeyFileError(f"{where}: the first field must be a SHA-256 hash (64 hex digits)")
    if role not in ROLES:
        raise KeyFileError(f"{where}: unknown role '{role}' (expected {' or '.join(ROLES)})")
    return ApiKey(raw, role, name, ROLES[role])


class KeyRing:
    """The keys of one file; ``load`` again to re-read it (the server does on SIGHUP)."""

    def __init__(self, keys: list[ApiKey], path: Path | None = None) -> None:
        self.keys = keys
        self.path = path

    @classmethod
    def load(cls, path: Path) -> KeyRing:
        try:
            text = path.read_text()
        except OSError as exc:
            raise KeyFileError(f"--api-keys-file {path}: {exc.strerror or exc}") from None
        keys: list[ApiKey] = []
        names: set[str] = set()
        for i, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key = _parse_line(line, f"--api-keys-file {path}:{i}")
            if key.name in names:
                raise KeyFileError(f"--api-keys-file {path}:{i}: the name '{key.name}' repeats")
            names.add(key.name)
            keys.append(key)
        return cls(keys, path)

    def find(self, token: str) -> ApiKey | None:
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found = None
        for key in self.keys:  # every hash compared, whatever matches
            if hmac.compare_digest(digest, key.digest):
                found = key
        return found


def add_keys_parser(sub: Any) -> None:
    """``sluice keys new|hash --role R --name N``."""
    keys = sub.add_parser("keys", help="make API keys and their --api-keys-file lines")
    ksub = keys.add_subparsers(dest="keys_command", required=True, metavar="COMMAND")
    for name, text in (
        ("new", "a fresh random key (stdout) and its file line (stderr)"),
        ("hash", "the file line of the key read from stdin"),
    ):
        p = ksub.add_parser(name, help=text)
        p.add_argument("--role", choices=sorted(ROLES), required=True)
        p.add_argument("--name", required=True)


def run_keys(ns: argparse.Namespace) -> int:
    if any(c.isspace() for c in ns.name) or not ns.name:
        print("error: --name must be one word", file=sys.stderr)
        return 2
    if ns.keys_command == "new":
        key = new_key()
        print(key)
    else:
        key = sys.stdin.readline().strip()
        if not key:
            print("error: no key on stdin", file=sys.stderr)
            return 2
    line = f"{hash_key(key)} {ns.role} {ns.name}"
    print(line, file=sys.stderr if ns.keys_command == "new" else sys.stdout)
    return 0
