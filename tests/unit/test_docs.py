"""The documentation: the flag reference is generated from the CLI parser and names every flag
of ``sluice serve``; the README stays a short entry point that starts with the two set-up
commands. (The full site build, links and anchors included, is ``make docs``.)"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return _load(ROOT / "scripts" / "gen_flag_reference.py", "gen_flag_reference")


def test_reference_names_every_serve_flag_with_its_default_and_choices(gen: ModuleType) -> None:
    parser = gen.serve_parser()
    page = gen.render(parser)
    rows = {line.split(" | ")[0] for line in page.splitlines() if line.startswith("| `--")}
    flags = gen.serve_flags(parser)
    assert len(flags) > 60
    for action in flags:
        for option in action.option_strings:
            assert any(f"`{option}`" in row for row in rows), f"{option} missing from the page"
        row = next(r for r in page.splitlines() if r.startswith(f"| `{action.option_strings[0]}`"))
        for choice in action.choices or ():
            assert f"`{choice}`" in row, (action.option_strings[0], choice)
        if action.help and action.help != argparse.SUPPRESS:
            first_word = re.sub(r"[\\`*_\[\]|<>]", "", action.help.split()[0])
            assert first_word in row, (action.option_strings[0], action.help)
    # every flag of the serve command, also one added later: none is left out
    assert sum(1 for line in page.splitlines() if line.startswith("| `--")) == len(flags)


def test_every_documented_flag_says_what_it_does(gen: ModuleType) -> None:
    bare = [a.option_strings[0] for a in gen.serve_flags() if not a.help]
    assert bare == [], "flags without help text (the reference would show an empty cell)"


def test_reference_shows_defaults_as_the_parser_has_them(gen: ModuleType) -> None:
    page = gen.render()
    row = {
        line.split(" | ")[0].split("`")[1]: line for line in page.splitlines() if "| `--" in line
    }
    assert "| `8000` |" in row["--http-port"]
    assert "| `none` |" in row["--model-control-mode"]
    assert "`67108864` (64 MiB)" in row["--http-max-input-size"]
    assert "| required |" in row["--model-repository"]
    # the environment's SLUICE_GRPC_EDGE is not the documented default
    assert "| `auto` |" in row["--grpc-edge"]


def test_the_docs_hook_adds_the_generated_page() -> None:
    pytest.importorskip("mkdocs")
    from mkdocs.config import load_config
    from mkdocs.structure.files import Files

    hook = _load(ROOT / "docs" / "hooks" / "flag_reference.py", "flag_reference_hook")
    config = load_config(str(ROOT / "mkdocs.yml"))
    config.plugins._current_plugin = None  # what mkdocs sets while it runs a hook
    files = hook.on_files(Files([]), config)
    page = files.get_file_from_path("reference/flags.md")
    assert page is not None
    assert "`--model-repository`" in page.content_string


def test_every_docs_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").rglob("*.md"):
        rel = page.relative_to(ROOT / "docs").as_posix()
        assert f" {rel}" in nav, f"docs/{rel} is not in mkdocs.yml's nav"


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 220
    body = [line for line in lines if line.strip()]
    assert body[0].startswith("# ")
    assert body[1] == "```"
    assert body[2].startswith("make serve ")
    assert body[3].startswith("make test ")
    assert body[4] == "```"


def test_no_work_labels_in_the_docs() -> None:
    texts = [ROOT / "README.md", ROOT / "bench" / "RESULTS.md", *(ROOT / "docs").rglob("*.md")]
    for path in texts:
        text = path.read_text()
        assert not re.search(r"(?i)\bstops?[ -]\d+", text), path
