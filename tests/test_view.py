"""`runner view` in a real headless Chromium (Debian's `chromium`, driven by playwright; those
tests are marked slow), over runs made by the real CLI against the real scripted provider, and
a worker driving a run the page approved. Also the view's guard over plain HTTP: the token, the
loopback Host check and the CSRF defence. Screenshots of each browser step go to the test's
temp folder.

Needs /usr/bin/chromium (`./scripts/test.sh` installs it: `apt-get install chromium`) and the
`playwright` package (dev extra); playwright's own browser download is never used.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runner.state import Endpoint, RunConfig, new_run
from runner.store import FileStore
from tests.conftest import Backend, cli, cli_json, cli_process, cli_process_json, one_error
from tests.fakeprovider import FakeProvider, completion, tool_call

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SCRIPT = "<script>alert(1)</script>"


class Proc:
    """A runner subprocess, stopped with terminate -> wait -> kill."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "runner", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env={**os.environ, **env})

        self.stderr = ""

    def stop(self) -> None:
        """Stop it (if still running) and keep what it wrote on stderr in `stderr`."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            _, self.stderr = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, self.stderr = self.proc.communicate()


@contextlib.contextmanager
def view_server(env: dict[str, str], *extra: str) -> Iterator[str]:
    """`runner view --port 0` on `env`'s store; yields its base URL."""
    server = Proc(["view", "--port", "0", *extra], env)
    try:
        assert server.proc.stdout is not None
        line = server.proc.stdout.readline()
        found = re.search(r"http://\S+/", line)
        assert found, f"no URL from runner view: {line!r}"
        yield found.group(0).replace("0.0.0.0", "127.0.0.1")
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), "the browser tests need Debian's chromium: apt-get install chromium"
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(20_000)
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    tab.on("dialog", on_dialog)
    tab.dialogs = dialogs
    try:
        yield tab
    finally:
        context.close()


def script_run(backend: Backend) -> str:
    """A run whose tool result holds `SCRIPT`: a model (the fake provider) asks to read a file
    named like a script tag, and the tool's error echoes the name."""
    def handler(body: dict[str, Any]) -> Any:
        if sum(1 for m in body["messages"] if m["role"] == "assistant") == 0:
            return completion({"role": "assistant", "content": None,
                               "tool_calls": [tool_call("c1", "read_file", json.dumps({"path": SCRIPT}))]})
        return completion({"role": "assistant", "content": "There is no file <b>named</b> " + SCRIPT})

    with FakeProvider(handler) as fake:
        code, out = cli_process_json("run", "Read the file.", "--base-url", fake.base_url, "--model", "fake",
                             runs_dir=backend.runs, env=backend.env)
    assert code == 0, out
    return str(out["run_id"])


