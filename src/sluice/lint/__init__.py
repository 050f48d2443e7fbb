"""``sluice repo lint``: a model repository's pitfalls, found before a load fails.

>>> findings, models = lint_repositories([Path("model_repo")], options)
>>> print(render_text(findings), end="")
ERROR resnet50 model_repo/resnet50/model.plan: model.plan lies at the model root ...
"""

from .checks import LintOptions, lint_repositories
from .findings import ERROR, WARNING, Finding, render_json, render_text

__all__ = [
    "ERROR",
    "WARNING",
    "Finding",
    "LintOptions",
    "lint_repositories",
    "render_json",
    "render_text",
]
