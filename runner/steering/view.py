"""The facts of a run the policies decide on, worked out once: `View`.

Every policy asks the same questions of the conversation: what was asked, which calls
succeeded and what each returned, which files were listed and which read (whole or in part),
where the evidence came from, which harness messages were sent since the last read. A `View`
answers them from the run's messages and tool runs alone, so a resumed run decides what the
killed one would have, and `runner serve` answers them from a client's conversation the same
way (`runner.steering.serve`). `view(state)` reuses the last view while the run is unchanged.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Literal

from runner.replies import small_talk
from runner.state import HarnessNote, Message, RunState, ToolCall
from runner.steering.questions import FOLDER_QUESTION, READ_EACH

Role = Literal["listing", "read", "search", "write"]
FOLDER_TOOLS: dict[str, Role] = {"list_files": "listing", "read_file": "read", "search_files": "search",
                                 "scan_archive": "search", "write_file": "write", "edit_file": "write",
                                 "delete_file": "write"}
"""runner's own folder tools (either catalog) and what each gives: a listing of the files, a
file's text, the lines that match (the demo's archive scan among them), a change kept in the
write ledger. A person's own tool or an
MCP tool is of no such kind, whatever its name (`View.role`)."""
TABLE_FILES = (".csv", ".tsv")
"""Files read as tables (`table_rows`, `table_extremes`; the "unrelated" review)."""
READ_STOPPED = re.compile(r"^\[lines \d+-(\d+) of \d+[^\n]*; read on with start_line=\d+\]$"
                          r"|^\[line (\d+) of \d+ [^\n]*; read on with start_line=\d+, offset=\d+\]$", re.MULTILINE)
"""What a read adds when it stops short of the file's end: the last line it returned whole, or
the line it stopped inside (then it returned the lines before it whole)."""
LISTED = re.compile(r"^(\S[^\n]*?) \((\d+) bytes\)", re.MULTILINE)
"""A file in a listing: ``path (N bytes)``, path and size."""
NO_MATCH = "No line matches "
"""How search_files' result begins when no line matched."""


