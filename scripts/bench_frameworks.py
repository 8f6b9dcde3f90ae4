"""Benchmark: agent frameworks on `runner serve`, beside llama-cpp-python's own server, same GGUF.

Five clients, each given the same small function tools and asked the same questions:

    openai_agents  `agents.Runner.run` over `OpenAIChatCompletionsModel` (tracing off)
    pydantic_ai    `pydantic_ai.Agent` over `OpenAIChatModel`
    langchain      `langchain.agents.create_agent` over `langchain_openai.ChatOpenAI`
    smolagents     `ToolCallingAgent` over `OpenAIServerModel` (a plain reply is its final answer,
                   through smolagents' own `parse_tool_calls` hook, as in bench_peers.py)
    openai_sdk     a hand-written loop on `openai.OpenAI` (chat.completions.create)

Every client asks for temperature 0 and sets no tool_choice and no parallel_tool_calls: what a
new user's agent sends. Each task offers three tools and is answered by one or two calls; the
answer is right when it matches the task's patterns (values only the tools know). `TASKS[:4]`
are the dev tasks (the only ones looked at while building the server's steering); the rest are
the test tasks.

Servers, on the same GGUF (default qwen2.5-coder-1.5b-instruct), one after the other:

    runner       `runner serve` (runner.local.LocalServer) with --steer (default: default), its
                 request log kept: every reply's kind (calls, text, empty) is counted from it
    llama-cpp-python  `python -m llama_cpp.server --chat_format chatml-function-calling`, from
                 the main venv's llama_cpp with its one missing server extra (starlette-context)
                 installed apart, in a --target folder (`LLAMA_SERVER_EXTRAS`)

The frameworks run in a venv of their own (default ~/.cache/runner-frameworks/venv, created on
first use from the pins of pyproject's `frameworks` extra), in a worker process of this script
per server. Between the worker and the server sits a counting proxy: requests per task, and
assistant replies with neither text nor a call ("empty"), for both servers alike.

Prints a Markdown table per server with the load average before and after, and writes it
into docs/serve.md between the `RESULTS_BEGIN`/`RESULTS_END` markers (--no-docs: print only).

    python scripts/bench_frameworks.py [--model NAME] [--steer off|default|on] [--only FW ...]
        [--tasks dev|test|all] [--servers runner llama-cpp-python] [--url NAME=URL ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VENV = Path.home() / ".cache" / "runner-frameworks" / "venv"
LLAMA_SERVER_EXTRAS = ["starlette-context==0.5.1"]
"""What llama_cpp.server needs beyond the main venv (installed with --no-deps into a folder of its own)."""
FRAMEWORKS = ("openai_agents", "pydantic_ai", "langchain", "smolagents", "openai_sdk")
DISTS = {"openai_agents": "openai-agents", "pydantic_ai": "pydantic-ai-slim", "langchain": "langchain",
         "smolagents": "smolagents", "openai_sdk": "openai"}
API_KEY = "sk-local"
INSTRUCTIONS = "You are a helpful assistant. Use the tools to answer the user's question."
MAX_MODEL_REQUESTS = 8
"""Each framework's own limit on model requests per task (turns, steps, request limit)."""
TASK_TIMEOUT_S = 600.0
RESULTS_BEGIN = "<!-- bench_frameworks: begin -->"
RESULTS_END = "<!-- bench_frameworks: end -->"


# --- the tools: values only they know ---------------------------------------------------------

WEATHER = {"trondheim": "7 °C, fog", "valparaiso": "19 °C, sunny", "nagoya": "12 °C, drizzle"}
ORDERS = {"QX-318": "out for delivery with Polar Post, expected today",
          "BM-7745": "held at customs in Rotterdam since 3 March",
          "TT-0051": "delivered on 2 March, signed for by R. Okafor"}
STOCK = {"LAMP-22": "14 units in the Leeds warehouse", "DESK-9": "0 units; next delivery 12 May"}
FLIGHTS = {"KL1193": "boarding at gate D7, departs 14:05", "SK4410": "delayed 40 minutes, gate B12"}
PRICES = {"NRDQ": "41.27 USD", "VLTX": "3.88 USD"}
RATES = {("CHF", "JPY"): 171.35, ("EUR", "NOK"): 11.62}
SHIPPING_EUR_PER_KG = {"iceland": 7.40, "portugal": 2.10}
CALLS: list[str] = []
"""The tool calls of the task in progress, by name (the worker empties it per task)."""


