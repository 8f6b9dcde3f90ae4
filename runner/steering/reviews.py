"""The review of a reply that would end the run: take it, or send it back once with a message
saying what it is (abstain_check, answer_check, second_opinion); and the final word on it
(`final_verdict`): an answer, an abstention, or no answer, which gets one fresh attempt and
then fails the run.

Each kind of non-answer (`NON_ANSWERS` in `runner.steering.texts`) has its own check and its
own scope: the kinds about the form of a reply hold for any run; those that weigh it against
files read hold only where runner's folder tools gave the evidence.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import runner.steering.checks as checks
import runner.steering.texts as texts
from runner.replies import BLANK, PROTOCOL, TOOL_JSON, ReplyClass, abstains, classify, echoes, restates, tells_how
from runner.state import Message, RunState
from runner.steering.questions import FILE_QUESTION, READ_EACH, question_words
from runner.steering.registry import on
from runner.steering.turns import restated_results
from runner.steering.view import View, view

CLAIMS_A_CHANGE = re.compile(
    r"\b(?:updated|changed|bumped|replaced|renamed|deleted|removed|added|fixed|edited|modified|created|wrote|"
    r"written|set (?:it|the|to))\b", re.IGNORECASE)
"""A reply that says it changed a file."""
SAYS_NOTHING_CHANGED = re.compile(
    r"\b(?:not|no|nothing|never|unable|cannot|can't|could not|couldn't|didn't|did not|wasn't|was not|rejected|"
    r"declined|refused|failed)\b", re.IGNORECASE)
"""A reply that says a change was not made."""
FORM_KINDS = ("instructions", "blanks", "restated", "copied", "unsupported")
"""The kinds of non-answer about a reply's form or what no tool returned: checked in any run."""


def review_answer(state: RunState) -> str | None:
    """After a reply that answers (no calls): when it says the information is not there
    (abstain_check) or is no answer (answer_check), or a second opinion is due, add the
    message that says so and asks again, once per kind until something new is read, and
    return its text (the run then goes on); None to take the answer. With no turn left the
    answer stands; with one, only a review that asks for the answer alone is sent."""
    v = view(state)
    if v.last.role != "assistant" or v.last.tool_calls or v.small_talk or v.turns_left < 1:
        return None
    if v.fresh_at is not None and (note := v.messages[v.fresh_at].harness) is not None and note.kind == "last_attempt":
        return None  # the last attempt's reply is judged by final_verdict alone
    message = None
    if v.fresh_at is not None:  # the second opinion is the last review a run gets
        message = _disagreement(v)
    elif abstains(v.last.content or "") and on(v, "abstain_check"):
        message = _abstention_review(v)
    elif "answer_check" in v.steering:
        last_turn = v.turns_left == 1
        again = not abstains(v.last.content or "")  # an abstention is sent back once a run, not once a read
        kind = next((k for k in _non_answers(v) if not v.sent("review", k, since_read=again)
                     and not (last_turn and texts.NON_ANSWERS[k][1] == "required")), None)
        if kind is not None:
            message = texts.harness_message(_review_text(v, kind), "review", _policy_of(kind),
                                            tool_choice=texts.NON_ANSWERS[kind][1], detail=kind)
        elif _second_opinion_due(v):
            text = texts.SECOND_OPINION[0].format(results=restated_results(v), question=v.question)
            message = texts.harness_message(text, "second_opinion", "second_opinion",
                                            tool_choice=texts.SECOND_OPINION[1], fresh=True)
    if message is None:
        return None
    state.messages.append(message)
    return message.content


def _policy_of(kind: str) -> str:
    return {"unlinked": "unlinked_answers", "unsure": "confidence_check"}.get(kind, "answer_check")


def _abstention_review(v: View) -> Message | None:
    """abstain_check's reminder, once, unless every listed file was read or a review already
    said the answer may not be there."""
    if (v.turns_left == 1 or v.sent("review", "abstention") or (v.listed and not v.unread)
            or v.sent("review", "unsupported", since_read=True)):
        return None
    text = texts.CHECK_ABSTENTION.format(read=", ".join(v.read_labels()) or "nothing yet", unread=_unread(v),
                                         question=v.question)
    return texts.harness_message(text, "review", "abstain_check", tool_choice="required", detail="abstention")


def non_answers(state: RunState) -> list[str]:
    """Every kind of non-answer the model's last reply is, in the order they are reviewed."""
    return _non_answers(view(state))


