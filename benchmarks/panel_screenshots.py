"""Screenshots of both scenarios' panels in a real browser, after a Run: JupyterLab on localhost, headless Chromium,
Playwright, set up as ``tests/test_browser.py`` sets them up (its helpers are reused).

Each panel is built as its notebook builds it (smoke mode, offline), its Run clicked, and the panel shot once the
run's row is in its history and the stage chart is drawn: scenario 1 with the user's V x V head (the real model's
verdict; the tiny twin out of memory at step 1 under the cap scaled from the T4), scenario 2 with the user's fold
loop (fold 2's load over the T4; the twin out of memory at fold 2's load under the scaled cap).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/panel_screenshots.py docs/images
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import test_browser as browser  # noqa: E402  (its JupyterLab and Chromium setup)

CELLS = [
    browser.CELLS[0],
    "from kit import panel\npanel_1 = panel(scenario=1, steps=2)\npanel_1",
    "panel_2 = panel(scenario=2, folds=3, steps=2)\npanel_2",
]
SHOTS = {0: "panel-scenario-1.png", 1: "panel-scenario-2.png"}


def shoot(page, base: str, token: str, out: Path) -> list[Path]:
    page.goto(f"{base}/lab/tree/panel.ipynb?token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.wait_for_function("() => document.body.innerText.includes('| Idle')", timeout=90_000)
    page.click(".jp-Notebook .jp-Cell >> nth=0")
    page.keyboard.press("Escape")
    for _ in CELLS:
        page.keyboard.press("Shift+Enter")
    page.wait_for_selector(".kit-panel >> nth=1", timeout=180_000)
    shots = []
    for index, name in SHOTS.items():
        panel = page.locator(".kit-panel").nth(index)
        panel.locator(".kit-judged").first.wait_for(timeout=60_000)
        panel.locator("button", has_text="Run").click()
        panel.locator(".kit-history td.kit-status").first.wait_for(timeout=600_000)
        panel.locator(".jp-OutputArea-output img").first.wait_for(timeout=60_000)
        time.sleep(1)
        panel.screenshot(path=str(out / name))
        print(f"{name}: {panel.locator('.kit-history td.kit-status').first.inner_text()}", flush=True)
        shots.append(out / name)
    return shots


def main(out_dir: str) -> None:
    from playwright.sync_api import sync_playwright

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    browser.CELLS[:] = CELLS
    tmp = Path(tempfile.mkdtemp(prefix="kit-shots-"))
    browser._notebook(tmp / "panel.ipynb")
    port, token = browser._free_port(), uuid.uuid4().hex
    with open(tmp / "jupyterlab.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp}",
             "--ServerApp.port_retries=0", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             "--LabApp.extension_manager=readonly", "--allow-root"],
            cwd=tmp, env=browser._lab_env(tmp), stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            browser._wait_for_server(f"{base}/api/status?token={token}", proc)
            with sync_playwright() as pw:
                chromium = pw.chromium.launch(executable_path=browser.CHROMIUM, args=browser.ARGS, headless=True)
                page = chromium.new_page(viewport={"width": 1400, "height": 2400})
                page.set_default_timeout(60_000)
                try:
                    shoot(page, base, token, out)
                except Exception:
                    page.screenshot(path=str(tmp / "failure.png"))
                    print(f"failed: see {tmp}/failure.png and {tmp}/jupyterlab.log", file=sys.stderr)
                    raise
                chromium.close()
        finally:
            proc.terminate()
            proc.wait(timeout=15)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/images")
