"""The suite fanned out on a real local Ray cluster: the same runs as the local
executor, and exactly-once runs when an actor is killed mid-suite.

One Ray cluster serves the whole module (starting one costs 9-14 s and ~0.8 GiB). Runs are
compared by (model, task, repeat): run ids differ, everything the model and tools did may not.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest
import ray

from runner import fanout, store
from runner.endpoints import Endpoint
from runner.fanout import REPORT_S, RayExecutor, _in_reports
from runner.local import physical_cores
from runner.render import write_suite_report
from runner.scripted import ScriptedServer, ScriptedSettings
from runner.state import RunStatus
from runner.suite import SuiteReport, TaskResult, percentile, run_suite, summarize
from tests.conftest import cli_process, cli_process_json

REPEATS = 5
KEYS = ("status", "turns", "tool_runs", "prompt_tokens", "completion_tokens", "cost_usd", "answer", "correct")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    fanout.ray_init(None, num_cpus=2)
    yield
    ray.shutdown()


def _by_key(report: SuiteReport) -> dict[tuple[str, str, int], TaskResult]:
    keyed = {(r.model, r.task, r.repeat): r for r in report.results}
    assert len(keyed) == len(report.results)
    return keyed


def _same_runs(report: SuiteReport, runs: Path, ref: SuiteReport, ref_runs: Path) -> None:
    """Run for run: the same figures and the same saved transcript."""
    got, want = _by_key(report), _by_key(ref)
    assert got.keys() == want.keys()
    for key, r in got.items():
        w = want[key]
        assert {k: getattr(r, k) for k in KEYS} == {k: getattr(w, k) for k in KEYS}, key
        messages = store.load(runs, r.run_id).messages
        assert messages == store.load(ref_runs, w.run_id).messages, key
    timeless = {"wall_ms", "turn_ms_mean", "turn_ms_p50", "turn_ms_p95"}
    assert ([s.model_dump(exclude=timeless) for s in report.summaries]
            == [s.model_dump(exclude=timeless) for s in ref.summaries])


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[SuiteReport, Path]:
    """The scripted suite x 5 repeats on the default (local) executor."""
    runs = tmp_path_factory.mktemp("local") / "runs"
    return run_suite("scripted", runs, repeats=REPEATS), runs


def test_ray_executor_gives_the_local_executors_runs(
    ray_cluster: None, local_reference: tuple[SuiteReport, Path], tmp_path: Path
) -> None:
    ref, ref_runs = local_reference
    assert len(ref.results) == 6 * REPEATS and all(r.correct for r in ref.results)
    runs = tmp_path / "runs"
    executor = RayExecutor(actors=2)
    report = run_suite("scripted", runs, repeats=REPEATS, executor=executor)
    assert report.executor == "ray" and report.repeats == REPEATS and not report.cancelled
    _same_runs(report, runs, ref, ref_runs)
    # every run was saved before any was driven; both actors drove runs (run i -> actor i mod 2)
    first_drive = min(e["ts"] for r in report.results for e in _events(runs, r.run_id) if e["type"] == "run_started")
    assert max(s.created_at for s in store.list_runs(runs)) <= first_drive
    assert len({r.driven_by for r in report.results}) == 2
    assert all(r.driven_by.startswith("local pid") for r in ref.results)
    assert [s.pass_rate for s in report.summaries] == [1.0] * 6
    assert not list(runs.glob("suite-*.json"))  # the library returns the report; the CLI writes it


def _events(runs: Path, run_id: str) -> list[dict[str, Any]]:
    path = store.trace_path(runs, run_id)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _stalled_at_turn_2(runs: Path) -> str | None:
    """A run whose first turn and its tool results were recorded over 0.5 s ago and whose
    second turn is not: it is waiting for the provider's stalled (2 s) second reply."""
    for folder in sorted(runs.iterdir()) if runs.exists() else []:
        if folder.name.startswith("."):  # the process's disk-full reserve
            continue
        events = _events(runs, folder.name)
        turns = [e["turn"] for e in events if e["type"] == "turn"]
        starts = {e["callId"] for e in events if e["type"] == "tool_start"}
        results = {e["callId"] for e in events if e["type"] == "tool_result"}
        if turns == [1] and starts and starts == results and time.time() - events[-1]["ts"] > 0.5:
            return folder.name
    return None


