"""Regenerate the screenshots in docs/img/ for docs/view.md: real runs made by the CLI on the
scripted provider in a temporary runs directory, `runner view` on it, and Debian's headless
Chromium (playwright) taking each page; with Phoenix installed (the `phoenix` extra), also the
plan run exported to Phoenix and its trace as Phoenix shows it.

    python scripts/view_screenshots.py            # writes docs/img/view-*.png
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "img"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def runner(*args: str, env: dict[str, str]) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-m", "runner", *args, "--json"], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)
    return dict(json.loads(proc.stdout))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="runner-shots-") as tmp:
        env = {"RUNNER_RUNS_DIR": str(Path(tmp) / "runs")}
        plan = runner("run", "--scenario", "plan", env=env)
        runner("run", "--scenario", "research", env=env)
        runner("run", "--scenario", "runaway", "--max-turns", "8", env=env)
        waiting = runner("run", "--scenario", "destructive", env=env)
        runner("suite", "--provider", "scripted", "--repeat", "2", env=env)
        view = subprocess.Popen([sys.executable, "-m", "runner", "view", "--port", "0"], stdout=subprocess.PIPE,
                                text=True, env={**os.environ, **env})
        phoenix = None
        try:
            assert view.stdout is not None
            found = re.search(r"http://\S+/", view.stdout.readline())
            assert found, "runner view printed no URL"
            url = found.group(0)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(url)
                page.screenshot(path=str(OUT / "view-runs.png"))
                page.goto(f"{url}runs/{plan['run_id']}")
                page.screenshot(path=str(OUT / "view-run.png"), full_page=True)
                page.goto(f"{url}runs/{waiting['run_id']}")
                page.screenshot(path=str(OUT / "view-approval.png"))
                page.goto(f"{url}suites")
                page.click("ul.suites a")
                page.screenshot(path=str(OUT / "view-suite.png"), full_page=True)
                phoenix = start_phoenix(Path(tmp))
                if phoenix is not None:
                    base = phoenix[1]
                    runner("export", str(plan["run_id"]), "--otlp-endpoint", base, env=env)
                    time.sleep(3)
                    page.goto(f"{base}/projects")
                    page.wait_for_timeout(3000)
                    page.get_by_text("runner", exact=True).first.click()
                    page.wait_for_timeout(3000)
                    page.get_by_text("invoke_agent runner").first.click()
                    page.wait_for_timeout(3000)
                    page.screenshot(path=str(OUT / "view-phoenix.png"))
                browser.close()
        finally:
            view.terminate()
            view.wait(10)
            if phoenix is not None:
                phoenix[0].terminate()
                phoenix[0].wait(15)
    for png in sorted(OUT.glob("view-*.png")):
        print(png.relative_to(ROOT))
    return 0


def start_phoenix(work: Path) -> tuple[subprocess.Popen[bytes], str] | None:
    exe = Path(sys.executable).with_name("phoenix")
    if not exe.exists():
        print("phoenix is not installed (pip install 'runner[phoenix]'): no Phoenix screenshot", file=sys.stderr)
        return None
    port = free_port()
    env = {**os.environ, "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(free_port()), "PHOENIX_HOST": "127.0.0.1",
           "PHOENIX_WORKING_DIR": str(work / "phoenix"), "PHOENIX_TELEMETRY_ENABLED": "false"}
    proc = subprocess.Popen([str(exe), "serve"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.terminate()
    return None


if __name__ == "__main__":
    sys.exit(main())
