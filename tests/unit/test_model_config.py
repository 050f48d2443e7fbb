from pathlib import Path
from typing import Any

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from sluice.core.validation import check_model_name
from sluice.errors import InvalidArgument, NotFound
from sluice.protocol.config_json import config_to_json_dict
from sluice.repository import layout
from sluice.repository.model_config import (
    normalise,
    parse_config_json,
    parse_config_text,
    validate,
)


def test_parse_error_names_file_line_and_field():
    text = 'name: "m"\nbackend: "python"\noutput [{ name: "O" data_type: TYPE_FP32 dimz: [1] }]\n'
    with pytest.raises(InvalidArgument) as e:
        parse_config_text(text, "/repo/m/config.pbtxt")
    msg = str(e.value)
    assert "/repo/m/config.pbtxt:3:" in msg and "dimz" in msg


def test_json_form_has_int64_as_numbers(tmp_path: Path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    c = parse_config_text(
        'backend: "python" max_batch_size: 8 input [{name: "I" data_type: TYPE_FP32 dims: [4]}] '
        "dynamic_batching { max_queue_delay_microseconds: 500 }",
        "x",
    )
    c = normalise(c, tmp_path / "m", [1])
    validate(c, "x")
    d = config_to_json_dict(c)
    assert d["name"] == "m"
    assert d["input"][0]["dims"] == [4]
    assert d["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert d["instance_group"][0]["kind"] == "KIND_CPU"
    again = parse_config_json(__import__("json").dumps(d))
    assert again == c


def test_name_mismatch_is_refused(tmp_path: Path):
    c = parse_config_text('name: "other" backend: "python"', "x")
    with pytest.raises(InvalidArgument, match="name"):
        normalise(c, tmp_path / "m", [1])


@pytest.mark.parametrize("bad", ["", ".", "..", "../x", "a/b", ".hidden", "a\\b"])
def test_model_names_that_are_not_plain_directories(bad):
    with pytest.raises(InvalidArgument) as info:
        check_model_name(bad)
    assert info.value.message == (
        f"invalid model name '{bad}': a model name must be a plain directory name in the "
        "model repository"
    )


def test_versions_skip_non_numeric_and_leading_zero(tmp_path: Path, caplog):
    m = tmp_path / "m"
    for d in ("1", "3", "0", "01", "v2", "latest"):
        (m / d).mkdir(parents=True)
    (m / "model.onnx").write_bytes(b"x")
    assert layout.list_versions(m) == [0, 1, 3]  # "0" is a version in Triton; "01" is not
    text = caplog.text
    for name in ("01", "v2", "latest"):  # each ignored directory named, with the rule
        assert (
            f"ignoring directory '{m / name}': version directories must be numeric without a "
            "leading 0" in text
        ), text
    assert f"file '{m / 'model.onnx'}' is at the model root and will not be loaded" in text
    assert f"ignoring directory '{m / '0'}'" not in text


def test_version_policy():
    c = mc.ModelConfig(name="m")
    assert layout.select_versions(c, [1, 2, 3]) == [3]
    c.version_policy.latest.num_versions = 2
    assert layout.select_versions(c, [1, 2, 3]) == [2, 3]
    c.version_policy.all.SetInParent()
    assert layout.select_versions(c, [1, 2, 3]) == [1, 2, 3]
    c.version_policy.specific.versions.extend([1, 3])
    assert layout.select_versions(c, [1, 2, 3]) == [1, 3]
    c.version_policy.specific.versions.append(7)
    with pytest.raises(NotFound, match="7"):
        layout.select_versions(c, [1, 2, 3])


def _cfg(text: str) -> Any:
    return parse_config_text('name: "m" backend: "python" ' + text, "cfg")


def test_configs_triton_loads_give_warnings_not_errors():
    # Triton 2.51 loads each of these (checked on this machine); sluice warns instead.
    io = 'input [{name: "I" data_type: TYPE_FP32 dims: [4]}] '
    (w,) = validate(_cfg("max_batch_size: 0 " + io + "dynamic_batching {}"), "cfg")
    assert w.startswith("cfg: 'dynamic_batching' has no effect with 'max_batch_size: 0'")
    (w,) = validate(
        _cfg("max_batch_size: 8 " + io + "dynamic_batching { default_priority_level: 2 }"), "cfg"
    )
    assert "default_priority_level 2 has no effect without 'priority_levels'" in w
    dup = 'input [{name: "I" data_type: TYPE_FP32 dims: [4]}, {name: "I" data_type: TYPE_INT32 dims: [1]}]'
    (w,) = validate(_cfg("max_batch_size: 8 " + dup), "cfg")
    assert w == "cfg: input 'I' is declared twice; the first declaration is used"
    assert validate(_cfg("max_batch_size: 8 " + io + "dynamic_batching {}"), "cfg") == []


def test_configs_triton_refuses_are_errors_with_its_phrase():
    io = 'input [{name: "I" data_type: TYPE_FP32 dims: [4]}] '
    cases = {
        "max_batch_size: 0 " + io + "dynamic_batching { preferred_batch_size: [4] }": (
            "dynamic batching preferred size must be <= max batch size"
        ),
        "max_batch_size: 8 " + io + "dynamic_batching { preferred_batch_size: [16] }": (
            "dynamic batching preferred size must be <= max batch size"
        ),
        "max_batch_size: 8 " + io + "dynamic_batching { priority_levels: 2 }": (
            "default priority level must be in range [1, 2]"
        ),
        "max_batch_size: -1 " + io: "'max_batch_size' must be non-negative value",
    }
    for text, phrase in cases.items():
        with pytest.raises(InvalidArgument) as info:
            validate(_cfg(text), "cfg")
        assert phrase in str(info.value), (text, str(info.value))