@pytest.mark.slow  # a headless Chromium
@pytest.mark.parametrize("backend", ["files", "postgres"], indirect=True)
def test_browser_runs_run_transcript_chart_and_approval(backend: Backend, tmp_path: Path, page: Any) -> None:
    runs, env = backend.runs, backend.env
    shots = tmp_path / "screenshots"
    code, plan = cli_process_json("run", "--scenario", "plan", runs_dir=runs, env=env)
    assert code == 0
    scripted = script_run(backend)
    code, waiting = cli_process_json("run", "--scenario", "destructive", runs_dir=runs, env=env)
    assert code == 3 and waiting["interruption"]["type"] == "approval", waiting
    call_id = waiting["interruption"]["call_id"]

    with view_server(env) as url:
        page.goto(url)
        for run_id in (plan["run_id"], scripted, waiting["run_id"]):
            assert page.locator(f'tr[data-run-id="{run_id}"]').count() == 1
        assert "3 runs" in " ".join(page.locator(".totals").inner_text().split())
        page.screenshot(path=str(shots / "1-runs.png"), full_page=True)

        page.click(f'a[href="/runs/{plan["run_id"]}"]')
        page.wait_for_url(f"**/runs/{plan['run_id']}")
        transcript = page.locator("#run-transcript").inner_text()
        assert "Which log file mentions a timeout" in transcript and "list_files" in transcript
        assert "worker 7 timed out after 30000 ms" in transcript
        assert page.locator('svg.chart[data-turns="3"]').count() == 1
        assert page.locator('svg.chart rect[data-series="prompt_tokens"]').count() == 3
        page.screenshot(path=str(shots / "2-run.png"), full_page=True)

        page.goto(f"{url}runs/{scripted}")
        result = page.locator(".call pre.result").inner_text()
        assert SCRIPT in result  # shown as text ...
        assert page.locator("#run-transcript script").count() == 0  # ... never as markup
        assert page.locator("#run-transcript b", has_text="named").count() == 0
        assert SCRIPT in page.locator(".msg.assistant pre.text").last.inner_text()
        page.wait_for_timeout(300)
        assert page.dialogs == []
        page.screenshot(path=str(shots / "3-script-as-text.png"), full_page=True)

        page.goto(f"{url}runs/{waiting['run_id']}")
        approval = page.locator("#approval")
        assert approval.get_attribute("data-call-id") == call_id
        assert "delete_file" in approval.inner_text() and "access.log" in approval.inner_text()
        page.screenshot(path=str(shots / "4-waiting.png"), full_page=True)
        worker = Proc(["worker", "--poll", "0.1"], env)
        try:
            page.click("#approve")
            page.wait_for_url(f"**/runs/{waiting['run_id']}")
            page.wait_for_selector('#status-badge:text-is("completed")', timeout=30_000)
            page.screenshot(path=str(shots / "5-completed.png"), full_page=True)
            assert "Deleted access.log." in page.locator(".call pre.result").last.inner_text()
            given = page.locator(".verdict-given.approve").inner_text()
            assert "approved by web:" in given
        finally:
            worker.stop()
        assert f"worker: {waiting['run_id']}: completed" in worker.stderr
    trace = [json.loads(line) for line in
             cli_process("trace", waiting["run_id"], "--json", runs_dir=runs, env=env).stdout.splitlines()]
    verdicts = [e for e in trace if e["type"] == "verdict"]
    assert len(verdicts) == 1 and verdicts[0]["verdict"] == "approve" and verdicts[0]["callId"] == call_id
    assert verdicts[0]["by"].startswith("web: ")
    assert trace[-1]["type"] == "run_stopped" and trace[-1]["status"] == "completed"
    assert sorted(p.name for p in shots.iterdir()) == ["1-runs.png", "2-run.png", "3-script-as-text.png",
                                                       "4-waiting.png", "5-completed.png"]


@pytest.mark.slow  # a headless Chromium
@pytest.mark.parametrize("backend", ["files", "postgres"], indirect=True)
def test_live_page_shows_turns_before_the_run_ends(backend: Backend, page: Any, tmp_path: Path) -> None:
    """A slow scripted run (700 ms per reply) driven by `runner run` in another process: the
    runs list gains its row and the run page its turns without a reload, while it runs."""
    with view_server(backend.env) as url:
        page.goto(url)
        page.evaluate("window.notReloaded = true")
        run = Proc(["run", "--scenario", "runaway", "--max-turns", "8", "--latency-ms", "700"], backend.env)
        try:
            row = page.wait_for_selector("tr[data-run-id]", timeout=20_000)
            assert row is not None
            run_id = row.get_attribute("data-run-id")
            assert page.evaluate("window.notReloaded") is True  # the row came over server-sent events
            page.goto(f"{url}runs/{run_id}")
            page.evaluate("window.notReloaded = true")
            page.wait_for_selector('.msg.assistant[data-turn="2"]', timeout=20_000)
            assert run.proc.poll() is None, "the run ended before the page showed turn 2"
            assert page.locator("#status-badge").inner_text() == "running"
            page.screenshot(path=str(tmp_path / "live-running.png"), full_page=True)
            page.wait_for_selector('#status-badge:text-is("max_turns_exceeded")', timeout=30_000)
            assert page.locator('.msg.assistant[data-turn="8"]').count() == 1
            assert page.locator('svg.chart[data-turns="8"]').count() == 1
            assert page.evaluate("window.notReloaded") is True
            assert int(page.evaluate("document.body.dataset.updates")) >= 3
            assert run.proc.wait(30) == 3
        finally:
            run.stop()


