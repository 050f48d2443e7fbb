"""The dependency direction of DESIGN.md: the core never imports a front-end, grpc itself, or
the web stack (tritonclient's generated protobuf schemas are data, not transport)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "sluice"
CORE = [
    "service.py",
    "stats.py",
    "validation.py",
    "types.py",
    "errors.py",
    "config.py",
    "metrics.py",
    "repository",
    "scheduling",
    "backends",
]
FORBIDDEN = ("grpc", "uvicorn", "starlette", "httptools", "sluice.frontends", "sluice.perf")


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # relative: resolve against the package
                pkg = path.relative_to(SRC.parent).with_suffix("").parts[: -node.level]
                mod = ".".join([*pkg, mod]) if mod else ".".join(pkg)
            names.append(mod)
    return names


def test_core_does_not_import_front_ends_or_transports():
    files = [
        p for c in CORE for p in ((SRC / c).rglob("*.py") if (SRC / c).is_dir() else [SRC / c])
    ]
    assert len(files) > 20
    bad = [
        (str(f.relative_to(SRC)), name)
        for f in files
        for name in _imports(f)
        if any(name == x or name.startswith(x + ".") for x in FORBIDDEN)
    ]
    assert bad == []
