"""Decoy values: a sentence that holds a value of the kind a question asks for, but does not answer it.

A question a document cannot answer ("Is there a maximum length for a glob pattern?") still finds
the passages on its topic, and those hold values of the asked kind (numbers, identifiers, names)
stated about something else. A reader trained only on near misses that lack such values learns
that "a number in view" means "the number asked for", and copies it. An unanswerable example with
a decoy shows the question's own passage without its answer, plus a sentence from elsewhere in the
corpus holding a value of the answer's kind, stated about a subject the question does not name;
the target stays "not found".

Pure functions of their input and an explicit `random.Random`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable

from engine.method.sentences import split_sentences
from training.cloze_questions import blanks, is_prose
from training.synonyms import FUNCTION_WORDS

_WORD = re.compile(r"[a-z0-9]+")
# Words of a question that name no subject ("What is the ... used for?", "Which option ...").
_QUESTION_WORDS = FUNCTION_WORDS | frozenset("""use used using default value called named tell find know need does
please""".split())


def value_kind(answer: str) -> str | None:
    """The kind of value `answer` is (training.cloze_questions.KINDS: "8080" a number, "--log-file" an
    identifier, "Thomas Leonard" a name, a quoted term), or None when it is a phrase ("a full or
    relative path") or several values: then no decoy of its kind exists."""
    answer = answer.strip()
    found = blanks(answer)
    if len(found) == 1 and found[0].start == 0 and found[0].end == len(answer):
        return found[0].kind
    return None


def subject_words(questions: Iterable[str]) -> frozenset[str]:
    """The words of `questions` that can name what they ask about (lower case, no function words):
    a decoy must share none of them, or it might answer the question after all."""
    return frozenset(w for q in questions for w in _WORD.findall(q.lower()) if w not in _QUESTION_WORDS)


def names_none_of(text: str, avoid: frozenset[str]) -> bool:
    """Whether `text` holds none of the words in `avoid` (a question's `subject_words`): then it is not
    about what the question asks, and cannot answer it."""
    return not avoid & set(_WORD.findall(text.lower()))


def decoy_sentence(paragraph: str, kind: str, avoid: frozenset[str], answer: str,
                   rng: random.Random) -> str | None:
    """A sentence of `paragraph` to show beside an unanswerable question: prose holding a value of
    `kind`, none of the words in `avoid` (the question's subject words), not the question's `answer`;
    drawn with `rng` among those that qualify, or None."""
    candidates = [s for s in split_sentences(paragraph)
                  if is_prose(s) and answer not in s and names_none_of(s, avoid)
                  and any(b.kind == kind for b in blanks(s))]
    return rng.choice(candidates) if candidates else None
