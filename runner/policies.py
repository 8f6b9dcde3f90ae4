"""Steering: what the harness adds to a run so that a small model finishes it, as named policies.

A large hosted model needs none of this; a 0.5-1.5B local model does. Each policy is a name
(`POLICIES` says what each does) that a model's manifest entry, `runner run --policy` and
`runner suite --policy` turn on or off. The loop asks this module which ``tool_choice`` the
next request sends (`tool_choice`), which tool schemas it offers (`offered_tools`) and which,
narrower, its calls must match (`grammar_tools`), which fields it adds (`request_fields`),
what to add to the conversation before it is sent (`before_request`: the request for the
answer, a nudge), what to say after a protocol
slip (`correction`), whether to take an answer (`review_answer`), and whether a repeated call
stops the run (`answers_repeat`). What a run gets before its first turn (the folder's
listing) is added when it is made (`opening`). Every message the
harness adds is a user message named ``runner`` (`CORRECTIVE_NAME`) kept in the transcript,
and everything the policies decide is a function of the transcript, so a resumed run sends
what the killed one would have.

The policies of earlier formats were separate `RunConfig` fields (`answer_after_tool_turns`,
`answer_on_stall`, `answer_restates_results`, `parallel_tool_calls`, `on_slip`,
`Endpoint.first_turn_tool_choice`); they still are, and `active` reads them back as names.
The policies added since are listed by name in `RunConfig.steering`.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from runner.errors import UsageError
from runner.state import Message, RunConfig, RunState, ToolCall

if TYPE_CHECKING:
    from runner.state import Endpoint

CORRECTIVE_NAME = "runner"
"""The ``name`` of the user messages the harness writes."""

POLICIES: dict[str, str] = {
    "first_turn_required": ("the first request sends tool_choice \"required\": the model's first reply is a call "
                            "(a task that is only small talk, a greeting or thanks, sends \"none\", and its answer is "
                            "taken)"),
    "untagged_calls": "runner's local server reads a reply that opens with a JSON object as a call",
    "corrective_retries": "a protocol slip (an empty reply, an unreadable call) is answered with a short message "
                          "saying what went wrong, instead of the same request again",
    "answer_forcing": "after N turns of tool calls, the answer is asked for with tool_choice \"none\"",
    "answer_on_stall": "the answer is asked for as soon as a turn of calls brings nothing new, or the reply after "
                       "results is empty",
    "one_call_per_turn": "parallel_tool_calls false: at most one call per reply",
    "restate_results": "the request for the answer restates the successful tool results",
    "listing_in_prompt": "the system prompt lists the folder's files (paths and sizes) before the first turn",
    "abstain_option": "the system prompt says how to answer when the files do not hold the answer",
    "evidence_first": "the answer is asked for on a stall only once a call other than a listing succeeded; before "
                      "that a repeated call is answered with a nudge to look inside the files",
    "listing_hints": "with listing_in_prompt, each listed file says which words of the question it holds",
    "listing_extremes": "with listing_in_prompt, for a question that compares the files' sizes, the listing ends "
                        "with a sentence naming the largest and the smallest file",
    "table_rows": "a CSV or TSV file read whole is followed, in its tool result, by its rows again with each "
                  "value named by its column (name=Dana Levi; team=design)",
    "table_extremes": "for a question that compares (most, highest, latest, ...), a CSV or TSV file read whole is "
                      "followed, in its tool result, by each numeric or date column's highest and lowest value "
                      "and the rows that hold them",
    "related_first": "while the files read hold no word of the question and listed files are still unread, the "
                     "next request sends tool_choice \"required\" (with path_choices, read_file limited to the "
                     "unread files): the model reads on instead of answering from the wrong file",
    "read_on_stall": "a turn of calls that brings nothing new (a read repeated) while listed files are unread "
                     "is followed by a request with tool_choice \"required\" (with path_choices, read_file "
                     "limited to the unread files), not by the request for the answer: the model reads on "
                     "instead of answering from the one file it keeps reading",
    "unlinked_answers": "with answer_check, an answer whose own words (a number, a name the question lacks) are "
                        "found only on lines that mention nothing of the question (nor does their file's name, "
                        "section or table header) is sent back once, quoting that line: it may be that the "
                        "files do not hold the answer",
    "abstain_check": "an answer that says the information is not there is taken only after one reminder to look "
                     "in the file most likely to hold it (that request sends tool_choice \"required\"), or at once "
                     "when every listed file was read or answer_check said it may be the answer",
    "repeat_results": "a call that repeats an earlier one and gets the same text back is answered with one line "
                      "pointing to the earlier result, not the whole text again (fewer prompt tokens to evaluate)",
    "confidence_check": "with answer_check, each reply's token probabilities are asked for (runner's local "
                        "server gives them), and an answer is sent back once when a word that carries it (a "
                        "number, a name, yes or no) was a close call, the likeliest other word of its kind "
                        "at least half as likely (2 or 6, Lisbon or Oslo): the model finds the line that "
                        "gives it, or says the files do not say",
    "second_opinion": "with answer_check, an answer about to be taken is asked for again in a fresh context (the "
                      "system prompt, then the run's tool results and the question, nothing else): when the two "
                      "answers disagree (each gives a number, a name, a file or a quote the other lacks), the "
                      "model is shown both and asked which the text supports, or to say the files do not say",
    "path_choices": "with listing_in_prompt, read_file's path must be one of the listed files (an enum in its "
                    "schema: a local model's grammar then cannot name a file that does not exist)",
    "answer_check": "a reply that is no answer is taken only after one message saying so and asking again, "
                    "once per kind until another file is read. The kinds:\n"
                    "- it repeats the question, or tells how to call the tools\n"
                    "- it copies lines of a file, or the chat's own markup (<tool_response>)\n"
                    "- it comes before any file was read (the question not being about the files)\n"
                    "- it quotes, or names, what nothing read says (a name such as Region A)\n"
                    "- it gives a number no file read shows (the question counting nothing)\n"
                    "- it comes from files that mention no word of the question (a table aside)\n"
                    "- it says the information is not there while a file is read only in part\n"
                    "- it gives a listed file's size\n"
                    "- it names no file when the question asks for one\n"
                    "- it leaves blanks to fill ([region name])\n"
                    "- it leaves files unread when the question asks to read each\n"
                    "- it names a file other than the listing's largest or smallest when asked for it\n"
                    "A reply saying the information is not there is taken once a file was read that mentions "
                    "a word of the question, or every listed file. With one turn "
                    "left, only a review that asks for the answer alone is sent.",
}
"""Every policy, by name, in words."""
NEW_POLICIES = ("listing_in_prompt", "listing_hints", "listing_extremes", "abstain_option", "evidence_first",
                "table_rows", "table_extremes", "related_first", "read_on_stall", "unlinked_answers", "abstain_check",
                "path_choices", "answer_check", "repeat_results", "confidence_check", "second_opinion")
"""The policies kept by name in `RunConfig.steering` (the others are fields of their own)."""

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
"""The request for the answer when every call so far failed or searched in vain (no results to
point to)."""
ASK_WITH_RESULTS = "Here is what the tools returned:\n\n{results}\n\nUsing only this, answer in one short sentence: {question}"
"""The user message of answer forcing with restated results."""
MAY_ABSTAIN = " If the files do not hold the answer, say that the information is not in the files."
"""Added to the request for the answer once abstain_check has asked the model to look again
after it said the information is not there: having looked, it may say so again."""
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
    "blanks": ("Your answer leaves blanks to fill ({blanks}): it is a template, not an answer.{unread} Read the "
               "file that holds what goes there if you have not, then answer my question in one short sentence: "
               "{question}", "auto"),
    "restated": ("Your reply repeated my question instead of answering it. Here is what the tools returned:\n\n"
                 "{results}\n\nUsing only this, answer in one short sentence: {question}", "none"),
    "copied": ("Your reply copied lines of a file instead of answering. Answer my question in one short sentence, "
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
    "unsupported": ("Nothing you read says {claim}. If the files do not hold the answer, say that the information "
                    "is not in the files; otherwise answer my question in one short sentence from what they say: "
                    "{question}", "auto"),
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
``tool_choice`` of the request that carries it. Each is sent once, and again only after a
file was read since."""
SECOND_OPINION = ("Here again is what the tools returned:\n\n{results}\n\nUsing only this, answer in one short "
                  "sentence: {question}", "none")
"""second_opinion: the request for the answer again, sent in a fresh context (`request_messages`)."""
DISAGREE = ("Another reading of the same files answered: \"{claim}\". Check both answers against the text above. "
            "Reply with the answer the text supports, in one short sentence; if it supports neither, reply "
            "exactly: The files do not say.", "none")
"""second_opinion: sent after the fresh answer when it disagrees with the first (`disagree`)."""
MENTIONING = "Of the files you have read ({read}), {files} {verb} {words}."
"""The "unnamed" review's account of the files read, when some mention a word of the question
(else it says what was read and what was not)."""
UNREAD = " Files you have not read: {files}."
"""Added to a review's message: the listed files the run has not read (`unread_files`)."""
UNREAD_MAX_FILES = 20
ECHO_LINE_CHARS = 40
"""A tool-result line at least this long, found verbatim in a reply, makes the reply a copy (`echoes`)."""
SIZE_QUESTION = re.compile(
    r"\b(?:largest|smallest|biggest|heaviest|lightest)\b[^?]*\bfiles?\b|\bfiles?\b[^?]*\b(?:largest|smallest|biggest)\b",
    re.IGNORECASE)
"""A question that compares the files' sizes."""
WHOLE_FOLDER_EXTREME = re.compile(
    r"\b(?:which|what)\s+(?:file|one)\b[^?]*\b(largest|biggest|smallest)\b|\bthe\s+(largest|biggest|smallest)\s+file\b",
    re.IGNORECASE)
