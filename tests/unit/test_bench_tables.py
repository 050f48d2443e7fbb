"""The benchmark scripts' arithmetic and files: paired ratios, goal flags, the performance
page's block, the matrix's repository (bench/ratio_table.py, run_all.py, vs_triton.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import ratio_table  # noqa: E402
import run_all  # noqa: E402
import vs_triton  # noqa: E402


def fig(per_sec: float) -> dict[str, float]:
    return {"infer_per_sec": per_sec, "p50_us": 800.0, "p99_us": 1500.0}


def cell(model: str, proto: str, c: int, pairs: list[tuple[float | None, float]]) -> dict:
    rounds = [
        {"first": "sluice", "sluice": None if s is None else fig(s), "triton": fig(t)}
        for s, t in pairs
    ]
    return {"model": model, "proto": proto, "c": c, "rounds": rounds}


def matrix(cells: list[dict]) -> dict[str, Any]:
    return {
        "settings": {"rounds": 3, "interval_ms": 800, "concurrency": [1, 8]},
        "labels": {"add_sub": "add_sub, dynamic batching (500 us window)"},
        "cells": cells,
    }


def test_median_of_paired_ratios_and_flags() -> None:
    sm = ratio_table.summary(cell("add_sub", "grpc", 1, [(1100, 1000), (900, 1000), (1300, 1000)]))
    assert sm["ratios"] == pytest.approx([1.1, 0.9, 1.3])
    assert sm["median"] == pytest.approx(1.1)
    assert sm["flags"] == ["round<1", "median<1.2"]
    assert sm["sluice"]["infer_per_sec"] == 1100 and sm["triton"]["infer_per_sec"] == 1000


def test_a_cell_meeting_both_goals_has_no_flag() -> None:
    sm = ratio_table.summary(cell("add_sub", "http", 8, [(1250, 1000), (2400, 2000), (1300, 1000)]))
    assert sm["median"] == pytest.approx(1.25)  # ratios 1.25 1.2 1.3
    assert sm["flags"] == []


def test_a_model_without_batching_says_when_one_instance_cannot_reach_the_goal() -> None:
    # sluice's execute() takes 2,800 us a request: one instance serves at most ~357/s; Triton
    # served 350/s, so no server can be 1.2x here (357 / 350 = 1.02)
    c = cell("heavy_nobatch", "http", 8, [(360, 350), (355, 350), (340, 350)])
    c["unbatched"] = True
    for r in c["rounds"]:
        r["sluice"]["compute_infer_us"] = 2800.0
    sm = ratio_table.summary(c)
    assert sm["ceiling"] == pytest.approx(1e6 / 2800 / 350)
    assert sm["flags"] == ["ceiling 1.02", "round<1", "median<1.2"]
    table = ratio_table.paired_table({"cells": [c]})
    assert "1 of them cannot reach 1.2 on any server" in table
    # the same figures for a batched model, or without the server's compute figure: no ceiling
    c["unbatched"] = False
    assert ratio_table.summary(c)["ceiling"] is None
    c["unbatched"] = True
    for r in c["rounds"]:
        del r["sluice"]["compute_infer_us"]
    assert ratio_table.summary(c)["ceiling"] is None
    # a quick model: the ceiling is far above the goal and says nothing
    quick = cell("add_sub_nobatch", "http", 8, [(1100, 1000)] * 3)
    quick["unbatched"] = True
    quick["rounds"][0]["sluice"]["compute_infer_us"] = 15.0
    sm = ratio_table.summary(quick)
    assert sm["ceiling"] > 60 and sm["flags"] == ["median<1.2"]


def test_a_failed_run_pairs_nothing_and_is_said() -> None:
    sm = ratio_table.summary(cell("add_sub", "grpc", 8, [(None, 1000), (1500, 1000), (1300, 1000)]))
    assert sm["ratios"][0] is None
    assert sm["median"] == pytest.approx(1.4)
    assert sm["flags"] == ["1 of 3 rounds failed"]


def test_markdown_row_per_model_and_protocol() -> None:
    m = matrix(
        [
            cell("add_sub", "grpc", 1, [(1300, 1000), (1250, 1000), (1200, 1000)]),
            cell("add_sub", "grpc", 8, [(900, 1000), (1300, 1000), (1300, 1000)]),
        ]
    )
    lines = ratio_table.markdown_table(m).splitlines()
    assert lines[0] == "| sluice/Triton throughput | c=1 | c=8 |"
    assert lines[2] == (
        "| add_sub, dynamic batching (500 us window), gRPC | 1.25 (1.30 1.25 1.20) | "
        "1.30 (0.90 1.30 1.30) **round<1** |"
    )
    assert "1 of 2 cells flagged" in ratio_table.paired_table(m)


def test_compare_sets_the_medians_side_by_side() -> None:
    old = matrix([cell("add_sub", "grpc", 1, [(1000, 1000)])])
    new = matrix([cell("add_sub", "grpc", 1, [(1500, 1000)])])
    assert ratio_table.compare(new, old).splitlines()[1].endswith("1.00 ->   1.50")


def test_history_counts_the_runs_that_met_the_goal_per_cell() -> None:
    a = matrix(
        [
            cell("add_sub", "grpc", 1, [(1300, 1000)] * 3),
            cell("add_sub", "http", 8, [(900, 1000), (1300, 1000), (1300, 1000)]),
        ]
    )
    b = matrix(
        [
            cell("add_sub", "grpc", 1, [(1100, 1000)] * 3),
            cell("add_sub", "http", 8, [(1250, 1000)] * 3),
        ]
    )
    lines = ratio_table.history([("run-a", a), ("run-b", b)]).splitlines()
    assert lines[0] == "2 runs, run-a .. run-b"
    assert lines[2].split("|") == ["add_sub         grpc     1 ", "   1 ", " 1.30 1.10*"]
    assert lines[3].split("|") == ["add_sub         http     8 ", "   1 ", " 1.30* 1.25"]


def saved(path: Path, started: str, per_sec: float, skipped: tuple[str, ...] = ()) -> None:
    res = {
        "started": started,
        "skipped": list(skipped),
        "commit": "abc1234",
        "machine": {"cpus": 2, "cpu": "x", "load": [1.0, 1.0, 1.0], "load_after": [1, 1, 1]},
        "matrix": matrix([cell("add_sub", "grpc", 1, [(per_sec, 1000)] * 3)]),
    }
    path.write_text(json.dumps(res))


def test_page_block_comes_from_the_latest_full_run(tmp_path: Path, monkeypatch) -> None:
    results = tmp_path / "results"
    results.mkdir()
    saved(results / "2026-12-01-1000.json", "2026-12-01T10:00:00+00:00", 1100)
    saved(results / "2026-12-02-0900.json", "2026-12-02T09:00:00+00:00", 1400)
    saved(results / "2026-12-02-1000-quick.json", "2026-12-02T10:00:00+00:00", 500)
    saved(results / "2026-12-02-1100.json", "2026-12-02T11:00:00+00:00", 700, ("resnet",))
    monkeypatch.setattr(run_all, "RESULTS", results)
    page = tmp_path / "performance.md"
    page.write_text(f"# P\n\nbefore\n\n{run_all.BEGIN}\nold figures\n{run_all.END}\n\nafter\n")
    assert run_all.update_page(page) == "2026-12-02-0900"
    text = page.read_text()
    assert text.startswith("# P\n\nbefore\n\n" + run_all.BEGIN + "\nMeasured 2026-12-02 ")
    assert text.endswith(run_all.END + "\n\nafter\n")
    assert "old figures" not in text and "1.40 (1.40 1.40 1.40)" in text
    assert "bench/results/2026-12-02-0900.md" in text
    # newer quick and partial runs exist, yet the page keeps the complete full run's figures
    assert "0.50" not in text and "0.70" not in text
    assert [p.stem for p in run_all.runs(quick=True)] == ["2026-12-02-1000-quick"]


def test_page_without_markers_is_refused(tmp_path: Path, monkeypatch) -> None:
    results = tmp_path / "results"
    results.mkdir()
    saved(results / "2026-12-02-0900.json", "2026-12-02T09:00:00+00:00", 1400)
    monkeypatch.setattr(run_all, "RESULTS", results)
    page = tmp_path / "performance.md"
    page.write_text("# P\n")
    with pytest.raises(SystemExit, match="markers"):
        run_all.update_page(page)


@pytest.mark.skipif(
    not (vs_triton.PEERS / "models" / "triton" / "add_sub").is_dir(),
    reason="bench-peers' models are not on this machine",
)
def test_matrix_repository_adds_add_sub_without_batching(tmp_path: Path) -> None:
    repo = vs_triton.write_repo(tmp_path / "repo", list(vs_triton.MODELS))
    assert sorted(p.name for p in repo.iterdir()) == sorted(vs_triton.MODELS)
    batched = (repo / "add_sub" / "config.pbtxt").read_text()
    plain = (repo / "add_sub_nobatch" / "config.pbtxt").read_text()
    assert "dynamic_batching" in batched and "dynamic_batching" not in plain
    assert 'name: "add_sub_nobatch"' in plain and "max_batch_size: 8" in plain
    model = (repo / "add_sub_nobatch" / "1" / "model.py").read_text()
    assert model == (repo / "add_sub" / "1" / "model.py").read_text()
