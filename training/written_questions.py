"""Questions written as people ask them, each over a real manual's passage that answers it.

The other question tasks make their questions from a sentence by rule, cloze or parse, so their
wording keeps to the sentence's own. A person asking about a page does not ("how much extra RAM
does --track-origins need?" for "increases memory use by a minimum of 100MB"). These items were
written that way, one passage of installed Debian documentation each (GNU info manuals, the Debian
Administrator's Handbook, git's manual, section 5 and 8 man pages, Python's library reference, the
Debian Reference, SQLite's documentation), with two or three wordings for one answer, a span of the
passage, and (`unanswered`) questions on the passage's topic that it does not answer, as people ask
a page what it does not say. None is from a manual eval-pdfs asks about (`tools.pdf_questions.SOURCES`).

The unit of the train / held-out split is the document collection (`group`): the questions of the
collections in HELD_OUT_GROUPS are never trained on; `docqa-tools probe-reading --written` reads them,
each over its passage alone, to measure reading people's questions on documents whose questions the
training never saw. Their text is another matter: every installed manual but eval-pdfs' held-out
packages is in the pretraining corpus (`training.corpus`, Python's HTML manual among them), so the
held-out collection is read as eval-pdfs' *seen* sources are: known text, new questions.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

WRITTEN_QUESTIONS = Path(__file__).with_name("data") / "written_questions.jsonl"
COLLECTIONS = ("written-info1", "written-info2", "written-handbook", "written-gitman", "written-python",
               "written-debref", "written-sqlite")
HELD_OUT_GROUPS = ("written-python",)
KINDS = ("number", "name", "identifier", "value", "phrase")
MAX_CONTEXT_WORDS = 70  # a passage fits one 128-token chunk of the bundled model with its BOS


@dataclass(frozen=True)
class WrittenQuestion:
    source: str  # "<group>/<document>", e.g. "written-info1/coreutils"
    context: str  # the passage, as the document words it
    answer: str  # a span of `context`
    questions: tuple[str, ...]  # wordings of the one question
    kind: str  # one of KINDS
    # Questions on the passage's topic that it does not answer (another attribute of its subject, the
    # same attribute of a neighbouring one): the answer to them, over this passage, is "not found".
    unanswered: tuple[str, ...] = ()

    @property
    def group(self) -> str:
        return self.source.split("/", 1)[0]

    @property
    def held_out(self) -> bool:
        return self.group in HELD_OUT_GROUPS


def parse_written_question(line: str) -> WrittenQuestion:
    """One JSONL line as an item; a clear ValueError where it is not one a task can ask."""
    raw = json.loads(line)
    if not isinstance(raw, dict):
        raise ValueError(f"an item is a JSON object, not {type(raw).__name__}")
    missing = [f for f in ("source", "context", "answer", "questions", "kind") if f not in raw]
    if missing:
        raise ValueError(f"missing field {missing[0]!r}")
    questions = raw["questions"]
    if not isinstance(questions, list) or not all(isinstance(q, str) for q in questions):
        raise ValueError("questions is a list of strings")
    unanswered = raw.get("unanswered", [])
    if not isinstance(unanswered, list) or not all(isinstance(q, str) for q in unanswered):
        raise ValueError("unanswered is a list of strings")
    item = WrittenQuestion(str(raw["source"]), " ".join(str(raw["context"]).split()), str(raw["answer"]).strip(),
                           tuple(q.strip() for q in questions if q.strip()), str(raw["kind"]),
                           tuple(q.strip() for q in unanswered if q.strip()))
    group, _, document = item.source.partition("/")
    if group not in COLLECTIONS or not document:
        raise ValueError(f"source {item.source!r} is no '<collection>/<document>' of {', '.join(COLLECTIONS)}")
    if item.kind not in KINDS:
        raise ValueError(f"kind {item.kind!r} is none of {', '.join(KINDS)}")
    if not item.answer or item.answer not in item.context:
        raise ValueError(f"answer {item.answer!r} is not a span of its context")
    if not item.questions:
        raise ValueError("no question")
    if {q.casefold() for q in item.unanswered} & {q.casefold() for q in item.questions}:
        raise ValueError("a question is both answered and unanswered by its passage")
    if len({q.casefold() for q in item.unanswered}) != len(item.unanswered):
        raise ValueError("an unanswered question is given twice")
    if len(item.context.split()) > MAX_CONTEXT_WORDS:
        raise ValueError(f"context of {len(item.context.split())} words, more than {MAX_CONTEXT_WORDS}")
    return item


def read_written_questions(path: Path = WRITTEN_QUESTIONS) -> list[WrittenQuestion]:
    """Every item of the file, in its order; a ValueError naming the line of one that is not valid."""
    items = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(parse_written_question(line))
        except ValueError as e:  # json.JSONDecodeError is one
            raise ValueError(f"{path}:{number}: {e}") from e
    return items


def training_items(items: list[WrittenQuestion]) -> list[dict]:
    """The items the training may ask (none of HELD_OUT_GROUPS), as the question tasks take them
    (`TaskSampler._asked_over_context`: context, answer, questions; source, the collection;
    document, whose other passages are the item's near misses; unanswered, its questions the passage
    does not answer)."""
    return [{"context": q.context, "answer": q.answer, "questions": list(q.questions), "source": q.group,
             "document": q.source, "unanswered": list(q.unanswered)} for q in items if not q.held_out]


def written_questions_digest(path: Path = WRITTEN_QUESTIONS) -> str:
    """The file's sha256, for a run's record of the items it was trained on (the file is versioned
    apart from the prepared corpus)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
