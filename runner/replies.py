"""What a model's final reply is: an answer, an abstention, or no answer at all.

Both the steering (which decides whether to take a reply) and the suite's grading (which
decides whether a taken reply counts) need the same judgement of a reply's form, apart from
whether its content is right: does it paste the chat's markup or a tool result back, write a
tool call as text, list tool names, tell the user how to call the tools, restate the question,
or say that the information is not there. They live here, in a module that imports neither.

`classify` puts a reply in one of three classes (`ReplyClass`), with the reason in words.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

PROTOCOL = re.compile(r"</?tool_(?:response|call)>|<\|im_(?:start|end)\|>")
"""The chat's own markup, which no answer holds: a transcript or tool result pasted back."""
TOOL_JSON = re.compile(r'"(?:name|arguments|parameters|properties|function|type)"\s*:')
"""A JSON key of a tool call or a tool schema: a reply holding one wrote a call or pasted the
tools as text."""
TOOL_LIST_MAX_OTHER_WORDS = 6
"""A reply naming two or more tools with fewer other words than this is a list of tools."""
ECHO_LINE_CHARS = 40
"""A tool-result line at least this long, found verbatim in a reply, makes the reply a copy."""
ABSTAINS = re.compile(
    r"\b(?:(?:is|are|was|were|'s)(?:n't| not) (?:mentioned|found|listed|specified|present|available|included|stated|"
    r"given|provided|defined|configured|recorded|shown|there|in (?:the|any))"
    r"|not (?:mentioned|listed|specified|stated|recorded|provided|given) (?:in|anywhere)"
    r"|no (?:information|mention|record|data|details?|entry|indication|reference)s?\b"
    r"|(?:does|do|did)(?:n't| not) (?:say|mention|contain|specify|include|list|state|show|give|record)"
    r"|(?:cannot|can't|could not|couldn't|unable to) (?:find|determine|tell|locate|see)"
    r"|there (?:is|are) no (?:\w+ )?(?:information|mention|record|data|details?|entry|file)"
    r"|information (?:is )?not (?:available|there)|not (?:available|found) in)", re.IGNORECASE)
"""A reply that says the information is not there (an abstention), in the ways models say it."""
TOOL_VERBS = re.compile(r"\b(?:call|calling|use|using|invoke|run)\b", re.IGNORECASE)
PLANS = re.compile(r"\b(?:I|we) (?:need|have|will need|would need|should|can|could|must|will|would)(?: to)? "
                   r"(?:read|call|use|check|look|open|search|find|list|grep|scan|inspect)\b"
                   r"|\blet me (?:read|call|use|check|look|open|search|find|list)\b", re.IGNORECASE)
"""A reply that says what it would read or call instead of answering ("I need to read ...");
telling the user what they can do ("you can use pytest") is an answer to a how-to question."""
YES_NO = re.compile(r"\s*(?:is|are|was|were|does|do|did|can|could|has|have|had|should|will|would)\b", re.IGNORECASE)
"""A question answered by yes or no."""
FILLER = frozenset("a an the is are was were be it its this that there here of in on to for and i my me you your "
                   "file files".split())
"""Words a reply may add to its question's and still say nothing new."""
SMALL_TALK = re.compile(
    r"(?:\W*(?:hi|hello|hey|hiya|howdy|good (?:morning|afternoon|evening)|thanks|thank you|thx|cheers|bye|goodbye|"
    r"ok|okay|great|cool|nice|perfect|that'?s (?:all|it)|that is (?:all|it)|how are you|who are you|"
    r"what can you do|can you help(?: me)?)(?: there| again| all| everyone| so much| very much| a lot| today)?)+[\W_]*",
    re.IGNORECASE)
"""A message that is only greetings, thanks or asking what the agent is: it asks nothing to look up."""
BLANK = re.compile(r"\[[A-Za-z][\w .'-]{1,40}\](?!\()|<[A-Za-z]\w* [\w .'-]{1,40}>|\{[A-Za-z]\w* [\w .'-]{1,40}\}")
"""A blank of a template answer: ``[region]``, ``<total amount>``, ``{user name}`` (not a Markdown
link, nor a tag or a type such as ``<div>`` or ``List<String>``)."""
LISTED_LINE = re.compile(r"^\s*[-*]?\s*\S+\.\w{1,5}\s*\(\d+ bytes\)\s*$", re.MULTILINE)
"""A line of a folder listing, ``path (N bytes)``."""
LISTING_PASTE_LINES = 3
"""A reply with this many listing lines or more pasted the listing."""

PASTED_LINES = 3
OWN_WORDS = 8
"""A reply with `PASTED_LINES` lines of one tool result and fewer than `OWN_WORDS` words of its
own pasted the result (`pastes`)."""

ReplyKind = Literal["answer", "abstention", "no_answer"]


@dataclass(frozen=True)
class ReplyClass:
    """What a final reply is.

    Attributes:
        kind: an answer, an abstention (says the information is not there), or no answer.
        why: for no answer, what it is instead, in words; None otherwise.
    """

    kind: ReplyKind
    why: str | None = None


