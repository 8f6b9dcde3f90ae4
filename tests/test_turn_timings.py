"""Every local turn explained: the server reports each reply's prompt tokens reused and
evaluated, prompt and generation ms; runner's client records them in the trace's ``turn``
event and the run's state; `runner show` (text and Markdown) and `runner view`'s run page show
them per turn. On the real llama.cpp server (SmolLM2) over loopback, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from runner.client import engine_timings
from runner.local import LocalServer
from runner.store import FileStore
from tests.conftest import cli, cli_json
from tests.test_view import view_server

pytestmark = pytest.mark.llama


@pytest.fixture(scope="module")
def local_run(smollm2_server: LocalServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A three-turn run of SmolLM2 through `runner run`: (its runs directory, its id)."""
    runs = tmp_path_factory.mktemp("runs")
    _, report = cli_json("run", "Which file is the largest?", "--base-url", smollm2_server.base_url, "--model",
                         "smollm2", "--tool-choice", "required", "--max-turns", "3", "--answer-after", "1",
                         runs_dir=runs, timeout=600)
    return runs, report["run_id"]


def test_each_turn_event_says_where_the_engine_time_went(local_run: tuple[Path, str]) -> None:
    runs, run_id = local_run
    events = [json.loads(line) for line in (runs / run_id / "trace.jsonl").read_text().splitlines()]
    turns = [e for e in events if e["type"] == "turn"]
    assert len(turns) >= 2
    for e in turns:
        assert e["promptReused"] + e["promptEvaluated"] == e["promptTokens"], e
        assert e["promptMs"] > 0 and e["genMs"] > 0, e
        assert "draftProposed" not in e  # not speculative
    assert all(e["promptReused"] > 0 for e in turns[1:])  # the conversation stays in the KV cache
    state = FileStore(runs).load(run_id)
    assert [t.engine.prompt_evaluated for t in state.per_turn if t.engine] == [e["promptEvaluated"] for e in turns]


def test_runner_show_prints_a_per_turn_breakdown(local_run: tuple[Path, str]) -> None:
    runs, run_id = local_run
    text = cli("show", run_id, runs_dir=runs).stdout
    assert "engine, per turn:" in text
    head = text.split("engine, per turn:\n", 1)[1].splitlines()[0]
    assert head.split() == ["turn", "choice", "prompt", "reused", "eval", "prompt", "ms", "out", "gen", "ms", "tok/s",
                            "turn", "ms"] and len(head) <= 80, head
    breakdowns = [line for line in text.splitlines() if line.strip().startswith("prompt ") and "reused +" in line]
    assert len(breakdowns) >= 2 and all("tok/s" in line for line in breakdowns), text
    markdown = cli("show", run_id, "--format", "md", runs_dir=runs).stdout
    assert "## Engine, per turn" in markdown and "| 1 | required |" in markdown


def test_the_run_page_shows_the_engine_columns(local_run: tuple[Path, str]) -> None:
    runs, run_id = local_run
    with view_server({"RUNNER_RUNS_DIR": str(runs)}) as url:
        page = httpx.get(f"{url}runs/{run_id}", timeout=30).text
    assert "<th class=\"n\">reused</th>" in page and "<th class=\"n\">tok/s</th>" in page
    assert page.count('data-field="prompt-evaluated"') >= 2


def test_a_run_on_the_scripted_provider_has_no_engine_fields(tmp_path: Path, provider: str) -> None:
    _, report = cli_json("run", "--scenario", "plan", runs_dir=tmp_path)
    events = [json.loads(line) for line in (tmp_path / report["run_id"] / "trace.jsonl").read_text().splitlines()]
    assert not any("promptReused" in e for e in events if e["type"] == "turn")
    assert "engine, per turn" not in cli("show", report["run_id"], runs_dir=tmp_path).stdout


def test_llama_cpp_server_timings_are_read_too() -> None:
    """llama.cpp's own server reports the same numbers under ``timings``."""
    read = engine_timings({"timings": {"cache_n": 400, "prompt_n": 30, "prompt_ms": 250.5, "predicted_n": 12,
                                       "predicted_ms": 900.0, "draft_n": 10, "draft_n_accepted": 7}})
    assert read is not None and (read.prompt_reused, read.prompt_evaluated, read.draft_accepted) == (400, 30, 7)
    assert engine_timings({"usage": {"prompt_tokens": 3}}) is None
    assert engine_timings({"runner": {"handler_ms": 3.0}}) is None  # another chat format: no engine account


def test_the_run_report_and_the_suite_paragraph_carry_them(local_run: tuple[Path, str]) -> None:
    from runner.render import engine_summary
    from runner.result import RunResult

    runs, run_id = local_run
    result = RunResult.of(FileStore(runs).load(run_id))
    assert len(result.per_turn_engine) == result.turns and all(result.per_turn_engine)
    [paragraph, _] = engine_summary([result])
    assert f"Engine over {result.turns} turns" in paragraph and "tok/s" in paragraph and "drafts" not in paragraph
    assert RunResult.of(FileStore(runs).load(run_id)).model_dump(mode="json")["per_turn_engine"][0]["prompt_ms"] > 0
