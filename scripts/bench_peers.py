"""Benchmark: runner beside other agent harnesses on the same scripted server.

Every harness runs the `plan` scenario (list_files -> read_file errors.log -> answer) against ONE
scripted provider (`runner scripted serve`, its own process, loopback, zero latency) with the
same two tools (list_files, read_file over a copy of tasks/workspace). Harnesses:

    bare             the floor: a hand-written loop on one kept-alive `httpx.AsyncClient`
    openai_sdk       a hand-written loop on `openai.AsyncOpenAI` (chat.completions.create)
    smolagents       `ToolCallingAgent` over `OpenAIServerModel` (sync; see SmolModel below)
    openai_agents    `agents.Runner.run` over `OpenAIChatCompletionsModel`, tracing disabled
    langgraph        `langgraph.prebuilt.create_react_agent` over `langchain_openai.ChatOpenAI`
    pydantic_ai      `pydantic_ai.Agent` over `OpenAIChatModel`
    runner_durable   `runner.harness.drive(state, url, runs_root, http=client)`: every
                     transition committed with its trace lines at the default durability
                     ("process": a kill of the process loses nothing), one client made once
                     as each peer makes its own
    runner_power     the same on `FileStore(runs_root, durability="power")`: what must survive an
                     OS crash or power loss is flushed before each effect (a paid model request,
                     a tool that may write)
    runner_memory    the same with runs_root=None (nothing written)
    runner_durable_shm  runner_durable with its runs folder in /dev/shm (a memory file system,
                     which a kill of the process does not touch either): the same commits
                     without the disk's metadata latency, to tell the harness's share from the
                     disk's. This VM's ext4 has no journal: a new inode is then taken only past
                     the free ones deleted in the last 5 s to 5 min, so after a clean-up nearby
                     (a test suite's, this script's own) creating a file costs ~0.1-1 ms instead
                     of ~10-20 µs, and a run creates four (its folder, lock, journal, trace);
                     `create_us` measures it before and after the timed loop

The peers are pip-installed (pinned, PEERS below) into a venv of this script's own
(default ~/.cache/runner-peers/venv, or --venv), created on first use; runner runs there from
this checkout through PYTHONPATH (its harness needs only httpx and pydantic, which the peers
bring). Three figures per harness, each from its own processes of that venv's Python:

    overhead ms/turn  one worker process runs every harness round-robin (order rotated each
                      round) after a warm-up; (median run - median bare run) / 3 turns.
                      Every run is verified: the provider's log shows exactly the three
                      requests of `plan` (turns 1, 2, 3), the tools saw exactly
                      list_files() then read_file(path="errors.log"), and the final text is
                      the scenario's. A harness that fails is reported with its error.
    import ms         median wall of `python -c "<the harness's imports>"` minus median wall of
                      `python -c "pass"`, fresh processes round-robin, bytecode cache warm.
    peak RSS MiB      ru_maxrss of a fresh process that imports the harness and does the
                      warm-up plus 10 verified runs (the interpreter included).

Prints a Markdown table with the machine, the date and the load average, and writes
runs/bench/peers.md and runs/bench/peers.json (see --out).

    python scripts/bench_peers.py [--runs 30] [--warmup 5] [--venv DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VENV = Path.home() / ".cache" / "runner-peers" / "venv"
PEERS = ["openai-agents==0.24.0", "pydantic-ai-slim[openai]==2.68.0", "langgraph==1.2.22",
         "langchain-openai==1.7.4", "smolagents[openai]==1.26.0", "openai", "httpx", "pydantic"]
"""What the venv gets (pip resolves the rest); the versions are the ones measured in the README."""
SCENARIO = "scripted/plan"
PROMPT = "Which log file mentions a timeout, and what does it say?"
FINAL_TEXT = "errors.log mentions a timeout: worker 7 timed out after 30000 ms."
EXPECTED_CALLS = [("list_files", {}), ("read_file", {"path": "errors.log"})]
EXPECTED_REQUESTS = [["plan", 1], ["plan", 2], ["plan", 3]]
TURNS = 3
API_KEY = "sk-local"
HARNESSES = ("bare", "openai_sdk", "smolagents", "openai_agents", "langgraph", "pydantic_ai",
             "runner_durable", "runner_power", "runner_memory", "runner_durable_shm")
IMPORTS = {
    "bare": "import httpx",
    "openai_sdk": "import openai",
    "smolagents": "from smolagents import ToolCallingAgent, OpenAIServerModel, tool",
    "openai_agents": "from agents import Agent, Runner, function_tool, OpenAIChatCompletionsModel, "
                     "set_tracing_disabled; from openai import AsyncOpenAI",
    "langgraph": "from langgraph.prebuilt import create_react_agent; from langchain_openai import ChatOpenAI",
    "pydantic_ai": "from pydantic_ai import Agent; from pydantic_ai.models.openai import OpenAIChatModel; "
                   "from pydantic_ai.providers.openai import OpenAIProvider",
    "runner_durable": "from runner import Endpoint, RunConfig, execute, new_run",
    "runner_power": "from runner import Endpoint, RunConfig, execute, new_run",
    "runner_memory": "from runner import Endpoint, RunConfig, execute, new_run",
    "runner_durable_shm": "from runner import Endpoint, RunConfig, execute, new_run",
}
LABELS = {
    "bare": "bare httpx loop (floor)",
    "openai_sdk": "openai SDK, hand-written loop",
    "smolagents": "smolagents",
    "openai_agents": "openai-agents",
    "langgraph": "langgraph",
    "pydantic_ai": "pydantic-ai",
    "runner_durable": "runner, every transition committed (durable against a kill)",
    "runner_power": "runner, durability power (durable against a power loss)",
    "runner_memory": "runner, run in memory",
    "runner_durable_shm": "runner, every transition committed, runs folder in /dev/shm",
}
SHM = Path("/dev/shm")
TARGETS_MS_PER_TURN = {"runner_durable": 0.5, "runner_power": 1.5}
"""Overhead per turn over the bare loop that runner's durable harnesses must stay within."""
DISTS = {"openai_sdk": "openai", "smolagents": "smolagents", "openai_agents": "openai-agents",
         "langgraph": "langgraph", "pydantic_ai": "pydantic-ai-slim", "bare": "httpx"}


