"""The steering policies, by name: what each adds to a real run's requests (a fake provider
on loopback records them), how the manifest and --policy choose them, and `runner policies`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from runner import steering as policies
from runner.errors import UsageError
from runner.models import ModelEntry
from runner.replies import restates
from runner.state import Endpoint, Message, RunConfig
from runner.steering import texts
from runner.steering.checks import unshown_figure
from runner.steering.reviews import _unread
from runner.steering.view import call_label
from tests.conftest import cli, drive, scripted_run
from tests.fakeprovider import Answer, FakeProvider, completion, error, tool_call

DONE = completion({"role": "assistant", "content": "Done."})


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider(lambda body: error(500, "no handler set")) as server:
        yield server


def _call(name: str, args: str = "{}", turn: int = 0) -> Answer:
    return completion({"role": "assistant", "content": None, "tool_calls": [tool_call(f"c{turn}_{name}", name, args)]})


def _play(fake: FakeProvider, turns: list[Answer]) -> None:
    replies = iter(turns)
    fake.handler = lambda body: DONE if body.get("tool_choice") == "none" else next(replies, DONE)


def _run(fake: FakeProvider, prompt: str = "Which file is it?", **config: Any) -> Any:
    return scripted_run("fake", prompt=prompt, base_url=fake.base_url, **config)


def _in_folder(fake: FakeProvider, folder: Path, prompt: str, turns: list[Answer], **config: Any) -> Any:
    """A run over `folder` with the folder catalog's tools, the model replying `turns` in order."""
    from runner import catalog

    replies = iter(turns)
    fake.handler = lambda body: next(replies)
    return drive(_run(fake, prompt=prompt, builtin_tools="folder", tools=list(catalog.FOLDER_TOOLS),
                      workspace=str(folder), **config), fake.base_url, None)


def test_a_request_with_tools_says_tool_choice_auto_outright(fake: FakeProvider) -> None:
    _play(fake, [_call("list_files")])
    state = drive(_run(fake), fake.base_url, None)
    assert state.status == "completed"
    assert [r.get("tool_choice") for r in fake.requests] == ["auto", "auto"]
    assert all(r["tools"] for r in fake.requests)


def test_a_request_without_tools_sends_no_tool_choice(fake: FakeProvider) -> None:
    _play(fake, [])
    state = drive(_run(fake, tools=[]), fake.base_url, None)
    assert state.status == "completed"
    assert "tool_choice" not in fake.requests[0] and not fake.requests[0].get("tools")


def test_listing_in_prompt_and_abstain_option_extend_the_system_prompt_once(fake: FakeProvider) -> None:
    _play(fake, [_call("read_file", '{"path": "notes.txt"}', 1)])
    state = _run(fake, steering=["listing_in_prompt", "listing_hints", "abstain_option"],
                 prompt="Which file is about rotating the logs?")
    state.messages.insert(0, state.messages[0].model_copy(update={"role": "system", "content": "Be brief."}))
    state = drive(state, fake.base_url, None)
    assert state.status == "completed"
    systems = [r["messages"][0]["content"] for r in fake.requests]
    assert systems[0] == systems[1]  # added before the first turn only
    assert systems[0].startswith("Be brief.\n\nThe folder holds 3 files (path and size in bytes):\n")
    lines = systems[0].split("\n\n")[1].splitlines()[1:]
    assert [line.split(" ")[0] for line in lines] == ["access.log", "errors.log", "notes.txt"]
    assert lines[2].endswith("; matches the question's rotating, logs")  # notes.txt: "rotate your logs"
    assert systems[0].endswith(texts.ABSTAIN)


def test_question_words_leave_out_what_names_no_file() -> None:
    assert policies.question_words("Which file is the largest?") == [("largest", "largest")]
    assert policies.question_words("Is caching enabled?") == [("caching", "cach"), ("enabled", "enabl")]


