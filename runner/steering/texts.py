"""The words the harness sends: every message a policy adds, as a template, with its kind.

A message the harness adds to a run is a user message named ``runner`` that carries a
`HarnessNote` (its kind, the policy that sent it, the ``tool_choice`` its request sends); the
policies find earlier ones by that note, never by their text. Where a template speaks of the
evidence, it has two wordings: one for runner's folder tools ("the files"), one for any other
tool ("the tool results"), chosen by where the run's evidence came from.
"""

from __future__ import annotations

from runner.state import HarnessKind, HarnessNote, Message

CORRECTIVE_NAME = "runner"
"""The ``name`` of the user messages the harness writes."""

CORRECTIONS = {
    "empty_tool_calls": "Your last reply announced a tool call but held none. Call one of the tools ({tools}), "
                        "or answer my question in one short sentence.",
    "blank_content": "Your last reply was empty. Using the tool results above, answer my question in one short "
                     "sentence: {question} If you still need to look, call one of the tools ({tools}).",
    "dropped_call": "Your last reply began a tool call that was not complete (cut off, or not written as a call). "
                    "Call one of the tools ({tools}) with its arguments in full, or answer my question in one "
                    "short sentence.",
    "unparsed_tool_call": 'Your last tool call could not be read. Write it as <tool_call>{{"name": "<tool>", '
                          '"arguments": {{...}}}}</tool_call> with one of the tools ({tools}), or answer my '
                          "question in one short sentence.",
}
"""The corrective user message for each slip: what went wrong and what to do."""
ASK_FOR_ANSWER = "Using the tool results above, answer my question in one short sentence: {question}"
"""The user message of answer forcing (sent with ``tool_choice: "none"``)."""
ASK_WITHOUT_RESULTS = ("No tool call has found anything yet. Answer my question in one short sentence, or say "
                       "what kept you from finding out: {question}")
"""The request for the answer when every call so far failed or searched in vain."""
ASK_WITH_RESULTS = "Here is what the tools returned:\n\n{results}\n\nUsing only this, answer in one short sentence: {question}"
"""The user message of answer forcing with restated results."""
MAY_ABSTAIN = {
    "files": " If the files do not hold the answer, say that the information is not in the files.",
    "tools": " If the tool results do not hold the answer, say so.",
}
"""Added to the request for the answer once abstain_check has asked the model to look again."""
NUDGE = ("That call gave the same result as before. You have not yet looked inside a file: call a tool on one of "
         "the files to find the answer to my question: {question}")
"""The user message after a repeated call with `evidence_first`, before anything but a listing succeeded."""
CHECK_ABSTENTION = ("Before you say the information is not there: you have read {read}.{unread} Read the file most "
                    "likely to hold the answer, then answer my question in one short sentence: {question}")
"""The user message after an answer that says the information is not there, with `abstain_check`."""
NON_ANSWERS: dict[str, tuple[str, str]] = {
    "unread_each": ("My question asks you to read each file, and you have not read {unread_files} yet. Read them, then "
                    "answer my question: {question}", "required"),
    "unread": ("You answered before reading any file, so your answer cannot come from the files.{unread} Read the "
               "file most likely to hold the answer, then answer my question in one short sentence: {question}",
               "required"),
    "instructions": ("Do not tell me how to use the tools or what to read: call them yourself.{unread} Then answer "
                     "my question in one short sentence: {question}", "required"),
    "blanks": ("Your answer leaves blanks to fill ({blanks}): it is a template, not an answer.{unread} {fill_from} "
               "if you have not, then answer my question in one short sentence: {question}", "auto"),
    "restated": ("Your reply repeated my question instead of answering it. Here is what the tools returned:\n\n"
                 "{results}\n\nUsing only this, answer in one short sentence: {question}", "none"),
    "copied": ("Your reply copied {copy_of} instead of answering. Answer my question in one short sentence, "
               "in your own words: {question}", "none"),
    "unfinished": ("You have read only part of {file}. Read the rest of it (its last result says where to read "
                   "on) before you say the information is not there, then answer my question in one short "
                   "sentence: {question}", "required"),
    "unrelated": ("The files you read ({read}) do not mention {words}, so your answer cannot come from them.{unread} "
                  "Read the file most likely to hold the answer, then answer my question in one short sentence: "
                  "{question}", "required"),
    "unnamed": ("Your answer names no file. My question: {question}\n{seen} Reply with one short sentence that "
                "starts with the file's name.", "auto"),
    "extreme": ("By the folder's listing, the {direction} file is {file} ({size} bytes), and your answer names "
                "{named}. Answer my question in one short sentence: {question}", "none"),
    "unsupported": ("Nothing you read says {claim}.{unread}{look}Answer my question in one short sentence from what "
                    "the {evidence} say{abstain}: {question}", "auto"),
    "unshown": ("No file you read gives {claim}.{unread} Read the file most likely to hold the answer, then answer my "
                "question in one short sentence: {question}", "required"),
    "unlinked": ("Your answer rests on a line that does not mention {words}: `{line}` ({file}).{unread}{read_on} "
                 "If no file answers my question, reply exactly: The files do not say. "
                 "Otherwise answer it in one short sentence from the line that does: {question}", "auto"),
    "sizes": ("Your answer gives {size}, the size of {file} in the folder's listing, not something a file says. "
              "Answer my question from what the files say, in one short sentence: {question}", "auto"),
    "unsure": ("You were unsure of {claim} in your answer.{unread} Find the line that gives the answer (read the "
               "file that holds it if you have not) and answer my question from that line alone; if no file "
               "gives it, reply exactly: The files do not say. My question: {question}", "auto"),
}
"""With `answer_check`, per kind of non-answer: the user message sent after it, and the
``tool_choice`` of the request that carries it."""
WORDING = {
    "files": {"copy_of": "lines of a file", "fill_from": "Read the file that holds what goes there"},
    "tools": {"copy_of": "a tool result", "fill_from": "Look up what goes there"},
}
"""The words of the reviews that name the evidence: for runner's folder tools, for any other tool."""
LOOK_FURTHER = " Look up the answer first if you have not. "
"""The "unsupported" review's advice while listed files are unread."""
ABSTAIN_CLAUSE = {
    "files": ", or say that the information is not in the files",
    "tools": ", or say that they do not give it",
}
"""The "unsupported" review's leave to abstain, once nothing listed is left to read."""
SECOND_OPINION = ("Here again is what the tools returned:\n\n{results}\n\nUsing only this, answer in one short "
                  "sentence: {question}", "none")