"""A question that asks for the largest or smallest of all the files, with no kind of file named
("Which file is the largest?", "What is the smallest file?")."""
YES_NO = re.compile(r"\s*(?:is|are|was|were|does|do|did|can|could|has|have|had|should|will|would)\b", re.IGNORECASE)
"""A question answered by yes or no."""
FILLER = frozenset("a an the is are was were be it its this that there here of in on to for and i my me you your "
                   "file files".split())
"""Words an answer may add to its question's and still say nothing new."""
FOLDER_QUESTION = re.compile(
    rf"\bhow many\b[^?]*\b(?:files?|folders?|director(?:y|ies))\b|{SIZE_QUESTION.pattern}"
    r"|\blist (?:the|all|every|each)\b[^?]*\bfiles?\b", re.IGNORECASE)
"""A question about the files themselves (how many, which is largest), which a listing answers."""
SMALL_TALK = re.compile(
    r"(?:\W*(?:hi|hello|hey|hiya|howdy|good (?:morning|afternoon|evening)|thanks|thank you|thx|cheers|bye|goodbye|"
    r"ok|okay|great|cool|nice|perfect|that'?s (?:all|it)|that is (?:all|it)|how are you|who are you|"
    r"what can you do|can you help(?: me)?)(?: there| again| all| everyone| so much| very much| a lot| today)?)+[\W_]*",
    re.IGNORECASE)
"""A task that is only greetings, thanks or asking what the agent is: it asks nothing of the files."""
READ_EACH = re.compile(r"\bread (?:each|every|all)\b|\bread (?:them|the files)\b", re.IGNORECASE)
"""A question that asks for every file to be read, which a listing does not answer."""
FILE_QUESTION = re.compile(
    r"\b(?:which|what)\s+(?:\w+\s+)?(?:files?|notes?|logs?|documents?|docs?|pages?|scripts?|sheets?)\b"
    r"|\bis there (?:a|an|any)\s+(?:\w+\s+)?(?:files?|notes?|logs?|documents?)\b", re.IGNORECASE)
"""A question whose answer is a file (which file mentions X, is there a file about Y)."""
BLANK = re.compile(r"\[[A-Za-z][\w .'-]{1,40}\](?!\()|<[A-Za-z]\w* [\w .'-]{1,40}>|\{[A-Za-z]\w* [\w .'-]{1,40}\}")
"""A blank of a template answer: ``[region]``, ``<total amount>``, ``{user name}`` (not a Markdown
link, nor a tag or a type such as ``<div>`` or ``List<String>``)."""
NAMED = re.compile(r"(?<![\w.'`/-])([A-Z][A-Za-z]+(?: [A-Z0-9][\w]*)*|[A-Z]{2,}\w*)")
"""A name an answer gives inside a sentence: capitalised words in a row (``Region A``, ``Dana Levi``)."""
CALENDAR = frozenset("january february march april may june july august september october november december "
                     "monday tuesday wednesday thursday friday saturday sunday "
                     "celsius fahrenheit kelvin utc gmt am pm kb mb gb tb kib mib gib hz khz mhz ghz kw kwh".split())
"""Capitalised words an answer may work out rather than copy: a month or weekday from a date
(``2026-01`` is January), a unit or time zone from a value (``temperature_c = 340`` is 340
degrees Celsius)."""
QUOTED = re.compile(r"`([^`\n]+)`|\"([^\"\n]+)\"|“([^”\n]+)”")
"""Text an answer quotes: in backticks, straight or curly double quotes."""
SIZE = re.compile(r"\b(\d+)\s*bytes?\b", re.IGNORECASE)
TOOL_VERBS = re.compile(r"\b(?:call|calling|use|using|invoke|run)\b", re.IGNORECASE)
PLANS = re.compile(r"\b(?:I|you|we) (?:need|have|will need|would need|should|can|could|must|will|would)(?: to)? "
                   r"(?:read|call|use|check|look|open|search|find|list|grep|scan|inspect)\b", re.IGNORECASE)
"""A reply that says what to read or call instead of answering."""
ABSTENTION = re.compile(
    r"\b(?:not (?:in|found|mentioned|listed|specified|provided|given|available|stated|present|included)\b"
    r"|no (?:information|mention|record|data|details?)\b"
    r"|(?:does|do|did)(?:n't| not) (?:say|mention|contain|specify|include|list|state|show)"
    r"|(?:cannot|can't|could not|couldn't|unable to) (?:find|determine|tell|locate))", re.IGNORECASE)
"""A reply that says the information is not there, as small models say it."""
LISTING = "\n\nThe folder holds {count} (path and size in bytes):\n{listing}"
"""Added to the system prompt with `listing_in_prompt` (with listing_hints, a file whose text
holds words of the question says which)."""
EXTREMES = "Of these, the largest is {large}, {large_size} bytes; the smallest is {small}, {small_size} bytes."
"""The listing's last line with `listing_extremes` (no ``(N bytes)`` in it, so it lists no file)."""
TABLE_ROWS = "\n\nThe same rows, each value named by its column:\n"
"""With `table_rows`, what follows a table's text in its tool result, before its named rows."""
TABLE_ROWS_MAX = 200
"""table_rows and table_extremes work on tables of at most this many lines (header included)."""
TABLE_EXTREMES = "\n\nThe highest and lowest value of each column of numbers or dates, over the {count} rows:\n"
"""With `table_extremes`, what follows a table's text in its tool result, before a line per column."""
EXTREME_ROW = "- {column}: highest {high} ({high_rows}); lowest {low} ({low_rows})"
"""One column's line with `table_extremes`: its extremes and the rows holding them, named by column."""
RIVAL_AT_LEAST = 0.5
"""With confidence_check, a word of the answer is a close call when the likeliest other word of
its kind had at least this share of its probability (`_unsure`)."""
TOP_LOGPROBS = 3
"""With confidence_check, the likeliest tokens asked for beside each generated one."""
ANSWER_WORDS = frozenset("yes no not on off true false enabled disabled".split())
"""Yes, no and their kin: the words that answer a yes/no question."""
CARRYING = re.compile(rf"\d[\d.,:]*\d|\d|\b[A-Z][A-Za-z]+\b|(?i:\b(?:{'|'.join(sorted(ANSWER_WORDS))})\b)")
"""The words that carry an answer: a number, a capitalised word (a name; not one of `FILLER`),
yes or no and their kin."""
WORD_ENDINGS = r"(?:s|es|e|ed|d|ing|er|ers|ion|ions)?"
"""The endings a question's word may have in a line and still count as the same word."""
SETTINGS_FILES = (".ini", ".cfg", ".conf", ".toml", ".json", ".yaml", ".yml", ".properties", ".env")
"""Files whose lines `_unlinked` weighs with the section and keys they sit under."""
ORDINALS = frozenset("first last next previous final".split())
"""Question words that say which line is meant by its place, not by what it says."""
COMPARES = re.compile(
    r"\b(?:most|least|fewest|highest|lowest|largest|smallest|biggest|greatest|maximum|minimum|max|min|"
    r"newest|oldest|latest|earliest|recent|recently|longest|shortest|cheapest|priciest|more|less|fewer|"
    r"higher|lower|larger|smaller|bigger|older|newer|cheaper|top)\b", re.IGNORECASE)
"""A question that compares values (the most, the latest, ...), which a table's extremes may answer."""
CALCULATES = re.compile(r"\bhow (?:many|much|often)\b|\b(?:number|count|total|sum|average|mean|percent(?:age)?)\b"
                        r"|\b(?:combined|altogether|difference|between)\b", re.IGNORECASE)
"""A question whose answer may be a number no file shows: one counted, added up or worked out."""
FIGURE = re.compile(r"(?<![\d.])(\d+(?:[.,:]\d+)*)(?:\s*(%|[a-z]+\b))?", re.IGNORECASE)
"""A number in text (``1.8``, ``08:05:17``, ``1,200``), with the word or % after it."""
NUMBER = re.compile(r"^[-+]?[$€£]?\d+(?:\.\d+)?%?$")
DATE = re.compile(r"^\d{4}-\d{2}(?:-\d{2})?(?:[T ]\d{2}:\d{2}(?::\d{2})?)?$")
"""Values `table_extremes` compares: numbers (a currency sign or % allowed) and ISO dates."""
REPEATED_RESULT = "The same text as your earlier call {call} returned, shown above: nothing changed."
"""With `repeat_results`, the tool result of a call that got the same text as an earlier one."""
ABSTAIN = ("\n\nIf the files do not hold the answer, do not guess: say that the information is not in the files.")
"""Added to the system prompt with `abstain_option`."""
HINT_MAX_BYTES = 200_000
"""listing_hints reads files up to this size for the question's words (larger ones get no hint)."""
STOPWORDS = frozenset("""
about above after again also among and another answer any are because been before being below between both but
can cannot could did does doing done down during each few file files folder for from had has have having here
how into its just many more most much must not now off once only other our out over own same says should
some such than that the their them then there these they this those through under until very was were what
when where which while who whom whose why will with within would you your yours
""".split())
"""Words a question holds that say nothing about which file answers it."""
LISTING_MAX_ENTRIES = 60
"""At most this many files are listed in the system prompt (a line says how many more there are)."""
RESTATED_RESULT_CHARS = 4_000
"""Each restated tool result is cut to this many characters."""
LISTING_TOOLS = frozenset({"list_files"})
"""Tools whose result lists the folder rather than showing what a file holds."""
PATH_CHOICE_TOOLS = frozenset({"read_file"})
"""Tools whose ``path`` argument `path_choices` limits to the listed files."""
TABLE_FILES = (".csv", ".tsv")
"""The file names `table_rows` and `table_extremes` read as tables, and the "unrelated" review
takes as able to answer a question whose words they do not hold."""
PROTOCOL = re.compile(r"</?tool_(?:response|call)>|<\|im_(?:start|end)\|>")
"""The chat's own markup, which no answer holds: a tool result pasted back with its tags."""
READ_STOPPED = re.compile(r"^\[lines \d+-(\d+) of \d+[^\n]*; read on with start_line=\d+\]$", re.MULTILINE)
"""The line a read of part of a file adds, saying the last line it returned."""

