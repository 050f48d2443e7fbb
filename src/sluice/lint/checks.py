"""The checks of ``sluice repo lint``: the seed's pitfalls, found before a load fails.

Rules of this file:
- The load's own code decides wherever it can: ``layout`` scans the directory,
  ``model_config`` parses (protobuf text_format into Triton's ModelConfig), fills and
  validates the config with Triton's phrases, ``devices`` answers KIND_GPU, the onnxruntime
  backend's ``check_tensors`` compares the config with the ONNX graph, the tensorrt backend
  deserializes plans. A finding is an error when the load would fail (or the model cannot
  serve as configured), a warning when it loads but part of the config has no effect or
  will hurt.
- Heuristics (each message says which):
  * dims with the batch dimension: against an ONNX graph, exact (dims of the graph's rank
    with max_batch_size > 0 and a dynamic first dim, or one dim short with max_batch_size 0);
    without a graph, a warning when dims have 2+ entries and the first equals max_batch_size.
  * queue delay: a warning above ``DELAY_WARN_US`` (10 ms); with ``--latency-budget-ms B`` a
    warning above B/2 and an error at B or more. At low load each request waits the whole
    delay for a batch that does not fill, so the delay is a floor under p50 and p99.
  * memory: instances x model file size x ``MEMORY_FACTOR`` for CPU instances of file-based
    backends (ONNX Runtime, TorchScript) against the memory available; python models load
    what their code loads, so only the admission at load time can measure them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import ModelSpec, backend_for
from ..backends.ensemble import composing_models
from ..backends.onnxruntime import check_tensors
from ..backends.sequence_io import check_sequence_io, server_inputs, state_outputs
from ..backends.tensorrt import plan_problem, runtime_problem
from ..errors import InvalidArgument, ServerError
from ..host.sysmem import format_size
from ..repository import layout
from ..repository.agents import verify_agents
from ..repository.devices import check_devices
from ..repository.model_config import (
    ConfigParseError,
    config_path,
    normalise,
    read_config,
    validate,
)
from .findings import ERROR, WARNING, Finding
from .model_files import file_size, onnx_graph, plan_header_problem

__all__ = ["DELAY_WARN_US", "MEMORY_FACTOR", "LintOptions", "lint_repositories"]

DELAY_WARN_US = 10_000
# resident memory per instance / model file size: an ONNX Runtime session of the example
# resnet50 (102 MB file) added 118 MB per instance on this machine (1.16x)
MEMORY_FACTOR = 1.2
_FILE_BACKENDS = ("onnxruntime", "pytorch")

# Triton's phrases (from model_config.validate) -> what to do
_ADVICE = {
    "dynamic batching preferred size must be <= max batch size": (
        "dynamic-batching",
        "lower preferred_batch_size or raise max_batch_size",
    ),
    "'max_batch_size' must be non-negative": (
        "max-batch-size",
        "use 0 (the model does not batch) or the largest batch it takes",
    ),
    "default priority level must be in range": (
        "dynamic-batching",
        "set default_priority_level between 1 and priority_levels",
    ),
    "has no effect with 'max_batch_size: 0'": (
        "dynamic-batching",
        "set max_batch_size to the largest batch (and dims without the batch dimension) for "
        "the batcher to combine requests, or remove dynamic_batching",
    ),
    "neither 'backend' nor 'platform'": (
        "backend",
        "set backend (python, onnxruntime, pytorch, tensorrt) or platform in config.pbtxt",
    ),
}


@dataclass(frozen=True, slots=True)
class LintOptions:
    memory: int  # bytes model instances may use (the machine's available memory, or --memory)
    memory_source: str  # says where ``memory`` came from, for messages
    gpu: bool  # the serving machine has a GPU
    latency_budget_ms: float | None = None
    auto_complete: bool = True  # as `sluice serve` without --disable-auto-complete-config
    config_name: str = ""  # as `sluice serve --model-config-name`: configs/<name>.pbtxt first


@dataclass(slots=True)
class _Estimate:
    model: str
    file: str
    instances: int
    size: int

    @property
    def bytes(self) -> int:
        return int(self.instances * self.size * MEMORY_FACTOR)


@dataclass(slots=True)
class _ModelLint:
    name: str
    model_dir: Path
    known_models: frozenset[str]
    options: LintOptions
    findings: list[Finding] = field(default_factory=list)
    estimate: _Estimate | None = None

    @property
    def config_file(self) -> str:
        return str(config_path(self.model_dir, self.options.config_name))

    def add(self, severity: str, check: str, file: Path | str, message: str, **kw: int) -> None:
        self.findings.append(Finding(severity, self.name, str(file), message, check, **kw))

    def clean(self, exc: ServerError) -> str:
        """The message without the load's prefixes (the finding names model and file)."""
        text = str(exc)
        for prefix in (
            f"failed to load '{self.name}': ",
            f"invalid model configuration {self.config_file}: ",
            f"{self.config_file}: ",
        ):
            text = text.removeprefix(prefix)
        return text

    def from_triton(self, severity: str, text: str) -> None:
        check, advice = next(
            ((c, a) for phrase, (c, a) in _ADVICE.items() if phrase in text), ("config", "")
        )
        self.add(severity, check, self.config_file, f"{text}: {advice}" if advice else text)

    # ------------------------------------------------------------------------------- run
    def run(self) -> None:
        versions = self.check_layout()
        config = self.read()
        if config is None:
            return
        try:
            for text in validate(config, self.config_file):
                self.from_triton(WARNING, self.clean(InvalidArgument(text)))
        except InvalidArgument as exc:
            self.from_triton(ERROR, self.clean(exc))
            if not config.backend and not config.platform:
                return
        self.check_agents(config)
        if not self.check_backend(config):
            return
        try:
            check_devices(self.name, config, gpu=self.options.gpu)
        except InvalidArgument as exc:
            self.add(
                ERROR,
                "kind-gpu",
                self.config_file,
                f"{self.clean(exc)} (if the serving machine has a GPU, lint there or pass --gpu)",
            )
        self.check_queue_delay(config)
        if config.platform == "ensemble":
            self.check_ensemble(config)
            return
        if not versions:
            return
        try:
            selected = layout.select_versions(config, versions)
        except ServerError as exc:
            self.add(ERROR, "version-policy", self.config_file, f"{self.clean(exc)}")
            return
        files = self.check_model_files(config, selected)
        self.check_dims(config, files)
        if config.backend == "tensorrt":
            self.check_plans(config, files)
        elif config.backend in _FILE_BACKENDS and files:
            self.check_memory(config, files, len(selected))

    # ----------------------------------------------------------------------- the checks
    def check_agents(self, config: mc.ModelConfig) -> None:
        """``model_repository_agents``: an agent sluice lacks, a checksum that does not
        match (the load would fail with the same text)."""
        try:
            verify_agents(config, self.model_dir)
        except ServerError as exc:
            self.add(ERROR, "repo-agent", self.config_file, f"{exc}: the load fails")

    def check_layout(self) -> list[int]:
        scan = layout.scan_model_dir(self.model_dir)
        for d in scan.not_versions:
            self.add(
                WARNING,
                "version-dirs",
                self.model_dir / d,
                f"'{d}' is not a version directory and is ignored (versions are numbers "
                f"without a leading 0, e.g. {self.model_dir / '1'}): rename it to a number "
                "or move it out of the model",
            )
        for f in scan.root_model_files:
            where = self.model_dir / f
            move = f"mkdir -p {self.model_dir / '1'} && mv {where} {self.model_dir / '1' / f}"
            if scan.versions:
                self.add(
                    WARNING,
                    "model-at-root",
                    where,
                    f"{f} lies at the model root, where it is never loaded (only "
                    f"{self.model_dir}/<version>/ is): move it into a version directory "
                    "or delete it",
                )
            else:
                self.add(
                    ERROR,
                    "model-at-root",
                    where,
                    f"{f} lies at the model root and the model has no version directory, so "
                    f"nothing loads: {move}",
                )
        if not scan.versions and not scan.root_model_files:
            self.add(
                ERROR,
                "version-dirs",
                self.model_dir,
                "no version directory, so nothing loads: put the model file in a numeric "
                f"version directory, e.g. {self.model_dir / '1'}/",
            )
        return scan.versions

    def read(self) -> mc.ModelConfig | None:
        """The config as the load fills it; None when it cannot be read."""
        try:
            config, _present = read_config(self.model_dir, self.options.config_name)
        except ConfigParseError as exc:
            self.add(
                ERROR,
                "config-parse",
                self.config_file,
                f"{exc.detail.rstrip('.')}: Triton cannot read this file, so the load fails; "
                "fix it there (protobuf text format of Triton's ModelConfig)",
                line=exc.line,
                column=exc.column,
            )
            return None
        except InvalidArgument as exc:
            self.add(ERROR, "config-parse", self.config_file, self.clean(exc))
            return None
        versions = layout.scan_model_dir(self.model_dir).versions
        try:
            return normalise(config, self.model_dir, versions, self.config_file)
        except InvalidArgument as exc:
            self.add(
                ERROR,
                "name",
                self.config_file,
                f'{self.clean(exc)}: set name: "{self.name}" (or rename the directory)',
            )
            config.name = ""
            return normalise(config, self.model_dir, versions, self.config_file)

    def check_backend(self, config: mc.ModelConfig) -> bool:
        if config.platform == "ensemble":
            return True
        if backend_for(config) is None:
            self.add(
                ERROR,
                "backend",
                self.config_file,
                f"unknown backend '{config.backend or config.platform}': sluice serves python, "
                "onnxruntime, pytorch, tensorrt and ensemble models; fix backend/platform",
            )
            return False
        return True

    def check_ensemble(self, config: mc.ModelConfig) -> None:
        for m in composing_models(config):
            if m not in self.known_models:
                self.add(
                    ERROR,
                    "ensemble",
                    self.config_file,
                    f"step model '{m}' is not in the repository: loading the ensemble loads "
                    "its steps, so this load fails; add the model or fix model_name",
                )

    def check_model_files(self, config: mc.ModelConfig, selected: list[int]) -> list[Path]:
        fname = config.default_model_filename
        present: list[Path] = []
        for v in selected:
            path = self.model_dir / str(v) / fname
            if path.exists():
                present.append(path)
                continue
            others = sorted(p.name for p in (self.model_dir / str(v)).iterdir())
            found = f" (the directory holds: {', '.join(others)})" if others else ""
            self.add(
                ERROR,
                "model-file",
                path,
                f"model file not found for version {v}{found}: put the {config.backend} model "
                f"there, or set default_model_filename to the file's name",
            )
        return present

    def check_dims(self, config: mc.ModelConfig, files: list[Path]) -> None:
        if config.backend == "onnxruntime" and files:
            try:
                graph = onnx_graph(files[-1], config)
            except ServerError as exc:
                self.add(ERROR, "model-file", files[-1], self.clean(exc))
                return
            if self.dims_against_graph(config, graph, files[-1]):
                return
            # sequence controls and states come from the server, not the config (as at load)
            server = frozenset(server_inputs(config) + state_outputs(config))
            try:
                check_tensors(
                    config,
                    graph,
                    "ONNX model",
                    complete=self.options.auto_complete,
                    server_tensors=server,
                )
                check_sequence_io(config, graph, "ONNX model")
            except InvalidArgument as exc:
                self.add(ERROR, "config-vs-model", self.config_file, self.clean(exc))
            return
        mbs = config.max_batch_size
        for kind, t in _tensors(config):
            dims = list(t.dims)
            if mbs > 1 and len(dims) >= 2 and dims[0] == mbs:
                self.add(
                    WARNING,
                    "dims-batch",
                    self.config_file,
                    f"{kind} '{t.name}' dims {dims} start with {mbs}, the max_batch_size: dims "
                    "leave the batch dimension out (Triton adds it); if the first dim is the "
                    f"batch, write dims: {dims[1:]}",
                )

    def dims_against_graph(
        self, config: mc.ModelConfig, graph: dict[str, dict[str, tuple[int, list[int]]]], f: Path
    ) -> bool:
        found = False
        mbs = config.max_batch_size
        for kind, t in _tensors(config):
            model = graph[kind].get(t.name)
            if model is None:
                continue
            shape = model[1]
            dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
            if mbs > 0 and len(dims) == len(shape) and shape and shape[0] == -1:
                self.add(
                    ERROR,
                    "dims-batch",
                    self.config_file,
                    f"{kind} '{t.name}' dims {dims} include the batch dimension: the model's "
                    f"{kind} is {_shape(shape)} and with max_batch_size {mbs} Triton adds the "
                    f"batch dimension in front of dims; write dims: {dims[1:]}",
                )
                found = True
            elif (
                mbs == 0
                and not self.options.auto_complete  # else auto-complete sets max_batch_size
                and len(shape) == len(dims) + 1
                and shape[0] == -1
            ):
                self.add(
                    ERROR,
                    "dims-batch",
                    self.config_file,
                    f"{kind} '{t.name}' dims {dims} leave out the model's first (batch) "
                    f"dimension ({f.name}: {_shape(shape)}) but max_batch_size is 0, so dims "
                    "must be the whole shape: set max_batch_size to the largest batch to let "
                    f"Triton batch, or write dims: {[-1, *dims]}",
                )
                found = True
        return found

    def check_queue_delay(self, config: mc.ModelConfig) -> None:
        delays = []
        if config.HasField("dynamic_batching") and config.max_batch_size > 0:
            delays.append(
                ("dynamic_batching", config.dynamic_batching.max_queue_delay_microseconds)
            )
        sb = config.sequence_batching
        if config.HasField("sequence_batching") and sb.HasField("oldest"):
            delays.append(("sequence_batching.oldest", sb.oldest.max_queue_delay_microseconds))
        budget = self.options.latency_budget_ms
        for where, us in delays:
            ms = us / 1000
            what = (
                f"{where}.max_queue_delay_microseconds is {us} ({ms:g} ms): at low load each "
                "request waits this long for a batch that does not fill, so it is a floor "
                "under p50 and p99"
            )
            if budget is not None:
                if ms >= budget:
                    self.add(
                        ERROR,
                        "queue-delay",
                        self.config_file,
                        f"{what}, and it is not below the latency budget of {budget:g} ms: "
                        f"lower it to at most {int(budget * 500)} (half the budget)",
                    )
                elif ms > budget / 2:
                    self.add(
                        WARNING,
                        "queue-delay",
                        self.config_file,
                        f"{what}, more than half the latency budget of {budget:g} ms: lower it, "
                        "then check p99 with sluice perf --latency-budget-ms",
                    )
            elif us > DELAY_WARN_US:
                self.add(
                    WARNING,
                    "queue-delay",
                    self.config_file,
                    f"{what}; above {DELAY_WARN_US // 1000} ms it likely dominates p99: lower it "
                    "and measure with sluice perf --latency-budget-ms (or lint with "
                    "--latency-budget-ms to check against your target)",
                )

    def check_memory(self, config: mc.ModelConfig, files: list[Path], versions: int) -> None:
        count = sum(
            max(1, g.count)
            for g in config.instance_group
            if g.kind != mc.ModelInstanceGroup.KIND_GPU
        )
        if not count:
            return
        size = file_size(files[-1])
        est = _Estimate(self.name, str(files[-1]), count * versions, size)
        self.estimate = est
        if est.bytes <= self.options.memory:
            return
        per = int(size * MEMORY_FACTOR) or 1
        fits = self.options.memory // per
        fit = (
            f"lower instance_group count to {fits}"
            if fits
            else "even one instance does not fit; use a machine with more memory"
        )
        self.add(
            ERROR,
            "memory",
            self.config_file,
            f"{est.instances} instance(s) x {format_size(size)} ({files[-1].name}) x "
            f"{MEMORY_FACTOR} is about {format_size(est.bytes)}, more than the "
            f"{format_size(self.options.memory)} available ({self.options.memory_source}); "
            f"each instance holds its own copy of the model: {fit}",
        )

    def check_plans(self, config: mc.ModelConfig, files: list[Path]) -> None:
        for path in files:
            problem = plan_header_problem(path)
            if problem is not None:
                self.add(ERROR, "tensorrt-plan", path, problem)
                continue
            missing = runtime_problem()
            if missing is not None:
                self.add(
                    WARNING,
                    "tensorrt-plan",
                    path,
                    f"the plan's TensorRT version and GPU were not checked here ({missing}); a "
                    "plan loads only with the TensorRT version and GPU architecture it was "
                    "built with: lint on the serving machine, or rebuild the plan there",
                )
                continue
            v = int(path.parent.name)
            spec = ModelSpec(
                self.name, v, self.model_dir, path.parent, config, self.model_dir.parent
            )
            problem = plan_problem(spec)
            if problem is not None:
                self.add(ERROR, "tensorrt-plan", path, self.clean(InvalidArgument(problem)))


