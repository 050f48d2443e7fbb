"""sluice vs Triton tables, with the ratio the issues use (sluice / Triton throughput).

    .venv/bin/python bench/ratio_table.py --json bench/results/DATE.json [--markdown]
    .venv/bin/python bench/ratio_table.py [--results /tmp/peers/results] [--rounds N]
    .venv/bin/python bench/ratio_table.py --history bench/results/*.json

The first form reads what ``bench/vs_triton.py --json`` (or ``bench/run_all.py``) saved: per
cell the time-adjacent pairs of every round. ``paired_table`` prints each cell's median
throughputs and p99s, every round's ratio, the median of the paired ratios and flags
(a round below the round goal, a median below the median goal, and for a model without
batching the ``ceiling``: the most one instance can serve, 1e6 / sluice's own Server Compute
Infer in us, over Triton's throughput, i.e. the best ratio any server could reach in that
cell; flagged when it is below the median goal); ``markdown_table`` is the
performance page's table; ``compare`` sets a run's medians beside an earlier run's;
``history`` (``--history``) sets every cell's medians across full runs side by side, with
how many of them met the goal: which cells repeat and which flip between runs of one code.

The second form reads bench-peers' ``run.sh`` result folders (``--rounds N``: the folders
suffixed ``_r1`` ... ``_rN``, each round a whole sweep on fresh servers).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

Rows = dict[tuple[str, str, int], dict[str, str]]
Result = dict[str, Any]  # bench/vs_triton.py's run_matrix()


def load(results: Path, name: str) -> Rows:
    """(model, protocol, concurrency) -> perf_analyzer summary row for one target."""
    out: Rows = {}
    path = results / name / "summary.csv"
    if not path.exists():
        return out
    with path.open() as f:
        for row in csv.DictReader(f):
            out[(row["model"], row["proto"], int(row["concurrency"]))] = row
    return out


def num(row: dict[str, str] | None, key: str) -> float:
    try:
        return float(row[key]) if row else 0.0
    except (KeyError, ValueError):
        return 0.0


def table(sluice: Rows, triton: Rows) -> str:
    lines = [
        f"{'model':<15}{'proto':<10}{'conc':>5} | {'sluice inf/s':>12} {'p99 ms':>7} | "
        f"{'triton inf/s':>12} {'p99 ms':>7} | {'sluice/triton':>13} {'p99 ratio':>9}"
    ]
    for key in sorted(set(sluice) | set(triton)):
        s, t = sluice.get(key), triton.get(key)
        st, tt = num(s, "infer_per_sec"), num(t, "infer_per_sec")
        sp, tp = num(s, "p99_us") / 1e3, num(t, "p99_us") / 1e3
        ratio = f"{st / tt:.2f}x" if st and tt else "n/a"
        pratio = f"{sp / tp:.2f}x" if sp and tp else "n/a"
        lines.append(
            f"{key[0]:<15}{key[1]:<10}{key[2]:>5} | {st:>12.0f} {sp:>7.2f} | {tt:>12.0f} "
            f"{tp:>7.2f} | {ratio:>13} {pratio:>9}"
        )
    return "\n".join(lines)


def rounds_table(rounds: list[tuple[Rows, Rows]]) -> str:
    """Per cell: median throughputs and p99s over the rounds, the median of the per-round
    sluice/Triton ratios and each round's (a round where either side failed is left out)."""
    lines = [
        f"{'model':<15}{'proto':<10}{'conc':>5} | {'sluice inf/s':>12} {'p99 ms':>7} | "
        f"{'triton inf/s':>12} {'p99 ms':>7} | {'median ratio':>12} | per round"
    ]
    keys = sorted({k for s, t in rounds for k in (*s, *t)})
    for key in keys:
        pairs = []
        for s, t in rounds:
            st, tt = num(s.get(key), "infer_per_sec"), num(t.get(key), "infer_per_sec")
            if st and tt:
                sp, tp = num(s.get(key), "p99_us") / 1e3, num(t.get(key), "p99_us") / 1e3
                pairs.append((st, tt, sp, tp))
        if not pairs:
            lines.append(f"{key[0]:<15}{key[1]:<10}{key[2]:>5} | no round measured both")
            continue
        med = [statistics.median(p[i] for p in pairs) for i in range(4)]
        ratios = [p[0] / p[1] for p in pairs]
        each = " ".join(f"{r:.2f}" for r in ratios)
        lines.append(
            f"{key[0]:<15}{key[1]:<10}{key[2]:>5} | {med[0]:>12.0f} {med[2]:>7.2f} | "
            f"{med[1]:>12.0f} {med[3]:>7.2f} | {statistics.median(ratios):>11.2f}x | {each}"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------- paired runs (vs_triton.py)
def ratios(cell: dict[str, Any]) -> list[float | None]:
    """Each round's sluice/Triton throughput ratio (None where either side failed)."""
    out: list[float | None] = []
    for r in cell["rounds"]:
        s, t = r.get("sluice"), r.get("triton")
        ok = s and t and s["infer_per_sec"] > 0 and t["infer_per_sec"] > 0
        out.append(s["infer_per_sec"] / t["infer_per_sec"] if ok else None)
    return out


def summary(
    cell: dict[str, Any], round_goal: float = 1.0, median_goal: float = 1.2
) -> dict[str, Any]:
    """A cell's median ratio, its rounds' ratios, median figures of each server, and flags."""
    each = ratios(cell)
    ok = [r for r in each if r is not None]
    side = {}
    for name in ("sluice", "triton"):
        runs = [r[name] for r in cell["rounds"] if r.get(name)]
        side[name] = {
            k: statistics.median(x[k] for x in runs) if runs else 0.0
            for k in ("infer_per_sec", "p99_us")
        }
    ceiling = None
    computes = [
        r["sluice"]["compute_infer_us"]
        for r in cell["rounds"]
        if r.get("sluice") and r["sluice"].get("compute_infer_us")
    ]
    if cell.get("unbatched") and computes and side["triton"]["infer_per_sec"]:
        ceiling = 1e6 / statistics.median(computes) / side["triton"]["infer_per_sec"]
    flags = []
    if ceiling is not None and ceiling < median_goal:
        flags.append(f"ceiling {ceiling:.2f}")
    if any(r < round_goal for r in ok):
        flags.append(f"round<{round_goal:g}")
    if ok and statistics.median(ok) < median_goal:
        flags.append(f"median<{median_goal:g}")
    if len(ok) < len(each):
        flags.append(f"{len(each) - len(ok)} of {len(each)} rounds failed")
    return {
        "median": statistics.median(ok) if ok else None,
        "ratios": each,
        "ceiling": ceiling,
        "flags": flags,
        **side,
    }


def _fmt(r: float | None) -> str:
    return "fail" if r is None else f"{r:.2f}"


def paired_table(result: Result, round_goal: float = 1.0, median_goal: float = 1.2) -> str:
    lines = [
        f"{'model':<16}{'proto':<6}{'conc':>4} | {'sluice inf/s':>12} {'p99 ms':>7} | "
        f"{'triton inf/s':>12} {'p99 ms':>7} | {'median':>6} | {'rounds':<16}| flags"
    ]
    short = bounded = 0
    for cell in result["cells"]:
        sm = summary(cell, round_goal, median_goal)
        sl, tr = sm["sluice"], sm["triton"]
        short += bool(sm["flags"])
        bounded += sm["ceiling"] is not None and sm["ceiling"] < median_goal
        lines.append(
            f"{cell['model']:<16}{cell['proto']:<6}{cell['c']:>4} | {sl['infer_per_sec']:>12.0f} "
            f"{sl['p99_us'] / 1e3:>7.2f} | {tr['infer_per_sec']:>12.0f} "
            f"{tr['p99_us'] / 1e3:>7.2f} | "
            f"{_fmt(sm['median']):>6} | {' '.join(_fmt(r) for r in sm['ratios']):<16}| "
            f"{', '.join(sm['flags'])}"
        )
    lines.append(
        f"{short} of {len(result['cells'])} cells flagged (goal: every round >= {round_goal:g}, "
        f"median >= {median_goal:g})"
    )
    if bounded:
        lines.append(
            f"{bounded} of them cannot reach {median_goal:g} on any server: 'ceiling' is one "
            "instance's most (1e6 / sluice's execute() time per request) over Triton's throughput"
        )
    return "\n".join(lines)


def markdown_table(result: Result, round_goal: float = 1.0, median_goal: float = 1.2) -> str:
    """One row per (model, protocol), one column per concurrency: the median of the paired
    ratios, then each round's; a cell short of a goal says which."""
    levels = result["settings"]["concurrency"]
    rows: dict[tuple[str, str], dict[int, str]] = {}
    for cell in result["cells"]:
        sm = summary(cell, round_goal, median_goal)
        text = _fmt(sm["median"])
        if len(sm["ratios"]) > 1:
            text += " (" + " ".join(_fmt(r) for r in sm["ratios"]) + ")"
        if sm["flags"]:
            text += " **" + ", ".join(sm["flags"]) + "**"
        rows.setdefault((cell["model"], cell["proto"]), {})[cell["c"]] = text
    proto_name = {"grpc": "gRPC", "http": "HTTP (binary)"}
    head = "| sluice/Triton throughput | " + " | ".join(f"c={c}" for c in levels) + " |"
    out = [head, "|---" * (len(levels) + 1) + "|"]
    for (model, proto), cols in rows.items():
        label = f"{result['labels'].get(model, model)}, {proto_name.get(proto, proto)}"
        out.append(f"| {label} | " + " | ".join(cols.get(c, "") for c in levels) + " |")
    return "\n".join(out)


def compare(new: Result, old: Result) -> str:
    """Each cell's median ratio now and in an earlier run (cells both measured)."""
    before = {(c["model"], c["proto"], c["c"]): summary(c)["median"] for c in old["cells"]}
    lines = [f"{'model':<16}{'proto':<6}{'conc':>4} | {'before':>6} -> {'now':>6}"]
    for cell in new["cells"]:
        key = (cell["model"], cell["proto"], cell["c"])
        if key in before:
            now = summary(cell)["median"]
            lines.append(
                f"{key[0]:<16}{key[1]:<6}{key[2]:>4} | {_fmt(before[key]):>6} -> {_fmt(now):>6}"
            )
    return "\n".join(lines)


def history(runs: list[tuple[str, Result]]) -> str:
    """Each cell across full runs (oldest first): every run's median ratio, ``*`` where the
    run flagged the cell, and in how many runs it met the goal; the cells in the newest
    run's order."""
    seen: dict[tuple[str, str, int], list[str]] = {}
    met: dict[tuple[str, str, int], int] = {}
    for _, result in runs:
        for cell in result["cells"]:
            key = (cell["model"], cell["proto"], cell["c"])
            s = summary(cell)
            seen.setdefault(key, []).append(_fmt(s["median"]) + ("*" if s["flags"] else ""))
            met[key] = met.get(key, 0) + (not s["flags"])
    order = [(c["model"], c["proto"], c["c"]) for c in runs[-1][1]["cells"]] if runs else []
    order += [k for k in seen if k not in order]
    lines = [
        f"{len(runs)} runs, {runs[0][0]} .. {runs[-1][0]}" if runs else "no runs",
        f"{'model':<16}{'proto':<6}{'conc':>4} | met | medians (* flagged)",
    ]
    for key in order:
        lines.append(f"{key[0]:<16}{key[1]:<6}{key[2]:>4} | {met[key]:>3} | {' '.join(seen[key])}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser()
    default = Path(os.environ.get("PEERS_DIR", "/tmp/peers")) / "results"
    p.add_argument("--results", type=Path, default=Path(os.environ.get("RESULTS_DIR", default)))
    p.add_argument("--suffix", default="", help="RESULT_SUFFIX the run used")
    p.add_argument("--rounds", type=int, default=1, help="ROUNDS the run used")
    p.add_argument("--json", type=Path, help="a run saved by bench/vs_triton.py --json")
    p.add_argument("--markdown", action="store_true", help="with --json: the page's table")
    p.add_argument(
        "--history", type=Path, nargs="+", help="full runs' JSON files: each cell across them"
    )
    args = p.parse_args()
    if args.history:
        runs = []
        for path in sorted(args.history):
            data = json.loads(path.read_text())
            runs.append((path.stem, data.get("matrix", data)))
        print(history(runs))
        return 0
    if args.json:
        result = json.loads(args.json.read_text())
        result = result.get("matrix", result)  # run_all's file holds the matrix under "matrix"
        print(markdown_table(result) if args.markdown else paired_table(result))
        return 0
    sfx = args.suffix
    if args.rounds > 1:
        rounds = [
            (load(args.results, f"sluice{sfx}_r{r}"), load(args.results, f"triton{sfx}_r{r}"))
            for r in range(1, args.rounds + 1)
        ]
        print(rounds_table(rounds))
        return 0
    print(table(load(args.results, "sluice" + sfx), load(args.results, "triton" + sfx)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