"""second_opinion: the request for the answer again, sent in a fresh context."""
DISAGREE = ("Another reading of the same {evidence} answered: \"{claim}\". Check both answers against the text above. "
            "Reply with the answer the text supports, in one short sentence; if it supports neither, reply "
            "exactly: The {evidence} do not say.", "none")
"""second_opinion: sent after the fresh answer when it disagrees with the first."""
LAST_ATTEMPT = ("Your last reply {why}; it does not answer my question. Here is what the tools returned:\n\n"
                "{results}\n\nUsing only this, answer my question in one short sentence of your own: {question}",
                "none")
"""final_answer: one fresh request for the answer after a reply that is no answer, sent in a
fresh context (the system prompt, then this message)."""
LAST_ATTEMPT_NO_RESULTS = ("Your last reply {why}; it does not answer my question. Answer it in one short "
                           "sentence of your own, or say what kept you from finding out: {question}", "none")
"""final_answer's request when the run has no tool result to restate."""
MENTIONING = "Of the files you have read ({read}), {files} {verb} {words}."
"""The "unnamed" review's account of the files read, when some mention a word of the question."""
UNREAD = " Files you have not read: {files}."
"""Added to a review's message: the listed files the run has not read."""
UNREAD_MAX_FILES = 20
REPEATED_RESULT = "The same text as your earlier call {call} returned, shown above: nothing changed."
"""With `repeat_results`, the tool result of a call that got the same text as an earlier one."""
LISTING = "\n\nThe folder holds {count} (path and size in bytes):\n{listing}"
"""Added to the system prompt with `listing_in_prompt`."""
EXTREMES = "Of these, the largest is {large}, {large_size} bytes; the smallest is {small}, {small_size} bytes."
"""The listing's last line with `listing_extremes` (no ``(N bytes)`` in it, so it lists no file)."""
ABSTAIN = "\n\nIf the files do not hold the answer, do not guess: say that the information is not in the files."
"""Added to the system prompt with `abstain_option`."""
TABLE_ROWS = "\n\nThe same rows, each value named by its column:\n"
"""With `table_rows`, what follows a table's text in its tool result, before its named rows."""
TABLE_EXTREMES = "\n\nThe highest and lowest value of each column of numbers or dates, over the {count} rows:\n"
"""With `table_extremes`, what follows a table's text in its tool result, before a line per column."""
EXTREME_ROW = "- {column}: highest {high} ({high_rows}); lowest {low} ({low_rows})"
"""One column's line with `table_extremes`."""


def harness_message(text: str, kind: HarnessKind, policy: str, tool_choice: str | None = None,
                    detail: str | None = None, fresh: bool = False) -> Message:
    """A user message the harness adds: `text`, named `CORRECTIVE_NAME`, with its note."""
    note = HarnessNote(kind=kind, policy=policy, tool_choice=tool_choice, detail=detail, fresh=fresh)
    return Message(role="user", content=text, name=CORRECTIVE_NAME, harness=note)
