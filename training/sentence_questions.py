"""Questions made from real sentences of the corpus, with the answer a span of the sentence.

"The default port is 8080." gives "What is the default port?" and "Which port is used by
default?", answer "8080". Each rule is a regular expression over one sentence and several question
wordings; the last wording of every rule is held out of training (`TRAINING_WORDINGS` vs
`HELD_OUT_WORDING`), and so are the corpus's held-out document kinds, so the evaluation asks
questions in wordings and over documents that training never saw.

Pure functions of their input: no state, no randomness.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A subject: a few words, no sentence punctuation; a value: a short span without a clause break.
_SUBJECT = r"[A-Za-z][\w+./-]*(?: (?!(?:is|was|are|defaults)\b)[\w+./-]+){0,5}"  # never past the verb
_VALUE = r"[^\s.,;:()][^.,;:()]{0,38}?"
_NAME = r"[A-Z][\w.'-]*(?: [A-Z][\w.'-]*){0,3}"  # a person's or group's name
# What may follow the value in the same sentence without being part of it.
_TAIL = r"(?:[,;] .*| (?:if|unless|when|but|and|or|for|in|on) .*)?"


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern
    wordings: tuple[str, ...]  # str.format templates over the pattern's named groups


def _rule(name: str, pattern: str, *wordings: str) -> Rule:
    return Rule(name, re.compile(pattern), wordings)


RULES: tuple[Rule, ...] = (
    _rule("default_is", rf"^The default (?P<x>{_SUBJECT}) is (?P<y>{_VALUE}){_TAIL}\.$",
          "What is the default {x}?", "Which {x} is used by default?", "If nothing else is set, what {x} is used?"),
    _rule("defaults_to", rf"^(?:The )?(?P<x>{_SUBJECT}) defaults to (?P<y>{_VALUE}){_TAIL}\.$",
          "What does {x} default to?", "What is the default of {x}?", "Unless changed, what value does {x} take?"),
    _rule("written_by", rf"^(?P<x>{_SUBJECT}) was (?:originally )?written by (?P<y>{_NAME})\.$",
          "Who wrote {x}?", "Who is the author of {x}?", "Whose work is {x}?"),
    _rule("made_by", rf"^(?P<x>{_SUBJECT}) (?:was|is) (?:developed|created|designed|maintained) by "
                     rf"(?P<y>{_NAME})\.$",
          "Who developed {x}?", "Who created {x}?", "Which people or group are behind {x}?"),
    _rule("stands_for", rf"^(?P<x>[A-Z][A-Z0-9]{{1,9}}) (?:stands for|is short for|is an abbreviation for) "
                        rf"(?P<y>{_VALUE})\.$",
          "What does {x} stand for?", "What is {x} short for?", "What is the long form of {x}?"),
    _rule("released_in", rf"^(?P<x>{_SUBJECT}) was (?:first )?(?P<v>released|introduced|published|added) in "
                         rf"(?P<y>(?:[A-Z][a-z]+ )?(?:19|20)\d\d)\.$",
          "When was {x} {v}?", "In what year was {x} {v}?", "What is the date on which {x} was {v}?"),
    _rule("port", rf"^(?P<x>{_SUBJECT}) (?:listens|runs|is available) on port (?P<y>\d{{2,5}})\b.*\.$",
          "Which port does {x} listen on?", "On what port does {x} run?", "What port number is {x} reached at?"),
    _rule("set_to", rf"^(?:By default,? )?(?:the |The )?(?P<x>{_SUBJECT}) is (?:set to|limited to) "
                    rf"(?P<y>\d[\w.]*(?: [a-z]+)?){_TAIL}\.$",
          "What is {x} set to?", "What value is {x} set to?", "How large is {x} configured to be?"),
)
TRAINING_WORDINGS = {rule.name: rule.wordings[:-1] for rule in RULES}
HELD_OUT_WORDING = {rule.name: rule.wordings[-1] for rule in RULES}


@dataclass(frozen=True)
class SentenceQuestion:
    rule: str
    sentence: str
    answer: str  # a span of `sentence`
    questions: tuple[str, ...]  # every wording of its rule, the held-out one last


def _subject(text: str) -> str:
    """A subject phrased for the middle of a question: a capitalised common first word lowered."""
    first, _, rest = text.partition(" ")
    if first[:1].isupper() and first[1:].islower() and rest and first.lower() in {"the", "this", "a", "an"}:
        return f"{first.lower()} {rest}"
    return text


def questions_for(sentence: str) -> list[SentenceQuestion]:
    """The questions the rules make of one sentence (usually none), answer spans checked."""
    sentence = " ".join(sentence.split())
    out = []
    for rule in RULES:
        m = rule.pattern.match(sentence)
        if not m:
            continue
        answer = m.group("y").strip()
        groups = {k: (_subject(v.strip()) if k == "x" else v) for k, v in m.groupdict().items() if v}
        if not answer or answer not in sentence or groups["x"].lower() in {"it", "this", "that", "they"}:
            continue
        out.append(SentenceQuestion(rule.name, sentence, answer, tuple(w.format(**groups) for w in rule.wordings)))
    return out
