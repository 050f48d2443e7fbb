"""The dependency direction of DESIGN.md: the core never imports a front-end, grpc itself, or
the web stack (tritonclient's generated protobuf schemas are data, not transport), and
``core/`` (what is serving now) never reaches up into the manager that writes it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "sluice"
CORE = [
    "service.py",
    "types.py",
    "errors.py",
    "config.py",
    "core",
    "observability",
    "security",
    "host",
    "repository",
    "scheduling",
    "backends",
]
FORBIDDEN = ("grpc", "uvicorn", "starlette", "httptools", "sluice.frontends", "sluice.perf")
# core/ is read by the manager, the service and the front-ends; it imports none of them.
CORE_FORBIDDEN = (
    *FORBIDDEN,
    "sluice.repository.manager",
    "sluice.repository.versions",
    "sluice.service",
    "sluice.server",
    "sluice.cli",
)


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


def _files(places: list[str]) -> list[Path]:
    return [
        p for c in places for p in ((SRC / c).rglob("*.py") if (SRC / c).is_dir() else [SRC / c])
    ]


def _bad(files: list[Path], forbidden: tuple[str, ...]) -> list[tuple[str, str]]:
    return [
        (str(f.relative_to(SRC)), name)
        for f in files
        for name in _imports(f)
        if any(name == x or name.startswith(x + ".") for x in forbidden)
    ]


def test_core_does_not_import_front_ends_or_transports():
    files = _files(CORE)
    assert len(files) > 20
    assert _bad(files, FORBIDDEN) == []


def test_core_package_does_not_import_the_manager_or_the_service():
    files = _files(["core"])
    assert len(files) >= 7
    assert _bad(files, CORE_FORBIDDEN) == []


def test_few_modules_lie_flat_at_the_top():
    flat = sorted(p.name for p in SRC.glob("*.py"))
    assert flat == [
        "__init__.py",
        "__main__.py",
        "cli.py",
        "config.py",
        "errors.py",
        "server.py",
        "service.py",
        "types.py",
    ]
