"""The dependency direction of DESIGN.md: the core never imports a front-end, grpc itself, or
the web stack (tritonclient's generated protobuf schemas are data, not transport), and
``core/`` (what is serving now) never reaches up into the manager that writes it."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
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


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of src/sluice it imports, ``if TYPE_CHECKING:`` imports included
    (a cycle through type hints is still a cycle in the design). ``from pkg import mod``
    counts as importing ``pkg.mod``. The root package's one import, inside its PEP 562
    ``__getattr__`` (``sluice.Server`` served from ``sluice.api`` on first use), is no
    dependency: nothing imports it at import time (``test_import_sluice_stays_cheap``)."""
    mods = {_module(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        out: set[str] = set()
        if name == "sluice":
            graph[name] = out
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join([*pkg, *([node.module] if node.module else [])])
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    out.add(sub if sub in mods else base)
        graph[name] = {m for m in out if m in mods and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_import_sluice_stays_cheap():
    """The root package imports nothing of its own at module level: the in-process API
    (``sluice.api``: the server, numpy, the front-ends' libraries) loads on first use of
    ``sluice.Server``, not with ``import sluice`` (which every python-model worker does)."""
    tree = ast.parse((SRC / "__init__.py").read_text())
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    assert [(getattr(n, "module", None) or n.names[0].name) for n in top] == [
        "__future__",
        "typing",
    ]
    code = (
        "import sys, sluice; before = 'sluice.api' in sys.modules or 'numpy' in sys.modules; "
        "sluice.Server; print(before, 'sluice.api' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(SRC.parent)},
    )
    assert out.stdout.split() == ["False", "True"]


def test_cycle_finder_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    graph = _graph()
    assert len(graph) > 100
    assert _cycles(graph) == []


def test_no_arrows_back_up():
    """Lower packages never import higher ones: the backends take nothing from the
    repository, the load tester nothing from the server's scheduling or from ops (ops builds
    on perf), and the config nothing from what it configures."""
    rules = {
        "sluice.backends": ("sluice.repository", "sluice.service", "sluice.server"),
        "sluice.perf": ("sluice.ops", "sluice.scheduling", "sluice.service", "sluice.server"),
        "sluice.config": ("sluice.security.access", "sluice.frontends", "sluice.core"),
        "sluice.protocol": ("sluice.core", "sluice.repository", "sluice.service"),
    }
    bad = [
        (mod, dep)
        for mod, deps in _graph().items()
        for low, highs in rules.items()
        if mod == low or mod.startswith(low + ".")
        for dep in deps
        if any(dep == h or dep.startswith(h + ".") for h in highs)
    ]
    assert bad == []


def test_what_serves_is_read_through_the_registry():
    """Outside ``repository/`` (the manager and the procedures that drive it) and
    ``server.py`` (which builds everything), nothing reaches into the manager's records or
    private methods: readers hold the registry (``core/registry.py``)."""
    allowed = {"server.py"}
    reach = ("manager.records", "manager._", ".manager.records", "manager.serving.")
    bad = [
        (str(p.relative_to(SRC)), line.strip())
        for p in SRC.rglob("*.py")
        if p.relative_to(SRC).parts[0] != "repository" and str(p.relative_to(SRC)) not in allowed
        for line in p.read_text().splitlines()
        if any(r in line for r in reach)
    ]
    assert bad == []
    # the registry's writes come from the repository's procedures only
    writes = re.compile(
        r"registry\.(publish|retire|set_state|set_states|drop_state|set_traffic|forget)\("
    )
    writers = sorted(
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if p.relative_to(SRC).parts[0] != "repository"
        and p != SRC / "core" / "registry.py"  # its usage example
        and writes.search(p.read_text())
    )
    assert writers == []
    assert writes.search((SRC / "repository" / "manager.py").read_text())
    # and ``repository/versions.py`` drives the manager through its public methods only
    versions = (SRC / "repository" / "versions.py").read_text()
    assert "manager._" not in versions


# The floors of the house, ground first: a module imports only from its own package or from a
# lower floor (a package on the same floor is a neighbour, not a dependency: never imported).
FLOORS = [
    ["types", "errors", "config", "host"],
    ["protocol"],
    ["backends", "tracing", "security", "perf"],
    ["core"],
    ["scheduling", "observability"],
    ["repository"],
    ["service", "lint", "ops"],
    ["frontends"],
    ["server"],
    ["cli"],
    ["api"],
    ["__main__"],
]


def _floor(module: str) -> tuple[int, str]:
    top = module.split(".")[1] if module.count(".") else ""
    for i, names in enumerate(FLOORS):
        if top in names:
            return i, top
    raise AssertionError(f"{module}: on no floor; add its package to FLOORS")


def test_every_import_runs_down_a_floor_or_stays_in_its_package():
    up = []
    for mod, deps in _graph().items():
        if mod == "sluice":
            continue
        floor, pkg = _floor(mod)
        for dep in deps:
            if dep == "sluice":
                continue
            dep_floor, dep_pkg = _floor(dep)
            if dep_pkg != pkg and dep_floor >= floor:
                up.append((mod, dep))
    assert sorted(up) == []
