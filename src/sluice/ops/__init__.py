"""The operator's commands: ``sluice model ...`` over the repository API and ``sluice tune``."""
