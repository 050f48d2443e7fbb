"""Scanning a model repository: ``<repo>/<model>/<numeric version>/`` plus ``config.pbtxt``.

Rules of this file:
- A model name is a plain directory name: no separators, not ``.``/``..``, not empty, not
  hidden. Anything else is refused before the file system is touched, so nothing outside a
  repository is ever read.
- ``--model-namespacing=true``: a name found in more than one repository is kept once per
  repository, under a *qualified key*: the model directory's absolute path (a client name
  never holds a ``/``, so a key can never be taken for a name a client sends). A name found
  once keeps its plain key. Without namespacing the first repository's wins (logged).
- Version directories must be numeric without a leading zero ("0" itself is a version, as
  in Triton); others are skipped with a
  warning that names them (and a model file at the model root is called out).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..core.validation import check_model_name
from ..errors import NotFound
from .model_config import CONFIGS_DIR

__all__ = [
    "ModelDirScan",
    "display_name",
    "is_qualified",
    "find_model_dir",
    "find_model_dir_or_none",
    "is_version_name",
    "list_models",
    "list_versions",
    "scan_model_dir",
    "select_versions",
]

log = logging.getLogger("sluice.repository")

_MODEL_FILE_SUFFIXES = (".py", ".onnx", ".pt", ".plan", ".savedmodel", ".graphdef", ".pb")


def is_qualified(key: str) -> bool:
    """A namespaced model's key (its directory's absolute path), not a plain name."""
    return key.startswith("/")


def display_name(key: str) -> str:
    """The model name of a key: the plain name itself, or a qualified key's last part."""
    return key.rsplit("/", 1)[-1] if is_qualified(key) else key


def list_models(repositories: tuple[Path, ...], namespacing: bool = False) -> dict[str, Path]:
    """Model key -> model directory, across every repository. Without ``namespacing`` a name
    found in more than one repository maps to the first one and is logged (Triton makes it
    unavailable); with it, each is kept under its qualified key (rules at the top)."""
    found: dict[str, list[Path]] = {}
    for repo in repositories:
        try:
            entries = sorted(os.scandir(repo), key=lambda e: e.name)
        except OSError as exc:
            log.error("cannot read model repository %s: %s", repo, exc)
            continue
        for entry in entries:
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            dirs = found.setdefault(entry.name, [])
            if dirs and not namespacing:
                log.warning(
                    "model '%s' is in more than one repository (%s and %s)",
                    entry.name,
                    dirs[0].parent,
                    repo,
                )
                continue
            dirs.append(Path(entry.path))
    out: dict[str, Path] = {}
    for name, dirs in found.items():
        if len(dirs) == 1:
            out[name] = dirs[0]
        else:
            out.update((str(d), d) for d in dirs)
    return out


def find_model_dir_or_none(repositories: tuple[Path, ...], name: str) -> Path | None:
    if is_qualified(name):  # a namespaced key: a directory right inside a repository
        candidate = Path(name)
        check_model_name(candidate.name)
        if candidate.parent in repositories and candidate.is_dir():
            return candidate
        return None
    check_model_name(name)
    for repo in repositories:
        candidate = repo / name  # name is a plain directory name: candidate is inside repo
        if candidate.is_dir():
            return candidate
    return None


def find_model_dir(repositories: tuple[Path, ...], name: str) -> Path:
    found = find_model_dir_or_none(repositories, name)
    if found is not None:
        return found
    raise NotFound(
        f"failed to load '{display_name(name)}': model directory not found in any model repository"
    )


@dataclass(frozen=True, slots=True)
class ModelDirScan:
    """What a model directory holds: numeric versions (sorted), directories that are not
    versions, and model files lying at the model root (the seed's pitfall)."""

    versions: list[int]
    not_versions: list[str]
    root_model_files: list[str]


def is_version_name(name: str) -> bool:
    """True for "0", "1", "12"; False for "01", "v1", "latest" ("0" is a version in Triton)."""
    return name.isdigit() and (name == "0" or not name.startswith("0"))


def scan_model_dir(model_dir: Path) -> ModelDirScan:
    """Versions, skipped directories and root model files of one model directory. Hidden
    and ``_``-prefixed directories (``__pycache__``) and ``configs`` (the named configs of
    ``--model-config-name``) are neither versions nor reported."""
    try:
        entries = sorted(os.scandir(model_dir), key=lambda e: e.name)
    except OSError as exc:
        raise NotFound(f"cannot read model directory {model_dir}: {exc}") from None
    versions: list[int] = []
    not_versions: list[str] = []
    root_files: list[str] = []
    for entry in entries:
        if entry.is_dir():
            if is_version_name(entry.name):
                versions.append(int(entry.name))
            elif not entry.name.startswith((".", "_")) and entry.name != CONFIGS_DIR:
                not_versions.append(entry.name)
        elif entry.name.endswith(_MODEL_FILE_SUFFIXES):
            root_files.append(entry.name)
    versions.sort()
    return ModelDirScan(versions, not_versions, root_files)


def list_versions(model_dir: Path, warn: bool = True) -> list[int]:
    """Numeric version directories, sorted; warns about the ones that are skipped."""
    scan = scan_model_dir(model_dir)
    if warn:
        for name in scan.not_versions:
            log.warning(
                "model '%s': ignoring directory '%s': version directories must be numeric "
                "without a leading 0",
                model_dir.name,
                model_dir / name,
            )
        for name in scan.root_model_files:
            log.warning(
                "model '%s': file '%s' is at the model root and will not be loaded; move it into "
                "a numeric version directory, e.g. %s/1/%s",
                model_dir.name,
                model_dir / name,
                model_dir,
                name,
            )
    return scan.versions


def select_versions(config: mc.ModelConfig, available: list[int]) -> list[int]:
    """Apply ``version_policy`` (default: latest 1) to the available versions."""
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return list(available)
    if which == "specific":
        wanted = sorted(set(policy.specific.versions))
        missing = [v for v in wanted if v not in available]
        if missing:
            raise NotFound(
                f"model '{config.name}': version_policy.specific asks for version(s) "
                f"{', '.join(map(str, missing))} which have no directory"
            )
        return [int(v) for v in wanted]
    n = policy.latest.num_versions if which == "latest" and policy.latest.num_versions > 0 else 1
    return available[-n:]