# --- the worker: runs inside the peers' venv ------------------------------------------------

class Tools:
    """list_files / read_file over one workspace folder, recording each call (name, arguments).

    The output text is the same as runner's tools give (`name (N bytes)` per line; file text).
    """

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def list_files(self) -> str:
        self.calls.append(("list_files", {}))
        files = sorted(p for p in self.workspace.iterdir() if p.is_file() and not p.name.startswith("."))
        return "\n".join(f"{p.name} ({p.stat().st_size} bytes)" for p in files)

    def read_file(self, path: str) -> str:
        self.calls.append(("read_file", {"path": path}))
        target = (self.workspace / path).resolve()
        if self.workspace.resolve() not in target.parents:
            return f"permission denied: {path!r} is outside the workspace"
        return target.read_text(encoding="utf-8", errors="replace")


LIST_DOC = "List the files in the workspace with their sizes in bytes."
READ_DOC = "Read a text file from the workspace and return its contents."
TOOL_SCHEMAS = [
    {"type": "function", "function": {"name": "list_files", "description": LIST_DOC,
                                      "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "read_file", "description": READ_DOC, "parameters": {
        "type": "object", "properties": {"path": {"type": "string", "description": "A file name from list_files."}},
        "required": ["path"]}}},
]

def plain_tools(tools: Tools) -> list[Callable[..., str]]:
    """list_files and read_file as plain typed functions with docstrings: what every peer turns
    into its own tool objects (schemas from the signature and the docstring)."""

    def list_files() -> str:
        """List the files in the workspace with their sizes in bytes."""
        return tools.list_files()

    def read_file(path: str) -> str:
        """Read a text file from the workspace and return its contents.

        Args:
            path: A file name from list_files.
        """
        return tools.read_file(path)

    return [list_files, read_file]


Run = Callable[[], Awaitable[str]]
"""One run of a harness: returns the final text (tool calls land in Tools.calls)."""


