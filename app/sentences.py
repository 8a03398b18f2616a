"""A small offline sentence splitter (stands in for nltk's punkt, which downloads its model)."""

from __future__ import annotations

import re

# A sentence ends at . ! or ? (optionally followed by closing quotes or brackets) before
# whitespace and an opening capital, digit or quote; common abbreviations do not end one.
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "inc", "ltd",
                  "co", "no", "fig", "vol", "pp", "u.s", "u.k", "jan", "feb", "mar", "apr", "jun", "jul", "aug",
                  "sep", "sept", "oct", "nov", "dec"}
_BOUNDARY = re.compile(r"([.!?][\"'\u201d\u2019)\]]*)\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Splits text into sentences; whitespace between sentences is dropped."""
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(text):
        end = match.end(1)
        words = text[start:end].rstrip(".!?\"')]\u201d\u2019").split()
        last = words[-1].lower() if words else ""
        if last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha()):
            continue  # "Dr. Smith", "J. Doe"
        sentences.append(text[start:end].strip())
        start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences
