"""Benchmark: BFCL's single-turn function-calling categories against OpenAI-compatible servers.

The Berkeley Function Calling Leaderboard (BFCL, Patil et al., ICML 2025) ships its data and its
own AST checker on PyPI as `bfcl-eval` (pinned below). This script asks its questions in BFCL's
FC mode, as BFCL's OpenAI chat-completions handler sends them: the case's messages, the case's
functions in ``tools`` (turned into OpenAI tools by bfcl-eval's own ``convert_to_tool``: dotted
names with ``_``, Gorilla types as JSON-schema types), ``temperature`` 0.001 and ``store`` false;
no ``tool_choice``, no ``parallel_tool_calls``, no system message of its own, no ``max_tokens``.
Each reply is graded by bfcl-eval: the AST categories by ``ast_checker``; irrelevance and
live_irrelevance are right when the reply calls no function, live_relevance when it calls one
(BFCL's relevance rule).

Categories: simple_python, multiple, parallel, parallel_multiple, irrelevance, live_simple,
live_multiple, live_irrelevance, live_relevance. A fixed split: a case is dev when the first byte
of the sha256 of its id is even, test otherwise; techniques are chosen on dev, test is run to
report. ``--n`` cases per category are drawn from the split with ``--seed``.

Servers, one after the other, on the same GGUF (default qwen2.5-coder-1.5b-instruct):

    runner            `runner serve` (runner.local.LocalServer), --steer (default: default)
    llama-cpp-python  `python -m llama_cpp.server --chat_format chatml-function-calling`
                      (bench_frameworks.LlamaCppPythonServer)

plus any ``--url NAME=URL`` already running. bfcl-eval runs in a venv of its own (default
~/.cache/runner/bench-venvs/bfcl), created on first use with the pinned bfcl-eval and only the
few packages its checker imports (no provider SDKs); a worker process in that venv asks and
grades, one per server. bfcl-eval's model registry (which imports every provider's SDK) is
replaced in the worker by a table that says what BFCL's OpenAI entries say: dotted names were
sent with ``_``.

Prints a per-category table (right/asked, percent with a 95% Wilson interval) beside the
published figures for Qwen2.5-1.5B-Instruct (FC), with the load average before and after each
server, writes it into docs/serve.md between the `RESULTS_BEGIN`/`RESULTS_END` markers
(--no-docs: print only), and every case's row to ``--json FILE``.

    python scripts/bench_bfcl.py [--model NAME] [--split dev|test] [--n 30] [--seed 0]
        [--categories ...] [--servers runner llama-cpp-python] [--url NAME=URL ...]
        [--steer off|default|on] [--json FILE] [--no-docs]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runner.suite.stats import wilson

REPO = Path(__file__).resolve().parent.parent
BFCL_PIN = "bfcl-eval==2026.3.23"
CHECKER_DEPS = ["filelock==3.20.0", "tenacity==9.2.1", "tree_sitter==0.21.3", "tree-sitter-java==0.21.0",
                "tree-sitter-javascript==0.21.4"]
"""What bfcl-eval's checker and tool conversion import, beyond the standard library (its provider
SDKs, inference engines and retrieval models are not installed)."""
DEFAULT_VENV = Path.home() / ".cache" / "runner" / "bench-venvs" / "bfcl"
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance", "live_simple",
              "live_multiple", "live_irrelevance", "live_relevance")
PUBLISHED: dict[str, float] = {"simple_python": 92.3, "multiple": 87.0, "parallel": 81.5, "parallel_multiple": 75.5,
                               "irrelevance": 62.7, "live_simple": 74.0, "live_multiple": 66.1}
"""BFCL's published accuracy of Qwen2.5-1.5B-Instruct (FC), percent, as the issue quotes it; the
mean is taken over these seven categories."""
TEMPERATURE = 0.001
"""What BFCL's handlers send unless told otherwise."""
CHECKER_MODEL = "openai-compatible-FC"
"""The model name the checker is given; the registry table in the worker says its dotted
function names were sent with ``_``, as BFCL's OpenAI FC entries do."""
REQUEST_TIMEOUT_S = 600.0
RESULTS_BEGIN = "<!-- bench_bfcl: begin -->"
RESULTS_END = "<!-- bench_bfcl: end -->"


# --- worker side (bfcl-eval's venv) ----------------------------------------------------------


def split_of(case_id: str) -> str:
    """"dev" when the first byte of sha256(id) is even, else "test"."""
    return "dev" if hashlib.sha256(case_id.encode("utf-8")).digest()[0] % 2 == 0 else "test"


