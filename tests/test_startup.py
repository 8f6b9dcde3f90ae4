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
from typing import Any

import httpx
import pytest

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
    assert not {"runner.store", "runner.client", "runner.catalog", "runner.config", "runner.endpoints"} & loaded


def test_library_import_defines_only_the_run_state_models() -> None:
    """The trace's event models, the tools, the streaming meter, json, asyncio and pydantic's
    TypeAdapter load when a run needs them, not with the names a script imports."""
    loaded = _loaded_after("from runner import run, RunState, RunConfig, execute")
    assert not {"runner.trace", "runner.tools", "runner.streaming", "asyncio", "pydantic.type_adapter",
                "importlib.metadata"} & loaded
    probe = "from runner import run, RunState, RunConfig, execute\nimport sys\nprint('json' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout == "False\n"
    assert {m for m in loaded if m.startswith("runner.")} == {
        "runner.state", "runner.loop", "runner.harness", "runner.errors", "runner.cancel", "runner.replies",
        "runner.steering", *(f"runner.steering.{m}" for m in ("checks", "prompt", "questions", "registry", "reviews",
                                                              "texts", "turns", "view"))}


def test_a_public_name_loads_with_the_collector_paused_and_left_as_it_was() -> None:
    """A public name's modules load with the cyclic collector paused (what an import makes
    lives on: modules, classes; unpaused, it runs ~38 times), and it is on again afterwards
    (one collection may follow at once), or still off when the program had switched it off."""
    probe = ("import gc, runner\n{before}\nlog, on = [], [False]\n"
             "gc.callbacks.append(lambda phase, info: on[0] and phase == 'start' and log.append(info))\n"
             "on[0] = True\nfrom runner import run\non[0] = False\n"
             "import sys\nprint(len(log), gc.isenabled(), 'runner.state' in sys.modules)")
    for before, enabled in (("", "True"), ("gc.disable()", "False")):
        out = subprocess.run([sys.executable, "-c", probe.format(before=before)], capture_output=True, text=True,
                             check=True).stdout.split()
        assert int(out[0]) <= (1 if enabled == "True" else 0) and out[1:] == [enabled, "True"]


def test_a_scenario_run_loads_no_network_stack(tmp_path: Path) -> None:
    """The in-process provider's client has no network transport: no httpcore, h11, h2 or anyio."""
    loaded = _loaded_after(f"import sys\nsys.argv = ['runner', 'run', '--scenario', 'plan', '--runs-dir', "
                           f"{str(tmp_path / 'runs')!r}]\nfrom runner.cli import main\n"
                           "try:\n    main()\nexcept SystemExit:\n    pass")
    assert {"httpx", "runner.loop", "runner.store"} <= loaded
    assert not {"httpcore", "h11", "h2", "anyio"} & loaded


def test_a_scenario_run_builds_no_option_adapter_and_reads_no_package_metadata(tmp_path: Path) -> None:
    """typer's per-option pydantic TypeAdapters are left unbuilt (the options given are text
    or absent), and pydantic's plugin scan, which imports importlib.metadata, is skipped."""
    loaded = _loaded_after(f"import sys\nsys.argv = ['runner', 'run', '--scenario', 'plan', '--runs-dir', "
                           f"{str(tmp_path / 'runs')!r}, '--tool-errors', 'text']\n"
                           "from runner.cli import main\ntry:\n    main()\nexcept SystemExit as exc:\n"
                           "    assert exc.code == 0, exc.code")
    assert {"runner.loop", "runner.trace", "pydantic.main"} <= loaded
    assert not {"typer._adapters", "importlib.metadata"} & loaded


def _first_drive(tmp_path: Path, warm: bool) -> dict[str, Any]:
    """A fresh interpreter that opens the in-process scripted provider, warms up (or not), then
    drives one scenario run into a runs directory: the runner modules that the drive imported
    and the runner models it built, and the run's status."""
    probe = f"""
import asyncio, json, sys
from pathlib import Path
from pydantic import BaseModel
from runner.harness import drive, warm_up
from runner.scripted import scripted_provider
from runner.state import RunConfig, new_run

def built():
    seen, models = set(), [BaseModel]
    while models:
        model = models.pop()
        models += model.__subclasses__()
        if model.__module__.startswith("runner.") and model.__pydantic_complete__:
            seen.add(model.__module__ + "." + model.__qualname__)
    return seen

with scripted_provider(in_process=True) as url:
    if {warm}:
        warm_up()
    state = new_run("Which log mentions a timeout?", RunConfig(model="scripted/plan"))
    modules, models = set(sys.modules), built()
    asyncio.run(drive(state, url, Path({str(tmp_path / "runs")!r})))
print(json.dumps({{"modules": sorted(m for m in set(sys.modules) - modules if m.startswith(("runner.", "httpx"))),
                  "models": sorted(built() - models), "status": state.status}}))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def test_a_warmed_up_process_builds_nothing_on_its_first_drive(tmp_path: Path) -> None:
    """`warm_up` (what a Ray actor runs when it starts) imports the modules and builds the
    pydantic models that a process's first drive would otherwise build while it runs."""
    cold = _first_drive(tmp_path / "cold", warm=False)
    assert cold["status"] == "completed" and {"runner.tools", "httpx"} <= set(cold["modules"]) and cold["models"]
    warm = _first_drive(tmp_path / "warm", warm=True)
    assert warm == {"modules": [], "models": [], "status": "completed"}