def classify(reply: str, question: str, tool_results: Sequence[str] = (),
             tool_names: Iterable[str] = ()) -> ReplyClass:
    """What `reply` is, as the last word of a run asked `question`: for small talk, an answer
    unless it is empty or protocol text; else no answer when it is empty,
    holds the chat's markup or tool-call JSON, pastes a folder listing or a tool result,
    lists tool names, tells how to call the tools or says what it would read, or restates the
    question; an abstention when it says the information is not there; else an answer.

    Args:
        tool_results: the text of every tool result the run saw.
        tool_names: the tools the run offered.
    """
    names = list(tool_names)
    if small_talk(question):  # any friendly reply answers small talk; only the protocol's own text does not
        bare = not reply.strip() or PROTOCOL.search(reply) or TOOL_JSON.search(reply)
        return ReplyClass("no_answer", "is empty or protocol text") if bare else ReplyClass("answer")
    why = no_answer_reason(reply, question, tool_results, names)
    if why is not None:
        return ReplyClass("no_answer", why)
    return ReplyClass("abstention" if abstains(reply) else "answer")


def no_answer_reason(reply: str, question: str, tool_results: Sequence[str] = (),
                     tool_names: Sequence[str] = ()) -> str | None:
    """Why `reply` is no answer (`classify`), or None when it is one."""
    text = reply.strip()
    if not text:
        return "is empty"
    if PROTOCOL.search(text):
        return "holds the chat's tool-protocol markup"
    if TOOL_JSON.search(text):
        return "writes a tool call or a tool schema as JSON"
    if len(LISTED_LINE.findall(text)) >= LISTING_PASTE_LINES:
        return "pastes the folder's listing"
    if pastes(text, tool_results):
        return "pastes a tool result"
    if lists_tools(text.lower(), tool_names):
        return "lists tool names"
    if instructs(text, tool_names):
        return "tells how to call the tools instead of answering"
    if restates(text, question):
        return "repeats the question"
    return None


def small_talk(question: str) -> bool:
    """`question` is only small talk (`SMALL_TALK`): a greeting, thanks, asking what the agent is."""
    return SMALL_TALK.fullmatch(question) is not None


def abstains(reply: str) -> bool:
    """`reply` says the information is not there."""
    return ABSTAINS.search(reply) is not None


def pastes(reply: str, tool_results: Iterable[str]) -> bool:
    """`reply` is a tool result pasted back: `PASTED_LINES` or more of its lines are lines of one
    result, word for word (case and runs of whitespace aside), and the rest of it has fewer
    than `OWN_WORDS` words. Quoting a line or two inside an answer, or relaying a one-line
    result ("Research summary: errors.log mentions a timeout"), is an answer."""
    lines = [" ".join(line.lower().split()) for line in reply.splitlines()]
    lines = [line for line in lines if line]
    for result in tool_results:
        held = {" ".join(line.lower().split()) for line in result.splitlines()} - {""}
        copied = [line for line in lines if line in held]
        own = [w for line in lines if line not in held for w in words(line)]
        if len(copied) >= PASTED_LINES and len(own) < OWN_WORDS:
            return True
    return False


def echoes(answer: str, tool_results: Iterable[str]) -> bool:
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


def lists_tools(text: str, tool_names: Iterable[str]) -> bool:
    """True if `text` (lower case) names three or more of `tool_names`, or two or more with
    fewer than `TOOL_LIST_MAX_OTHER_WORDS` other words: a list of tools, not an answer."""
    named = {name for name in tool_names if re.search(rf"\b{re.escape(name.lower())}\b", text)}
    if len(named) >= 3:
        return True
    other = [w for w in re.findall(r"[a-z0-9_.]+", text) if w not in named]
    return len(named) >= 2 and len(other) < TOOL_LIST_MAX_OTHER_WORDS


def tells_how(reply: str, tool_names: Iterable[str]) -> bool:
    """`reply` names one of the tools and tells how to call it, or says what it would read or
    call (`PLANS`) instead of answering."""
    named = any(name and re.search(rf"\b{re.escape(name)}\b", reply) for name in tool_names)
    return (named and TOOL_VERBS.search(reply) is not None) or PLANS.search(reply) is not None


def instructs(reply: str, tool_names: Iterable[str]) -> bool:
    """`reply` tells how to call a tool (a verb of calling right before the tool's name: "call
    `read_file` with ...", "use the search_files tool") or says what it would read or call
    (`PLANS`): narrower than `tells_how`, which a review may send back on a hunch."""
    for name in tool_names:
        if name and re.search(rf"\b(?:call|calling|use|using|invoke|run)\s+(?:the\s+)?[`'\"]?{re.escape(name)}\b",
                              reply, re.IGNORECASE):
            return True
    return PLANS.search(reply) is not None


def restates(reply: str, question: str) -> bool:
    """`reply` asks a question back, or holds no word that its question (or `FILLER`) does
    not ("The note lists who attended a meeting."). A yes/no question ("Is the beta feature
    on?" "The beta feature is on.") and one that offers choices ("... 8080 or 9090?") are
    answered with their own words, so a reply to one only restates it when it ends in "?"."""
    if reply.rstrip().endswith("?"):
        return True
    asked = set(words(question))
    said = words(reply)
    return (bool(said) and "or" not in asked and not YES_NO.match(question)
            and all(w in asked or w in FILLER for w in said))


def words(text: str) -> list[str]:
    """The lower-cased words and numbers of `text`."""
    return re.findall(r"[a-z0-9]+", text.lower())
