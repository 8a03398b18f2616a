"""`docqa-tools probe-reading`: does the model read a passage it is given, question by question kind?

eval-pdfs' hand-written questions are few (89) and mix two failures: a passage not found and a
passage not read. This probe asks many questions made by rule from the PDFs' own sentences and
reads each over its own context alone (the app's prefill of that context as a document, every
chunk chosen: `pdf_questions.read_passage_alone`), so only reading is measured, split by kind:

- `rule, training wording` / `rule, held-out wording`: training.sentence_questions' rules (a
  sentence shape such as "The default X is Y." asked as "What is the default X?"), in the first of
  the rule's training wordings and in its held-out wording (never trained on);
- `cloze`: training.cloze_questions (a number, identifier, name or quoted term of any sentence of
  prose blanked and asked in noised words);
- `parsed`: training.parsed_questions (such a blank asked in people's order, from a dependency
  parse: "What does the library use for checksums?"), in its plain wording; asked where spaCy is
  installed (the `train` extra);
- `parsed, reworded`: each parsed question again, reworded as people ask
  (training.reworded_questions: a synonym, a name from the passage, a hedge, an opening...), where
  WordNet is installed (Debian's wordnet-base); the two parsed kinds differ by that rewording alone;

and by document source: a held-out PDF's text is not in the training corpus, a seen one's is.

The rule and cloze kinds share their templates with training tasks, so a model can pass them by
learning the templates: they say whether reading transfers to new documents, and eval-pdfs'
hand-written questions whether it transfers to people's wording. Right: the answer holds the
expected span as whole words (`pdf_questions.holds_answer`, as eval-pdfs scores).

`--written` asks training.written_questions' items instead (kind `written`): questions people would
type, written over passages of installed manuals, every wording of the held-out collection's (its
questions never trained on; its text, like a seen PDF's, in the corpus) and a sample of the trained;
and (kind `written, unanswered`) the items' questions on the passage's topic that it does not
answer, right where the model says so ("not found"), not where it makes up a value from the page.
Kind `written, in its page` asks the held-out wordings again over the passage among the other
written passages of its document, joined in the file's order (86-534 tokens: 1-5 chunks, all read):
whether the reading survives chunks full of other options, values and names, as a PDF's page has
them. Its "right" cannot tell which passage was read where another passage of the page holds the
same answer text (27 of the 456 wordings). The unanswered questions are not asked there: another
passage of the page may answer them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.method.reading import abstains
from engine.method.sentences import split_sentences
from tools.pdf_questions import SOURCES, PdfSource, app_over, holds_answer, known_sources, read_passage_alone, read_pdf
from training.cloze_questions import cloze_example, occurrences
from training.reworded_questions import Rewording, one_token_words
from training.sentence_questions import context_window, questions_for
from training.written_questions import WrittenQuestion

WRITTEN_KIND = "written"
WRITTEN_UNANSWERED_KIND = "written, unanswered"
WRITTEN_IN_PAGE_KIND = "written, in its page"
KINDS = ("rule, training wording", "rule, held-out wording", "cloze", "parsed", "parsed, reworded", WRITTEN_KIND,
         WRITTEN_UNANSWERED_KIND, WRITTEN_IN_PAGE_KIND)
CONTEXT_CHARS = 450  # a question's context, as the training tasks cut it: it fits one chunk
MIN_PARAGRAPH_CHARS = 80  # shorter blocks of a PDF's text are headings, page numbers, table cells


@dataclass(frozen=True)
class ProbeQuestion:
    source: str
    kind: str  # one of KINDS
    passage: str  # what is read: the question's sentence with its neighbours, or its page's passages joined
    question: str
    answer: str  # a span of `passage`; "" where the passage does not answer (right: "not found")


@dataclass(frozen=True)
class ProbeRow:
    source: str
    held_out: bool
    kind: str
    question: str
    answer: str
    shown: str
    right: bool


def paragraphs(text: str) -> list[str]:
    """Pure: the blank-line-separated blocks of a document's text of at least MIN_PARAGRAPH_CHARS,
    their lines joined (a PDF's lines end mid-sentence)."""
    return [" ".join(block.split()) for block in text.split("\n\n") if len(block.strip()) >= MIN_PARAGRAPH_CHARS]


def probe_questions(source: str, text: str, per_kind: int, rng: random.Random,
                    parser: Any | None = None, rewording: Rewording | None = None) -> list[ProbeQuestion]:
    """Pure given `rng` (and `parser`): up to `per_kind` questions of each kind from `text`'s
    paragraphs, taken in an order drawn by `rng`; a rule question is asked in both wordings of the
    same sentence, so the two wordings' scores differ by wording alone. The parsed kind only with a
    `parser` (training.parsed_questions.load_parser), drawn from the same order after the others;
    each also reworded with `rewording`, if given."""
    paras = paragraphs(text)
    rng.shuffle(paras)
    return _rule_and_cloze_questions(source, paras, per_kind, rng) + (
        _parsed_questions(source, paras, per_kind, parser, rewording, rng) if parser is not None else [])


def _parsed_questions(source: str, paras: list[str], per_kind: int, parser: Any, rewording: Rewording | None,
                      rng: random.Random) -> list[ProbeQuestion]:
    """The first parsed question of each sentence of prose, in the paragraphs' order, whose answer
    its passage holds once; after each, its rewording (`rewording`, if given)."""
    from training.parsed_questions import askable_sentences, questions_of

    out: list[ProbeQuestion] = []
    parsed = 0
    for para in paras:
        for sentence, passage in askable_sentences(para, CONTEXT_CHARS):
            if parsed >= per_kind:
                return out
            made = [q for q in questions_of(parser(sentence)) if occurrences(passage, q.answer) == 1]
            if made:
                out.append(ProbeQuestion(source, KINDS[3], passage, made[0].question, made[0].answer))
                parsed += 1
                if rewording is not None:
                    asked = rewording(made[0].question, made[0].answer, passage, rng)
                    out.append(ProbeQuestion(source, KINDS[4], passage, asked, made[0].answer))
    return out


def _rule_and_cloze_questions(source: str, paras: list[str], per_kind: int,
                              rng: random.Random) -> list[ProbeQuestion]:
    """Rule questions in both wordings, and cloze questions, in the paragraphs' order."""
    rule: list[ProbeQuestion] = []
    cloze: list[ProbeQuestion] = []
    for para in paras:
        if len(rule) >= 2 * per_kind and len(cloze) >= per_kind:
            break
        sents = split_sentences(para)
        for i, sentence in enumerate(sents):
            if len(sentence) > CONTEXT_CHARS:  # its context would not fit one chunk
                continue
            for q in questions_for(sentence):
                if len(rule) >= 2 * per_kind:
                    break
                lo, hi = context_window(sents, i, CONTEXT_CHARS)
                passage = " ".join(sents[lo:hi])
                rule.append(ProbeQuestion(source, KINDS[0], passage, q.questions[0], q.answer))
                rule.append(ProbeQuestion(source, KINDS[1], passage, q.questions[-1], q.answer))
        if len(cloze) < per_kind and (made := cloze_example(para, rng, CONTEXT_CHARS)) is not None:
            cloze.append(ProbeQuestion(source, KINDS[2], made.context, made.question, made.answer))
    return rule + cloze


def written_probe_questions(items: list[WrittenQuestion], per_group: int, rng: random.Random) -> list[ProbeQuestion]:
    """Pure given `rng`: every wording of every held-out item (training.written_questions), and of
    each training collection `per_group` items drawn by `rng`, in their first wording (how well
    questions the training asked are read: against the held-out row, what memorising is worth);
    after each collection's answerable questions, its unanswered ones the same way (all of a
    held-out item's, a sampled trained item's first); last, every held-out wording again over the
    item's page: the passages of its document (`source`), in the items' order, joined."""
    held = [q for q in items if q.held_out]
    asked = [ProbeQuestion(q.group, WRITTEN_KIND, q.context, wording, q.answer)
             for q in held for wording in q.questions]
    asked += [ProbeQuestion(q.group, WRITTEN_UNANSWERED_KIND, q.context, wording, "")
              for q in held for wording in q.unanswered]
    pages: dict[str, list[str]] = {}
    for q in held:
        pages.setdefault(q.source, []).append(q.context)
    for group in sorted({q.group for q in items if not q.held_out}):
        in_group = [q for q in items if q.group == group]
        members = rng.sample(in_group, min(per_group, len(in_group)))
        asked += [ProbeQuestion(group, WRITTEN_KIND, q.context, q.questions[0], q.answer) for q in members]
        asked += [ProbeQuestion(group, WRITTEN_UNANSWERED_KIND, q.context, q.unanswered[0], "")
                  for q in members if q.unanswered]
    asked += [ProbeQuestion(q.group, WRITTEN_IN_PAGE_KIND, " ".join(pages[q.source]), wording, q.answer)
              for q in held for wording in q.questions]
    return asked


def summarize(rows: list[ProbeRow]) -> str:
    """A markdown table: right / asked per kind asked (in KINDS' order), held-out sources first, then seen."""
    kinds = [kind for kind in KINDS if any(r.kind == kind for r in rows)]
    lines = ["| sources | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for held_out, label in ((True, "held-out"), (False, "seen")):
        cells = []
        for kind in kinds:
            picked = [r for r in rows if r.held_out == held_out and r.kind == kind]
            right = sum(r.right for r in picked)
            cells.append(f"{right}/{len(picked)} ({right / len(picked):.0%})" if picked else "-")
        if any(c != "-" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def probe(model_dir: Path, out_dir: Path, only: Iterable[str] | None = None, per_kind: int = 25, seed: int = 11,
          device: str | None = None, sources: dict[str, PdfSource] = SOURCES,
          progress: Callable[[str], None] = print, written: list[WrittenQuestion] | None = None) -> list[ProbeRow]:
    """Draws the questions from each source's PDF (`only` these, if given), or with `written` asks
    those items instead (`written_probe_questions`, `per_kind` of each training collection), reads
    each over its passage alone with the model in `model_dir` through a fresh app (a temporary
    library, removed after), and writes rows.jsonl, summary.md and meta.json under `out_dir`."""
    if written is not None:
        asked = written_probe_questions(written, per_kind, random.Random(seed))
        held_out = {q.group: q.held_out for q in written}
        return _read_each_alone(model_dir, out_dir, asked, held_out, device, progress,
                                {"written": sorted(held_out), "per_kind": per_kind, "seed": seed})
    from app.ingest import extract_pdf

    names = known_sources(only, sources) if only else list(sources)
    try:
        from training.parsed_questions import load_parser

        parser = load_parser()
    except RuntimeError as e:
        parser = None
        progress(f"no parsed questions: {e}")
    rewording = None
    try:
        from tokenizers import Tokenizer

        from training.synonyms import build_synonyms

        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        rewording = Rewording(build_synonyms(), one_token_words(lambda text: tokenizer.encode(text).ids))
    except FileNotFoundError as e:
        progress(f"no reworded questions: {e}")
    # A generator per source, so that a source's questions do not depend on which others are asked.
    asked = [q for name in names for q in probe_questions(name, extract_pdf(read_pdf(sources[name])).text,
                                                          per_kind, random.Random(f"{seed}:{name}"), parser,
                                                          rewording)]
    return _read_each_alone(model_dir, out_dir, asked, {name: sources[name].held_out for name in names}, device,
                            progress, {"sources": names, "per_kind": per_kind, "seed": seed})


def _read_each_alone(model_dir: Path, out_dir: Path, asked: list[ProbeQuestion], held_out: dict[str, bool],
                     device: str | None, progress: Callable[[str], None], meta: dict) -> list[ProbeRow]:
    """Reads each question over its passage alone; writes rows.jsonl, summary.md and meta.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    with app_over(model_dir, device) as service:
        for n, q in enumerate(asked, 1):
            shown = read_passage_alone(service, q.question, q.passage)
            # A model without an abstain answer abstains by answering nothing.
            right = (abstains(shown, service.defaults.abstain_answer or "") if q.kind == WRITTEN_UNANSWERED_KIND
                     else holds_answer(shown, [q.answer]))
            rows.append(ProbeRow(q.source, held_out[q.source], q.kind, q.question, q.answer, shown, right))
            progress(f"[{n}/{len(asked)}] {q.source} {q.kind}: {'right' if rows[-1].right else 'wrong'}")
        device_name = str(service.engine.device)
    (out_dir / "rows.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    (out_dir / "summary.md").write_text(summarize(rows) + "\n")
    (out_dir / "meta.json").write_text(json.dumps({"model": str(model_dir), **meta, "device": device_name},
                                                  indent=2) + "\n")
    return rows