async def make_bare(url: str, tools: Tools) -> Run:
    import httpx

    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {API_KEY}"})

    async def run() -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
        for _ in range(10):
            response = await http.post(url + "/chat/completions", json={
                "model": SCENARIO, "messages": messages, "tools": TOOL_SCHEMAS})
            response.raise_for_status()
            message = response.json()["choices"][0]["message"]
            messages.append(message)
            if not message.get("tool_calls"):
                return str(message.get("content") or "")
            for call in message["tool_calls"]:
                fn = call["function"]
                out = getattr(tools, fn["name"])(**json.loads(fn["arguments"] or "{}"))
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
        raise RuntimeError("no final answer in 10 turns")
    return run


async def make_openai_sdk(url: str, tools: Tools) -> Run:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key=API_KEY)

    async def run() -> str:
        messages: list[Any] = [{"role": "user", "content": PROMPT}]
        for _ in range(10):
            completion = await client.chat.completions.create(
                model=SCENARIO, messages=messages, tools=TOOL_SCHEMAS)  # type: ignore[arg-type]
            message = completion.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return message.content or ""
            for call in message.tool_calls:
                if call.type != "function":
                    raise RuntimeError(f"unexpected tool call type {call.type!r}")
                out = getattr(tools, call.function.name)(**json.loads(call.function.arguments or "{}"))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
        raise RuntimeError("no final answer in 10 turns")
    return run


async def make_smolagents(url: str, tools: Tools) -> Run:
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool
    from smolagents.models import ChatMessage, ChatMessageToolCall, ChatMessageToolCallFunction
    from smolagents.monitoring import LogLevel

    class SmolModel(OpenAIServerModel):  # type: ignore[misc]
        """smolagents' ToolCallingAgent ends a run only through its `final_answer` tool and tries
        to parse a call out of any plain reply; OpenAI-shaped models end with plain text. This
        hook (smolagents' own extension point for replies without native calls) maps a plain
        reply to final_answer(answer=text): no extra model call, no change to the loop."""

        def parse_tool_calls(self, message: ChatMessage) -> ChatMessage:
            if not message.tool_calls:
                message.tool_calls = [ChatMessageToolCall(
                    id="final", type="function",
                    function=ChatMessageToolCallFunction(name="final_answer", arguments={"answer": message.content}))]
            return super().parse_tool_calls(message)

    model = SmolModel(model_id=SCENARIO, api_base=url, api_key=API_KEY)
    agent = ToolCallingAgent(tools=[tool(f) for f in plain_tools(tools)], model=model, max_steps=6,
                             verbosity_level=LogLevel.OFF)

    async def run() -> str:
        return str(agent.run(PROMPT))  # sync: blocks this event loop, which has nothing else to do
    return run


async def make_openai_agents(url: str, tools: Tools) -> Run:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # its default exports traces to the OpenAI platform

    model = OpenAIChatCompletionsModel(model=SCENARIO, openai_client=AsyncOpenAI(base_url=url, api_key=API_KEY))
    agent = Agent(name="plan", instructions=None, tools=[function_tool(f) for f in plain_tools(tools)], model=model)

    async def run() -> str:
        result = await Runner.run(agent, PROMPT, max_turns=10)
        return str(result.final_output)
    return run


async def make_langgraph(url: str, tools: Tools) -> Run:
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    model = ChatOpenAI(model=SCENARIO, base_url=url, api_key=API_KEY)
    graph = create_react_agent(model, plain_tools(tools))

    async def run() -> str:
        out = await graph.ainvoke({"messages": [{"role": "user", "content": PROMPT}]})
        return str(out["messages"][-1].content)
    return run


async def make_pydantic_ai(url: str, tools: Tools) -> Run:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(SCENARIO, provider=OpenAIProvider(base_url=url, api_key=API_KEY))
    agent = Agent(model)
    for fn in plain_tools(tools):
        agent.tool_plain(fn)

    async def run() -> str:
        result = await agent.run(PROMPT)
        return str(result.output)
    return run


