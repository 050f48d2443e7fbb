"""config.pbtxt -> Triton's own ``ModelConfig`` (parsed with protobuf's text_format), defaults,
normalisation of platform/backend names, and validation.

Every error names the file, and where protobuf tells it, the line, column and field.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from ..errors import InvalidArgument
from ..scheduling.latency_target import LATENCY_TARGET_PARAM, latency_target_us

__all__ = [
    "CONFIG_FILE",
    "CONFIGS_DIR",
    "check_config_name",
    "config_path",
    "ConfigParseError",
    "read_config",
    "parse_config_text",
    "parse_config_json",
    "normalise",
    "validate",
]

CONFIG_FILE = "config.pbtxt"
# --model-config-name=<name> reads <model>/configs/<name>.pbtxt (Triton's custom configuration)
CONFIGS_DIR = "configs"

# platform -> backend, as Triton fills them in
_PLATFORM_BACKEND = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
}
_BACKEND_PLATFORM = {
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "tensorrt": "tensorrt_plan",
}
_DEFAULT_FILENAME = {
    "python": "model.py",
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
}
# file in a version directory -> backend, for configs that name neither
_FILE_BACKEND = {
    "model.py": "python",
    "model.onnx": "onnxruntime",
    "model.pt": "pytorch",
    "model.plan": "tensorrt",
}


class ConfigParseError(InvalidArgument):
    """A config.pbtxt that protobuf's text_format cannot read; ``line`` / ``column`` are 1-based
    (0 when protobuf does not know them) and ``detail`` is protobuf's message."""

    def __init__(self, source: str, line: int, column: int, detail: str) -> None:
        where = f"{source}:{line}:{column}" if line else source
        super().__init__(f"invalid model configuration {where}: {detail}")
        self.source = source
        self.line = line
        self.column = column
        self.detail = detail


def parse_config_text(text: str, source: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        line, col = exc.GetLine() or 0, exc.GetColumn() or 0
        detail = str(exc)
        # protobuf prefixes "line:col : "; keep only the message, we print the location.
        if detail.startswith(f"{line}:{col} : "):
            detail = detail[len(f"{line}:{col} : ") :]
        raise ConfigParseError(source, line, col, detail) from None
    return config


def parse_config_json(text: str, source: str = "'config' parameter") -> mc.ModelConfig:
    config = mc.ModelConfig()
    try:
        json_format.Parse(text, config)
    except (json_format.ParseError, ValueError) as exc:
        raise InvalidArgument(f"invalid model configuration in {source}: {exc}") from None
    return config


def check_config_name(name: str) -> str:
    """``--model-config-name``: a plain file name without ``.pbtxt`` ("" = config.pbtxt only),
    so that the configuration read is always inside the model's ``configs`` directory."""
    if name and (name in (".", "..") or "/" in name or "\\" in name or "\0" in name):
        raise ValueError(
            f"--model-config-name: '{name}' is not a plain file name (it names "
            f"<model>/{CONFIGS_DIR}/<name>.pbtxt)"
        )
    return name


def config_path(model_dir: Path, config_name: str = "") -> Path:
    """The file a model's configuration comes from: ``configs/<config_name>.pbtxt`` where it
    exists, else ``config.pbtxt`` (Triton falls back to it per model; with neither, the model
    loads as without a config: auto-completed)."""
    if config_name:
        custom = model_dir / CONFIGS_DIR / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    return model_dir / CONFIG_FILE


def read_config(model_dir: Path, config_name: str = "") -> tuple[mc.ModelConfig, bool]:
    """(config, present): the parsed configuration (``config_path``), or an empty config if
    there is none."""
    path = config_path(model_dir, config_name)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return mc.ModelConfig(), False
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"cannot read {path}: {exc}") from None
    return parse_config_text(text, str(path)), True


def normalise(
    config: mc.ModelConfig, model_dir: Path, versions: list[int], source: str = ""
) -> mc.ModelConfig:
    """Fill name, platform/backend and instance groups the way Triton does. ``source`` names
    where the config came from (default: the model's config.pbtxt)."""
    source = source or str(model_dir / CONFIG_FILE)
    if not config.name:
        config.name = model_dir.name
    elif config.name != model_dir.name:
        raise InvalidArgument(
            f"unexpected directory name '{model_dir.name}' for model '{config.name}', directory "
            f"name must equal model name (invalid model configuration {source}: field 'name' is "
            f"'{config.name}' but the model is '{model_dir.name}')"
        )
    if not config.backend and config.platform in _PLATFORM_BACKEND:
        config.backend = _PLATFORM_BACKEND[config.platform]
    if config.backend and not config.platform and config.backend in _BACKEND_PLATFORM:
        config.platform = _BACKEND_PLATFORM[config.backend]
    if not config.backend and not config.platform:
        for version in reversed(versions):
            for fname, backend in _FILE_BACKEND.items():
                if (model_dir / str(version) / fname).exists():
                    config.backend = backend
                    config.platform = _BACKEND_PLATFORM.get(backend, "")
                    break
            if config.backend:
                break
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.platform == "ensemble":
        return config
    if not config.default_model_filename and config.backend in _DEFAULT_FILENAME:
        config.default_model_filename = _DEFAULT_FILENAME[config.backend]
    if (
        config.HasField("dynamic_batching")
        and config.max_batch_size > 0
        and not (config.dynamic_batching.preferred_batch_size)
    ):
        config.dynamic_batching.preferred_batch_size.append(config.max_batch_size)
    if not config.instance_group:  # auto-filled group is named after the model, as Triton
        group = config.instance_group.add(name=config.name)
        group.kind = mc.ModelInstanceGroup.KIND_CPU
        group.count = 1
    for i, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{i}"
        if group.count == 0:
            group.count = 1
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_CPU
    return config


