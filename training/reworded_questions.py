"""Questions reworded the way people ask them, from questions made by rule out of a sentence.

The questions training.sentence_questions and training.parsed_questions make keep the sentence's
own words ("How many extra suppression files may I use?"). People asking about a manual do not:
"How many additional suppression files can I give valgrind at most?" swaps a word for a synonym,
names the program the manual is about, adds a hedge or a setting the passage does not mention,
drops the question mark. A model trained only
on the sentence's words learns to answer where every word of the question is in a passage and to
say "not found" otherwise, so it refuses most of what people type (the model card's PDF questions).

`reword` changes a question in those ways, each at random and independently, and never touches the
answer's words (the question must still ask for the same span). Whether the passage holds the fact
is left to the example: over a passage without the sentence the reworded question's answer is
still "not found", so what decides an answer stays the fact's presence, not the words' match.

Pure functions of the question, its answer, its context, a synonym map (training.synonyms) and an
explicit `random.Random`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass

from training.synonyms import FUNCTION_WORDS

# Each change's chance, drawn independently for each reworded question.
# WordNet's usual sense is often not the manual's ("setting" -> "scene"): one swap, in half the
# questions, teaches that a word may differ without making the question ask something else.
SYNONYM_SHARE = 0.5  # up to MAX_SWAPS content words swapped for a synonym
MAX_SWAPS = 1
TOPIC_SHARE = 0.35  # a name from the context the question lacks ("... in valgrind?")
# Words the passage lacks, not synonyms, are what makes a reader trained on the sentence's own words
# refuse ("How many extra suppression files may I use?" answered, the same with "at most" or "with
# valgrind" after it "not found"): a hedge or a setting, in most reworded questions.
HEDGE_SHARE = 0.4  # "... at most?", "... by default?"
SETTING_SHARE = 0.3  # "... on Linux?", "... in my build?"
OPENING_SHARE = 0.2  # "so ", "hey, ", "I was wondering: "
DROP_SHARE = 0.25  # an article or a determiner dropped
LOWERCASE_SHARE = 0.35  # the first letter in lower case
NO_MARK_SHARE = 0.3  # the question mark left off

# Openings and hedges people put around a question. None of relations.FRAMINGS (whose held-out ones
# the lookup evaluation uses) is among them.
OPENINGS = ("so ", "hey, ", "I was wondering: ", "in the docs, ", "does anyone know ", "um, ", "ok so ")
HEDGES = (" at most", " by default", " exactly", " roughly", " actually", " usually", " these days",
          " in practice", " again")
SETTINGS = (" on Linux", " on my machine", " in my build", " for my project", " on the command line",
            " in the manual", " according to the docs", " when I run it", " in my setup")
TOPIC_FORMS = (" in {t}", " with {t}", " for {t}", " in {t}'s docs", ", {t}")
_SEPARATORS = frozenset({",", ";", ":", "(", ")", '"', ", "})
_DROPPABLE = frozenset({"the", "a", "an", "this", "that"})
_TOKEN = re.compile(r"[A-Za-z][A-Za-z'-]*|[^A-Za-z\s]+|\s+")
# A name in running text: capitalised or with a digit or inner capitals ("Valgrind" mid-sentence,
# "bzip2", "PyPI"), three characters or more. Identifiers in capitals ("READ_ONLY") are left out:
# they are the values questions ask for, not what the document is about.
_NAME = re.compile(r"(?<![\w-])(?:[a-z][a-z0-9]*[0-9][a-z0-9]*|[A-Z][a-z0-9]+[A-Za-z0-9]*)(?![\w-])")
TOPIC_MIN_MENTIONS = 2  # a name the context mentions once is seldom what it is about


def _swap_synonyms(words: list[str], protected: set[str], synonyms: Mapping[str, Sequence[str]],
                   common: Callable[[str], bool], rng: random.Random) -> list[str]:
    """Up to MAX_SWAPS content words (not in `protected`) swapped for a common synonym; a plural
    "-s" kept. Only a lower-case word standing alone: a capitalised one is a name's ("Union
    Counties"), one joined to other characters an identifier's ("LEVEL4", "mime.text")."""
    places = []
    for i, w in enumerate(words):
        lower = w.lower()
        alone = all(j < 0 or j >= len(words) or words[j].isspace() or words[j] in _SEPARATORS for j in (i - 1, i + 1))
        if w != lower or not w[:1].isalpha() or lower in FUNCTION_WORDS or lower in protected or not alone:
            continue
        stem, suffix = (lower, "") if lower in synonyms else (lower[:-1], "s") if lower.endswith("s") else (lower, "")
        choices = [s + suffix for s in synonyms.get(stem, ()) if common(s + suffix)]
        if choices:
            places.append((i, choices))
    out = list(words)
    for i, choices in rng.sample(places, min(len(places), rng.randint(1, MAX_SWAPS))):
        out[i] = rng.choice(choices)
    return out


