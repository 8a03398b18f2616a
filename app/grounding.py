"""Whether an answer is written in the passages it was read from.

A model that copies its answers out of the passages (the bundled lookup reader; a model folder says
so with `extractive_answers` in its docqa.json) can still produce a value that is in none of them:
a made-up answer. The app then flags it instead of presenting it as read. The check is textual and
lenient (case, spacing, quotes, dashes and the answer's outer punctuation do not matter; a list
answer passes when each of its items is found), so a copied answer is never flagged for its form.

A small model copying a long span in parallel diffusion steps sometimes garbles a few of its
characters ("a thread error Silector" for "a thread error detector", "--zero-bables=function" for
"--zero-before=function"); `closest_span` finds the span it was copying, so the app shows the
passage's own words instead of flagging a copy for a typo. It also commits an answer's end a few
characters early at times ("1,84" for "1,840", "Caleb S" for "Caleb Sato"), still a span of the
passage; `completed_at_word_end` shows the word the passage completes it to.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

# How alike (difflib's ratio, 0-1, on normalized text) a garbled copy and the passage's span it
# was copying are at least, as a whole and word by word. closest_span only runs on answers the
# passages do not hold, so its risk is a wrong answer losing its warning: the span keeps the
# answer's word count, its numbers and a likeness in every word ("not supported" never becomes
# "supported", "1.2" never "12", "xz" never "lzma").
SIMILAR_SPAN = 0.75
SIMILAR_WORD = 0.5
# A word may differ from its span's only where both are this long (garbles are in long copies;
# "MB" / "ms" and "xz" / "gz" are different values), neither holds a digit ("CRC-32X" and
# "CRC-32C" may name two things), and the two are no pair of opposites below.
MIN_MENDED_WORD = 6
_OPPOSITES = (("min", "max"), ("enabl", "disabl"), ("input", "output"), ("upper", "lower"), ("first", "last"),
              ("before", "after"), ("increas", "decreas"), ("includ", "exclud"), ("allow", "den"),
              ("import", "export"), ("encod", "decod"), ("encrypt", "decrypt"), ("compress", "decompress"),
              ("read", "writ"), ("start", "stop"), ("open", "clos"), ("add", "remov"), ("load", "unload"),
              ("lock", "unlock"), ("mount", "unmount"), ("sign", "unsign"), ("valid", "invalid"))
MAX_SPAN_WORDS = 16  # longer answers are sentences, not copied values: they are left as written
# Shorter answers are left as written: a character or two is most of them ("50" / "500").
MIN_SPAN_CHARS = 6
_OUTER_PUNCTUATION = " .,;:!?\"'"
_NUMBER = re.compile(r"\d+")
# "A, B and C" / "A, B, and C" / "A; B" / "A or B": the items of a list answer. A comma inside a number ("7,160")
# has no space after it and stays.
_ITEM_SEPARATORS = re.compile(r",?\s+(?:and|or|&)\s+|,\s+|;\s*")
# The rest of a word, identifier or number cut inside it: a word character right after the cut,
# then word characters and a dot, comma, colon, slash or hyphen between two of them ("1,8|40",
# "os.pa|th.join", "Sa|to"); a space ends it. Nothing where the cut falls at a word's end: "10" of
# "10-15" and "1" of "1.5" are whole values, not cut ones.
_WORD_REST = re.compile(r"\w(?:\w|[.,:/-](?=\w))*")
MIN_CUT_CHARS = 2  # a one-character answer ("5") is left as written: "50" and "500" are different values
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
    return [s for s in (item.strip(_OUTER_PUNCTUATION + "()[]") for item in items) if s]


def _unbracketed(text: str) -> str:
    """Pure: `text` without the outer punctuation, brackets and quotes around it, brackets only
    where unmatched inside ("(see x" -> "see x"; "malloc()" stays)."""
    while True:
        before = text
        text = text.strip(_OUTER_PUNCTUATION)
        if text[:1] in "([" and text.count(")" if text[:1] == "(" else "]") < text.count(text[:1]):
            text = text[1:]
        if text[-1:] in ")]" and text.count("(" if text[-1:] == ")" else "[") < text.count(text[-1:]):
            text = text[:-1]
        if text == before:
            return text


def joined_passages(passages: Sequence[Passage]) -> list[str]:
    """Pure: the passages' texts, normalized, those that follow each other in a document joined."""
    return [normalized(t) for t in _joined(passages)]


def _joined(passages: Sequence[Passage]) -> list[str]:
    """Pure: the passages' texts as written, those that follow each other in a document joined."""
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
    return texts


def answer_in_passages(answer: str, passages: Sequence[Passage]) -> bool:
    """Pure: whether every item of `answer` is written in one of the passages (an empty answer is)."""
    texts = joined_passages(passages)
    return all(any(item in text for text in texts) for item in answer_items(answer))