def test_an_actor_killed_mid_suite_leaves_every_run_done_exactly_once(
    ray_cluster: None, local_reference: tuple[SuiteReport, Path], tmp_path: Path
) -> None:
    ref, ref_runs = local_reference
    runs = tmp_path / "runs"
    executor = RayExecutor(actors=2, max_restarts=2, max_task_retries=2)
    # One shared scripted provider that stalls 2 s the first time it sees each turn-2 request:
    # a run caught there is mid-turn (nothing of turn 2 recorded), and the retried request is
    # not stalled again. The kill lands while the victim waits for that reply.
    with ScriptedServer(ScriptedSettings(faults={2: "slow"}, slow_fault_s=2.0)) as server:
        column = Endpoint(model="scripted", base_url=server.base_url)
        out: list[SuiteReport] = []
        suite = threading.Thread(target=lambda: out.append(run_suite(
            "scripted", runs, repeats=REPEATS, executor=executor, columns=[column])))
        suite.start()
        deadline = time.monotonic() + 120
        victim = None
        while victim is None and time.monotonic() < deadline and suite.is_alive():
            victim = _stalled_at_turn_2(runs)
            time.sleep(0.05)
        assert victim is not None, "no run reached its second turn"
        ray.kill(executor.assigned[victim], no_restart=False)
        suite.join(timeout=300)
    assert out, "the suite did not finish"
    report = out[0]
    _same_runs(report, runs, ref, ref_runs)
    for r in report.results:
        events = _events(runs, r.run_id)
        starts = Counter(e["callId"] for e in events if e["type"] == "tool_start")
        paid = Counter(e["turn"] for e in events if e["type"] == "turn")
        assert set(starts.values()) == {1} and len(starts) == r.tool_runs, (r.task, starts)
        assert paid == Counter(range(1, r.turns + 1)), (r.task, paid)
        assert [t.turn for t in store.load(runs, r.run_id).per_turn] == list(range(1, r.turns + 1))
        stops = [e for e in events if e["type"] == "run_stopped"]
        assert [e["status"] for e in stops] == ["completed"], (r.task, stops)
    # the victim was killed mid-run and resumed from the store by the retried drive
    assert [e["type"] for e in _events(runs, victim)].count("run_resumed") == 1
    assert sum(e["type"] == "run_resumed" for r in report.results for e in _events(runs, r.run_id)) >= 1


def test_runner_suite_executor_ray_joins_a_running_cluster(ray_cluster: None, tmp_path: Path) -> None:
    """The CLI as a second driver of the module's cluster (`--address`), two model columns
    (the scripted provider twice would collapse: --model is de-duplicated)."""
    address = ray.get_runtime_context().gcs_address
    code, out = cli_process_json("suite", "--executor", "ray", "--address", address, "--actors", "2", "--provider",
                         "scripted", "--repeat", "2", runs_dir=tmp_path / "runs", timeout=300)
    assert code == 0, out
    assert out["executor"] == "ray" and out["repeats"] == 2 and out["models"] == ["scripted"]
    assert [(r["task"], r["repeat"]) for r in out["results"]][:4] == [
        ("timeout_file", 1), ("timeout_file", 2), ("count_files", 1), ("count_files", 2)]
    assert all(r["correct"] and r["driven_by"].startswith("node ") for r in out["results"])
    assert {s["task"]: s["pass_rate"] for s in out["summaries"]} == {t: 1.0 for t in TASKS}


