"""A small offline sentence splitter (stands in for nltk's punkt, which downloads its model)."""

from __future__ import annotations

import re

# A sentence ends at . ! or ? (optionally followed by closing quotes or brackets) before
# whitespace and an opening capital, digit or quote; common abbreviations do not end one.
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "inc", "ltd",
                  "co", "no", "fig", "vol", "pp", "u.s", "u.k", "jan", "feb", "mar", "apr", "jun", "jul", "aug",
                  "sep", "sept", "oct", "nov", "dec"}
_BOUNDARY = re.compile(r"([.!?][\"'\u201d\u2019)\]]*)\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")


_PARAGRAPH = re.compile(r"\n[ \t]*\n\s*(?=\S)")


def _boundaries(text: str):
    """(end of a sentence, start of the next) for every sentence boundary, in order."""
    start = 0
    for match in _BOUNDARY.finditer(text):
        end = match.end(1)
        words = text[start:end].rstrip(".!?\"')]\u201d\u2019").split()
        last = words[-1].lower() if words else ""
        if last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha()):
            continue  # "Dr. Smith", "J. Doe"
        yield end, match.end()
        start = match.end()


def split_sentences(text: str) -> list[str]:
    """Splits text into sentences; whitespace between sentences is dropped."""
    sentences, start = [], 0
    for end, next_start in _boundaries(text):
        sentences.append(text[start:end].strip())
        start = next_start
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def sentence_starts(text: str) -> list[int]:
    """Character offsets where a sentence or a paragraph begins (not the text's start), sorted:
    where a document's chunks are best cut (`engine.method.chunking.chunk_tokens`)."""
    starts = {next_start for _, next_start in _boundaries(text)}
    starts.update(match.end() for match in _PARAGRAPH.finditer(text))
    return sorted(s for s in starts if 0 < s < len(text))
