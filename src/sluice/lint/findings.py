"""A lint finding and its two renderings: one line per finding for people, JSON for CI."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["ERROR", "WARNING", "Finding", "render_json", "render_text", "summary"]

ERROR = "error"  # the load fails, or the model cannot serve as configured
WARNING = "warning"  # it loads, but part of the config has no effect or will hurt


@dataclass(frozen=True, slots=True)
class Finding:
    """``check`` names the rule (``version-dirs``, ``config-parse``, ``dims-batch``, ...) so CI
    can filter; ``message`` says what is wrong and what to do."""

    severity: str
    model: str
    file: str
    message: str
    check: str
    line: int | None = None
    column: int | None = None

    @property
    def where(self) -> str:
        if self.line:
            return f"{self.file}:{self.line}:{self.column or 0}"
        return self.file


def render_text(findings: Sequence[Finding]) -> str:
    """``ERROR resnet50 model_repo/resnet50/config.pbtxt:6:3: ...`` lines, errors first."""
    ordered = sorted(findings, key=lambda f: (f.severity != ERROR, f.model, f.where))
    return "".join(f"{f.severity.upper()} {f.model} {f.where}: {f.message}\n" for f in ordered)


def render_json(findings: Sequence[Finding]) -> str:
    ordered = sorted(findings, key=lambda f: (f.severity != ERROR, f.model, f.where))
    return json.dumps([asdict(f) for f in ordered], indent=2) + "\n"


def summary(findings: Sequence[Finding], models: int, repositories: Sequence[str]) -> str:
    errors = sum(f.severity == ERROR for f in findings)
    warnings = len(findings) - errors
    where = ", ".join(repositories)
    if not findings:
        return f"{where}: {models} model(s), no findings"
    return (
        f"{where}: {models} model(s), {errors} error{'' if errors == 1 else 's'}, "
        f"{warnings} warning{'' if warnings == 1 else 's'}"
    )
