"""deploy/: the Kubernetes manifests validate (kubernetes-validate --strict) and agree with
each other and with `sluice serve`'s flags; every Grafana query names metrics a real server
exports (scraped from its metrics port)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.cli import parse_serve_args
from tests import zoo
from tests.conftest import ROOT
from tests.e2e.helpers import infer_fp32

K8S = ROOT / "deploy" / "kubernetes"
GRAFANA = ROOT / "deploy" / "grafana" / "sluice.json"
CORE_KINDS = {
    "Deployment",
    "Service",
    "HorizontalPodAutoscaler",
    "PodDisruptionBudget",
    "ConfigMap",
}


def _docs() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out[doc["kind"]] = doc
    return out


def _validator() -> list[str]:
    exe = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("kubernetes-validate is not installed (pip install -e '.[dev]')")
    return [exe]


def test_manifests_validate_strict() -> None:
    files = sorted(str(p) for p in K8S.glob("*.yaml"))
    proc = subprocess.run(
        [*_validator(), "--strict", *files], capture_output=True, text=True, timeout=60
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # every core kind passed against the schema; only the two CRDs have none in the validator
    passed = set(re.findall(r"passed for resource (\w+)/", out))
    assert passed == {k.lower() for k in CORE_KINDS}, out
    missing = set(re.findall(r"Couldn't find schema for kind (\w+)", out))
    assert missing == {"ServiceMonitor", "ServingRuntime"}, out


def _flags(args: list[str]) -> Any:
    return parse_serve_args(args)


def test_manifests_agree_with_the_server_and_each_other() -> None:
    docs = _docs()
    dep = docs["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["sluice", "serve"]
    cfg = _flags(c["args"])  # the flags parse as `sluice serve` parses them
    grace = pod["terminationGracePeriodSeconds"]
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert grace > cfg.exit_timeout_secs + pre_stop
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": cfg.http_port, "grpc": cfg.grpc_port, "metrics": cfg.metrics_port}
    # probes as docs/deployment.md "Behind Kubernetes probes"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 300
    assert "memory" in c["resources"]["limits"] and "cpu" in c["resources"]["requests"]
    readme = (ROOT / "docs" / "deployment.md").read_text()
    assert "/v2/health/live" in readme and "startupProbe" in readme
    # selectors: Service, PDB and ServiceMonitor find the Deployment's pods
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert docs["Service"]["spec"]["selector"].items() <= labels.items()
    assert docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    svc_labels = docs["Service"]["metadata"]["labels"]
    sm = docs["ServiceMonitor"]["spec"]
    assert sm["selector"]["matchLabels"].items() <= svc_labels.items()
    assert {e["port"] for e in sm["endpoints"]} <= {
        p["name"] for p in docs["Service"]["spec"]["ports"]
    }
    assert sm["endpoints"][0]["path"] == "/metrics"
    # HPA: its metrics are the ones the adapter rules name, on a queue signal
    hpa = docs["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "sluice",
    }
    rules = yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"])["rules"]
    named = {r["name"]["as"] for r in rules}
    assert {m["pods"]["metric"]["name"] for m in hpa["metrics"]} == named
    for r in rules:
        assert re.fullmatch(r["name"]["matches"], r["seriesQuery"].split("{")[0])
    # KServe ServingRuntime: v2 protocol, flags that parse, the port it declares is HTTP's
    sr = docs["ServingRuntime"]["spec"]
    assert docs["ServingRuntime"]["apiVersion"] == "serving.kserve.io/v1alpha1"
    assert "v2" in sr["protocolVersions"] and "grpc-v2" in sr["protocolVersions"]
    (kc,) = sr["containers"]
    assert kc["name"] == "kserve-container"
    kcfg = _flags(kc["args"])
    assert [str(p) for p in kcfg.model_repositories] == ["/mnt/models"]
    assert kc["ports"][0]["containerPort"] == kcfg.http_port
    assert {f["name"] for f in sr["supportedModelFormats"]} >= {"triton"}


@pytest.fixture(scope="module")
def exported(module_server: Any, module_repo: Path) -> set[str]:
    """Sample names a real server exports once a model has served (and failed) requests."""
    zoo.fail_model(module_repo)
    srv = module_server(module_repo)
    assert infer_fp32(srv, "faulty", 1.0)[0] == 200
    assert infer_fp32(srv, "faulty", 13.0)[0] != 200
    with urllib.request.urlopen(f"http://{srv.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_grafana_queries_name_exported_metrics(exported: set[str]) -> None:
    dash = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v.get("definition")]
    used = {m for e in exprs for m in re.findall(r"\bnv_[a-z_]+", e)}
    unknown = sorted(used - exported)
    assert not unknown, f"queries name metrics the server does not export: {unknown}"
    # what the issue asks the dashboard to show
    for needed in (
        "nv_inference_count",
        "nv_inference_request_duration_histogram_us_bucket",
        "nv_inference_queue_duration_us",
        "nv_inference_request_failure",
        "nv_inference_pending_request_count",
        "nv_cpu_utilization",
        "nv_cpu_memory_used_bytes",
    ):
        assert needed in used, needed
    assert "histogram_quantile(0.99" in " ".join(exprs)
    # well-formed panels: unique ids, a datasource, at least one target each
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["targets"] and p["datasource"]["type"] == "prometheus", p["title"]
        assert {"x", "y", "w", "h"} <= p["gridPos"].keys()


def test_adapter_rules_name_exported_metrics(exported: set[str]) -> None:
    rules = yaml.safe_load(_docs()["ConfigMap"]["data"]["config.yaml"])["rules"]
    used = {
        m
        for r in rules
        for m in re.findall(r"\b(?:nv|sluice)_[a-z_]+", r["seriesQuery"] + r["metricsQuery"])
    }
    assert used and not used - exported