ROW_RECORDER = """
window.seen = [];
const record = () => document.querySelectorAll("tr[data-run-id]").forEach(
    (tr) => window.seen.push([tr.dataset.runId, tr.dataset.status, Number(tr.dataset.turns)]));
new MutationObserver(record).observe(document.getElementById("runs-list"), {childList: true, subtree: true});
"""
"""Records every (run id, status, turns) the live runs list shows, as it is updated."""


@pytest.mark.slow  # a headless Chromium
@pytest.mark.llama
def test_live_runs_list_follows_a_local_model_suite_turn_by_turn(tmp_path: Path, page: Any) -> None:
    """`runner suite --provider local` (the packaged SmolLM2 on the real llama.cpp server) in
    another process: the runs list, never reloaded, shows a run at turn 1 while it is still
    running, then every run at its stop."""
    env = {"RUNNER_RUNS_DIR": str(tmp_path / "runs")}
    with view_server(env) as url:
        page.goto(url)
        page.evaluate(ROW_RECORDER)
        suite = Proc(["suite", "--provider", "local", "--model", "smollm2-135m-instruct", "--max-turns", "3",
                      "--max-tokens", "64"], env)
        try:
            assert suite.proc.wait(600) == 0
        finally:
            suite.stop()
        page.wait_for_function("document.querySelectorAll('tr[data-run-id]').length === 6")
        page.wait_for_function("[...document.querySelectorAll('tr[data-run-id]')].every("
                               "(tr) => tr.dataset.status !== 'running')", timeout=10_000)
        seen = page.evaluate("window.seen")
        page.screenshot(path=str(tmp_path / "local-suite.png"), full_page=True)
    mid_run = {(run_id, turns) for run_id, status, turns in seen if status == "running" and turns >= 1}
    assert mid_run, f"the list never showed a run's turn while it ran: {sorted(set(map(tuple, seen)))[:20]}"
    finals = {run_id: (status, turns) for run_id, status, turns in seen}
    assert len(finals) == 6 and all(status != "running" for status, _ in finals.values())


def test_non_loopback_needs_a_token(tmp_path: Path) -> None:
    proc = cli_process("view", "--host", "0.0.0.0", runs_dir=tmp_path / "runs", timeout=60)  # or it serves on
    assert proc.returncode == 2
    assert "--token" in one_error(proc.stderr), proc.stderr


