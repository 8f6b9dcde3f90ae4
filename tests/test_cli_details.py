"""What a person reads on the command line, checked where it used to mislead: help usage lines,
bounds in click's words, config-file mistakes named as they are, tables without padding,
model paths whole, a research parent's cost counted once, $0 runs apart in the totals, a
local run's resume note, and an OpenTelemetry receiver that is not there."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from runner import start
from runner.render import own_cost, run_totals
from runner.state import Endpoint, RunConfig, new_run
from runner.store import FileStore
from tests.conftest import cli, cli_json, one_error
from tests.fakeprovider import FakeProvider, scripted


@pytest.mark.parametrize("command", ["show", "trace", "resume", "repair"])
def test_help_names_the_run_id_argument_plainly(command: str) -> None:
    usage = cli(command, "--help", runs_dir=None).stdout.splitlines()[0]
    assert usage == f"Usage: runner {command} [OPTIONS] RUN_ID"


def test_a_bound_is_said_in_clicks_words(tmp_path: Path) -> None:
    proc = cli("runs", "--limit", "0", runs_dir=tmp_path)
    assert proc.returncode == 2
    assert "Invalid value for '--limit': 0 is not in the range x>=1." in proc.stderr
    assert "Input should be" not in proc.stderr


def test_an_unknown_config_key_is_called_unknown_not_a_secret(tmp_path: Path) -> None:
    (tmp_path / "runner.toml").write_text("max_token = 5\n")
    proc = cli("config", "show", runs_dir=None, cwd=tmp_path)
    assert proc.returncode == 2
    assert "unknown setting 'max_token'" in proc.stderr and "secret" not in proc.stderr
    (tmp_path / "runner.toml").write_text('provider_key = "sk-live-0123456789abcdef"\n')
    proc = cli("config", "show", runs_dir=None, cwd=tmp_path)
    assert proc.returncode == 2 and "holds a secret" in proc.stderr and "0123456789" not in proc.stderr


def test_tables_have_no_spaces_at_line_ends(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    cli("run", "--scenario", "plan", runs_dir=runs)
    cli("run", "--scenario", "research", runs_dir=runs)
    for args in (("runs",), ("runs", "--totals", "--by", "model"), ("models", "list"),
                 ("suite", "--provider", "scripted")):
        out = cli(*args, runs_dir=runs).stdout
        assert out and all(line == line.rstrip() for line in out.splitlines()), (args, out)


def test_models_list_shows_each_path_whole() -> None:
    from runner import models

    out = cli("models", "list", runs_dir=None).stdout
    for row in models.list_models():
        assert str(row.path) in out


def test_a_research_parent_lists_its_own_cost_and_the_totals_count_the_child_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    code, parent = cli_json("run", "--scenario", "research", runs_dir=runs)
    assert code == 0
    store = FileStore(runs)
    parent_state = store.load(parent["run_id"])
    child = store.load(f"{parent['run_id']}.c1")
    assert parent_state.child_cost_usd == pytest.approx(child.cost_usd) and child.cost_usd > 0
    listed = {line.split()[0]: line.split()[5] for line in cli("runs", runs_dir=runs).stdout.splitlines()[2:]}
    assert float(listed[parent["run_id"]]) + float(listed[child.run_id]) == pytest.approx(parent_state.cost_usd,
                                                                                       abs=2e-6)
    assert own_cost(parent_state) == f"{parent_state.cost_usd - child.cost_usd:.6f}"


def test_a_run_on_a_loopback_endpoint_costs_nothing_unless_priced(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with FakeProvider(scripted("plan")) as fake:
        code, free = cli_json("run", "--scenario", "plan", "--base-url", fake.base_url, runs_dir=runs)
        assert code == 0 and free["cost_usd"] > 0  # the scripted provider plays a hosted one: priced
        code, local = cli_json("run", "Which log mentions a timeout?", "--base-url", fake.base_url, "--model", "m",
                               "--workspace", str(tmp_path), runs_dir=runs)
        assert code == 0 and local["cost_usd"] == 0
        code, priced = cli_json("run", "Which log mentions a timeout?", "--base-url", fake.base_url, "--model", "m",
                                "--workspace", str(tmp_path), "--price-in", "1", "--price-out", "2", runs_dir=runs)
        assert code == 0 and priced["cost_usd"] == pytest.approx((300 * 1 + 30 * 2) / 1e6)
    rows = {r["group"]: r for r in json.loads(cli("runs", "--totals", "--json", runs_dir=runs).stdout)}
    assert rows["unpriced"]["runs"] == 1 and rows["unpriced"]["cost_usd"] == 0
    assert rows["priced"]["runs"] == 2 and rows["all runs"]["runs"] == 3
    table = cli("runs", "--totals", runs_dir=runs).stdout
    assert "unpriced" in table and "priced" in table


def test_a_hosted_endpoint_keeps_the_reference_prices() -> None:
    hosted = RunConfig(endpoint=Endpoint(model="gpt", base_url="https://api.example.com/v1"))
    local = RunConfig(endpoint=Endpoint(model="qwen", local_model="qwen2.5-coder-1.5b-instruct"))
    assert hosted.prices == (2.0, 12.0) and hosted.priced
    assert local.prices == (0.0, 0.0) and not local.priced
    assert RunConfig(endpoint=local.endpoint, price_in_usd_per_mtok=0.5).prices == (0.5, 12.0)
    assert [r.group for r in run_totals([(new_run("q", hosted), "completed")], None)] == ["all runs"]


def test_totals_by_model_count_a_manifest_model_once_whichever_name_its_runs_carry() -> None:
    def run(model: str) -> tuple[Any, str]:
        return new_run("q", RunConfig(endpoint=Endpoint(model=model, local_model="x.gguf"))), "completed"

    rows = run_totals([run("qwen2.5-coder-1.5b-instruct"), run("qwen2.5-coder-1.5b-instruct-q4_k_m"),
                       run("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), run("my-own-q4_k_m")], "model")
    assert [(r.group, r.runs) for r in rows[:3]] == [
        ("qwen2.5-coder-1.5b", 2), ("qwen2.5-coder-0.5b", 1), ("my-own", 1)]


def test_a_token_budget_stops_a_run_at_zero_dollars(tmp_path: Path) -> None:
    with FakeProvider(scripted("plan")) as fake:
        code, out = cli_json("run", "Which log mentions a timeout?", "--base-url", fake.base_url, "--model", "m",
                             "--workspace", str(tmp_path), "--max-tokens-total", "150", runs_dir=tmp_path / "runs")
    assert code == 3 and out["status"] == "budget_exceeded" and out["turns"] == 2
    assert out["interruption"]["limit_tokens"] == 150 and out["interruption"]["used_tokens"] == 220


@pytest.mark.parametrize(("limit", "option"), [(["--max-tokens-total", "1500"], "--max-tokens-total N"),
                                               (["--max-wall-s", "0.5", "--latency-ms", "200"], "--max-wall-s S")])
def test_a_token_or_time_budget_stop_says_which_option_a_resume_lifts(tmp_path: Path, limit: list[str],
                                                                      option: str) -> None:
    runs = tmp_path / "runs"
    stopped = cli("run", "--scenario", "runaway", *limit, runs_dir=runs)
    assert stopped.returncode == 3 and "budget" in stopped.stdout, stopped.stdout
    hint = " ".join(stopped.stdout.split()[stopped.stdout.split().index("resume"):])
    assert hint.startswith("resume with") and hint.endswith(option) and "--max-budget" not in hint, hint
    run_id = next(p.name for p in runs.iterdir() if not p.name.startswith("."))
    lifted = cli("resume", run_id, option.split()[0], "0", "--max-turns", "25", runs_dir=runs)
    assert lifted.returncode == 3 and "turn cap of 25" in lifted.stdout, lifted.stdout


def test_a_prompt_with_no_model_and_the_default_model_not_pulled_says_what_to_give(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PROMPT alone runs on the manifest's default model when it is on disk; with none there
    it is a usage error saying what to give."""
    done = cli("run", "What files are here?", runs_dir=tmp_path / "runs", env={"RUNNER_MODELS_DIR": str(tmp_path)})
    assert done.returncode == 2 and one_error(done.stderr) == (
        "error: give --model NAME (a local model: runner models list), --base-url URL --model NAME (an endpoint), "
        "or --scenario NAME (a scripted run)")
    monkeypatch.setenv("RUNNER_MODELS_DIR", str(tmp_path))
    assert start._pulled_default() is None