def closest_span(answer: str, passages: Sequence[Passage]) -> str | None:
    """Pure: the run of as many whole words of one of the passages as the answer has (as written
    there, outer punctuation and unmatched brackets dropped) most like `answer`: with the same
    numbers in the same order, at least SIMILAR_SPAN alike as a whole and SIMILAR_WORD word by word;
    else None, and for an answer shorter than MIN_SPAN_CHARS or longer than MAX_SPAN_WORDS words.
    Ties go to the earlier span."""
    target = _unbracketed(normalized(answer))
    target_words = target.split()
    n = len(target_words)
    if len(target) < MIN_SPAN_CHARS or n > MAX_SPAN_WORDS:
        return None
    numbers = _NUMBER.findall(target)
    whole = difflib.SequenceMatcher(autojunk=False)
    whole.set_seq2(target)  # difflib indexes the second sequence once
    word = difflib.SequenceMatcher(autojunk=False)
    best, best_ratio = None, SIMILAR_SPAN
    for passage in passages:
        raw = passage.text.split()
        words = [_unbracketed(normalized(w)) for w in raw]  # each word normalized once
        for i in range(len(words) - n + 1):
            span = " ".join(words[i:i + n]).strip()
            if _NUMBER.findall(span) != numbers:
                continue
            whole.set_seq1(span)
            if whole.real_quick_ratio() < best_ratio or whole.quick_ratio() < best_ratio:
                continue
            ratio = whole.ratio()
            if ratio < best_ratio or (best is not None and ratio == best_ratio):
                continue
            if all(_alike(word, a, b) for a, b in zip(target_words, words[i:i + n], strict=True)):
                best, best_ratio = _unbracketed(" ".join(raw[i:i + n])), ratio
    return best


def _alike(matcher: difflib.SequenceMatcher, a: str, b: str) -> bool:
    """Whether the answer's word `a` may be a garbled copy of the passage's word `b`."""
    if a == b:
        return True
    if min(len(a), len(b)) < MIN_MENDED_WORD or any(c.isdigit() for c in a + b):
        return False
    if any((x in a and y in b) or (y in a and x in b) for x, y in _OPPOSITES):
        return False
    matcher.set_seqs(a, b)
    return matcher.ratio() >= SIMILAR_WORD


def completed_at_word_end(answer: str, passages: Sequence[Passage]) -> str:
    """Pure: `answer` with its last word completed as the passages write it ("1,84" -> "1,840",
    "Dahl and Caleb S" -> "Dahl and Caleb Sato"), where its last item ends inside a word or number
    everywhere the passages hold it and they complete it alike everywhere; else `answer`.

    A parallel decoder sometimes commits the answer's end before its last characters (the end's
    slot cannot see what its neighbour will hold), and a value cut short is still a span of the
    passage, so the substring check passes it: shown as read, "1,84" would be a wrong number."""
    text = answer.rstrip()
    last = _ITEM_SEPARATORS.split(text)[-1].strip()
    if not text[-1:].isalnum() or len(last) < MIN_CUT_CHARS:
        return answer
    # Where a word, identifier or number begins: "84" is no cut copy of "1,840".
    pattern = re.compile(r"(?<!\w)(?<!\w[.,:/-])" + r"\s+".join(re.escape(w) for w in last.split()), re.IGNORECASE)
    rests = {m.group() if (m := _WORD_REST.match(t, found.end())) else ""
             for t in _joined(passages) for found in pattern.finditer(t)}
    if len(rests) != 1 or "" in rests:  # held whole somewhere, ambiguous, or not found as written
        return answer
    return text + rests.pop()


def without_repeated_items(answer: str) -> str:
    """Pure: a list answer with each value once, in the order first given ("7, 8, 9, 9" -> "7, 8, 9";
    "A, B and A" -> "A, B"): a diffusion decoder can commit one value into two slots of a list, and
    a value shown twice reads as two. An answer of more than MAX_SPAN_WORDS words is a sentence and
    is left as written, as is one without repeats."""
    if len(answer.split()) > MAX_SPAN_WORDS:
        return answer
    # [item, separator, item, separator, item, ...]: the separators as the answer writes them.
    parts = re.split(f"({_ITEM_SEPARATORS.pattern})", answer)
    kept, seen = [parts[0]], set(answer_items(parts[0]))
    for separator, item in zip(parts[1::2], parts[2::2], strict=True):
        value = answer_items(item)  # the item normalized: [] for an empty one, else one value
        if value and value[0] in seen:
            continue
        seen.update(value)
        kept += [separator, item]
    return "".join(kept)


def grounded_answer(answer: str, passages: Sequence[Passage]) -> str | None:
    """Pure: `answer` as written in the passages: itself where they hold it (its last word
    completed where it was cut: `completed_at_word_end`), the span it was copying where a close
    one exists (`closest_span`), else None (not from the passages)."""
    if answer_in_passages(answer, passages):
        return completed_at_word_end(answer, passages)
    return closest_span(answer, passages)
