"""Reading each selected chunk alone, and which answer to keep.

A small extractive reader (the bundled model) reads one passage better than several side by side:
over K chunks it may copy another subject's value from a neighbouring chunk, or say it cannot find
a fact that one of them states. So, as open-domain QA readers do (each retrieved passage read on its
own, the answers compared), the answer decoded over all selected chunks together (the joint
reading) is checked against each chunk read alone (`AnswerParams.read_chunks_alone`), and with
`AnswerParams.confirm_with_lone_reading` given only where one of those confirms it. A confirmed
list answer is then completed from the chunks read alone (`gathered_values`): over K chunks that
each hold one of a key's values, the reader lists all but one of them at times (repeating one in
its slot), where each chunk read alone gives its own. Pure: the readings and passages are texts.
"""

from __future__ import annotations

import re


def _words(text: str) -> list[str]:
    """The answer's words, lower-cased, without punctuation: what two readings are compared by."""
    return re.findall(r"\w+", text.lower())


def _normalized(text: str) -> str:
    return " ".join(text.lower().split()).strip(" .")


def abstains(text: str, abstain_answer: str) -> bool:
    """Whether an answer is the model's "the passages do not say" (case, spacing and a final full
    stop ignored); an empty answer says nothing either."""
    return not _normalized(text) or _normalized(text) == _normalized(abstain_answer)


# ", and" before ", " ("7, 8, and 9" is three values); not a comma inside a number ("1,840").
_LIST_SEPARATOR = re.compile(r",?\s+and\s+|,\s+|;\s*")


def _items(text: str) -> set[tuple[str, ...]]:
    """A list answer's values, each as its words ("7, 8 and 9" -> {("7",), ("8",), ("9",)})."""
    return {tuple(_words(item)) for item in _LIST_SEPARATOR.split(text) if _words(item)}


def _part_of(part: list[str], whole: list[str]) -> bool:
    """Whether `part` is a run of consecutive words of `whole`, shorter than it."""
    n = len(part)
    return 0 < n < len(whole) and any(whole[i:i + n] == part for i in range(len(whole) - n + 1))


def _written_in(part: list[str], whole: list[str]) -> bool:
    """Whether `part` is a run of consecutive words of `whole` (or all of it)."""
    return bool(part) and (part == whole or _part_of(part, whole))


def lone_readings_settled(alone: list[str], abstain_answer: str) -> bool:
    """Whether the lone readings so far already decide `choose_lone_reading` whatever the rest say:
    two of them answer, so the joint reading stands (the remaining chunks need not be read)."""
    return sum(not abstains(text, abstain_answer) for text in alone) >= 2


def confirms(joint: str, lone: str, abstain_answer: str) -> bool:
    """Whether a chunk read alone gives the joint reading's answer: both answer, and the words of
    one are those of the other or a run of them (a name that one reading cut short), or the two
    share a value where either is a list (the joint reading gathers a key's values from several
    chunks, in another order than one chunk alone gives its own)."""
    if abstains(joint, abstain_answer) or abstains(lone, abstain_answer):
        return False
    a, b = _words(joint), _words(lone)
    return a == b or _part_of(a, b) or _part_of(b, a) or bool(_items(joint) & _items(lone))


def first_confirming(joint: str, alone: list[str], abstain_answer: str) -> int | None:
    """The first chunk read alone that confirms the joint answer (`confirms`), or None. Two readings
    that agree are evidence a single reading is not: a small reader that makes up an answer over K
    chunks (another subject's value, a span near the question's words) rarely makes up the same one
    over each chunk alone. An abstaining joint answer is never confirmed."""
    return next((i for i, text in enumerate(alone) if confirms(joint, text, abstain_answer)), None)


def confirmed_answer(joint: str, lone: str) -> str:
    """The answer given where `lone` confirms `joint`: the joint one (a chunk alone may hold only
    some of a list's values), unless the lone reading holds all its words and more (the joint
    reading cut a name or a value short: "glass house" for "the glass house")."""
    return lone if _part_of(_words(joint), _words(lone)) else joint


def confirmed(joint: str, alone: list[str], abstain_answer: str) -> bool:
    """Whether some chunk read alone confirms the joint answer (`first_confirming`)."""
    return first_confirming(joint, alone, abstain_answer) is not None