def test_a_resumed_local_run_says_the_turn_it_continues_at() -> None:
    state = new_run("q", RunConfig(endpoint=Endpoint(model="smollm2-135m-instruct", local_model="smollm2-135m-instruct",
                                                     first_turn_tool_choice="required")))
    assert "first turn tool_choice=required" in start._llama_note(state)
    state.turns = 1
    note = start._llama_note(state)
    assert "continuing at turn 2" in note and "first turn" not in note


def test_an_otlp_receiver_that_is_not_there_costs_no_retries(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    began = time.monotonic()
    proc = cli("run", "--scenario", "plan", "--otlp-endpoint", f"http://127.0.0.1:{port}", runs_dir=tmp_path)
    assert proc.returncode == 0
    assert time.monotonic() - began < 4  # the exporter's own back-off took ~7 s
    assert "nothing listens there" in proc.stderr


def test_resume_refuses_a_base_url_for_a_model_runner_serves(tmp_path: Path) -> None:
    from runner.store import FileStore as Files

    state = new_run("q", RunConfig(endpoint=Endpoint(model="smollm2-135m-instruct",
                                                     local_model="smollm2-135m-instruct")))
    state.status = "interrupted"
    Files(tmp_path).save(state)
    proc = cli("resume", state.run_id, "--base-url", "http://127.0.0.1:9/v1", runs_dir=tmp_path)
    assert proc.returncode == 2 and "nothing to replace" in one_error(proc.stderr)
