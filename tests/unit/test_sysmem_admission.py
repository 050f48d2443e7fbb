"""Sizes in words, the cgroup's memory (v1 and v2 layouts), and the admission's decision
with the machine's memory given (no server, no processes started)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from sluice.host.sysmem import (
    MachineMemory,
    format_size,
    machine_memory,
    parse_size,
    tree_rss,
)
from sluice.repository.admission import MemoryAdmission, safety_margin

MiB = 1 << 20
GiB = 1 << 30


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("1024", 1024), ("512K", 512 << 10), ("512M", 512 * MiB), ("2G", 2 * GiB)]
    + [("1.5g", int(1.5 * GiB)), ("8GiB", 8 * GiB), ("8GB", 8 * GiB), ("1T", 1 << 40)],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "M", "-1G", "2X", "1 G B"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="K, M, G or T"):
        parse_size(text)


def test_tree_rss_counts_the_process_and_its_descendants() -> None:
    """As psutil sums them (RSS of the process and of every descendant); a child holding
    64 MiB is counted, a pid that does not exist is 0."""
    code = "import sys; b = bytearray(64 << 20); sys.stdout.write('up\\n'); sys.stdout.flush(); input()"
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"
        me = psutil.Process()
        expected = sum(p.memory_info().rss for p in [me, *me.children(recursive=True)])
        got = tree_rss()
        assert got >= 64 << 20
        assert abs(got - expected) < 8 << 20, (got, expected)  # this process moves a little
        assert tree_rss(child.pid) >= 64 << 20
    finally:
        child.communicate("", timeout=30)
    assert tree_rss(2**22 + 1) == 0  # above any pid_max


def test_format_size() -> None:
    assert format_size(512) == "512 B"
    assert format_size(250 * MiB) == "250.0 MiB"
    assert format_size(3 * GiB // 2) == "1.5 GiB"


def test_cgroup_v2_limit_minus_working_set(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text(f"{2 * GiB}\n")
    (tmp_path / "memory.current").write_text(f"{GiB}\n")
    (tmp_path / "memory.stat").write_text(f"anon 1\ninactive_file {256 * MiB}\n")
    mem = machine_memory(tmp_path)
    # 2 GiB limit - (1 GiB used - 256 MiB reclaimable cache), unless the machine has less
    assert mem.available <= 2 * GiB - (GiB - 256 * MiB)
    if mem.where == "cgroup memory limit":
        assert mem.available == GiB + 256 * MiB and mem.total <= 2 * GiB


def test_cgroup_v1_and_no_limit(tmp_path: Path) -> None:
    v1 = tmp_path / "memory"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # no limit
    (v1 / "memory.usage_in_bytes").write_text(f"{GiB}\n")
    assert machine_memory(tmp_path).where == "MemAvailable"
    (v1 / "memory.limit_in_bytes").write_text(f"{GiB}\n")
    (v1 / "memory.stat").write_text(f"total_inactive_file {100 * MiB}\n")
    mem = machine_memory(tmp_path)
    assert mem.where == "cgroup memory limit" and mem.available == 100 * MiB


def test_safety_margin_bounds() -> None:
    assert safety_margin(GiB) == 128 * MiB
    assert safety_margin(8 * GiB) == 8 * GiB // 20
    assert safety_margin(128 * GiB) == GiB


class _Instance:
    """A stand-in instance whose start 'holds' nothing measurable (no pid)."""

    def __init__(self, fail: bool = False) -> None:
        self.name = "i"
        self.started = self.stopped = False
        self.fail = fail

    async def start(self) -> None:
        if self.fail:
            raise RuntimeError("init exploded")
        self.started = True

    async def execute(self, requests: object) -> object:
        raise NotImplementedError

    async def stop(self, grace: float | None = None) -> None:
        self.stopped = True


def _config(platform: str = "") -> mc.ModelConfig:
    return mc.ModelConfig(name="m", platform=platform)


def test_decision_names_estimate_count_and_what_is_left() -> None:
    admission = MemoryAdmission(machine=lambda: MachineMemory(1200 * MiB, 16 * GiB, "x"))
    assert admission._refusal("m", 1, 100 * MiB, 2) is None  # 1200 - 819 margin >= 100
    why = admission._refusal("m", 1, 100 * MiB, 8)
    assert why is not None
    assert why.startswith(
        "not enough memory for 8 instances of model 'm' version 1: the first instance took "
        "100.0 MiB (measured), so 8 need about 800.0 MiB; the other 7 need 700.0 MiB but "
    )
    assert "at most 4 instances fit: set instance_group count to 4" in why
    assert "safety margin" in why and "free memory on this machine" in why
    over = MemoryAdmission(machine=lambda: MachineMemory(100 * MiB, 16 * GiB, "x"))
    why = over._refusal("m", 1, 10 * MiB, 1)
    assert why is not None and "nothing is left" in why


def test_first_failure_starts_nothing_more_and_success_starts_all() -> None:
    admission = MemoryAdmission(machine=lambda: MachineMemory(64 * GiB, 64 * GiB, "x"))
    bad = [_Instance(fail=True), _Instance(), _Instance()]
    results, _ = asyncio.run(admission.start_instances("m", 1, _config(), bad))  # type: ignore[arg-type]
    assert all(isinstance(r, RuntimeError) for r in results)
    assert not bad[1].started and bad[1].stopped
    good = [_Instance(), _Instance(), _Instance()]
    results, _ = asyncio.run(admission.start_instances("m", 1, _config(), good))  # type: ignore[arg-type]
    assert results == [None, None, None] and all(i.started for i in good)


def test_refusal_stops_the_first_instance() -> None:
    admission = MemoryAdmission(machine=lambda: MachineMemory(0, 64 * GiB, "x"))
    insts = [_Instance(), _Instance()]
    results, _ = asyncio.run(admission.start_instances("m", 1, _config(), insts))  # type: ignore[arg-type]
    assert all(r is not None and "not enough memory" in str(r) for r in results)
    assert insts[0].started and insts[0].stopped and not insts[1].started


def test_a_declared_estimate_replaces_the_measurement() -> None:
    from sluice.errors import InvalidArgument
    from sluice.repository.admission import declared_estimate

    cfg = _config()
    assert declared_estimate(cfg) is None
    cfg.parameters["sluice_memory_estimate"].string_value = "512M"
    assert declared_estimate(cfg) == 512 * MiB
    admission = MemoryAdmission(machine=lambda: MachineMemory(64 * GiB, 64 * GiB, "x"))
    insts = [_Instance(), _Instance()]
    results, estimate = asyncio.run(admission.start_instances("m", 1, cfg, insts))  # type: ignore[arg-type]
    assert results == [None, None] and estimate == 512 * MiB
    why = admission._refusal("m", 1, 40 * GiB, 3, "declared")
    assert why is not None and "the first instance took 40.0 GiB (declared)" in why
    cfg.parameters["sluice_memory_estimate"].string_value = "lots"
    with pytest.raises(InvalidArgument) as info:
        declared_estimate(cfg)
    assert str(info.value).startswith(
        "model 'm': parameter 'sluice_memory_estimate' must be a size in bytes (e.g. '512M')"
    )