LISTED = re.compile(r"^(\S[^\n]*?) \((\d+) bytes\)", re.MULTILINE)
"""A file in a listing: ``path (N bytes)``, path and size."""


# --- choosing policies by name: the manifest, --policy ---

def active(config: RunConfig) -> list[str]:
    """The policies in force for a run, by name, in `POLICIES` order."""
    on = {
        "first_turn_required": config.endpoint.first_turn_tool_choice == "required",
        "untagged_calls": False,  # a property of the server (runner.local), not of the run
        "corrective_retries": config.on_slip == "corrective",
        "answer_forcing": config.answer_after_tool_turns is not None,
        "answer_on_stall": config.answer_on_stall,
        "one_call_per_turn": config.parallel_tool_calls is False,
        "restate_results": config.answer_restates_results != "never",
        **{name: name in config.steering for name in NEW_POLICIES},
    }
    return [name for name in POLICIES if on[name]]


def active_for_entry(entry: Any) -> list[str]:
    """The policies a model manifest entry (`runner.models.ModelEntry`) gives its runs, by name."""
    from runner.state import Endpoint

    config = RunConfig(endpoint=Endpoint(model=entry.name, first_turn_tool_choice=entry.first_turn_tool_choice),
                       **entry.harness_defaults())
    names = set(active(config)) | ({"untagged_calls"} if entry.untagged_calls else set())
    return [n for n in POLICIES if n in names]