def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: the city's name, e.g. "Oslo".
    """
    CALLS.append("get_weather")
    key = city.lower().replace("í", "i").strip()
    return f"{city}: {WEATHER[key]}" if key in WEATHER else f"No weather data for {city!r}."


def fahrenheit_to_celsius(fahrenheit: float) -> str:
    """Convert a temperature from degrees Fahrenheit to degrees Celsius.

    Args:
        fahrenheit: the temperature in °F.
    """
    CALLS.append("fahrenheit_to_celsius")
    return f"{float(fahrenheit)} °F = {(float(fahrenheit) - 32) * 5 / 9:.1f} °C"


def celsius_to_fahrenheit(celsius: float) -> str:
    """Convert a temperature from degrees Celsius to degrees Fahrenheit.

    Args:
        celsius: the temperature in °C.
    """
    CALLS.append("celsius_to_fahrenheit")
    return f"{float(celsius)} °C = {float(celsius) * 9 / 5 + 32:.1f} °F"


def order_status(order_id: str) -> str:
    """Shipping status of a customer's order.

    Args:
        order_id: the order number, e.g. "AB-1234".
    """
    CALLS.append("order_status")
    key = order_id.strip().upper()
    return f"Order {key}: {ORDERS[key]}" if key in ORDERS else f"No order {order_id!r} found."


def stock_level(sku: str) -> str:
    """How many units of a product are in stock.

    Args:
        sku: the product's stock-keeping unit, e.g. "CHAIR-1".
    """
    CALLS.append("stock_level")
    key = sku.strip().upper()
    return f"{key}: {STOCK[key]}" if key in STOCK else f"No product {sku!r}."


def kilometres_to_miles(kilometres: float) -> str:
    """Convert a distance from kilometres to miles.

    Args:
        kilometres: the distance in km.
    """
    CALLS.append("kilometres_to_miles")
    return f"{float(kilometres)} km = {float(kilometres) / 1.609344:.1f} miles"


def share_price(ticker: str) -> str:
    """The latest price of one share of a listed company.

    Args:
        ticker: the stock ticker symbol, e.g. "ACME".
    """
    CALLS.append("share_price")
    key = ticker.strip().upper()
    return f"{key}: {PRICES[key]}" if key in PRICES else f"Unknown ticker {ticker!r}."


def flight_status(flight: str) -> str:
    """Departure status of a flight today.

    Args:
        flight: the flight number, e.g. "BA123".
    """
    CALLS.append("flight_status")
    key = flight.replace(" ", "").upper()
    return f"Flight {key}: {FLIGHTS[key]}" if key in FLIGHTS else f"No flight {flight!r} today."


def exchange_rate(from_currency: str, to_currency: str) -> str:
    """Today's exchange rate between two currencies.

    Args:
        from_currency: ISO code of the currency to convert from, e.g. "USD".
        to_currency: ISO code of the currency to convert to, e.g. "GBP".
    """
    CALLS.append("exchange_rate")
    pair = (from_currency.strip().upper(), to_currency.strip().upper())
    return f"1 {pair[0]} = {RATES[pair]} {pair[1]}" if pair in RATES else f"No rate for {pair[0]}/{pair[1]}."


def shipping_cost(weight_kg: float, country: str) -> str:
    """Cost of shipping a parcel abroad.

    Args:
        weight_kg: the parcel's weight in kilograms.
        country: the destination country.
    """
    CALLS.append("shipping_cost")
    key = country.strip().lower()
    if key not in SHIPPING_EUR_PER_KG:
        return f"No shipping to {country!r}."
    return f"{float(weight_kg)} kg to {country}: {float(weight_kg) * SHIPPING_EUR_PER_KG[key]:.2f} EUR"


@dataclass(frozen=True)
class Task:
    """One question, the three tools offered with it, and the patterns a right answer matches (all)."""

    name: str
    question: str
    tools: tuple[Callable[..., str], ...]
    patterns: tuple[str, ...]

    def right(self, answer: str) -> bool:
        return all(re.search(p, answer, re.IGNORECASE) for p in self.patterns)


TRAVEL = (get_weather, fahrenheit_to_celsius, flight_status)
SHOP = (order_status, stock_level, shipping_cost)
MARKET = (share_price, exchange_rate, kilometres_to_miles)
TASKS = [
    # dev
    Task("weather", "What is the weather like in Trondheim right now?", TRAVEL, (r"\bfog",)),
    Task("order", "What's the status of my order QX-318?", SHOP, (r"Polar Post|out for delivery",)),
    Task("f_to_c", "Convert 77.9 degrees Fahrenheit to Celsius.", TRAVEL, (r"25[.,]5",)),
    Task("stock_and_order", "How many LAMP-22 units do you have in stock, and where is order BM-7745?", SHOP,
         (r"\b14\b", r"customs|Rotterdam")),
    # test
    Task("restock", "Is the DESK-9 desk in stock? If not, when does it come back?", SHOP, (r"12 May|May 12",)),
    Task("km_to_miles", "How many miles is 42.195 km?", MARKET, (r"26[.,]2",)),
    Task("share", "What does one NRDQ share cost right now?", MARKET, (r"41[.,]27",)),
    Task("flight", "Is flight KL1193 boarding yet, and from which gate?", TRAVEL, (r"\bD7\b",)),
    Task("rate", "How many Japanese yen do I get for one Swiss franc today?", MARKET, (r"171[.,]35",)),
    Task("signed", "Who signed for order TT-0051?", SHOP, (r"Okafor",)),
    Task("shipping", "What does it cost to ship a 3.5 kg parcel to Iceland?", SHOP, (r"25[.,]90?\b",)),
    Task("weather_f", "What is the temperature in Nagoya now, in degrees Fahrenheit?",
         (get_weather, celsius_to_fahrenheit, flight_status), (r"53[.,]6",)),
]
DEV = 4


# --- the frameworks (worker side: the frameworks' venv) ---------------------------------------

def make_openai_agents(url: str, model: str) -> Callable[[Task], str]:
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # its default exports traces to the OpenAI platform
    chat = OpenAIChatCompletionsModel(model=model, openai_client=AsyncOpenAI(base_url=url, api_key=API_KEY))

    def run(task: Task) -> str:
        agent = Agent(name="assistant", instructions=INSTRUCTIONS, model=chat,
                      tools=[function_tool(f) for f in task.tools], model_settings=ModelSettings(temperature=0))
        return str(Runner.run_sync(agent, task.question, max_turns=MAX_MODEL_REQUESTS).final_output)
    return run


def make_pydantic_ai(url: str, model: str) -> Callable[[Task], str]:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    chat = OpenAIChatModel(model, provider=OpenAIProvider(base_url=url, api_key=API_KEY))

    def run(task: Task) -> str:
        agent = Agent(chat, instructions=INSTRUCTIONS, tools=list(task.tools), model_settings={"temperature": 0})
        limits = UsageLimits(request_limit=MAX_MODEL_REQUESTS)
        return str(agent.run_sync(task.question, usage_limits=limits).output)
    return run


def make_langchain(url: str, model: str) -> Callable[[Task], str]:
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model=model, base_url=url, api_key=API_KEY, temperature=0)

    def run(task: Task) -> str:
        agent = create_agent(chat, tools=list(task.tools), system_prompt=INSTRUCTIONS)
        out = agent.invoke({"messages": [{"role": "user", "content": task.question}]},
                           {"recursion_limit": 2 * MAX_MODEL_REQUESTS + 1})
        return str(out["messages"][-1].content)
    return run


def make_smolagents(url: str, model: str) -> Callable[[Task], str]:
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool
    from smolagents.models import ChatMessage, ChatMessageToolCall, ChatMessageToolCallFunction
    from smolagents.monitoring import LogLevel

    class SmolModel(OpenAIServerModel):  # type: ignore[misc]
        """A plain reply is the final answer (smolagents' hook for replies without native calls)."""

        def parse_tool_calls(self, message: ChatMessage) -> ChatMessage:
            if not message.tool_calls:
                message.tool_calls = [ChatMessageToolCall(
                    id="final", type="function",
                    function=ChatMessageToolCallFunction(name="final_answer", arguments={"answer": message.content}))]
            return super().parse_tool_calls(message)

    chat = SmolModel(model_id=model, api_base=url, api_key=API_KEY, temperature=0)

    def run(task: Task) -> str:
        agent = ToolCallingAgent(tools=[tool(f) for f in task.tools], model=chat, max_steps=MAX_MODEL_REQUESTS,
                                 verbosity_level=LogLevel.OFF, instructions=INSTRUCTIONS)
        return str(agent.run(task.question))
    return run


def make_openai_sdk(url: str, model: str) -> Callable[[Task], str]:
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key=API_KEY)

    def run(task: Task) -> str:
        by_name = {f.__name__: f for f in task.tools}
        messages: list[Any] = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": task.question}]
        tools: list[Any] = [schema(f) for f in task.tools]
        for _ in range(MAX_MODEL_REQUESTS):
            completion = client.chat.completions.create(model=model, messages=messages, temperature=0, tools=tools)
            message = completion.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return message.content or ""
            for call in message.tool_calls:
                if call.type != "function":
                    raise RuntimeError(f"unexpected tool call type {call.type!r}")
                try:
                    out = by_name[call.function.name](**json.loads(call.function.arguments or "{}"))
                except (KeyError, TypeError, ValueError) as exc:
                    out = f"error: {exc}"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
        raise RuntimeError(f"no answer in {MAX_MODEL_REQUESTS} requests")
    return run


