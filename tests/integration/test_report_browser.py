"""report.html in a real browser: headless Chromium loads the report of a short real simulation.

The page must load with no console error, no uncaught exception and no failed load; every
``<img>`` (the inlined plots) must decode to a picture of non-zero size; the verdict must open the
page. Chromium is driven over its DevTools protocol (a websocket), started with its own profile
directory and a debugging port of its choosing, and stopped afterwards.

Chromium is Debian's ``chromium`` package, which ``make test`` installs when missing
(``tools/install-debian-package.sh chromium chromium``). Without it this test fails and says so:
it is never skipped.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from headroom.cli import main

pytestmark = pytest.mark.slow

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STARTUP_S = 90.0  # a loaded 2-core host can take long to start a browser
STEP_S = 120.0  # any one protocol step (a load, a decode, a screenshot)
# A short run with a reclaim (so there are releases) and both ends of the policy list.
SCENARIO = """
name: browser-check
seed: 3
duration_s: 600
slo: {p99_ms: 200, window_s: 10}
world: {ads: 5000, dim: 16, base_candidates: 200, max_candidates: 600, holdout: 0.02}
models:
  base: {cpu_ms_per_candidate: 0.1, accelerator_ms_per_candidate: 0.02, hardware: [gpu-a, gpu-b]}
  strong: {cpu_ms_per_candidate: 0.005, accelerator_ms_per_candidate: 0.1, hardware: [gpu-b]}
segments:
  - {name: premium, share: 0.15, value: {mean: 3.0, sigma: 0.8}, base_error: 0.15,
     strong_error: 0.10}
  - {name: casual,  share: 0.85, value: {mean: 0.6, sigma: 0.6}, base_error: 0.50,
     strong_error: 0.20}
regions:
  - name: us-east
    dedicated: {cpu: 12, accelerator: 2, hardware: gpu-a}
    traffic: {rps: 60}
    opportunistic:
      - {resource: cpu,         hardware: any,   trace: [[0, 4], [300, 8]]}
      - {resource: accelerator, hardware: gpu-b, trace: [[0, 2]]}
events:
  - {at_s: 240, kind: preempt, region: us-east, resource: accelerator, hardware: gpu-b, units: 0}
  - {at_s: 360, kind: grant,   region: us-east, resource: accelerator, hardware: gpu-b, units: 2}
"""


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "chromium is not installed: the report browser test needs Debian's `chromium` package "
        "(`make test` installs it; or apt-get install chromium)"
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """report.html of a real, short simulation (static and headroom)."""
    base = tmp_path_factory.mktemp("browser")
    scenario = base / "browser-check.yaml"
    scenario.write_text(SCENARIO, encoding="utf-8")
    out = base / "run"
    code = main(
        [
            "simulate",
            str(scenario),
            "--policy",
            "static,headroom",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    return out / "report.html"


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[str]:
    """A headless Chromium on a free debugging port; yields the port's HTTP address."""
    binary = chromium_binary()
    log = (profile.parent / "chromium.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            "--headless",
            "--no-sandbox",  # the tests may run as root (a container)
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + STARTUP_S
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None:
                log.flush()
                tail = (profile.parent / "chromium.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"chromium exited with {proc.returncode} at start-up:\n{tail}")
            if time.monotonic() > deadline:
                pytest.fail(f"chromium did not open its debugging port within {STARTUP_S:g} s")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        log.close()


class Page:
    """One page target over the DevTools protocol: commands, and the events it reports."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        ident = self.next_id
        await self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        async with asyncio.timeout(STEP_S):
            while True:
                message = json.loads(await self.ws.recv())
                if message.get("id") == ident:
                    if "error" in message:
                        raise AssertionError(f"{method}: {message['error']}")
                    result: dict[str, Any] = message.get("result", {})
                    return result
                if "method" in message:
                    self.events.append(message)

    async def wait_for(self, method: str) -> dict[str, Any]:
        async with asyncio.timeout(STEP_S):
            while True:
                for e in self.events:
                    if e["method"] == method:
                        return e
                message = json.loads(await self.ws.recv())
                if "method" in message:
                    self.events.append(message)

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads seen so far."""
        found = []
        for e in self.events:
            method, params = e["method"], e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                args = [a.get("value", a.get("description")) for a in params.get("args", [])]
                found.append(f"console.{params['type']}: {args}")
            elif method == "Runtime.exceptionThrown":
                found.append(f"exception: {params.get('exceptionDetails')}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                found.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url')}")
            elif method == "Network.loadingFailed":
                found.append(f"load failed: {params.get('errorText')}")
        return found


# Every <img> once decoded (decode() rejects a picture that cannot be decoded).
IMAGES_JS = """
Promise.all(Array.from(document.images).map(img => img.decode().then(
  () => ({alt: img.alt, ok: true, w: img.naturalWidth, h: img.naturalHeight}),
  err => ({alt: img.alt, ok: false, w: img.naturalWidth, h: img.naturalHeight,
           error: String(err)}))))
"""
PAGE_JS = """({title: document.title,
  verdict: (document.getElementById('verdict') || {}).innerText || null,
  checks: !!document.getElementById('checks'),
  width: document.documentElement.scrollWidth})"""


async def inspect(address: str, url: str) -> dict[str, Any]:
    from urllib.request import urlopen

    def targets() -> list[dict[str, Any]]:
        with urlopen(f"http://{address}/json/list", timeout=STEP_S) as r:
            listed: list[dict[str, Any]] = json.loads(r.read())
            return listed

    pages = [t for t in await asyncio.to_thread(targets) if t.get("type") == "page"]
    assert pages, "chromium opened no page"
    async with connect(pages[0]["webSocketDebuggerUrl"], max_size=None) as ws:
        page = Page(ws)
        for domain in ("Runtime", "Log", "Network", "Page"):
            await page.send(f"{domain}.enable")
        await page.send("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                        deviceScaleFactor=1, mobile=False)  # fmt: skip
        navigated = await page.send("Page.navigate", url=url)
        assert "errorText" not in navigated, navigated
        await page.wait_for("Page.loadEventFired")
        images = await page.send(
            "Runtime.evaluate", expression=IMAGES_JS, awaitPromise=True, returnByValue=True
        )
        info = await page.send("Runtime.evaluate", expression=PAGE_JS, returnByValue=True)
        shot = await page.send("Page.captureScreenshot", format="png")
        return {
            "screenshot": base64.b64decode(shot["data"]),
            "images": images["result"]["value"],
            "page": info["result"]["value"],
            "problems": page.problems(),
        }


def test_report_loads_in_chromium_with_every_image_decoded(report: Path, tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    profile.mkdir()
    screenshot = tmp_path / "report.png"
    with chromium(profile) as address:
        seen = asyncio.run(inspect(address, report.resolve().as_uri()))
    screenshot.write_bytes(seen["screenshot"])  # kept beside the test's files, to look at
    assert seen["problems"] == [], seen["problems"]
    images = seen["images"]
    n_png = len(list((report.parent / "plots").glob("*.png")))
    assert len(images) == n_png >= 8, images  # every plot, inlined
    bad = [i for i in images if not i["ok"] or i["w"] <= 0 or i["h"] <= 0]
    assert bad == [], bad
    page = seen["page"]
    assert page["title"].startswith("headroom report")
    assert page["verdict"], page
    assert page["verdict"].startswith("headroom:"), page
    assert "checks" in page["verdict"]
    assert page["checks"]
    assert screenshot.read_bytes().startswith(PNG_MAGIC)
