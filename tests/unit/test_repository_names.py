"""Pure parts of the repository's naming: the named-config file choice, namespaced keys,
and the parsing of --model-config-name / --metrics-config."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.cli import parse_serve_args
from sluice.repository import layout
from sluice.repository.model_config import check_config_name, config_path


def test_config_path_prefers_the_named_file(tmp_path: Path) -> None:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "h100.pbtxt").write_text("")
    assert config_path(tmp_path, "h100") == tmp_path / "configs" / "h100.pbtxt"
    assert config_path(tmp_path, "a100") == tmp_path / "config.pbtxt"
    assert config_path(tmp_path) == tmp_path / "config.pbtxt"
    (tmp_path / "configs" / "dir.pbtxt").mkdir()  # not a file: not taken
    assert config_path(tmp_path, "dir") == tmp_path / "config.pbtxt"


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", ".", "a\\b"])
def test_config_name_must_be_a_plain_file_name(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a plain file name"):
        check_config_name(bad)
    assert check_config_name("h100") == "h100" and check_config_name("") == ""


def test_configs_dir_is_not_a_version(tmp_path: Path) -> None:
    for d in ("1", "configs", "v2"):
        (tmp_path / d).mkdir()
    scan = layout.scan_model_dir(tmp_path)
    assert scan.versions == [1] and scan.not_versions == ["v2"]


def test_namespaced_keys(tmp_path: Path) -> None:
    ra, rb = tmp_path / "ra", tmp_path / "rb"
    for d in (ra / "m", ra / "u", rb / "m", rb / "e"):
        d.mkdir(parents=True)
    plain = layout.list_models((ra, rb))
    assert plain == {"m": ra / "m", "u": ra / "u", "e": rb / "e"}
    spaced = layout.list_models((ra, rb), namespacing=True)
    assert spaced == {
        str(ra / "m"): ra / "m",
        str(rb / "m"): rb / "m",
        "u": ra / "u",
        "e": rb / "e",
    }
    key = str(rb / "m")
    assert layout.is_qualified(key) and not layout.is_qualified("m")
    assert layout.display_name(key) == "m" and layout.display_name("u") == "u"
    assert layout.find_model_dir_or_none((ra, rb), key) == rb / "m"
    # a qualified key outside the repositories is not a model
    assert layout.find_model_dir_or_none((ra,), key) is None


def test_metrics_config_parsing(tmp_path: Path) -> None:
    cfg = parse_serve_args(
        [
            f"--model-repository={tmp_path}",
            "--metrics-config=summary_latencies=true",
            "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001",
            "--metrics-config=counter_latencies=false",
            "--metrics-config=histogram_latencies=true",
        ]
    )
    assert cfg.summary_latencies and cfg.histogram_latencies and not cfg.counter_latencies
    assert cfg.summary_quantiles == ((0.5, 0.05), (0.99, 0.001))
    default = parse_serve_args([f"--model-repository={tmp_path}"])
    assert (default.summary_latencies, default.counter_latencies, default.summary_quantiles) == (
        False,
        True,
        (),
    )
    assert not default.model_namespacing and default.model_config_name == ""