def _make_runner(durability: str | None) -> Callable[[str, Tools, Path], Awaitable[Run]]:
    """runner's harness on a FileStore at `durability` ("process", "power"), or in memory (None)."""
    async def make(url: str, tools: Tools, runs_root: Path) -> Run:
        from runner import Endpoint, RunConfig, new_run
        from runner.client import new_http_client
        from runner.harness import drive
        from runner.store import FileStore

        http = new_http_client(url)  # made once, as each peer makes its client once
        store = FileStore(runs_root, durability=durability) if durability else None  # type: ignore[arg-type]

        async def run() -> str:
            state = new_run(PROMPT, RunConfig(endpoint=Endpoint(model=SCENARIO, base_url=url)))
            state = await drive(state, url, store, http=http)
            for m in state.messages:  # runner works on its own per-run workspace copy
                for call in m.tool_calls or []:
                    tools.calls.append((call.function.name, json.loads(call.function.arguments or "{}")))
            if state.status != "completed":
                raise RuntimeError(f"runner stopped {state.status}: {state.reason}")
            return state.answer
        return run
    return make


async def _requests_after(http: Any, url: str, after: int) -> tuple[int, list[list[Any]]]:
    data = (await http.get(url.removesuffix("/v1") + "/requests", params={"after": after})).json()
    return int(data["total"]), list(data["requests"])


async def build(name: str, url: str, tools: Tools, runs_root: Path) -> Run:
    makers: dict[str, Callable[..., Awaitable[Run]]] = {
        "bare": make_bare, "openai_sdk": make_openai_sdk, "smolagents": make_smolagents,
        "openai_agents": make_openai_agents, "langgraph": make_langgraph, "pydantic_ai": make_pydantic_ai,
    }
    if name.startswith("runner_"):
        durability = {"runner_durable": "process", "runner_power": "power", "runner_durable_shm": "process"}.get(name)
        root = SHM / runs_root.parent.name / name if name == "runner_durable_shm" else runs_root / name
        return await _make_runner(durability)(url, tools, root)
    return await makers[name](url, tools)


async def worker(names: list[str], url: str, workspace: Path, runs_root: Path, runs: int,
                 warmup: int) -> dict[str, Any]:
    """Round-robin timed runs of `names`; {"times_ms": {name: [...]}, "errors": {name: text}}."""
    import httpx

    tools = Tools(workspace)
    runs_fns: dict[str, Run] = {}
    errors: dict[str, str] = {}
    for name in names:
        try:
            runs_fns[name] = await build(name, url, tools, runs_root)
        except Exception as exc:
            errors[name] = f"set-up failed: {type(exc).__name__}: {exc}"
    times: dict[str, list[float]] = {n: [] for n in runs_fns}
    async with httpx.AsyncClient() as log:
        seen, _ = await _requests_after(log, url, 0)
        for i in range(warmup + runs):
            live = [n for n in runs_fns if n not in errors]
            k = i % max(len(live), 1)
            for name in live[k:] + live[:k]:
                tools.calls.clear()
                began = time.perf_counter()
                try:
                    text = await runs_fns[name]()
                except Exception as exc:
                    errors[name] = f"run failed: {type(exc).__name__}: {str(exc)[:300]}"
                    seen, _ = await _requests_after(log, url, seen)
                    continue
                ms = (time.perf_counter() - began) * 1000
                seen, requests = await _requests_after(log, url, seen)
                problem = verify(text, tools.calls, requests)
                if problem:
                    errors[name] = f"verification failed: {problem}"
                elif i >= warmup:
                    times[name].append(ms)
    return {"times_ms": {n: t for n, t in times.items() if n not in errors}, "errors": errors}


def verify(text: str, calls: list[tuple[str, dict[str, Any]]], requests: list[list[Any]]) -> str:
    """'' if the run made exactly plan's model calls and tool calls and ended with its text."""
    if requests != EXPECTED_REQUESTS:
        return f"model calls {requests}, expected {EXPECTED_REQUESTS}"
    if calls != EXPECTED_CALLS:
        return f"tool calls {calls}, expected {EXPECTED_CALLS}"
    if text.strip() != FINAL_TEXT:
        return f"final text {text!r}, expected {FINAL_TEXT!r}"
    return ""


def worker_main(args: argparse.Namespace) -> None:
    if args.worker == "overhead":
        out = asyncio.run(worker(args.only, args.base_url, args.workspace, args.runs_root, args.runs, args.warmup))
    else:  # rss: this process only
        out = asyncio.run(worker(args.only, args.base_url, args.workspace, args.runs_root, 10, args.warmup))
        out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


# --- the driver: runs in runner's own environment ---------------------------------------------

