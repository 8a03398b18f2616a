"""Questions made by blanking a span of a real sentence (cloze questions), over that sentence's text.

"Any file named Override.xml takes precedence over all other files in the same packages directory."
blanks "Override.xml" and asks "Any file named what takes precedence over all other files in the
same packages directory?"; "processing 3 data streams in parallel" asks "processing how many data
streams in parallel?". Where the blank is what a copula says of a subject, or a known verb's
object, the question is put in the order people ask it: "The default port is 8080." -> "What is
the default port?", "The tool prints 72 columns." -> "How many columns does the tool print?" (a
share of the time; about 1% of the corpus's blanks stand so). The rules of
training.sentence_questions cover a few sentence shapes (2,085 questions in the whole corpus); a
blank can be put in almost any sentence that holds a number, a name or an identifier, so every
relation a manual states becomes a question, in its own words.

A question a person types shares fewer words with the text than its sentence does, so the questions
are noised as Lewis et al. (2019, unsupervised QA by cloze translation) found helps: a window of
the sentence around the blank (people ask short questions), some words dropped, some swapped for
words of the same meaning. The answer is always a span of the text the example shows, found
exactly once in it.

Pure functions of their input and an explicit `random.Random`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from engine.method.sentences import split_sentences
from training.sentence_questions import NOT_A_SUBJECT_START, OPTION_VERBS, base_form, context_window

# Candidate answers, each a whole word or run of words, tried in this order (an earlier kind's span
# wins an overlap): numbers with their unit or percent sign, identifiers, names, quoted terms.
_NUMBER = re.compile(r"(?<![\w.-])(?:\d+(?:[.,]\d+)*(?:[-\u2013]\d+(?:[.,]\d+)*)?)(?:%|[A-Za-z]{1,3}\b)?(?![\w-])")
# An identifier: an option ("--log-file"), a file or path ("Override.xml", "/etc/mime.types"), a
# name with inner punctuation or case ("user.mime_type", "CRC-32C", "MulByXpowD", "NULL").
_IDENTIFIER = re.compile(r"(?<![\w./-])(?:--?[A-Za-z][\w-]*(?:=\S+)?|/?[\w-]+(?:[./_][\w-]+)+|"
                         r"[a-z]+[A-Z][\w]*|[A-Z][a-z]+[A-Z][\w]*|[A-Z]{2,}(?:-\d+[A-Z]*)?)(?![\w/-])")
# A name: two to four capitalised words ("Thomas Leonard", "Free Software Foundation").
_NAME = re.compile(r"(?<![\w.])(?!(?:The|A|An|This|That|These|In|On|If|When|For|With|See|Note|Use)\b)"
                   r"[A-Z][a-z]+(?:[ -](?:(?:of|de|van|von) )?[A-Z][a-z]+){1,3}(?![\w])")
_QUOTED = re.compile(r"[\u2018'\"\u201c]([^\u2018\u2019'\"\u201c\u201d]{2,40})[\u2019'\"\u201d]")
_OPENING, _CLOSING = "\u2018'\"\u201c(", "\u2019'\"\u201d)"
KINDS = ("number", "identifier", "name", "quoted")
# Capitals that are a heading or a requirement keyword (RFC 2119), not a thing a question asks for.
_NOT_AN_ACRONYM = frozenset("""MAY MUST SHALL SHOULD NOT REQUIRED RECOMMENDED OPTIONAL NAME SYNOPSIS DESCRIPTION
OPTIONS NOTE NOTES WARNING AND OR SEE ALSO BUGS AUTHOR AUTHORS FILES EXAMPLES""".split())
# A sentence of prose: no markup, code or cross-reference syntax (info's "*note", Texinfo, roff
# leftovers, assignments), mostly plain words.
_NOT_PROSE = re.compile(r"[*\\{}=|`#@]|::|---|\(\s|\s\)|\.\.\.|\(merge ")
_PLAIN_WORD = re.compile(r"^[A-Za-z][a-z]*[,;:]?$")
PLAIN_WORD_SHARE = 0.6  # of a sentence's words, at least

MIN_WORDS, MAX_WORDS = 6, 45  # sentences outside this length ask nothing (headings, tables, run-ons)
WINDOW_WORDS = (6, 12)  # words kept on each side of the blank: fewest, most
DROP_SHARE = 0.1  # each other word of a noised question is dropped with this probability
SWAP_SHARE = 0.5  # each word with a listed same-meaning word is swapped with this probability
# Of the questions that can be put in the order people ask them ("What is the default port?" rather
# than "The default port is what?"), this share is; the rest keep the sentence's order.
FRONTED_SHARE = 0.7
_COPULAS = frozenset({"is", "are", "was", "were"})
_PLURAL_AFTER = re.compile(r" ((?:[a-z]+ ){0,2}[a-z]+s)\b")  # up to three words, the last plural
_SUBJECT_WORDS = (1, 8)  # a fronted question's subject: fewest and most words
# A fronted question's subject opens with a determiner, or is one capitalised name ("Valgrind");
# it holds no word that starts another clause or verb phrase ("The daemon listens on port 8080 and").
_DETERMINERS = ("the", "a", "an")
_NOT_IN_A_FRONTED_SUBJECT = _COPULAS | {"and", "or", "but", "has", "have", "had", "can", "will", "may", "must",
                                        "should", "would", "could", "does", "do", "did", "not"}
# The word after a fronted blank: it ends the blank's phrase ("8080 for new installs"); any other
# ("8080 or 8443", "64 KB plus", "1 to 100") means the blank is part of a longer value.
_AFTER_A_FRONTED_BLANK = frozenset("""for in on at by from with when if per since until under within during after
before because unless while where which that so as""".split())
# Whose value is a person: "Who is the maintainer?"; any other name is asked with "What".
_PERSON_NOUNS = frozenset("""author authors maintainer maintainers developer developers creator creators founder
founders inventor writer writers designer designers contributor contributors""".split())
# Words ending in "s" that are no plural noun a number counts ("sets 9 as the default"), and
# conjunctions ("port 8080 and uses TLS").
_NOT_PLURAL = frozenset("""as is its this was has does his us thus plus less unless yes always sometimes perhaps
across towards whereas besides and or but then""".split())

# Words of technical prose and what a user might type instead (both ways where it reads right).
_SAME_MEANING = {
    "default": ["standard", "usual"], "maximum": ["largest", "most", "max"], "minimum": ["smallest", "least", "min"],
    "uses": ["employs", "takes"], "use": ["employ"], "requires": ["needs"], "require": ["need"],
    "needs": ["requires"], "contains": ["holds", "includes"], "holds": ["contains"], "faster": ["quicker"],
    "slower": ["less fast"], "larger": ["bigger"], "smaller": ["less"], "begins": ["starts"], "starts": ["begins"],
    "ends": ["finishes"], "stored": ["kept", "saved"], "written": ["saved", "output"], "creates": ["makes"],
    "create": ["make"], "prints": ["shows", "outputs"], "print": ["show", "output"], "shows": ["prints", "displays"],
    "displays": ["shows"], "specifies": ["gives", "sets"], "specify": ["give", "set"], "option": ["flag", "switch"],
    "options": ["flags", "switches"], "directory": ["folder"], "directories": ["folders"], "file": ["document"],
    "removes": ["deletes"], "remove": ["delete"], "deleted": ["removed"], "allows": ["lets", "permits"],
    "enables": ["turns on"], "disables": ["turns off"], "called": ["named"], "named": ["called"],
    "returns": ["gives back"], "function": ["routine", "call"], "program": ["tool", "application"],
    "programs": ["tools", "applications"], "approximately": ["about", "roughly"], "about": ["around"],
    "several": ["a few", "multiple"], "many": ["lots of"], "large": ["big"], "small": ["little"],
    "information": ["info", "details"], "users": ["people"], "user": ["person"], "error": ["failure"],
    "errors": ["failures", "problems"], "memory": ["RAM"], "size": ["length"], "number": ["count"],
    "used": ["applied", "taken"], "run": ["execute"], "runs": ["executes"], "released": ["published", "out"],
    "author": ["writer"], "written by": ["by"], "originally": ["first"], "precedence": ["priority"],
    "takes precedence over": ["overrides", "wins over"], "at least": ["no less than"], "at most": ["no more than"],
    "up to": ["at most"], "instead of": ["rather than"], "in order to": ["to"], "because": ["since"],
}
_PHRASES = sorted(_SAME_MEANING, key=len, reverse=True)
# Words a question may lose without losing what it asks (never the wh-phrase or the answer's neighbours).
_DROPPABLE = frozenset("""
a an the this that these those of to in on at by for with from as is are was were be been it its
also only then just very so such any all some each every can could may might will would should
""".split())
# Words quoted for emphasis ("the import 'could' happen"), not as terms.
_EMPHASISED = _DROPPABLE | {"not", "no", "never", "always", "must", "need", "before", "after"}


@dataclass(frozen=True)
class Blank:
    start: int  # character span of the answer in the sentence
    end: int
    kind: str  # KINDS


@dataclass(frozen=True)
class ClozeExample:
    context: str  # the sentence with its neighbours, as the example shows it
    question: str
    answer: str  # a span of `context`, found there exactly once


def is_prose(sentence: str) -> bool:
    """Whether `sentence` reads as a sentence of prose: capitalised, ending in a full stop, no
    markup or code (`_NOT_PROSE`), most of its words plain words."""
    words = sentence.split()
    if not (MIN_WORDS <= len(words) <= MAX_WORDS) or not sentence[:1].isupper() or not sentence.endswith("."):
        return False
    if _NOT_PROSE.search(sentence):
        return False
    return sum(bool(_PLAIN_WORD.match(w.rstrip("."))) for w in words) >= PLAIN_WORD_SHARE * len(words)


def blanks(sentence: str) -> list[Blank]:
    """Spans of `sentence` a question can ask for, without overlaps (numbers first, then
    identifiers, names, quoted terms), each a whole word or run of words."""
    found: list[Blank] = []
    taken: list[tuple[int, int]] = []
    for kind, pattern in (("number", _NUMBER), ("identifier", _IDENTIFIER), ("name", _NAME), ("quoted", _QUOTED)):
        for m in pattern.finditer(sentence):
            start, end = m.span(1) if kind == "quoted" else m.span()
            text = sentence[start:end]
            if kind == "identifier" and text in _NOT_AN_ACRONYM:
                continue
            if kind == "quoted" and text.lower() in _EMPHASISED:
                continue  # a word put in quotes for emphasis ("could"), not a term
            if any(start < b and a < end for a, b in taken):
                continue
            taken.append((start, end))
            found.append(Blank(start, end, kind))
    return sorted(found, key=lambda b: b.start)


def _wh_phrase(sentence: str, blank: Blank) -> str:
    """What stands for the blank: "how many" before a plural noun ("3 data streams" -> "how many
    data streams"), "whom" after "by" for a name, else "what"."""
    before = sentence[:blank.start].split()
    prev = before[-1].lower() if before else ""
    if _counted_noun(sentence, blank):
        return "how many"
    if blank.kind == "name" and prev == "by":
        return "whom"
    return "what"


def _counted_noun(sentence: str, blank: Blank) -> str:
    """The plural noun phrase a number blank counts ("3 data streams" -> "data streams"), else ""."""
    if blank.kind != "number" or not sentence[blank.start:blank.end][-1].isdigit():
        return ""
    m = _PLURAL_AFTER.match(sentence, blank.end)
    return m.group(1) if m and not set(m.group(1).split()) & _NOT_PLURAL else ""


def _swap_same_meaning(words: list[str], rng: random.Random) -> list[str]:
    text = " " + " ".join(words) + " "
    for phrase in _PHRASES:
        key = f" {phrase} "
        if key in text.lower() and rng.random() < SWAP_SHARE:
            at = text.lower().index(key)
            text = text[:at] + " " + rng.choice(_SAME_MEANING[phrase]) + " " + text[at + len(key):]
    return text.split()


def _clause_before(words: list[str]) -> list[str]:
    """The words after the last one that ends a clause (a comma, semicolon or colon)."""
    for i in range(len(words) - 1, -1, -1):
        if words[i].endswith((",", ";", ":")):
            return words[i + 1:]
    return words


def _clause_after(rest: str) -> list[str]:
    """The words of `rest` (what follows a blank) up to the first that ends a clause, that one's
    punctuation dropped; none where `rest` opens with a clause's end ("NULL, and errno ...")."""
    if rest.lstrip()[:1] in tuple(",;:)"):
        return []
    words = rest.rstrip(" .;:!?").split()
    for i, w in enumerate(words):
        if w.endswith((",", ";", ":")):
            return words[:i] + [w.rstrip(",;:")]
    return words


def _fronted(sentence: str, start: int, end: int, blank: Blank) -> tuple[list[str], list[str], list[str]] | None:
    """Where the blank is what a copula says of its clause's subject ("The default port is 8080
    for new installs.") or the object right after a known verb in the third person ("The library
    uses CRC-32C for checksums.", "The tool prints 72 columns by default."), the question in the
    order people ask it, as (its head, the subject, the rest of the clause): (["What", "is"],
    ["the", "default", "port"], ["for", "new", "installs"]), (["What", "does"], ["the", "library",
    "use"], ["for", "checksums"]), (["How", "many", "columns", "does"], ["the", "tool", "print"],
    ["by", "default"]); None for any other blank."""
    counted = _counted_noun(sentence, blank)
    if blank.kind == "quoted" or _wh_phrase(sentence, blank) == "whom":
        return None
    before = _clause_before(sentence[:start].split())
    if len(before) < 2:
        return None
    verb = before[-1]
    if verb.lower() in _COPULAS and not counted:  # "How many files is the limit?" is not how people ask
        head_verb, tail = verb.lower(), []
    elif verb.islower() and verb.endswith("s") and base_form(verb) in OPTION_VERBS and base_form(verb) != verb:
        head_verb, tail = "does", [base_form(verb)]
    else:
        return None
    subject = before[:-1]
    if subject[0].lower() in ("and", "but", "or", "while", "whereas"):  # "..., and the maximum is 100"
        subject = subject[1:]
    fewest, most = _SUBJECT_WORDS
    if not fewest <= len(subject) <= most or set(w.lower() for w in subject) & _NOT_IN_A_FRONTED_SUBJECT:
        return None
    if subject[0].lower() in _DETERMINERS:
        subject = [subject[0].lower(), *subject[1:]]
    elif len(subject) > 1 or not subject[0][:1].isupper() or subject[0].lower() in NOT_A_SUBJECT_START:
        return None  # "By default the tool", "Running the command", "It": no subject to front
    after = _clause_after(sentence[end + (len(counted) + 1 if counted else 0):])
    if after and after[0].lower() not in _AFTER_A_FRONTED_BLANK:
        return None
    person = blank.kind == "name" and bool({w.lower() for w in subject} & _PERSON_NOUNS)
    wh = ["How", "many", *counted.split()] if counted else ["Who" if person else "What"]
    return [*wh, head_verb], subject + tail, after[:WINDOW_WORDS[1]]


def noised_words(words: list[str], rng: random.Random) -> list[str]:
    """Words swapped for words of the same meaning, then droppable ones dropped (DROP_SHARE)."""
    return [w for w in _swap_same_meaning(words, rng) if w.lower() not in _DROPPABLE or rng.random() >= DROP_SHARE]


def cloze_question(sentence: str, blank: Blank, rng: random.Random, noised: bool = True) -> str:
    """`sentence` asked about `blank`: in the order people ask it where `_fronted` can put it so
    (always when not `noised`, else FRONTED_SHARE of the time), else
    the blank replaced by its wh-phrase in a window of words around it; `noised`: words dropped and
    swapped for words of the same meaning."""
    # The blank's quotes go with it ("set 'argtypes' for" -> "set what for"), nested ones too ("‘'x'’").
    start, end = blank.start, blank.end
    while start > 0 and end < len(sentence) and sentence[start - 1] in _OPENING and sentence[end] in _CLOSING:
        start, end = start - 1, end + 1
    fronted = _fronted(sentence, start, end, blank)
    if fronted is not None and (not noised or rng.random() < FRONTED_SHARE):
        head, subject, after = fronted
        if noised:  # the last word stays: the verb, or the subject's noun that names what is asked
            subject = noised_words(subject[:-1], rng) + subject[-1:]
            after = noised_words(after, rng)
        return " ".join([*head, *subject, *after]).rstrip(",;:") + "?"
    wh = _wh_phrase(sentence, blank)
    # The blank's clause only: what a comma ends, the question needs not.
    before, after = _clause_before(sentence[:start].split()), _clause_after(sentence[end:])
    lo, hi = WINDOW_WORDS
    before = before[-rng.randint(lo, hi):] if noised else before
    after = after[:rng.randint(lo, hi)] if noised else after
    if noised:  # the words next to the blank stay ("how many data streams", "named what")
        before = noised_words(before[:-1], rng) + before[-1:]
        after = after[:1] + noised_words(after[1:], rng)
    if before and before[0].istitle() and before[0].isalpha() and before[0] != "I":  # "The", not "GNU"
        before[0] = before[0].lower()
    question = " ".join([*before, wh, *after]).rstrip(",;:")
    return question[0].upper() + question[1:] + "?"


def cloze_example(paragraph: str, rng: random.Random, context_chars: int = 450) -> ClozeExample | None:
    """A cloze question over one sentence of `paragraph`, with that sentence and its neighbours (at
    most `context_chars`) as the context; None when no sentence of it holds a blank to ask."""
    sents = split_sentences(paragraph)
    order = list(range(len(sents)))
    rng.shuffle(order)
    for i in order:
        sent = " ".join(sents[i].split())
        if len(sent) > context_chars or not is_prose(sent):
            continue
        options = blanks(sent)
        rng.shuffle(options)
        lo, hi = context_window(sents, i, context_chars)
        context = " ".join(" ".join(s.split()) for s in sents[lo:hi])
        for blank in options:
            answer = sent[blank.start:blank.end]
            if occurrences(context, answer) != 1:
                continue  # asked twice in its text, the answer would be a guess between them
            return ClozeExample(context, cloze_question(sent, blank, rng), answer)
    return None


def occurrences(text: str, span: str) -> int:
    return len(re.findall(r"(?<!\w)" + re.escape(span) + r"(?!\w)", text))
