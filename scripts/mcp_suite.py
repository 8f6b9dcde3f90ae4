"""The six-task suite on a local model twice, one table: with runner's built-in tools, and with
the filesystem MCP server's tools instead (what `runner run --no-builtin-tools --mcp
'fs=mcp-server-filesystem ${RUNNER_WORKSPACE}'` offers): score, mean turn, and the prompt
tokens of the first turn and per turn (the larger tool list costs tokens).

The filesystem server works on each run's own copy of the workspace (``${RUNNER_WORKSPACE}``,
also its working folder, so relative paths land there); its tools keep their own names
(``prefix=""``). Needs the servers of scripts/mcp_servers.sh ($RUNNER_MCP_SERVERS).

Usage: ``python scripts/mcp_suite.py [--model NAME] [--repeat N] [--runs-dir DIR]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner import suite
from runner.state import McpServer


def filesystem_server() -> McpServer:
    cache = Path(os.environ.get("RUNNER_MCP_SERVERS") or Path.home() / ".cache" / "runner" / "mcp")
    program = cache / "node_modules" / ".bin" / "mcp-server-filesystem"
    if not program.exists():
        sys.exit(f"mcp_suite: {program} is missing: run scripts/mcp_servers.sh")
    return McpServer(name="fs", command=[str(program), "${RUNNER_WORKSPACE}"], cwd="${RUNNER_WORKSPACE}", prefix="")


def row(label: str, report: suite.SuiteReport) -> list[str]:
    results = report.results
    turns = [ms for r in results for ms in r.turn_ms]
    first = [r.per_turn_prompt_tokens[0] for r in results if r.per_turn_prompt_tokens]
    per_turn = [t for r in results for t in r.per_turn_prompt_tokens]
    return [label, f"{sum(r.correct for r in results)}/{len(results)}",
            f"{statistics.mean(turns):,.0f}" if turns else "-", f"{statistics.mean(first):,.0f}" if first else "-",
            f"{statistics.mean(per_turn):,.0f}" if per_turn else "-", f"{sum(r.calls for r in results)}"]


def progress(label: str, result: suite.TaskResult) -> None:
    print(f"  {label:22} {result.task:14} turns={result.turns} calls={result.calls} ok={result.correct}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--runs-dir", type=Path, default=None)
    args = parser.parse_args()
    runs = args.runs_dir or Path(tempfile.mkdtemp(prefix="runner-mcp-suite-"))
    columns: list[tuple[str, dict[str, Any] | None]] = [
        ("built-in tools", None), ("filesystem MCP server", {"tools": [], "mcp": [filesystem_server()]})]
    rows = []
    for label, settings in columns:
        report = suite.run_suite("local", runs, models=[args.model], repeats=args.repeat, run_settings=settings,
                                 on_note=print, on_result=functools.partial(progress, label))
        rows.append(row(label, report))
    head = ["tools", "score", "mean turn ms", "prompt tokens, turn 1", "prompt tokens / turn", "calls"]
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
    print(f"\n{args.model}, runs in {runs}")
    for line in [head, *rows]:
        print("  ".join(str(cell).rjust(w) if i else str(cell).ljust(w) for i, (cell, w) in enumerate(zip(line, widths))))


if __name__ == "__main__":
    main()