class View:
    """The facts of one run at one moment (see the module docstring). Built by `view`."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.messages = state.messages
        self.steering = frozenset(state.config.steering)

    # --- the question and the turns ---

    @functools.cached_property
    def question_at(self) -> int:
        """Where the question is: the last user message the harness did not write."""
        return max((i for i, m in enumerate(self.messages) if m.role == "user" and m.harness is None), default=0)

    @functools.cached_property
    def question(self) -> str:
        """The task: the last user message the harness did not write (a run's prompt)."""
        return self.messages[self.question_at].content or "" if self.messages else ""

    @functools.cached_property
    def small_talk(self) -> bool:
        """The task is only small talk: nothing to look up, no review of its answer."""
        return small_talk(self.question)

    @functools.cached_property
    def call_turns(self) -> int:
        """Assistant turns of tool calls since the question."""
        return sum(1 for m in self.messages[self.question_at:] if m.role == "assistant" and m.tool_calls)

    @property
    def replied(self) -> bool:
        """The model has been asked since the question (a turn that was a slip counts)."""
        return self.state.turns > 0

    @property
    def turns_left(self) -> int:
        """How many more turns the run's turn cap allows (a large number without one)."""
        cap = self.state.config.limits.max_turns
        return 1_000_000 if cap is None else cap - self.state.turns

    @functools.cached_property
    def tool_names(self) -> list[str]:
        """The tools the run offers, by name."""
        return [getattr(t, "name", t) for t in self.state.config.tools]

    # --- harness messages ---

    @property
    def last(self) -> Message:
        return self.messages[-1]

    @property
    def last_note(self) -> HarnessNote | None:
        """The note of the last message, when the harness wrote it."""
        return self.last.harness

    def sent(self, kind: str, detail: str | None = None, since_read: bool = False) -> bool:
        """The harness sent a message of `kind` (and `detail`) in this run; with `since_read`,
        after the last result of a call that read something new."""
        start = self.last_read_at if since_read else 0
        return any(m.harness is not None and m.harness.kind == kind and (detail is None or m.harness.detail == detail)
                   for m in self.messages[start:])

    @functools.cached_property
    def last_read_at(self) -> int:
        """Where the last tool result that read something new is (a listing, a search that matched
        nothing and a call that repeats an earlier one word for word read nothing new); 0 for none."""
        ok = {r.call_id for r in self.state.tool_runs if r.ok and self.role(r.tool_name) != "listing"}
        ok -= self.found_nothing
        signatures = {r.call_id: r.signature for r in self.state.tool_runs}
        seen: set[str] = set()
        at = 0
        for i, m in enumerate(self.messages):
            if m.role == "tool" and m.tool_call_id in ok:
                at = i if signatures[m.tool_call_id] not in seen else at
                seen.add(signatures[m.tool_call_id])
        return at

    @functools.cached_property
    def fresh_at(self) -> int | None:
        """Where the last request sent in a fresh context is (`HarnessNote.fresh`), None before one."""
        return next((i for i in range(len(self.messages) - 1, -1, -1)
                     if (note := self.messages[i].harness) is not None and note.fresh), None)

    # --- tools and their results ---

    def role(self, tool_name: str) -> Role | None:
        """What evidence a tool of this name gives, when it is runner's own folder tool."""
        config = self.state.config
        if tool_name in config.tool_refs:
            return None
        return FOLDER_TOOLS.get(tool_name)

    @functools.cached_property
    def calls(self) -> dict[str, ToolCall]:
        return {c.id: c for m in self.messages for c in (m.tool_calls or [])}

    @functools.cached_property
    def ok_ids(self) -> set[str]:
        return {r.call_id for r in self.state.tool_runs if r.ok}

    @functools.cached_property
    def successful(self) -> list[tuple[ToolCall, str]]:
        """Each call that succeeded, with the text of its tool result, in order."""
        return [(self.calls[m.tool_call_id], m.content or "") for m in self.messages
                if m.role == "tool" and m.tool_call_id in self.ok_ids and m.tool_call_id in self.calls]

    @functools.cached_property
    def found_nothing(self) -> set[str]:
        """The call ids of searches that matched no line."""
        return {m.tool_call_id for m in self.messages
                if m.role == "tool" and m.tool_call_id and (m.content or "").startswith(NO_MATCH)}

    @functools.cached_property
    def other_evidence(self) -> bool:
        """A tool other than runner's folder tools returned something: the answer may rest on it."""
        return any(self.role(call.function.name) is None for call, _ in self.successful)

    @functools.cached_property
    def folder_run(self) -> bool:
        """The run works with runner's folder tools only (it offers read_file, and every tool it
        offers is one of them or a write tool), and nothing else returned evidence: the reviews
        that speak of files apply."""
        reads = [n for n in self.tool_names if self.role(n) == "read"]
        return bool(reads) and not self.other_evidence and not self.state.config.mcp

    @property
    def evidence_word(self) -> str:
        """How a message names the evidence: "files" in a folder run, else "tool results"."""
        return "files" if self.folder_run else "tool results"

    @functools.cached_property
    def writes(self) -> list[tuple[str, str, bool]]:
        """Each call of runner's write tools: (call label, how it ended, whether it changed a
        file); how it ended is "done", "declined", "refused" or "failed"."""
        out = []
        for r in self.state.tool_runs:
            if self.role(r.tool_name) != "write" or r.source == "cache" or r.call_id not in self.calls:
                continue
            ended = ("done" if r.ok else "failed") if r.source == "run" else \
                "declined" if r.source == "rejected" else "refused"
            out.append((call_label(self.calls[r.call_id]), ended, ended == "done"))
        return out

    @functools.cached_property
    def has_evidence(self) -> bool:
        """A call that can hold an answer succeeded: any but a listing or a search that matched
        nothing; or a listing, when the question is about the files themselves; or a listing
        once the run was nudged past it."""
        asked = self.question
        if FOLDER_QUESTION.search(asked) and not READ_EACH.search(asked) and any(r.ok for r in self.state.tool_runs):
            return True
        return any(r.ok and r.source == "run" and self.role(r.tool_name) != "listing"
                   and r.call_id not in self.found_nothing for r in self.state.tool_runs) or self.sent("nudge")

    def result_texts(self, listings: bool = True) -> list[str]:
        """The text of every result of a call that succeeded and found something, each after its
        call's argument values (with `listings` False, listings left out)."""
        return [f"{argument_text(call)}\n{text}" for call, text in self.successful
                if call.id not in self.found_nothing and (listings or self.role(call.function.name) != "listing")]

    @functools.cached_property
    def seen_text(self) -> str:
        """The question, the system prompt and every tool result, lower-cased, spaces squashed."""
        texts = [self.question, *(m.content or "" for m in self.messages if m.role in ("system", "tool"))]
        return " ".join(" ".join(t.lower().split()) for t in texts)

    def read_labels(self, listings: bool = True) -> list[str]:
        """What the successful calls read, in words (a read's path; another call as its tool
        and arguments), sorted; with `listings` False, listings left out."""
        return sorted({(path_of(c) if self.role(c.function.name) == "read" else "") or call_label(c)
                       for c in self.calls.values()
                       if c.id in self.ok_ids and (listings or self.role(c.function.name) != "listing")})

    # --- files listed and read ---

    @functools.cached_property
    def prompt_listing(self) -> list[tuple[str, str]]:
        """The files the system prompt lists, with their sizes, when it lists every file; else []."""
        if not self.messages or self.messages[0].role != "system":
            return []
        listing = self.messages[0].content or ""
        return [] if "... and " in listing else LISTED.findall(listing)

    @functools.cached_property
    def listed(self) -> list[tuple[str, str]]:
        """Each file the run has seen listed (the system prompt's listing, list_files results),
        with its size in bytes as listed, in the order listed."""
        texts = [m.content or "" for m in self.messages[:1] if m.role == "system"]
        texts += [text for call, text in self.successful if self.role(call.function.name) == "listing"]
        return [(path, size) for text in texts for path, size in LISTED.findall(text)]

    @functools.cached_property
    def reads(self) -> list[tuple[str, str, int]]:
        """Each successful read: its path, the text it returned and the line it started at."""
        out = []
        for call, text in self.successful:
            if self.role(call.function.name) == "read" and (path := path_of(call)):
                start = arguments(call).get("start_line") if isinstance(arguments(call), dict) else None
                out.append((path, text, start if isinstance(start, int) and start > 1 else 1))
        return out

    @functools.cached_property
    def read_whole(self) -> set[str]:
        """The paths whose every line the reads returned: one read of the whole file, or line
        ranges that join up from line 1 to the end."""
        ranges: dict[str, list[tuple[int, int | None]]] = {}
        for path, text, start in self.reads:
            stop = READ_STOPPED.search(text)
            through = None if stop is None else int(stop.group(1)) if stop.group(1) else int(stop.group(2)) - 1
            ranges.setdefault(path, []).append((start, through))
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

    @functools.cached_property
    def read_in_part(self) -> list[str]:
        """The files the run began to read and has not read to the end, in order."""
        return list(dict.fromkeys(path for path, _, _ in self.reads if path not in self.read_whole))

    @functools.cached_property
    def read_files(self) -> list[tuple[str, str]]:
        """Each file read with success, as its path and the text returned."""
        return [(path, text) for path, text, _ in self.reads]

    @functools.cached_property
    def unread(self) -> list[str]:
        """The files the run has seen listed and not read with a call that succeeded (a search
        that matched nothing reads nothing; a file read in part is not read), in the order listed."""
        listed = list(dict.fromkeys(path for path, _ in self.listed))
        read = {path_of(call) for call, _ in self.successful
                if call.id not in self.found_nothing and self.role(call.function.name) not in ("listing", "read")}
        read |= self.read_whole
        return [p for p in listed if p not in read]


def path_of(call: ToolCall) -> str | None:
    """The ``path`` argument of a call, if it has one."""
    args = arguments(call)
    path = args.get("path") if isinstance(args, dict) else None
    return path.removeprefix("./") if isinstance(path, str) else None


def arguments(call: ToolCall) -> Any:
    """A call's arguments as the model wrote them, parsed ({} when they are no JSON)."""
    import json  # here, not at the top: `from runner import run` does not load json

    try:
        return json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError:
        return {}


def call_label(call: ToolCall) -> str:
    """A call in words: the tool's name and its argument values (``read_file notes.txt``)."""
    return f"{call.function.name} {argument_text(call)}".strip()


def argument_text(call: ToolCall) -> str:
    """A call's arguments in words, space-separated: a text value as it is (``notes.txt``),
    any other as ``name=value`` (``recursive=false``)."""
    import json

    args = arguments(call)
    if not isinstance(args, dict):
        return json.dumps(args, ensure_ascii=False)
    return " ".join(v if isinstance(v, str) else f"{k}={json.dumps(v, ensure_ascii=False)}"
                    for k, v in args.items() if v is not None)


_last: tuple[tuple[int, ...], View] | None = None


def view(state: RunState) -> View:
    """The `View` of `state` as it is now (the last one again while nothing changed)."""
    global _last
    last = state.messages[-1] if state.messages else None
    key = (id(state), id(state.config), len(state.messages), len(state.tool_runs), state.turns, id(last),
           hash(last.content) if last is not None else 0, hash(state.messages[0].content) if last is not None else 0,
           hash(tuple(state.config.steering)))
    cached = _last  # read once: another thread may set it meanwhile (each view holds its own state)
    if cached is not None and cached[0] == key:
        return cached[1]
    made = View(state)
    _last = (key, made)
    return made