def test_plugins_turned_on_load_through_the_real_loader() -> None:
    """With `PYDANTIC_DISABLE_PLUGINS=` (empty) the stand-in is not installed; turned on after
    it was, the real loader answers."""
    code = ("import os, sys\nfrom runner.command import prepare_process\nprepare_process()\n"
            "from pydantic import TypeAdapter\nTypeAdapter(int)\nbefore = 'importlib.metadata' in sys.modules\n"
            "os.environ['PYDANTIC_DISABLE_PLUGINS'] = ''\nTypeAdapter(str)\n"
            "print(before, 'importlib.metadata' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert off.stdout.split() == ["False", "True"]
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                        env={**env, "PYDANTIC_DISABLE_PLUGINS": ""})
    assert on.stdout.split() == ["True", "True"]


def test_option_values_coerce_as_typer_coerces_them(tmp_path: Path) -> None:
    """Every option of every command, given nothing, its default, or text: `Coercion` gives
    what typer's own coercion (a pydantic TypeAdapter) gives, or the same error; save text
    that is no whole number for a whole-number option, which it refuses in its own words
    (typer's lax adapter takes "3.0"), text that is no number for a number option (refused in
    its own words, not pydantic's), and a number out of the option's bounds, which it
    refuses in click's words ("0 is not in the range x>=1."), not pydantic's."""
    import typer.main

    build_runtime_param = pytest.importorskip("typer._coercion").build_runtime_param  # typer's own, as it runs
    from runner.cli import app
    from runner.command import Coercion

    group: Any = typer.main.get_command(app)
    (tmp_path / "a-file").write_text("x")
    checked = 0
    for name, command in group.commands.items():
        ctx = command.make_context(name, [], resilient_parsing=True)
        for param in (p for p in command.get_params(ctx) if hasattr(p, "type_descriptor")):
            many = param.multiple or param.nargs == -1
            values = [None, param.default, str(tmp_path), str(tmp_path / "a-file"), "3", "-1", "0.5", "3.0", "plan",
                      "md", -1, 70_000, 0.0005, True]
            for value in values:
                value = (value,) if many and isinstance(value, str) else value
                ours, theirs = _outcome(Coercion(param), param, ctx, value), _outcome(
                    build_runtime_param(param.type_descriptor), param, ctx, value)
                if Coercion(param)._kind() is int and value in (str(tmp_path), str(tmp_path / "a-file"), "0.5", "3.0",
                                                                "plan", "md"):
                    assert ours == ("BadParameter", f"{value!r} is not a whole number"), (name, param.name, value)
                elif Coercion(param)._kind() is float and value in (str(tmp_path), str(tmp_path / "a-file"), "plan",
                                                                    "md"):
                    assert theirs[0] == "BadParameter" and ours == ("BadParameter", f"{value!r} is not a number"), (
                        name, param.name, value)
                elif (theirs[0] == "BadParameter" and " than or equal to " in str(theirs[1])
                      and not isinstance(value, bool)):  # out of bounds: said in click's words, not pydantic's
                    assert ours[0] == "BadParameter" and f"{value} is not in the range " in str(ours[1]), (
                        name, param.name, value, ours)
                else:
                    assert ours == theirs, (name, param.name, value)
                checked += 1
    assert checked > 400


def _outcome(coercion: object, param: object, ctx: object, value: object) -> tuple[str, object]:
    try:
        return "value", coercion.coerce(value, param, ctx)  # type: ignore[attr-defined]
    except Exception as exc:
        return type(exc).__name__, str(exc)


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
            "print(len(tokens.encoding().encode('worker 7 timed out after 30000 ms; naïve café 東京')),"
            " tokens.ranks_cache_path())")
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


def test_counts_are_recorded_and_read_back_without_the_tokenizer(tmp_path: Path) -> None:
    code = ("import sys\nfrom runner import tokens\n"
            "print(tokens.count(sys.argv[1]), 'tiktoken' in sys.modules)")
    env = {**os.environ, "RUNNER_CACHE_DIR": str(tmp_path)}

    def count(text: str) -> tuple[int, bool]:
        out = subprocess.run([sys.executable, "-c", code, text], capture_output=True, text=True, check=True, env=env)
        n, loaded = out.stdout.split()
        return int(n), loaded == "True"

    text = "worker 7 timed out after 30000 ms; naïve café 東京"
    first = count(text)
    assert first[1] and first[0] > 10  # counted with the encoding
    assert count(text) == (first[0], False)  # read back: the encoding never loaded
    from runner import tokens

    path = tmp_path / tokens.counts_path().name
    path.write_text(path.read_text() + "garbage line\n" + "0" * 32 + " x\n")
    assert count(text) == (first[0], False)  # malformed lines are skipped
    assert count(text + " ")[1]  # another text: counted
    assert len(path.read_text().splitlines()) == 4


