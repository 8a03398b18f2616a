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
from collections.abc import Callable
from dataclasses import dataclass

# A subject: a few words, no sentence punctuation; a value: a short span without a clause break.
_SUBJECT = r"[A-Za-z][\w+./-]*(?: (?!(?:is|was|are|defaults)\b)[\w+./-]+){0,5}"  # never past the verb
_VALUE = r"[^\s.,;:()][^.,;:()]{0,38}?"
_NAME = r"[A-Z][\w.'-]*(?: [A-Z][\w.'-]*){0,3}"  # a person's or group's name
# What a sentence tells how to do: a lower-case verb phrase of a few words ("enable core dumps").
_ACTION = r"[a-z][\w'-]*(?: [\w./'=-]+){1,7}"
_PROPER = r"[A-Z][\w+.-]*(?: [A-Z][\w+.-]*){0,2}"  # a capitalised name of up to three words ("Valgrind", "GNU Make")
# What may follow the value in the same sentence without being part of it.
_TAIL = r"(?:[,;] .*| (?:if|unless|when|but|and|or|for|in|on) .*)?"


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern
    wordings: tuple[str, ...]  # str.format templates over the pattern's named groups and `derive`'s
    # More template fields from the matched groups, or None where the match asks nothing.
    derive: Callable[[dict[str, str]], dict[str, str] | None] | None = None


def _rule(name: str, pattern: str, *wordings: str,
          derive: Callable[[dict[str, str]], dict[str, str] | None] | None = None) -> Rule:
    return Rule(name, re.compile(pattern), wordings, derive)


# An option of a manual's option list, with its argument if any: "-b", "--block-size=SIZE",
# "-e PATTERNS", "--output <file>", "--color[=WHEN]".
_OPTION = r"-{1,2}[A-Za-z0-9?][\w-]*(?:=\S+|\[=[^\]]+\]| <[^>]+>| [A-Z][A-Z_]+\b)?"
# Verbs an option's description opens with ("Print the version", "Prints the version", "do not
# ignore entries"): a description that opens otherwise ("Deprecated option", "Same as -k", "FILE
# exists") tells no action to ask about.
OPTION_VERBS = frozenset("""
    abort accept add allow append apply ask assume attempt avoid be build call cause change check
    choose clear collect compare compile compress configure connect consider continue convert copy
    count create decode decompress decrease define delete dereference describe detach determine
    disable display do don't download drop dump edit emit enable encode exclude execute exit expand
    explain extract fail fetch filter find flush follow force format generate give group handle hide
    ignore include increase indent indicate inhibit initialize insert install interpret keep kill
    leave limit link list load lock log make mark match merge mount move name notify omit open
    output override overwrite pad parse pass pause perform place prefer prefix prepend preserve
    prevent print process produce prompt provide prune put query quit quote raise read rebuild
    receive recognize recover recurse redirect reduce refuse register reject reload remove rename
    repeat replace report request require reset resolve restore restrict resume retain retry return
    reverse rotate run save scale scan search select send set show sign silence skip sort specify
    split start stop store strip substitute suppress switch sync take tell test trace translate
    treat trust truncate turn unlink unpack unset update upload use validate verify wait warn wipe
    wrap write
""".split())


# A description cut before its object ("ignore entries starting with .") ends in one of these.
_DANGLING = frozenset("a an the to of with for in on by from and or as at into than".split())


def base_form(verb: str) -> str:
    """"prints" -> "print", "specifies" -> "specify", "does" -> "do"; a base form is returned as is."""
    if verb in OPTION_VERBS:
        return verb
    for third, base in (("doesn't", "don't"), ("does", "do"), ("ies", "y"), ("sses", "ss"), ("shes", "sh"),
                        ("ches", "ch"), ("xes", "x"), ("s", "")):
        if verb.endswith(third):
            return verb[: len(verb) - len(third)] + base
    return verb