def confirmation_settled(joint: str, alone: list[str], abstain_answer: str) -> bool:
    """Whether the lone readings so far already decide `confirmed`: the joint reading abstains (no
    reading can confirm it) or one of them confirms it (the remaining chunks need not be read)."""
    return abstains(joint, abstain_answer) or confirmed(joint, alone, abstain_answer)


def choose_lone_reading(joint: str, alone: list[str], abstain_answer: str) -> int | None:
    """Which lone reading answers the question instead of the joint one, or None to keep the joint.

    Exactly one chunk read alone must answer (the others abstain): that chunk holds the fact, and
    its reading is taken (also where it agrees with the joint one: the chunk is then known to be the
    answer's source), unless its words are only a part of the joint answer's (a list the joint
    reading completed from two chunks, a name it gave in full; word by word, so "1" is not a part of
    "10"). Where several chunks answer alone (values spread over chunks) or none does, the joint
    reading stands.
    """
    answering = [i for i, text in enumerate(alone) if not abstains(text, abstain_answer)]
    if len(answering) != 1:
        return None
    if not abstains(joint, abstain_answer) and _part_of(_words(alone[answering[0]]), _words(joint)):
        return None
    return answering[0]


def _value_words(text: str) -> list[str]:
    """Words with each number kept whole ("1,840", "3.5"): what a gathered value is told apart and
    found in its chunk by, so that "840" is not held by "1,840" nor a value cut short ("1,84")."""
    return re.findall(r"\d+(?:[.,:]\d+)*|\w+", text.lower())


def _values(text: str) -> list[str]:
    """A list answer's values as written, in order, each once ("7, 8, 8 and 9" -> ["7", "8", "9"])."""
    values, seen = [], set()
    for item in _LIST_SEPARATOR.split(text):
        key = tuple(_value_words(item))
        if key and key not in seen:
            seen.add(key)
            values.append(item.strip(" ."))
    return values


def _shape(value: str) -> tuple[bool, ...]:
    """A value's form, per word whether it is a number: (True,) for "7675088", (False, False) for
    "Halden Works", (False, True) for "March 5"."""
    return tuple(word[0].isdigit() for word in _value_words(value))


def gathers(joint: str, abstain_answer: str) -> bool:
    """Whether the joint answer is a list of like values (two or more of one shape: numbers, or
    names of as many words): then every chunk is read alone, since each may hold a value the joint
    reading left out (`gathered_values`). A date ("March 5, 2021"), a place ("Greenwich Village,
    New York City") or a span ("10th and 11th centuries") has values of unlike shapes: no list."""
    values = _values(joint) if not abstains(joint, abstain_answer) else []
    return len(values) >= 2 and len({_shape(v) for v in values}) == 1


def gathered_values(joint: str, alone: list[str], passages: list[str], abstain_answer: str
                    ) -> list[tuple[int, str]]:
    """The values chunks read alone add to the joint list answer, as (reading, value) in reading
    order: each value of a lone reading that answers, of the list's shape, which the answer lacks,
    and whose words (numbers whole) its own chunk (`passages[reading]`) holds in a row, so that a
    value a reading made up is never added; each value once. Nothing where the joint answer is no
    list (`gathers`). A value another subject's sentence holds in that chunk may still be added: it
    rests on one reading, where the list it completes was confirmed."""
    if not gathers(joint, abstain_answer):
        return []
    values = _values(joint)
    shape, seen, added = _shape(values[0]), {tuple(_value_words(v)) for v in values}, []
    for i, (text, passage) in enumerate(zip(alone, passages, strict=True)):
        if abstains(text, abstain_answer):
            continue
        held = _value_words(passage)
        for value in _values(text):
            key = tuple(_value_words(value))
            if _shape(value) == shape and key not in seen and _written_in(list(key), held):
                seen.add(key)
                added.append((i, value))
    return added


def with_values(joint: str, values: list[str]) -> str:
    """The joint list answer, each of its values once, with `values` after them
    ("7, 8, 8" + ["9"] -> "7, 8, 9"); the joint answer as it is where nothing is added."""
    return ", ".join(_values(joint) + values) if values else joint
