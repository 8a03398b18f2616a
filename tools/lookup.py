"""Held-out lookup and no-answer evaluation data, beside RULER's, in RULER's files and format.

Questions come from `training.relations.held_out_samples`: held-out relation families, held-out
paraphrases, held-out framings, facts worded in held-out dressings (`lookup_form`: "As of 2024,
...", "..., who signed the new berth contract.") and facts stated value first (`lookup_value_first`:
"Odile Varga is the manager of the old mill."), never trained on. Their haystacks are a document source the
model never saw either: Debian's licence and copyright files (/usr/share/doc/*/copyright, the
`licences` kind that training.corpus keeps out of training). Each task a file
`<task>_<length>/validation.jsonl` that `tools.ruler.load` reads as it reads RULER's; a list answer
is scored on all its items, a no-answer question is right when the answer says "not found".
`niah_absent_key` asks RULER's needle question for a key the document lacks, other keys' needles in
the same licence text: "not found" is right, another key's value the worst answer.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from tools.ruler import DOC_END, DOC_START
from training.corpus import normalise, read_maybe_gzipped, source_files
from training.relations import NOT_FOUND, held_out_samples

TASKS = ("lookup_family", "lookup_paraphrase", "lookup_framing", "lookup_form", "lookup_value_first", "no_answer",
         "niah_absent_key")
_KIND_OF_TASK = {"lookup_family": "family", "lookup_paraphrase": "paraphrase", "lookup_framing": "framing",
                 "lookup_form": "form", "lookup_value_first": "value_first", "no_answer": None}
MIN_PARAGRAPH_CHARS = 80
# niah_absent_key: a needle question whose key the document lacks, with 1-4 other keys' needles in
# RULER's sentence in view; half the time one of them shares a word with the asked key. The right
# answer is "not found"; the worst is a value copied from a key in view. Keys are drawn from these
# words (RULER's key form, adjective-noun).
ABSENT_KEY_ADJECTIVES = ("amber", "quiet", "violet", "silver", "golden", "crimson", "lunar", "solar", "hollow",
                         "brisk", "gentle", "rapid", "frozen", "narrow", "ancient", "bitter")
ABSENT_KEY_NOUNS = ("harbor", "falcon", "badger", "walrus", "heron", "otter", "lynx", "maple", "cedar", "river",
                    "lantern", "meadow", "anchor", "summit", "thistle", "beacon")


def licence_paragraphs(doc_root: Path = Path("/usr/share/doc")) -> list[str]:
    """Every distinct paragraph of the machine's licence and copyright files, in a fixed order."""
    seen, out = set(), []
    for path in source_files("licences", doc_root=doc_root):
        for paragraph in normalise(read_maybe_gzipped(path)).split("\n\n"):
            if len(paragraph) >= MIN_PARAGRAPH_CHARS and paragraph not in seen:
                seen.add(paragraph)
                out.append(paragraph)
    if not out:
        raise RuntimeError(f"no licence files under {doc_root}: the lookup haystacks are read from there")
    return out


def _haystack(paragraphs: list[str], counts: list[int], target_tokens: int, rng: random.Random) -> list[str]:
    """Consecutive paragraphs from a random start (wrapping), about `target_tokens` tokens in all."""
    start = rng.randrange(len(paragraphs))
    out, total, i = [], 0, start
    while total < target_tokens:
        out.append(paragraphs[i % len(paragraphs)])
        total += counts[i % len(paragraphs)]
        i += 1
        if i - start > len(paragraphs):  # fewer tokens than asked in all the files: repeat them
            start = i
    return out


def answer_items(answer: str) -> list[str]:
    """The strings scored: each item of a list ("A, B and C"), else the answer itself."""
    if answer == NOT_FOUND:
        return [answer]
    parts = re.split(r", | and ", answer)
    return parts if len(parts) == 3 else [answer]


def generate(out_dir: Path, tokenizer, tasks: list[str], lengths: list[int], samples: int, seed: int = 42,
             doc_root: Path = Path("/usr/share/doc")) -> None:
    """Writes <out>/<task>_<length>/validation.jsonl: `samples` questions each, held-out facts in
    licence text of about `length` tokens (the fact sentences add a few dozen)."""
    paragraphs = licence_paragraphs(doc_root)
    counts = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in paragraphs]
    for task in tasks:
        if task not in TASKS:
            raise ValueError(f"unknown lookup task {task!r} (choose from {', '.join(TASKS)})")
        for length in lengths:
            rng = random.Random(f"{seed}/{task}/{length}")
            target = out_dir / f"{task}_{length}" / "validation.jsonl"
            target.parent.mkdir(parents=True, exist_ok=True)
            rows = []
            for index in range(samples):
                haystack = _haystack(paragraphs, counts, length - 96, rng)
                if task == "niah_absent_key":
                    rows.append(_absent_key_row(index, length, haystack, rng))
                    continue
                sample = held_out_samples([haystack], 1, seed=rng.randrange(1 << 30), kind=_KIND_OF_TASK[task],
                                          no_answer_share=1.0 if task == "no_answer" else 0.0)[0]
                rows.append({"index": index, "input": f"{DOC_START}{sample.document}{DOC_END}\n{sample.question}",
                             "outputs": answer_items(sample.answer), "length": length, "family": sample.family,
                             "wording": sample.wording, "framing": sample.framing, "needle": sample.fact})
            target.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _absent_key_row(index: int, length: int, haystack: list[str], rng: random.Random) -> dict:
    """One niah_absent_key question: other keys' needles placed between the haystack's paragraphs."""
    def key() -> str:
        return f"{rng.choice(ABSENT_KEY_ADJECTIVES)}-{rng.choice(ABSENT_KEY_NOUNS)}"

    asked, present, count = key(), [], rng.randint(1, 4)
    while len(present) < count:
        other = key()
        if other != asked and other not in present:
            present.append(other)
    if rng.random() < 0.5:  # a near miss: a key in view shares the asked key's adjective or noun
        adjective, noun = asked.split("-")
        near = f"{adjective}-{rng.choice(ABSENT_KEY_NOUNS)}" if rng.random() < 0.5 else \
            f"{rng.choice(ABSENT_KEY_ADJECTIVES)}-{noun}"
        if near != asked and near not in present:
            present[0] = near
    paragraphs = list(haystack)
    for other in present:
        value = rng.randrange(1_000_000, 10_000_000)
        needle = f"One of the special magic numbers for {other} is: {value}."
        paragraphs.insert(rng.randrange(len(paragraphs) + 1), needle)
    question = f"What is the special magic number for {asked} mentioned in the provided text?"
    document = "\n\n".join(paragraphs)
    return {"index": index, "input": f"{DOC_START}{document}{DOC_END}\n{question}",
            "outputs": [NOT_FOUND], "length": length, "asked": asked, "keys_in_view": present}
