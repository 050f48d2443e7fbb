#!/usr/bin/env python3
"""The flag reference of ``sluice serve``, written from the CLI's own argparse parser so that
it cannot drift from the code.

The docs build runs it through ``docs/hooks/flag_reference.py`` (the page is generated in
memory at every build, never committed); by hand::

    .venv/bin/python scripts/gen_flag_reference.py            # the Markdown page on stdout
    .venv/bin/python scripts/gen_flag_reference.py -o FILE    # ... into FILE

Rules of this file: everything shown comes from the parser (option strings, help, default,
choices, metavar); nothing about a flag is written here by hand. Flags hidden from ``--help``
(tritonserver's deprecated and GPU-only spellings, accepted and ignored) are listed in their
own table, so the page still names every flag the parser takes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["serve_parser", "serve_flags", "render"]

ROOT = Path(__file__).resolve().parent.parent

# Read at parse time by --grpc-edge (its default); kept out so the page is the same everywhere.
_ENV_DEFAULTS = ("SLUICE_GRPC_EDGE",)


def serve_parser() -> argparse.ArgumentParser:
    """The parser ``sluice serve`` uses (sluice.cli.build_parser's "serve" sub-command), from
    this checkout's src/ whatever sluice the interpreter has installed."""
    src = str(ROOT / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    from sluice.cli import build_parser

    saved = {k: os.environ.pop(k) for k in _ENV_DEFAULTS if k in os.environ}
    try:
        parser = build_parser()
    finally:
        os.environ.update(saved)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["serve"]
    raise RuntimeError("sluice.cli.build_parser() has no 'serve' sub-command")


def serve_flags(parser: argparse.ArgumentParser | None = None) -> list[argparse.Action]:
    """Every option of ``sluice serve`` except --help, in the parser's order."""
    parser = parser or serve_parser()
    return [
        a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)
    ]


def _code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`"


def _cell(text: str) -> str:
    """Help text as plain Markdown table text: one line, and none of its characters read as
    markup (``<key>`` is no HTML tag, ``bsp_*`` no emphasis, ``a|b`` no column)."""
    text = " ".join(text.split())
    for ch in "\\`*_[]|":
        text = text.replace(ch, "\\" + ch)
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _size_note(value: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if value >= 1 << shift and value % (1 << shift) == 0:
            return f" ({value >> shift} {unit})"
    return ""


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    if action.metavar:
        return str(action.metavar)
    return action.dest.upper()


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    d = action.default
    if isinstance(action, argparse._StoreTrueAction):
        return "off"
    if isinstance(action, argparse._AppendAction):
        return "none (repeatable)" if not d else _code(", ".join(map(str, d))) + " (repeatable)"
    if d is None:
        return "not set"
    if isinstance(d, bool):
        return _code("true" if d else "false")
    if d == "":
        return "none"
    if isinstance(d, int):
        return _code(str(d)) + _size_note(d)
    return _code(str(d))


def _names(action: argparse.Action) -> str:
    value = _value(action)
    names = " ".join(_code(o) for o in action.option_strings)
    return f"{names} {_code(value)}" if value else names


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The reference page, Markdown."""
    flags = serve_flags(parser)
    shown = [a for a in flags if a.help != argparse.SUPPRESS]
    hidden = [a for a in flags if a.help == argparse.SUPPRESS]
    lines = [
        "# `sluice serve` flags",
        "",
        "Generated from sluice's command-line parser (`sluice.cli`) at every docs build by",
        "`scripts/gen_flag_reference.py`: this page is what `sluice serve` accepts, exactly.",
        "Flags take tritonserver's spellings (`--flag=value` or `--flag value`; booleans",
        "`true`/`false`). An unknown flag is a one-line error (exit status 2). How each flag",
        "compares with tritonserver's: [Migrating from Triton](../migrating-from-triton.md#flag-by-flag).",
        "",
        f"{len(flags)} flags: {len(shown)} documented below, {len(hidden)} accepted for",
        "compatibility and hidden from `--help`.",
        "",
        "| flag | default | choices | what it does |",
        "|---|---|---|---|",
    ]
    for a in shown:
        choices = ", ".join(_code(str(c)) for c in a.choices) if a.choices else ""
        lines.append(f"| {_names(a)} | {_default(a)} | {choices} | {_cell(a.help or '')} |")
    lines += [
        "",
        "## Accepted for compatibility",
        "",
        "tritonserver's deprecated spellings (the `--trace-*` flags, read as `--trace-config`)",
        "and flags that only matter on a GPU build of Triton: accepted so that existing command",
        "lines run, hidden from `sluice serve --help`.",
        "",
        "| flag | default |",
        "|---|---|",
    ]
    for a in hidden:
        lines.append(f"| {_names(a)} | {_default(a)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    ns = p.parse_args(argv)
    page = render()
    if ns.output:
        ns.output.write_text(page)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
