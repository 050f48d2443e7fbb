"""``sluice perf``: a perf_analyzer-compatible load tester (closed- and open-loop), with knee
detection, CSV and plots. Entry point: ``sluice.perf.cli.main``."""

__all__: list[str] = []
