"""The engine's sampling gives the tokens plain greedy decoding gives: greedy sampling that tries
the best token against the grammar first (and keeps an untagged call's opening the grammar
allows), on the real llama.cpp server over loopback, against the grammar applied to the whole
vocabulary every token and every untagged call rewound (SmolLM2, tagged calls;
Qwen2.5-Coder-0.5B, untagged calls and the prose grammar). Speculative decoding by prompt
lookup: drafts proposed, accepted and reported."""

from __future__ import annotations

from typing import Any

import pytest

from runner import models
from runner.local import LocalServer
from tests.test_kv_every_turn import conversation
from tests.test_local_server import ALL_TOOLS, SMOL, ask, post

pytestmark = pytest.mark.llama

NAMED = {"type": "function", "function": {"name": "tail_log"}}


def requests() -> list[dict[str, Any]]:
    """Requests under each grammar: a whole-turn call, a named call, auto (free text watched for
    a call, untagged calls), none (the no-call grammar), no tools at all."""
    turn2, turn3 = conversation()
    return [
        {"messages": ask("Read notes.txt."), "tools": ALL_TOOLS, "tool_choice": "required", "max_tokens": 48},
        {"messages": ask("Show the last 20 lines of errors.log."), "tools": ALL_TOOLS, "tool_choice": NAMED,
         "max_tokens": 48},
        {"messages": turn2, "tools": ALL_TOOLS, "tool_choice": "auto", "max_tokens": 48},
        {"messages": turn3, "tools": ALL_TOOLS, "tool_choice": "none", "max_tokens": 48},
        {"messages": ask("Tell me about lighthouses."), "max_tokens": 32},
    ]


def replies(server: LocalServer) -> list[tuple[Any, Any]]:
    out = []
    for body in requests():
        reply = post(server, timeout=600, **body)
        out.append((reply["choices"], reply["usage"]["completion_tokens"]))
    return out


@pytest.mark.parametrize("model", [SMOL, "qwen2.5-coder-0.5b-instruct"])
def test_trying_the_best_token_first_gives_the_same_replies(model: str) -> None:
    path = models.pull(model)
    got = {}
    for check_first in (False, True):
        with LocalServer(path, model_name="m", prefix_cache_mb=0, grammar_check_first=check_first) as server:
            got[check_first] = replies(server)
    assert [choices for choices, _ in got[True]] == [choices for choices, _ in got[False]]
    # An untagged call's opening is no longer generated twice: fewer tokens, never more.
    assert all(new <= old for (_, new), (_, old) in zip(got[True], got[False]))
    assert any(choices[0]["message"].get("tool_calls") for choices, _ in got[True])
    assert any(choices[0]["message"].get("content") for choices, _ in got[True])


@pytest.mark.parametrize("model", [SMOL, "qwen2.5-coder-0.5b-instruct"])
def test_a_reply_ends_at_its_last_call_with_the_same_calls(model: str) -> None:
    """One call per reply allowed: the reply ends as the call's object closes. The calls, the
    content and the finish reason are those of a reply that generates the closing tag and the
    end of turn; no reply takes more tokens (a call ends one decode sooner at least)."""
    path = models.pull(model)
    got = {}
    for stop in (False, True):
        with LocalServer(path, model_name="m", prefix_cache_mb=0, stop_at_call_end=stop) as server:
            got[stop] = [post(server, timeout=600, parallel_tool_calls=False, **body) for body in requests()]
    assert [r["choices"] for r in got[True]] == [r["choices"] for r in got[False]]
    tokens = [(new["usage"]["completion_tokens"], old["usage"]["completion_tokens"],
               bool(new["choices"][0]["message"].get("tool_calls"))) for new, old in zip(got[True], got[False])]
    assert any(called for _, _, called in tokens)
    assert all(new <= old if called else new == old for new, old, called in tokens), tokens
    assert any(new < old for new, old, _ in tokens), tokens


# --- speculative decoding ---------------------------------------------------------------------