def _tensors(config: mc.ModelConfig) -> list[tuple[str, mc.ModelInput | mc.ModelOutput]]:
    return [("input", t) for t in config.input] + [("output", t) for t in config.output]


def _shape(shape: list[int]) -> str:
    return "[" + ", ".join("N" if i == 0 and d == -1 else str(d) for i, d in enumerate(shape)) + "]"


def lint_repositories(
    repositories: Sequence[Path], options: LintOptions
) -> tuple[list[Finding], int]:
    """(findings, number of models) for every model directory in the repositories."""
    models = layout.list_models(tuple(repositories))
    findings: list[Finding] = []
    estimates: list[_Estimate] = []
    known = frozenset(models)
    for name, model_dir in models.items():
        lint = _ModelLint(name, model_dir, known, options)
        lint.run()
        findings.extend(lint.findings)
        if lint.estimate is not None:
            estimates.append(lint.estimate)
    total = sum(e.bytes for e in estimates)
    if len(estimates) > 1 and total > options.memory:
        findings.append(
            Finding(
                WARNING,
                "*",
                ", ".join(str(r) for r in repositories),
                f"the ONNX Runtime and TorchScript models together need about "
                f"{format_size(total)} (instances x file size x {MEMORY_FACTOR}), more than the "
                f"{format_size(options.memory)} available ({options.memory_source}): do not "
                "load them all on one machine (--model-control-mode=explicit with --load-model)",
                "memory",
            )
        )
    return findings, len(models)
