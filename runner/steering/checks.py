"""An answer weighed against the run's evidence: what it says that nothing returned, a number
no file shows, a line it rests on that has nothing to do with the question, a close call in its
own token probabilities, two answers that disagree. Each check reads a `View` and the model's
last reply; the reviews (`runner.steering.reviews`) decide what to do with what they find.
"""

from __future__ import annotations

import itertools
import math
import re

from runner.replies import abstains
from runner.steering.questions import (
    CALCULATES,
    COMPARES,
    FILE_QUESTION,
    FOLDER_QUESTION,
    ORDINALS,
    STOPWORDS,
    WHOLE_FOLDER_EXTREME,
    mentions,
    question_words,
    word_in,
)
from runner.steering.view import TABLE_FILES, View, call_label

NAMED = re.compile(r"(?<![\w.'`/-])([A-Z][A-Za-z]+(?: [A-Z0-9][\w]*)*|[A-Z]{2,}\w*)")
"""A name an answer gives inside a sentence: capitalised words in a row (``Region A``, ``Dana Levi``)."""
CALENDAR = frozenset("january february march april may june july august september october november december "
                     "monday tuesday wednesday thursday friday saturday sunday "
                     "celsius fahrenheit kelvin utc gmt am pm kb mb gb tb kib mib gib hz khz mhz ghz kw kwh".split())
"""Capitalised words an answer may work out rather than copy: a month or weekday from a date,
a unit or time zone from a value."""
QUOTED = re.compile(r"`([^`\n]+)`|\"([^\"\n]+)\"|“([^”\n]+)”")
"""Text an answer quotes: in backticks, straight or curly double quotes."""
SIZE = re.compile(r"\b(\d+)\s*bytes?\b", re.IGNORECASE)
FIGURE = re.compile(r"(?<![\d.])(\d+(?:[.,:]\d+)*)(?:\s*(%|[a-z]+\b))?", re.IGNORECASE)
"""A number in text (``1.8``, ``08:05:17``, ``1,200``), with the word or % after it."""
FILLER = frozenset("a an the is are was were be it its this that there here of in on to for and i my me you your "
                   "file files".split())
"""Words an answer may add to its question's and still say nothing new."""
ANSWER_WORDS = frozenset("yes no not on off true false enabled disabled".split())
"""Yes, no and their kin: the words that answer a yes/no question."""
CARRYING = re.compile(rf"\d[\d.,:]*\d|\d|\b[A-Z][A-Za-z]+\b|(?i:\b(?:{'|'.join(sorted(ANSWER_WORDS))})\b)")
"""The words that carry an answer: a number, a capitalised word, yes or no and their kin."""
RIVAL_AT_LEAST = 0.5
"""With confidence_check, a word of the answer is a close call when the likeliest other word of
its kind had at least this share of its probability (`unsure`)."""
SETTINGS_FILES = (".ini", ".cfg", ".conf", ".toml", ".json", ".yaml", ".yml", ".properties", ".env")
"""Files whose lines `unlinked` weighs with the section and keys they sit under."""
KEY_FILE = re.compile(r"[\w.-]+\.[A-Za-z][A-Za-z0-9]{0,4}\b")
"""A file's name in an answer (``station.ini``)."""
KEY_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")


def answer_of(v: View) -> str:
    return v.last.content or ""


def unsupported(v: View) -> str | None:
    """Text the answer quotes, or a name it gives inside a sentence (a month or weekday aside),
    that no tool result, the listing, the question or the run's own calls hold; or, once every
    listed file was read, a number none of them holds (`unshown_figure`); None when none."""
    answer = answer_of(v)
    seen = v.seen_text + " " + " ".join(call_label(c).lower() for c in v.calls.values())
    for quoted in QUOTED.findall(answer):
        text = " ".join(next(q for q in quoted if q).lower().split())
        if len(text) >= 3 and text not in seen:
            return f"`{text}`"
    for sentence in re.split(r"(?<=[.!?:;])\s+|\n+", QUOTED.sub("", answer)):
        for name in NAMED.finditer(sentence):
            words = name.group(1).split()
            if name.start() > 0 and words[0].lower() not in CALENDAR and " ".join(words).lower() not in seen:
                return f"`{name.group(1)}`"
    return None if v.unread else unshown_figure(v)


def unshown_figure(v: View) -> str | None:
    """A number the answer gives (with the word after it) that no tool result, the listing or
    the question holds, when the question asks for no count or sum; None when there is none."""
    if CALCULATES.search(v.question):
        return None
    shown = {form for m in FIGURE.finditer(v.seen_text) for form in _forms(m.group(1))}
    for m in FIGURE.finditer(answer_of(v)):
        if _forms(m.group(1))[0] not in shown:
            unit = "" if (m.group(2) or "").lower() in FILLER else m.group(2) or ""
            return f"`{m.group(1)}{unit if unit in ('', '%') else ' ' + unit}`"
    return None


def _forms(figure: str) -> list[str]:
    """The ways of writing a number taken as the same: itself without thousands commas, then,
    for a clock time, each run of two or three of its parts (``08:05:17`` gives ``08:05``)."""
    parts = figure.replace(",", "").split(":")
    return [":".join(parts), *(":".join(parts[i:i + n]) for n in (2, 3) for i in range(len(parts) - n + 1))]


def unsure(v: View) -> str | None:
    """The word of the answer (`CARRYING`) that was the closest call, as `word`: a token of it
    whose likeliest other token begins a word of the same kind and had at least
    `RIVAL_AT_LEAST` of its probability. None without token probabilities or a close call."""
    tokens = v.last.logprobs or []
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