COPY = [{"role": "system", "content": "You copy text exactly."},
        {"role": "user", "content": "Copy this line exactly, nothing else: logs/archive/2026-11-30/errors.log "
                                    "logs/archive/2026-11-30/access.log logs/archive/2026-11-30/notes.txt"}]


def test_prompt_lookup_drafts_are_verified_and_counted(tmp_path: Any) -> None:
    """A reply that copies the prompt is drafted by prompt lookup: drafts are proposed and accepted,
    counted in the reply's timings, and reach the trace and `runner show` through the client."""
    from tests.conftest import cli, cli_json

    with LocalServer(models.pull(SMOL), model_name="m", prefix_cache_mb=0, draft="lookup") as server:
        reply = post(server, messages=COPY, max_tokens=48, timeout=600)
        timings = reply["runner"]
        assert 0 < timings["draft_accepted"] <= timings["draft_proposed"], timings
        assert "archive/2026-11-30" in reply["choices"][0]["message"]["content"]
        called = post(server, messages=ask("Read logs/archive/2026-11-30/errors.log."), tools=ALL_TOOLS,
                      tool_choice="required", max_tokens=64, timeout=600)
        assert called["choices"][0]["message"]["tool_calls"]  # drafting under the call grammar too
        assert called["runner"]["draft_proposed"] >= called["runner"]["draft_accepted"] >= 0
        _, run = cli_json("run", "Read logs/archive/2026-11-30/errors.log and copy its path.", "--base-url",
                          server.base_url, "--model", "m", "--tool-choice", "required", "--max-turns", "2",
                          runs_dir=tmp_path, timeout=600)
    shown = cli("show", run["run_id"], "--full", runs_dir=tmp_path).stdout
    assert "drafts accepted" in shown, shown
    events = (tmp_path / run["run_id"] / "trace.jsonl").read_text()
    assert '"draftProposed"' in events and '"draftAccepted"' in events


def test_without_drafting_the_timings_say_nothing_of_drafts(smollm2_server: LocalServer) -> None:
    reply = post(smollm2_server, messages=COPY, max_tokens=8)
    assert "draft_proposed" not in reply["runner"] and "draft_accepted" not in reply["runner"]


# --- call against text, another call against end of turn, by probability mass ----------------


def test_the_first_tokens_call_probability_is_reported_and_a_threshold_holds_the_reply_to_prose() -> None:
    """Under tool_choice auto the reply reports the probability the model gave opening a call
    (Qwen2.5-Coder-0.5B, untagged calls); a threshold above it makes the reply prose, one below
    it leaves greedy's reply; weighing another call against end of turn changes a reply only
    where it refused an end of turn."""
    import threading

    from runner.engine import ChatRequest, Engine
    from runner.local import LocalSettings, load_llama
    from runner.local_app import complete

    llama = load_llama(LocalSettings(model=models.pull("qwen2.5-coder-0.5b-instruct"), n_threads=1))
    request = ChatRequest(messages=ask("Read notes.txt."), tools=ALL_TOOLS, max_tokens=48)

    def reply(engine: Engine) -> dict[str, Any]:
        return complete(engine.stream(request, threading.Event()), "m", 0, "x")

    greedy = reply(Engine(llama, untagged_calls=True))
    probability = greedy["runner"]["call_probability"]
    assert 0.5 < probability < 1.0, greedy["runner"]
    assert greedy["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "read_file"
    held = reply(Engine(llama, untagged_calls=True, call_threshold=probability + 0.01))
    assert not held["choices"][0]["message"].get("tool_calls") and held["choices"][0]["message"]["content"]
    kept = reply(Engine(llama, untagged_calls=True, call_threshold=probability - 0.01))
    assert kept["choices"] == greedy["choices"]
    plain = reply(Engine(llama, untagged_calls=True, another_call_by_mass=False))
    assert plain["runner"]["more_calls_chosen"] == 0
    assert (plain["choices"] == greedy["choices"]) == (greedy["runner"]["more_calls_chosen"] == 0)