def fields_for(names: Iterable[str], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `RunConfig` (and `Endpoint`) fields that turn exactly the policies `names` on:
    those listed on, every other off. Parameters (N of answer forcing, when results are
    restated) come from `defaults` (a manifest entry's `harness_defaults`), else the values
    measured best for a 1.5B model (N = 6, restated after a failed call).

    Raises:
        UsageError: a name that is no policy (one line, with the names there are).
    """
    wanted = list(names)
    unknown = [n for n in wanted if n not in POLICIES]
    if unknown:
        raise UsageError(f"unknown policy {unknown[0]!r}; {_suggestion(unknown[0])}")
    d = defaults or {}
    on = set(wanted)
    restate = d.get("answer_restates_results") or "never"
    return {
        "first_turn_tool_choice": "required" if "first_turn_required" in on else "auto",
        "on_slip": "corrective" if "corrective_retries" in on else "repeat",
        "answer_after_tool_turns": (d.get("answer_after_tool_turns") or 6) if "answer_forcing" in on else None,
        "answer_on_stall": "answer_on_stall" in on,
        "parallel_tool_calls": False if "one_call_per_turn" in on else None,
        "answer_restates_results": ((restate if restate != "never" else "after_failure")
                                    if "restate_results" in on else "never"),
        "steering": [n for n in NEW_POLICIES if n in on],
    }


def edited(current: Iterable[str], edits: Iterable[str]) -> list[str]:
    """`current` changed by `--policy` values: ``+NAME`` adds, ``-NAME`` removes, plain names
    replace the whole set (``none``: no policy).

    Raises:
        UsageError: a name that is no policy.
    """
    names = list(current)
    edits = list(edits)
    if any(e and e[0] not in "+-" for e in edits):
        names = []
    for edit in edits:
        name = edit.lstrip("+-")
        if name == "none":
            names = []
            continue
        if name not in POLICIES:
            raise UsageError(f"--policy {edit}: no such policy; {_suggestion(name)}")
        if edit.startswith("-"):
            names = [n for n in names if n != name]
        elif name not in names:
            names.append(name)
    return [n for n in POLICIES if n in names]


def _suggestion(name: str) -> str:
    """What to say after an unknown policy name: the close ones, else where they are listed (one
    each, where several were given with commas)."""
    import difflib

    if "," in name:
        return "give one name per --policy (repeat the option)"
    close = difflib.get_close_matches(name, list(POLICIES), n=3, cutoff=0.5) or [
        p for p in POLICIES if name and name in p]
    return f"did you mean {' or '.join(close)}?" if close else "runner policies lists them"


def split_fields(fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`fields_for`'s fields as (RunConfig fields, Endpoint fields)."""
    from runner.state import Endpoint

    endpoint = {k: v for k, v in fields.items() if k in Endpoint.model_fields}
    return {k: v for k, v in fields.items() if k not in endpoint}, endpoint


def with_endpoint(endpoint: Endpoint, fields: dict[str, Any]) -> Endpoint:
    return endpoint.model_copy(update=split_fields(fields)[1])


# --- what the loop asks ---

def tool_choice(state: RunState, sends_tools: bool = True) -> str | None:
    """The ``tool_choice`` the next request sends: "none" when an answer is due
    (`answer_is_due`), else the first turn's setting on turn 1, else "auto", said outright
    (some servers, llama-cpp-python's own among them, leave the tools out of the prompt
    unless it is sent); None, nothing sent, for a request without tools."""
    if not sends_tools:
        return None
    if answer_is_due(state):
        return "none"
    if (review := _review_last(state)) is not None:
        return "none" if _turns_left(state) == 1 else review
    if _read_on(state) or _read_on_stall(state):
        return "required"
    return first_turn_choice(state) if state.turns == 0 else "auto"


def first_turn_choice(state: RunState) -> str:
    """The first request's ``tool_choice``: the endpoint's, but "none" instead of "required"
    for small talk (`small_talk`), which asks for no call: answered in words, not with a listing."""
    first = state.config.endpoint.first_turn_tool_choice
    return "none" if first == "required" and small_talk(state) else first


def small_talk(state: RunState) -> bool:
    """The run's task is only small talk (`SMALL_TALK`): there is nothing to look up,
    so the first turn requires no call and its answer is not reviewed."""
    return SMALL_TALK.fullmatch(question(state)) is not None


def _read_on(state: RunState) -> bool:
    """related_first: a turn of calls just ended, the files read so far hold no word of the
    question while listed files are unread (`_unrelated`), and two turns or more are left (one
    to read, one to answer)."""
    return ("related_first" in state.config.steering and state.messages[-1].role == "tool"
            and _turns_left(state) >= 2 and _unrelated(state))


def _read_on_stall(state: RunState) -> bool:
    """read_on_stall: a turn of calls just brought nothing new (`_stalled`), listed files are
    unread, the question is not about the files themselves (the listing answers that), and two
    turns or more are left."""
    return ("read_on_stall" in state.config.steering and state.messages[-1].role == "tool"
            and _turns_left(state) >= 2 and not FOLDER_QUESTION.search(question(state))
            and _stalled(state) and bool(unread_files(state)))


def request_fields(state: RunState) -> dict[str, Any]:
    """Fields the next request adds for the policies: with confidence_check, the reply's
    token log probabilities (OpenAI's ``logprobs`` and ``top_logprobs``)."""
    return {"logprobs": True, "top_logprobs": TOP_LOGPROBS} if "confidence_check" in state.config.steering else {}


def offered_tools(state: RunState, schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``tools`` array the next request sends: `schemas` as they are, or with
    path_choices, read_file's ``path`` limited to the files the system prompt lists (when it
    lists them all). The same on every request of a run, so the prompt's cached prefix holds."""
    files = _listed_files(state)
    return _with_paths(schemas, files) if files else schemas


def grammar_tools(state: RunState, schemas: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """With path_choices, after answer_check's review of an answer from unrelated files, or
    while related_first or read_on_stall asks for another read: read_file with its ``path``
    limited to the listed files not read yet, sent as runner's ``grammar_tools`` (the call
    must match it, the prompt still shows `offered_tools`); None otherwise."""
    files = _listed_files(state)
    if not files or not (_last_is(state, NON_ANSWERS["unrelated"][0]) or _read_on(state) or _read_on_stall(state)):
        return None
    unread = set(unread_files(state))
    if not (narrower := [f for f in files if f in unread]):
        return None
    return [s for s in _with_paths(schemas, narrower) if s.get("function", {}).get("name") in PATH_CHOICE_TOOLS]


def _listed_files(state: RunState) -> list[str]:
    """With path_choices, the files the system prompt lists, when it lists them all; else []."""
    return [path for path, _ in _prompt_listing(state)] if "path_choices" in state.config.steering else []


def _prompt_listing(state: RunState) -> list[tuple[str, str]]:
    """The files the system prompt lists, with their sizes, when it lists every file of the
    folder; else []."""
    if not state.messages or state.messages[0].role != "system":
        return []
    listing = state.messages[0].content or ""
    return [] if "... and " in listing else LISTED.findall(listing)


def _with_paths(schemas: list[dict[str, Any]], files: list[str]) -> list[dict[str, Any]]:
    """`schemas` with the string ``path`` of the tools in PATH_CHOICE_TOOLS limited to `files`."""
    out = []
    for schema in schemas:
        function = schema.get("function", {})
        path = function.get("parameters", {}).get("properties", {}).get("path")
        if function.get("name") in PATH_CHOICE_TOOLS and isinstance(path, dict) and path.get("type") == "string":
            parameters = function["parameters"]
            schema = {**schema, "function": {**function, "parameters": {
                **parameters, "properties": {**parameters["properties"], "path": {**path, "enum": files}}}}}
        out.append(schema)
    return out


def tool_result_text(state: RunState, call: ToolCall, text: str, signature: str) -> str:
    """The text the model reads for a successful call's result: `text`, with table_rows
    followed by a table's rows named by column (`_table_rows`), with table_extremes by its
    columns' extremes (`_table_extremes`); with repeat_results, for a call
    that repeats an earlier successful one (the same `signature`, as its `ToolRun` has it) whose
    result read the same, one line pointing to it (`REPEATED_RESULT`)."""
    rows = _read_table(call, text) if {"table_rows", "table_extremes"} & set(state.config.steering) else None
    if rows is not None:  # both read the table as the tool gave it
        text = _table_extremes(state, rows, _table_rows(state, rows, text))
    if "repeat_results" in state.config.steering and _same_as_before(state, signature, text):
        return REPEATED_RESULT.format(call=_call_label(call))
    return text


def _same_as_before(state: RunState, signature: str, text: str) -> bool:
    """An earlier successful call with this signature got `text` (as capped) as its result."""
    from runner.tools import cap_text

    earlier = {r.call_id for r in state.tool_runs if r.ok and r.signature == signature}
    shown = cap_text(text, state.config.max_tool_result_chars)[0]
    return any(m.role == "tool" and m.tool_call_id in earlier and m.content == shown for m in state.messages)


def _table_rows(state: RunState, rows: list[list[str]], text: str) -> str:
    """With table_rows, `text` (a table read whole, whose `rows` are a header and rows of as
    many values) followed by the same rows with each value named by its column (`TABLE_ROWS`);
    else `text`."""
    if "table_rows" not in state.config.steering:
        return text
    named = ["; ".join(f"{column}={value}" for column, value in zip(rows[0], row)) for row in rows[1:]]
    return text.rstrip("\n") + TABLE_ROWS + "\n".join(named)


def _table_extremes(state: RunState, rows: list[list[str]], text: str) -> str:
    """With table_extremes and a question that compares (`COMPARES`), `text` (a table read
    whole, as `rows`) followed by a line per column of numbers or ISO dates (ids left out; blank
    cells skipped): its highest and lowest value and every row holding each, the other values
    named by column; else `text`."""
    asked = question(state)
    if "table_extremes" not in state.config.steering or not COMPARES.search(asked) or FOLDER_QUESTION.search(asked):
        return text  # a question that compares the files themselves (the largest file) is not about rows
    header, body = rows[0], rows[1:]
    lines = []
    for i, column in enumerate(header):
        values = [value for row in body if (value := row[i].strip())]  # a blank cell holds no value
        key = _comparable(column, values)
        if key is None:
            continue
        high, low = max(values, key=key), min(values, key=key)
        lines.append(EXTREME_ROW.format(column=column, high=high, low=low,
                                        high_rows=_rows_holding(header, body, i, high, key),
                                        low_rows=_rows_holding(header, body, i, low, key)))
    if not lines:
        return text
    return text.rstrip("\n") + TABLE_EXTREMES.format(count=len(body)) + "\n".join(lines)


def _comparable(column: str, values: list[str]) -> Callable[[str], Any] | None:
    """How to order a column's values: as numbers, or as ISO dates (text order); None for an id
    column, one of text, or one whose values are all the same."""
    name = column.strip().lower()
    if name == "id" or name.endswith(("_id", " id")) or len(set(values)) < 2:
        return None
    if all(NUMBER.match(v) for v in values):
        return lambda v: float(v.strip("$€£%"))
    if all(DATE.match(v) for v in values):
        return str
    return None


def _rows_holding(header: list[str], body: list[list[str]], column: int, value: str, key: Callable[[str], Any]) -> str:
    """The rows whose `column` orders equal to `value`, each as its other values named by column
    (blank ones left out)."""
    return " | ".join("; ".join(f"{h}={v}" for j, (h, v) in enumerate(zip(header, row)) if j != column and v.strip())
                      for row in body if row[column].strip() and key(row[column].strip()) == key(value))


def _read_table(call: ToolCall, text: str) -> list[list[str]] | None:
    """A CSV or TSV file's text read whole by a read tool as rows (the header first), or None
    when the call read no such file, or the text is not a table of at most `TABLE_ROWS_MAX`
    lines, each with as many values as the header (two or more)."""
    import csv

    path = (_path_of(call) or "").lower()
    if call.function.name not in PATH_CHOICE_TOOLS or not path.endswith(TABLE_FILES):
        return None
    rows = [row for row in csv.reader(text.splitlines(), delimiter="\t" if path.endswith(".tsv") else ",") if row]
    if len(rows) < 2 or len(rows) > TABLE_ROWS_MAX or len(rows[0]) < 2 or any(len(r) != len(rows[0]) for r in rows):
        return None
    return rows


def before_request(state: RunState) -> None:
    """Add what the policies in force add before the next request: the request for the answer
    when it is due, or a nudge after a repeated call (unless the harness's last message is
    still unanswered, e.g. written just before a crash). What a run gets before its first
    turn is added when it is made (`opening`)."""
    if _harness_message_last(state) or state.messages[-1].role == "assistant":
        return
    if answer_is_due(state):
        state.messages.append(Message(role="user", content=_answer_request(state), name=CORRECTIVE_NAME))
    elif _nudge_due(state):
        state.messages.append(Message(role="user", content=NUDGE.format(question=question(state)),
                                      name=CORRECTIVE_NAME))


def _turns_left(state: RunState) -> int:
    """How many more turns the run's turn cap allows (a large number without one)."""
    cap = state.config.limits.max_turns
    return 1_000_000 if cap is None else cap - state.turns


def review_answer(state: RunState) -> str | None:
    """abstain_check and answer_check: after a reply that answers (no calls), when it says the
    information is not there (abstain_check) or is no answer (answer_check, `non_answer`),
    add the message that says so and asks again, once per kind per run, and return its text
    (the run then goes on); None to take the answer. With no turn left the answer stands;
    with one, only a review that asks for the answer alone is sent (its request sends
    tool_choice "none")."""
    last = state.messages[-1]
    steering = state.config.steering
    if last.role != "assistant" or last.tool_calls or not {"abstain_check", "answer_check"} & set(steering):
        return None
    if small_talk(state):
        return None
    if _turns_left(state) < 1:
        return None
    last_turn = _turns_left(state) == 1  # a review that asks to look again needs two
    text = None
    if (asked := _afresh_at(state)) is not None:  # the second opinion is the last review a run gets
        text = _disagreement(state, asked)
    elif "abstain_check" in steering and ABSTENTION.search(last.content or ""):
        if not (last_turn or _sent(state, CHECK_ABSTENTION) or (_listed(state) and not unread_files(state))
                or _sent(state, NON_ANSWERS["unsupported"][0], since_read=True)):
            text = CHECK_ABSTENTION.format(read=", ".join(_read_labels(state)) or "nothing yet",
                                           unread=_unread(state), question=question(state))
    elif "answer_check" in steering:
        kind = next((k for k in non_answers(state) if not _sent(state, NON_ANSWERS[k][0], since_read=True)
                     and not (last_turn and NON_ANSWERS[k][1] == "required")), None)
        if kind is not None:
            results = restated_results(state) if kind == "restated" else ""
            words = [word for word, _ in question_words(question(state))]
            size, file = (_listed_size_quoted(state) if kind == "sizes" else None) or ("", "")
            _, line, linked_file = (_unlinked(state) if kind == "unlinked" else None) or ("", "", "")
            claim = ((_unsupported(state) if kind == "unsupported" else None)
                     or (_unshown_figure(state) if kind == "unshown" else None)
                     or (_unsure(state) if kind == "unsure" else None) or "")
            direction, extreme, extreme_size, named = (_wrong_extreme(state) if kind == "extreme" else None) or \
                ("", "", "", "")
            unread = unread_files(state)
            text = NON_ANSWERS[kind][0].format(
                question=question(state), unread=_unread(state, unread), results=results or "(nothing)",
                read=", ".join(_read_labels(state, listings=False)), words=" or ".join(words), line=line,
                read_on=" Read the one most likely to hold the answer." if unread else "",
                size=extreme_size or size, claim=claim,
                file=extreme or file or linked_file or (", ".join(_read_in_part(state)) if kind == "unfinished" else ""),
                unread_files=", ".join(unread),
                seen=_seen(state, unread) if kind == "unnamed" else "", direction=direction, named=named,
                blanks=", ".join(dict.fromkeys(BLANK.findall(last.content or ""))))
        elif _second_opinion_due(state):
            text = SECOND_OPINION[0].format(results=restated_results(state), question=question(state))
    if text is None:
        return None
    state.messages.append(Message(role="user", content=text, name=CORRECTIVE_NAME))
    return text


def _second_opinion_due(state: RunState) -> bool:
    """With second_opinion, an answer about to be taken (not one saying the information is not
    there) is asked for again, once, when the run has tool results to restate and two turns left."""
    return ("second_opinion" in state.config.steering and not ABSTENTION.search(state.messages[-1].content or "")
            and _turns_left(state) >= 2 and bool(restated_results(state)))


def _disagreement(state: RunState, asked: int) -> str | None:
    """After the second opinion (`SECOND_OPINION`, the message at `asked`), the message that
    shows the model its first answer when the two disagree (`disagree`), once; None to take the
    second answer."""
    first = next((m.content or "" for m in reversed(state.messages[:asked]) if m.role == "assistant"), "")
    if _sent(state, DISAGREE[0]) or _turns_left(state) < 1 or asked != len(state.messages) - 2:
        return None
    if not disagree(first, state.messages[-1].content or "", question(state)):
        return None
    return DISAGREE[0].format(claim=" ".join(first.split())[:300])


KEY_FILE = re.compile(r"[\w.-]+\.[A-Za-z][A-Za-z0-9]{0,4}\b")
"""A file's name in an answer (``station.ini``)."""
KEY_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")


def answer_keys(answer: str, asked: str = "") -> set[str]:
    """What an answer gives, in lower case: the text it quotes, the files it names, its numbers
    and the words of the names it gives (`NAMED`, but not `FILLER`, yes or no, a month, nor a
    word of the question `asked`: "Read" of a reply that echoes "Read notes.txt ...")."""
    keys = {" ".join(next(q for q in quoted if q).lower().split()) for quoted in QUOTED.findall(answer)}
    keys |= {name.lower() for name in KEY_FILE.findall(answer)}
    rest = KEY_FILE.sub(" ", QUOTED.sub(" ", answer))
    keys |= set(KEY_NUMBER.findall(rest))
    in_question = set(re.findall(r"\w+", asked.lower()))
    for name in NAMED.finditer(rest):
        words = name.group(1).lower().split()
        if words[0] not in CALENDAR:
            keys |= {w for w in words if w not in FILLER and w not in ANSWER_WORDS and w not in in_question}
    return keys


def disagree(first: str, second: str, asked: str = "") -> bool:
    """Two answers to the question `asked` disagree: each gives something (`answer_keys`) the
    other does not hold, or one opens with yes and the other with no, or only the second says
    the information is not there."""
    if ABSTENTION.search(first):
        return False
    if ABSTENTION.search(second):
        return True
    a, b = " ".join(first.lower().split()), " ".join(second.lower().split())
    opening = [re.match(r"\W*(yes|no)\b", x) for x in (a, b)]
    if opening[0] and opening[1] and opening[0].group(1) != opening[1].group(1):
        return True
    return (any(k not in b for k in answer_keys(first, asked))
            and any(k not in a for k in answer_keys(second, asked)))


def request_messages(state: RunState) -> list[Message]:
    """The messages the next request sends: the run's, or, once second_opinion asked again, a
    fresh context: the system prompt, then everything from that request on."""
    at = _afresh_at(state)
    if at is None:
        return state.messages
    return [*state.messages[:1 if state.messages[0].role == "system" else 0], *state.messages[at:]]


def _afresh_at(state: RunState) -> int | None:
    """Where second_opinion's request is in the run's messages, None before it was sent."""
    return next((i for i in range(len(state.messages) - 1, -1, -1) if starts_afresh(state.messages[i])), None)


def starts_afresh(message: Message) -> bool:
    """`message` is second_opinion's request, sent with only the system prompt before it."""
    return _made_from(message, SECOND_OPINION[0])


def _made_from(message: Message, template: str) -> bool:
    """`message` is the harness's, made from `template`."""
    return (message.role == "user" and message.name == CORRECTIVE_NAME
            and (message.content or "").startswith(_prefix(template)))


def non_answer(state: RunState) -> str | None:
    """The first kind of non-answer (a key of `NON_ANSWERS`) the model's last reply is, if any
    (`non_answers`)."""
    return next(iter(non_answers(state)), None)


def non_answers(state: RunState) -> list[str]:
    """Every kind of non-answer (keys of `NON_ANSWERS`) the model's last reply is, in the order
    they are reviewed: "unread_each", the question asks to read each file and listed files
    are unread; "unread", nothing but a listing succeeded, a tool that reads a file was
    offered and the question does not ask about the files themselves (the other kinds are
    then not looked at; a reply telling how to call the tools is "instructions" instead);
    "instructions", it names one of the run's tools and tells how to call it, or says what
    it would read; "blanks", it is a template with blanks to fill
    (`BLANK`); "restated", it repeats the question, asks one or
    adds no word of its own to it (`_adds_nothing`); "copied", it copies a tool result
    (`echoes`) or holds the chat's markup (`PROTOCOL`); "extreme", the question asks for the
    largest or smallest file and it names
    another file the system prompt lists (`_wrong_extreme`); "unsupported", it quotes text
    nothing read holds, or gives a number none shows once every file was read (`_unsupported`);
    "unrelated", none of the results it could come from mentions a word of the question
    (`question_words`) while listed files are still unread; "unfinished", it says the
    information is not there while a file the run began to read is not read to its end;
    "unshown", it gives a number no file read shows while listed files are unread
    (`_unshown_figure`); "unlinked" (with unlinked_answers), what it adds to the question is
    found only on lines that do not mention the question (`_unlinked`); "sizes", it gives a
    listed file's size; "unnamed", the question asks for a file and it names none. A reply that
    says the information is not there, once a file was read, is only "unread_each",
    "unfinished", "unrelated" (nothing read could say so) or nothing: the other kinds are about
    what an answer says (abstain_check has its own reminder)."""
    answer = (state.messages[-1].content or "").strip()
    asked = question(state)
    names = [getattr(t, "name", t) for t in state.config.tools]
    kinds = []
    if "read_file" in names and READ_EACH.search(asked) and unread_files(state):
        kinds.append("unread_each")
    instructions = (any(isinstance(n, str) and n in answer for n in names)
                    and TOOL_VERBS.search(answer) is not None) or PLANS.search(answer) is not None
    if "read_file" in names and not _has_evidence(state):
        return [*kinds, "instructions" if instructions else "unread"]
    if ABSTENTION.search(answer):  # "not there" is no answer while nothing read could say so, or a file is half read
        return kinds + ["unfinished"] * bool(_read_in_part(state)) + ["unrelated"] * _unrelated(state)
    checks: dict[str, Callable[[], bool]] = {
        "instructions": lambda: instructions,
        "blanks": lambda: BLANK.search(answer) is not None,
        "restated": lambda: answer.endswith("?") or _adds_nothing(answer, asked),
        "copied": lambda: PROTOCOL.search(answer) is not None or echoes(answer, _result_texts(state)),
        "extreme": lambda: _wrong_extreme(state) is not None,
        "unsupported": lambda: _unsupported(state) is not None,
        "unrelated": lambda: _unrelated(state),
        "unshown": lambda: bool(unread_files(state)) and _unshown_figure(state) is not None,
        "unlinked": lambda: "unlinked_answers" in state.config.steering and _unlinked(state) is not None,
        "unsure": lambda: "confidence_check" in state.config.steering and _unsure(state) is not None,
        "sizes": lambda: _listed_size_quoted(state) is not None,
        "unnamed": lambda: FILE_QUESTION.search(asked) is not None and not _names_a_file(state, answer),
    }
    return kinds + [kind for kind, check in checks.items() if check()]


def _adds_nothing(answer: str, asked: str) -> bool:
    """`answer` holds no word that its question (or `FILLER`) does not: it restates the
    question ("The note lists who attended a meeting."). A yes/no question ("Is the beta
    feature on?" "The beta feature is on.") and one that offers choices ("... 8080 or 9090?")
    are answered with their own words, so they are left out."""
    words = set(_words(asked))
    return (bool(_words(answer)) and "or" not in words and not YES_NO.match(asked)
            and all(w in words or w in FILLER for w in _words(answer)))


def _wrong_extreme(state: RunState) -> tuple[str, str, str, str] | None:
    """For a question that asks for the largest or smallest of all the files
    (`WHOLE_FOLDER_EXTREME`), when the system prompt lists every file of the folder and the
    answer names listed files but not that one: (direction, the file, its size, the files
    named); else None."""
    match = WHOLE_FOLDER_EXTREME.search(question(state))
    listed = dict(_prompt_listing(state))
    if match is None or len(listed) < 2:
        return None
    direction = next(g for g in match.groups() if g).lower()
    pick = max if direction in ("largest", "biggest") else min
    file = pick(listed, key=lambda path: (int(listed[path]), path))
    lowered = (state.messages[-1].content or "").lower()
    named = [p for p in listed if p.lower() in lowered or p.rsplit("/", 1)[-1].lower() in lowered]
    if not named or file in named:
        return None
    return direction, file, listed[file], ", ".join(named)


def _seen(state: RunState, unread: list[str]) -> str:
    """What the "unnamed" review says the run has read: `MENTIONING`, when files it read hold a
    word of the question, else the files read and those not read (`unread`)."""
    read = ", ".join(_read_labels(state, listings=False))
    return _mentioning(state, read) or f"You have read {read or 'no file'}.{_unread(state, unread)}"


def _mentioning(state: RunState, read: str) -> str:
    """`MENTIONING` for the files the run read whose text holds a word of the question, or ""."""
    words = question_words(question(state))
    ok = {r.call_id for r in state.tool_runs if r.ok}
    calls = {c.id: c for m in state.messages for c in (m.tool_calls or []) if c.id in ok}
    files: list[str] = []
    found: list[str] = []
    for m in state.messages:
        call = calls.get(m.tool_call_id or "") if m.role == "tool" else None
        path = _path_of(call) if call is not None and call.function.name not in LISTING_TOOLS else None
        hits = [w for w, stem in words if mentions((m.content or "").lower(), stem)] if path else []
        if path and hits and path not in files:
            files.append(path)
            found += [w for w in hits if w not in found]
    if not files:
        return ""
    return MENTIONING.format(read=read, files=", ".join(files), verb="mentions" if len(files) == 1 else "mention",
                             words=" and ".join(found))


def _unsupported(state: RunState) -> str | None:
    """Text the answer quotes (in backticks or quotes), or a name it gives inside a sentence
    (`NAMED`, a month or weekday aside), that no tool result, the listing, the question or the
    run's own calls (a tool's name, its arguments) hold, as `text`; or, once every listed file
    was read, a number it gives that none of them holds (`_unshown_figure`); None when there is
    none."""
    answer = state.messages[-1].content or ""
    seen = _seen_text(state) + " " + " ".join(_call_label(c).lower() for m in state.messages
                                              for c in (m.tool_calls or []))
    for quoted in QUOTED.findall(answer):
        text = " ".join(next(q for q in quoted if q).lower().split())
        if len(text) >= 3 and text not in seen:
            return f"`{text}`"
    for sentence in re.split(r"(?<=[.!?:;])\s+|\n+", QUOTED.sub("", answer)):
        for name in NAMED.finditer(sentence):
            words = name.group(1).split()
            if name.start() > 0 and words[0].lower() not in CALENDAR and " ".join(words).lower() not in seen:
                return f"`{name.group(1)}`"
    return None if unread_files(state) else _unshown_figure(state)


def _unsure(state: RunState) -> str | None:
    """The word of the answer (`CARRYING`) that was the closest call, as `word`: a token of
    it whose likeliest other token (another spelling of the same word, or a word such as
    "The" that begins the sentence another way, aside) begins a word of the same kind (a digit
    for a digit, a capital for a capital, yes for no) and had at least `RIVAL_AT_LEAST` of
    its probability. None when the reply came without token probabilities or no word was so
    close."""
    import math

    tokens = state.messages[-1].logprobs or []
    ends = list(itertools.accumulate(len(t.token) for t in tokens))
    closest: tuple[float, str] | None = None
    for word in CARRYING.finditer("".join(t.token for t in tokens)):
        if word.group()[0].isupper() and word.group().lower() in FILLER:
            continue
        for i, token in enumerate(tokens):
            if ends[i] <= word.start() or ends[i] - len(token.token) >= word.end():
                continue
            same = token.token.strip().lower()
            others = [t for t in token.top_logprobs if t.token.strip().lower() not in (same, *FILLER)]
            p = math.exp(token.logprob) + sum(math.exp(t.logprob) for t in token.top_logprobs
                                              if t.token != token.token and t.token.strip().lower() == same)
            rival = math.exp(others[0].logprob) if others and _same_kind(token.token, others[0].token) else 0.0
            if rival >= RIVAL_AT_LEAST * p and (closest is None or p < closest[0]):
                closest = (p, word.group())
    return None if closest is None else f"`{closest[1]}`"


def _same_kind(token: str, other: str) -> bool:
    """Two tokens begin words of one kind: digits, capitalised words, or yes/no and their kin."""
    a, b = token.strip(), other.strip()
    if not a or not b:
        return False
    return ((a[0].isdigit() and b[0].isdigit()) or (a[0].isupper() and b[0].isupper())
            or (a.lower() in ANSWER_WORDS and b.lower() in ANSWER_WORDS))


def _unshown_figure(state: RunState) -> str | None:
    """A number the answer gives (with the word after it, as `2 minutes`) that no tool result,
    the listing or the question holds, when the question asks for no count or sum
    (`CALCULATES`); None when there is none."""
    if CALCULATES.search(question(state)):
        return None
    shown = {form for m in FIGURE.finditer(_seen_text(state)) for form in _forms(m.group(1))}
    for m in FIGURE.finditer(state.messages[-1].content or ""):
        if _forms(m.group(1))[0] not in shown:
            unit = "" if (m.group(2) or "").lower() in FILLER else m.group(2) or ""
            return f"`{m.group(1)}{unit if unit in ('', '%') else ' ' + unit}`"
    return None


def _unlinked(state: RunState) -> tuple[str, str, str] | None:
    """The answer's own words (numbers, and words the question lacks) found only on lines of
    the files read that mention no word of the question, neither on the line nor in where it
    sits (its file's name, a settings file's section and keys, a table's header): as the
    words, the line and its file; None when the answer adds nothing such, or a line holding
    most of those words mentions the question, or the question counts, compares, orders or
    asks for a file (its answer may be on any line)."""
    asked = question(state)
    if any(p.search(asked) for p in (CALCULATES, COMPARES, FOLDER_QUESTION, FILE_QUESTION)):
        return None
    stems = [stem for _, stem in question_words(asked)]
    if not stems or any(word in ORDINALS for word in _words(asked)):
        return None
    asked_words = set(_words(asked))
    answer_words = {w for w in _words(state.messages[-1].content or "")
                    if w not in asked_words and w not in STOPWORDS and w not in FILLER
                    and (len(w) >= 3 or w.isdigit()) and not any(_word_in(w, stem) for stem in stems)}
    lines = [(path, line, f"{path} {where} {line}".lower())
             for path, text in _read_files(state) for line, where in _file_lines(path, text)]
    held = [(len(answer_words & set(_words(line))), path, line, context) for path, line, context in lines]
    most = max((n for n, *_ in held), default=0)
    if most == 0:
        return None
    best = [(path, line, context) for n, path, line, context in held if n == most]
    if any(_word_in(context, stem) for _, _, context in best for stem in stems):
        return None
    path, line, _ = best[0]
    return " ".join(sorted(answer_words & set(_words(line)))), line, path


def _word_in(text: str, stem: str) -> bool:
    """`text` (lower case) holds `stem` as a word, or with a common ending (``s``, ``ed``,
    ``ing``, ...), spaces, hyphens and underscores between its letters aside: "to-do" is in
    "# to do", "cach" in "[cache]", "port" not in "export", "toma" not in "tomato"."""
    letters = _squash(stem)
    joined = r"[\s_-]*".join(map(re.escape, letters))
    return bool(letters) and re.search(rf"(?<![a-z0-9]){joined}{WORD_ENDINGS}(?![a-z0-9])", text) is not None


def _file_lines(path: str, text: str) -> list[tuple[str, str]]:
    """A file's non-blank lines as `_unlinked` weighs them, each with where it sits: a table's
    rows after its header; in a settings file (INI, TOML, JSON, YAML, ...) the ``[section]``
    above a line and the keys that open the blocks holding it (``features``), the sections
    themselves left out; any other line alone."""
    lines = [line for line in text.splitlines() if line.strip()]
    if path.lower().endswith(TABLE_FILES):
        return [(line, lines[0]) for line in lines[1:]]
    if not path.lower().endswith(SETTINGS_FILES):
        return [(line.strip(), "") for line in lines]
    out: list[tuple[str, str]] = []
    section = ""
    parents: list[tuple[int, str]] = []  # (indent, key) of the open blocks
    for raw in lines:
        line, indent = raw.strip(), len(raw) - len(raw.lstrip())
        while parents and parents[-1][0] >= indent:
            parents.pop()
        if re.fullmatch(r"\[[^\]]+\]", line):
            section, parents = line, []
            continue
        out.append((line, " ".join([section, *(key for _, key in parents)]).strip()))
        if line.endswith(("{", "[", ":")) and (key := line.rstrip("{[:").strip().rstrip(":").strip().strip('"\'')):
            parents.append((indent, key))
    return out


def _read_files(state: RunState) -> list[tuple[str, str]]:
    """Each file a read tool read with success, as its path and the text it returned."""
    return [(path, text) for path, text, _ in _reads(state)]


def _successful_results(state: RunState) -> list[tuple[ToolCall, str]]:
    """Each call that succeeded, with the text of its tool result, in order."""
    ok = {r.call_id for r in state.tool_runs if r.ok}
    calls = {c.id: c for m in state.messages for c in (m.tool_calls or [])}
    return [(calls[m.tool_call_id], m.content or "") for m in state.messages
            if m.role == "tool" and m.tool_call_id in ok and m.tool_call_id in calls]


def _forms(figure: str) -> list[str]:
    """The ways of writing a number that `_unshown_figure` takes as the same: itself without
    thousands commas first, then, for a clock time, each run of two or three of its parts
    (``08:05:17`` gives ``08:05``). Leading zeros stay: a date's ``01`` is no ``1 hour``."""
    parts = figure.replace(",", "").split(":")
    return [":".join(parts), *(":".join(parts[i:i + n]) for n in (2, 3) for i in range(len(parts) - n + 1))]


def _seen_text(state: RunState) -> str:
    """The question, the system prompt and every tool result, lower-cased, spaces squashed."""
    return " ".join(" ".join(t.lower().split()) for t in [question(state), *(m.content or "" for m in state.messages
                                                          if m.role in ("system", "tool"))])


def _listed_size_quoted(state: RunState) -> tuple[str, str] | None:
    """The answer gives a size in bytes that a listed file has ("167 bytes", that file), the
    question not being about the files themselves; else None."""
    answer = state.messages[-1].content or ""
    if FOLDER_QUESTION.search(question(state)) or FILE_QUESTION.search(question(state)):
        return None
    sizes = {size: path for path, size in _listed(state)}
    return next(((m.group(0), sizes[m.group(1)]) for m in SIZE.finditer(answer) if m.group(1) in sizes), None)


def _names_a_file(state: RunState, answer: str) -> bool:
    """`answer` names a file the run has seen listed or has read (its path or its name);
    True too when the run knows of no file, so there is nothing to ask for."""
    paths = [path for path, _ in _listed(state)] + _read_labels(state, listings=False)
    if not paths:
        return True
    lowered = answer.lower()
    return any(p.lower() in lowered or p.rsplit("/", 1)[-1].lower() in lowered for p in paths)


def _result_texts(state: RunState, listings: bool = True) -> list[str]:
    """The text of every tool result of a call that succeeded and found something (a search
    that matched no line left out: its pattern holds the question's words, not the files; with
    `listings` False, listing tools left out too), each after its call's argument values."""
    found_nothing = _found_nothing(state)
    return [f"{_argument_text(call)}\n{text}" for call, text in _successful_results(state)
            if call.id not in found_nothing and (listings or call.function.name not in LISTING_TOOLS)]


def _unrelated(state: RunState) -> bool:
    """Files were read, none of them (nor any other result but a listing) mentions a word of
    the question, and listed files are still unread: the answer came from the wrong file.
    A question about the files themselves is answered from the listing, and one that names
    a file the run read is taken to be about that file, and one that read a table (CSV or TSV)
    may have answered from it: a table's column names seldom repeat a question's words ("who
    joined most recently" is answered by a start_year column)."""
    asked = question(state)
    stems = [stem for _, stem in question_words(asked)]
    texts = [text.lower() for text in _result_texts(state, listings=False)]
    if not stems or not texts or FOLDER_QUESTION.search(asked) or not unread_files(state):
        return False
    read = [label.lower() for label in _read_labels(state, listings=False)]
    if any(label in asked.lower() or label.endswith(TABLE_FILES) for label in read):
        return False
    return not any(mentions(text, stem) for stem in stems for text in texts)


def mentions(text: str, stem: str) -> bool:
    """`text` (lower case) holds `stem`, spaces, hyphens and underscores aside: "to-do" is in
    "todo.md" and in "# to do"."""
    return stem in text or _squash(stem) in _squash(text)


def _squash(text: str) -> str:
    return re.sub(r"[\s_-]+", "", text)


def _read_labels(state: RunState, listings: bool = True) -> list[str]:
    """What the run's successful calls read, in words (a read's path; another call as its tool
    and arguments, ``search_files ERROR``), sorted (with `listings` False, listing calls left out)."""
    ok = {r.call_id for r in state.tool_runs if r.ok}
    return sorted({(_path_of(c) if c.function.name in PATH_CHOICE_TOOLS else "") or _call_label(c)
                   for m in state.messages
                   for c in (m.tool_calls or [])
                   if c.id in ok and (listings or c.function.name not in LISTING_TOOLS)})


def echoes(answer: str, tool_results: list[str]) -> bool:
    """True if `answer` reproduces a tool result: one of its lines of `ECHO_LINE_CHARS`+
    characters, or two of its consecutive lines, appear verbatim (case and runs of whitespace
    ignored). Quoting a short phrase or one short line (a one-line note) is allowed."""
    flat = " ".join(answer.lower().split())
    for result in tool_results:
        lines = [" ".join(line.lower().split()) for line in result.splitlines()]
        lines = [line for line in lines if line]
        if any(len(line) >= ECHO_LINE_CHARS and line in flat for line in lines):
            return True
        if any(f"{a} {b}" in flat for a, b in itertools.pairwise(lines)):
            return True
    return False


def _found_nothing(state: RunState) -> set[str]:
    """The call ids of searches that matched no line."""
    from runner.tools import NO_MATCH

    return {m.tool_call_id for m in state.messages
            if m.role == "tool" and m.tool_call_id and (m.content or "").startswith(NO_MATCH)}


def unread_files(state: RunState) -> list[str]:
    """The files the run has seen listed (the system prompt's listing, list_files results) and
    not read with a call that succeeded (a search that matched nothing reads nothing; a file
    read in part, whose line ranges do not yet join up from its first line to its last, is not
    read), in the order listed."""
    listed = list(dict.fromkeys(path for path, _ in _listed(state)))
    found_nothing = _found_nothing(state)
    read = {_path_of(call) for call, _ in _successful_results(state)
            if call.id not in found_nothing and call.function.name not in LISTING_TOOLS | PATH_CHOICE_TOOLS}
    read |= _read_whole(_reads(state))
    return [p for p in listed if p not in read]


def _read_whole(reads: list[tuple[str, str, int]]) -> set[str]:
    """The paths whose every line one of `reads` (`_reads`) returned: one read of the whole
    file, or line ranges that join up from line 1 to the end (a range that stops short of the
    end says so: ``[lines 1-40 of 300; ...]``; one that says nothing ran to the end)."""
    ranges: dict[str, list[tuple[int, int | None]]] = {}
    for path, text, start in reads:
        stop = READ_STOPPED.search(text)
        ranges.setdefault(path, []).append((start, int(stop.group(1)) if stop else None))
    whole = set()
    for path, spans in ranges.items():
        reached = 0
        for start, through in sorted(spans, key=lambda span: span[0]):
            if start > reached + 1:
                break
            if through is None:
                whole.add(path)
                break
            reached = max(reached, through)
    return whole


def _read_in_part(state: RunState) -> list[str]:
    """The files the run began to read and has not read to the end (`_read_whole`), in order."""
    reads = _reads(state)
    whole = _read_whole(reads)
    return list(dict.fromkeys(path for path, _, _ in reads if path not in whole))


def _reads(state: RunState) -> list[tuple[str, str, int]]:
    """Each successful read: its path, the text it returned and the line it started at."""
    out = []
    for call, text in _successful_results(state):
        if call.function.name in PATH_CHOICE_TOOLS and (path := _path_of(call)):
            args = _arguments(call)
            start = args.get("start_line") if isinstance(args, dict) else None
            out.append((path, text, start if isinstance(start, int) and start > 1 else 1))
    return out


def _listed(state: RunState) -> list[tuple[str, str]]:
    """Each file the run has seen listed (the system prompt's listing, list_files results),
    with its size in bytes as listed, in the order listed."""
    texts = [m.content or "" for m in state.messages[:1] if m.role == "system"]
    listing_calls = {c.id for m in state.messages for c in (m.tool_calls or []) if c.function.name in LISTING_TOOLS}
    texts += [m.content or "" for m in state.messages if m.role == "tool" and m.tool_call_id in listing_calls]
    return [(path, size) for text in texts for path, size in LISTED.findall(text)]


def _path_of(call: ToolCall) -> str | None:
    """The ``path`` argument of a call, if it has one."""
    args = _arguments(call)
    path = args.get("path") if isinstance(args, dict) else None
    return path.removeprefix("./") if isinstance(path, str) else None


def _arguments(call: ToolCall) -> Any:
    """A call's arguments as the model wrote them, parsed ({} when they are no JSON)."""
    import json  # here, not at the top: `from runner import run` does not load json

    try:
        return json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError:
        return {}


def _unread(state: RunState, files: list[str] | None = None) -> str:
    """`UNREAD` for the listed files not read yet (`files`, when already worked out), or ""."""
    files = unread_files(state) if files is None else files
    if not files:
        return ""
    begun = {path for path, _, _ in _reads(state)}
    shown = [f"{path} (read in part)" if path in begun else path for path in files[:UNREAD_MAX_FILES]]
    shown += [f"{len(files) - UNREAD_MAX_FILES} more"] if len(files) > UNREAD_MAX_FILES else []
    return UNREAD.format(files=", ".join(shown))


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _review_last(state: RunState) -> str | None:
    """The ``tool_choice`` the next request sends when the last message is the harness's
    review of an answer (abstain_check's reminder: "required"; answer_check's, `NON_ANSWERS`),
    else None."""
    reviews = [(CHECK_ABSTENTION, "required"), *NON_ANSWERS.values(), SECOND_OPINION, DISAGREE]
    return next((choice for template, choice in reviews if _last_is(state, template)), None)


def _last_is(state: RunState, template: str) -> bool:
    """The last message is the harness's, made from `template`."""
    return _made_from(state.messages[-1], template)


def _sent(state: RunState, template: str, since_read: bool = False) -> bool:
    """The harness already sent a message made from `template` in this run (with
    `since_read`, after the last result of a call that read something: a search that matched
    no line, or a call that repeats an earlier one word for word, reads nothing)."""
    start = 0
    if since_read:  # a call repeated word for word reads nothing new
        ok = {r.call_id for r in state.tool_runs if r.ok and r.tool_name not in LISTING_TOOLS} - _found_nothing(state)
        signatures = {r.call_id: r.signature for r in state.tool_runs}
        seen: set[str] = set()
        for i, m in enumerate(state.messages):
            if m.role == "tool" and m.tool_call_id in ok:
                start = i if signatures[m.tool_call_id] not in seen else start
                seen.add(signatures[m.tool_call_id])
    return any(_made_from(m, template) for m in state.messages[start:])


def _prefix(template: str) -> str:
    """How a message made from `template` starts, whatever it is filled with (every template
    starts with words of its own)."""
    return template.split("{", 1)[0][:30]


def correction(state: RunState, tool_names: list[str], slip: str) -> str:
    """Add the corrective user message for `slip` (replacing one added before, so corrections
    never pile up) and return its text. When the answer is due, the correction is the request
    for the answer itself, sent with tool_choice "none"."""
    text = CORRECTIONS.get(slip, CORRECTIONS["blank_content"]).format(
        tools=", ".join(tool_names), question=question(state))
    if answer_is_due(state):
        text = _answer_request(state)
    message = Message(role="user", content=text, name=CORRECTIVE_NAME)
    if _harness_message_last(state):
        state.messages[-1] = message
    else:
        state.messages.append(message)
    return text


# --- the policies themselves ---

def answer_is_due(state: RunState) -> bool:
    """Answer forcing: the last message is not the model's (a tool result or a harness
    message), and there were `answer_after_tool_turns` assistant turns of tool calls, or
    (answer_on_stall) the last of them brought nothing new, or the reply after results was
    empty. With evidence_first a stall asks for the answer only once a call that looked
    inside a file succeeded."""
    cfg = state.config
    if state.messages[-1].role == "assistant":
        return False
    if _nudge_last(state) or _review_last(state) is not None:
        return False
    after = cfg.answer_after_tool_turns
    if after is not None and sum(1 for m in state.messages if m.role == "assistant" and m.tool_calls) >= after:
        return True
    if not cfg.answer_on_stall:
        return False
    if ("evidence_first" in cfg.steering and not _has_evidence(state)) or _read_on_stall(state):
        return False
    return _stalled(state) or _blank_after_results(state)


def _has_evidence(state: RunState) -> bool:
    """A call that can hold an answer succeeded: any but a listing, or a listing when the
    question is about the files themselves (`FOLDER_QUESTION`: the listing is the evidence).
    A search that matched no line is no evidence. A listing counts as evidence once it has
    been nudged past, too."""
    asked = question(state)
    if FOLDER_QUESTION.search(asked) and not READ_EACH.search(asked) and any(r.ok for r in state.tool_runs):
        return True
    found_nothing = _found_nothing(state)
    return any(r.ok and r.source == "run" and r.tool_name not in LISTING_TOOLS and r.call_id not in found_nothing
               for r in state.tool_runs) or any(
        m.role == "user" and m.name == CORRECTIVE_NAME and m.content and m.content.startswith(NUDGE[:40])
        for m in state.messages)


def answers_repeat(state: RunState) -> bool:
    """evidence_first: a call repeated right after its nudge is answered with the request for
    the answer, not stopped by the repeated-call rule (the listing may hold the answer)."""
    if "evidence_first" not in state.config.steering:
        return False
    last_assistant = max((i for i, m in enumerate(state.messages) if m.role == "assistant"), default=-1)
    before = state.messages[last_assistant - 1] if last_assistant > 0 else None
    return before is not None and before.role == "user" and before.name == CORRECTIVE_NAME and \
        (before.content or "").startswith(NUDGE[:40])


def _nudge_due(state: RunState) -> bool:
    """evidence_first: the last turn of calls stalled before anything but a listing succeeded."""
    cfg = state.config
    return ("evidence_first" in cfg.steering and cfg.answer_on_stall and not _has_evidence(state)
            and _stalled(state) and not _read_on_stall(state))


def _nudge_last(state: RunState) -> bool:
    last = state.messages[-1]
    return last.role == "user" and last.name == CORRECTIVE_NAME and (last.content or "").startswith(NUDGE[:40])


def _blank_after_results(state: RunState) -> bool:
    """The model's last reply was empty, after some tool call succeeded: it has nothing more
    to call, so its answer is asked for."""
    last = state.per_turn[-1] if state.per_turn else None
    return last is not None and last.slip == "blank_content" and any(r.ok for r in state.tool_runs)


def _stalled(state: RunState) -> bool:
    """The last turn of tool calls brought nothing new: each of its calls failed or repeated
    an earlier successful call, and some earlier call had succeeded (there is something to
    answer from)."""
    last = next((m for m in reversed(state.messages) if m.role == "assistant"), None)
    if last is None or not last.tool_calls:
        return False
    ids = {c.id for c in last.tool_calls}
    before = [r for r in state.tool_runs if r.call_id not in ids]
    known = {r.signature for r in before if r.ok}
    runs = [r for r in state.tool_runs if r.call_id in ids]
    if not known or len(runs) < len(ids):
        return False
    return all(not r.ok or r.signature in known for r in runs)


def restated_results(state: RunState) -> str:
    """Every distinct successful tool result of the run, and every call the user declined (the
    model must not answer as if it ran), in order, each under a header naming the call
    (``--- read_file notes.txt ---``: the tool and its argument values), each cut to
    `RESTATED_RESULT_CHARS`; "" when there is none."""
    from runner.tools import cap_text

    calls = {c.id: c for m in state.messages for c in (m.tool_calls or [])}
    texts = {m.tool_call_id: m.content or "" for m in state.messages if m.role == "tool"}
    seen: set[str] = set()
    parts = []
    for record in state.tool_runs:
        declined = record.source == "rejected"
        key = record.call_id if declined else record.signature
        if not (record.ok or declined) or key in seen or record.call_id not in calls:
            continue
        seen.add(key)
        parts.append(f"--- {_call_label(calls[record.call_id])} ---\n"
                     f"{cap_text(texts.get(record.call_id, ''), RESTATED_RESULT_CHARS)[0]}")
    return "\n\n".join(parts)


def _last_calls_failed(state: RunState) -> bool:
    """Some call of the last assistant turn of tool calls failed."""
    last = next((m for m in reversed(state.messages) if m.role == "assistant" and m.tool_calls), None)
    ids = {c.id for c in last.tool_calls or []} if last is not None else set()
    return any(not r.ok for r in state.tool_runs if r.call_id in ids)


def _call_label(call: ToolCall) -> str:
    """A call in words: the tool's name and its argument values (``read_file notes.txt``)."""
    return f"{call.function.name} {_argument_text(call)}".strip()


def _argument_text(call: ToolCall) -> str:
    """A call's arguments in words, space-separated: a text value as it is (``notes.txt``),
    any other as ``name=value`` (``recursive=false``)."""
    import json

    args = _arguments(call)
    if not isinstance(args, dict):
        return json.dumps(args, ensure_ascii=False)
    return " ".join(v if isinstance(v, str) else f"{k}={json.dumps(v, ensure_ascii=False)}"
                    for k, v in args.items() if v is not None)


def _answer_request(state: RunState) -> str:
    """The user message asking for the answer: the task restated, after the run's successful
    tool results as `RunConfig.answer_restates_results` says (or saying there are none when
    every call failed or found nothing); once abstain_check has asked
    the model to look again, with leave to say the information is not there (`MAY_ABSTAIN`)."""
    mode = state.config.answer_restates_results
    restate = mode == "always" or (mode == "after_failure" and _last_calls_failed(state))
    results = restated_results(state) if restate else ""
    found_nothing = _found_nothing(state)
    if results:
        text = ASK_WITH_RESULTS.format(results=results, question=question(state))
    elif not any((r.ok and r.call_id not in found_nothing) or r.source == "rejected" for r in state.tool_runs):
        text = ASK_WITHOUT_RESULTS.format(question=question(state))
    else:
        text = ASK_FOR_ANSWER.format(question=question(state))
    return text + (MAY_ABSTAIN if _sent(state, CHECK_ABSTENTION) else "")


def opening(state: RunState, folder: Path | None) -> None:
    """What the policies add to a new run before it is first saved (so its transcript and a
    resume hold it): listing_in_prompt and abstain_option extend the system prompt, or make
    one. Whoever saves a new run calls it with the folder its tools will read (the suite, and
    `runner.harness.drive` for a run it saves first)."""
    _extend_system(state, state.config.tools, folder)


def _extend_system(state: RunState, tool_names: list[str], workspace: Path | None) -> None:
    """listing_in_prompt and abstain_option: their text added to the system prompt (a system
    message made for it when the run has none), once."""
    steering = state.config.steering
    if not ({"listing_in_prompt", "abstain_option"} & set(steering)) or state.turns:
        return
    if not (state.messages and state.messages[0].role == "system"):
        state.messages.insert(0, Message(role="system", content=""))
    system = state.messages[0]
    text = system.content or ""
    if "listing_in_prompt" in steering and workspace is not None and "list_files" in tool_names \
            and LISTING.split("{")[0] not in text:
        words = question_words(question(state)) if "listing_hints" in steering else []
        extremes = "listing_extremes" in steering and bool(SIZE_QUESTION.search(question(state)))
        listing = folder_listing(workspace, hints=words, extremes=extremes)
        files = len([line for line in listing.splitlines() if " bytes)" in line])
        more = listing.rsplit("... and ", 1)[-1].split(" ", 1)[0] if "... and " in listing else "0"
        count = files + int(more)
        text += LISTING.format(count=f"{count} file{'s' if count != 1 else ''}", listing=listing)
    if "abstain_option" in steering and ABSTAIN not in text:
        text += ABSTAIN
    system.content = text.lstrip("\n") if not (system.content or "") else text


def question_words(text: str) -> list[tuple[str, str]]:
    """The words of a question that may name what holds its answer (four letters or more, not
    `STOPWORDS`), each with the stem a file is searched for (a plural's s, -ing, -ed
    dropped), in order, once."""
    out: list[tuple[str, str]] = []
    for word in re.findall(r"[a-z][a-z0-9_-]{3,}", text.lower()):
        if word in STOPWORDS or word in (w for w, _ in out):
            continue
        stem = word
        for suffix in ("ing", "ed", "es", "s"):
            if word.endswith(suffix) and len(word) - len(suffix) >= 4:
                stem = word[: -len(suffix)]
                break
        out.append((word, stem))
    return out


def _hint(path: Path, name: str, words: list[tuple[str, str]]) -> str:
    """The question's words whose stem the file's name or text holds, as ``; matches a, b``
    ("" for none)."""
    if not words:
        return ""
    try:
        text = name.lower() + "\n" + (path.read_text(encoding="utf-8", errors="replace").lower()
                                      if path.stat().st_size <= HINT_MAX_BYTES else "")
    except OSError:
        return ""
    found = [word for word, stem in words if stem in text]
    return f"; matches the question's {', '.join(found)}" if found else ""


def folder_listing(folder: Path, max_entries: int = LISTING_MAX_ENTRIES,
                   hints: list[tuple[str, str]] | None = None, extremes: bool = False) -> str:
    """Every file under `folder` the folder tools show (hidden entries and what a `.gitignore`
    ignores left out: runner's own runs directory among them), as ``path (N bytes)`` lines in
    path order, at most `max_entries` of them; with `hints`
    (`question_words`), each line says which of them the file holds; with `extremes`, a last
    line names the largest and the smallest of all the files (`EXTREMES`)."""
    from runner.tools import Folder

    shown = Folder(folder)
    found = sorted((path, size) for path, _, size in shown.files(shown.root))
    lines = [f"{path} ({size} bytes){_hint(folder / path, path, hints or [])}" for path, size in found[:max_entries]]
    if len(found) > max_entries:
        lines.append(f"... and {len(found) - max_entries} more files")
    if extremes and len(found) > 1:
        (small, small_size), (large, large_size) = min(found, key=_by_size), max(found, key=_by_size)
        lines.append(EXTREMES.format(large=large, large_size=large_size, small=small, small_size=small_size))
    return "\n".join(lines) or "(no files)"


def _by_size(entry: tuple[str, int]) -> tuple[int, str]:
    return entry[1], entry[0]


def question(state: RunState) -> str:
    """The run's task: its first user message."""
    return next((m.content or "" for m in state.messages if m.role == "user"), "")


def _harness_message_last(state: RunState) -> bool:
    return state.messages[-1].role == "user" and state.messages[-1].name == CORRECTIVE_NAME