def schema(function: Callable[..., str]) -> dict[str, Any]:
    """An OpenAI tool definition from a tool's signature and docstring (str and float parameters)."""
    import inspect

    doc = inspect.getdoc(function) or ""
    described = dict(re.findall(r"^\s+(\w+): (.+)$", doc, re.MULTILINE))
    parameters = inspect.signature(function).parameters
    return {"type": "function", "function": {
        "name": function.__name__, "description": doc.split("\n\n")[0],
        "parameters": {"type": "object", "required": list(parameters), "properties": {
            name: {"type": "number" if p.annotation in (float, "float") else "string", "description": described.get(name, "")}
            for name, p in parameters.items()}}}}


MAKERS = {"openai_agents": make_openai_agents, "pydantic_ai": make_pydantic_ai, "langchain": make_langchain,
          "smolagents": make_smolagents, "openai_sdk": make_openai_sdk}


class CountingProxy:
    """A loopback HTTP proxy in front of a server: it counts chat requests and the assistant
    replies that hold neither text nor a call (`empty`), per task (`reset`)."""

    def __init__(self, target: str) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        import httpx

        self.requests = 0
        self.empty = 0
        client = httpx.Client(base_url=target, timeout=TASK_TIMEOUT_S)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                reply = client.request(method, self.path, content=body,
                                       headers={"content-type": self.headers.get("content-type", "application/json")})
                if self.path.endswith("/chat/completions"):
                    proxy.count(reply)
                self.send_response(reply.status_code)
                self.send_header("content-type", reply.headers.get("content-type", "application/json"))
                self.send_header("content-length", str(len(reply.content)))
                self.end_headers()
                self.wfile.write(reply.content)

            def do_POST(self) -> None:
                self._forward("POST")

            def do_GET(self) -> None:
                self._forward("GET")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, reply: Any) -> None:
        self.requests += 1
        try:
            message = reply.json()["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            return  # an error reply or a stream: not an assistant message
        if not (message.get("content") or "").strip() and not message.get("tool_calls"):
            self.empty += 1

    def reset(self) -> None:
        self.requests = self.empty = 0


def worker_main(args: argparse.Namespace) -> None:
    """Run every (framework, task) against one server; one JSON line per run on stdout."""
    import logging

    logging.disable(logging.WARNING)
    proxy = CountingProxy(args.target)
    tasks = selected(args.tasks)
    for name in args.only:
        try:
            run = MAKERS[name](proxy.url, args.model_id)
        except Exception as exc:  # a framework that does not load is reported, the others still run
            for task in tasks:
                print(json.dumps({"framework": name, "task": task.name, "error": f"setup: {exc!r}"[:300]}), flush=True)
            continue
        for task in tasks:
            CALLS.clear()
            proxy.reset()
            began = time.perf_counter()
            answer, error = "", None
            try:
                answer = run(task)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
            print(json.dumps({
                "framework": name, "task": task.name, "dev": TASKS.index(task) < DEV, "right": task.right(answer),
                "answer": answer[:300], "error": error, "tool_calls": len(CALLS), "requests": proxy.requests,
                "empty": proxy.empty, "seconds": round(time.perf_counter() - began, 2)}), flush=True)


def selected(which: str) -> list[Task]:
    return {"dev": TASKS[:DEV], "test": TASKS[DEV:], "all": TASKS}[which]


# --- the servers and the report (main side: runner's venv) ------------------------------------

def frameworks_pins() -> list[str]:
    """The `frameworks` extra of pyproject.toml."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return list(project["optional-dependencies"]["frameworks"])


def ensure_venv(venv: Path) -> Path:
    """The frameworks' venv's python, creating it and installing the pins on first use."""
    python = venv / "bin" / "python"
    marker = venv / ".runner-frameworks"
    pins = frameworks_pins()
    if marker.exists() and marker.read_text() == json.dumps(pins):
        return python
    print(f"installing {' '.join(pins)} into {venv} ...", file=sys.stderr)
    if not python.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *pins], check=True)
    marker.write_text(json.dumps(pins))
    return python


def llama_server_extras(folder: Path) -> Path:
    """A folder holding `LLAMA_SERVER_EXTRAS` (pip --target, no dependencies), for PYTHONPATH."""
    marker = folder / ".runner-extras"
    if not (marker.exists() and marker.read_text() == json.dumps(LLAMA_SERVER_EXTRAS)):
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(folder),
                        *LLAMA_SERVER_EXTRAS], check=True)
        marker.write_text(json.dumps(LLAMA_SERVER_EXTRAS))
    return folder


class LlamaCppPythonServer:
    """llama-cpp-python's own OpenAI server on `model`, on a free loopback port; a context manager."""

    def __init__(self, model: Path, name: str, extras: Path, log_path: Path, threads: int) -> None:
        from runner.local import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", name,
                        "--chat_format", "chatml-function-calling", "--n_ctx", "4096", "--n_threads", str(threads),
                        "--host", "127.0.0.1", "--port", str(self.port)]
        self.env = {**os.environ, "PYTHONPATH": str(extras), "OMP_WAIT_POLICY": "PASSIVE"}
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LlamaCppPythonServer:
        import httpx

        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited: {self.log_path.read_text()[-800:]}")
            try:
                if httpx.get(self.url + "/models", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("llama_cpp.server did not start in 180 s")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def run_worker(python: Path, url: str, model_id: str, frameworks: list[str], tasks: str) -> list[dict[str, Any]]:
    """Every (framework, task) run against the server at `url`, as the worker reports them."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OPENAI_API_KEY=API_KEY, OTEL_SDK_DISABLED="true", LANGCHAIN_TRACING_V2="false",
               OPENAI_AGENTS_DISABLE_TRACING="1", TOKENIZERS_PARALLELISM="false")
    command = [str(python), str(Path(__file__).resolve()), "--worker", "--target", url.removesuffix("/v1"),
               "--model-id", model_id, "--tasks", tasks, "--only", *frameworks]
    rows = []
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as worker:
        assert worker.stdout is not None
        for line in worker.stdout:
            row = json.loads(line)
            rows.append(row)
            mark = "ok " if row.get("right") else "-- "
            print(f"  {mark}{row['framework']:<14} {row['task']:<16} {row.get('seconds', 0):>6} s  "
                  f"{(row.get('error') or row.get('answer', ''))[:90]!r}", file=sys.stderr, flush=True)
    return rows


def replies_in_log(log_path: Path) -> dict[str, int]:
    """runner serve's request log: chat replies by kind (calls, text, empty)."""
    from runner.local_app import REQUEST_LOG_PREFIX

    kinds: dict[str, int] = {"calls": 0, "text": 0, "empty": 0}
    for line in log_path.read_text(errors="replace").splitlines():
        found = re.search(r" reply=(\w+)", line) if line.startswith(REQUEST_LOG_PREFIX) else None
        if found:
            kinds[found.group(1)] = kinds.get(found.group(1), 0) + 1
    return kinds


def table(rows: list[dict[str, Any]], frameworks: list[str]) -> list[str]:
    lines = ["| framework | right (all) | right (test) | tool calls / task | requests / task | s / task | "
             "empty replies | errors |", "|---|---|---|---|---|---|---|---|"]
    for name in frameworks:
        mine = [r for r in rows if r["framework"] == name]
        if not mine:
            continue
        n = len(mine)
        test = [r for r in mine if not r.get("dev")]
        errors = sum(1 for r in mine if r.get("error"))
        lines.append(
            f"| {name} | {sum(bool(r.get('right')) for r in mine)}/{n} | "
            f"{sum(bool(r.get('right')) for r in test)}/{len(test)} | "
            f"{sum(r.get('tool_calls', 0) for r in mine) / n:.1f} | {sum(r.get('requests', 0) for r in mine) / n:.1f} | "
            f"{sum(r.get('seconds', 0) for r in mine) / n:.1f} | {sum(r.get('empty', 0) for r in mine)} | {errors} |")
    return lines


def misses(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        if not r.get("right"):
            said = r.get("error") or r.get("answer") or ""
            out.append(f"- {r['framework']} / {r['task']}: {said[:140]!r}".replace("\n", " "))
    return out


def load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def report(results: dict[str, dict[str, Any]], frameworks: list[str], args: argparse.Namespace,
           versions: dict[str, str]) -> str:
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"Measured {date} by `python scripts/bench_frameworks.py --steer {args.steer} --tasks {args.tasks}` "
             f"on {args.model}, {os.cpu_count()} CPUs shared with other work; frameworks: "
             + ", ".join(f"{d} {v}" for d, v in versions.items()) + ".", ""]
    for server, result in results.items():
        lines += [f"**{server}** (load average before {result['load_before']}, after {result['load_after']}; "
                  f"{result['wall_s']:.0f} s)", "", *table(result["rows"], frameworks), ""]
        if "log_replies" in result:
            kinds = result["log_replies"]
            lines += [f"runner serve's request log over the whole matrix: {kinds['calls']} replies with calls, "
                      f"{kinds['text']} with text, **{kinds['empty']} empty**.", ""]
        wrong = misses(result["rows"])
        if wrong:
            lines += [f"<details><summary>{server}: the {len(wrong)} misses</summary>", "", *wrong, "", "</details>", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_docs(text: str, path: Path) -> None:
    """Replace the text between `RESULTS_BEGIN` and `RESULTS_END` in `path` with `text`."""
    doc = path.read_text(encoding="utf-8")
    head, _, rest = doc.partition(RESULTS_BEGIN)
    _, _, tail = rest.partition(RESULTS_END)
    path.write_text(f"{head}{RESULTS_BEGIN}\n{text}{RESULTS_END}{tail}", encoding="utf-8")


def versions_of(python: Path, frameworks: list[str]) -> dict[str, str]:
    dists = sorted({DISTS[f] for f in frameworks})
    code = f"import importlib.metadata as m, json; print(json.dumps({{d: m.version(d) for d in {dists!r}}}))"
    return dict(json.loads(subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                                          check=True).stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="a manifest name")
    parser.add_argument("--steer", choices=["off", "default", "on"], default="default", help="runner serve --steer")
    parser.add_argument("--only", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    parser.add_argument("--tasks", choices=["dev", "test", "all"], default="all")
    parser.add_argument("--servers", nargs="+", choices=["runner", "llama-cpp-python"],
                        default=["runner", "llama-cpp-python"])
    parser.add_argument("--url", action="append", default=[], metavar="NAME=URL",
                        help="also run against a server already running at URL (…/v1)")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="the frameworks' venv (created if missing)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each server")
    parser.add_argument("--no-docs", action="store_true", help="print the results only")
    # worker mode (internal): runs inside the frameworks' venv
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--model-id", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args)
        return
    from runner import models
    from runner.local import LocalServer, LocalSettings

    python = ensure_venv(args.venv)
    path = models.resolve(args.model)
    work = Path(tempfile.mkdtemp(prefix="bench-frameworks-"))
    results: dict[str, dict[str, Any]] = {}

    def measure(server: str, url: str) -> dict[str, Any]:
        print(f"{server} at {url} (load {load()})", file=sys.stderr, flush=True)
        began, before = time.perf_counter(), load()
        rows = run_worker(python, url, args.model, args.only, args.tasks)
        return {"rows": rows, "load_before": before, "load_after": load(), "wall_s": time.perf_counter() - began}

    if "runner" in args.servers:
        log = work / "runner-serve.log"
        settings = LocalSettings(model=path, model_name=args.model, port=0, steer=args.steer, n_threads=args.threads)
        with LocalServer(settings, log_path=log) as running:
            results[f"runner serve --steer {args.steer}"] = measure("runner serve", running.base_url)
        results[f"runner serve --steer {args.steer}"]["log_replies"] = replies_in_log(log)
    if "llama-cpp-python" in args.servers:
        extras = llama_server_extras(args.venv.parent / "llama-server-extras")
        with LlamaCppPythonServer(path, args.model, extras, work / "llama-cpp-python.log", args.threads) as llama:
            results["llama-cpp-python server (chatml-function-calling)"] = measure("llama-cpp-python", llama.url)
    for given in args.url:
        name, _, url = given.partition("=")
        results[name] = measure(name, url)
    text = report(results, args.only, args, versions_of(python, args.only))
    (work / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(text)
    print(f"(rows: {work / 'results.json'})", file=sys.stderr)
    if not args.no_docs:
        write_docs(text, REPO / "docs" / "serve.md")


if __name__ == "__main__":
    main()