def _third_person(verb: str) -> str:
    """"print" -> "prints", "specify" -> "specifies", "do" -> "does", "don't" -> "doesn't"."""
    if verb in ("be", "do", "don't"):
        return {"be": "is", "do": "does", "don't": "doesn't"}[verb]
    if verb.endswith(("s", "sh", "ch", "x", "z")):
        return verb + "es"
    if verb.endswith("y") and verb[-2:-1] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def _option_action(groups: dict[str, str]) -> dict[str, str] | None:
    """An option description's action in the base form ("print the author") and the third person
    ("prints the author"), or None where it does not open with a known verb."""
    first, _, rest = groups["x"].strip().partition(" ")
    base = base_form(first.lower())
    if base not in OPTION_VERBS or not rest or rest.split()[-1].lower() in _DANGLING:
        return None
    # "print the version and exit": the idiom's second verb agrees too ("prints ... and exits").
    third_rest = rest[: -len(" and exit")] + " and exits" if rest.endswith(" and exit") else rest
    return {"do": f"{base} {rest}", "does": f"{_third_person(base)} {third_rest}"}


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
    _rule("limit", rf"^The (?P<m>maximum|minimum) (?P<x>{_SUBJECT}) is "
                   rf"(?P<y>\d[\w.]*(?:,\d+)*(?: [A-Za-z]+)?){_TAIL}\.$",
          "What is the {m} {x}?", "What {m} {x} is allowed?", "What {m} applies to the {x}?"),
    _rule("called", rf"^(?P<x>{_SUBJECT}) (?P<be>is|are) (?:called|known as|named|referred to as) "
                    rf"(?P<y>{_VALUE}){_TAIL}\.$",
          "What {be} {x} called?", "By what name {be} {x} known?", "What name do people give {x}?"),
    _rule("kept_in", rf"^(?P<x>{_SUBJECT}) (?P<be>is|are) (?P<v>stored|kept|located|installed|saved|found|placed) "
                     rf"(?:in|under|at) (?P<y>{_VALUE}){_TAIL}\.$",
          "Where {be} {x} {v}?", "In which place {be} {x} {v}?", "What location holds {x}?"),
    _rule("requires", rf"^(?P<x>{_SUBJECT}) (?P<v>requires|needs) (?P<y>(?!to\b){_VALUE}){_TAIL}\.$",
          "What does {x} require?", "What is needed by {x}?", "Which prerequisite does {x} have?"),
    _rule("use_to", rf"^(?:You can |You may |You should )?[Uu]se (?P<y>{_VALUE}) to (?P<x>{_ACTION})\.$",
          "What can I use to {x}?", "How do I {x}?", "Which thing lets you {x}?"),
    _rule("to_use", rf"^To (?P<x>{_ACTION}), (?:use|run|type|call|set|pass|add|specify) (?P<y>{_VALUE})\.$",
          "What can I use to {x}?", "How do I {x}?", "Which thing lets you {x}?"),
    # A manual's option list: "-a, --all do not ignore entries starting with ." The answer is the
    # whole list of the option's names, so either name a user knows reads as right.
    _rule("option_does", rf"^(?P<y>{_OPTION}(?:, {_OPTION}){{0,2}}) (?P<x>[A-Za-z][\w'-]*(?: [^\s.;:()]+){{1,14}})\.?$",
          "Which option {does}?", "What option do I use to {do}?", "Is there a flag to {do}?",
          derive=_option_action),
    _rule("is_a", rf"^(?P<x>{_PROPER}) is (?P<y>an? (?!(?:lot|bit|few|little|number|part|way|acronym|abbreviation)\b)"
                  rf"[^.,;:() ]+ [^.,;:()]{{2,50}}?)(?: (?:that|which|who|used|for|to|in|on|with|from|and|or)\b.*)?\.$",
          "What is {x}?", "What kind of thing is {x}?", "Can you describe what {x} is?"),
)
TRAINING_WORDINGS = {rule.name: rule.wordings[:-1] for rule in RULES}
HELD_OUT_WORDING = {rule.name: rule.wordings[-1] for rule in RULES}


@dataclass(frozen=True)
class SentenceQuestion:
    rule: str
    sentence: str
    answer: str  # a span of `sentence`
    questions: tuple[str, ...]  # every wording of its rule, the held-out one last


# A subject that points outside its sentence ("this file", "it") asks nothing a reader can find;
# one opening with a conjunction ("If the value is set to 60") is a clause, not a subject.
_DEICTIC = {"it", "its", "this", "that", "these", "those", "they", "them", "their", "there", "here", "such", "which",
            "each", "he", "she", "we", "you", "your", "our", "one", "another", "other", "same"}
NOT_A_SUBJECT_START = _DEICTIC | {"if", "when", "whenever", "but", "and", "or", "so", "because", "while", "although",
                                   "since", "once", "after", "before", "unless", "whether", "where", "then", "also",
                                   "now", "however", "thus", "hence", "note", "any", "all", "some", "every", "no",
                                   "most", "many", "both", "either", "neither"}
_NOT_IN_A_SUBJECT = {"that", "which", "who", "whom", "whose", "then", "also", "only", "now", "not", "this", "these",
                     "those", "it", "them", "they", "following", "to", "if", "unless"}
# An answer that points elsewhere ("the following options") or runs into a clause ("--x if you want").
_NOT_IN_AN_ANSWER = {"this", "that", "which", "these", "those", "it", "them", "one", "following", "below", "above",
                     "not", "if"}
# "is called" that means "invoked": the value is then when or how, not a name.
_NOT_A_NAME_START = {"before", "after", "on", "in", "when", "by", "for", "with", "from", "once", "at", "whenever",
                     "if", "to", "only", "each", "every", "as", "during", "again", "first", "last", "under", "via",
                     "without"}


def _asks_something(rule: str, subject: str, answer: str) -> bool:
    """Whether a match makes a question a reader of its sentence can answer (see the word sets)."""
    words, answer_words = subject.lower().split(), answer.lower().split()
    if rule == "option_does":  # the "subject" is the option's description, checked by its rule
        return bool(words and answer_words)
    if not words or not answer_words or words[0] in NOT_A_SUBJECT_START:
        return False
    if set(words[1:]) & _NOT_IN_A_SUBJECT or set(answer_words) & _NOT_IN_AN_ANSWER:
        return False
    return not (rule == "called" and answer_words[0] in _NOT_A_NAME_START)


def _subject(text: str) -> str:
    """A subject phrased for the middle of a question: a capitalised common first word lowered."""
    first, _, rest = text.partition(" ")
    if rest and first in {"The", "A", "An"}:
        return f"{first.lower()} {rest}"
    return text


def context_window(sentences: list[str], i: int, max_chars: int) -> tuple[int, int]:
    """[lo, hi): sentence i with as many of its neighbours as fit in `max_chars` (joined by
    spaces), one more on each side in turn, so that a question's context fits one chunk."""
    lo, hi = i, i + 1
    while True:
        before = (lo, hi)
        if lo > 0 and len(" ".join(sentences[lo - 1:hi])) <= max_chars:
            lo -= 1
        if hi < len(sentences) and len(" ".join(sentences[lo:hi + 1])) <= max_chars:
            hi += 1
        if (lo, hi) == before:
            return lo, hi


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
        if not answer or answer not in sentence or not _asks_something(rule.name, m.group("x"), answer):
            continue
        if rule.derive is not None:
            derived = rule.derive(groups)
            if derived is None:
                continue
            groups |= derived
        out.append(SentenceQuestion(rule.name, sentence, answer, tuple(w.format(**groups) for w in rule.wordings)))
    return out
