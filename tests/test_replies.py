"""What a final reply is (`runner.replies.classify`): an answer, an abstention, or no answer."""

from __future__ import annotations

import pytest

from runner.replies import classify

NOTES = "Remember to rotate your logs.\nThe nightly export moved to 02:30.\nDana owns it.\nBackups run at 04:00."
LISTING = "app.log (120 bytes)\nnotes.md (88 bytes)\nconfig.yaml (301 bytes)\n"
TOOLS = ["list_files", "read_file", "search_files"]


@pytest.mark.parametrize(("question", "reply", "kind", "why"), [
    ("When does the nightly export run?", "It runs at 02:30, and Dana owns it.", "answer", None),
    ("When does the nightly export run?", "The files do not say.", "abstention", None),
    ("When does the nightly export run?", "When does the nightly export run?", "no_answer", "repeats the question"),
    ("Which note lists who attended?", "The note lists who attended.", "no_answer", "repeats the question"),
    ("Is debug mode turned on?", "Debug mode is turned on.", "answer", None),  # a yes/no question, its own words
    ("When does the nightly export run?", "", "no_answer", "is empty"),
    ("When does the nightly export run?", "<tool_response>02:30</tool_response>", "no_answer",
     "holds the chat's tool-protocol markup"),
    ("When does the nightly export run?", '{"name": "read_file", "arguments": {"path": "notes.md"}}', "no_answer",
     "writes a tool call or a tool schema as JSON"),
    ("What is in the folder?", LISTING, "no_answer", "pastes the folder's listing"),
    ("When does the nightly export run?", NOTES, "no_answer", "pastes a tool result"),
    ("When does the nightly export run?", "The notes say: The nightly export moved to 02:30.", "answer", None),
    ("Which file mentions a timeout?", "Research summary: errors.log mentions a timeout: worker 7 timed out.",
     "answer", None),  # a one-line result relayed
    ("When does the nightly export run?", "To find out, call read_file with the path notes.md.", "no_answer",
     "tells how to call the tools instead of answering"),
    ("When does the nightly export run?", "I need to read notes.md to answer.", "no_answer",
     "tells how to call the tools instead of answering"),
    ("How do I run the tests?", "You can use pytest: run `pytest tests/` from the project's folder.", "answer", None),
    ("Which tools do you have?", "list_files read_file search_files", "no_answer", "lists tool names"),
    ("hi", "Hello! How can I help you today?", "answer", None),  # small talk: a friendly reply answers it
    ("thanks, that's all", "", "no_answer", "is empty or protocol text"),
])
def test_a_reply_is_an_answer_an_abstention_or_no_answer(question: str, reply: str, kind: str, why: str | None) -> None:
    got = classify(reply, question, [NOTES], TOOLS)
    assert (got.kind, got.why) == (kind, why)
