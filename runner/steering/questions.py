"""What a question asks, in the policies' terms: about the files themselves, for a file, for
each file to be read, a comparison or a count; and the words that may name what holds its
answer (`question_words`), with the matching every policy shares (`mentions`, `word_in`).
"""

from __future__ import annotations

import re

SIZE_QUESTION = re.compile(
    r"\b(?:largest|smallest|biggest|heaviest|lightest)\b[^?]*\bfiles?\b|\bfiles?\b[^?]*\b(?:largest|smallest|biggest)\b",
    re.IGNORECASE)
"""A question that compares the files' sizes."""
WHOLE_FOLDER_EXTREME = re.compile(
    r"\b(?:which|what)\s+(?:file|one)\b[^?]*\b(largest|biggest|smallest)\b|\bthe\s+(largest|biggest|smallest)\s+file\b",
    re.IGNORECASE)
"""A question that asks for the largest or smallest of all the files, with no kind of file named."""
FOLDER_QUESTION = re.compile(
    rf"\bhow many\b[^?]*\b(?:files?|folders?|director(?:y|ies))\b|{SIZE_QUESTION.pattern}"
    r"|\blist (?:the|all|every|each)\b[^?]*\bfiles?\b", re.IGNORECASE)
"""A question about the files themselves (how many, which is largest), which a listing answers."""
READ_EACH = re.compile(r"\bread (?:each|every|all)\b|\bread (?:them|the files)\b", re.IGNORECASE)
"""A question that asks for every file to be read, which a listing does not answer."""
FILE_QUESTION = re.compile(
    r"\b(?:which|what)\s+(?:\w+\s+)?(?:files?|notes?|logs?|documents?|docs?|pages?|scripts?|sheets?)\b"
    r"|\bis there (?:a|an|any)\s+(?:\w+\s+)?(?:files?|notes?|logs?|documents?)\b", re.IGNORECASE)
"""A question whose answer is a file (which file mentions X, is there a file about Y)."""
COMPARES = re.compile(
    r"\b(?:most|least|fewest|highest|lowest|largest|smallest|biggest|greatest|maximum|minimum|max|min|"
    r"newest|oldest|latest|earliest|recent|recently|longest|shortest|cheapest|priciest|more|less|fewer|"
    r"higher|lower|larger|smaller|bigger|older|newer|cheaper|top)\b", re.IGNORECASE)
"""A question that compares values (the most, the latest, ...), which a table's extremes may answer."""
CALCULATES = re.compile(r"\bhow (?:many|much|often)\b|\b(?:number|count|total|sum|average|mean|percent(?:age)?)\b"
                        r"|\b(?:combined|altogether|difference|between)\b", re.IGNORECASE)
"""A question whose answer may be a number no file shows: one counted, added up or worked out."""
ORDINALS = frozenset("first last next previous final".split())
"""Question words that say which line is meant by its place, not by what it says."""
STOPWORDS = frozenset("""
about above after again also among and another answer any are because been before being below between both but
can cannot could did does doing done down during each few file files folder for from had has have having here
how into its just many more most much must not now off once only other our out over own same says should
some such than that the their them then there these they this those through under until very was were what
when where which while who whom whose why will with within would you your yours
""".split())
"""Words a question holds that say nothing about which file answers it."""
WORD_ENDINGS = r"(?:s|es|e|ed|d|ing|er|ers|ion|ions)?"
"""The endings a question's word may have in a line and still count as the same word."""


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


def mentions(text: str, stem: str) -> bool:
    """`text` (lower case) holds `stem`, spaces, hyphens and underscores aside: "to-do" is in
    "todo.md" and in "# to do"."""
    return stem in text or squash(stem) in squash(text)


def word_in(text: str, stem: str) -> bool:
    """`text` (lower case) holds `stem` as a word, or with a common ending (``s``, ``ed``,
    ``ing``, ...), spaces, hyphens and underscores between its letters aside: "to-do" is in
    "# to do", "cach" in "[cache]", "port" not in "export", "toma" not in "tomato"."""
    letters = squash(stem)
    joined = r"[\s_-]*".join(map(re.escape, letters))
    return bool(letters) and re.search(rf"(?<![a-z0-9]){joined}{WORD_ENDINGS}(?![a-z0-9])", text) is not None


def squash(text: str) -> str:
    return re.sub(r"[\s_-]+", "", text)
