"""Reading each selected chunk alone, and which answer to keep.

A small extractive reader (the bundled model) reads one passage better than several side by side:
over K chunks it may copy another subject's value from a neighbouring chunk, or say it cannot find
a fact that one of them states. So, as open-domain QA readers do (each retrieved passage read on its
own, the answers compared), the answer decoded over all selected chunks together (the joint
reading) is checked against each chunk read alone (`AnswerParams.read_chunks_alone`). Pure: the
readings are texts.
"""

from __future__ import annotations


def _plain(text: str) -> str:
    return " ".join(text.lower().split()).strip(" .")


def abstains(text: str, abstain_answer: str) -> bool:
    """Whether an answer is the model's "the passages do not say" (case, spacing and a final full
    stop ignored); an empty answer says nothing either."""
    return not _plain(text) or _plain(text) == _plain(abstain_answer)


def choose_lone_reading(joint: str, alone: list[str], abstain_answer: str) -> int | None:
    """Which lone reading answers the question instead of the joint one, or None to keep the joint.

    Exactly one chunk read alone must answer (the others abstain): that chunk holds the fact, and
    its reading is taken (also where it agrees with the joint one: the chunk is then known to be the
    answer's source), unless it is only a part of the joint answer (a list the joint reading
    completed from two chunks). Where several chunks answer alone (values spread over chunks) or
    none does, the joint reading stands.
    """
    answering = [i for i, text in enumerate(alone) if not abstains(text, abstain_answer)]
    if len(answering) != 1:
        return None
    lone, whole = _plain(alone[answering[0]]), _plain(joint)
    if not abstains(joint, abstain_answer) and lone != whole and lone in whole:
        return None
    return answering[0]