def test_evidence_first_nudges_a_repeated_listing_and_asks_once_a_file_was_read(fake: FakeProvider) -> None:
    _play(fake, [_call("list_files", turn=1), _call("list_files", turn=2), _call("read_file", '{"path": "errors.log"}', 3),
                 _call("read_file", '{"path": "errors.log"}', 4)])
    state = drive(_run(fake, answer_on_stall=True, steering=["evidence_first"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == "Done."
    assert [r.get("tool_choice") for r in fake.requests] == ["auto", "auto", "auto", "auto", "none"]
    nudge = fake.requests[2]["messages"][-1]
    assert nudge["name"] == "runner" and nudge["content"] == texts.NUDGE.format(question="Which file is it?")
    assert fake.requests[4]["messages"][-1]["content"] == texts.ASK_FOR_ANSWER.format(question="Which file is it?")


def test_without_evidence_first_a_repeated_listing_asks_for_the_answer_at_once(fake: FakeProvider) -> None:
    _play(fake, [_call("list_files", turn=1), _call("list_files", turn=2)])
    state = drive(_run(fake, answer_on_stall=True), fake.base_url, None)
    assert state.status == "completed" and state.tool_run_count == 2
    assert [r.get("tool_choice") for r in fake.requests] == ["auto", "auto", "none"]


def test_policy_names_round_trip_through_the_config() -> None:
    names = ["first_turn_required", "corrective_retries", "answer_forcing", "one_call_per_turn", "listing_in_prompt"]
    fields = policies.fields_for(names, {"answer_after_tool_turns": 2})
    own, at_endpoint = policies.split_fields(fields)
    config = RunConfig(endpoint=Endpoint(model="m", **at_endpoint), **own)
    assert policies.active(config) == names and config.answer_after_tool_turns == 2


def test_policy_edits_add_remove_and_replace() -> None:
    start = ["first_turn_required", "answer_on_stall"]
    assert policies.edited(start, ["+abstain_option", "-answer_on_stall"]) == ["first_turn_required", "abstain_option"]
    assert policies.edited(start, ["listing_in_prompt"]) == ["listing_in_prompt"]
    assert policies.edited(start, ["none"]) == []
    with pytest.raises(UsageError, match="no such policy"):
        policies.edited(start, ["+answer_everything"])


def test_a_manifest_entry_names_its_policies() -> None:
    entry = ModelEntry(name="m", source="package", package="p", filename="m.gguf", quantization="Q4",
                       policies=["first_turn_required", "answer_on_stall", "abstain_option"])
    assert entry.first_turn_tool_choice == "required" and entry.answer_on_stall and entry.steering == ["abstain_option"]
    assert entry.answer_after_tool_turns is None and entry.on_slip == "repeat"


def test_runner_policies_lists_every_policy_and_each_models_set(tmp_path: Path) -> None:
    done = cli("policies", "--json", runs_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert list(shown["policies"]) == list(policies.POLICIES)
    assert "first_turn_required" in shown["models"]["qwen2.5-coder-1.5b-instruct"]
    assert shown["answer_after_tool_turns"]["qwen2.5-coder-1.5b-instruct"] == 6
    assert list(shown["serve_policies"]) == ["first_turn_required", "answer_forcing", "answer_on_stall"]
    assert shown["scopes"]["answer_check"]["where"] == ["run"] and "serve" in shown["scopes"]["answer_forcing"]["where"]
    table = cli("policies", runs_dir=tmp_path, env={"COLUMNS": "80"}).stdout
    assert "answer_forcing (after 6" in table and "\nanswer_on_stall\n" in table
    assert "    applies to: runs whose evidence comes from runner's folder tools alone" in table
    assert max(len(line) for line in table.splitlines()) <= 80


def test_an_unknown_policy_is_a_usage_error_in_one_line(tmp_path: Path) -> None:
    done = cli("run", "--scenario", "plan", "--policy", "+guess_harder", runs_dir=tmp_path)
    assert done.returncode == 2 and "guess_harder" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_abstain_check_sends_one_reminder_before_an_abstention_is_taken(fake: FakeProvider) -> None:
    gave_up = completion({"role": "assistant", "content": "The information is not in the files."})
    replies = iter([_call("read_file", '{"path": "nope.txt"}', 1), gave_up, _call("read_file", '{"path": "errors.log"}', 2),
                    gave_up])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, steering=["abstain_check"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == "The information is not in the files."
    reminder = fake.requests[2]["messages"][-1]
    assert reminder["name"] == "runner" and reminder["content"] == texts.CHECK_ABSTENTION.format(
        read="nothing yet", unread="", question="Which file is it?")
    assert fake.requests[2].get("tool_choice") == "required" and len(fake.requests) == 4  # one reminder only


def test_without_abstain_check_an_abstention_ends_the_run(fake: FakeProvider) -> None:
    fake.handler = lambda body: completion({"role": "assistant", "content": "The files do not say."})
    state = drive(_run(fake), fake.base_url, None)
    assert state.status == "completed" and len(fake.requests) == 1


def test_the_listing_is_saved_with_a_new_run_that_had_no_system_prompt(fake: FakeProvider, tmp_path: Path) -> None:
    from runner.store import FileStore

    _play(fake, [_call("list_files", turn=1)])
    state = drive(_run(fake, steering=["listing_in_prompt"]), fake.base_url, tmp_path / "runs")
    assert fake.requests[0]["messages"][0]["role"] == "system"
    assert fake.requests[0]["messages"][0]["content"].startswith("The folder holds 3 files")
    saved = FileStore(tmp_path / "runs").load(state.run_id)
    assert saved.messages[0].role == "system" and saved.messages[0].content == fake.requests[0]["messages"][0]["content"]


def test_a_listing_repeated_after_the_nudge_gets_the_request_for_the_answer_not_a_failure(fake: FakeProvider) -> None:
    _play(fake, [_call("list_files", turn=1), _call("list_files", turn=2), _call("list_files", turn=3)])
    state = drive(_run(fake, answer_on_stall=True, steering=["evidence_first"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == "Done."
    assert [r.get("tool_choice") for r in fake.requests] == ["auto", "auto", "auto", "none"]


def test_abstain_check_lets_an_abstention_stand_when_no_turn_is_left_to_look(fake: FakeProvider) -> None:
    fake.handler = lambda body: completion({"role": "assistant", "content": "The information is not in the files."})
    state = drive(_run(fake, steering=["abstain_check"], max_turns=1), fake.base_url, None)
    assert state.status == "completed" and len(fake.requests) == 1


def _say(text: str) -> Answer:
    return completion({"role": "assistant", "content": text})


@pytest.mark.parametrize(("prompt", "small"), [
    ("hi", True), ("Thanks!", True), ("Hello there.", True), ("thanks, that's all", True),
    ("Hello! Can you help me?", True), ("What can you do?", True),
    ("hi, which file is largest?", False), ("Thank the team", False), ("Okay, is caching on?", False)])
def test_a_greeting_requires_no_call_and_its_answer_is_taken(fake: FakeProvider, prompt: str, small: bool) -> None:
    replies = iter([_say("Hello! What would you like to know about the files?"),
                    _call("list_files", turn=1), _say("It is notes.txt.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt=prompt, first_turn_tool_choice="required", steering=["answer_check"]),
                  fake.base_url, None)
    assert fake.requests[0]["tool_choice"] == ("none" if small else "required")
    if small:
        assert state.status == "completed" and state.answer.startswith("Hello!") and len(fake.requests) == 1
    else:  # an answer before any call is sent back, as for any task
        assert len(fake.requests) > 1 and fake.requests[1]["messages"][-1]["name"] == "runner"


def test_answer_check_asks_for_a_read_when_the_answer_came_before_any_file_was(fake: FakeProvider) -> None:
    replies = iter([_call("list_files", turn=1), _say("The folder holds 3 files."),
                    _call("read_file", '{"path": "notes.txt"}', 2), _say("Rotate the logs.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What should I remember?", steering=["answer_check"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == "Rotate the logs."
    review = fake.requests[2]["messages"][-1]
    assert review["name"] == "runner" and review["content"] == (
        "You answered before reading any file, so your answer cannot come from the files. Files you have not read: "
        "access.log, errors.log, notes.txt. Read the file most likely to hold the answer, then answer my question "
        "in one short sentence: What should I remember?")
    assert [r.get("tool_choice") for r in fake.requests] == ["auto", "auto", "required", "auto"]


def test_answer_check_takes_an_answer_from_a_listing_when_the_question_is_about_the_files(fake: FakeProvider) -> None:
    replies = iter([_call("list_files", turn=1), _say("There are 3 files.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="How many files are there?", steering=["answer_check"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == "There are 3 files." and len(fake.requests) == 2


@pytest.mark.parametrize(("kind", "reply", "choice", "review"), [
    ("restated", "What does notes.txt say?", "none",
     "Your reply repeated my question instead of answering it. Here is what the tools returned:\n\n"
     "--- read_file notes.txt ---\nRemember to rotate your logs.\n\n\n"
     "Using only this, answer in one short sentence: What does notes.txt say?"),
    ("instructions", "To find out, you can call the `read_file` function with the path notes.txt.", "required",
     "Do not tell me how to use the tools or what to read: call them yourself. Then answer my question in one "
     "short sentence: What does notes.txt say?"),
    ("instructions", "I need to read the file notes.txt to answer.", "required", None),
    ("instructions", 'To answer, I need to search the files for the phrase "rotate".', "required", None),
])
def test_answer_check_reviews_a_non_answer_once_per_kind(fake: FakeProvider, kind: str, reply: str,
                                                          choice: str, review: str | None) -> None:
    replies = iter([_call("read_file", '{"path": "notes.txt"}', 1), *[_say(reply)] * 5])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What does notes.txt say?", steering=["answer_check"]), fake.base_url, None)
    kinds = policies.non_answers(state.model_copy(update={"messages": state.messages[:-2]}))
    assert kinds[0] == kind
    # reviewed once for each kind it is, asked once more in a fresh context, then the run fails: no answer
    assert state.status == "failed" and state.error is not None and state.error.type == "no_answer"
    assert state.answer == "" and state.messages[-1].content == reply and len(fake.requests) == 3 + len(kinds)
    reviews = [r["messages"][-1]["content"][:30] for r in fake.requests[2:-1]]
    assert len(set(reviews)) == len(reviews) == len(kinds)
    last = fake.requests[-1]["messages"]  # a fresh context: the run has no system prompt, so the request alone
    assert len(last) == 1 and last[0]["name"] == "runner" and fake.requests[-1]["tool_choice"] == "none"
    sent = fake.requests[2]["messages"][-1]["content"]
    assert sent.startswith(texts.NON_ANSWERS[kind][0][:30]) and (review is None or sent == review)
    assert fake.requests[2].get("tool_choice") == choice


def test_without_answer_check_a_restated_question_gets_one_more_attempt_then_fails_as_no_answer(
        fake: FakeProvider) -> None:
    replies = iter([_call("read_file", '{"path": "notes.txt"}', 1), _say("What does notes.txt say?"),
                    _say("What does notes.txt say?")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What does notes.txt say?"), fake.base_url, None)
    assert state.status == "failed" and state.error is not None and state.error.type == "no_answer"
    assert "repeats the question" in (state.reason or "") and len(fake.requests) == 3
    last = fake.requests[-1]["messages"]
    assert [m["role"] for m in last] == ["user"] and "Remember to rotate your logs." in last[0]["content"]
    assert state.messages[-1].content == "What does notes.txt say?"  # the reply is kept for the person


def test_a_no_answer_that_the_last_attempt_answers_is_taken(fake: FakeProvider) -> None:
    replies = iter([_call("read_file", '{"path": "notes.txt"}', 1), _say("What does notes.txt say?"),
                    _say("It says to rotate the logs.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What does notes.txt say?"), fake.base_url, None)
    assert state.status == "completed" and state.answer == "It says to rotate the logs."


def test_path_choices_limits_read_file_to_the_listed_files(fake: FakeProvider) -> None:
    _play(fake, [_call("read_file", '{"path": "notes.txt"}', 1)])
    state = drive(_run(fake, steering=["listing_in_prompt", "path_choices"]), fake.base_url, None)
    assert state.status == "completed"
    for request in fake.requests:
        tools = {t["function"]["name"]: t["function"]["parameters"] for t in request["tools"]}
        assert tools["read_file"]["properties"]["path"]["enum"] == ["access.log", "errors.log", "notes.txt"]
        assert "enum" not in tools["delete_file"]["properties"]["path"]


def test_without_the_listing_path_choices_leaves_the_schemas_alone(fake: FakeProvider) -> None:
    _play(fake, [_call("read_file", '{"path": "notes.txt"}', 1)])
    drive(_run(fake, steering=["path_choices"]), fake.base_url, None)
    assert all("enum" not in t["function"]["parameters"]["properties"].get("path", {})
               for r in fake.requests for t in r["tools"])


def test_a_question_about_the_files_is_answered_from_a_repeated_listing_without_a_nudge(fake: FakeProvider) -> None:
    _play(fake, [_call("list_files", turn=1), _call("list_files", turn=2)])
    state = drive(_run(fake, prompt="How many files are in this folder, counting subfolders?", answer_on_stall=True,
                       steering=["evidence_first", "answer_check"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == "Done."
    assert [r.get("tool_choice") for r in fake.requests] == ["auto", "auto", "none"]
    assert not any(m.get("name") == "runner" and m["content"].startswith(texts.NUDGE[:40])
                   for m in fake.requests[-1]["messages"])


def test_a_manifest_model_at_a_base_url_gets_its_manifest_policies() -> None:
    from runner import models
    from runner.request import RunRequest
    from runner.start import prepare

    entry = models.entry_for("qwen2.5-coder-1.5b-instruct")
    assert entry is not None
    for name in (entry.name, entry.filename.removesuffix(".gguf")):  # as runner serve names it
        config = prepare(RunRequest(prompt="hi", base_url="http://127.0.0.1:9/v1", model=name)).state.config
        assert policies.active(config) == [p for p in policies.active_for_entry(entry) if p != "untagged_calls"]
    other = prepare(RunRequest(prompt="hi", base_url="http://127.0.0.1:9/v1", model="gpt-x")).state.config
    assert policies.active(other) == ["corrective_retries"]  # runner run's own default, model or not


def test_answer_check_asks_for_an_answer_in_words_when_the_reply_copies_a_file(fake: FakeProvider) -> None:
    line = "2026-09-06T09:13:44Z ERROR worker 7: job 8830 timed out after 30000 ms"
    replies = iter([_call("read_file", '{"path": "errors.log"}', 1), _say(line), _say("Job 8830 timed out.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="Which job timed out?", steering=["answer_check"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == "Job 8830 timed out."
    review = fake.requests[2]
    assert review["messages"][-1]["content"] == (
        "Your reply copied lines of a file instead of answering. Answer my question in one short sentence, in your "
        "own words: Which job timed out?")
    assert review["tool_choice"] == "none"


def test_an_answer_from_a_file_that_does_not_mention_the_question_is_sent_to_the_unread_ones(
        fake: FakeProvider) -> None:
    replies = iter([_call("read_file", '{"path": "access.log"}', 1), _say("Nothing needs rotating."),
                    _call("read_file", '{"path": "notes.txt"}', 2), _say("The logs.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What should I rotate?", steering=["answer_check", "listing_in_prompt",
                                                                     "path_choices"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == "The logs."
    review = fake.requests[2]
    assert review["messages"][-1]["content"] == (
        "The files you read (access.log) do not mention rotate, so your answer cannot come from them. Files you have "
        "not read: errors.log, notes.txt. Read the file most likely to hold the answer, then answer my question in "
        "one short sentence: What should I rotate?")
    assert review["tool_choice"] == "required"
    # the prompt's tools stay as they were (its cached prefix holds); only the call is narrowed
    assert all(r["tools"] == fake.requests[0]["tools"] for r in fake.requests)
    paths = [t["function"]["parameters"]["properties"]["path"]["enum"] for r in fake.requests
             for t in r["tools"] if t["function"]["name"] == "read_file"]
    assert paths == [["access.log", "errors.log", "notes.txt"]] * 4
    assert [r.get("grammar_tools") is not None for r in fake.requests] == [False, False, True, False]
    assert [t["function"]["name"] for t in review["grammar_tools"]] == ["read_file"]
    assert review["grammar_tools"][0]["function"]["parameters"]["properties"]["path"]["enum"] == [
        "errors.log", "notes.txt"]


def test_related_first_reads_on_while_the_files_read_hold_no_word_of_the_question(fake: FakeProvider) -> None:
    replies = iter([_call("read_file", '{"path": "access.log"}', 1), _call("read_file", '{"path": "notes.txt"}', 2),
                    _say("The logs.")])
    fake.handler = lambda body: next(replies)
    steering = ["related_first", "answer_check", "listing_in_prompt", "path_choices"]
    state = drive(_run(fake, prompt="What should I rotate?", steering=steering, max_turns=8), fake.base_url, None)
    assert state.status == "completed" and state.answer == "The logs." and len(fake.requests) == 3
    # after access.log (no word of the question) the model must read on, and only an unread file;
    # once notes.txt (which says "rotate") was read, it may answer
    assert [r["tool_choice"] for r in fake.requests] == ["auto", "required", "auto"]
    assert [r.get("grammar_tools") is not None for r in fake.requests] == [False, True, False]
    assert fake.requests[1]["grammar_tools"][0]["function"]["parameters"]["properties"]["path"]["enum"] == [
        "errors.log", "notes.txt"]
    assert all(m.get("name") != "runner" for m in fake.requests[-1]["messages"])  # no review was needed


def test_related_first_leaves_the_last_turn_to_answer(fake: FakeProvider) -> None:
    replies = iter([_call("read_file", '{"path": "access.log"}', 1), _say("Nothing.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What should I rotate?", steering=["related_first", "listing_in_prompt",
                                                                      "path_choices"], max_turns=2),
                  fake.base_url, None)
    assert state.answer == "Nothing." and [r["tool_choice"] for r in fake.requests] == ["auto", "auto"]


def test_an_answer_resting_on_a_line_that_does_not_mention_the_question_is_sent_back_once(
        fake: FakeProvider) -> None:
    replies = iter([_call("read_file", '{"path": "errors.log"}', 1), _say("The backup took 30000 ms."),
                    _say("The files do not say how long the backup took.")])
    fake.handler = lambda body: next(replies)
    steering = ["answer_check", "unlinked_answers", "listing_in_prompt", "path_choices"]
    state = drive(_run(fake, prompt="How long did the disk backup take?", steering=steering), fake.base_url, None)
    assert state.status == "completed" and state.answer == "The files do not say how long the backup took."
    review = fake.requests[2]  # errors.log mentions the disk, but not on the line the answer rests on
    assert review["messages"][-1]["content"] == (
        "Your answer rests on a line that does not mention long or disk or backup or take: `2026-09-06T09:13:44Z "
        "ERROR worker 7: job 8830 timed out after 30000 ms` (errors.log). Files you have not read: access.log, "
        "notes.txt. Read the one most likely to hold the answer. If no file answers my question, reply exactly: The "
        "files do not say. Otherwise answer it in one short sentence from the line that does: How long did the disk "
        "backup take?")
    assert review["tool_choice"] == "auto"


@pytest.mark.parametrize(("prompt", "reply", "sent_back"), [
    ("How long did the worker 7 job take?", "It timed out after 30000 ms.", False),  # the line names worker and job
    ("How long did the nightly backup take?", "The backup took 30000 ms.", True),
    ("How many errors mention the scheduler?", "412 of them.", False),  # a count may be on no line
    ("What was the last warning?", "Disk at 91%.", False),  # which line is asked by its place
    ("How long did the nightly backup take?", "It took long.", False),  # nothing of its own found on a line
])
def test_unlinked_answers_weigh_only_what_the_answer_adds(fake: FakeProvider, prompt: str, reply: str,
                                                          sent_back: bool) -> None:
    replies = iter([_call("read_file", '{"path": "errors.log"}', 1), _say(reply), _say("Done.")])
    fake.handler = lambda body: next(replies)
    steering = ["answer_check", "unlinked_answers"]
    state = drive(_run(fake, prompt=prompt, steering=steering), fake.base_url, None)
    assert (state.answer == "Done.") is sent_back
    without = iter([_call("read_file", '{"path": "errors.log"}', 1), _say(reply), _say("Done.")])
    fake.handler = lambda body: next(without)
    assert drive(_run(fake, prompt=prompt, steering=["answer_check"]), fake.base_url, None).answer == reply


def test_a_question_that_names_the_file_read_is_answered_from_it(fake: FakeProvider) -> None:
    replies = iter([_call("read_file", '{"path": "access.log"}', 1), _say("Three requests.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What is the last event in access.log?", steering=["answer_check"]),
                  fake.base_url, None)
    assert state.status == "completed" and state.answer == "Three requests." and len(fake.requests) == 2


def test_every_harness_message_carries_its_kind_and_policy_and_none_is_sent_to_the_model(fake: FakeProvider) -> None:
    """Reviews are found again by their note, not their words: a review whose text a later
    version reworded still counts as sent, and the note never reaches the provider."""
    replies = iter([_call("read_file", '{"path": "errors.log"}', 1), _say("What does errors.log say?"),
                    _say("Job 8830 timed out after 30000 ms.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="Which job timed out?", steering=["answer_check"]), fake.base_url, None)
    notes = [m.harness for m in state.messages if m.harness is not None]
    assert len(notes) == len([m for m in state.messages if m.name == "runner"])
    assert notes and all(n.kind == "review" and n.policy == "answer_check" for n in notes)
    assert notes[0].detail == "restated" and notes[0].tool_choice == "none"
    assert all("harness" not in m for body in fake.requests for m in body["messages"])
    reworded = state.model_copy(deep=True)
    reworded.messages[-2].content = "Some other wording of the same review."
    reworded.messages.pop()
    reworded.messages.append(reworded.messages[-2].model_copy(update={"harness": None, "name": None,
                                                                      "role": "assistant",
                                                                      "content": "What does errors.log say?"}))
    assert policies.view(reworded).sent("review", "restated", since_read=True)
    loaded = type(state).model_validate_json(state.model_dump_json())
    assert [m.harness for m in loaded.messages] == [m.harness for m in state.messages]


@pytest.mark.parametrize(("prompt", "steering", "reply", "answer", "review", "choice"), [
    ("Which log mentions a timeout?", ["answer_check"], "Yes, a timeout is mentioned.",
     "errors.log mentions a timeout.",
     "Your answer names no file. My question: Which log mentions a timeout?\nOf the files you have read "
     "(errors.log), errors.log mentions timeout. Reply with one short sentence that starts with the file's name.",
     "auto"),
    ("How long did job 8830 run before it timed out?", ["answer_check", "listing_in_prompt"],
     "The job ran for 423 bytes.", "It ran for 30000 ms.",
     "Your answer gives 423 bytes, the size of errors.log in the folder's listing, not something a file says. "
     "Answer my question from what the files say, in one short sentence: How long did job 8830 run before it "
     "timed out?", "auto"),
    ("Which job timed out?", ["answer_check"], "Job `9931` timed out.", 'Job "8830" timed out.',  # quoted, and said
     "Nothing you read says `9931`. Answer my question in one short sentence from what the files say, or say that "
     "the information is not in the files: Which job timed out?", "auto"),
    ("Which worker timed out?", ["answer_check"], "The worker in Region A timed out.",
     "Worker 7 timed out on Monday, UTC, 30 degrees Celsius, the ERROR line says.",  # a weekday, a unit or
     # a time zone may come from a value; ERROR is in the file
     "Nothing you read says `Region A`. Answer my question in one short sentence from what the files say, or say "
     "that the information is not in the files: Which worker timed out?", "auto"),
    ("Which job timed out, and after how long?", ["answer_check"], "Job [job id] timed out after <the duration>.",
     "Job 8830 timed out after 30000 ms, see [the log](errors.log) <br>.",  # a link, a tag: no blanks
     "Your answer leaves blanks to fill ([job id], <the duration>): it is a template, not an answer. Read the file that "
     "holds what goes there if you have not, then answer my question in one short sentence: Which job timed out, "
     "and after how long?", "auto"),
])
def test_an_answer_that_names_no_file_gives_a_listed_size_or_quotes_what_no_file_says_is_reviewed(
        fake: FakeProvider, prompt: str, steering: list[str], reply: str, answer: str, review: str, choice: str) -> None:
    replies = iter([_call("read_file", '{"path": "errors.log"}', 1), _say(reply), _say(answer)])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt=prompt, steering=steering), fake.base_url, None)
    assert state.status == "completed" and state.answer == answer
    assert fake.requests[2]["messages"][-1]["content"] == review
    assert fake.requests[2]["tool_choice"] == choice


@pytest.mark.parametrize("reply", ["Per `read_file`, the queue depth is 412.",
                                   'The "errors.log" line says the queue depth is 412.',
                                   "The queue depth is 412\nThis is what the log says."])  # a line's first word
def test_a_quoted_tool_name_or_call_argument_is_no_claim_about_the_files(fake: FakeProvider, reply: str) -> None:
    _play(fake, [_call("read_file", '{"path": "errors.log"}', 1), _say(reply)])
    state = drive(_run(fake, prompt="What is the queue depth?", steering=["answer_check"]), fake.base_url, None)
    assert state.answer == reply and state.turns == 2


def test_a_reply_in_words_between_two_same_calls_ends_the_row_the_repeat_rule_counts(fake: FakeProvider) -> None:
    """Listing twice, saying what to call (sent back: call it yourself), listing again: no three
    calls in a row, so the run goes on to its answer instead of failing."""
    replies = iter([_call("list_files", "{}", 1), _call("list_files", "{}", 2), _say("You can call list_files."),
                    _call("list_files", "{}", 3), _call("read_file", '{"path": "notes.txt"}', 4),
                    _say("Rotate the logs.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What should I rotate?", steering=["answer_check"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == "Rotate the logs."
    assert [r.signature for r in state.tool_runs].count(state.tool_runs[0].signature) == 3


def test_what_was_read_names_a_read_by_its_path_and_another_call_by_its_tool() -> None:
    from runner.state import FunctionCall, ToolCall, ToolRun, new_run

    state = new_run("q", RunConfig.model_validate({"model": "scripted/plan"}))
    calls = [("c1", "read_file", {"path": "app.log", "start_line": 1}), ("c2", "search_files", {"pattern": "quota"}),
             ("c3", "read_file", {"path": "app.log"}), ("c4", "list_files", {})]
    state.messages.append(Message(role="assistant", tool_calls=[
        ToolCall(id=i, function=FunctionCall(name=n, arguments=json.dumps(a))) for i, n, a in calls]))
    state.tool_runs += [ToolRun(call_id=i, tool_name=n, signature=i, ok=True, ms=1) for i, n, _ in calls]
    assert policies.view(state).read_labels() == ["app.log", "list_files", "search_files quota"]
    assert policies.view(state).read_labels(listings=False) == ["app.log", "search_files quota"]


def test_a_review_is_sent_again_only_after_another_file_was_read(fake: FakeProvider) -> None:
    asked = "What does notes.txt say?"
    replies = iter([_call("read_file", '{"path": "notes.txt"}', 1), _say(asked), _call("read_file", '{"path": "errors.log"}', 2),
                    _say(asked), _say(asked), _say(asked)])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt=asked, steering=["answer_check"]), fake.base_url, None)
    assert state.status == "failed" and state.error is not None and state.error.type == "no_answer"
    assert len(fake.requests) == 6  # the last of them the one fresh attempt
    reviews = [r["messages"][-1]["content"] for r in fake.requests if r["messages"][-1].get("name") == "runner"]
    assert [r.startswith("Your reply repeated my question") for r in reviews] == [True, True, False]


def test_a_read_repeated_word_for_word_does_not_earn_the_same_review_again(fake: FakeProvider) -> None:
    asked = "What does notes.txt say?"
    read = _call("read_file", '{"path": "notes.txt"}', 1)
    replies = iter([read, _say(asked), _call("read_file", '{"path": "notes.txt"}', 2), _say(asked), _say("Rotate.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt=asked, steering=["answer_check"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == "Rotate." and len(fake.requests) == 5
    reviews = [r["messages"][-1]["content"] for r in fake.requests if r["messages"][-1].get("name") == "runner"]
    assert [r.startswith("Your reply repeated my question") for r in reviews] == [True, False]


def test_listing_extremes_names_the_largest_and_smallest_file_for_a_question_about_sizes(fake: FakeProvider) -> None:
    _play(fake, [_call("read_file", '{"path": "notes.txt"}', 1)])
    steering = ["listing_in_prompt", "listing_extremes", "path_choices"]
    state = drive(_run(fake, prompt="Which file is the largest?", steering=steering), fake.base_url, None)
    system = fake.requests[0]["messages"][0]["content"]
    assert system.endswith("The folder holds 3 files (path and size in bytes):\naccess.log (195 bytes)\n"
                           "errors.log (423 bytes)\nnotes.txt (30 bytes)\nOf these, the largest is errors.log, "
                           "423 bytes; the smallest is notes.txt, 30 bytes.")
    assert policies.view(state).unread == ["access.log", "errors.log"]
    read_file = next(t for t in fake.requests[0]["tools"] if t["function"]["name"] == "read_file")
    assert read_file["function"]["parameters"]["properties"]["path"]["enum"] == ["access.log", "errors.log", "notes.txt"]
    other = drive(_run(fake, prompt="What is the largest job number?", steering=steering), fake.base_url, None)
    assert other.messages[0].content and other.messages[0].content.endswith("notes.txt (30 bytes)")


def test_an_answer_naming_another_file_than_the_largest_is_reviewed_with_the_listing(fake: FakeProvider) -> None:
    replies = iter([_call("read_file", '{"path": "notes.txt"}', 1), _say("The largest file is notes.txt, 30 bytes."),
                    _say("The largest file is errors.log.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="Which file is the largest?", steering=["listing_in_prompt", "answer_check"]),
                  fake.base_url, None)
    assert state.status == "completed" and state.answer == "The largest file is errors.log."
    assert fake.requests[2]["messages"][-1]["content"] == (
        "By the folder's listing, the largest file is errors.log (423 bytes), and your answer names notes.txt. "
        "Answer my question in one short sentence: Which file is the largest?")
    assert fake.requests[2]["tool_choice"] == "none"


@pytest.mark.parametrize(("prompt", "reply", "steering"), [
    ("Which file is the smallest?", "The smallest file is notes.txt.", ["listing_in_prompt", "answer_check"]),
    ("Which log file is the largest?", "access.log is the largest log.", ["listing_in_prompt", "answer_check"]),
    ("Which file is the largest?", "The largest is notes.txt.", ["answer_check"]),  # no listing seen
])
def test_an_extreme_answer_is_taken_when_right_or_when_the_listing_cannot_tell(
        fake: FakeProvider, prompt: str, reply: str, steering: list[str]) -> None:
    replies = iter([_call("read_file", '{"path": "notes.txt"}', 1), _say(reply)])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt=prompt, steering=steering), fake.base_url, None)
    assert state.status == "completed" and state.answer == reply and len(fake.requests) == 2


@pytest.mark.parametrize(("prompt", "reply", "restated"), [
    ("Which note lists who attended a meeting?", "The note lists who attended a meeting.", True),
    ("Which file mentions the backup?", "The file mentions the backup.", True),
    ("Is the beta search feature turned on?", "The beta search feature is turned on.", False),  # a yes
    ("Is there a file about rotating logs?", "Yes, there is a file about rotating logs.", False),
    ("Is caching enabled?", "Caching is not enabled.", False),
    ("Is the port 8080 or 9090?", "The port is 8080.", False),  # a choice the question offers
])
def test_an_answer_that_adds_no_word_to_the_question_restates_it(prompt: str, reply: str, restated: bool) -> None:
    assert restates(reply, prompt) is restated


def test_a_question_word_written_another_way_is_still_mentioned() -> None:
    todo = "todo.md\n# to do\n- [ ] order new laptops"
    assert policies.mentions(todo, "to-do") and policies.mentions("# to-do\n", "todo")
    assert policies.mentions(todo, "laptop") and not policies.mentions("reading.md\n# reading list", "to-do")


def test_after_an_unsupported_claim_the_answer_may_be_that_it_is_not_there(fake: FakeProvider) -> None:
    replies = iter([_call("read_file", '{"path": "errors.log"}', 1), _say("It builds on `alpine:3.19`."),
                    _say("The information is not in the files.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="Which Docker base image does the project build on?",
                       steering=["listing_in_prompt", "answer_check", "abstain_check"]), fake.base_url, None)
    # reviewed once; the abstention then stands, though files are unread: the review offered it
    assert state.status == "completed" and state.answer == "The information is not in the files."
    assert len(fake.requests) == 3 and policies.view(state).unread == ["access.log", "notes.txt"]
    assert fake.requests[2]["messages"][-1]["content"].startswith("Nothing you read says `alpine:3.19`.")


def test_after_looking_again_the_request_for_the_answer_allows_the_abstention(fake: FakeProvider) -> None:
    absent = "The information is not in the files."
    replies = iter([_call("read_file", '{"path": "notes.txt"}', 1), _say(absent),
                    _call("read_file", '{"path": "notes.txt"}', 2), _say(absent)])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What is Tomas's email address?", answer_on_stall=True,
                       steering=["listing_in_prompt", "abstain_check"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == absent and len(fake.requests) == 4
    assert fake.requests[2]["messages"][-1]["content"].startswith("Before you say the information is not there")
    assert fake.requests[3]["tool_choice"] == "none"  # the same file again: a stall
    assert fake.requests[3]["messages"][-1]["content"] == (
        "Using the tool results above, answer my question in one short sentence: What is Tomas's email address? "
        "If the files do not hold the answer, say that the information is not in the files.")


def test_an_abstention_after_every_listed_file_was_read_stands(fake: FakeProvider) -> None:
    reads = [_call("read_file", f'{{"path": "{name}"}}', i) for i, name in enumerate(
        ["access.log", "errors.log", "notes.txt"], 1)]
    replies = iter([*reads, _say("The information is not in the files.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="Which Docker base image does the project build on?",
                       steering=["listing_in_prompt", "abstain_check"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == "The information is not in the files."
    assert len(fake.requests) == 4


def test_a_question_that_asks_to_read_each_file_is_sent_to_each_unread_one(fake: FakeProvider) -> None:
    replies = iter([_call("list_files", turn=1), _say("There are three files."), _call("read_file", '{"path": "notes.txt"}', 2),
                    _say("notes.txt says to rotate the logs."), _call("read_file", '{"path": "access.log"}', 3),
                    _call("read_file", '{"path": "errors.log"}', 4), _say("Read all three.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="List the files and then read each one.", steering=["answer_check"]),
                  fake.base_url, None)
    assert state.status == "completed" and state.answer == "Read all three." and state.tool_run_count == 4
    reviews = [r["messages"][-1]["content"] for r in fake.requests if r["messages"][-1].get("name") == "runner"]
    assert reviews == [
        "My question asks you to read each file, and you have not read access.log, errors.log, notes.txt yet. Read "
        "them, then answer my question: List the files and then read each one.",
        "My question asks you to read each file, and you have not read access.log, errors.log yet. Read them, then "
        "answer my question: List the files and then read each one."]


def test_a_restated_call_names_its_arguments_that_are_not_text() -> None:
    from runner.state import FunctionCall, ToolCall

    def label(args: str) -> str:
        return call_label(ToolCall(id="c", function=FunctionCall(name="list_files", arguments=args)))

    assert label('{"path": "src", "recursive": false, "max_depth": 2}') == "list_files src recursive=false max_depth=2"
    assert label("{}") == "list_files" and label("not json") == "list_files"


def test_table_rows_names_each_value_of_a_table_read_whole() -> None:
    from runner.state import FunctionCall, RunConfig, ToolCall, new_run

    def seen(path: str, text: str, steering: list[str]) -> str:
        state = new_run("q", RunConfig.model_validate({"model": "scripted/plan", "steering": steering}))
        call = ToolCall(id="c", function=FunctionCall(name="read_file", arguments=json.dumps({"path": path})))
        return policies.tool_result_text(state, call, text, signature="")

    table = "name,team\nDana Levi,design\nChen Wei,platform\n"
    assert seen("staff.csv", table, ["table_rows"]) == (
        "name,team\nDana Levi,design\nChen Wei,platform\n\nThe same rows, each value named by its column:\n"
        "name=Dana Levi; team=design\nname=Chen Wei; team=platform")
    assert seen("a.tsv", "k\tv\nx\t1\n", ["table_rows"]).endswith("\nk=x; v=1")
    assert seen("staff.csv", table, []) == table  # the policy off
    assert seen("notes.txt", table, ["table_rows"]) == table  # not a table file
    assert seen("cut.csv", "name,team\nDana Levi\n", ["table_rows"]) == "name,team\nDana Levi\n"  # ragged: as it is


def test_table_extremes_names_each_columns_highest_and_lowest_rows_for_a_comparing_question() -> None:
    from runner.state import FunctionCall, RunConfig, ToolCall, new_run

    def seen(prompt: str, path: str, text: str, steering: list[str] = ["table_extremes"]) -> str:  # noqa: B006
        state = new_run(prompt, RunConfig.model_validate({"model": "scripted/plan", "steering": steering}))
        call = ToolCall(id="c", function=FunctionCall(name="read_file", arguments=json.dumps({"path": path})))
        return policies.tool_result_text(state, call, text, signature="")

    staff = "id,name,start_year,joined\n1,Amara,2019,2019-03-01\n2,Bruno,2023,2023-01-09\n3,Chen,2017,2017-06-30\n" \
            "4,Dana,2023,2023-05-02\n"
    assert seen("Who joined most recently?", "staff.csv", staff) == staff.rstrip("\n") + (
        "\n\nThe highest and lowest value of each column of numbers or dates, over the 4 rows:\n"
        "- start_year: highest 2023 (id=2; name=Bruno; joined=2023-01-09 | id=4; name=Dana; joined=2023-05-02); "
        "lowest 2017 (id=3; name=Chen; joined=2017-06-30)\n"
        "- joined: highest 2023-05-02 (id=4; name=Dana; start_year=2023); lowest 2017-06-30 (id=3; name=Chen; "
        "start_year=2017)")
    money = "month,spent\njan,$1200\nfeb,950\nmar,1430.5\n"
    assert "- spent: highest 1430.5 (month=mar); lowest 950 (month=feb)" in seen("Which month cost the most?",
                                                                              "b.csv", money)
    assert seen("Where does Bruno work?", "staff.csv", staff) == staff  # no comparison asked
    assert seen("Which file is the largest?", "staff.csv", staff) == staff  # one about the files, not rows
    assert seen("Who joined most recently?", "staff.csv", staff, []) == staff  # the policy off
    assert seen("Who joined most recently?", "staff.txt", staff) == staff  # not a table file
    assert seen("Which is the largest?", "t.csv", "name,kind\na,x\nb,y\n") == "name,kind\na,x\nb,y\n"  # no numbers
    same = "name,n\na,1\nb,1\n"
    assert seen("Which has the most?", "t.csv", same) == same  # one value throughout: nothing to compare
    lent = "tool,lent_to,lent_on\ndrill,,\nsaw,Ravi,2025-10-14\njack,,\nsander,Agnes,2026-01-09\n"
    assert seen("Who borrowed a tool most recently?", "t.csv", lent).endswith(  # blank cells hold no value
        "- lent_on: highest 2026-01-09 (tool=sander; lent_to=Agnes); lowest 2025-10-14 (tool=saw; lent_to=Ravi)")
    both = seen("Which month cost the most?", "b.csv", money, ["table_rows", "table_extremes"])
    assert "\nmonth=mar; spent=1430.5\n" in both and both.endswith("- spent: highest 1430.5 (month=mar); lowest 950 "
                                                                   "(month=feb)")  # each reads the table itself


def test_the_listing_in_the_prompt_leaves_out_what_the_folder_tools_leave_out(tmp_path: Path) -> None:
    """Runner's own runs directory (its `.gitignore` ignores everything), what the folder's
    `.gitignore` ignores and hidden files are no files of the user's, in the prompt as in list_files."""
    (tmp_path / "notes.md").write_text("hello\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("print(1)\n")
    (tmp_path / "runs" / "20261204-1").mkdir(parents=True)
    (tmp_path / "runs" / ".gitignore").write_text("*\n")
    (tmp_path / "runs" / "20261204-1" / "state.json").write_text("{}" * 500)
    (tmp_path / ".gitignore").write_text("*.tmp\n")
    (tmp_path / "scratch.tmp").write_text("x")
    (tmp_path / ".env").write_text("KEY=1\n")
    assert policies.folder_listing(tmp_path, extremes=True) == (
        "notes.md (6 bytes)\nsrc/app.py (9 bytes)\n"
        "Of these, the largest is src/app.py, 9 bytes; the smallest is notes.md, 6 bytes.")


def test_runner_run_on_ones_own_folder_sends_what_the_manifest_policies_add(fake: FakeProvider, tmp_path: Path) -> None:
    """`runner run` with a manifest model gets its policies as the suite's runs do: the folder's
    listing in the system prompt from the first request on, read_file limited to its files."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "inventory.csv").write_text("name,qty\nbolts,40\nbrackets,7\n")
    (folder / "notes.txt").write_text("Ask Priya.\n")
    _play(fake, [_call("read_file", '{"path": "inventory.csv"}', 1)])
    done = cli("run", "Which item has the lowest quantity?", "--base-url", fake.base_url, "--model",
               "qwen2.5-coder-1.5b-instruct", "--workspace", str(folder), runs_dir=tmp_path / "runs")
    assert done.returncode == 0, done.stderr
    first = fake.requests[0]
    assert first["messages"][0] == {"role": "system", "content": "The folder holds 2 files (path and size in bytes):\n"
                                    "inventory.csv (29 bytes)\nnotes.txt (11 bytes)"}
    read_file = next(t for t in first["tools"] if t["function"]["name"] == "read_file")
    assert read_file["function"]["parameters"]["properties"]["path"]["enum"] == ["inventory.csv", "notes.txt"]
    assert all(r["messages"][0] == first["messages"][0] for r in fake.requests)


def test_an_answer_from_a_table_is_not_sent_elsewhere_for_lacking_the_questions_words(
        fake: FakeProvider, tmp_path: Path) -> None:
    """A table's columns seldom repeat the question's words: an answer after reading one is
    taken, though staff.csv holds neither "joined" nor "recently" and notes.txt is unread."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "staff.csv").write_text("name,start_year\nChen Wei,2017\nFatima Zahra,2023\n")
    (folder / "notes.txt").write_text("Ask Priya.\n")
    replies = iter([_call("read_file", '{"path": "staff.csv"}', 1), _say("Fatima Zahra joined most recently.")])
    fake.handler = lambda body: next(replies)
    done = cli("run", "Who joined most recently?", "--base-url", fake.base_url, "--model",
               "qwen2.5-coder-1.5b-instruct", "--workspace", str(folder), "--json", runs_dir=tmp_path / "runs")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answer"] == "Fatima Zahra joined most recently." and len(fake.requests) == 2


@pytest.mark.parametrize("steering", [["repeat_results"], []])
def test_repeat_results_points_a_repeated_read_to_the_earlier_result(fake: FakeProvider, steering: list[str]) -> None:
    read = '{"path": "errors.log"}'
    _play(fake, [_call("read_file", read, 1), _call("read_file", read, 2)])
    state = drive(_run(fake, answer_on_stall=True, steering=steering), fake.base_url, None)
    assert state.status == "completed" and state.tool_run_count == 2
    first, again = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert "ERROR" in first
    if steering:
        assert again == texts.REPEATED_RESULT.format(call="read_file errors.log")
        call = next(c for m in state.messages for c in (m.tool_calls or []))
        changed = first + "one more line\n"
        assert policies.tool_result_text(state, call, changed, state.tool_runs[0].signature) == changed
    else:
        assert again == first


def test_answer_check_takes_an_abstention_once_a_file_that_could_say_was_read(fake: FakeProvider) -> None:
    abstain = "The files do not say what to rotate."
    replies = iter([_call("read_file", '{"path": "access.log"}', 1), _say(abstain),
                    _call("read_file", '{"path": "notes.txt"}', 2), _say(abstain)])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What should I rotate?", steering=["answer_check", "listing_in_prompt"]),
                  fake.base_url, None)
    assert state.status == "completed" and state.answer == abstain and len(fake.requests) == 4
    # access.log does not mention rotating, and two files were unread: not yet a reason to give up
    assert fake.requests[2]["messages"][-1]["content"].startswith(
        "The files you read (access.log) do not mention rotate, so your answer cannot come from them.")
    assert fake.requests[2]["tool_choice"] == "required"
    assert policies.non_answers(state) == []  # notes.txt mentions rotating: its "not there" stands
    replies = iter([_call("read_file", '{"path": "access.log"}', 1), _say(abstain)])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What should I rotate?", steering=["answer_check"]), fake.base_url, None)
    assert state.answer == abstain and len(fake.requests) == 6  # no listing: no file known to be unread


def test_answer_check_sends_an_abstention_before_any_read_to_the_files(fake: FakeProvider) -> None:
    replies = iter([_say("The information is not in the files."), _call("read_file", '{"path": "notes.txt"}', 1),
                    _say("The logs.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What should I rotate?", steering=["answer_check"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == "The logs."
    assert fake.requests[1]["messages"][-1]["content"].startswith("You answered before reading any file")


def test_the_local_harness_rows_end_with_each_manifest_models_whole_set(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    import sys

    from runner import models

    spec = importlib.util.spec_from_file_location("experiments", Path(__file__).parents[1] / "scripts" / "experiments.py")
    assert spec is not None and spec.loader is not None
    experiments = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "experiments", experiments)
    spec.loader.exec_module(experiments)
    stepped = {name for _, step in experiments.HARNESS_STEPS for name in step}
    for entry in models.load_manifest().models:
        assert set(policies.active_for_entry(entry)) <= stepped, entry.name


def test_a_search_that_matched_nothing_is_no_evidence(fake: FakeProvider, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("Rotate the logs on Fridays.\n")
    state = _in_folder(fake, tmp_path, "Where is the zebra?", [
        _call("search_files", '{"pattern": "zebra", "path": "notes.txt"}', 1), _say("The zebra is in the notes."),
        _call("read_file", '{"path": "notes.txt"}', 2), _say("There is no zebra.")],
        steering=["answer_check", "listing_in_prompt"])
    assert state.tool_runs[0].ok and state.status == "completed" and state.answer == "There is no zebra."
    review = fake.requests[2]["messages"][-1]["content"]
    assert review.startswith("You answered before reading any file") and "not read: notes.txt." in review


def test_a_search_that_matched_nothing_mentions_nothing_and_reads_nothing(fake: FakeProvider, tmp_path: Path) -> None:
    """Its pattern holds the question's words, not the files: after it, a "not there" from an
    unrelated file is still sent on, and a review is not sent again as if a file had been read."""
    (tmp_path / "app.log").write_text("08:00 service started\n")
    (tmp_path / "notes.md").write_text("On call in December: Ana.\n")
    state = _in_folder(fake, tmp_path, "Who is on call in December?", [
        _call("read_file", '{"path": "app.log"}', 1),
        _call("search_files", '{"pattern": "on call December", "path": "app.log"}', 2),
        _say("The on-call engineer for December is not listed."),
        _call("read_file", '{"path": "notes.md"}', 3), _say("Ana is on call in December.")],
        steering=["answer_check", "listing_in_prompt"])
    assert state.tool_runs[1].ok and state.answer == "Ana is on call in December."
    assert fake.requests[3]["messages"][-1]["content"].startswith(
        "The files you read (app.log, search_files on call December app.log) do not mention")
    assert policies.view(state).result_texts(listings=False)[0].startswith("app.log\n08:00 service started")
    assert len(policies.view(state).result_texts(listings=False)) == 2  # the two reads, not the search


def test_when_every_search_found_nothing_the_request_does_not_point_to_results(fake: FakeProvider,
                                                                               tmp_path: Path) -> None:
    from runner import catalog

    (tmp_path / "notes.txt").write_text("Rotate the logs on Fridays.\n")
    _play(fake, [_call("search_files", '{"pattern": "zebra"}', 1), _call("search_files", '{"pattern": "zebra"}', 2)])
    drive(_run(fake, prompt="Where is the zebra?", builtin_tools="folder", tools=list(catalog.FOLDER_TOOLS),
               workspace=str(tmp_path), answer_on_stall=True, answer_after_tool_turns=6), fake.base_url, None)
    assert fake.requests[-1]["tool_choice"] == "none"
    assert fake.requests[-1]["messages"][-1]["content"] == texts.ASK_WITHOUT_RESULTS.format(
        question="Where is the zebra?")


def test_a_number_no_file_read_shows_is_sent_to_the_unread_files_then_may_be_not_there(fake: FakeProvider) -> None:
    replies = iter([_call("read_file", '{"path": "notes.txt"}', 1), _say("The scheduler waited 45 minutes."),
                    _call("read_file", '{"path": "errors.log"}', 2), _say("It waited 45 minutes."),
                    _call("read_file", '{"path": "access.log"}', 3), _say("It waited 45 minutes."),
                    _say("The information is not in the files.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="How long did the scheduler wait?", max_turns=8,
                       steering=["listing_in_prompt", "answer_check"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == "The information is not in the files."
    reviews = [m.content or "" for m in state.messages if m.role == "user" and m.name == "runner"]
    # unread files left: read them (tool_choice required); every file read: it may not be there
    assert reviews[0].startswith("The files you read (notes.txt) do not mention")
    assert reviews[1] == ("No file you read gives `45 minutes`. Files you have not read: access.log. Read the file "
                          "most likely to hold the answer, then answer my question in one short sentence: How long "
                          "did the scheduler wait?")
    assert reviews[2].startswith("Nothing you read says `45 minutes`. Answer my question in one short sentence "
                                 "from what the files say, or say that the information is not in the files:")
    state.messages.append(Message(role="assistant", content="It waited 400 and then 45 of them."))
    assert unshown_figure(policies.view(state)) == "`45`"  # a word after the number shown only if it says more
    assert [r["tool_choice"] for r in fake.requests] == ["auto", "auto", "required", "auto", "required", "auto", "auto"]


@pytest.mark.parametrize("prompt, answer, reviewed", [
    ("How long did the job time out after?", "After 30000 ms.", False),  # the file shows it
    ("How many ERROR lines are there?", "There are 3.", False),  # counted: no file need show it
    ("What is the soft limit of the queue?", "The soft limit is 500.", True),
    ("What is the soft limit of the queue?", "The soft limit is 400.", False),
    # the same number written another way: a time without its seconds
    ("When did the first job time out?", "On 2026-09-06 at 09:13.", False),
    ("When did the first job time out?", "On 2026-09-06 at 09:45.", True),
])
def test_a_number_is_reviewed_only_when_no_file_shows_it_and_nothing_was_counted(
        fake: FakeProvider, prompt: str, answer: str, reviewed: bool) -> None:
    reads = [_call("read_file", f'{{"path": "{name}"}}', i) for i, name in enumerate(
        ["access.log", "errors.log", "notes.txt"], 1)]
    replies = iter([*reads, _say(answer), _say("Done.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt=prompt, steering=["listing_in_prompt", "answer_check"]), fake.base_url, None)
    assert (state.answer == "Done.") is reviewed


def test_with_one_turn_left_only_a_review_that_asks_for_the_answer_alone_is_sent(fake: FakeProvider) -> None:
    reads = [_call("read_file", f'{{"path": "{name}"}}', i) for i, name in enumerate(
        ["access.log", "errors.log", "notes.txt"], 1)]
    replies = iter([*reads, _say("The soft limit is 500."), _say("The information is not in the files.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What is the soft limit of the queue?", max_turns=5,
                       steering=["listing_in_prompt", "answer_check"]), fake.base_url, None)
    assert state.status == "completed" and state.answer == "The information is not in the files."
    assert fake.requests[-1]["tool_choice"] == "none"  # the last turn: no call could be answered
    # a review that sends the model to read (tool_choice required) needs two turns: with one, none
    replies = iter([_call("read_file", '{"path": "notes.txt"}', 1), _say("The soft limit is 500.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What is the soft limit of the queue?", max_turns=3,
                       steering=["listing_in_prompt", "answer_check"]), fake.base_url, None)
    assert state.answer == "The soft limit is 500." and state.turns == 2


def test_a_file_read_in_part_stays_unread_until_its_ranges_reach_the_end(fake: FakeProvider, tmp_path: Path) -> None:
    """Lines 1-5 of a 30-line log are no read of the log: an answer that the information is not
    there is sent back to it, named as read in part; lines 6 to the end complete it."""
    lines = [f"02:{i:02d} heartbeat ok" for i in range(29)] + ["03:10 backup finished"]
    (tmp_path / "app.log").write_text("\n".join(lines) + "\n")
    state = _in_folder(fake, tmp_path, "When did the backup finish?", [
        _call("read_file", '{"path": "app.log", "start_line": 1, "end_line": 5}', 1), _say("The files do not say."),
        _call("read_file", '{"path": "app.log", "start_line": 6}', 2), _say("The backup finished at 03:10.")],
        steering=["answer_check", "listing_in_prompt"])
    assert state.status == "completed" and state.answer == "The backup finished at 03:10."
    review = fake.requests[2]["messages"][-1]["content"]
    assert review.startswith("You have read only part of app.log. Read the rest of it")
    assert fake.requests[2]["tool_choice"] == "required"
    assert policies.view(state).unread == []


def test_a_not_there_after_one_line_of_a_file_that_mentions_the_question_is_sent_back(
        fake: FakeProvider, tmp_path: Path) -> None:
    """The line read mentions the question's words, so the files read are related; but the
    file was read in part: the answer may be in the rest. Other reviews name it as unread."""
    lines = [f"02:{i:02d} maintenance window: heartbeat ok" for i in range(29)] + ["03:10 maintenance closed by Ana"]
    (tmp_path / "ops.log").write_text("\n".join(lines) + "\n")
    (tmp_path / "notes.md").write_text("Nothing here.\n")
    state = _in_folder(fake, tmp_path, "Who closed the maintenance window?", [
        _call("read_file", '{"path": "ops.log", "start_line": 1, "end_line": 1}', 1),
        _say("The files do not say who closed the maintenance window."),
        _call("read_file", '{"path": "ops.log", "start_line": 2}', 2), _say("Ana closed the maintenance window.")],
        steering=["answer_check", "listing_in_prompt"])
    assert state.answer == "Ana closed the maintenance window." and len(fake.requests) == 4
    assert fake.requests[2]["messages"][-1]["content"].startswith("You have read only part of ops.log.")
    assert _unread(policies.view(state.model_copy(update={"messages": state.messages[:4]}))) == (
        " Files you have not read: notes.md, ops.log (read in part).")


@pytest.mark.parametrize(("ranges", "whole"), [
    ([(1, None)], True),                      # the whole file at once
    ([(1, 5)], False),                        # a head
    ([(6, None)], False),                     # the tail only
    ([(6, None), (1, 5)], True),              # both, in any order
    ([(1, 5), (7, None)], False),             # a gap at line 6
    ([(1, 10), (4, 12), (13, None)], True),   # overlapping ranges
])
def test_line_ranges_make_a_whole_read_only_when_they_join_up(ranges: list[tuple[int, int | None]],
                                                                whole: bool) -> None:
    from runner.state import FunctionCall, ToolCall, ToolRun, new_run

    state = new_run("q", RunConfig.model_validate({"model": "scripted/plan"}))
    for i, (start, through) in enumerate(ranges):
        text = "line\n" + ("" if through is None else f"[lines {start}-{through} of 30; read on with start_line={through + 1}]")
        call = ToolCall(id=f"c{i}", function=FunctionCall(name="read_file",
                                                           arguments=json.dumps({"path": "app.log", "start_line": start})))
        state.messages += [Message(role="assistant", tool_calls=[call]),
                           Message(role="tool", tool_call_id=call.id, content=text)]
        state.tool_runs.append(ToolRun(call_id=call.id, tool_name="read_file", signature=call.id, ok=True, ms=1))
    assert policies.view(state).read_whole == ({"app.log"} if whole else set())


def test_read_on_stall_asks_for_a_read_of_an_unread_file_instead_of_the_answer(fake: FakeProvider) -> None:
    """A read repeated while listed files are unread: the next request requires a call, and
    the call grammar offers read_file of the unread files only; once nothing is unread, a
    repeat asks for the answer as before."""
    read = [_call("read_file", '{"path": "notes.txt"}', i) for i in (1, 2)]
    others = [_call("read_file", '{"path": "errors.log"}', 3), _call("read_file", '{"path": "access.log"}', 4),
              _call("read_file", '{"path": "access.log"}', 5)]
    _play(fake, [*read, *others])
    steering = ["listing_in_prompt", "path_choices", "read_on_stall", "answer_check"]
    state = drive(_run(fake, prompt="When were the logs rotated?", answer_on_stall=True, steering=steering),
                  fake.base_url, None)
    assert state.status == "completed" and state.answer == "Done."
    choices = [r.get("tool_choice") for r in fake.requests]
    assert choices == ["auto", "auto", "required", "auto", "auto", "none"]
    narrowed = fake.requests[2]["grammar_tools"]
    assert [t["function"]["name"] for t in narrowed] == ["read_file"]
    assert narrowed[0]["function"]["parameters"]["properties"]["path"]["enum"] == ["access.log", "errors.log"]
    assert not any(m.get("name") == "runner" for m in fake.requests[2]["messages"])  # no words added
    _play(fake, [*read, *others])
    without = drive(_run(fake, prompt="When were the logs rotated?", answer_on_stall=True,
                         steering=[s for s in steering if s != "read_on_stall"]), fake.base_url, None)
    assert without.turns == 3  # the repeat asks for the answer at once


def test_an_answer_holding_the_chats_markup_is_sent_back_as_a_copy(fake: FakeProvider) -> None:
    pasted = "It ran for 30000 ms:\n<tool_response>\njob 8830 timed out\n</tool_response>"
    replies = iter([_call("read_file", '{"path": "errors.log"}', 1), _say(pasted), _say("It ran for 30000 ms.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="How long did job 8830 run before it timed out?", steering=["answer_check"]),
                  fake.base_url, None)
    assert state.answer == "It ran for 30000 ms." and len(fake.requests) == 3
    assert fake.requests[2]["messages"][-1]["content"].startswith("Your reply copied lines of a file")
    assert fake.requests[2]["tool_choice"] == "none"


def _unsure(text: str, close: dict[str, list[tuple[str, float]]]) -> Answer:
    """An answer with its tokens' log probabilities: one token per word, each sure of itself
    except the words of `close`, given with the likeliest tokens at their place."""
    import math

    tokens = [(w if i == 0 else " " + w) for i, w in enumerate(text.split(" "))]
    content = []
    for token in tokens:
        top = close.get(token.strip(), [(token, 0.99)])
        content.append({"token": token, "logprob": math.log(next(p for t, p in top if t == token)),
                        "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in top]})
    body = completion({"role": "assistant", "content": text})
    body.body["choices"][0]["logprobs"] = {"content": content}
    return body


@pytest.mark.parametrize(("reply", "close", "sent_back"), [
    ("The timeout is logged as ERROR.", {"ERROR.": [(" ERROR.", 0.3), (" WARN", 0.25), (" INFO", 0.2)]}, "`ERROR`"),
    ("There are 2 parts.", {"2": [(" 2", 0.4), (" 6", 0.35), (" 1", 0.1)]}, "`2`"),
    ("No, it is off.", {"No,": [("No,", 0.45), ("Yes", 0.4), ("The", 0.1)]}, "`No`"),
    # not a close call: the runner-up is another way to begin the sentence, or the same word
    ("There are 2 parts.", {"2": [(" 2", 0.4), (" {\"", 0.35)]}, None),
    ("Kim logged in first.", {"Kim": [("Kim", 0.45), (" Kim", 0.4), ("Lee", 0.1)]}, None),
    ("There are 2 parts.", {"2": [(" 2", 0.85), (" 6", 0.1)]}, None),
    ("The team meets weekly.", {"The": [("The", 0.3), ("A", 0.3)]}, None),
])
def test_confidence_check_sends_a_close_call_back_once(fake: FakeProvider, reply: str,
                                                       close: dict[str, list[tuple[str, float]]],
                                                       sent_back: str | None) -> None:
    replies = iter([_call("read_file", '{"path": "errors.log"}', 1), _unsure(reply, close), _say("The files do not say.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="How many parts are low?", steering=["answer_check", "confidence_check"]),
                  fake.base_url, None)
    assert all(r.get("logprobs") is True and r.get("top_logprobs") == policies.TOP_LOGPROBS for r in fake.requests)
    assert all("logprobs" not in m for r in fake.requests for m in r["messages"])  # kept, never sent back
    if sent_back is None:
        assert state.answer == reply and len(fake.requests) == 2
        return
    assert state.answer == "The files do not say." and len(fake.requests) == 3
    review = fake.requests[2]["messages"][-1]
    assert review["name"] == "runner" and review["content"].startswith(f"You were unsure of {sent_back} in your answer.")
    assert state.messages[-3].logprobs is not None and state.messages[-3].content == reply


def test_without_confidence_check_no_logprobs_are_asked_for(fake: FakeProvider) -> None:
    replies = iter([_call("read_file", '{"path": "errors.log"}', 1),
                    _unsure("There are 2 parts.", {"2": [(" 2", 0.4), (" 6", 0.35)]})])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="How many parts are low?", steering=["answer_check"]), fake.base_url, None)
    assert state.answer == "There are 2 parts." and not any("logprobs" in r for r in fake.requests)


@pytest.mark.parametrize("logprobs", [{"content": [{"token": "2"}]}, {"content": "2"}, [1, 2], None])
def test_log_probabilities_a_provider_garbles_are_left_out_not_a_failure(fake: FakeProvider, logprobs: Any) -> None:
    answer = _say("There are 2 parts.")
    answer.body["choices"][0]["logprobs"] = logprobs
    replies = iter([_call("read_file", '{"path": "errors.log"}', 1), answer])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="How many parts are low?", steering=["answer_check", "confidence_check"]),
                  fake.base_url, None)
    assert state.status == "completed" and state.answer == "There are 2 parts." and len(fake.requests) == 2
    assert state.messages[-1].logprobs is None


@pytest.mark.parametrize(("first", "second", "differ"), [
    ("There are 2 parts.", "The list holds 5 parts.", True),
    ("The largest file is tools.csv, 516 bytes.", "The largest file is service.log, 822 bytes.", True),
    ("Chen Wei joined most recently.", "Fatima Zahra joined most recently.", True),
    ("Yes, it is on.", "No, it is on.", True),
    ("The port is 5432.", "The files do not say.", True),
    # agreeing: the same key, more or fewer words, another unit's spelling
    ("The soldering iron is set to 340 degrees Celsius.", "The soldering iron is set to 340°C.", False),
    ("The platform team has the largest budget, 420.", "The team with the largest budget is platform.", False),
    ("The file `server-errors.log` mentions it.", 'The file "server-errors.log" mentions it.', False),
    ("The files do not say.", "Kim logged in first.", False),
])
def test_two_answers_disagree_when_each_gives_what_the_other_lacks(first: str, second: str, differ: bool) -> None:
    assert policies.disagree(first, second) is differ


def test_a_reply_that_echoes_the_question_gives_no_name_of_its_own() -> None:
    asked = "Read notes.txt and tell me what it says."
    first = "notes.txt says Priya rotates the logs."
    assert policies.disagree(first, asked)  # without the question, "Read" counts as a name
    assert not policies.disagree(first, asked, asked)
    assert policies.disagree(first, "notes.txt says Omar rotates the logs.", asked)
    assert policies.answer_keys("Dana Levi joined in 2021.", "Who joined after Dana?") == {"levi", "2021"}


@pytest.mark.parametrize(("second", "answer"), [
    ("The list holds 2 parts.", "The list holds 2 parts."),  # agreeing: the second answer is taken
    ("The list holds 5 parts.", "The files do not say."),  # disagreeing: shown both, the model decides
])
def test_second_opinion_asks_again_in_a_fresh_context(fake: FakeProvider, second: str, answer: str) -> None:
    replies = iter([_call("read_file", '{"path": "errors.log"}', 1), _say("There are 2 parts."), _say(second),
                    _say("The files do not say.")])
    fake.handler = lambda body: next(replies)
    state = _run(fake, prompt="How many parts are low?", steering=["answer_check", "second_opinion"])
    state.messages.insert(0, Message(role="system", content="You answer from the files."))
    state = drive(state, fake.base_url, None)
    assert state.status == "completed" and state.answer == answer
    asked = fake.requests[2]
    system = [{"role": "system", "content": "You answer from the files."}]
    assert asked["tool_choice"] == "none" and asked["messages"][:-1] == system
    fresh = asked["messages"][-1]["content"]
    assert fresh.startswith("Here again is what the tools returned:") and "--- read_file errors.log ---" in fresh
    assert fresh.endswith("How many parts are low?") and "There are 2 parts." not in fresh
    if answer == second:
        assert len(fake.requests) == 3
        return
    shown = fake.requests[3]
    assert shown["messages"][:-3] == system and [m["role"] for m in shown["messages"][-3:]] == ["user", "assistant", "user"]
    assert shown["messages"][-1]["content"].startswith('Another reading of the same files answered: "There are 2 parts."')
    assert shown["tool_choice"] == "none" and len(fake.requests) == 4
    # the run keeps the whole conversation, in order; the transcript says which requests left it out
    assert [m.content for m in state.messages[-5:]] == ["There are 2 parts.", fresh, second,
                                                        shown["messages"][-1]["content"], "The files do not say."]
    from runner.render import transcript_lines

    lines = transcript_lines(state, [], width=80)
    assert any(line.startswith("── runner (asks again; second_opinion, sent alone after the system prompt) ") for line in lines)
    assert "  (it restates read_file errors.log)" in lines
    assert any(line.startswith("── runner (shows both answers; second_opinion, in that fresh context) ") for line in lines)


def test_second_opinion_is_not_asked_for_an_abstention_nor_without_results(fake: FakeProvider) -> None:
    replies = iter([_call("read_file", '{"path": "errors.log"}', 1), _say("The files do not say.")])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="How many parts are low?", steering=["answer_check", "second_opinion"]),
                  fake.base_url, None)
    assert state.answer == "The files do not say." and len(fake.requests) == 2


def test_a_conversation_too_long_for_the_context_window_sends_its_earliest_results_as_a_line(
        fake: FakeProvider, tmp_path: Path) -> None:
    from runner.loop import ELIDED

    for name in ("a.log", "b.log", "c.log"):
        (tmp_path / name).write_text("".join(f"{name} line {i}: nothing happened\n" for i in range(100)))
    replies = iter([_call("read_file", json.dumps({"path": name}), turn) for turn, name in
                    enumerate(("a.log", "b.log", "c.log"))] + [_say("Nothing happened.")])

    def answer(body: dict[str, Any]) -> Answer:
        if sum(len(m.get("content") or "") for m in body["messages"]) > 9_000:
            return error(400, "the prompt has 5,283 tokens, more than the 4,096 of the context window",
                         "invalid_request_error", code="context_length_exceeded")
        return next(replies)

    fake.handler = answer
    state = drive(_run(fake, prompt="What happened?", builtin_tools="folder", tools=["read_file"],
                       workspace=str(tmp_path)), fake.base_url, None)
    assert state.status == "completed" and state.answer == "Nothing happened." and state.elided_results == 1
    refused, fitted = fake.requests[-2:]
    assert [m["role"] for m in refused["messages"]] == [m["role"] for m in fitted["messages"]]
    kept = [m["content"] for m in fitted["messages"] if m["role"] == "tool"]
    assert kept[0] == ELIDED.format(tool="read_file", chars=len((tmp_path / "a.log").read_text()))
    assert kept[1:] == [(tmp_path / n).read_text() for n in ("b.log", "c.log")]  # the latest are sent whole
    assert next(m.content for m in state.messages if m.role == "tool") == (tmp_path / "a.log").read_text()
    from runner.render import transcript_lines

    shown = " ".join(transcript_lines(state, [], width=80))
    assert "its 1 earliest tool result went as one line each in later requests" in shown

    fake.handler = lambda body: error(400, "maximum context length exceeded", "invalid_request_error",
                                      code="context_length_exceeded")
    hopeless = drive(_run(fake, prompt="What happened?"), fake.base_url, None)
    assert hopeless.status == "failed" and hopeless.error is not None and hopeless.error.type == "context_overflow"


@pytest.mark.parametrize("then", ["answers", "asks again"])
def test_a_call_the_user_declined_is_not_put_to_them_again(fake: FakeProvider, then: str) -> None:
    from runner import loop

    delete = '{"path": "access.log"}'
    replies = iter([_call("delete_file", delete, 1), _call("delete_file", delete, 2),
                    _say("I left access.log alone.") if then == "answers" else _call("delete_file", delete, 3)])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="Free some space.", tools=["delete_file"]), fake.base_url, None)
    assert state.status == "interrupted" and state.interruption is not None
    loop.reject(state, state.interruption.call_id, "keep it for the audit")  # type: ignore[union-attr]
    state = drive(state, fake.base_url, None)
    results = [m.content for m in state.messages if m.role == "tool"]
    assert results[1] == loop.DECLINED_BEFORE.format(reason="keep it for the audit")  # not asked again
    if then == "answers":
        assert state.status == "completed" and state.answer == "I left access.log alone." and len(results) == 2
    else:  # declined again: the same failure twice in a row ends the run
        assert state.status == "failed" and state.error is not None and state.error.type == "repeated_failure"
        assert results[2] == results[1]


@pytest.mark.parametrize(("asked", "about_files"), [
    ("List every file in the folder with its size.", True), ("List the files and then read each one.", True),
    ("How many files are there?", True), ("What is the first book on the reading list?", False)])
def test_a_question_about_the_files_themselves_is_told_apart(asked: str, about_files: bool) -> None:
    assert bool(policies.FOLDER_QUESTION.search(asked)) is about_files


def test_an_abstention_is_sent_back_once_a_run_not_once_a_read(fake: FakeProvider) -> None:
    no = "The information is not in the files."
    replies = iter([_call("read_file", '{"path": "errors.log"}', 1), _say(no),
                    _call("read_file", '{"path": "access.log"}', 2), _say(no)])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What is the backup password?", steering=["listing_in_prompt", "answer_check"]),
                  fake.base_url, None)
    assert state.status == "completed" and state.answer == no and len(fake.requests) == 4
    reviews = [m.harness.detail for m in state.messages if m.harness is not None]
    assert reviews == ["unrelated"]  # read another file after it, the same answer is taken


def test_a_call_written_as_text_is_sent_back_as_instructions_and_its_file_stays_unread(fake: FakeProvider) -> None:
    written = '{"name": "read_file", "arguments": {"path": "notes.txt"}}'
    replies = iter([_call("read_file", '{"path": "errors.log"}', 1), _say(written), *[_say("Rotate your logs.")] * 2])
    fake.handler = lambda body: next(replies)
    state = drive(_run(fake, prompt="What does the note ask me to do?",
                       steering=["listing_in_prompt", "answer_check"]), fake.base_url, None)
    review = next(m for m in state.messages if m.harness is not None)
    assert review.harness is not None and review.harness.detail == "instructions"
    assert "Files you have not read: access.log, notes.txt." in (review.content or "")  # not "says `name`"