def _non_answers(v: View) -> list[str]:
    """Every kind of non-answer the model's last reply is, in the order they are reviewed
    (`texts.NON_ANSWERS` says each in words). The kinds about a reply's form hold for any run;
    the others only where runner's folder tools gave the evidence. A reply that says the
    information is not there is only "unread_each", "unfinished", "unrelated" or nothing."""
    answer = (v.last.content or "").strip()
    asked = v.question
    folder = v.folder_run
    kinds = []
    if folder and READ_EACH.search(asked) and v.unread:
        kinds.append("unread_each")
    if TOOL_JSON.search(answer):  # a call written as text: what it names is no claim, its path no answer
        return [*kinds, "instructions"]
    instructions = tells_how(answer, v.tool_names) and not _carries_an_answer(v, answer)
    if folder and not v.has_evidence:
        return [*kinds, "instructions" if instructions else "unread"]
    if abstains(answer):
        if not folder:
            return kinds
        return kinds + ["unfinished"] * bool(v.read_in_part) + ["unrelated"] * checks.unrelated(v)
    found: dict[str, Callable[[], bool]] = {
        "instructions": lambda: instructions,
        "blanks": lambda: BLANK.search(answer) is not None,
        "restated": lambda: restates(answer, asked),
        "copied": lambda: PROTOCOL.search(answer) is not None or echoes(answer, v.result_texts()),
        "extreme": lambda: checks.wrong_extreme(v) is not None,
        "unsupported": lambda: checks.unsupported(v) is not None,
        "unrelated": lambda: checks.unrelated(v),
        "unshown": lambda: bool(v.unread) and checks.unshown_figure(v) is not None,
        "unlinked": lambda: on(v, "unlinked_answers") and checks.unlinked(v) is not None,
        "unsure": lambda: on(v, "confidence_check") and checks.unsure(v) is not None,
        "sizes": lambda: checks.listed_size_quoted(v) is not None,
        "unnamed": lambda: FILE_QUESTION.search(asked) is not None and not checks.names_a_file(v, answer),
    }
    scoped = [kind for kind in found if folder or kind in FORM_KINDS]
    if not folder and v.other_evidence:  # another tool answered: what it returned may need working out
        scoped = [kind for kind in scoped if kind != "unsupported"]
    return kinds + [kind for kind in scoped if found[kind]()]


def _carries_an_answer(v: View, answer: str) -> bool:
    """A reply that also tells how to use the tools still answers a question that asks for a
    file when it names one the question does not and a tool result does (a search's match)."""
    if FILE_QUESTION.search(v.question) is None:
        return False
    asked, said = v.question.lower(), answer.lower()
    found = " ".join(text.lower() for text in v.result_texts())
    return any(name in said and name not in asked and name in found
               for name in re.findall(r"[\w./-]+\.[a-z][a-z0-9]{0,4}\b", said))


def _review_text(v: View, kind: str) -> str:
    """The review message for `kind`, filled in from the run."""
    last = v.last.content or ""
    results = restated_results(v) if kind == "restated" else ""
    words = [word for word, _ in question_words(v.question)]
    size, file = (checks.listed_size_quoted(v) if kind == "sizes" else None) or ("", "")
    _, line, linked_file = (checks.unlinked(v) if kind == "unlinked" else None) or ("", "", "")
    claim = ((checks.unsupported(v) if kind == "unsupported" else None)
             or (checks.unshown_figure(v) if kind == "unshown" else None)
             or (checks.unsure(v) if kind == "unsure" else None) or "")
    direction, extreme, extreme_size, named = (checks.wrong_extreme(v) if kind == "extreme" else None) or \
        ("", "", "", "")
    unread = v.unread
    evidence = v.evidence_word
    return texts.NON_ANSWERS[kind][0].format(
        question=v.question, unread=_unread(v, _answer_named_aside(v, unread)), results=results or "(nothing)",
        read=", ".join(v.read_labels(listings=False)), words=" or ".join(words), line=line,
        read_on=" Read the one most likely to hold the answer." if unread else "",
        size=extreme_size or size, claim=claim,
        file=extreme or file or linked_file or (", ".join(v.read_in_part) if kind == "unfinished" else ""),
        unread_files=", ".join(unread), seen=_seen(v, unread) if kind == "unnamed" else "",
        direction=direction, named=named, blanks=", ".join(dict.fromkeys(BLANK.findall(last))),
        evidence=evidence, look=texts.LOOK_FURTHER if unread else " ",
        abstain="" if unread else texts.ABSTAIN_CLAUSE["files" if v.folder_run else "tools"],
        **texts.WORDING["files" if v.folder_run else "tools"])