def unlinked(v: View) -> tuple[str, str, str] | None:
    """The answer's own words found only on lines of the files read that mention no word of
    the question, neither on the line nor in where it sits (its file's name, a settings
    file's section and keys, a table's header): as the words, the line and its file; None when
    the answer adds nothing such, a line holding most of them mentions the question, or the
    question counts, compares, orders or asks for a file."""
    asked = v.question
    if any(p.search(asked) for p in (CALCULATES, COMPARES, FOLDER_QUESTION, FILE_QUESTION)):
        return None
    stems = [stem for _, stem in question_words(asked)]
    if not stems or any(word in ORDINALS for word in _words(asked)):
        return None
    asked_words = set(_words(asked))
    answer_words = {w for w in _words(answer_of(v))
                    if w not in asked_words and w not in STOPWORDS and w not in FILLER
                    and (len(w) >= 3 or w.isdigit()) and not any(word_in(w, stem) for stem in stems)}
    lines = [(path, line, f"{path} {where} {line}".lower())
             for path, text in v.read_files for line, where in _file_lines(path, text)]
    held = [(len(answer_words & set(_words(line))), path, line, context) for path, line, context in lines]
    most = max((n for n, *_ in held), default=0)
    if most == 0:
        return None
    best = [(path, line, context) for n, path, line, context in held if n == most]
    if any(word_in(context, stem) for _, _, context in best for stem in stems):
        return None
    path, line, _ = best[0]
    return " ".join(sorted(answer_words & set(_words(line)))), line, path


def _file_lines(path: str, text: str) -> list[tuple[str, str]]:
    """A file's non-blank lines as `unlinked` weighs them, each with where it sits: a table's
    rows after its header; in a settings file the section above a line and the keys that open
    the blocks holding it; any other line alone."""
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


def unrelated(v: View) -> bool:
    """Files were read, none of them (nor any other result but a listing) mentions a word of
    the question, and listed files are still unread: the answer came from the wrong file. A
    question about the files themselves, one that names a file the run read, and one whose
    run read a table are left out."""
    asked = v.question
    stems = [stem for _, stem in question_words(asked)]
    texts = [text.lower() for text in v.result_texts(listings=False)]
    if not stems or not texts or FOLDER_QUESTION.search(asked) or not v.unread:
        return False
    read = [label.lower() for label in v.read_labels(listings=False)]
    if any(label in asked.lower() or label.endswith(TABLE_FILES) for label in read):
        return False
    return not any(mentions(text, stem) for stem in stems for text in texts)


def wrong_extreme(v: View) -> tuple[str, str, str, str] | None:
    """For a question that asks for the largest or smallest of all the files, when the system
    prompt lists every file and the answer names listed files but not that one: (direction,
    the file, its size, the files named); else None."""
    match = WHOLE_FOLDER_EXTREME.search(v.question)
    listed = dict(v.prompt_listing)
    if match is None or len(listed) < 2:
        return None
    direction = next(g for g in match.groups() if g).lower()
    pick = max if direction in ("largest", "biggest") else min
    file = pick(listed, key=lambda path: (int(listed[path]), path))
    lowered = answer_of(v).lower()
    named = [p for p in listed if p.lower() in lowered or p.rsplit("/", 1)[-1].lower() in lowered]
    if not named or file in named:
        return None
    return direction, file, listed[file], ", ".join(named)


def listed_size_quoted(v: View) -> tuple[str, str] | None:
    """The answer gives a size in bytes that a listed file has ("167 bytes", that file), the
    question not being about the files themselves; else None."""
    if FOLDER_QUESTION.search(v.question) or FILE_QUESTION.search(v.question):
        return None
    sizes = {size: path for path, size in v.listed}
    return next(((m.group(0), sizes[m.group(1)]) for m in SIZE.finditer(answer_of(v)) if m.group(1) in sizes), None)


def names_a_file(v: View, answer: str) -> bool:
    """`answer` names a file the run has seen listed or has read, or one a result named (a
    search's matching line); True when the run knows of no file, so there is nothing to ask."""
    paths = [path for path, _ in v.listed] + v.read_labels(listings=False)
    if not paths:
        return True
    lowered = answer.lower()
    return any(p.lower() in lowered or p.rsplit("/", 1)[-1].lower() in lowered for p in paths)


def mentioning(v: View, read: str) -> str:
    """`MENTIONING` for the files the run read whose text holds a word of the question, or ""."""
    from runner.steering.texts import MENTIONING

    words = question_words(v.question)
    files: list[str] = []
    found: list[str] = []
    for path, text in v.read_files:
        hits = [w for w, stem in words if mentions(text.lower(), stem)]
        if hits and path not in files:
            files.append(path)
            found += [w for w in hits if w not in found]
    if not files:
        return ""
    return MENTIONING.format(read=read, files=", ".join(files), verb="mentions" if len(files) == 1 else "mention",
                             words=" and ".join(found))


def answer_keys(answer: str, asked: str = "") -> set[str]:
    """What an answer gives, in lower case: the text it quotes, the files it names, its numbers
    and the words of the names it gives (not filler, yes or no, a month, nor a word of the
    question `asked`)."""
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
    if abstains(first):
        return False
    if abstains(second):
        return True
    a, b = " ".join(first.lower().split()), " ".join(second.lower().split())
    opening = [re.match(r"\W*(yes|no)\b", x) for x in (a, b)]
    if opening[0] and opening[1] and opening[0].group(1) != opening[1].group(1):
        return True
    return (any(k not in b for k in answer_keys(first, asked))
            and any(k not in a for k in answer_keys(second, asked)))


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())
