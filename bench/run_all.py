"""Every benchmark against Triton in one run, written to one dated results file.

    .venv/bin/python bench/run_all.py            # full: ~15 minutes on 2 cores
    .venv/bin/python bench/run_all.py --quick    # ~3 minutes: 1 round, short windows
    .venv/bin/python bench/run_all.py --docs-only  # rewrite the page's figures from bench/results
    .venv/bin/python bench/run_all.py --skip resnet memory

Runs, in this order, each in the same invocation:

1. the matrix (``bench/vs_triton.py``): 5 python models x gRPC, HTTP x c=1, 8, 32, sluice and
   real Triton 2.51 up at once, time-adjacent pairs, the median of the paired ratios (full: 3
   rounds of 800 ms windows; quick: 1 round of 500 ms);
2. ResNet-50 ONNX (``bench/resnet50_onnx.py``): sluice / the same onnxruntime session
   in-process at its best batch size, and the knee of the seed's concurrency sweep against
   Triton's onnxruntime backend modelled in-process;
3. python-model memory and start-up (``bench/python_memory.py``), when that script exists
   (quick: N = 10 only).

It writes ``bench/results/<UTC date>-<HHMM>[-quick].md`` (what a reader compares) and ``.json``
(every figure: ``bench/ratio_table.py --json`` prints its matrix again), with the commit
measured and each cell's median beside the previous run's of the same mode; a part that
fails is said there and the run goes on (exit status 1). A complete full run then
rewrites the performance page's current figures (``docs/performance.md``, between the
``run_all`` markers) from the latest full results file only; a quick run leaves the page
alone (its windows are too short to be the page's figures).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import ratio_table  # noqa: E402
import resnet50_onnx  # noqa: E402
import vs_triton  # noqa: E402

RESULTS = HERE / "results"
PAGE = ROOT / "docs" / "performance.md"
BEGIN = "<!-- run_all:begin (written by bench/run_all.py from the latest full run) -->"
END = "<!-- run_all:end -->"
MEMORY = HERE / "python_memory.py"
PARTS = ("matrix", "resnet", "memory")


def say(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


def commit() -> str:
    def git(*args: str) -> str:
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return r.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "src", "bench/*.py")
    return head + (" + uncommitted changes" if dirty else "")


def run_memory(quick: bool) -> dict[str, Any]:
    """bench/python_memory.py as it is (another script's flags: only those its --help lists)."""
    with tempfile.TemporaryDirectory(prefix="sluice-run-all-") as tmp:
        return _run_memory(quick, Path(tmp) / "memory.json")


def _run_memory(quick: bool, json_path: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(HERE)])}
    helptext = subprocess.run(
        [sys.executable, str(MEMORY), "--help"], capture_output=True, text=True, env=env
    ).stdout
    flags = ["--counts", "10"] if quick and "--counts" in helptext else []
    cmd = [sys.executable, str(MEMORY), *flags]
    if "--json" in helptext:
        cmd += ["--json", str(json_path)]
    t0 = time.monotonic()
    try:
        r = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=300 if quick else 900
        )
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = f"{e.stdout or ''}\ntimed out", 124
    rows = None
    if json_path.exists():
        rows = json.loads(json_path.read_text())
    table = [ln for ln in out.splitlines() if ln.startswith("|")]
    return {
        "command": " ".join([".venv/bin/python bench/python_memory.py", *flags]),
        "rc": rc,
        "seconds": round(time.monotonic() - t0),
        "table": "\n".join(table),
        "tail": "\n".join(out.strip().splitlines()[-15:]),
        "rows": rows,
    }


# ----------------------------------------------------------------------------- the file
def matrix_markdown(m: dict[str, Any]) -> str:
    s = m["settings"]
    printed = s.get("numpy") or {}
    numpy = (
        "The python models' numpy, as the heavy models printed it at initialize: "
        + ", ".join(
            f"{server} {' '.join(sorted(set(got.values()))) or 'not printed'}"
            for server, got in printed.items()
        )
        + " (sluice's process tree imports Triton's venv's numpy: `vs_triton.peers_numpy`).\n\n"
        if printed
        else ""
    )
    return numpy + (
        f"{len(m['cells'])} cells, {s['rounds']} round(s) of {s['interval_ms']} ms windows "
        "(perf_analyzer -p; 3 windows per run), both servers up at once, the order alternating; "
        "each cell: the median of the paired sluice/Triton throughput ratios, then each round's; "
        "flagged: a round below 1.0 or a median below 1.2, and for a model without batching a "
        "ceiling below 1.2 (one instance's most, 1e6 / sluice's execute() time per request, over "
        "Triton's throughput: the best ratio any server could reach there).\n\n"
        + ratio_table.markdown_table(m)
    )