def ensure_venv(venv: Path) -> Path:
    """The venv's python, creating the venv and installing PEERS on first use."""
    python = venv / "bin" / "python"
    marker = venv / ".runner-peers"
    if marker.exists() and marker.read_text() == json.dumps(PEERS):
        return python
    print(f"creating {venv} and installing {' '.join(PEERS)} ...", file=sys.stderr)
    venv.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PEERS], check=True)
    marker.write_text(json.dumps(PEERS))
    return python


def versions(python: Path) -> dict[str, str]:
    code = f"import importlib.metadata as m, json; print(json.dumps({{d: m.version(d) for d in {sorted(set(DISTS.values()))!r}}}))"
    return dict(json.loads(subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                                          check=True).stdout))


def peer_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(REPO)  # runner from this checkout
    env["OPENAI_API_KEY"] = API_KEY
    env["OTEL_SDK_DISABLED"] = "true"
    env["LANGCHAIN_TRACING_V2"] = "false"
    return env


def run_worker(python: Path, mode: str, names: list[str], url: str, work: Path, runs: int, warmup: int,
               ) -> dict[str, Any]:
    cmd = [str(python), str(Path(__file__).resolve()), "--worker", mode, "--base-url", url,
           "--workspace", str(work / "workspace"), "--runs-root", str(work / "runs"),
           "--runs", str(runs), "--warmup", str(warmup), "--only", *names]
    done = subprocess.run(cmd, env=peer_env(), cwd=work, capture_output=True, text=True)
    if done.returncode != 0:
        return {"times_ms": {}, "errors": {n: f"worker exited {done.returncode}: {done.stderr[-300:]}" for n in names}}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def import_times(python: Path, names: list[str], rounds: int, cwd: Path) -> dict[str, float]:
    """Median wall of `python -c IMPORTS[name]` minus median of `python -c pass`, ms."""
    cases = {"pass": "pass", **{n: IMPORTS[n] for n in names}}
    walls: dict[str, list[float]] = {c: [] for c in cases}
    order = list(cases)
    for i in range(rounds + 2):
        k = i % len(order)
        for case in order[k:] + order[:k]:
            began = time.perf_counter()
            subprocess.run([str(python), "-c", cases[case]], env=peer_env(), cwd=cwd, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if i >= 2:
                walls[case].append((time.perf_counter() - began) * 1000)
    base = statistics.median(walls["pass"])
    return {n: statistics.median(walls[n]) - base for n in names}


def create_us(folder: Path, files: int = 40) -> float:
    """Median µs to create an empty file in a new subfolder of `folder`, with a pause of 1 ms
    before each (as between a run's steps). A new run creates a folder and three files. On this
    VM's ext4, which has no journal, a new inode is found only past those freed in the last
    seconds to minutes, so the cost moves from ~10 µs to ~1 ms with what was deleted nearby
    (a test suite's or a benchmark's clean-up); the files are left for the clean-up at the end."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = Path(tempfile.mkdtemp(prefix="create-probe-", dir=folder))
    times = []
    for i in range(files):
        time.sleep(0.001)
        began = time.perf_counter_ns()
        os.close(os.open(probe / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        times.append((time.perf_counter_ns() - began) / 1000)
    return statistics.median(times)


def measure(python: Path, names: list[str], runs: int, warmup: int, import_rounds: int,
            scratch: Path) -> dict[str, Any]:
    from runner.harness import workspace_template
    from runner.scripted import scripted_provider

    scratch.mkdir(parents=True, exist_ok=True)
    # Under the reports' folder, as in the other benchmarks: on this VM a file created under
    # /tmp (a folder tests create and delete in all day) took 0.2-0.6 ms, against ~8 us anywhere
    # else on the same disk.
    work = Path(tempfile.mkdtemp(prefix="runner-peers-", dir=scratch))
    try:
        shutil.copytree(workspace_template(), work / "workspace")
        shm = SHM / work.name
        shm.mkdir(parents=True, exist_ok=True)
        with scripted_provider() as url:
            create = {"before": [create_us(work / "runs"), create_us(shm)]}
            load_before = os.getloadavg()
            timed = run_worker(python, "overhead", names, url, work, runs, warmup)
            load_after = os.getloadavg()
            create["after"] = [create_us(work / "runs"), create_us(shm)]
            rss: dict[str, Any] = {}
            for name in names:
                out = run_worker(python, "rss", [name], url, work, 10, warmup)
                rss[name] = out.get("rss_mib") if not out["errors"] else None
        imports = import_times(python, names, import_rounds, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(SHM / work.name, ignore_errors=True)
    return {"times_ms": timed["times_ms"], "errors": timed["errors"], "rss_mib": rss, "import_ms": imports,
            "loadavg_before_after": [load_before[0], load_after[0]], "create_us": create}


def render(r: dict[str, Any]) -> str:
    times, errors = r["times_ms"], r["errors"]
    floor = statistics.median(times["bare"]) if "bare" in times else None
    lines = [
        "# runner beside other agent harnesses", "",
        f"- {r['date']}; machine: {r['machine']}; load average (1 min) before / after the timed loop: "
        f"{r['loadavg_before_after'][0]:.2f} / {r['loadavg_before_after'][1]:.2f}",
        f"- workload: `{SCENARIO}` (3 model calls, 2 tool calls) against one scripted provider process on "
        f"loopback, zero latency; {r['runs']} timed rounds after {r['warmup']} warm-up rounds, round-robin in one "
        "process, every run verified (model calls, tool calls, final text)",
        "- overhead per turn = (median run − median bare run) / 3; import = `python -c IMPORTS` − `python -c pass`; "
        "peak RSS = a fresh process importing the harness and doing the warm-up + 10 runs",
        f"- creating a file in the runs folder's disk (a new run creates a folder and three files), median of 40 "
        f"after a 1 ms pause: {r['create_us']['before'][0]:.0f} µs before the timed loop, "
        f"{r['create_us']['after'][0]:.0f} µs after (in /dev/shm: {r['create_us']['before'][1]:.0f} and "
        f"{r['create_us']['after'][1]:.0f} µs)", "",
        "| harness | version | overhead ms/turn | median run ms | import ms | peak RSS MiB |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name in r["names"]:
        version = r["versions"].get(DISTS.get(name, ""), "this checkout" if name.startswith("runner") else "")
        imp = r["import_ms"].get(name)
        rss = r["rss_mib"].get(name)
        if name in times and floor is not None:
            med = statistics.median(times[name])
            over = f"{(med - floor) / TURNS:.2f}"
            run = f"{med:.2f}"
        else:
            over = run = "failed: " + errors.get(name, "no runs").replace("|", "/")
        lines.append(f"| {LABELS[name]} | {version} | {over} | {run} | "
                     f"{'' if imp is None else f'{imp:.0f}'} | {'' if rss is None else f'{rss:.0f}'} |")
    checks = [f"- {LABELS[name]}: {(statistics.median(times[name]) - floor) / TURNS:.2f} ms/turn over the bare loop "
              f"(target <= {limit} ms/turn: "
              f"{'meets' if (statistics.median(times[name]) - floor) / TURNS <= limit else 'MISSES'})"
              for name, limit in TARGETS_MS_PER_TURN.items() if name in times and floor is not None]
    if checks:
        lines += ["", *checks]
    return "\n".join(lines) + "\n"


def machine() -> str:
    """CPU model, core count, OS and Python, for the table's caption."""
    cpuinfo = Path("/proc/cpuinfo")
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if cpuinfo.exists() else platform.processor()
    return (f"{model or platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    parser.add_argument("--import-rounds", type=int, default=10)
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="the peers' venv (created if missing)")
    parser.add_argument("--only", nargs="+", choices=HARNESSES, default=list(HARNESSES))
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench")
    # worker mode (internal): run inside the peers' venv
    parser.add_argument("--worker", choices=["overhead", "rss"], help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--workspace", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--runs-root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args)
        return
    names = ["bare", *[n for n in args.only if n != "bare"]]  # the floor is always measured
    python = ensure_venv(args.venv)
    report = measure(python, names, args.runs, args.warmup, args.import_rounds, args.out)
    report.update(names=names, runs=args.runs, warmup=args.warmup, versions=versions(python),
                  date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                  machine=machine())
    text = render(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers.md").write_text(text, encoding="utf-8")
    (args.out / "peers.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
