"""A headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, for tests of
the dashboard page: navigate, evaluate JavaScript, wait on page state, take a screenshot.

Usage::

    with Browser(tmp_path) as page:
        page.navigate("http://127.0.0.1:8000/dashboard")
        page.wait_for("document.querySelectorAll('tr').length > 1")
        page.screenshot(tmp_path / "shot.png")
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import websockets

__all__ = ["Browser", "chromium_path"]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium process with one page; stopped by its PID on exit."""

    def __init__(self, workdir: Path, width: int = 1280, height: int = 1000) -> None:
        self.workdir = workdir
        self.size = (width, height)
        self.proc: subprocess.Popen[bytes] | None = None
        self.loop = asyncio.new_event_loop()
        self.ws: Any = None
        self.ids = itertools.count(1)
        self.console: list[str] = []

    def __enter__(self) -> Browser:
        exe = chromium_path()
        assert exe is not None
        log = self.workdir / "chromium.log"
        self._log = open(log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                exe,
                "--headless",
                "--no-sandbox",  # tests may run as root
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={self.workdir / 'chromium-profile'}",
                f"--window-size={self.size[0]},{self.size[1]}",
                "about:blank",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            port = self._devtools_port(log)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                targets = json.loads(r.read())
            url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            self.ws = self.loop.run_until_complete(websockets.connect(url, max_size=64 << 20))
            self.call("Page.enable")
            self.call("Runtime.enable")
        except BaseException:
            self.__exit__()
            raise
        return self

    def _devtools_port(self, log: Path, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(
                r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", log.read_text(errors="replace")
            )
            if m:
                return int(m.group(1))
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited: {log.read_text(errors='replace')}")
            time.sleep(0.05)
        raise TimeoutError(f"chromium did not open DevTools: {log.read_text(errors='replace')}")

    def __exit__(self, *exc: object) -> None:
        if self.ws is not None:
            self.loop.run_until_complete(self.ws.close())
        self.loop.close()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()

    # ------------------------------------------------------------------ protocol
    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        mid = next(self.ids)
        await self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(await asyncio.wait_for(self.ws.recv(), 30))
            if msg.get("method") == "Runtime.consoleAPICalled":
                args = msg["params"].get("args", [])
                self.console.append(
                    " ".join(str(a.get("value", a.get("description"))) for a in args)
                )
            elif msg.get("method") == "Runtime.exceptionThrown":
                self.console.append(json.dumps(msg["params"]["exceptionDetails"]))
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self.loop.run_until_complete(self._call(method, params))

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0, what: str = "") -> Any:
        """Poll ``expression`` until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError:
                value = None  # the page is still loading
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(
            f"timed out waiting for {what or expression}; console: {self.console[-10:]}"
        )

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))
