# Developer entry points. `make serve` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install models serve test check docs format bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,torch,otel,docs,perf,storage,openai]'
	touch $(STAMP)

# The native gRPC edge (gRPC C++; DESIGN.md): system packages, then a ~10 s compile. Where
# either cannot happen the server serves gRPC with grpc.aio, so this never fails the install.
EDGE_SRC   := src/sluice/frontends/grpc_edge/_edge.cc
EDGE_STAMP := $(VENV)/.grpc-edge
$(EDGE_STAMP): $(EDGE_SRC) src/sluice/frontends/grpc_edge/build.py | $(STAMP)
	scripts/install-system-deps || echo "install-system-deps failed: gRPC falls back to grpc.aio"
	$(PY) src/sluice/frontends/grpc_edge/build.py
	touch $@

install: $(STAMP) $(EDGE_STAMP)

# Generated example models (seeded weights; not committed): resnet50 ONNX, a TorchScript MLP.
MODELS := examples/model_repo/resnet50/1/model.onnx examples/model_repo/torch_linear/1/model.pt
$(MODELS): scripts/make_models.py | $(STAMP)
	$(PY) scripts/make_models.py

models: $(MODELS)

serve: install models
	$(VENV)/bin/sluice serve --model-repository=examples/model_repo \
	  --model-control-mode=explicit --load-model=add_sub --strict-readiness=true

# perf_analyzer (NVIDIA's, from the tritonclient 2.40.0 wheel) for the seed-command e2e tests
PA_STAMP := $(VENV)/bin/perf_analyzer
$(PA_STAMP): scripts/install-perf-analyzer | $(STAMP)
	scripts/install-perf-analyzer

# Azurite (the Azure Blob emulator, from npm) for the object-store repository tests
AZURITE_STAMP := $(VENV)/azurite/.installed
$(AZURITE_STAMP): scripts/install-test-services | $(STAMP)
	scripts/install-test-services

# The docs build and the checks run first: a broken page or a lint error fails CI early.
test: install models $(PA_STAMP) $(AZURITE_STAMP) docs check
	scripts/install-system-deps
	scripts/run-tests

check: install
	$(VENV)/bin/ruff format --check src tests bench scripts docs/hooks
	$(VENV)/bin/ruff check src tests bench scripts docs/hooks
	$(VENV)/bin/mypy

# The documentation site (mkdocs.yml, docs/) into site/, every warning an error: broken links,
# missing anchors, pages left out of the nav. The flag reference is generated during the build.
docs: install
	$(VENV)/bin/mkdocs build --strict --quiet -d site

format: install
	$(VENV)/bin/ruff format src tests bench scripts docs/hooks
	$(VENV)/bin/ruff check --fix src tests bench scripts docs/hooks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
