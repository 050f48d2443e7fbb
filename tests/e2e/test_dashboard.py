"""The operator's dashboard (/dashboard) in a real headless Chromium: the rendered page lists
the models and their states, charts are drawn from live statistics, a button loads a model,
the control event shows; a screenshot is kept (SLUICE_DASHBOARD_SCREENSHOT=path to keep it
elsewhere too, e.g. docs/dashboard.png)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from tests import zoo
from tests.e2e.cdp import Browser, chromium_path
from tests.e2e.helpers import index_entries, infer_fp32, post, request, wait_until

pytestmark = pytest.mark.skipif(
    chromium_path() is None, reason="chromium is not installed (scripts/install-system-deps)"
)


def _load(srv: object, stop: threading.Event, sent: list[int]) -> None:
    """Bounded client load: sleep (ok) and faulty (13 fails in the model) once loaded."""
    for i in range(3000):
        if stop.is_set():
            return
        infer_fp32(srv, "sleep", float(i))
        sent[0] += 1
        if i % 5 == 0:
            infer_fp32(srv, "faulty", 13.0)


def test_dashboard_renders_live_data_and_loads_a_model(start_server, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    zoo.identity(repo)
    zoo.sleep_model(repo, ms=2, count=2)
    zoo.fail_model(repo)
    srv = start_server(
        repo, "--model-control-mode=explicit", "--load-model=identity", "--load-model=sleep"
    )
    # the JSON the page polls, and the page itself
    code, raw = request(srv, "GET", "/dashboard/data")
    assert code == 200, raw
    doc = json.loads(raw)
    assert {(m["name"], m["state"]) for m in doc["models"]} == {
        ("identity", "READY"),
        ("sleep", "READY"),
        ("faulty", ""),
    }
    assert next(m for m in doc["models"] if m["name"] == "sleep")["instances"] == 2
    code, raw = request(srv, "GET", "/dashboard")
    assert code == 200 and b"<canvas" in raw
    code, raw = post(srv, "/dashboard/data")
    assert code == 405, raw

    stop = threading.Event()
    sent = [0]
    client = threading.Thread(target=_load, args=(srv, stop, sent), daemon=True)
    client.start()
    try:
        with Browser(tmp_path) as page:
            page.navigate(f"http://127.0.0.1:{srv.http_port}/dashboard?interval=500")
            page.wait_for("Number(document.body.dataset.polls) >= 1", what="first poll")
            states = page.evaluate(
                "[...document.querySelectorAll('#models tbody tr')]"
                ".map(r => [r.dataset.model, r.dataset.state])"
            )
            assert sorted(states) == [["faulty", ""], ["identity", "READY"], ["sleep", "READY"]]
            assert page.evaluate("document.querySelector('#ready').textContent") == "ready"
            # live charts: a throughput series for sleep with a value above 0, drawn on canvas
            page.wait_for(
                "(Chart.getChart('c-throughput').data.datasets.find(d => d.label === 'sleep/1')"
                " || {data: []}).data.some(v => v > 0)",
                what="a throughput point for sleep/1",
            )
            page.wait_for(
                "Chart.getChart('c-latency').data.datasets.some(d => d.data.some(v => v > 0))",
                what="a latency percentile",
            )
            painted = page.evaluate(
                "(() => { const c = document.querySelector('#c-throughput');"
                " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
                " let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; })()"
            )
            assert painted > 1000, painted
            # a button loads a model: the server loads it, the page shows it READY and the event
            page.evaluate(
                'document.querySelector(\'tr[data-model="faulty"] button[data-action="load"]\')'
                ".click()"
            )
            wait_until(
                lambda: [e.get("state") for e in index_entries(srv, "faulty")] == ["READY"],
                what="faulty READY after the button",
            )
            page.wait_for(
                "document.querySelector('tr[data-model=\"faulty\"]').dataset.state === 'READY'",
                what="faulty READY on the page",
            )
            page.wait_for(
                "[...document.querySelectorAll('#events tbody tr')].some(r =>"
                " r.textContent.includes('load') && r.textContent.includes('faulty'))",
                what="the load event",
            )
            # failures by reason, from the faulty model's errors
            page.wait_for(
                "Chart.getChart('c-fail').data.datasets.some(d => d.label === 'faulty/1'"
                " && d.data.some(v => v > 0))",
                what="a failure bar",
            )
            page.wait_for("Chart.getChart('c-batch').data.labels.length > 0", what="batch sizes")
            shot = tmp_path / "dashboard.png"
            page.screenshot(shot)
            assert shot.stat().st_size > 10_000
            keep = os.environ.get("SLUICE_DASHBOARD_SCREENSHOT")
            if keep:
                shutil.copyfile(shot, keep)
            assert not [c for c in page.console if "exception" in c.lower()], page.console
    finally:
        stop.set()
        client.join(30)
    assert sent[0] > 0
    events = json.loads(request(srv, "GET", "/dashboard/data")[1])["events"]
    assert events[0]["action"] == "load" and events[0]["model"] == "faulty" and events[0]["ok"]


def test_dashboard_with_api_keys_sends_the_operators_key(start_server, tmp_path: Path) -> None:
    """Keys on: the page's data needs a key (statistics), its controls the admin role; the
    key the operator types is sent as 'Authorization: Bearer <key>' (and kept in
    sessionStorage)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    zoo.identity(repo)
    keys = tmp_path / "keys"
    reader, admin = "reader-secret", "admin-secret"
    keys.write_text(
        f"{hashlib.sha256(reader.encode()).hexdigest()} inference reader\n"
        f"{hashlib.sha256(admin.encode()).hexdigest()} admin ops\n"
    )
    srv = start_server(repo, "--model-control-mode=explicit", f"--api-keys-file={keys}")
    assert request(srv, "GET", "/dashboard")[0] == 200  # the page itself is open
    assert request(srv, "GET", "/dashboard/data")[0] == 401
    with Browser(tmp_path) as page:
        page.navigate(f"http://127.0.0.1:{srv.http_port}/dashboard?interval=500")
        page.wait_for(
            "document.querySelector('#server').textContent.includes('401')", what="the refusal"
        )

        def use_key(key: str) -> None:
            page.evaluate(
                f"(() => {{ const k = document.querySelector('#key'); k.value = {key!r};"
                " k.dispatchEvent(new Event('change')); })()"
            )

        # an inference key reads the data but may not load
        use_key(reader)
        page.wait_for("!!document.querySelector('tr[data-model=\"identity\"]')", what="the models")
        click = (
            'document.querySelector(\'tr[data-model="identity"] button[data-action="load"]\')'
            ".click()"
        )
        page.evaluate(click)
        page.wait_for(
            "document.querySelector('#status').textContent.includes('403')", what="the 403"
        )
        # the admin key loads it
        use_key(admin)
        page.evaluate(click)
        page.wait_for(
            "document.querySelector('tr[data-model=\"identity\"]').dataset.state === 'READY'",
            what="identity READY",
        )
        assert page.evaluate("sessionStorage.getItem('sluice.dashboard.key')") == admin
    code, raw = request(
        srv, "GET", "/v2/repository/index", headers={"Authorization": f"Bearer {admin}"}
    )
    assert code == 200 and {"name": "identity", "version": "1", "state": "READY"} in json.loads(raw)
