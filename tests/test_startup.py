"""Start-up and the scripted provider's serving path: what loads when, the bare
ASGI app's routes, the provider started with an inherited socket, and the cache of parsed
o200k tables. Speeds live in scripts/bench_*.py; these tests check behaviour and order."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from runner.scripted import ScriptedServer, scripted_provider

PLAN_BODY = {"model": "scripted/plan", "messages": [{"role": "user", "content": "Which log mentions a timeout?"}]}


def _loaded_after(code: str, env: dict[str, str] | None = None) -> set[str]:
    """Names of real (executed) modules in a fresh interpreter after `code` ran."""
    probe = (f"{code}\nimport sys, json\n"
             "print(json.dumps([n for n, m in sys.modules.items() if type(m).__name__ != '_LazyModule']))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})})
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_help_loads_no_models_no_http_no_event_loop() -> None:
    loaded = _loaded_after("import sys\nsys.argv = ['runner', '--help']\nfrom runner.cli import main\n"
                           "try:\n    main()\nexcept SystemExit:\n    pass")
    assert "typer" in loaded
    assert not {"pydantic", "httpx", "runner.state", "runner.store", "asyncio.events", "rich"} & loaded


def test_library_import_leaves_httpx_until_a_client_is_made() -> None:
    loaded = _loaded_after("from runner import run, RunState, RunConfig, execute")
    assert {"runner.loop", "runner.harness", "pydantic"} <= loaded
    assert not {"httpx", "tiktoken", "uvicorn", "fastapi", "typer"} & loaded


def test_requests_log_reports_each_answered_call_from_an_index(provider_server: ScriptedServer) -> None:
    root = provider_server.base_url.removesuffix("/v1")
    before = httpx.get(root + "/requests").json()["total"]
    with httpx.Client(base_url=provider_server.base_url) as http:
        first = http.post("/chat/completions", json=PLAN_BODY).json()
        call = first["choices"][0]["message"]
        http.post("/chat/completions", json={**PLAN_BODY, "messages": [
            *PLAN_BODY["messages"], call, {"role": "tool", "tool_call_id": "c1", "content": "errors.log (10 bytes)"}]})
    log = httpx.get(root + "/requests", params={"after": before}).json()
    assert log["requests"] == [["plan", 1], ["plan", 2]]
    assert log["total"] == before + 2


def test_routes_answer_like_the_framework_did(provider_server: ScriptedServer) -> None:
    url = provider_server.base_url
    assert httpx.get(url.removesuffix("/v1") + "/health").json() == {"status": "ok"}
    assert "scripted/plan" in [m["id"] for m in httpx.get(url + "/models").json()["data"]]
    assert httpx.get(url + "/chat/completions").status_code == 405
    assert httpx.get(url + "/nowhere").status_code == 404
    bad = httpx.post(url + "/chat/completions", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    reply = httpx.post(url + "/chat/completions", json=PLAN_BODY)
    assert reply.headers["content-type"] == "application/json"
    assert reply.json()["usage"]["prompt_tokens"] > 0


def test_provider_child_serves_on_the_inherited_socket_then_stops() -> None:
    with scripted_provider() as url:
        # Yielded before the child has loaded: the first request queues in the kernel.
        reply = httpx.post(url + "/chat/completions", json=PLAN_BODY, timeout=60)
        assert reply.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "list_files"
        port = int(url.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # closed with the child


def test_parsed_tables_cache_gives_the_same_counts_and_survives_corruption(tmp_path: Path) -> None:
    code = ("from runner import tokens\n"
            "print(tokens.count('worker 7 timed out after 30000 ms; naïve café 東京'), tokens.ranks_cache_path())")
    env = {**os.environ, "RUNNER_CACHE_DIR": str(tmp_path)}

    def count() -> tuple[str, Path]:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        n, path = out.stdout.split()
        return n, Path(path)

    parsed, cache = count()  # no cache: tiktoken parses the verified file, the tables are saved
    assert cache.parent == tmp_path and cache.stat().st_size > 1_000_000
    assert count()[0] == parsed  # loaded from the cache
    cache.write_bytes(b"\x00garbage")
    assert count()[0] == parsed  # unreadable cache: parsed again, and rewritten
    assert cache.stat().st_size > 1_000_000


def test_cli_help_default_turn_cap_is_the_state_default() -> None:
    from runner import cli, state

    assert cli.DEFAULT_MAX_TURNS == state.DEFAULT_MAX_TURNS