def topic_names(context: str, question: str, answer: str, words: Container[str] = frozenset()) -> list[str]:
    """Names the context mentions at least TOPIC_MIN_MENTIONS times that neither the question nor
    the answer holds, most frequent first: what a person asking about the document might add
    ("valgrind", "GnuPG"). A capitalised English word (one of `words`: "World", "Fort") is no name."""
    asked = question.lower() + " " + answer.lower()
    counts: dict[str, int] = {}
    named: set[str] = set()  # seen where a capital shows a name, not a sentence's opening
    for m in _NAME.finditer(context):
        name, start = m.group(0), m.start()
        if name.lower() in FUNCTION_WORDS or name.lower() in asked or name.lower() in words:
            continue
        counts[name] = counts.get(name, 0) + 1
        # A word capitalised only for opening a sentence is no name ("The", "Memory").
        if not (name[0].isupper() and name[1:].islower()) or (start and context[:start].rstrip()[-1:] not in ".!?:"):
            named.add(name)
    return sorted((n for n in named if counts[n] >= TOPIC_MIN_MENTIONS), key=lambda n: (-counts[n], n))


def reword(question: str, answer: str, context: str, synonyms: Mapping[str, Sequence[str]],
           common: Callable[[str], bool], rng: random.Random) -> str:
    """`question` (asking for `answer` over `context`) in words closer to a person's: synonyms,
    a name from the context, a hedge, a setting, an opening, a dropped article, lower case, no
    question mark, each drawn on its own. `common(word)` says whether a synonym is common enough to swap in."""
    body = question.strip()
    mark = body.endswith("?")
    body = body.rstrip("?").rstrip()
    words = _TOKEN.findall(body)
    protected = {w.lower() for w in re.findall(r"[A-Za-z][A-Za-z'-]*", answer)}
    if rng.random() < SYNONYM_SHARE:
        words = _swap_synonyms(words, protected, synonyms, common, rng)
    if rng.random() < DROP_SHARE:
        droppable = [i for i, w in enumerate(words) if w.lower() in _DROPPABLE and i > 0]
        if droppable:
            i = rng.choice(droppable)
            gone = 2 if i + 1 < len(words) and words[i + 1].isspace() else 1  # the word and its space
            words = words[:i] + words[i + gone:]
    body = "".join(words).rstrip()  # (a dropped last word leaves the space before it)
    if rng.random() < TOPIC_SHARE:
        names = topic_names(context, body, answer, synonyms)
        if names:
            body += rng.choice(TOPIC_FORMS).format(t=rng.choice(names[:3]))
    if rng.random() < HEDGE_SHARE:
        body += rng.choice(HEDGES)
    if rng.random() < SETTING_SHARE:
        body += rng.choice(SETTINGS)
    if rng.random() < OPENING_SHARE:
        opening = rng.choice(OPENINGS)
        body = opening + (body[:1].lower() + body[1:] if not body[:2].isupper() else body)
    if rng.random() < LOWERCASE_SHARE and not body[:2].isupper():
        body = body[:1].lower() + body[1:]
    return body + ("?" if mark and rng.random() >= NO_MARK_SHARE else "")


def one_token_words(encode: Callable[[str], Sequence[int]]) -> Callable[[str], bool]:
    """Whether a word after a space is one token of `encode`'s tokenizer (text -> ids): a word
    common in the text the tokenizer was fitted on, so common enough to swap in."""
    return lambda word: len(encode(" " + word)) == 1


@dataclass(frozen=True)
class Rewording:
    """`reword` with its word lists bound: training.synonyms' map, and which words are common
    enough to swap in (one token of the model's tokenizer, say)."""

    synonyms: Mapping[str, Sequence[str]]
    common: Callable[[str], bool]

    def __call__(self, question: str, answer: str, context: str, rng: random.Random) -> str:
        return reword(question, answer, context, self.synonyms, self.common, rng)