def test_the_counts_file_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runner import tokens

    monkeypatch.setenv("RUNNER_CACHE_DIR", str(tmp_path))
    path = tokens.counts_path()
    n = tokens.COUNTS_MAX_ENTRIES + 10
    path.write_text("".join(f"{i:032x} {i}\n" for i in range(n)))
    counts = tokens._read_counts()
    assert len(counts) == tokens.COUNTS_MAX_ENTRIES // 2 and counts[f"{n - 1:032x}"] == n - 1
    assert len(path.read_text().splitlines()) == tokens.COUNTS_MAX_ENTRIES // 2


def test_cli_help_default_turn_cap_is_the_state_default() -> None:
    from runner import request, state

    assert request.DEFAULT_MAX_TURNS == state.DEFAULT_MAX_TURNS


def test_a_scenario_run_is_answered_in_process_like_the_served_provider(tmp_path: Path, provider: str) -> None:
    from runner.trace import read_trace
    from tests.conftest import cli_json, drive, scripted_run

    runs = tmp_path / "runs"
    code, out = cli_json("run", "--scenario", "plan", "--fault", "500@2", "--max-retries", "1", runs_dir=runs)
    assert code == 0 and out["status"] == "completed"
    events = read_trace(runs / out["run_id"] / "trace.jsonl")
    started = next(e for e in events if e.type == "run_started")
    assert started.endpoint is not None
    assert started.endpoint.startswith("http://scripted-") and started.endpoint.endswith(".in-process/v1")
    assert [len(e.retries or []) for e in events if e.type == "turn"] == [0, 1, 0]  # the fault fired in process
    served = drive(scripted_run("plan"), provider, None)
    assert out["per_turn_prompt_tokens"] == [t.prompt_tokens for t in served.per_turn]
    assert out["completion_tokens"] == served.completion_tokens and out["answer"] == served.answer


def test_a_stopped_in_process_provider_is_unreachable() -> None:
    import asyncio

    from runner.client import ChatClient
    from runner.errors import ProviderError
    from runner.scripted import InProcessProvider
    from runner.state import Message

    provider = InProcessProvider()
    with provider as url:
        pass

    async def ask() -> None:
        async with ChatClient(url, max_retries=0) as client:
            await client.chat("scripted/plan", [Message(role="user", content="hi")])

    with pytest.raises(ProviderError, match="no in-process provider answers"):
        asyncio.run(ask())


def test_resume_keeps_the_latency_the_run_was_started_with(tmp_path: Path) -> None:
    from tests.conftest import cli_json

    runs = tmp_path / "runs"
    code, out = cli_json("run", "--scenario", "plan", "--latency-ms", "300", "--max-turns", "1", runs_dir=runs)
    assert code == 3 and out["turns"] == 1
    code, out = cli_json("resume", out["run_id"], "--max-turns", "5", runs_dir=runs)
    assert code == 0 and out["status"] == "completed"
    from runner.store import FileStore

    state = FileStore(runs).load(out["run_id"])
    assert [t.provider_ms >= 300 for t in state.per_turn] == [True, True, True]
    code, out = cli_json("run", "--scenario", "plan", "--max-turns", "1", runs_dir=runs)
    code, out = cli_json("resume", out["run_id"], "--max-turns", "5", "--latency-ms", "200", runs_dir=runs)
    state = FileStore(runs).load(out["run_id"])
    assert [t.provider_ms >= 200 for t in state.per_turn] == [False, True, True]


def test_a_command_line_builds_only_the_command_it_names() -> None:
    """typer builds the options of every command it holds: while `runner run ...` runs, the app
    holds `run` alone; a group, an unknown name or no name leave every command in place."""
    import typer.main

    from runner.cli import app
    from runner.command import building_only_the_command_in

    every = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert {"run", "resume", "runs", "scripted", "config"} <= every
    with building_only_the_command_in(app, ["run", "--scenario", "plan"]):
        assert set(typer.main.get_command(app).commands) == {"run"}  # type: ignore[attr-defined]
    for args in (["scripted", "serve"], ["rn"], ["--help"], []):
        with building_only_the_command_in(app, args):
            assert set(typer.main.get_command(app).commands) == every, args  # type: ignore[attr-defined]
    assert set(typer.main.get_command(app).commands) == every  # type: ignore[attr-defined]
