"""Whether an answer is written in the passages it was read from.

A model that copies its answers out of the passages (the bundled lookup reader; a model folder says
so with `extractive_answers` in its docqa.json) can still produce a value that is in none of them:
a made-up answer. The app then flags it instead of presenting it as read. The check is textual and
lenient (case, spacing, quotes, dashes and the answer's outer punctuation do not matter; a list
answer passes when each of its items is found), so a copied answer is never flagged for its form.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

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