def validate(config: mc.ModelConfig, source: str) -> list[str]:
    """Structural checks Triton makes before a backend sees the config. Raises for what
    Triton refuses; returns warnings for what Triton loads but that has no effect or looks
    like a mistake (a config real Triton loads must load here too)."""
    warnings: list[str] = []
    if not config.backend and not config.platform:
        raise InvalidArgument(
            f"invalid model configuration {source}: neither 'backend' nor 'platform' is set and "
            "no model file was found to infer it from"
        )
    if config.max_batch_size < 0:
        raise InvalidArgument(
            f"invalid model configuration {source}: 'max_batch_size' must be non-negative value"
        )
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for t in tensors:
            if not t.name:
                raise InvalidArgument(
                    f"invalid model configuration {source}: an {kind} has no 'name'"
                )
            if t.name in seen:
                # Triton loads it; the first declaration is the one that counts here.
                warnings.append(
                    f"{source}: {kind} '{t.name}' is declared twice; the first declaration is used"
                )
            seen.add(t.name)
            if t.data_type == mc.TYPE_INVALID:
                raise InvalidArgument(
                    f"invalid model configuration {source}: {kind} '{t.name}' has no 'data_type'"
                )
            if not t.dims and not (t.reshape.shape or config.max_batch_size > 0):
                raise InvalidArgument(
                    f"invalid model configuration {source}: {kind} '{t.name}' has no 'dims'"
                )
            for d in t.dims:
                if d < -1 or d == 0:
                    raise InvalidArgument(
                        f"invalid model configuration {source}: {kind} '{t.name}' has invalid "
                        f"dims {list(t.dims)}: each must be -1 or positive"
                    )
    if config.HasField("dynamic_batching"):
        warnings.extend(_check_dynamic_batching(config, source))
    warnings.extend(_check_latency_target(config, source))
    return warnings


def _check_latency_target(config: mc.ModelConfig, source: str) -> list[str]:
    """sluice's ``latency_target_us``: a positive integer, with an effect only where the
    dynamic batcher batches (Triton ignores the parameter)."""
    try:
        target = latency_target_us(config)
    except InvalidArgument as exc:
        raise InvalidArgument(f"invalid model configuration {source}: {exc.message}") from None
    if target is None:
        return []
    if not config.HasField("dynamic_batching") or config.max_batch_size == 0:
        return [
            f"{source}: parameter '{LATENCY_TARGET_PARAM}' has no effect without "
            "'dynamic_batching' and a 'max_batch_size' above 0: it steers the dynamic "
            "batcher's window"
        ]
    return []


def _check_dynamic_batching(config: mc.ModelConfig, source: str) -> list[str]:
    db = config.dynamic_batching
    warnings: list[str] = []
    for size in db.preferred_batch_size:
        if size <= 0 or size > config.max_batch_size:
            raise InvalidArgument(
                f"invalid model configuration {source}: dynamic batching preferred size must be "
                f"<= max batch size: preferred_batch_size {size} is not between 1 and "
                f"max_batch_size ({config.max_batch_size})"
            )
    if config.max_batch_size == 0:
        warnings.append(
            f"{source}: 'dynamic_batching' has no effect with 'max_batch_size: 0' (the model "
            "does not batch): each request executes alone"
        )
    if db.priority_levels == 0 and db.default_priority_level != 0:
        warnings.append(
            f"{source}: dynamic_batching.default_priority_level {db.default_priority_level} has "
            "no effect without 'priority_levels'"
        )
    if db.priority_levels and not 1 <= db.default_priority_level <= db.priority_levels:
        raise InvalidArgument(
            f"invalid model configuration {source}: default priority level must be in range "
            f"[1, {db.priority_levels}] (dynamic_batching.default_priority_level is "
            f"{db.default_priority_level})"
        )
    return warnings
