"""MkDocs hook: adds reference/flags.md, generated from sluice's own CLI parser at every
build (scripts/gen_flag_reference.py), so the flag reference is never stale and never
committed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mkdocs.structure.files import File, Files

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gen_flag_reference.py"
PAGE = "reference/flags.md"


def _render() -> str:
    spec = importlib.util.spec_from_file_location("gen_flag_reference", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.render())


def on_files(files: Files, config) -> Files:  # noqa: ANN001 (MkDocsConfig)
    existing = files.get_file_from_path(PAGE)
    if existing is not None:
        files.remove(existing)
    files.append(File.generated(config, PAGE, content=_render()))
    return files
