"""Training data and evaluation helpers: the layout matches inference; RULER scoring and splitting."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from tokenizers import Tokenizer

from app.defaults import BUNDLED_MODEL
from engine.method.sentences import sentence_starts, split_sentences
from engine.model.config import ModelConfig
from engine.model.transformer import DiffusionLM
from engine.model.weights import load_model, read_model_config
from tools import ruler
from tools.evaluation import EvalRow, heatmap, summarize
from training.tasks import (
    ROLE_ANSWER,
    ROLE_CHUNK,
    ROLE_PREFIX,
    ROLE_QUERY,
    Example,
    Layout,
    TaskSampler,
    attention_mask,
    collate,
)
from training.train import make_layout, model_config

TOK = Tokenizer.from_file(str(BUNDLED_MODEL / "tokenizer.json"))


def _flat(seqs):
    lengths = torch.tensor([len(s) for s in seqs])
    return {"tokens": torch.tensor([t for s in seqs for t in s], dtype=torch.int16),
            "offsets": torch.cat((torch.zeros(1, dtype=torch.long), lengths.cumsum(0)))}


def _corpus():
    """A small corpus in the format training.prepare writes (tokenized essays and paragraphs)."""
    sentences = [TOK.encode(f" Sentence number {i} talks about rivers and hills.").ids for i in range(200)]
    paragraphs = [TOK.encode(f"Title {i}\nParagraph {i} mentions the town of Alder {i}.").ids for i in range(30)]
    return {"essay_sentences": _flat(sentences), "paragraphs": _flat(paragraphs),
            "paragraph_titles": [f"Title {i}" for i in range(30)],
            "qa": [{"question": "Which town?", "answer": "Alder 3", "gold": [3], "paragraphs": [3, 4, 5]}],
            "adjectives": ["quiet", "amber"], "nouns": ["harbor", "falcon"]}


def _sampler(chunk=64, answer=24):
    cfg = model_config(TOK)
    layout = make_layout(BUNDLED_MODEL, cfg)
    return TaskSampler(_corpus(), lambda s: TOK.encode(s).ids, TOK.decode, layout, chunk, answer, seed=0), layout, cfg


def test_examples_fit_chunks_and_answers_end_with_eos():
    sampler, layout, _ = _sampler()
    for k in (1, 2, 4):
        for task in (sampler.niah, sampler.kv_retrieval, sampler.hotpot, sampler.which_document):
            ex = task(k)
            assert len(ex.chunks) == k and all(len(c) <= 63 for c in ex.chunks)
            assert len(ex.answer_ids) == 24 and ex.answer_ids[-1] == layout.eos


def test_needle_answer_is_in_a_chunk():
    sampler, _, _ = _sampler(chunk=128)
    for _ in range(20):
        ex = sampler.niah(4)
        answer = TOK.decode([t for t in ex.answer_ids if t != sampler.layout.eos])
        first = answer.split(", ")[0]
        assert any(first in TOK.decode(c) for c in ex.chunks), (answer, [TOK.decode(c) for c in ex.chunks])


def test_word_answers_are_token_copies_of_the_needle():
    """A word value is answered with the tokens it has in the needle's text, so the model copies
    tokens rather than respelling a word (" perfect" is one token, "perfect" two)."""
    sampler, layout, _ = _sampler(chunk=128)
    comma = TOK.encode(",").ids
    seen = 0
    for _ in range(200):
        ex = sampler.niah(4)
        answer = [t for t in ex.answer_ids if t != layout.eos]
        first = answer[:answer.index(comma[0])] if comma[0] in answer else answer
        if not TOK.decode(first).strip().replace("-", "").isalpha():
            continue  # numbers and UUIDs tokenize the same with or without the space
        seen += 1
        assert any(first == c[i:i + len(first)] for c in ex.chunks for i in range(len(c))), TOK.decode(first)
    assert seen >= 5


def test_multiquery_key_counts_are_drawn_from_the_given_list():
    cfg = model_config(TOK)
    layout = make_layout(BUNDLED_MODEL, cfg)
    weights = {"single": 0, "multikey": 0, "multivalue": 0, "multiquery": 1}
    sampler = TaskSampler(_corpus(), lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 256, seed=0,
                          niah_variant_weights=weights, multiquery_keys=(4,))
    for _ in range(10):
        answer = TOK.decode([t for t in sampler.niah(4).answer_ids if t != layout.eos])
        assert len(answer.split(", ")) == 4, answer  # one value per asked key
    with pytest.raises(ValueError, match="multiquery_keys"):
        TaskSampler(_corpus(), lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=0, multiquery_keys=(5,))


def test_absent_key_needles_ask_for_a_key_the_document_lacks():
    """The "absent" variant: other keys' needles in view, the asked key in none of the chunks, and
    the answer "not found"; some of the keys in view share a word with the asked one."""
    cfg = model_config(TOK)
    layout = make_layout(BUNDLED_MODEL, cfg)
    corpus = _corpus() | {"adjectives": ["quiet", "amber", "lunar", "solar"], "nouns": ["harbor", "falcon", "heron"]}
    sampler = TaskSampler(corpus, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 24, seed=0,
                          niah_variant_weights={"absent": 1})
    shared_word = 0
    for _ in range(60):
        ex = sampler.niah(4)
        question, text = TOK.decode(ex.question_ids), " ".join(TOK.decode(c) for c in ex.chunks)
        asked = re.search(r"special magic \w+ for (\S+) mentioned", question).group(1)
        present = re.findall(r"special magic \w+ for (\S+) is:", text)
        assert TOK.decode([t for t in ex.answer_ids if t != layout.eos]).strip() == "not found"
        assert present and asked not in present, (asked, present)
        if "-" in asked and any(set(asked.split("-")) & set(p.split("-")) for p in present):
            shared_word += 1
    assert shared_word >= 10
    # A variant left out of the weights is not drawn; an unknown one is refused.
    TaskSampler(corpus, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 24, seed=0,
                niah_variant_weights={"single": 1})
    with pytest.raises(ValueError, match="weights must name only"):
        TaskSampler(corpus, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 24, seed=0,
                    niah_variant_weights={"missing": 1})


def test_sampler_stream_is_that_of_the_bundled_runs():
    """Seeded data is what makes a run reproducible: with the default options the sampler draws
    exactly what it drew when the bundled model was first trained (the digest was taken then;
    drawing the multi-query key count before the multi-key one changed it)."""
    import hashlib

    layout = make_layout(BUNDLED_MODEL, model_config(TOK))
    sampler = TaskSampler(_corpus(), lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=8)
    digest = hashlib.sha256()
    for _ in range(40):
        ex = sampler.sample(4)
        digest.update(repr((ex.chunks, ex.question_ids, ex.answer_ids, ex.scoring)).encode())
    assert digest.hexdigest() == "04159c4da417eb5a05bb62d4c32b0417fbec642f027e03fc28bb6839f0b9164b"


def test_collate_positions_and_mask_follow_inference():
    layout = Layout(prefix=[0, 7, 8], query_head=[9], query_tail=[10], bos=0, eos=1, mask=2, pad=1)
    ex = Example(chunks=[[20, 21], [22]], question_ids=[30, 31], answer_ids=[40, 1])
    b = collate([ex], layout, chunk_size=8, question_loss_share=0.0, rng=random.Random(0))
    roles = b["roles"][0].tolist()
    assert roles == [ROLE_PREFIX] * 3 + [ROLE_CHUNK] * 5 + [ROLE_QUERY] * 4 + [ROLE_ANSWER] * 2
    # prefix 0..2; chunk j at P + j*C; query at P + K*C; answer right after the query
    assert b["positions"][0].tolist() == [0, 1, 2, 3, 4, 5, 11, 12, 19, 20, 21, 22, 23, 24]
    assert b["targets"][0].tolist() == [False] * 12 + [True, True]
    m = attention_mask(b["roles"], b["segments"])[0, 0]
    assert m[3].tolist() == [False] * 3 + [True] * 3 + [False] * 8  # chunk 1 sees only itself
    assert m[8].tolist() == [True] * 12 + [False] * 2  # the query does not see the answer
    assert m[12].all()  # the answer sees everything


def test_scoring_examples_use_local_positions_and_question_targets():
    layout = Layout(prefix=[0, 7], query_head=[9], query_tail=[10], bos=0, eos=1, mask=2, pad=1)
    ex = Example(chunks=[[20, 21, 22]], question_ids=[30, 31], answer_ids=[], scoring=True)
    b = collate([ex], layout, chunk_size=8, question_loss_share=0.0, rng=random.Random(0))
    assert b["positions"][0].tolist() == list(range(8))
    assert b["targets"][0].tolist() == [False] * 5 + [True, True, False]


def test_sentence_splitter():
    text = 'Dr. Smith left at 5 p.m. "Why?" she asked. The U.S. Army won. 42 came next.'
    assert split_sentences(text) == ["Dr. Smith left at 5 p.m.", '"Why?" she asked.', "The U.S. Army won.",
                                     "42 came next."]
    # Where chunks may be cut: each later sentence's start, and a paragraph's, never mid-sentence.
    text += "\n\nlower-case heading\nand a wrapped line."
    assert [text[i:i + 6] for i in sentence_starts(text)] == ['"Why?"', "The U.", "42 cam", "lower-"]


def test_ruler_scoring():
    assert ruler.score("niah_multivalue", "1234567, 7654321", ["1234567", "7654321", "1111111"]) == 2 / 3
    assert ruler.score("qa_1", "It is in France.", ["france", "Paris"]) == 1.0
    assert ruler.score("niah_single_1", "", ["1"]) == 0.0


def test_ruler_samples_follow_the_seed(tmp_path):
    """`docqa-tools eval-data --seed`: the same seed writes the same samples, another seed others (a
    held-out set for tuning settings, apart from the seed-42 set the model card reports)."""
    pytest.importorskip("long_context_eval")  # installed by `scripts/install.sh --eval`
    contexts = {}
    for name, seed in (("a", 42), ("b", 42), ("c", 7)):
        ruler.generate(tmp_path / name, BUNDLED_MODEL, ["niah_single_1"], [1024], {1024: 2}, seed=seed)
        contexts[name] = [s.context for s in ruler.load(tmp_path / name, ["niah_single_1"], [1024])]
    assert len(contexts["a"]) == 2 and contexts["a"] == contexts["b"]
    assert contexts["c"] != contexts["a"]


def test_answer_spans_point_into_the_asked_fact_not_an_earlier_equal_value():
    """A held-out lookup's value can also stand in another subject's fact (values come from small
    pools): the answer's place is inside the asked fact's sentence, the needle."""
    context = "The Velda stew is made with apples. Filler text here. The Morwen curry is made with apples."
    plain = ruler.Sample("lookup_family", 4096, 0, context, "What is the Morwen curry made with?", ["apples"], None)
    asked = dataclasses.replace(plain, needle="The Morwen curry is made with apples.")
    assert plain.answer_spans() == [(28, 34)]
    at = context.rindex("apples")
    assert asked.answer_spans() == [(at, at + 6)]
    with pytest.raises(ValueError, match="needle is not in its context"):
        dataclasses.replace(plain, needle="The Tarn pie is made with apples.").answer_spans()


def _lookup_samples(tmp_path: Path, tasks: list[str], per_task: int, seed: int,
                    packages: int = 6) -> list[ruler.Sample]:
    """`per_task` samples of each lookup task at 1K, written by tools.lookup over licence-like files
    of `packages` packages (the haystacks the lookup evaluation reads), and loaded back."""
    from tools import lookup

    doc_root = tmp_path / "doc"
    for i in range(packages):
        (doc_root / f"pkg{i}").mkdir(parents=True)
        (doc_root / f"pkg{i}" / "copyright").write_text("\n\n".join(
            f"Package {i} paragraph {j}: permission is hereby granted to use, copy and modify this software."
            for j in range(12)))
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(BUNDLED_MODEL / "tokenizer.json"))
    lookup.generate(tmp_path / "data", hf_tok, tasks, [1024], per_task, seed=seed, doc_root=doc_root)
    return ruler.load(tmp_path / "data", tasks, [1024])


def test_lookup_eval_files_name_the_asked_fact_and_load_with_it(tmp_path):
    samples = _lookup_samples(tmp_path, ["lookup_family", "no_answer", "niah_absent_key"], 6, seed=3)
    assert len(samples) == 18
    rows = [json.loads(line) for line in (tmp_path / "data" / "niah_absent_key_1024" / "validation.jsonl").open()]
    for s, row in zip([s for s in samples if s.task == "niah_absent_key"], rows, strict=True):
        # the asked key stands nowhere in the document; 1-4 other keys' needles do
        assert s.outputs == ["not found"] and row["asked"] in s.question and row["asked"] not in s.context
        assert 1 <= len(row["keys_in_view"]) <= 4
        assert all(f"special magic numbers for {key} is: " in s.context for key in row["keys_in_view"])
    for s in samples:
        if s.task in ("no_answer", "niah_absent_key"):
            assert s.needle == "" and s.outputs == ["not found"]
        else:
            assert s.needle in s.context and s.question
            spans = s.answer_spans()
            assert len(spans) == len(s.outputs) and all(s.context[a:b] in s.outputs for a, b in spans)
            assert all(s.context.find(s.needle) <= a for a, _ in spans)


def test_eval_rows_keep_the_lone_readings_and_what_confirmation_withheld(tmp_path):
    """docqa-tools eval with the bundled model's defaults (each chosen chunk also read alone, an
    answer given only where one of them confirms it): a row keeps the lone readings it took, and a
    row shown "not found" by confirmation the joint answer it withheld, which none of them confirms."""
    from engine.engine import Engine
    from engine.method.reading import abstains, confirms
    from tools.evaluation import evaluate

    # Seed 8 holds, on this project's CPUs, a lookup whose joint answer no chunk alone confirms.
    samples = _lookup_samples(tmp_path, ["lookup_family", "no_answer"], 3, seed=8, packages=4)
    engine = Engine.from_pretrained(BUNDLED_MODEL, device="cpu")
    real_answer, traces = engine.answer, []

    def answer_keeping_its_trace(*args, **kwargs):
        result = real_answer(*args, **kwargs)
        traces.append(result.trace)
        return result

    engine.answer = answer_keeping_its_trace
    rows = evaluate(engine, samples, ["static"], 128, 4096, progress=lambda line: None)
    assert len(rows) == 6 and all(r.mode.endswith("+alone") for r in rows)
    assert [(r.lone_answers, r.unconfirmed) for r in rows] == [(t.lone_answers, t.unconfirmed) for t in traces]
    assert any(r.lone_answers for r in rows)
    for r in rows:
        if r.unconfirmed is not None:
            assert abstains(r.prediction, "not found") and not abstains(r.unconfirmed, "not found")
            assert not any(confirms(r.unconfirmed, lone, "not found") for lone in r.lone_answers)


def test_summary_and_heatmap(tmp_path):
    rows = [EvalRow("niah_single_2", n, i, "static", float(i % 2), "x", ["y"], i / 4, True, 1.0, 1.0, 2 + i % 3)
            for n in (4096, 8192) for i in range(4)]
    rows[0].score = 0.75  # a list with one value of four wrong: the cell is 68.75%, shown to a decimal
    md = summarize(rows)
    assert "| niah_single_2 | 68.8 (n=4) | 50.0 (n=4) |" in md and "recall" in md
    assert "chunks decoded over, on average: 2.75 (from 2 to 4, 8 samples)" in md
    assert "confirmed" not in md  # no lone readings: nothing to say about confirmation
    # A right joint answer that no chunk alone confirmed is counted as a loss; a wrong one is not.
    rows[1].unconfirmed, rows[1].score, rows[1].prediction = "y", 0.0, "not found"
    rows[2].unconfirmed = "z"
    assert ('answers no chunk read alone confirmed, shown as the abstain answer: 2 of 8 samples '
            '(1 of them would have scored higher as read)') in summarize(rows)
    heatmap(rows, tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 1000


@pytest.mark.slow
def test_data_parallel_training_run_and_resume(tmp_path):
    """Two processes (gloo on the CPU) train a small model from scratch: both take the same steps
    (a rank that stopped alone would leave the other waiting in an all-reduce: the timeout fails
    it), rank 0 alone exports. A second, single-process run resumes from the checkpoint and keeps
    its architecture and its first curriculum stage without being told them. docqa.json's run list
    is the weights' own lineage, not what the folder held before (here the bundled model's runs)."""
    torch.save(_corpus(), tmp_path / "corpus.pt")
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "docqa.json"):
        shutil.copy(BUNDLED_MODEL / name, model_dir / name)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    common = ["-m", "training.train", "--data", str(tmp_path), "--model-dir", str(model_dir), "--minutes", "0.1",
              "--total-minutes", "1", "--batch-size", "2", "--workers", "0", "--checkpoint",
              str(tmp_path / "ckpt.pt"), "--log-file", str(tmp_path / "log.json")]
    first = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            *common, "--layers", "2", "--hidden", "128", "--kv-heads", "1", "--start-stage", "2"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    meta = json.loads((tmp_path / "log.json").read_text())["meta"]
    assert meta["processes"] == 2 and meta["gpus"] == 0 and meta["steps"] > 0 and meta["start_stage"] == 2
    assert first.stdout.count("exported to") == 1  # rank 0 only
    assert read_model_config(model_dir).num_layers == 2
    assert json.loads((model_dir / "docqa.json").read_text())["training"]["runs"] == [meta]
    second = subprocess.run([sys.executable, *common, "--resume", str(tmp_path / "ckpt.pt")],
                            env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    resumed = json.loads((tmp_path / "log.json").read_text())["meta"]
    assert resumed["processes"] == 1 and resumed["steps"] > meta["steps"] and resumed["start_stage"] == 2
    cfg = read_model_config(model_dir)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_kv_heads) == (2, 128, 1)
    runs = json.loads((model_dir / "docqa.json").read_text())["training"]["runs"]
    assert runs == [meta, resumed] and resumed["first_step"] == meta["steps"]
    assert load_model(model_dir).cfg == cfg


def test_oracle_check_answers_over_the_needle_chunks(tmp_path):
    """The reading check runs end to end on the bundled model: one example per NIAH variant, each
    prefilled as exactly its chunks, a score per answer, and a summary per variant."""
    torch.save(_corpus(), tmp_path / "corpus.pt")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", "tools.oracle_check", "--data", str(tmp_path), "--per-variant",
                           "1", "--out", str(tmp_path / "oracle.json")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "oracle.json").read_text())
    assert [r["variant"] for r in report["rows"]] == ["single", "multikey", "multivalue", "multiquery", "absent"]
    assert all(r["gold"] and 0.0 <= r["score"] <= 1.0 for r in report["rows"])
    assert set(report["summary"]) == {"single", "multikey", "multivalue", "multiquery", "absent", "mean"}
    assert all(r["gold"] == "not found" for r in report["rows"] if r["variant"] == "absent")


def test_lookup_examples_ask_training_wordings_of_facts_in_real_text():
    from training import relations

    corpus = _corpus() | {"text_paragraphs": _flat([TOK.encode(f" The daemon reads file number {i} at start, "
                                                               "then listens on its port.").ids for i in range(50)])}
    cfg = model_config(TOK)
    layout = make_layout(BUNDLED_MODEL, cfg)
    sampler = TaskSampler(corpus, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=3,
                          task_weights={"lookup": 1})
    import re

    sp = relations.split()
    trained = [re.compile(re.escape(relations.frame(w, framing)).replace(re.escape("{s}"), ".+") + "$")
               for f in sp.train_families for w in sp.train_wordings(f) for framing in sp.train_framings]
    not_found = 0
    for _ in range(200):
        ex = sampler.sample(4, scoring_share=0.0)
        assert len(ex.chunks) == 4 and all(len(c) <= 127 for c in ex.chunks)
        question = TOK.decode(ex.question_ids)
        assert any(p.match(question) for p in trained), question  # a training wording in a training framing
        answer = TOK.decode([t for t in ex.answer_ids if t != layout.eos]).strip()
        if answer == relations.NOT_FOUND:
            not_found += 1
        else:
            assert any(answer in TOK.decode(c) for c in ex.chunks), answer
    assert 10 < not_found < 60
    with pytest.raises(ValueError, match="needs the corpus's real text"):
        TaskSampler(_corpus(), lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=3,
                    task_weights={"lookup": 1})


def test_generated_lookups_read_both_subject_and_relation_and_never_a_held_out_family():
    """The generated-family task: the asked value stands in a chunk, beside a fact of the same
    relation about another subject and one of another relation about the same subject; no question
    uses a relation whose words all stand in one held-out family."""
    from training import relations

    sp = relations.split()
    held_words = [set(re.findall(r"[a-z]+", " ".join((f.fact, f.question, *f.paraphrases)).lower()))
                  for f in sp.held_out_families]
    generated = relations.generated_relations(sp)
    assert len(generated) >= 1000
    assert not any({*name.split()} <= words for name, _, _ in generated for words in held_words)
    assert ("serial number", "code", "what") not in generated  # a held-out family asks for a serial number
    corpus = _corpus() | {"text_paragraphs": _flat([TOK.encode(f" The daemon reads file number {i} at start, "
                                                               "then listens on its port.").ids for i in range(50)])}
    layout = make_layout(BUNDLED_MODEL, model_config(TOK))
    sampler = TaskSampler(corpus, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=5,
                          task_weights={"lookup_generated": 1})
    relation_names = sorted((name for name, _, _ in generated), key=len, reverse=True)
    value_first = 0
    for _ in range(200):
        ex = sampler.sample(4, scoring_share=0.0)
        assert len(ex.chunks) == 4 and all(len(c) <= 127 for c in ex.chunks)
        question = TOK.decode(ex.question_ids)
        asked = next((n for n in relation_names if n in question), None)
        assert asked is not None, question
        text = " ".join(TOK.decode(c) for c in ex.chunks)
        assert text.count(asked) >= 1  # the other subject's fact of the same relation at least
        answer = TOK.decode([t for t in ex.answer_ids if t != layout.eos]).strip()
        assert answer != relations.NOT_FOUND and answer in text, (question, answer)  # always answerable
        value_first += f"{answer} is the " in text
    assert value_first > 10  # generated facts teach the value-first form the table's families never take


def _real_text_sampler(task: str, seed: int):
    """(corpus, layout, sampler) drawing only `task`, over a corpus with 50 paragraphs of "real" text."""
    corpus = _corpus() | {"text_paragraphs": _flat([TOK.encode(f" Paragraph {i} says the daemon reads its file "
                                                               "at start and then listens.").ids for i in range(50)])}
    layout = make_layout(BUNDLED_MODEL, model_config(TOK))
    sampler = TaskSampler(corpus, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=seed,
                          task_weights={task: 1})
    return corpus, layout, sampler


def test_near_lookups_put_facts_about_near_subjects_beside_the_asked_one_and_ask_lists_often():
    """lookup_near: a training wording and framing; beside the asked fact (or in its place, for "not
    found") at least one fact of the same family about another subject sharing a word with the asked
    one; list families asked far more often than among the training families (4%)."""
    from training import relations
    from training.tasks import LOOKUP_NEAR_LIST_SHARE

    _, layout, sampler = _real_text_sampler("lookup_near", seed=7)
    sp = relations.split()

    def pattern(template: str, **groups: str) -> str:
        out = re.escape(template)
        for name, group in groups.items():
            out = out.replace(re.escape("{" + name + "}"), group)
        return out

    asked_by = [(f, re.compile(pattern(relations.frame(w, framing), s="(?P<s>.+)") + "$"))
                for f in sp.train_families for w in sp.train_wordings(f) for framing in sp.train_framings]
    lists = not_found = 0
    for _ in range(150):
        ex = sampler.sample(4, scoring_share=0.0)
        assert len(ex.chunks) == 4 and all(len(c) <= 127 for c in ex.chunks)
        question = TOK.decode(ex.question_ids)
        family, subject = next((f, m["s"]) for f, p in asked_by if (m := p.match(question)))
        lists += family.is_list
        texts = [TOK.decode(c) for c in ex.chunks]
        text = " ".join(texts)
        fact = re.compile(pattern(family.fact, S="(?P<s>[^.]+?)", s="(?P<s>[^.]+?)", v=".+?"))
        stated = {m["s"].strip().lower() for t in texts for m in fact.finditer(t)}
        stems = {w[:4] for w in re.findall(r"[a-z]+", subject.lower())} - {"the"}
        near = [s for s in stated if s != subject.lower() and stems & {w[:4] for w in re.findall(r"[a-z]+", s)}]
        assert near, (question, stated)
        answer = TOK.decode([t for t in ex.answer_ids if t != layout.eos]).strip()
        if answer == relations.NOT_FOUND:
            not_found += 1
            assert subject.lower() not in stated
        else:
            assert subject.lower() in stated and answer in text, (question, answer)
    assert 5 < not_found < 50
    assert lists > 150 * LOOKUP_NEAR_LIST_SHARE * 0.6


def test_dressed_lookups_word_facts_in_training_dressings_only():
    """lookup_dressed: about LOOKUP_DRESSED_SHARE of the facts in a training dressing (a lead, a
    trailing clause), never in a held-out one; the answer still stands in the chunks."""
    from training import relations
    from training.tasks import LOOKUP_DRESSED_SHARE

    _, layout, sampler = _real_text_sampler("lookup_dressed", seed=11)

    def fragments(dressing):
        return [p.strip(" ,") for half in dressing for p in re.split(r"\{\w+\}", half) if p.strip(" ,")]

    def shows(text, dressing):
        return all(f in text for f in fragments(dressing))

    dressed = answered = 0
    for _ in range(120):
        ex = sampler.sample(4, scoring_share=0.0)
        text = " ".join(TOK.decode(c) for c in ex.chunks)
        assert not any(shows(text, d) for d in relations.HELD_OUT_DRESSINGS), text
        dressed += sum(shows(text, d) for d in relations.TRAIN_DRESSINGS) > 0
        answer = TOK.decode([t for t in ex.answer_ids if t != layout.eos]).strip()
        if answer != relations.NOT_FOUND:
            answered += 1
            assert answer in text
    assert answered > 80 and dressed > 120 * LOOKUP_DRESSED_SHARE


def test_lookup_facts_that_do_not_fit_a_chunk_are_left_out_but_never_the_asked_one(monkeypatch):
    """Long values (a list of long names, say) in one chunk: the distractors that do not fit are
    dropped; the asked fact, placed first, always stands in the chunk."""
    from training import relations

    _, layout, sampler = _real_text_sampler("lookup_near", seed=9)
    drawn = itertools.count()
    # About 40 tokens each, and each fact's own: the answer found in the chunk is the asked fact's.
    monkeypatch.setattr(relations, "value", lambda kind, rng: " ".join([f"Wenlock-Galloway {next(drawn)}"] * 8))
    family = next(f for f in relations.split().train_families if f.is_list)
    for _ in range(20):
        ex = sampler._lookup_example(1, family, (family.question,), most_others=0, near_subjects=2)
        assert len(ex.chunks) == 1 and len(ex.chunks[0]) <= 127
        answer = TOK.decode([t for t in ex.answer_ids if t != layout.eos]).strip()
        if answer != relations.NOT_FOUND:
            assert answer in TOK.decode(ex.chunks[0])


def test_text_denoising_restores_the_text_that_follows_its_chunk():
    corpus, layout, sampler = _real_text_sampler("text_denoising", seed=2)
    stream = corpus["text_paragraphs"]["tokens"].tolist()
    for _ in range(20):
        ex = sampler.sample(4, scoring_share=0.0)
        assert ex.scoring and len(ex.chunks) == 1 and len(ex.chunks[0]) == 127 and ex.answer_ids == []
        assert len(ex.question_ids) == 48
        joined = ex.chunks[0] + ex.question_ids  # consecutive in the stream (which wraps around)
        doubled = stream + stream
        assert any(doubled[i:i + len(joined)] == joined for i in range(len(stream)))
    batch = collate([sampler.sample(4, scoring_share=0.0) for _ in range(3)], layout, 128, 0.0, random.Random(0))
    assert int(batch["targets"].sum()) == 3 * 48


def test_text_mdm_sequences_are_consecutive_text_every_token_a_target_attending_to_all():
    from training.tasks import ROLE_ANSWER, TEXT_MDM_LENGTH

    corpus, layout, sampler = _real_text_sampler("text_mdm", seed=3)
    streams = [corpus[name]["tokens"].tolist() for name in ("text_paragraphs", "essay_sentences")]
    sources = set()
    for _ in range(30):
        ex = sampler.sample(4, scoring_share=1.0)  # never turned into a scoring example
        assert ex.plain and not ex.scoring and ex.chunks == [] and ex.question_ids == []
        assert len(ex.answer_ids) == TEXT_MDM_LENGTH
        head = ex.answer_ids[:40]
        found = [i for i, stream in enumerate(streams)
                 if any((stream + stream)[j:j + 40] == head for j in range(len(stream)))]
        sources.add(found[0] if found else "paragraphs")
    assert sources == {0, 1, "paragraphs"}  # all three sources are drawn
    batch = collate([sampler.sample(4) for _ in range(2)], layout, 128, 0.0, random.Random(0))
    n = 1 + TEXT_MDM_LENGTH
    assert batch["ids"].shape == (2, n) and (batch["ids"][:, 0] == layout.bos).all()
    assert batch["positions"][0].tolist() == list(range(n))
    assert (batch["roles"] == ROLE_ANSWER).all()
    assert batch["targets"][:, 0].logical_not().all() and batch["targets"][:, 1:].all()
    assert attention_mask(batch["roles"], batch["segments"]).all()  # bidirectional over the whole text


def test_pooling_kv_heads_keeps_the_function_when_grouped_heads_agree():
    """GQA conversion: where the KV heads of a group are equal, their mean is each of them, so the
    pooled model (fewer KV heads) computes what the original did; where they differ it does not."""
    from engine.attention import BACKENDS, dense_mask
    from training.train import pool_kv_heads

    cfg = dataclasses.replace(model_config(TOK, num_layers=2, hidden_size=384, num_kv_heads=6),
                              intermediate_size=96)
    torch.manual_seed(0)
    model = DiffusionLM(cfg).eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for name, t in state.items():  # make heads 0-2 and 3-5 share K and V
        if ".k_proj." in name or ".v_proj." in name:
            heads = t.view(6, cfg.head_dim, -1)
            heads[1:3] = heads[0]
            heads[4:6] = heads[3]
    model.load_state_dict(state)
    pooled_cfg = dataclasses.replace(cfg, num_kv_heads=2)
    pooled = DiffusionLM(pooled_cfg).eval()
    pooled.load_state_dict(pool_kv_heads(state, cfg, 2))
    ids = torch.randint(10, cfg.vocab_size, (1, 37))
    pos = torch.arange(37)[None]
    mask = dense_mask(torch.ones(1, 1, 37, 37, dtype=torch.bool))

    def logits(m):
        with torch.no_grad():
            return m(ids, pos, mask, BACKENDS["sdpa"], logits_rows="all").logits

    want, got = logits(model), logits(pooled)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert pooled_cfg.num_kv_heads * cfg.head_dim == pooled.layers[0].self_attn.k_proj.out_features
    with pytest.raises(ValueError, match="cannot pool"):
        pool_kv_heads(state, cfg, 4)
    state[next(n for n in state if ".k_proj." in n)].view(6, cfg.head_dim, -1)[1] += 1.0  # heads differ
    pooled.load_state_dict(pool_kv_heads(state, cfg, 2))
    model.load_state_dict(state)
    assert not torch.allclose(logits(pooled), logits(model), atol=1e-3)


def test_sentence_questions_are_answered_by_a_span_of_their_sentence():
    from training.sentence_questions import RULES, TRAINING_WORDINGS, questions_for

    cases = {
        "The default port is 8080.": ("default_is", "8080", "What is the default port?"),
        "The default sort order is ascending unless --reverse is given.": ("default_is", "ascending", None),
        "The strict mode defaults to off.": ("defaults_to", "off", "What does strict mode default to?"),
        "dbus-send was written by Philip Blundell.": ("written_by", "Philip Blundell", "Who wrote dbus-send?"),
        "PEP stands for Python Enhancement Proposal.": ("stands_for", "Python Enhancement Proposal", None),
        "Munin node listens on port 4949 for its master.": ("port", "4949", None),
        "The maximum file size is 8 GiB.": ("limit", "8 GiB", "What is the maximum file size?"),
        "The minimum size is 20GB, and the maximum is 64TB.": ("limit", "20GB", None),
        "A commit with no parents is called a root commit.": ("called", "a root commit",
                                                              "What is a commit with no parents called?"),
        "The log file is kept in /var/log/frobd.": ("kept_in", "/var/log/frobd", "Where is the log file kept?"),
        "The chage program requires a shadow password file.": ("requires", "a shadow password file", None),
        "Use the --quiet option to suppress all output.": ("use_to", "the --quiet option",
                                                           "What can I use to suppress all output?"),
        "To list the stored keys, run frob --list-keys.": ("to_use", "frob --list-keys",
                                                           "What can I use to list the stored keys?"),
        "Valgrind is an instrumentation framework for building dynamic analysis tools.": (
            "is_a", "an instrumentation framework", "What is Valgrind?"),
        "-b, --benchmark perform a benchmark on decoding": ("option_does", "-b, --benchmark",
                                                             "Which option performs a benchmark on decoding?"),
        "--enable-fat Includes multiple versions of certain functions.": (
            "option_does", "--enable-fat", "Which option includes multiple versions of certain functions?"),
        "-e PATTERNS, --regexp=PATTERNS Use PATTERNS as the patterns.": (
            "option_does", "-e PATTERNS, --regexp=PATTERNS", "Which option uses PATTERNS as the patterns?"),
        "-C, --ignore-case Specifies that case is ignored.": (
            "option_does", "-C, --ignore-case", "Which option specifies that case is ignored?"),
    }
    for sentence, (rule, answer, question) in cases.items():
        (q,) = questions_for(sentence)
        assert (q.rule, q.answer) == (rule, answer), sentence
        assert len(q.questions) == len(TRAINING_WORDINGS[rule]) + 1
        if question:
            assert q.questions[0] == question
    assert questions_for("It defaults to off.") == []  # a pronoun is no subject to ask about
    assert questions_for("The grass is green.") == []
    for clause in ("If the value is set to 60, the load is 60%.",  # a clause, not a subject
                   "Note that output requires use of print.", "This file is kept in /etc.",
                   "The hook is called before the refname is updated.",  # "called" as invoked, not named
                   "Use this function to compute the variance.", "To pick a format, use one of the following options.",
                   "The key needs to be quoted.", "Use --tls-max if you want to cap the TLS version.",
                   "Use -o to name the output file if you want."):
        assert questions_for(clause) == [], clause
    for not_an_action in ("--random-file <file> Deprecated option", "-f FILE FILE exists and is a regular file",
                          "-s Silent mode", "-a, --all do not ignore entries starting with ."):  # no verb; cut short
        assert questions_for(not_an_action) == [], not_an_action
    assert questions_for("-n, --dry-run does nothing")[0].questions[1] == "What option do I use to do nothing?"
    assert questions_for("-v, --verbose be verbose")[0].questions[0] == "Which option is verbose?"
    assert questions_for("-V show the version and exit")[0].questions[:2] == (
        "Which option shows the version and exits?", "What option do I use to show the version and exit?")
    assert all(len(TRAINING_WORDINGS[r.name]) == len(r.wordings) - 1 >= 2 for r in RULES)


@pytest.mark.parametrize(("task", "items_key"), [("sentence_qa", "sentence_questions"),
                                                 ("parsed_qa", "parsed_questions")])
def test_questions_over_a_context_hold_their_answer_or_say_not_found(task, items_key):
    from training import relations
    from training.sentence_questions import HELD_OUT_WORDING

    items = [{"context": f"Options are read at start. The default timeout is {i} seconds. Restart to apply.",
              "answer": str(i), "questions": ["What is the default timeout?", "Which timeout is used by default?"]}
             for i in range(20)]
    corpus = _corpus() | {"text_paragraphs": _flat([TOK.encode(f" Paragraph {i} of plain text.").ids
                                                    for i in range(50)]),
                          items_key: items}
    layout = make_layout(BUNDLED_MODEL, model_config(TOK))
    sampler = TaskSampler(corpus, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=5,
                          task_weights={task: 1}, near_miss_share=0.5)
    not_found = near_misses = 0
    for _ in range(100):
        ex = sampler.sample(4, scoring_share=0.0)
        question = TOK.decode(ex.question_ids)
        assert question in items[0]["questions"] and question != HELD_OUT_WORDING["default_is"]
        answer = TOK.decode([t for t in ex.answer_ids if t != layout.eos]).strip()
        if answer == relations.NOT_FOUND:
            not_found += 1
            assert not any("default timeout" in TOK.decode(c) for c in ex.chunks)
            # a near miss: the answer's neighbours shown without it
            near_misses += any("Options are read at start. Restart to apply." in TOK.decode(c) for c in ex.chunks)
        else:
            assert any(f"default timeout is {answer} seconds" in TOK.decode(c) for c in ex.chunks)
    assert 3 < not_found < 35
    assert 0 < near_misses < not_found
    # Without near misses (the default), the stream is the one drawn before they existed: an
    # unanswerable question sees unrelated text only.
    plain = TaskSampler(corpus, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=5,
                        task_weights={task: 1})
    for _ in range(100):
        ex = plain.sample(4, scoring_share=0.0)
        assert not any("Restart to apply." in TOK.decode(c) for c in ex.chunks) or \
            any("default timeout is" in TOK.decode(c) for c in ex.chunks)
    with pytest.raises(ValueError, match="near_miss_share"):
        TaskSampler(corpus, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=5,
                    task_weights={task: 1}, near_miss_share=1.5)
    with pytest.raises(ValueError, match=f"{task} task needs"):
        TaskSampler(_corpus() | {"text_paragraphs": corpus["text_paragraphs"]}, lambda s: TOK.encode(s).ids,
                    TOK.decode, layout, 128, 64, seed=3, task_weights={task: 1})


def test_decoys_hold_a_value_of_the_asked_kind_about_another_subject():
    from training.decoy_values import decoy_sentence, subject_words, value_kind

    assert [value_kind(a) for a in ("8080", " --log-file ", "Thomas Leonard", "a full or relative path",
                                    "8080 or 8443")] == ["number", "identifier", "name", None, None]
    avoid = subject_words(["What is the default timeout?", "Which timeout is used by default?"])
    assert avoid == {"timeout"}
    paragraph = ("The default timeout is 30 seconds for new installs. The cache keeps 64 entries in all. It holds "
                 "5 maps. The north gate opens early in the morning for visitors. The archive holds 12 maps of the "
                 "coast.")
    rng = random.Random(0)
    drawn = {decoy_sentence(paragraph, "number", avoid, "30", rng) for _ in range(40)}
    # never the sentence naming the question's subject, one without a number, or one too short
    assert drawn == {"The cache keeps 64 entries in all.", "The archive holds 12 maps of the coast."}
    assert decoy_sentence(paragraph, "name", avoid, "30", rng) is None
    assert decoy_sentence(paragraph, "number", avoid | {"cache", "archive"}, "30", rng) is None


def test_near_misses_show_decoys_and_still_say_not_found():
    from training import relations

    items = [{"context": f"Options are read at start. The default timeout is {i} seconds. Restart to apply.",
              "answer": str(i), "questions": ["What is the default timeout?", "Which timeout is used by default?"]}
             for i in range(20)]
    decoys = [f" The archive in the east wing holds {i} old maps." for i in range(10)]
    corpus = _corpus() | {"text_paragraphs": _flat([TOK.encode(t).ids for t in decoys]), "sentence_questions": items}
    layout = make_layout(BUNDLED_MODEL, model_config(TOK))

    def sampler(**shares):
        return TaskSampler(corpus, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=5,
                           task_weights={"sentence_qa": 1}, **shares)

    with_decoys = sampler(near_miss_share=1.0, decoy_share=0.5)
    shown = 0
    for _ in range(300):
        ex = with_decoys.sample(4, scoring_share=0.0)
        answer = TOK.decode([t for t in ex.answer_ids if t != layout.eos]).strip()
        near_miss = [TOK.decode(c) for c in ex.chunks if "Options are read at start." in TOK.decode(c)]
        if answer != relations.NOT_FOUND or not near_miss:
            continue
        assert "default timeout" not in near_miss[0]
        shown += "old maps." in near_miss[0]
    assert shown > 10
    # Without decoys (share 0, the default), near misses are drawn as before decoys existed: the
    # digest of these 100 examples as the sampler drew them then (at af1a246).
    without, digest = sampler(near_miss_share=1.0, decoy_share=0.0), hashlib.sha256()
    for _ in range(100):
        ex = without.sample(4, scoring_share=0.0)
        digest.update(repr((ex.chunks, ex.question_ids, ex.answer_ids)).encode())
        assert not any("old maps." in TOK.decode(c) and "Options are read" in TOK.decode(c) for c in ex.chunks)
    assert digest.hexdigest() == "da917aca3543e46f1d16a14193c81b29de19f6b564ccc1a30ec35d5db918680e"
    with pytest.raises(ValueError, match="decoy_share"):
        sampler(near_miss_share=1.0, decoy_share=1.5)
    with pytest.raises(ValueError, match="needs near_miss_share"):
        sampler(decoy_share=0.5)

    # Answerable examples may hold a decoy too, beside the sentence that answers: the answer stays.
    with_answerable_decoys, seen, with_decoy = sampler(answerable_decoy_share=0.5), 0, 0
    for _ in range(300):
        ex = with_answerable_decoys.sample(4, scoring_share=0.0)
        answer = TOK.decode([t for t in ex.answer_ids if t != layout.eos]).strip()
        if answer == relations.NOT_FOUND:
            continue
        shown = next(TOK.decode(c) for c in ex.chunks if "Options are read at start." in TOK.decode(c))
        assert f"The default timeout is {answer} seconds." in shown
        seen += 1
        with_decoy += "old maps." in shown
    assert seen > 100 and 0.3 * seen < with_decoy < 0.7 * seen
    with pytest.raises(ValueError, match="answerable_decoy_share"):
        sampler(answerable_decoy_share=-0.1)


def test_cloze_blanks_are_numbers_identifiers_names_and_quoted_terms():
    from training.cloze_questions import blanks

    sentence = ("Any file named Override.xml takes precedence, says Thomas Leonard, over the 3 data streams "
                "and the ‘worker bees’ of CRC-32C; it MUST be read.")
    found = {sentence[b.start:b.end]: b.kind for b in blanks(sentence)}
    assert found == {"Override.xml": "identifier", "Thomas Leonard": "name", "3": "number",
                     "worker bees": "quoted", "CRC-32C": "identifier"}  # MUST: a keyword, not a term

    def spans(text):
        return [text[b.start:b.end] for b in blanks(text)]

    assert spans("The weight is 50, and the maximum is 100%.") == ["50", "100%"]
    assert spans("The Savannah server reads it.") == []  # "The" opens no name
    assert spans("She wrote it with ‘could’ in mind.") == []  # a word quoted for emphasis


def test_cloze_questions_ask_for_the_blank_in_the_sentences_words():
    import random

    from training.cloze_questions import blanks, cloze_question, is_prose

    sentence = "Any file named Override.xml takes precedence over all other files in the same packages directory."
    (blank,) = blanks(sentence)
    assert cloze_question(sentence, blank, random.Random(0), noised=False) == (
        "Any file named what takes precedence over all other files in the same packages directory?")
    streams = "For integer math, interleaving 3 data streams works best on current chips."
    (blank,) = blanks(streams)
    assert cloze_question(streams, blank, random.Random(0), noised=False) == (
        "Interleaving how many data streams works best on current chips?")  # its clause only
    quoted = "It is advised to always specify ‘argtypes’ for all variadic functions."
    assert cloze_question(quoted, blanks(quoted)[0], random.Random(0), noised=False) == (
        "It is advised to always specify what for all variadic functions?")
    nested = "Added handling for the ‘'unknown-8bit'’ charset."  # Texinfo's quotes around a quoted term
    assert cloze_question(nested, blanks(nested)[0], random.Random(0), noised=False) == (
        "Added handling for the what charset?")
    by = "The manual was written by Thomas Leonard in his spare time."
    assert "by whom" in cloze_question(by, blanks(by)[0], random.Random(0), noised=False)
    # What a copula says of a subject is asked in the order people ask it; each in its own clause.
    two = "The default weight value is 50, and the maximum is 100."
    assert [cloze_question(two, b, random.Random(0), noised=False) for b in blanks(two)] == [
        "What is the default weight value?", "What is the maximum?"]
    who = "The maintainer of the package is Bart Van Assche."
    assert cloze_question(who, blanks(who)[0], random.Random(0), noised=False) == (
        "Who is the maintainer of the package?")
    deictic = "Its maximum size is 30,000,000 entries."  # "its" points outside the sentence: not a subject
    assert cloze_question(deictic, blanks(deictic)[0], random.Random(0), noised=False) == (
        "Its maximum size is how many entries?")
    verbs = ["The library uses CRC-32C for checksums.", "The tool prints 72 columns by default.",
             "The limit is 100 files per directory.", "It uses CRC-32C for checksums."]
    assert [cloze_question(v, blanks(v)[0], random.Random(0), noised=False) for v in verbs] == [
        "What does the library use for checksums?", "How many columns does the tool print by default?",
        "The limit is how many files per directory?", "It uses what for checksums?"]
    # Fronted only where the result asks the same thing: no opener before the subject, no clause
    # across it, the blank the whole value, "Who" for people only; else the sentence's order.
    kept = {"By default the tool uses CRC-32C for checksums.": "By default the tool uses what for checksums?",
            "The default port is 8080 or 8443 when TLS is on.": "The default port is what or 8443 when TLS is on?",
            "The first release was 2003 and the last was 2019.": "The first release was what and the last was 2019?",
            "The recommended editor is Visual Studio Code.": "What is the recommended editor?",
            "The maintainer of the package is Bart Van Assche.": "Who is the maintainer of the package?",
            "The function returns NULL on error, and errno is set.": "What does the function return on error?",
            "The compressor sets 9 as the default level.": "What does the compressor set as the default level?",
            "The daemon listens on port 8080 and uses TLS.": "The daemon listens on port what and uses TLS?"}
    for said, question in kept.items():
        assert cloze_question(said, blanks(said)[0], random.Random(0), noised=False) == question, said
    port = "The default port is 8080 for every new installation."
    asked = {cloze_question(port, blanks(port)[0], random.Random(seed)) for seed in range(40)}
    assert any(q.startswith("What is ") for q in asked) and any(" is what " in q for q in asked)  # both orders
    assert all("port" in q and "8080" not in q for q in asked)  # the subject's last word is kept
    rng = random.Random(3)
    noised = {cloze_question(sentence, blanks(sentence)[0], rng) for _ in range(40)}
    assert len(noised) > 5 and all(" what " in q or q.startswith("What ") for q in noised)
    assert all("Override.xml" not in q for q in noised)
    assert any("priority" in q or "wins over" in q or "overrides" in q for q in noised)  # same meaning, other words
    for not_prose in ("See *note poll(): 251a. for more about the 3 calls.", "x = 3 and y = 4 in the loop here.",
                      "NAME ---- git-clone - Clone a repository into 2 directories.", "too short: 3 words."):
        assert not is_prose(not_prose), not_prose
    assert is_prose(sentence)


def test_cloze_examples_hold_their_answer_once_in_their_context():
    import random

    from training.cloze_questions import cloze_example

    paragraph = ("The daemon reads its settings at start. Any file named Override.xml takes precedence over all "
                 "other files in the same packages directory. Restart it to apply a change.")
    rng = random.Random(1)
    for _ in range(20):
        ex = cloze_example(paragraph, rng)
        assert ex.answer == "Override.xml" and ex.context.count("Override.xml") == 1
        assert ex.context.startswith("The daemon reads") and ex.question.endswith("?")
    assert cloze_example("Set it to 8 here, or to 8 there, as the files say.", rng) is None  # twice: ambiguous
    assert cloze_example("no sentence of prose here", rng) is None
    tight = cloze_example(paragraph, random.Random(1), context_chars=120)
    assert tight.context == ("Any file named Override.xml takes precedence over all other files in the same "
                             "packages directory.")


def test_cloze_qa_examples_put_the_answer_in_one_chunk_of_real_text():
    texts = [" The service reads its settings at start. The default port of the cache server is 6379 for "
             f"every user. Ask the admin, item {i}." for i in range(30)]
    corpus = _corpus() | {"text_paragraphs": _flat([TOK.encode(t).ids for t in texts])}
    layout = make_layout(BUNDLED_MODEL, model_config(TOK))
    sampler = TaskSampler(corpus, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=5,
                          task_weights={"cloze_qa": 1})
    for _ in range(30):
        ex = sampler.sample(3, scoring_share=0.0)
        answer = TOK.decode([t for t in ex.answer_ids if t != layout.eos]).strip()
        question = TOK.decode(ex.question_ids)
        assert answer in ("6379", *(str(i) for i in range(30)))
        assert answer not in question and question.endswith("?")
        assert sum(answer in TOK.decode(c) for c in ex.chunks) >= 1 and len(ex.chunks) == 3
    headings = _corpus() | {"text_paragraphs": _flat([TOK.encode(" NAME ---- git-clone").ids] * 5)}
    sampler = TaskSampler(headings, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=5,
                          task_weights={"cloze_qa": 1})
    with pytest.raises(ValueError, match="cloze question"):
        sampler.sample(2, scoring_share=0.0)


def test_parsed_qa_draws_each_source_as_often_however_many_questions_it_has():
    items = [{"context": f"The default timeout of tool {i} is {i} seconds.", "answer": f"{i} seconds",
              "questions": [f"What is the default timeout of tool {i}?"], "source": "hotpotqa" if i else "corpus"}
             for i in range(10)]
    corpus = _corpus() | {"text_paragraphs": _flat([TOK.encode(f" Paragraph {i} of plain text.").ids
                                                    for i in range(50)]),
                          "parsed_questions": items}
    layout = make_layout(BUNDLED_MODEL, model_config(TOK))
    sampler = TaskSampler(corpus, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=5,
                          task_weights={"parsed_qa": 1})
    asked = [TOK.decode(sampler.sample(4, scoring_share=0.0).question_ids) for _ in range(200)]
    from_corpus = sum(q == "What is the default timeout of tool 0?" for q in asked)
    assert 70 < from_corpus < 130  # one question of ten, drawn half of the time


def test_hotpot_near_misses_ask_over_the_distractors_alone():
    """With near misses, some HotpotQA questions are asked over their distractor paragraphs alone
    (retrieved for the question, without its answer) and answered "not found"; never where the
    answer also stands in a distractor; none by default."""
    from training import relations

    layout = make_layout(BUNDLED_MODEL, model_config(TOK))

    def answers(corpus, share):
        sampler = TaskSampler(corpus, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=4,
                              task_weights={"hotpot": 1}, near_miss_share=share)
        out = []
        for _ in range(200):
            ex = sampler.sample(2, scoring_share=0.0)
            out.append((TOK.decode([t for t in ex.answer_ids if t != layout.eos]).strip(),
                        " ".join(TOK.decode(c) for c in ex.chunks)))
        return out

    drawn = answers(_corpus(), 1.0)
    missed = [text for answer, text in drawn if answer == relations.NOT_FOUND]
    assert 10 < len(missed) < 60  # about the lookup task's share, 15%
    assert not any("Alder 3." in text for text in missed)
    assert all("Alder 3." in text for answer, text in drawn if answer != relations.NOT_FOUND)
    assert all(answer != relations.NOT_FOUND for answer, _ in answers(_corpus(), 0.0))
    everywhere = _corpus() | {"qa": [{"question": "Which kind of place?", "answer": "town", "gold": [3],
                                      "paragraphs": [3, 4, 5]}]}
    assert all(answer == "town" for answer, _ in answers(everywhere, 1.0))


def test_export_keeps_the_folders_training_notes_only_for_the_same_lineage(tmp_path):
    """A run continuing the folder's weights keeps their notes; a fresh model exported into a copy
    of another model's folder drops that model's (they would describe other weights)."""
    from training.train import export

    cfg = ModelConfig(family="llada", vocab_size=32, hidden_size=64, intermediate_size=96, num_layers=1,
                      num_heads=1, num_kv_heads=1, head_dim=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                      max_position_embeddings=64, mask_token_id=2, bos_token_id=0, eos_token_id=1)
    model = DiffusionLM(cfg)
    first = {"steps": 10, "seed": 1, "curriculum": [(0.0, [1])]}  # tuples, as a resumed checkpoint holds them
    (tmp_path / "docqa.json").write_text(json.dumps({"chunk_size": 64, "weak_score": -2.0, "training": {
        "machine": "one H200", "runs": [first]}}))
    export(model, cfg, tmp_path, [first, {"steps": 20, "seed": 1}])
    kept = json.loads((tmp_path / "docqa.json").read_text())
    assert kept["training"]["machine"] == "one H200" and len(kept["training"]["runs"]) == 2
    assert kept["chunk_size"] == 64 and kept["weak_score"] == -2.0  # people's settings stay either way
    export(model, cfg, tmp_path, [{"steps": 5, "seed": 9}])
    fresh = json.loads((tmp_path / "docqa.json").read_text())
    assert fresh["training"] == {"runs": [{"steps": 5, "seed": 9}]} and fresh["weak_score"] == -2.0
