"""A local-model suite run killed mid-run resumes against the same local model: the
run records how to restart its endpoint (`config.local_model`), so `runner resume` starts the
llama.cpp server again instead of sending the run to the scripted provider."""

from __future__ import annotations

from pathlib import Path

from runner import store
from tests.conftest import cli_process, cli_process_json

FIVE = {"completed", "failed", "max_turns_exceeded", "budget_exceeded", "interrupted"}


def test_a_killed_local_suite_run_resumes_on_the_local_model(runs: Path) -> None:
    killed = cli_process("suite", "--provider", "local", "--model", "smollm2-135m-instruct", "--max-turns", "2",
                 "--max-tokens", "48", "--json",
                 runs_dir=runs, timeout=900, env={"RUNNER_CRASH_AT": "reply:1"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    code, listed = cli_process_json("runs", runs_dir=runs)
    # the suite saves every run first (queued); the one being driven when the kill came died
    assert code == 0 and sorted(r["status"] for r in listed) == ["died", *["queued"] * 5]
    run_id = next(r["run_id"] for r in listed if r["status"] == "died")
    saved = store.load(runs, run_id)
    assert saved.config.endpoint.base_url is None and saved.config.endpoint.local_model is not None
    assert saved.config.endpoint.local_model.endswith(".gguf") and saved.turns == 1
    resumed = cli_process("resume", run_id, runs_dir=runs, timeout=900)
    assert "starting llama.cpp on SmolLM2-135M-Instruct.Q4_1.gguf for this run" in resumed.stderr, resumed.stderr
    code, listed = cli_process_json("runs", runs_dir=runs)
    done = next(r for r in listed if r["run_id"] == run_id)
    assert done["status"] in FIVE and "unknown scenario" not in (done["reason"] or ""), done
    assert done["model"] == "SmolLM2-135M-Instruct.Q4_1" and done["turns"] >= 1
    events = store.FileStore(runs).read_trace(run_id)
    assert [e.type for e in events].count("run_resumed") == 1 and events[-1].type == "run_stopped"
    assert [e.turn for e in events if e.type == "turn"] == list(range(1, done["turns"] + 1))


def test_a_resume_names_the_gguf_it_starts_as_a_new_run_does() -> None:
    """A run records its local model by manifest name (`--model smollm2`) or by path (the
    suite); either way the note before llama.cpp starts names the same file."""
    from runner.start import _llama_note, local_choice
    from runner.state import Endpoint, RunConfig, new_run

    choice = local_choice("smollm2")
    assert choice is not None
    for recorded in (choice.recorded, str(choice.path)):
        note = _llama_note(new_run("q", RunConfig(endpoint=Endpoint(model=choice.name, local_model=recorded))))
        assert note.endswith(f"starting llama.cpp on {choice.path.name} for this run"), note
        assert note.startswith(f"model: {choice.name}, first turn tool_choice="), note