def _registry_shim() -> None:
    """Stand in for ``bfcl_eval.constants.model_config`` (it imports every provider SDK): the
    checker reads only ``underscore_to_dot`` of the model's entry from it."""
    import types

    class Registry(dict[str, Any]):
        def __missing__(self, key: str) -> Any:
            return types.SimpleNamespace(underscore_to_dot=True)

    shim = types.ModuleType("bfcl_eval.constants.model_config")
    shim.MODEL_CONFIG_MAPPING = Registry()  # type: ignore[attr-defined]
    sys.modules["bfcl_eval.constants.model_config"] = shim


def load_cases(category: str, split: str, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` cases of `category` from `split` (all when fewer), drawn with `seed`, each with its
    ground truth (``None`` for the relevance categories)."""
    import random

    import bfcl_eval

    data = Path(bfcl_eval.__file__).parent / "data"

    def lines(path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    cases = [c for c in lines(data / f"BFCL_v4_{category}.json") if split_of(c["id"]) == split]
    answers = data / "possible_answer" / f"BFCL_v4_{category}.json"
    truth = {a["id"]: a["ground_truth"] for a in lines(answers)} if answers.exists() else {}
    chosen = sorted(random.Random(f"{seed}:{category}").sample(cases, min(n, len(cases))), key=lambda c: c["id"])
    return [c | {"ground_truth": truth.get(c["id"])} for c in chosen]


def request_body(case: dict[str, Any], model: str, max_tokens: int | None = None) -> dict[str, Any]:
    """What BFCL's OpenAI chat-completions handler sends in FC mode for this single-turn case
    (plus `max_tokens` when given: BFCL sends none)."""
    from bfcl_eval.constants.enums import ModelStyle
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.model_handler.utils import convert_to_tool

    tools = convert_to_tool(case["function"], GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS)
    body: dict[str, Any] = {"messages": case["question"][0], "model": model, "temperature": TEMPERATURE,
                            "store": False}
    if tools:
        body["tools"] = tools
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def ask(base_url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST the body; the reply's message, finish reason and usage, or the error."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{base_url}/chat/completions", data=json.dumps(body).encode("utf-8"),
                                     headers={"Content-Type": "application/json", "Authorization": "Bearer sk-local"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            reply = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return {"error": f"HTTP {exc.code}: {exc.read()[:300]!r}"}
    except (urllib.error.URLError, TimeoutError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    choice = reply["choices"][0]
    return {"message": choice["message"], "finish_reason": choice.get("finish_reason"),
            "usage": reply.get("usage"), "runner": reply.get("runner")}


def grade(case: dict[str, Any], category: str, reply: dict[str, Any]) -> tuple[bool, str]:
    """Whether BFCL counts the reply right, and why not. The reply's calls are decoded as BFCL's
    OpenAI FC handler decodes them ([{name: arguments parsed}]); a reply without calls, or
    with arguments that are not JSON, does not decode."""
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.utils import is_empty_output, is_function_calling_format_output

    if "error" in reply:
        return False, reply["error"]
    calls = reply["message"].get("tool_calls")
    why = ""
    try:
        if calls is None:
            raise ValueError("no tool_calls in the reply")
        decoded = [{c["function"]["name"]: json.loads(c["function"]["arguments"])} for c in calls]
    except (ValueError, KeyError, TypeError) as exc:
        decoded, why = None, f"not decoded: {exc}"
    called = decoded is not None and not is_empty_output(decoded)
    if "irrelevance" in category:
        return not called, "called a function" if called else ""
    if category == "live_relevance":
        return called, "" if called else "called no function"
    if decoded is None:
        return False, why
    if not is_function_calling_format_output(decoded):
        return False, "not in function-call format"
    verdict = ast_checker(case["function"], decoded, case["ground_truth"], Language.PYTHON, category, CHECKER_MODEL)
    return bool(verdict["valid"]), "" if verdict["valid"] else f"{verdict['error_type']}: {verdict['error']}"[:300]


def worker_main(args: argparse.Namespace) -> None:
    """Ask and grade every selected case against ``args.target``: one JSON row per line on stdout."""
    _registry_shim()
    for category in args.categories:
        for case in load_cases(category, args.split, args.n, args.seed):
            began = time.perf_counter()
            reply = ask(args.target, request_body(case, args.model_id, args.max_tokens))
            right, why = grade(case, category, reply)
            message = reply.get("message") or {}
            print(json.dumps({
                "category": category, "id": case["id"], "right": right, "why": why,
                "seconds": round(time.perf_counter() - began, 1),
                "calls": [[c["function"]["name"], c["function"]["arguments"]] for c in message.get("tool_calls") or []],
                "content": (message.get("content") or "")[:400], "finish_reason": reply.get("finish_reason"),
                "ground_truth": case["ground_truth"], "question": case["question"][0][-1]["content"][:300],
                "runner": reply.get("runner"),
            }, ensure_ascii=False), flush=True)


# --- main side (runner's venv) -----------------------------------------------------------------


def ensure_venv(venv: Path) -> Path:
    """bfcl-eval's venv's python, created on first use: the pinned bfcl-eval without its
    dependencies, then `CHECKER_DEPS`."""
    python = venv / "bin" / "python"
    marker = venv / ".runner-bfcl"
    wanted = json.dumps([BFCL_PIN, *CHECKER_DEPS])
    if marker.exists() and marker.read_text() == wanted:
        return python
    print(f"installing {BFCL_PIN} (no provider SDKs) into {venv} ...", file=sys.stderr)
    if not python.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", BFCL_PIN], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *CHECKER_DEPS], check=True)
    marker.write_text(wanted)
    return python


def run_worker(python: Path, url: str, args: argparse.Namespace, rows_path: Path) -> list[dict[str, Any]]:
    """Every selected case asked of the server at `url` and graded, as the worker reports them;
    each row is also appended to `rows_path` (JSON lines) as it comes."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    command = [str(python), str(Path(__file__).resolve()), "--worker", "--target", url, "--model-id", args.model,
               "--split", args.split, "--n", str(args.n), "--seed", str(args.seed), "--categories", *args.categories,
               *(["--max-tokens", str(args.max_tokens)] if args.max_tokens else [])]
    rows = []
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as worker:
        assert worker.stdout is not None
        for line in worker.stdout:
            row = json.loads(line)
            rows.append(row)
            with rows_path.open("a", encoding="utf-8") as kept:
                kept.write(line)
            said = row["why"] if not row["right"] else ""
            calls = ", ".join(name for name, _ in row["calls"]) or "-"
            print(f"  {'ok' if row['right'] else '--'} {row['id']:<28} {row['seconds']:>6} s  calls: {calls[:60]}  "
                  f"{said[:100]}", file=sys.stderr, flush=True)
    if worker.returncode:
        raise SystemExit(f"the bfcl worker failed (exit {worker.returncode})")
    return rows


def cell(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "—"
    right = sum(bool(r["right"]) for r in rows)
    low, high = wilson(right, len(rows))
    return f"{right}/{len(rows)} ({100 * right / len(rows):.0f}% [{100 * low:.0f}–{100 * high:.0f}])"


def table(results: dict[str, dict[str, Any]], categories: list[str]) -> list[str]:
    servers = list(results)
    lines = ["| category | " + " | ".join(servers) + " | published, Qwen2.5-1.5B-Instruct (FC) |",
             "|---|" + "---:|" * (len(servers) + 1)]
    for category in categories:
        cells = [cell([r for r in results[s]["rows"] if r["category"] == category]) for s in servers]
        published = f"{PUBLISHED[category]:.1f}%" if category in PUBLISHED else "—"
        lines.append(f"| {category} | " + " | ".join(cells) + f" | {published} |")
    scored = [c for c in categories if c in PUBLISHED]
    if scored:
        means = []
        for s in servers:
            shares = [sum(bool(r["right"]) for r in rows) / len(rows) for c in scored
                      if (rows := [r for r in results[s]["rows"] if r["category"] == c])]
            means.append(f"{100 * sum(shares) / len(shares):.1f}%" if shares else "—")
        mean_published = sum(PUBLISHED[c] for c in scored) / len(scored)
        lines.append(f"| mean of the {len(scored)} published categories | " + " | ".join(means)
                     + f" | {mean_published:.1f}% |")
    return lines


def load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = (f"python scripts/bench_bfcl.py --model {args.model} --split {args.split} --n {args.n} "
               f"--seed {args.seed} --steer {args.steer}" + "".join(f" --setting {s}" for s in args.setting)
               + (f" --max-tokens {args.max_tokens}" if args.max_tokens else "")
               + (f" --categories {' '.join(args.categories)}" if list(args.categories) != list(CATEGORIES) else ""))
    lines = [f"Measured {date} by `{command}` ({BFCL_PIN}'s data and checker; {os.cpu_count()} CPUs shared "
             "with other work). Each cell: right/asked (percent [95% Wilson interval]).", ""]
    for server, result in results.items():
        lines.append(f"- {server}: load average before {result['load_before']}, after {result['load_after']}; "
                     f"{result['wall_s']:.0f} s")
    return "\n".join([*lines, "", *table(results, list(args.categories))]) + "\n"


def write_docs(text: str, path: Path) -> None:
    """Replace the text between `RESULTS_BEGIN` and `RESULTS_END` in `path` with `text`."""
    doc = path.read_text(encoding="utf-8")
    head, _, rest = doc.partition(RESULTS_BEGIN)
    _, _, tail = rest.partition(RESULTS_END)
    path.write_text(f"{head}{RESULTS_BEGIN}\n{text}{RESULTS_END}{tail}", encoding="utf-8")


def from_files(args: argparse.Namespace) -> None:
    """The table of the runs saved with ``--json`` (each a server or more, same split, n, seed
    and categories, said by the command each file records), printed and written to the docs."""
    results: dict[str, dict[str, Any]] = {}
    commands = []
    for path in args.from_json:
        saved = json.loads(path.read_text(encoding="utf-8"))
        results.update(saved["results"])
        commands.append("python " + " ".join(saved["command"]))
    categories = [c for c in CATEGORIES if any(r["category"] == c for res in results.values() for r in res["rows"])]
    lines = [f"Written {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')} by "
             f"`python scripts/bench_bfcl.py --from-json {' '.join(p.name for p in args.from_json)}` from runs "
             f"of the servers apart, at the same time ({BFCL_PIN}'s data and checker; {os.cpu_count()} CPUs shared "
             "with other work):", "", *(f"- `{c}`" for c in commands), "",
             "Each cell: right/asked (percent [95% Wilson interval]).", ""]
    for server, result in results.items():
        lines.append(f"- {server}: load average before {result['load_before']}, after {result['load_after']}; "
                     f"{result['wall_s']:.0f} s")
    text = "\n".join([*lines, "", *table(results, categories)]) + "\n"
    print(text)
    if not args.no_docs:
        write_docs(text, REPO / "docs" / "serve.md")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="a manifest name")
    parser.add_argument("--split", choices=["dev", "test"], default="dev")
    parser.add_argument("--n", type=int, default=30, help="cases per category")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--categories", nargs="+", choices=CATEGORIES, default=list(CATEGORIES))
    parser.add_argument("--steer", choices=["off", "default", "on"], default="default", help="runner serve --steer")
    parser.add_argument("--servers", nargs="*", choices=["runner", "llama-cpp-python"],
                        default=["runner", "llama-cpp-python"])
    parser.add_argument("--url", action="append", default=[], metavar="NAME=URL",
                        help="also run against a server already running at URL (…/v1)")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="bfcl-eval's venv (created if missing)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each server")
    parser.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                        help="a runner serve setting (runner.local.LocalSettings field), e.g. call_threshold=0.5")
    parser.add_argument("--json", type=Path, help="write every case's row here")
    parser.add_argument("--no-docs", action="store_true", help="print the results only")
    parser.add_argument("--max-tokens", type=int, help="send max_tokens (BFCL sends none): a cap for a server "
                        "that answers in long prose on a shared CPU; a call is made at the reply's start either way")
    parser.add_argument("--from-json", nargs="+", type=Path, default=[], metavar="FILE",
                        help="ask nothing: the table from the --json files of earlier runs (servers run apart)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--model-id", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args)
        return
    if args.from_json:
        from_files(args)
        return
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the servers are stopped on the way out
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_frameworks import LlamaCppPythonServer, llama_server_extras

    from runner import models
    from runner.local import LocalServer, LocalSettings

    python = ensure_venv(args.venv)
    work = Path(tempfile.mkdtemp(prefix="bench-bfcl-"))
    print(f"rows as they come: {work}/rows-*.jsonl", file=sys.stderr)
    results: dict[str, dict[str, Any]] = {}

    def measure(server: str, url: str) -> dict[str, Any]:
        print(f"{server} at {url} (load {load()})", file=sys.stderr, flush=True)
        began, before = time.perf_counter(), load()
        rows = run_worker(python, url, args, work / f"rows-{len(results)}.jsonl")
        return {"rows": rows, "load_before": before, "load_after": load(), "wall_s": time.perf_counter() - began}

    if "runner" in args.servers:
        settings = LocalSettings.model_validate({
            "model": models.resolve(args.model), "model_name": args.model, "port": 0, "steer": args.steer,
            "n_threads": args.threads, **dict(given.split("=", 1) for given in args.setting)})
        with LocalServer(settings, log_path=work / "runner-serve.log") as running:
            results[f"runner serve --steer {args.steer}"] = measure("runner serve", running.base_url)
    if "llama-cpp-python" in args.servers:
        extras = llama_server_extras(args.venv.parent / "llama-server-extras")
        with LlamaCppPythonServer(models.resolve(args.model), args.model, extras, work / "llama-cpp-python.log",
                                  args.threads) as llama:
            results["llama-cpp-python server"] = measure("llama-cpp-python", llama.url)
    for given in args.url:
        name, _, url = given.partition("=")
        results[name] = measure(name, url)
    text = report(results, args)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"command": sys.argv, "results": results}, indent=1, ensure_ascii=False),
                             encoding="utf-8")
    if not args.no_docs:
        write_docs(text, REPO / "docs" / "serve.md")


if __name__ == "__main__":
    main()
