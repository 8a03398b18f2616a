"""Whether an answer is written in the passages it was read from.

A model that copies its answers out of the passages (the bundled lookup reader; a model folder says
so with `extractive_answers` in its docqa.json) can still produce a value that is in none of them:
a made-up answer. The app then flags it instead of presenting it as read. The check is textual and
lenient (case, spacing, quotes, dashes and the answer's outer punctuation do not matter; a list
answer passes when each of its items is found), so a copied answer is never flagged for its form.

A small model copying a long span in parallel diffusion steps sometimes garbles a few of its
characters ("a thread error Silector" for "a thread error detector", "--zero-bables=function" for
"--zero-before=function"); `closest_span` finds the span it was copying, so the app shows the
passage's own words instead of flagging a copy for a typo.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

# How alike (difflib's ratio, 0-1, on normalized text) an answer and a passage's span must be for the
# span to stand for the answer: on probe-reading's rows (journal, 2026-12-05) 0.75 mended every
# garbled copy seen and changed no right answer; a wrong value of the same kind ("50" for "100")
# is far below it.
SIMILAR_SPAN = 0.75
MAX_SPAN_WORDS = 16  # longer answers are sentences, not copied values: they are left as written
# Shorter answers are left as written: a character or two is most of them ("50" / "500").
MIN_SPAN_CHARS = 6
_SPAN_EDGES = " .,;:!?\"'()[]"
# "A, B and C" / "A; B" / "A or B": the items of a list answer. A comma inside a number ("7,160")
# has no space after it and stays.
_ITEM_SEPARATORS = re.compile(r",\s+|;\s*|\s+(?:and|or|&)\s+")
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-"})


@dataclass(frozen=True)
class Passage:
    """A passage's text and where it lies in its document (characters), so that passages that
    follow each other are read as one text (a value cut by a chunk boundary is still found)."""

    document_id: str
    char_start: int  # -1: not known
    char_end: int
    text: str


def normalized(text: str) -> str:
    """Pure: lower case, one space for any run of white space, curly quotes and dashes plain."""
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES).lower()
    return " ".join(text.split())


def answer_items(answer: str) -> list[str]:
    """Pure: the answer's items, normalized, without their outer punctuation ("PDF, JSON and PNG."
    -> ["pdf", "json", "png"]; "7,160 euros" stays one)."""
    items = _ITEM_SEPARATORS.split(normalized(answer))
    return [s for s in (item.strip(" .,;:!?\"'()[]") for item in items) if s]


def joined_passages(passages: Sequence[Passage]) -> list[str]:
    """Pure: the passages' texts, normalized, those that follow each other in a document joined."""
    ordered = sorted(passages, key=lambda p: (p.document_id, p.char_start))
    texts: list[str] = []
    previous: Passage | None = None
    for p in ordered:
        follows = (previous is not None and p.char_start >= 0 and previous.document_id == p.document_id
                   and previous.char_end == p.char_start)
        if follows:
            texts[-1] += p.text
        else:
            texts.append(p.text)
        previous = p
    return [normalized(t) for t in texts]


def answer_in_passages(answer: str, passages: Sequence[Passage]) -> bool:
    """Pure: whether every item of `answer` is written in one of the passages (an empty answer is)."""
    texts = joined_passages(passages)
    return all(any(item in text for text in texts) for item in answer_items(answer))


def closest_span(answer: str, passages: Sequence[Passage]) -> str | None:
    """Pure: the run of whole words of one of the passages (as written there, its outer
    punctuation stripped) most like `answer`, of the answer's word count give or take one, with the
    same digits in the same order (a number is never changed into another), when it is at least
    SIMILAR_SPAN alike; else None, and for an answer shorter than MIN_SPAN_CHARS or longer than
    MAX_SPAN_WORDS words. Ties go to the earlier span."""
    target = normalized(answer).strip(_SPAN_EDGES)
    n = len(target.split())
    if len(target) < MIN_SPAN_CHARS or n > MAX_SPAN_WORDS:
        return None
    digits = re.sub(r"\D", "", target)
    best, best_ratio = None, SIMILAR_SPAN
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(target)  # difflib caches the second sequence's index
    for passage in passages:
        words = passage.text.split()
        for length in range(max(1, n - 1), n + 2):
            for i in range(len(words) - length + 1):
                span = " ".join(words[i:i + length]).strip(_SPAN_EDGES)
                if re.sub(r"\D", "", span) != digits:
                    continue
                matcher.set_seq1(normalized(span))
                if matcher.real_quick_ratio() < best_ratio or matcher.quick_ratio() < best_ratio:
                    continue
                ratio = matcher.ratio()
                if ratio > best_ratio or (best is None and ratio >= best_ratio):
                    best, best_ratio = span, ratio
    return best


def grounded_answer(answer: str, passages: Sequence[Passage]) -> str | None:
    """Pure: `answer` as written in the passages: itself where they hold it, the span it was
    copying where a close one exists (`closest_span`), else None (not from the passages)."""
    if answer_in_passages(answer, passages):
        return answer
    return closest_span(answer, passages)