def _answer_named_aside(v: View, unread: list[str]) -> list[str]:
    """The unread files a review lists, less those the answer itself names (a file found by a
    search, say): a review never tells the model it has not read what it answered with."""
    answer = v.last.content or ""
    if TOOL_JSON.search(answer) or tells_how(answer, v.tool_names):  # naming a file to read is no answer from it
        return unread
    lowered = answer.lower()
    return [p for p in unread if p.lower() not in lowered and p.rsplit("/", 1)[-1].lower() not in lowered]


def _seen(v: View, unread: list[str]) -> str:
    read = ", ".join(v.read_labels(listings=False))
    return checks.mentioning(v, read) or f"You have read {read or 'no file'}.{_unread(v, unread)}"


def _unread(v: View, files: list[str] | None = None) -> str:
    """`UNREAD` for the listed files not read yet (`files`, when already worked out), or ""."""
    files = v.unread if files is None else files
    if not files:
        return ""
    begun = {path for path, _, _ in v.reads}
    shown = [f"{path} (read in part)" if path in begun else path for path in files[:texts.UNREAD_MAX_FILES]]
    shown += [f"{len(files) - texts.UNREAD_MAX_FILES} more"] if len(files) > texts.UNREAD_MAX_FILES else []
    return texts.UNREAD.format(files=", ".join(shown))


def _second_opinion_due(v: View) -> bool:
    """second_opinion: an answer about to be taken (not an abstention) is asked for again, once,
    when the run has tool results to restate and two turns left."""
    return (on(v, "second_opinion") and not abstains(v.last.content or "") and v.turns_left >= 2
            and bool(restated_results(v)))


def _disagreement(v: View) -> Message | None:
    """After the second opinion, the message that shows the model its first answer when the two
    disagree, once; None to take the second answer."""
    asked = v.fresh_at
    assert asked is not None
    first = next((m.content or "" for m in reversed(v.messages[:asked]) if m.role == "assistant"), "")
    if v.sent("disagreement") or v.turns_left < 1 or asked != len(v.messages) - 2:
        return None
    if not checks.disagree(first, v.last.content or "", v.question):
        return None
    text = texts.DISAGREE[0].format(claim=" ".join(first.split())[:300], evidence=v.evidence_word)
    return texts.harness_message(text, "disagreement", "second_opinion", tool_choice=texts.DISAGREE[1])


def final_verdict(state: RunState) -> ReplyClass:
    """What the reply about to end the run is (`runner.replies.classify`), over every tool
    result of the run."""
    v = view(state)
    return classify(v.last.content or "", v.question, v.result_texts(), v.tool_names)


def ask_once_more(state: RunState, verdict: ReplyClass) -> bool:
    """After a final reply that is no answer: add one fresh request for the answer (the system
    prompt, then the results and the question) and return True; False when it was asked once
    already or no turn is left (the run then fails)."""
    v = view(state)
    if v.sent("last_attempt") or v.turns_left < 1:
        return False
    results = restated_results(v)
    why = verdict.why or "is no answer"
    if results:
        text = texts.LAST_ATTEMPT[0].format(why=why, results=results, question=v.question)
    else:
        text = texts.LAST_ATTEMPT_NO_RESULTS[0].format(why=why, question=v.question)
    message = texts.harness_message(text, "last_attempt", "final_answer", tool_choice="none", fresh=True)
    state.messages.append(message)
    return True


def unmade_change(state: RunState) -> str | None:
    """When the run's calls of runner's write tools changed nothing (each declined, refused or
    failed) and the reply about to be taken says it changed a file: what became of them, in
    words ("write_file pyproject.toml: declined"); None otherwise."""
    v = view(state)
    if not v.writes or any(changed for _, _, changed in v.writes):
        return None
    answer = v.last.content or ""
    if not CLAIMS_A_CHANGE.search(answer) or SAYS_NOTHING_CHANGED.search(answer):
        return None
    return "; ".join(f"{label}: {ended}" for label, ended, _ in v.writes)


def unsupported_claim(state: RunState) -> str | None:
    """What the answer about to be taken says that no tool returned, when the run's own review
    already sent it back for that (and it still says it); None otherwise."""
    v = view(state)
    if not v.sent("review", "unsupported") and not v.sent("review", "unshown"):
        return None
    return checks.unsupported(v) or checks.unshown_figure(v)
