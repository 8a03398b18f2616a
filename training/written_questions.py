"""Questions written as people ask them, each over a real manual's passage that answers it.

The other question tasks make their questions from a sentence by rule, cloze or parse, so their
wording keeps to the sentence's own. A person asking about a page does not ("how much extra RAM
does --track-origins need?" for "increases memory use by a minimum of 100MB"). These items were
written that way, one passage of installed Debian documentation each (GNU info manuals, the Debian
Administrator's Handbook, git's manual, section 5 and 8 man pages, Python's library reference),
with two or three wordings for one answer, a span of the passage. None is from a manual eval-pdfs
asks about (`tools.pdf_questions.SOURCES`).

The unit of the train / held-out split is the document collection (`group`): the collections in
HELD_OUT_GROUPS are never trained on; `docqa-tools probe-reading --written` reads them, each over
its passage alone, to measure reading people's questions on documents the training never saw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

WRITTEN_QUESTIONS = Path(__file__).with_name("data") / "written_questions.jsonl"
HELD_OUT_GROUPS = ("written-python",)
MAX_CONTEXT_WORDS = 70  # a passage fits one 128-token chunk of the bundled model with its BOS


@dataclass(frozen=True)
class WrittenQuestion:
    source: str  # "<group>/<document>", e.g. "written-info1/coreutils"
    context: str  # the passage, as the document words it
    answer: str  # a span of `context`
    questions: tuple[str, ...]  # wordings of the one question
    kind: str  # number, name, identifier, value or phrase

    @property
    def group(self) -> str:
        return self.source.split("/", 1)[0]

    @property
    def held_out(self) -> bool:
        return self.group in HELD_OUT_GROUPS


def parse_written_question(line: str) -> WrittenQuestion:
    """One JSONL line as an item; a clear ValueError where it is not one a task can ask."""
    raw = json.loads(line)
    item = WrittenQuestion(str(raw["source"]), " ".join(str(raw["context"]).split()), str(raw["answer"]).strip(),
                           tuple(str(q).strip() for q in raw["questions"] if str(q).strip()), str(raw.get("kind", "")))
    if "/" not in item.source:
        raise ValueError(f"source {item.source!r} names no '<group>/<document>'")
    if not item.answer or item.answer not in item.context:
        raise ValueError(f"answer {item.answer!r} is not a span of its context")
    if not item.questions:
        raise ValueError("no question")
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
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{number}: {e}") from e
    return items


def training_items(items: list[WrittenQuestion]) -> list[dict]:
    """The items the training may ask (none of HELD_OUT_GROUPS), as the question tasks take them
    (`TaskSampler._asked_over_context`: context, answer, questions; source, the collection; and
    document, whose other passages are the item's near misses)."""
    return [{"context": q.context, "answer": q.answer, "questions": list(q.questions), "source": q.group,
             "document": q.source} for q in items if not q.held_out]
