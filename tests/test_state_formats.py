"""Runs saved by earlier versions of runner: they list, resume and take verdicts.

`fixtures/runs_v2/` holds a FileStore run written by runner with state format 2 (flat config
fields): `runner run --scenario destructive`, stopped for approval of `delete_file`.
`fixtures/runs_v3/` holds one written with state format 3, before the harness's messages
carried their kind: `runner run "What does notes.txt say?" --policy +answer_check`, in a folder
since removed, against a fake provider that read notes.txt, restated the question (so the run
holds a review), then answered 404 (interrupted).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from runner import store
from runner.state import FORMAT_VERSION, RunConfig
from tests.conftest import cli
from tests.fakeprovider import FakeProvider, completion

FIXTURES = Path(__file__).parent / "fixtures"
V2_RUN = "20261201-151329-fdbd7e"
V3_RUN = "20261206-030849-dc205a"


def test_a_format_2_run_lists_resumes_and_takes_a_verdict(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURES / "runs_v2", runs)
    listed = cli("runs", "--json", runs_dir=runs)
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["run_id"] == V2_RUN and row["status"] == "interrupted"

    old = store.load(runs, V2_RUN)
    assert old.config.endpoint.model == "scripted/destructive" and old.config.limits.max_turns == 20
    assert old.interruption is not None and old.interruption.type == "approval"

    resumed = cli("resume", V2_RUN, "--approve", "c2", "--json", runs_dir=runs)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"
    new = store.load(runs, V2_RUN)
    assert new.format_version == FORMAT_VERSION and new.status == "completed"
    verdicts = [e for e in store.FileStore(runs).read_trace(V2_RUN) if e.type == "verdict"]
    assert [(v.callId, v.verdict) for v in verdicts] == [("c2", "approve")]


def test_flat_config_keys_are_lifted_into_endpoint_and_limits() -> None:
    flat = {"model": "m", "base_url": "http://127.0.0.1:1/v1", "timeout_s": 5, "max_turns": 3,
            "max_budget_usd": 0.5, "max_protocol_retries": 1, "dedupe": True}
    config = RunConfig.model_validate(flat)
    assert config.endpoint.model == "m" and config.endpoint.timeout_s == 5 and config.endpoint.kind == "url"
    assert (config.limits.max_turns, config.limits.max_budget_usd, config.limits.max_protocol_retries) == (3, 0.5, 1)
    assert config.dedupe
    assert RunConfig.model_validate_json(config.model_dump_json()) == config
    assert "model" not in config.model_dump() and "max_turns" not in config.model_dump()


def test_a_format_3_run_with_a_review_loads_with_legacy_notes_and_resumes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURES / "runs_v3", runs)
    old = store.load(runs, V3_RUN)
    assert old.format_version == 3 and old.status == "interrupted"
    [review] = [m for m in old.messages if m.name == "runner"]
    assert review.harness is not None and review.harness.kind == "legacy"
    shown = cli("show", V3_RUN, runs_dir=runs)
    assert shown.returncode == 0 and "── runner (asks again) " in shown.stdout
    folder = tmp_path / "project"  # the run worked on the folder it was started in, gone since
    folder.mkdir()
    (folder / "notes.txt").write_text("Remember to rotate your logs.\n")
    with FakeProvider(lambda body: completion({"role": "assistant", "content": "It says to rotate the logs."})) as fake:
        resumed = cli("resume", V3_RUN, "--base-url", fake.base_url, "--workspace", str(folder), "--json",
                      runs_dir=runs)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["answer"] == "It says to rotate the logs."
    assert all("harness" not in m for m in fake.requests[0]["messages"])
    new = store.load(runs, V3_RUN)
    assert new.format_version == FORMAT_VERSION and new.status == "completed"