def test_token_csrf_and_host_checks(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    env = {"RUNNER_RUNS_DIR": str(runs)}
    code, waiting = cli_json("run", "--scenario", "destructive", runs_dir=runs)
    assert code == 3
    run_id, call_id = waiting["run_id"], waiting["interruption"]["call_id"]
    with view_server({**env, "RUNNER_VIEW_TOKEN": "s3cret-token"}, "--host", "0.0.0.0") as url:
        assert httpx.get(url).status_code == 401
        assert httpx.get(f"{url}runs/{run_id}").status_code == 401
        assert httpx.get(f"{url}static/view.js").status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
        entry = httpx.get(f"{url}runs/{run_id}?token=s3cret-token")
        assert entry.status_code == 303 and entry.headers["location"] == f"/runs/{run_id}"
        assert "samesite=strict" in entry.headers["set-cookie"].lower()
        with httpx.Client(base_url=url, cookies=entry.cookies) as client:
            run_page = client.get(f"/runs/{run_id}")
            assert run_page.status_code == 200
            assert "script-src 'self'" in run_page.headers["content-security-policy"]
            csrf = re.search(r'name="csrf" value="([^"]+)"', run_page.text)
            assert csrf is not None
            form = {"call_id": call_id, "verdict": "approve", "reason": ""}
            assert client.post(f"/runs/{run_id}/verdict", data=form).status_code == 403  # no CSRF token
            assert client.post(f"/runs/{run_id}/verdict", data={**form, "csrf": "guess"}).status_code == 403
            cross = client.post(f"/runs/{run_id}/verdict", data={**form, "csrf": csrf.group(1)},
                                headers={"Origin": "http://evil.example"})
            assert cross.status_code == 403
            site = client.post(f"/runs/{run_id}/verdict", data={**form, "csrf": csrf.group(1)},
                               headers={"Sec-Fetch-Site": "cross-site"})
            assert site.status_code == 403
            assert client.get(f"/runs/{run_id}/verdict").status_code == 405  # state changes only by POST
            wrong = client.post(f"/runs/{run_id}/verdict", data={**form, "call_id": "c99", "csrf": csrf.group(1)},
                                headers={"Origin": url.rstrip("/")})
            assert wrong.status_code == 400 and f"waits for a verdict on call {call_id} (delete_file)" in wrong.text
            state = json.loads(cli("runs", "--json", runs_dir=runs).stdout)[0]
            assert state["status"] == "interrupted"  # nothing above gave a verdict
            given = client.post(f"/runs/{run_id}/verdict", data={**form, "verdict": "reject", "reason": "keep it",
                                                                 "csrf": csrf.group(1)},
                                headers={"Origin": url.rstrip("/")})
            assert given.status_code == 303
    trace = [json.loads(line) for line in cli("trace", run_id, "--json", runs_dir=runs).stdout.splitlines()]
    verdict = next(e for e in trace if e["type"] == "verdict")
    assert verdict["verdict"] == "reject" and verdict["reason"] == "keep it" and verdict["by"].startswith("web: ")
    code, resumed = cli_json("resume", run_id, runs_dir=runs)  # a web verdict, then a plain resume
    assert code == 0 and resumed["status"] == "completed" and "did not delete" in resumed["answer"], resumed

    with view_server(env) as url:  # loopback without a token: only loopback host names
        assert httpx.get(url).status_code == 200
        assert httpx.get(url, headers={"Host": "attacker.example"}).status_code == 403
        assert httpx.get(url, headers={"Host": "localhost"}).status_code == 200


def test_runs_filters_totals_and_suites(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    env = {"RUNNER_RUNS_DIR": str(runs)}
    for scenario in ("plan", "plan", "repeat"):
        cli_json("run", "--scenario", scenario, runs_dir=runs)
    code, report = cli_json("suite", "--provider", "scripted", runs_dir=runs, timeout=120)
    assert code == 0
    with view_server(env) as url:
        everything = httpx.get(url).text
        assert 'data-matching="9"' in everything  # 3 runs + the suite's 6
        plans = httpx.get(url, params={"model": "scripted/plan"}).text
        assert 'data-matching="2"' in plans and plans.count("<tr data-run-id=") == 2
        assert "<b>6</b> turns" in plans
        found = httpx.get(url, params={"q": "worker 7 TIMED"}).text  # the answer, case-insensitively
        assert plans.count("<tr data-run-id=") == 2 and "data-matching" in found
        assert 'data-matching="0"' in httpx.get(url, params={"status": "died"}).text
        suites = httpx.get(f"{url}suites").text
        name = next(runs.glob("suite-*.json")).stem
        assert name in suites
        page = httpx.get(f"{url}suites/{name}").text
        assert "timeout_file" in page and "100%" in page
        assert httpx.get(f"{url}suites/..%2Fetc").status_code == 404
        store = FileStore(runs)
        for k in range(50):  # queued runs, made directly in the store: a second page
            store.create(new_run(f"task {k}", RunConfig(endpoint=Endpoint(model="scripted/plan"))))
        first = httpx.get(url, params={"status": "queued"}).text
        assert 'data-matching="50"' in first and first.count("<tr data-run-id=") == 50 and ">older<" not in first
        store.create(new_run("one more", RunConfig(endpoint=Endpoint(model="scripted/plan"))))
        first = httpx.get(url, params={"status": "queued"}).text
        older = re.search(r'href="(/\?[^"]*page=2[^"]*)"', first)
        assert older is not None and first.count("<tr data-run-id=") == 50
        second = httpx.get(url + older.group(1).lstrip("/").replace("&amp;", "&")).text
        assert second.count("<tr data-run-id=") == 1 and "task 0" in second and "page 2 of 2" in second
        assert httpx.get(f"{url}runs/nope").status_code == 404
        started = time.monotonic()
        with httpx.stream("GET", f"{url}runs/{report['results'][0]['run_id']}/events", timeout=10) as stream:
            first = ""
            for line in stream.iter_lines():
                first += line + "\n"
                if line.startswith("data:"):
                    break
        assert "event: update" in first and time.monotonic() - started < 5


def test_a_write_waiting_for_a_verdict_shows_the_diff_it_would_make(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    code, waiting = cli_json("run", "--scenario", "destructive", runs_dir=runs)
    assert code == 3
    with view_server({"RUNNER_RUNS_DIR": str(runs)}) as url, httpx.Client(base_url=url) as client:
        page = client.get(f"/runs/{waiting['run_id']}").text
    approval = page[page.index('id="approval"'):]
    assert "delete <code>access.log</code>: 3 lines\n      removed, 0 added" in approval
    diff = re.search(r'<pre class="diff" id="diff">(.*?)</pre>', approval, re.S)
    assert diff is not None and '<span class="del">-10.0.0.4 - - [06/Sep/2026:09:12:00] &#34;GET' in diff.group(1)


def test_a_verdict_on_a_run_that_cannot_be_written_says_why(tmp_path: Path) -> None:
    """The run's folder refuses writes (its lock file made immutable, as a read-only mount
    or another user's folder would): the web verdict is a page saying why, not a bare 500
    with a traceback, and the CLI's resume is one error line; nothing is given."""
    runs = tmp_path / "runs"
    code, waiting = cli_json("run", "--scenario", "destructive", runs_dir=runs)
    assert code == 3
    run_id, call_id = waiting["run_id"], waiting["interruption"]["call_id"]
    lock = runs / run_id / "lock"
    subprocess.run(["chattr", "+i", str(lock)], check=True)
    try:
        with view_server({"RUNNER_RUNS_DIR": str(runs)}) as url, httpx.Client(base_url=url) as client:
            page = client.get(f"/runs/{run_id}")
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert csrf is not None
            given = client.post(f"/runs/{run_id}/verdict", headers={"Origin": url.rstrip("/")},
                                data={"call_id": call_id, "verdict": "approve", "reason": "", "csrf": csrf.group(1)})
            assert given.status_code == 500 and f"run {run_id} cannot be driven from" in given.text, given.text
            assert "Operation not permitted" in given.text and "Traceback" not in given.text
        proc = cli_process("resume", run_id, "--approve", call_id, runs_dir=runs)
        assert proc.returncode == 1 and f"run {run_id} cannot be driven from {runs}: " in one_error(proc.stderr)
    finally:
        subprocess.run(["chattr", "-i", str(lock)], check=True)
    assert "verdict" not in [e["type"] for e in map(json.loads, (runs / run_id / "trace.jsonl").read_text().splitlines())]


def test_a_refused_second_verdict_in_the_view_leaves_the_approved_run_queued(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    code, waiting = cli_json("run", "--scenario", "destructive", runs_dir=runs)
    assert code == 3
    run_id, call_id = waiting["run_id"], waiting["interruption"]["call_id"]
    with view_server({"RUNNER_RUNS_DIR": str(runs)}) as url, httpx.Client(base_url=url) as client:
        csrf = re.search(r'name="csrf" value="([^"]+)"', client.get(f"/runs/{run_id}").text)
        assert csrf is not None

        def post(verdict: str, call: str = call_id) -> httpx.Response:
            return client.post(f"/runs/{run_id}/verdict", headers={"Origin": url.rstrip("/")},
                               data={"call_id": call, "verdict": verdict, "reason": "", "csrf": csrf.group(1)})

        assert post("approve").status_code == 303
        for verdict, call in (("approve", call_id), ("reject", call_id), ("approve", "c9")):
            refused = post(verdict, call)
            assert refused.status_code == 400, (verdict, call, refused.text)
            assert json.loads(cli("runs", "--json", runs_dir=runs).stdout)[0]["status"] == "queued", (verdict, call)
        assert "is approved already" in post("reject").text
    events = [e["type"] for e in map(json.loads, (runs / run_id / "trace.jsonl").read_text().splitlines())]
    assert events.count("verdict") == 1
    code, done = cli_json("resume", run_id, runs_dir=runs)
    assert code == 0 and done["status"] == "completed" and done["answer"] == "Deleted access.log to free space."