def resnet_markdown(r: dict[str, Any]) -> str:
    sk, tk = r["sluice_knee"], r["triton_knee"]

    def knee(k: dict[str, Any]) -> str:
        where = f"c={k['c']}" if k["found"] else f"none up to c={r['levels'][-1]}, best c={k['c']}"
        return f"{k['per_sec']:.1f} img/s (knee {where})"

    ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.3f}"
    pairs = " ".join(f"{x:.3f}" for x in r["pairs"])
    knee_ratio = "n/a" if r["knee_ratio"] is None else f"{r['knee_ratio']:.2f}"
    return "\n".join(
        [
            "| ResNet-50 ONNX (seed config, gRPC) | figure | goal |",
            "|---|---|---|",
            f"| sluice / the same onnxruntime session in-process at its best batch size "
            f"(batch {r['best_batch']}; sluice at c={r['best_c']}) | {ratio} ({pairs}) | >= 0.98 |",
            f"| knee of `--concurrency-range 1:32` (levels {' '.join(map(str, r['levels']))}), "
            f"sluice | {knee(sk)} | |",
            f"| the same, Triton's onnxruntime backend modelled in-process (2 sessions, "
            f"default threads) | {knee(tk)} | |",
            f"| sluice / Triton at the knee | {knee_ratio} | >= 1.0 |",
        ]
    )


def write_results(res: dict[str, Any], stamp: str) -> Path:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stamp}.json").write_text(json.dumps(res, indent=1) + "\n")
    mode = "quick" if res["quick"] else "full"
    lines = [
        f"# Benchmarks, {res['started'][:16].replace('T', ' ')} UTC ({mode} run)",
        "",
        f"Code: commit {res['commit']}. Machine: {res['machine']['cpus']} cores "
        f"({res['machine']['cpu']}), load average {_load(res['machine']['load'])} before, "
        f"{_load(res['machine']['load_after'])} after. Took {res['seconds'] / 60:.1f} minutes. "
        f"Command: `.venv/bin/python bench/run_all.py{' --quick' if res['quick'] else ''}`.",
    ]
    if res.get("skipped"):
        lines += ["", f"Skipped (`--skip`): {', '.join(res['skipped'])}."]
    for part, why in res.get("failed", {}).items():
        lines += ["", f"**{part} failed**: {why}"]
    if res.get("note"):
        lines += ["", res["note"]]
    if "matrix" in res:
        m = res["matrix"]
        lines += ["", "## sluice vs Triton 2.51, python models", "", matrix_markdown(m)]
        lines += ["", "Every figure (medians of each server's runs):", "", "```"]
        lines += [ratio_table.paired_table(m), "```"]
        if res.get("previous"):
            lines += ["", f"Against the previous {mode} run ({res['previous']['stamp']}):"]
            lines += ["", "```", res["previous"]["compare"], "```"]
    if "resnet" in res:
        lines += ["", "## ResNet-50 ONNX", "", resnet_markdown(res["resnet"]), "", "```"]
        lines += [resnet50_onnx.report(res["resnet"]), "```"]
    if "memory" in res:
        mem = res["memory"]
        lines += ["", "## Python models: memory and start-up", ""]
        lines += [f"`{mem['command']}` (exit status {mem['rc']}, {mem['seconds']} s)", ""]
        lines += [mem["table"] or "```\n" + mem["tail"] + "\n```"]
    path = RESULTS / f"{stamp}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _load(load: list[float]) -> str:
    return " / ".join(f"{x:.1f}" for x in load)


# ------------------------------------------------------------------------ previous runs
def runs(quick: bool, has: str = "") -> list[Path]:
    """Saved results of one mode, oldest first (the names sort by date); with ``has``, only
    those that measured that part (a run with ``--skip`` leaves parts out)."""
    found = [p for p in sorted(RESULTS.glob("2*.json")) if p.stem.endswith("-quick") == quick]
    if has:
        found = [p for p in found if has in json.loads(p.read_text())]
    return found


