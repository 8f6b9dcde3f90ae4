"""Every steering policy, by name: what it does, which hooks it implements, where it applies
(its scope) and where it can run (runner's loop, `runner serve`); and how a run's
configuration turns policies on (`active`, `fields_for`, `edited`).

A policy's scope is data and code at once: `Policy.scope` says it in words for `runner
policies`, `Policy.applies` decides it on a `View`. A policy outside its scope does nothing, so
a policy chosen for questions about a folder never speaks of files to a run whose answer came
from another tool.

The policies of earlier formats are separate `RunConfig` fields (`answer_after_tool_turns`,
`answer_on_stall`, `answer_restates_results`, `parallel_tool_calls`, `on_slip`,
`Endpoint.first_turn_tool_choice`); `active` reads them back as names. The others are listed by
name in `RunConfig.steering`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from runner.errors import UsageError
from runner.state import Endpoint, RunConfig

if TYPE_CHECKING:
    from runner.steering.view import View

Hook = Literal["opening", "tool_choice", "tools", "request", "before_request", "tool_result", "after_slip",
               "review", "resample"]
"""Where a policy acts: the system prompt of a new run (opening); the next request's
``tool_choice``, the tools it offers and its grammar, its extra fields; a message added before
it; a tool result's text; the message after a protocol slip; the review of a reply that would
end the run; a reply sampled again (the server)."""
Where = Literal["run", "serve", "engine"]


def _always(v: View) -> bool:
    return True


def _tools_offered(v: View) -> bool:
    return bool(v.tool_names) and not v.small_talk


def _folder_run(v: View) -> bool:
    return v.folder_run and not v.small_talk


def _lists_folder(v: View) -> bool:
    return "list_files" in v.tool_names and v.role("list_files") == "listing" and not v.small_talk


@dataclass(frozen=True)
class Policy:
    """One steering policy.

    Attributes:
        name: how the manifest, ``--policy`` and reports name it.
        description: what it does, in words.
        hooks: where it acts (`Hook`).
        scope: when it applies, in words.
        applies: when it applies, decided on the run's `View`.
        where: where it can run: runner's loop, `runner serve`, or the local engine itself.
    """

    name: str
    description: str
    hooks: tuple[Hook, ...]
    scope: str
    applies: Callable[[View], bool] = _always
    where: tuple[Where, ...] = ("run",)


FOLDER_SCOPE = "runs whose evidence comes from runner's folder tools alone (read_file offered; no other tool answered)"
P = Policy
REGISTRY: tuple[Policy, ...] = (
    P("first_turn_required", "the first request after the question sends tool_choice \"required\": the model's first "
      "reply is a call (small talk, a greeting or thanks, sends \"none\", and its answer is taken)",
      ("tool_choice",), "tools offered, the question not small talk", _tools_offered, ("run", "serve")),
    P("untagged_calls", "runner's local server reads a reply that opens with a JSON object as a call", (),
      "every reply of the local server", _always, ("engine",)),
    P("corrective_retries", "a protocol slip (an empty reply, an unreadable call) is answered with a short message "
      "saying what went wrong, instead of the same request again", ("after_slip",), "every run"),
    P("answer_forcing", "after N turns of tool calls since the question, the answer is asked for with tool_choice "
      "\"none\" (the server samples the reply so, adding no message)", ("before_request", "tool_choice"),
      "tools offered", _tools_offered, ("run", "serve")),
    P("answer_on_stall", "the answer is asked for as soon as a turn of calls brings nothing new (each call failed or "
      "repeated an earlier one), or the reply after results is empty; the server also samples again, as an answer, "
      "a reply whose calls all repeat calls already answered", ("before_request", "tool_choice", "resample"),
      "tools offered", _tools_offered, ("run", "serve")),
    P("one_call_per_turn", "parallel_tool_calls false: at most one call per reply", ("request",), "every run"),
    P("restate_results", "the request for the answer restates the successful tool results", ("before_request",),
      "every run"),
    P("listing_in_prompt", "the system prompt lists the folder's files (paths and sizes) before the first turn",
      ("opening",), "runs offering runner's list_files", _lists_folder),
    P("abstain_option", "the system prompt says how to answer when the files do not hold the answer", ("opening",),
      "runs offering runner's list_files", _lists_folder),
    P("evidence_first", "the answer is asked for on a stall only once a call other than a listing succeeded; before "
      "that a repeated call is answered with a nudge to look inside the files", ("before_request",),
      FOLDER_SCOPE, _folder_run),
    P("listing_hints", "with listing_in_prompt, each listed file says which words of the question it holds",
      ("opening",), "runs offering runner's list_files", _lists_folder),
    P("listing_extremes", "with listing_in_prompt, for a question that compares the files' sizes, the listing ends "
      "with a sentence naming the largest and the smallest file", ("opening",), "runs offering runner's list_files",
      _lists_folder),
    P("table_rows", "a CSV or TSV file read whole is followed, in its tool result, by its rows again with each value "
      "named by its column (name=Dana Levi; team=design)", ("tool_result",), "a runner read_file of a .csv or .tsv"),
    P("table_extremes", "for a question that compares (most, highest, latest, ...), a CSV or TSV file read whole is "
      "followed, in its tool result, by each numeric or date column's highest and lowest value and the rows that "
      "hold them", ("tool_result",), "a runner read_file of a .csv or .tsv"),
    P("related_first", "while the files read hold no word of the question and listed files are still unread, the "
      "next request sends tool_choice \"required\" (with path_choices, read_file limited to the unread files)",
      ("tool_choice", "tools"), FOLDER_SCOPE, _folder_run),
    P("read_on_stall", "a turn of calls that brings nothing new while listed files are unread is followed by a "
      "request with tool_choice \"required\" (with path_choices, read_file limited to the unread files), not by the "
      "request for the answer", ("tool_choice", "tools"), FOLDER_SCOPE, _folder_run),
    P("unlinked_answers", "with answer_check, an answer whose own words are found only on lines that mention nothing "
      "of the question is sent back once, quoting that line", ("review",), FOLDER_SCOPE, _folder_run),
    P("abstain_check", "an answer that says the information is not there is taken only after one reminder to look "
      "in the file most likely to hold it, or at once when every listed file was read", ("review",),
      FOLDER_SCOPE, _folder_run),
    P("repeat_results", "a call that repeats an earlier one and gets the same text back is answered with one line "
      "pointing to the earlier result, not the whole text again", ("tool_result",), "every run"),
    P("confidence_check", "with answer_check, each reply's token probabilities are asked for, and an answer is sent "
      "back once when a word that carries it was a close call (the likeliest other word of its kind at least half "
      "as likely)", ("request", "review"), FOLDER_SCOPE, _folder_run),
    P("second_opinion", "with answer_check, an answer about to be taken is asked for again in a fresh context (the "
      "system prompt, then the run's tool results and the question): when the two answers disagree, the model is "
      "shown both and asked which the text supports", ("review",), "runs with tool results to restate",
      _tools_offered),
    P("path_choices", "with listing_in_prompt, read_file's path must be one of the listed files (an enum in its "
      "schema: a local model's grammar then cannot name a file that does not exist)", ("tools",),
      "runs whose system prompt lists every file", _lists_folder),
    P("answer_check", "a reply that is no answer is sent back once per kind (until something new is read), saying "
      "what it is and asking again. Any run: it repeats the question, tells how to call the tools, leaves blanks, "
      "copies a tool result or the chat's markup, quotes or names what no tool returned. Runs on runner's folder "
      "tools alone, also: it comes before any file was read, gives a number no file read shows, comes from files "
      "that mention no word of the question, says the information is not there while a file is half read or each "
      "file was to be read, gives a listed file's size, names no file when asked for one, names the wrong largest "
      "or smallest file", ("review",), "tools offered, the question not small talk", _tools_offered),
)
"""Every policy, in the order they are listed and tried."""
POLICIES: dict[str, str] = {p.name: p.description for p in REGISTRY}
"""Every policy, by name, in words."""
BY_NAME: dict[str, Policy] = {p.name: p for p in REGISTRY}
NEW_POLICIES = ("listing_in_prompt", "listing_hints", "listing_extremes", "abstain_option", "evidence_first",
                "table_rows", "table_extremes", "related_first", "read_on_stall", "unlinked_answers", "abstain_check",
                "path_choices", "answer_check", "repeat_results", "confidence_check", "second_opinion")
"""The policies kept by name in `RunConfig.steering` (the others are fields of their own)."""
DEFAULT_ANSWER_AFTER_TURNS = 6
"""answer_forcing's N when a model's manifest entry sets none (measured best for a 1.5B model)."""


def on(v: View, name: str) -> bool:
    """Policy `name` is turned on for the run and the run is in its scope."""
    return name in v.steering and BY_NAME[name].applies(v)


def active(config: RunConfig) -> list[str]:
    """The policies in force for a run, by name, in registry order."""
    turned_on = {
        "first_turn_required": config.endpoint.first_turn_tool_choice == "required",
        "untagged_calls": False,  # a property of the server (runner.local), not of the run
        "corrective_retries": config.on_slip == "corrective",
        "answer_forcing": config.answer_after_tool_turns is not None,
        "answer_on_stall": config.answer_on_stall,
        "one_call_per_turn": config.parallel_tool_calls is False,
        "restate_results": config.answer_restates_results != "never",
        **{name: name in config.steering for name in NEW_POLICIES},
    }
    return [name for name in POLICIES if turned_on[name]]


def active_for_entry(entry: Any) -> list[str]:
    """The policies a model manifest entry (`runner.models.ModelEntry`) gives its runs, by name."""
    config = RunConfig(endpoint=Endpoint(model=entry.name, first_turn_tool_choice=entry.first_turn_tool_choice),
                       **entry.harness_defaults())
    names = set(active(config)) | ({"untagged_calls"} if entry.untagged_calls else set())
    return [n for n in POLICIES if n in names]


def fields_for(names: Iterable[str], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `RunConfig` (and `Endpoint`) fields that turn exactly the policies `names` on: those
    listed on, every other off. Parameters (N of answer forcing, when results are restated) come
    from `defaults` (a manifest entry's `harness_defaults`), else N = 6, restated after a failed call.

    Raises:
        UsageError: a name that is no policy (one line, with the names there are).
    """
    wanted = list(names)
    unknown = [n for n in wanted if n not in POLICIES]
    if unknown:
        raise UsageError(f"unknown policy {unknown[0]!r}; {_suggestion(unknown[0])}")
    d = defaults or {}
    chosen = set(wanted)
    restate = d.get("answer_restates_results") or "never"
    return {
        "first_turn_tool_choice": "required" if "first_turn_required" in chosen else "auto",
        "on_slip": "corrective" if "corrective_retries" in chosen else "repeat",
        "answer_after_tool_turns": ((d.get("answer_after_tool_turns") or DEFAULT_ANSWER_AFTER_TURNS)
                                    if "answer_forcing" in chosen else None),
        "answer_on_stall": "answer_on_stall" in chosen,
        "parallel_tool_calls": False if "one_call_per_turn" in chosen else None,
        "answer_restates_results": ((restate if restate != "never" else "after_failure")
                                    if "restate_results" in chosen else "never"),
        "steering": [n for n in NEW_POLICIES if n in chosen],
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
    """What to say after an unknown policy name: the close ones, else where they are listed."""
    import difflib

    if "," in name:
        return "give one name per --policy (repeat the option)"
    close = difflib.get_close_matches(name, list(POLICIES), n=3, cutoff=0.5) or [
        p for p in POLICIES if name and name in p]
    return f"did you mean {' or '.join(close)}?" if close else "runner policies lists them"


def split_fields(fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`fields_for`'s fields as (RunConfig fields, Endpoint fields)."""
    endpoint = {k: v for k, v in fields.items() if k in Endpoint.model_fields}
    return {k: v for k, v in fields.items() if k not in endpoint}, endpoint


def with_endpoint(endpoint: Endpoint, fields: dict[str, Any]) -> Endpoint:
    return endpoint.model_copy(update=split_fields(fields)[1])
