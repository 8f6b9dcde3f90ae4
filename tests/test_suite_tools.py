"""A suite offers tools beyond the folder's: its own Python tools (a file in the suite folder)
and an MCP server installed by scripts/mcp_servers.sh (mcp-server-time), answered by scenarios
of the scripted provider named as the tasks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.scripted import SCENARIOS
from runner.suite import load_suite, run_suite
from runner.suite.loading import installed_program
from tests.conftest import cli

TICKETS = '''
from pydantic import BaseModel

from runner.tools import Tool, ToolContext


class TicketParams(BaseModel):
    key: str


class LookupTicket(Tool):
    name = "lookup_ticket"
    description = "The status of a ticket of the team's tracker, by its key."
    Params = TicketParams
    read_only = True

    def run_sync(self, args: TicketParams, ctx: ToolContext) -> str:
        return {"OPS-7": "OPS-7: closed on 2026-11-30 by Dana"}.get(args.key, f"no ticket {args.key}")
'''
TASKS: list[dict[str, Any]] = [
    {"id": "ticket_status", "shape": "tool", "prompt": "Is OPS-7 closed?", "check": {"all": ["closed"]}},
    {"id": "tokyo_to_kolkata", "shape": "tool", "prompt": "It is 14:00 in Tokyo. What time is it in Kolkata?",
     "check": {"all": [r"\b10:30\b"]}},
]
SCRIPTS = {
    "ticket_status": lambda turn, tools: [("c1", "lookup_ticket", {"key": "OPS-7"})] if turn == 0
    else f"Yes: {tools.split(': ', 1)[1]}.",
    "tokyo_to_kolkata": lambda turn, tools: [("c1", "convert_time", {
        "source_timezone": "Asia/Tokyo", "time": "14:00", "target_timezone": "Asia/Kolkata"})] if turn == 0
    else "It is 10:30 in Kolkata." if "10:30" in tools else "I could not convert it.",
}


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "desk-tools"
    (root / "workspace").mkdir(parents=True)
    (root / "workspace" / "todo.md").write_text("- ask about OPS-7\n")
    (root / "tickets.py").write_text(TICKETS)
    suite = {"system": "You help with a desk.", "tools": ["list_files"], "own_tools": {"lookup_ticket": "tickets.py:LookupTicket"},
             "mcp": {"clock": {"command": "mcp-server-time --local-timezone UTC"}}, "tasks": TASKS}
    (root / "suite.json").write_text(json.dumps(suite))
    for name, script in SCRIPTS.items():
        monkeypatch.setitem(SCENARIOS, name, script)
    return root


@pytest.mark.skipif(installed_program("mcp-server-time") is None, reason="scripts/mcp_servers.sh installs mcp-server-time")
def test_a_suite_offers_its_own_tools_and_an_mcp_servers(folder: Path, tmp_path: Path) -> None:
    report = run_suite("scripted", tmp_path / "runs", suites=[load_suite(folder)])
    by = {r.task: r for r in report.results}
    assert by["ticket_status"].correct and by["ticket_status"].tool_runs == 1, by["ticket_status"].answer
    assert by["tokyo_to_kolkata"].correct, by["tokyo_to_kolkata"].answer
    assert {s["shape"] for s in json.loads(report.model_dump_json())["shapes"]} == {"tool"}


def test_an_own_tool_or_a_server_that_cannot_be_found_is_a_line_each(folder: Path, tmp_path: Path) -> None:
    suite = json.loads((folder / "suite.json").read_text())
    suite["own_tools"] = {"lookup_ticket": "tickets.py:Missing", "list_files": "tickets.py:LookupTicket"}
    suite["mcp"] = {"clock": {"command": "no-such-mcp-server --flag"}, "bad__name": {"command": "mcp-server-time"}}
    (folder / "suite.json").write_text(json.dumps(suite))
    done = cli("suite", "--suite", str(folder), "--provider", "scripted", runs_dir=tmp_path / "runs")
    assert done.returncode == 2
    lines = [line.strip() for line in done.stderr.strip().splitlines()[1:]]
    assert lines[0].startswith("own_tools.lookup_ticket: ") and "has no attribute 'Missing'" in lines[0]
    assert lines[1] == "own_tools.list_files: the suite offers a built-in tool of that name"
    assert lines[2].startswith("mcp.clock.command: no-such-mcp-server is not installed (on PATH, or in ")
    assert lines[3].startswith("mcp.bad__name: 'bad__name' cannot name an MCP server")
    assert len(lines) == 4 + (installed_program("mcp-server-time") is None)