def _complete(res: dict[str, Any]) -> bool:
    return not res.get("skipped") and not res.get("failed")


def page_block(res: dict[str, Any], stamp: str) -> str:
    """The performance page's current figures, from one full results file."""
    parts = [
        f"Measured {res['started'][:10]} by `bench/run_all.py` (results file "
        f"`bench/results/{stamp}.md`, commit {res['commit']}, load average "
        f"{_load(res['machine']['load'])} at the start on this {res['machine']['cpus']}-core "
        "machine). Both servers measured in the same run, so compare ratios; absolute numbers "
        "vary with machine load.",
    ]
    if "matrix" in res:
        parts.append(matrix_markdown(res["matrix"]))
    if "resnet" in res:
        parts.append(resnet_markdown(res["resnet"]))
    if "memory" in res and res["memory"]["table"]:
        parts.append("Python models, memory and start-up:\n\n" + res["memory"]["table"])
    return "\n\n".join(parts)


def update_page(page: Path = PAGE) -> str | None:
    """Rewrite the page's block from the latest full run that skipped and failed nothing; its
    stamp is returned (None when there is none yet). A page without the markers is an error."""
    full = [p for p in runs(quick=False) if _complete(json.loads(p.read_text()))]
    if not full:
        return None
    latest = full[-1]
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{page}: the run_all markers are missing")
    res = json.loads(latest.read_text())
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    page.write_text(f"{head}{BEGIN}\n{page_block(res, latest.stem)}\n{END}{tail}")
    return latest.stem


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip", nargs="+", default=[], choices=PARTS)
    ap.add_argument("--docs-only", action="store_true", help="only rewrite the page's figures")
    ap.add_argument("--note", default="", help="a line for the results file (e.g. the load)")
    args = ap.parse_args()
    if args.docs_only:
        stamp = update_page()
        print(f"{PAGE}: figures from {stamp}" if stamp else "no full run in bench/results yet")
        return 0
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
    )
    started = datetime.now(UTC)
    stamp = started.strftime("%Y-%m-%d-%H%M") + ("-quick" if args.quick else "")
    res: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "quick": args.quick,
        "commit": commit(),
        "machine": vs_triton.machine(),
        "note": args.note,
        "skipped": args.skip,
    }
    t0 = time.monotonic()
    if "matrix" not in args.skip:
        say("matrix: sluice vs Triton, python models")
        opts = vs_triton.QUICK if args.quick else vs_triton.FULL
        if attempt(res, "matrix", lambda: vs_triton.run_matrix(say=say, **opts)):
            say("\n" + ratio_table.paired_table(res["matrix"]))
            earlier = runs(args.quick, has="matrix")
            if earlier:
                old = json.loads(earlier[-1].read_text())
                res["previous"] = {
                    "stamp": earlier[-1].stem,
                    "compare": ratio_table.compare(res["matrix"], old["matrix"]),
                }
    if "resnet" not in args.skip:
        say("ResNet-50 ONNX")
        ropts = resnet50_onnx.QUICK if args.quick else resnet50_onnx.FULL
        if attempt(res, "resnet", lambda: resnet50_onnx.run(**ropts, say=say)):
            say("\n" + resnet50_onnx.report(res["resnet"]))
    if "memory" not in args.skip and MEMORY.exists():
        say("python models: memory and start-up (bench/python_memory.py)")
        res["memory"] = run_memory(args.quick)
        say("\n" + (res["memory"]["table"] or res["memory"]["tail"]))
    res["seconds"] = round(time.monotonic() - t0)
    res["machine"]["load_after"] = os.getloadavg()
    path = write_results(res, stamp)
    say(f"wrote {path.relative_to(ROOT)} and its .json ({res['seconds'] / 60:.1f} minutes)")
    if not args.quick:
        say(f"{PAGE.relative_to(ROOT)}: figures from {update_page()}")
    return 1 if res.get("failed") else 0


def attempt(res: dict[str, Any], part: str, measure: Any) -> bool:
    """``res[part] = measure()``; a part that fails is recorded and the run goes on."""
    try:
        res[part] = measure()
        return True
    except (Exception, SystemExit) as exc:
        res.setdefault("failed", {})[part] = f"{type(exc).__name__}: {exc}"
        say(f"{part} failed: {exc}")
        return False


if __name__ == "__main__":
    sys.exit(main())
