"""Builds the native gRPC edge (``_edge*.so``) next to this file.

Usage::

    .venv/bin/python src/sluice/frontends/grpc_edge/build.py           # build if stale
    .venv/bin/python src/sluice/frontends/grpc_edge/build.py --force

Needs a C++17 compiler and gRPC C++ with its pkg-config file (Debian: ``libgrpc++-dev``;
``scripts/install-system-deps`` installs it). Where either is missing it says so and exits 0:
the server then serves gRPC with ``grpc.aio`` (the fallback), so ``pip install -e .`` and
``make install`` keep working on machines without the library. ``--strict`` exits 1 instead.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "_edge.cc"


def target() -> Path:
    return HERE / f"_edge{sysconfig.get_config_var('EXT_SUFFIX')}"


def _pkg_config(*args: str, package: str = "grpc++") -> list[str] | None:
    if shutil.which("pkg-config") is None:
        return None
    res = subprocess.run(["pkg-config", *args, package], capture_output=True, text=True)
    if res.returncode != 0:
        return None
    return shlex.split(res.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    ap.add_argument("--strict", action="store_true", help="fail when it cannot be built")
    ns = ap.parse_args(argv)
    out = target()
    if not ns.force and out.exists() and out.stat().st_mtime >= SOURCE.stat().st_mtime:
        print(f"grpc edge: {out.name} is up to date")
        return 0
    cxx = shutil.which("c++") or shutil.which("g++")
    flags = _pkg_config("--cflags", "--libs")
    if cxx is None or flags is None:
        why = "no C++ compiler" if cxx is None else "gRPC C++ not found (pkg-config grpc++)"
        print(f"grpc edge: not built: {why}; gRPC will be served by grpc.aio")
        return 1 if ns.strict else 0
    # abseil's mutexes without deadlock detection where abseil's own package is there to
    # link (_edge.cc: SLUICE_ABSL_SYNC)
    absl = _pkg_config("--cflags", "--libs", package="absl_synchronization")
    if absl is not None:
        flags = ["-DSLUICE_ABSL_SYNC", *flags, *absl]
    include = sysconfig.get_paths()["include"]
    tmp = out.with_suffix(".tmp")
    cmd = [
        cxx,
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        "-Wall",
        f"-I{include}",
        str(SOURCE),
        "-o",
        str(tmp),
        *flags,
    ]
    t0 = time.monotonic()
    res = subprocess.run(cmd)
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        print("grpc edge: build failed (see above); gRPC will be served by grpc.aio")
        return 1 if ns.strict else 0
    tmp.replace(out)
    print(f"grpc edge: built {out.name} in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