def _alive(pid: int) -> bool:
    """True while process `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


READ_ONLY = {"list_files", "read_file", "scan_archive"}
"""The demo tools a resume may run again when a kill cut them off (they change nothing)."""


def _paid_once(runs: Path, results: list[dict[str, Any]]) -> None:
    """Every run's trace: each tool call finished once, and started once unless it is a
    read-only call a kill cut off before its result (the resume runs it again); each turn
    paid once; one stop."""
    for r in results:
        events = _events(runs, r["run_id"])
        starts = Counter(e["callId"] for e in events if e["type"] == "tool_start")
        ends = Counter(e["callId"] for e in events if e["type"] == "tool_result")
        tools = {e["callId"]: e["toolName"] for e in events if e["type"] == "tool_start"}
        assert set(ends.values()) <= {1} and len(ends) == r["tool_runs"], (r["task"], ends)
        assert all(n == 1 or (n == 2 and tools[c] in READ_ONLY) for c, n in starts.items()), (r["task"], starts)
        assert Counter(e["turn"] for e in events if e["type"] == "turn") == Counter(range(1, r["turns"] + 1))
        assert [e["status"] for e in events if e["type"] == "run_stopped"] == ["completed"], r["task"]


def test_ctrl_c_kills_the_actors_at_once_and_resume_finishes_the_suite(ray_cluster: None, tmp_path: Path) -> None:
    """Each run shows as it stops (its line on stderr, before the suite ends); Ctrl-C then
    kills the actors at once and saves the report; `--resume` on Ray finishes the runs it
    lists as unfinished, the runs the killed actors were driving resumed where they were, and
    nothing paid twice."""
    address = ray.get_runtime_context().gcs_address
    env = {**os.environ, "RUNNER_RUNS_DIR": str(tmp_path / "runs")}
    proc = subprocess.Popen([sys.executable, "-m", "runner", "suite", "--executor", "ray", "--address", address,
                             "--actors", "2", "--provider", "scripted", "--latency-ms", "300", "--repeat", "3"],
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    line = ""
    while "timeout_file" not in line:
        line = proc.stderr.readline()
        assert line or proc.poll() is None, "the suite ended before any run was shown"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    before = json.loads(next((tmp_path / "runs").glob("suite-*.json")).read_text())
    assert before["cancelled"] and before["unfinished"] and len(before["results"]) + len(before["unfinished"]) == 18
    actors = {int(r["driven_by"].rsplit(" ", 1)[1]) for r in before["results"]}
    deadline = time.monotonic() + 10
    while any(map(_alive, actors)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert actors and not any(map(_alive, actors))
    time.sleep(1.1)  # the new report gets a new name
    code, after = cli_process_json("suite", "--resume", before["report_path"],
                                   "--executor", "ray", "--address", address, "--actors", "2",
                                   runs_dir=tmp_path / "runs", timeout=300)
    assert code == 0, after
    assert sorted(r["run_id"] for r in after["results"]) == sorted(
        [r["run_id"] for r in before["results"]] + before["unfinished"])
    assert all(r["correct"] for r in after["results"]) and after["unfinished"] == []
    _paid_once(tmp_path / "runs", after["results"])
    resumed = [r["run_id"] for r in after["results"]
               if any(e["type"] == "run_resumed" for e in _events(tmp_path / "runs", r["run_id"]))]
    assert resumed, "no run was caught mid-run by Ctrl-C"


# --- the report and the options (no Ray needed) ----------------------------------------------

TASKS = ["timeout_file", "count_files", "read_notes", "read_each", "largest_file", "rotate_logs"]


def test_an_actor_reports_runs_as_they_stop_at_most_every_report_s() -> None:
    """Forty short runs (4 ms of CPU each, after a pass through the loop) come in a few
    replies, never two within `REPORT_S`; a run that stops after a quiet spell is reported at
    once; each run once, in order, at most `at_once` at a time."""
    stopped_s: dict[str, float] = {}
    started: list[str] = []
    live = peak = 0

    async def one(run_id: str) -> str:
        nonlocal live, peak
        started.append(run_id)
        live += 1
        peak = max(peak, live)
        await asyncio.sleep(4 * REPORT_S if run_id == "slow" else 0)
        time.sleep(0.004)
        live -= 1
        stopped_s[run_id] = time.monotonic()
        return run_id

    async def replies(run_ids: list[str]) -> list[tuple[float, list[str]]]:
        return [(time.monotonic(), stopped) async for stopped in _in_reports(one, run_ids, 4)]

    run_ids = [f"fast{i}" for i in range(40)] + ["slow"]
    got = asyncio.run(replies(run_ids))
    assert started == run_ids and peak == 4
    assert sorted(r for _, stopped in got for r in stopped) == sorted(run_ids)
    assert 2 <= len(got) < 20
    assert all(b - a >= REPORT_S * 0.99 for (a, _), (b, _) in itertools.pairwise(got[:-1]))
    assert all(at - stopped_s[r] <= REPORT_S + 0.1 for at, stopped in got for r in stopped)
    assert got[-1][1] == ["slow"] and got[-1][0] - stopped_s["slow"] < 0.05


@pytest.mark.parametrize("values, q, want", [
    ([], 50, 0.0), ([7.0], 95, 7.0), ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
    ([10.0 * i for i in range(1, 21)], 95, 190.5), ([5.0, 1.0, 3.0], 0, 1.0), ([5.0, 1.0, 3.0], 100, 5.0),
])
def test_percentile_interpolates_between_closest_ranks(values: list[float], q: float, want: float) -> None:
    assert percentile(values, q) == pytest.approx(want)


def _fake(task: str, repeat: int, correct: bool, turn_ms: list[float], status: RunStatus = "completed") -> TaskResult:
    return TaskResult(provider="local", model="m", task=task, repeat=repeat, status=status, turns=len(turn_ms),
                      tool_runs=1, prompt_tokens=100, completion_tokens=10, cost_usd=0.001, wall_ms=sum(turn_ms),
                      mean_turn_ms=sum(turn_ms) / len(turn_ms), answer="a", correct=correct, run_id=f"{task}-{repeat}",
                      turn_ms=turn_ms)


def test_summaries_pool_the_turns_of_every_repeat() -> None:
    results = [_fake("a", 1, True, [10.0, 20.0]), _fake("a", 2, False, [30.0], "max_turns_exceeded"),
               _fake("b", 1, True, [5.0])]
    a, b = summarize(results)
    assert (a.task, a.runs, a.passed, a.pass_rate) == ("a", 2, 1, 0.5)
    assert a.statuses == {"completed": 1, "max_turns_exceeded": 1}
    assert (a.turns, a.turn_ms_mean, a.turn_ms_p50, a.turn_ms_p95) == (1.5, 20.0, 20.0, 29.0)
    assert (b.runs, b.pass_rate, b.turn_ms_p95) == (1, 1.0, 5.0)


def test_the_report_files(tmp_path: Path) -> None:
    results = [_fake("a", 1, True, [10.0, 20.0]), _fake("a", 2, False, [30.0])]
    report = SuiteReport(model="m", max_turns=8, results=results, models=["m"], repeats=2,
                         summaries=summarize(results))
    path = write_suite_report(report, tmp_path)
    assert SuiteReport.model_validate_json(path.read_text()) == report and report.report_path == str(path.with_suffix(".md"))
    md = path.with_suffix(".md").read_text()
    assert "| a | 2 | 1/2 (50%) | 1.5 | 1 | 100 | 10 | 0.001000 | 20.0 | 20.0 | 29.0 |" in md
    assert f"]({path.with_suffix('.png').name})" in md and path.with_suffix(".png").stat().st_size > 0


@pytest.mark.parametrize("args, message", [
    (("--address", "auto"), "--address and --actors need --executor ray"),
    (("--executor", "dask"), "--executor must be local or ray"),
    (("--provider", "scripted", "--model", "smollm2-135m-instruct"), "--provider scripted runs no local model"),
])
def test_suite_usage_errors(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    proc = cli_process("suite", *args, runs_dir=tmp_path / "runs")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()  # refused before any run was created


def test_an_endpoint_that_cannot_start_stops_the_suite_with_its_own_error(ray_cluster: None, tmp_path: Path) -> None:
    from runner.errors import LocalServerError

    column = Endpoint(model="missing", local_model=str(tmp_path / "missing.gguf"))
    with pytest.raises(LocalServerError, match=r"missing\.gguf"):
        run_suite("local", tmp_path / "runs", columns=[column], executor=RayExecutor(actors=1))
    # the runs were created first, and stay saved for `runner resume`
    assert len(store.list_runs(tmp_path / "runs")) == 6


def test_a_local_model_on_ray_actors_gives_the_local_executors_runs(ray_cluster: None, tmp_path: Path) -> None:
    """Each actor starts its own llama.cpp server on the packaged SmolLM2 (half the cores each);
    greedy decoding makes the runs equal to the local executor's (one server, default threads)."""
    kw: dict[str, Any] = {"models": ["smollm2-135m-instruct"], "max_turns": 2, "max_tokens": 48}
    ref = run_suite("local", tmp_path / "local", **kw)
    report = run_suite("local", tmp_path / "ray", executor=RayExecutor(actors=2), **kw)
    _same_runs(report, tmp_path / "ray", ref, tmp_path / "local")
    assert report.model == "SmolLM2-135M-Instruct.Q4_1" and report.first_turn_tool_choice == "required"
    assert len({r.driven_by for r in report.results}) == 2
    # both servers' per-reply stats are collected: one entry per turn of every run
    assert len(report.local_turns) == sum(r.turns for r in report.results) == len(ref.local_turns)
    started = [e for e in _events(tmp_path / "ray", report.results[0].run_id) if e["type"] == "run_started"]
    assert started[0]["server"]["n_threads"] == max(1, physical_cores() // 2)  # the cores shared by 2 actors
