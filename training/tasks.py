"""Training examples for the bundled model, in the exact token layout of inference.

An example is [prefix] [chunk_1 .. chunk_K] [query] [answer], the chunks BOS-prefixed and of at
most C tokens; `collate` turns a batch into tensors with positions (chunk j at P + j*C, the
query after the K chunks: `continuous` mode) and the roles that define the attention mask (see
`attention_mask`). A "scoring" example is [chunk] [query] at local positions, as the chunk scorer
sees it, with the question's tokens as the only targets.

Tasks: needle retrieval in RULER's wording (single, multi-key, multi-value, multi-query; numbers,
words, UUIDs as keys and values; essay, repeated and needle haystacks), key-value retrieval,
extractive QA over HotpotQA paragraphs, "which document mentions X", masked-diffusion language
modelling on real text (`text_mdm`, the pretraining task, in LLaDA's layout), and lookups: facts of the
training relation families (training.relations) placed in real text, asked in the training
wordings and framings, with a fact of the same family about another subject beside them, and
sometimes not there at all (the answer is then relations.NOT_FOUND); and questions made from the
corpus's own sentences (training.sentence_questions by rules, training.parsed_questions from a parse,
training.cloze_questions by blanking a span of any sentence of prose), over their real context,
some of them reworded as people ask (training.reworded_questions).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from engine.method.sentences import split_sentences
from training import relations
from training.cloze_questions import cloze_example
from training.decoy_values import decoy_sentence, names_none_of, subject_words, value_kind
from training.reworded_questions import Rewording, one_token_words

ROLE_PAD, ROLE_PREFIX, ROLE_CHUNK, ROLE_QUERY, ROLE_ANSWER = -1, 0, 1, 2, 3
REPEAT_HAYSTACK = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@dataclass
class Example:
    chunks: list[list[int]]  # content tokens per chunk (BOS added at collate), document order
    question_ids: list[int]
    answer_ids: list[int]
    scoring: bool = False  # [chunk][query] layout, question tokens as targets
    plain: bool = False  # [BOS][answer] alone, attending to itself: masked-diffusion pretraining on text


@dataclass(frozen=True)
class Layout:
    prefix: list[int]
    query_head: list[int]
    query_tail: list[int]
    bos: int
    eos: int
    mask: int
    pad: int


# Relative draw weights by default; each training run of the bundled model names its own (model card).
# A task left out of a weights dict has weight 0 (the tasks added later are 0 by default, so the
# default stream stays the one the bundled model was first trained on).
TASK_WEIGHTS = {"niah": 10, "kv_retrieval": 2, "hotpot": 3, "which_document": 2, "lookup": 0, "sentence_qa": 0,
                "lookup_generated": 0, "text_denoising": 0, "text_mdm": 0, "lookup_near": 0,
                "lookup_dressed": 0, "cloze_qa": 0, "parsed_qa": 0, "written_qa": 0}
LOOKUP_NOT_FOUND_SHARE = 0.15
# Of the near misses of a question with passages of its own document besides (written_qa), the share
# shown one of those; the others show the passage's own sentences without the answer.
NEAR_PASSAGE_SHARE = 0.5
# A passage shorter than a chunk by fewer tokens than this is not filled (a sentence or two of
# filler would be cut to a fragment).
MIN_FILL = 8
# lookup_near asks a list family this share of the time (the table's 7 training list families are
# 4% of plain lookups; on the held-out sets a list question is the likeliest miss).
LOOKUP_NEAR_LIST_SHARE = 0.3
LOOKUP_NEAR_SUBJECTS = (1, 2)  # facts of the asked family about near subjects, fewest and most
# lookup_dressed words this share of its facts in a training dressing (a lead, a trailing clause):
# the rest stay in their families' plain sentences, which most documents use.
LOOKUP_DRESSED_SHARE = 0.6
# The generated task asks for "not found" never: with a share (measured, see the journal) its
# refusals, where only the asked relation's phrase is missing, taught the model to answer only
# questions whose words stand in the fact, and it said "not found" to held-out families and
# paraphrases.
LOOKUP_GENERATED_NOT_FOUND_SHARE = 0.0
# Paragraphs cloze_qa draws before it gives up: about one in seven real paragraphs has a sentence
# of prose with something to ask, so 200 failing in a row means a corpus without prose.
CLOZE_TRIES = 200
# Paragraphs a near miss draws for a decoy before it is shown without one (most paragraphs hold a
# sentence of prose with a number, identifier or name, so a few tries nearly always find one).
DECOY_TRIES = 20
TEXT_DENOISING_TARGET = 48  # tokens of text the text_denoising task restores after its chunk
# Tokens of one text_mdm sequence: three chunks' worth, so that a word is read in more context than
# one chunk gives, while a batch of them costs about what a batch of K = 4 examples does.
TEXT_MDM_LENGTH = 384
# Where text_mdm draws its text from, by share: the corpus's technical prose (the documents users
# bring), HotpotQA's encyclopedic paragraphs (names, dates, places) and the essays (running prose).
TEXT_MDM_SOURCES = {"text": 6, "paragraphs": 3, "essay": 1}
# "absent" asks for a key the document lacks while other keys' needles stand in view (the answer is
# "not found"): without it the model learns that a needle question always has a needle to copy, and
# gives another key's value. It comes last at weight 0 so the default stream stays the same.
NIAH_VARIANT_WEIGHTS = {"single": 4, "multikey": 3, "multivalue": 2, "multiquery": 2, "absent": 0}
# Of "absent" examples with word keys, the share where a key in view shares a word with the asked one
# ("amber-falcon" asked, "amber-heron" present): the near miss a copy by one word would take.
NIAH_ABSENT_SHARED_WORD_SHARE = 0.5
# Of "absent" examples, the share asked in the multi-value wording ("What are all the ...").
NIAH_ABSENT_LIST_WORDING_SHARE = 0.3


def _share(name: str, value: float) -> float:
    """`value`, a share of examples, checked to lie within [0, 1]."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be within [0, 1], got {value}")
    return value


class TaskSampler:
    """Draws training examples from the prepared corpus (see training/prepare.py)."""

    def __init__(self, corpus: dict, encode, decode, layout: Layout, chunk_size: int, answer_len: int,
                 seed: int, task_weights: dict[str, float] | None = None,
                 niah_variant_weights: dict[str, float] | None = None,
                 multiquery_keys: tuple[int, ...] | None = None, near_miss_share: float = 0.0,
                 reword_share: float = 0.0, synonyms: Mapping[str, Sequence[str]] | None = None,
                 decoy_share: float = 0.0, answerable_decoy_share: float = 0.0,
                 written_not_found_share: float = LOOKUP_NOT_FOUND_SHARE,
                 written_unanswered_share: float = 0.0, filled_context_share: float = 0.0,
                 written_page_share: float = 0.0) -> None:
        self.rng = random.Random(seed)
        # Of sentence_qa's and parsed_qa's questions, the share reworded as people ask
        # (training.reworded_questions, with `synonyms` from training.synonyms; written_qa's are
        # written so already). 0 draws the streams of the runs before rewording existed.
        self.reword_share = _share("reword_share", reword_share)
        if reword_share and synonyms is None:
            raise ValueError("rewording questions needs a synonym map (training.synonyms)")
        self.rewording = Rewording(synonyms, one_token_words(encode)) if synonyms is not None else None
        # Of the unanswerable examples of the tasks that ask over real text (sentence_qa, parsed_qa,
        # written_qa, hotpot), the share that are near misses: passages on the question's topic that
        # do not hold its answer, as a search finds for a question the document cannot answer. 0
        # draws the streams of the runs before near misses existed.
        self.near_miss_share = _share("near_miss_share", near_miss_share)
        # Of sentence_qa's, parsed_qa's and written_qa's near misses, the share shown with a decoy
        # besides: a sentence from elsewhere in the corpus holding a value of the answer's kind about
        # another subject (training.decoy_values). 0 draws the streams of the runs before decoys
        # existed.
        self.decoy_share = _share("decoy_share", decoy_share)
        if decoy_share and not near_miss_share:
            raise ValueError("decoys are shown in near misses: decoy_share needs near_miss_share")
        # Of sentence_qa's, parsed_qa's and written_qa's answerable examples, the share whose context
        # holds a decoy too: the same kind of value about another subject beside the answer. Decoys
        # only in unanswerable examples teach "a decoy in view means not found", and a model that
        # cannot tell the decoy from the answer refuses both; with decoys on both sides only telling
        # them apart pays. 0 draws the streams of the runs before it existed.
        self.answerable_decoy_share = _share("answerable_decoy_share", answerable_decoy_share)
        # Of written_qa's examples, the share asked where the passage shown does not answer: people
        # ask a page what it does not say (a third of eval-pdfs' questions), and a model that only
        # ever saw a person's question answered learns to answer every one.
        self.written_not_found_share = _share("written_not_found_share", written_not_found_share)
        # Of written_qa's examples of items that have them, the share asking one of the item's
        # unanswered questions over its own whole passage ("not found"): the hardest near miss, a
        # page on the question's very subject, with values of its kind, that does not state the one
        # asked. A reader that learned "a person's question over the page on its topic has its
        # answer there" makes one up from such a page. 0 draws the stream the same items draw
        # without unanswered questions.
        self.written_unanswered_share = _share("written_unanswered_share", written_unanswered_share)
        # Of the passages the reading tasks show (sentence_qa's, parsed_qa's and written_qa's context,
        # a near miss's sentences, a near passage), the share placed among real text that fills their
        # chunk, as every chunk but a document's last is full at inference (a passage within MIN_FILL
        # tokens of a full chunk stays as it is). A passage alone has a median of 50-64 tokens of a
        # 127-token chunk: shown only so, "the short chunk holds the answer" is learned, and a PDF's
        # full chunks are read as no passage seen in training. 0 draws the stream of the runs before
        # it existed.
        self.filled_context_share = _share("filled_context_share", filled_context_share)
        # Of the passages written_qa shows for an answer or an unanswered question, the share placed
        # among the other passages of their own document (before it those the file has before it,
        # after it those after), as a manual's page holds a passage among its neighbours' options,
        # values and names: people's questions are read far worse there than over the passage alone
        # (probe-reading --written, `written, in its page`). Beside an unanswered question stand only
        # passages naming none of its subject words: another might answer it. The rest are placed
        # as filled_context_share says. 0 draws the stream of the runs before it existed.
        self.written_page_share = _share("written_page_share", written_page_share)
        # How many keys a multi-query question asks for, drawn uniformly from this list; None draws
        # 2-4 uniformly (the default stream). RULER's niah_multiquery always asks for 4.
        if multiquery_keys is not None and (not multiquery_keys or any(not 1 <= n <= 4 for n in multiquery_keys)):
            raise ValueError(f"multiquery_keys must be 1-4 keys each, got {multiquery_keys}")
        self.multiquery_keys = multiquery_keys
        self.task_weights = dict.fromkeys(TASK_WEIGHTS, 0.0) | dict(task_weights or TASK_WEIGHTS)
        self.niah_variant_weights = dict.fromkeys(NIAH_VARIANT_WEIGHTS, 0.0) | dict(niah_variant_weights
                                                                                  or NIAH_VARIANT_WEIGHTS)
        if set(self.task_weights) != set(TASK_WEIGHTS) or any(w < 0 for w in self.task_weights.values()) \
                or not any(self.task_weights.values()):
            raise ValueError(f"task weights must name only {sorted(TASK_WEIGHTS)}, with non-negative values, "
                             f"got {task_weights}")
        known = NIAH_VARIANT_WEIGHTS
        given = self.niah_variant_weights
        if set(given) != set(known) or any(w < 0 for w in given.values()) or not any(given.values()):
            raise ValueError(f"NIAH variant weights must name only {sorted(known)} with non-negative values, "
                             f"got {given}")
        for task, needs in (("lookup", "text_paragraphs"), ("lookup_generated", "text_paragraphs"),
                            ("text_denoising", "text_paragraphs"), ("text_mdm", "text_paragraphs"),
                            ("sentence_qa", "text_paragraphs"), ("cloze_qa", "text_paragraphs"),
                            ("sentence_qa", "sentence_questions"), ("parsed_qa", "parsed_questions"),
                            ("written_qa", "written_questions")):
            if self.task_weights[task] and not corpus.get(needs):
                source = ("training.written_questions' items (training.train adds them)" if task == "written_qa"
                          else "the corpus's real text (training.prepare --corpus)")
                raise ValueError(f"the {task} task needs {source}")
        self.encode, self.decode = encode, decode  # str -> list[int], list[int] -> str
        self.layout, self.c, self.answer_len = layout, chunk_size, answer_len
        self.sent_tok, self.sent_off = corpus["essay_sentences"]["tokens"], corpus["essay_sentences"]["offsets"]
        self.par_tok, self.par_off = corpus["paragraphs"]["tokens"], corpus["paragraphs"]["offsets"]
        self.titles = corpus["paragraph_titles"]
        self.qa = corpus["qa"]
        self.adjs, self.nouns = corpus["adjectives"], corpus["nouns"]
        self._repeat = self.encode(" " + REPEAT_HAYSTACK)
        self._paragraph_break = self.encode("\n\n")
        text = corpus.get("text_paragraphs")  # real English (training.corpus), for the lookup haystacks
        self.text_tok, self.text_off = (text["tokens"], text["offsets"]) if text else (None, None)
        self.split = relations.split()
        self.train_list_families = [f for f in self.split.train_families if f.is_list]
        self.generated_relations = relations.generated_relations(self.split)
        self.sentence_questions = corpus.get("sentence_questions", [])  # training.prepare
        # training.prepare --parsed-questions, by source: each source is drawn as often, so that the
        # technical prose users bring is not outnumbered by HotpotQA's denser encyclopedic sentences.
        self.parsed_questions: dict[str, list[dict]] = {}
        for item in corpus.get("parsed_questions", []):
            self.parsed_questions.setdefault(item.get("source", "corpus"), []).append(item)
        # training.written_questions.training_items, by document collection, each drawn as often,
        # and by document: a near miss shows a passage of the asked item's own document.
        self.written_questions: dict[str, list[dict]] = {}
        self.written_by_document: dict[str, list[dict]] = {}
        for item in corpus.get("written_questions", []):
            self.written_questions.setdefault(item["source"], []).append(item)
            self.written_by_document.setdefault(item["document"], []).append(item)

    # ---- random values in RULER's formats --------------------------------------------------------

    def _value(self, kind: str) -> str:
        r = self.rng
        if kind == "numbers":
            return str(r.randint(10**6, 10**7 - 1))
        if kind == "words":
            return f"{r.choice(self.adjs)}-{r.choice(self.nouns)}"
        return str(uuid.UUID(int=r.getrandbits(128), version=4))

    def _sentence(self, i: int) -> list[int]:
        return self.sent_tok[self.sent_off[i]:self.sent_off[i + 1]].tolist()

    def _filler(self, n: int, haystack: str) -> list[list[int]]:
        """Sentences totalling at least n tokens."""
        out, total = [], 0
        if haystack == "essay":
            i = self.rng.randrange(len(self.sent_off) - 1)
            while total < n:
                s = self._sentence(i % (len(self.sent_off) - 1))
                out.append(s)
                total += len(s)
                i += 1
        elif haystack == "text":
            i = self.rng.randrange(len(self.text_off) - 1)
            while total < n:
                j = i % (len(self.text_off) - 1)
                s = self.text_tok[self.text_off[j]:self.text_off[j + 1]].tolist()
                out.append(s)
                total += len(s)
                i += 1
        elif haystack == "repeat":
            while total < n:
                out.append(self._repeat)
                total += len(self._repeat)
        else:  # "needle": a haystack of other needles
            while total < n:
                kind = self.rng.choice(["numbers", "words"])
                s = self.encode(f" One of the special magic {kind} for {self._value('words')} is: {self._value(kind)}.")
                out.append(s)
                total += len(s)
        return out

    def _chunk_with(self, needles: list[list[int]], haystack: str) -> list[int]:
        """C-1 content tokens of haystack with the needles inserted at sentence boundaries."""
        room = self.c - 1
        need = sum(len(x) for x in needles)
        assert need < room, "needles longer than a chunk"
        sents = self._filler(room - need + 8, haystack)
        if haystack == "text":
            # Real paragraphs can be longer than a chunk: needles spread between them could be cut
            # apart, so they go in together, at one boundary.
            at = self.rng.randrange(len(sents) + 1)
            sents[at:at] = needles
        else:
            for needle in needles:
                sents.insert(self.rng.randrange(len(sents) + 1), needle)
        flat = [t for s in sents for t in s]
        if len(flat) > room:  # cut filler, never a needle: drop tokens from an end away from them
            start = self.rng.randrange(0, len(flat) - room + 1)
            needle_spans = self._spans(sents, needles)
            lo = min(a for a, _ in needle_spans)
            hi = max(b for _, b in needle_spans)
            start = min(max(start, hi - room), lo)
            flat = flat[start:start + room]
        return flat

    @staticmethod
    def _spans(sents, needles):
        spans, pos = [], 0
        ids = {id(n) for n in needles}
        for s in sents:
            if id(s) in ids:
                spans.append((pos, pos + len(s)))
            pos += len(s)
        return spans or [(0, 0)]

    def _answer(self, text: str) -> list[int]:
        # With a leading space, as the value stands in running text (" is: perfect-club."): the
        # byte-level BPE merges the space into a word's first token ("Ġperfect" against "per" +
        # "fect"), so without it a word answer is a respelling of the text, not a copy. Digits
        # and UUID pieces are single tokens either way (the space is its own token before them).
        # The app strips the answer's text.
        ids = self.encode(" " + text.strip())[: self.answer_len - 1]
        return ids + [self.layout.eos] * (self.answer_len - len(ids))

    # ---- tasks -------------------------------------------------------------------------------------

    def niah(self, k: int) -> Example:
        for _ in range(20):
            example = self._niah_once(k)
            if example is not None:
                return example
        raise RuntimeError("could not fit needles into the chunks")

    def _niah_once(self, k: int) -> Example | None:
        r = self.rng
        variant = r.choices(list(self.niah_variant_weights), list(self.niah_variant_weights.values()))[0]
        haystack = r.choices(["essay", "repeat", "needle"], [6, 2, 1])[0]
        key_kind = r.choices(["words", "numbers", "uuids"], [5, 3, 2])[0]  # number keys: the weak multi-key skill
        val_kind = r.choices(["numbers", "words", "uuids"], [5, 2, 3])[0]
        # Multi-key, then multi-query: the order the default stream was drawn in, so a seed keeps its stream.
        n_multikey = r.randint(2, 4)
        n_query = r.randint(2, 4) if self.multiquery_keys is None else r.choice(self.multiquery_keys)
        # "absent": keys[0] is asked and has no needle; keys[1:] (1-3 of them) have one each.
        n_keys = {"single": 1, "multikey": n_multikey, "multivalue": 1, "multiquery": n_query,
                  "absent": n_multikey}[variant]
        n_vals = r.randint(2, 4) if variant == "multivalue" else 1
        keys = [self._value(key_kind) for _ in range(n_keys)]
        if variant == "absent":
            keys = self._absent_keys(keys, key_kind)
            # A haystack of random needles could hold the asked key by chance; the keys in view
            # are the example's own needles.
            haystack = "essay" if haystack == "needle" else haystack
        needles = []  # (chunk, key index, value, tokens)
        for ki, key in enumerate(keys):
            if variant == "absent" and ki == 0:
                continue
            for _ in range(n_vals):
                value = self._value(val_kind)
                text = f" One of the special magic {val_kind} for {key} is: {value}."
                needles.append((r.randrange(k), ki, value, self.encode(text)))
        queried = list(range(n_keys)) if variant == "multiquery" else [0]
        per_chunk: list[list] = [[] for _ in range(k)]
        for n in needles:
            per_chunk[n[0]].append(n)
        # Too many needles for one chunk: spread them round robin.
        if any(sum(len(x[3]) for x in p) > self.c - 24 for p in per_chunk):
            per_chunk = [needles[i::k] for i in range(k)]
            if any(sum(len(x[3]) for x in p) > self.c - 24 for p in per_chunk):
                return None  # too many long needles for k chunks: draw again
        chunks = [self._chunk_with([n[3] for n in p], haystack) for p in per_chunk]
        order = [n for p in per_chunk for n in p]  # document order
        if variant == "multiquery":
            answer = ", ".join(n[2] for qi in queried for n in order if n[1] == qi)
            keys_text = ", ".join(keys[:-1]) + ", and " + keys[-1]
            question = f"What are all the special magic {val_kind} for {keys_text} mentioned in the provided text?"
        elif variant == "absent":
            answer = relations.NOT_FOUND
            question = (f"What are all the special magic {val_kind} for {keys[0]} mentioned in the provided text?"
                        if r.random() < NIAH_ABSENT_LIST_WORDING_SHARE else
                        f"What is the special magic {val_kind[:-1]} for {keys[0]} mentioned in the provided text?")
        elif variant == "multivalue":
            answer = ", ".join(n[2] for n in order if n[1] == 0)
            question = f"What are all the special magic {val_kind} for {keys[0]} mentioned in the provided text?"
        else:
            answer = next(n[2] for n in order if n[1] == 0)
            question = f"What is the special magic {val_kind[:-1]} for {keys[0]} mentioned in the provided text?"
        return Example(chunks, self.encode(question), self._answer(answer))

    def _absent_keys(self, keys: list[str], key_kind: str) -> list[str]:
        """keys with keys[0] (the asked one) unlike every other, and, for word keys, a share of the
        time one other key made to share a word with it (a near miss)."""
        r = self.rng
        for _ in range(100):
            if keys[0] not in keys[1:]:
                break
            keys[0] = self._value(key_kind)
        else:
            raise RuntimeError("too few distinct needle keys in the corpus to ask for an absent one")
        if key_kind == "words" and r.random() < NIAH_ABSENT_SHARED_WORD_SHARE:
            adjective, noun = keys[0].split("-", 1)
            other = self._value("words").split("-", 1)
            near = f"{adjective}-{other[1]}" if r.random() < 0.5 else f"{other[0]}-{noun}"
            if near != keys[0]:
                keys[r.randrange(1, len(keys))] = near
        return keys

    def kv_retrieval(self, k: int) -> Example:
        r = self.rng
        pairs_per_chunk = max(1, (self.c - 1) // 46)
        chunks, target = [], None
        hit = r.randrange(k)
        for j in range(k):
            lines = []
            for _ in range(pairs_per_chunk):
                key, value = self._value("uuids"), self._value("uuids")
                lines.append((key, value))
            if j == hit:
                target = r.choice(lines)
            ids = self.encode(" " + " ".join(f'"{a}": "{b}",' for a, b in lines))[: self.c - 1]
            chunks.append(ids)
        question = f'What is the value associated with the key "{target[0]}"?'
        return Example(chunks, self.encode(question), self._answer(target[1]))

    def _paragraph(self, i: int, number: int) -> list[int]:
        header = self.encode(f"Document {number}:\n")
        return (header + self.par_tok[self.par_off[i]:self.par_off[i + 1]].tolist())[: self.c - 1]

    def hotpot(self, k: int) -> Example:
        r = self.rng
        for _ in range(20):
            qa = r.choice(self.qa)
            answer = self.encode(qa["answer"])
            if qa["gold"] and len(answer) < self.answer_len - 1:
                break
        gold = list(dict.fromkeys(qa["gold"]))[:k]
        others = [p for p in qa["paragraphs"] if p not in gold]
        r.shuffle(others)

        def filled(ids: list[int]) -> list[int]:  # up to k paragraphs: random ones after the question's
            while len(ids) < k:
                ids.append(r.randrange(len(self.par_off) - 1))
            return ids

        # A near miss (the rate the context tasks have): the question over its distractors alone,
        # paragraphs retrieved for it that do not hold the answer.
        picked = None
        if self.near_miss_share and r.random() < LOOKUP_NOT_FOUND_SHARE * self.near_miss_share:
            picked = filled(others[:k])
            if any(qa["answer"] in self.decode(self.par_tok[self.par_off[p]:self.par_off[p + 1]].tolist())
                   for p in picked):
                picked = None  # the answer stands in a distractor too: asked over its gold paragraphs
        answer = qa["answer"] if picked is None else relations.NOT_FOUND
        picked = picked or filled(gold + others[: max(0, k - len(gold))])
        r.shuffle(picked)
        chunks = [self._paragraph(p, n + 1) for n, p in enumerate(picked)]
        return Example(chunks, self.encode(qa["question"]), self._answer(answer))

    def which_document(self, k: int) -> Example:
        r = self.rng
        picked = [r.randrange(len(self.par_off) - 1) for _ in range(k)]
        target = r.randrange(k)
        tokens = self.par_tok[self.par_off[picked[target]]:self.par_off[picked[target] + 1]].tolist()
        start = r.randrange(max(1, min(len(tokens), self.c - 20) - 6))
        phrase = self.decode(tokens[start:start + r.randint(3, 6)])
        chunks = [self._paragraph(p, n + 1) for n, p in enumerate(picked)]
        question = f'Which document mentions "{phrase.strip()}"?'
        return Example(chunks, self.encode(question), self._answer(f"Document {target + 1}"))

    def lookup(self, k: int) -> Example:
        """A fact of a training family in real text, asked in a training wording and framing; a fact
        of the same family about another subject is always there too, and sometimes (a share of
        LOOKUP_NOT_FOUND_SHARE) the asked one is not: the answer is then "not found"."""
        r, sp = self.rng, self.split
        family = r.choice(sp.train_families)
        return self._lookup_example(k, family, sp.train_wordings(family), most_others=k)

    def lookup_generated(self, k: int) -> Example:
        """The lookup task over generated families (`relations.generated_family`): thousands of
        relations rather than the table's. Beside the asked fact stand one of the same relation about
        another subject and one of another relation about the same subject, so that both the subject
        and the relation have to be read."""
        r = self.rng
        family = relations.generated_family(r.choice(self.generated_relations), r)
        same_subject = relations.generated_family(r.choice(self.generated_relations), r)
        return self._lookup_example(k, family, (family.question, *family.paraphrases), most_others=k - 1,
                                    same_subject_family=same_subject, not_found_share=LOOKUP_GENERATED_NOT_FOUND_SHARE)

    def lookup_dressed(self, k: int) -> Example:
        """The lookup task with each fact worded as documents word facts around them: a time or a
        source before it, a clause after its value (`relations.TRAIN_DRESSINGS`; the held-out ones
        are never used), LOOKUP_DRESSED_SHARE of the facts."""
        r, sp = self.rng, self.split
        family = r.choice(sp.train_families)
        return self._lookup_example(k, family, sp.train_wordings(family), most_others=k,
                                    dressed_share=LOOKUP_DRESSED_SHARE)

    def lookup_near(self, k: int) -> Example:
        """The lookup task made harder where the held-out sets find the model weak: a list family
        LOOKUP_NEAR_LIST_SHARE of the time, and beside the asked fact one or two facts of its family
        about near subjects ("the north depot" for "the north warehouse", "Ines Okafor" for "Ines
        Varga"), so the answer is the one whose whole subject matches the question's. Unanswerable
        (the lookup task's share): only the near subjects' facts are there."""
        r, sp = self.rng, self.split
        family = r.choice(self.train_list_families if r.random() < LOOKUP_NEAR_LIST_SHARE else sp.train_families)
        return self._lookup_example(k, family, sp.train_wordings(family), most_others=k - 1,
                                    near_subjects=r.randint(*LOOKUP_NEAR_SUBJECTS))

    def _lookup_example(self, k: int, family: relations.Family, wordings: tuple[str, ...], most_others: int,
                        same_subject_family: relations.Family | None = None,
                        not_found_share: float = LOOKUP_NOT_FOUND_SHARE, near_subjects: int = 0,
                        dressed_share: float = 0.0) -> Example:
        """`family`'s fact (or, a `not_found_share` of the time, "not found"), its other subject,
        `near_subjects` facts of it about subjects sharing a word with the asked one, and up to
        `most_others` facts of training families, in k chunks of real text. The draws keep the
        order the bundled model's lookup training made them in, so a seed keeps its stream."""
        r, sp = self.rng, self.split
        asked = relations.draw_fact(family, r)
        other = relations.draw_fact(family, r)
        while other.subject == asked.subject:
            other = relations.draw_fact(family, r)
        answerable = r.random() >= not_found_share
        facts = ([asked] if answerable else []) + [other]
        taken = {asked.subject, other.subject}
        for _ in range(near_subjects):
            near = relations.near_subject(asked.subject, family.subject_kind, r, avoid=taken)
            taken.add(near)
            facts.append(relations.Fact(family, near, relations.value(family.value_kind, r)))
        if same_subject_family is not None:
            facts.append(relations.Fact(same_subject_family, asked.subject,
                                        relations.value(same_subject_family.value_kind, r)))
        facts += [relations.draw_fact(r.choice(sp.train_families), r) for _ in range(r.randint(0, most_others))]
        if dressed_share:  # (draws only here, so the other lookup tasks keep their streams)
            facts = [relations.dress_some(f, relations.TRAIN_DRESSINGS, r) if r.random() < dressed_share else f
                     for f in facts]
            asked = facts[0] if answerable else asked
        per_chunk: list[list[list[int]]] = [[] for _ in range(k)]

        def used(j: int) -> int:
            return sum(len(needle) for needle in per_chunk[j])

        for i, fact in enumerate(facts):  # at most two facts in a chunk where they can
            needle = self.encode(" " + fact.sentence)
            slot = r.randrange(k) if i < k else i % k
            if len(per_chunk[slot]) >= 2:
                slot = per_chunk.index(min(per_chunk, key=len))
            if used(slot) + len(needle) >= self.c - 1:  # more facts than fit (long lists, one chunk)
                slot = min(range(k), key=used)
                if used(slot) + len(needle) >= self.c - 1:
                    # The asked fact comes first, into an empty chunk: only a distractor is left out.
                    assert fact is not asked, "the asked fact does not fit in a chunk"
                    continue
            per_chunk[slot].append(needle)
        chunks = [self._chunk_with(needles, "text") for needles in per_chunk]
        question = relations.frame(asked.question(r.choice(wordings)), r.choice(sp.train_framings))
        return Example(chunks, self.encode(question), self._answer(asked.value if answerable else relations.NOT_FOUND))

    def sentence_qa(self, k: int) -> Example:
        """A question made from a real sentence by rule (training.sentence_questions), in a training
        wording, over that sentence's own context among real paragraphs."""
        return self._asked_over_context(self.rng.choice(self.sentence_questions), k)

    def parsed_qa(self, k: int) -> Example:
        """A question put in people's order from a parse of a real sentence (training.parsed_questions:
        "What does the library use for checksums?"), in one of its wordings, over that sentence's
        own context among real paragraphs; its source (the corpus, HotpotQA) drawn first."""
        by_source = self.parsed_questions
        return self._asked_over_context(self.rng.choice(by_source[self.rng.choice(sorted(by_source))]), k)

    def written_qa(self, k: int) -> Example:
        """A question written as a person asks it about a manual's passage (training.written_questions),
        in one of its wordings, over that passage among real paragraphs; its collection drawn first.
        Of the examples of an item with unanswered questions, `written_unanswered_share` ask one of
        those over the whole passage ("not found"). Of the rest, `written_not_found_share` say "not
        found": the passage left out, or in a near miss its other sentences, or another passage of
        the same document, that do not hold the answer. (An item with unanswered questions says "not
        found" at u + (1 - u) x that share.)"""
        r = self.rng
        by_group = self.written_questions
        item = r.choice(by_group[r.choice(sorted(by_group))])
        if self.written_unanswered_share and item.get("unanswered") and r.random() < self.written_unanswered_share:
            chunks = [self._chunk_with([], "text") for _ in range(k)]
            # Beside it in its page, no passage naming what any of its unanswered questions asks about.
            chunks[r.randrange(k)] = self._written_as_chunk(item, self.encode(" " + item["context"])[: self.c - 1],
                                                            subject_words(item["unanswered"]))
            return Example(chunks, self.encode(r.choice(item["unanswered"])), self._answer(relations.NOT_FOUND))
        mates = [m["context"] for m in self.written_by_document[item["document"]]
                 if m is not item and item["answer"] not in m["context"]]
        # Written as people ask already: not reworded by rule.
        return self._asked_over_context(item, k, self.written_not_found_share, mates, reword=False,
                                        as_chunk=lambda passage: self._written_as_chunk(item, passage))

    def _written_as_chunk(self, item: dict, passage: list[int], avoid: frozenset[str] = frozenset()) -> list[int]:
        """`passage` (tokens of written `item`'s context) as a chunk: `written_page_share` of the time
        among the other passages of its document that name none of `avoid` (`_in_page`), else as
        `_as_chunk` places it."""
        if self.written_page_share and self.rng.random() < self.written_page_share:
            return self._in_page(item, passage, avoid)
        return self._as_chunk(passage)

    def _in_page(self, item: dict, passage: list[int], avoid: frozenset[str]) -> list[int]:
        """`passage` whole, between the passages of `item`'s document the file has before it and
        after it (those naming any of `avoid` left out), cut to C-1 tokens at a random point around
        it; as it is where no other passage qualifies."""
        page = self.written_by_document[item["document"]]
        at = next(i for i, m in enumerate(page) if m is item)
        before = " ".join(m["context"] for m in page[:at] if names_none_of(m["context"], avoid))
        after = " ".join(m["context"] for m in page[at + 1:] if names_none_of(m["context"], avoid))
        head = self.encode(" " + before) if before else []
        tail = self.encode(" " + after) if after else []
        room = self.c - 1 - len(passage)
        if room <= 0 or not (head or tail):
            return passage
        # Tokens taken from before the passage: as many as leave the rest of the room to `tail`.
        least, most = max(0, room - len(tail)), min(room, len(head))
        taken = self.rng.randint(least, most) if least <= most else len(head)
        return head[len(head) - taken:] + passage + tail[:room - taken]

    def _asked_over_context(self, item: dict, k: int, not_found_share: float = LOOKUP_NOT_FOUND_SHARE,
                            near_passages: Sequence[str] = (), reword: bool = True,
                            as_chunk: Callable[[list[int]], list[int]] | None = None) -> Example:
        """`item`'s question (one of its wordings; reworded `reword_share` of the time if `reword`)
        over its context in one of k chunks of real text; sometimes (`not_found_share`) the answer
        is "not found": the context left out, or (a near miss, `near_miss_share` of them) shown
        without the sentences that hold the answer, or, NEAR_PASSAGE_SHARE of the time where any are
        given, as one of `near_passages` (on the question's topic, without its answer). The answering
        context is made a chunk by `as_chunk` (default `_as_chunk`), every other passage by `_as_chunk`."""
        r = self.rng
        chunks = [self._chunk_with([], "text") for _ in range(k)]
        context = self.encode(" " + item["context"])[: self.c - 1]
        # A context cut at the chunk's end may lose its answer: then it is not shown at all.
        answerable = r.random() >= not_found_share and item["answer"] in self.decode(context)
        if answerable:
            if self.answerable_decoy_share and r.random() < self.answerable_decoy_share:
                context = self._with_decoy(item, context, r)
            chunks[r.randrange(k)] = (as_chunk or self._as_chunk)(context)
        elif self.near_miss_share and r.random() < self.near_miss_share:
            if near_passages and r.random() < NEAR_PASSAGE_SHARE:
                chunks[r.randrange(k)] = self._as_chunk(self.encode(" " + r.choice(near_passages))[: self.c - 1])
                return self._asked(item, chunks, relations.NOT_FOUND, reword)
            rest = [s for s in split_sentences(item["context"]) if item["answer"] not in s]
            # A passage whose every sentence holds the answer leaves nothing on topic to hide a decoy in.
            if rest and self.decoy_share and r.random() < self.decoy_share:
                decoy = self._decoy(item, r)
                if decoy is not None:
                    rest.insert(r.randrange(len(rest) + 1), decoy)
            if rest:
                chunks[r.randrange(k)] = self._as_chunk(self.encode(" " + " ".join(rest))[: self.c - 1])
        return self._asked(item, chunks, item["answer"] if answerable else relations.NOT_FOUND, reword)

    def _as_chunk(self, passage: list[int]) -> list[int]:
        """`passage` (tokens, at most a chunk's C-1) as a chunk: `filled_context_share` of the time
        among real paragraphs that fill it to C-1 tokens (the passage whole, at a boundary between
        them), else alone. A passage within MIN_FILL tokens of a full chunk stays as it is."""
        if self.filled_context_share and len(passage) <= self.c - 1 - MIN_FILL \
                and self.rng.random() < self.filled_context_share:
            return self._chunk_with([passage], "text")
        return passage

    def _asked(self, item: dict, chunks: list[list[int]], answer: str, reword: bool) -> Example:
        """`item`'s question, one of its wordings (reworded, `reword_share` of the time if `reword`),
        over `chunks`."""
        r = self.rng
        question = r.choice(item["questions"])
        if reword and self.reword_share and r.random() < self.reword_share:
            question = self.rewording(question, item["answer"], item["context"], r)
        return Example(chunks, self.encode(question), self._answer(answer))

    def _with_decoy(self, item: dict, context: list[int], r: random.Random) -> list[int]:
        """`item`'s context (tokens, cut to a chunk) with a decoy sentence put between two of its
        sentences, if one is found and the answer still fits in the chunk; else `context` as it was."""
        decoy = self._decoy(item, r)
        if decoy is None:
            return context
        sentences = split_sentences(item["context"])
        sentences.insert(r.randrange(len(sentences) + 1), decoy)
        shown = self.encode(" " + " ".join(sentences))[: self.c - 1]
        return shown if item["answer"] in self.decode(shown) else context

    def _decoy(self, item: dict, r: random.Random) -> str | None:
        """A sentence of a random corpus paragraph holding a value of the kind `item`'s answer is,
        about none of the subjects its questions name (training.decoy_values), or None."""
        answer = item["answer"].strip()
        kind = value_kind(answer)
        if kind is None:
            return None
        avoid = subject_words(item["questions"])
        for _ in range(DECOY_TRIES):
            j = r.randrange(len(self.text_off) - 1)
            paragraph = self.decode(self.text_tok[self.text_off[j]:self.text_off[j + 1]].tolist())
            found = decoy_sentence(paragraph, kind, avoid, answer, r)
            if found is not None:
                return found
        return None

    def cloze_qa(self, k: int) -> Example:
        """A cloze question (training.cloze_questions: a span of a real sentence blanked and asked,
        in noised words) over the sentence's own context, in one of k chunks of real text. Always
        answerable: a question whose words are missing from the text is what a refusal would be
        taught on, and that teaches refusing whatever is worded otherwise (see lookup_generated)."""
        r = self.rng
        for _ in range(CLOZE_TRIES):
            j = r.randrange(len(self.text_off) - 1)
            made = cloze_example(self.decode(self.text_tok[self.text_off[j]:self.text_off[j + 1]].tolist()), r)
            if made is None:
                continue
            context = self.encode(" " + made.context)[: self.c - 1]
            if made.answer not in self.decode(context):  # cut at the chunk's end
                continue
            chunks = [self._chunk_with([], "text") for _ in range(k)]
            chunks[r.randrange(k)] = context
            return Example(chunks, self.encode(made.question), self._answer(made.answer))
        raise ValueError(f"none of {CLOZE_TRIES} paragraphs of the corpus has a sentence to ask a cloze question of")

    def text_denoising(self, k: int) -> Example:
        """Masked-diffusion language modelling on real text: a chunk of consecutive paragraphs and
        the text that follows it as the target, in the scorer's view (one chunk, the target where the
        question stands). It keeps the model learning the language the documents are written in,
        and that is what the predictive scorer measures: how well a chunk explains what follows."""
        sents = self._filler(self.c - 1 + TEXT_DENOISING_TARGET, "text")
        flat = [t for s in sents for t in s]
        chunk = flat[: self.c - 1]
        target = flat[self.c - 1: self.c - 1 + TEXT_DENOISING_TARGET]
        return Example([chunk], target, [], scoring=True)

    def text_mdm(self, k: int) -> Example:
        """Masked-diffusion language modelling, as LLaDA pretrains: TEXT_MDM_LENGTH tokens of
        consecutive text (paragraphs of one source in the corpus's order) attending to one another,
        every token a target (`collate` masks a random share t of them). It teaches the language the
        documents are written in, which the task examples, with their loss on a few answer tokens,
        teach slowly. `k` is not used: the sequence has no chunks."""
        r = self.rng
        source = r.choices(list(TEXT_MDM_SOURCES), list(TEXT_MDM_SOURCES.values()))[0]
        if source == "paragraphs":
            out, i = [], r.randrange(len(self.par_off) - 1)
            while len(out) < TEXT_MDM_LENGTH:
                j = i % (len(self.par_off) - 1)
                out += self.par_tok[self.par_off[j]:self.par_off[j + 1]].tolist() + self._paragraph_break
                i += 1
        else:
            out = [t for s in self._filler(TEXT_MDM_LENGTH, source) for t in s]
        return Example([], [], out[:TEXT_MDM_LENGTH], plain=True)

    def sample(self, k: int, scoring_share: float = 0.2) -> Example:
        r = self.rng
        name = r.choices(list(self.task_weights), list(self.task_weights.values()))[0]
        ex = getattr(self, name)(k)
        if ex.plain:
            return ex
        if r.random() < scoring_share:
            # The scorer's view: one of the example's chunks (relevant or not) and the question as
            # the target, so that the question's likelihood learns to depend on the chunk.
            ex = Example([ex.chunks[r.randrange(len(ex.chunks))]], ex.question_ids, [], scoring=True)
        return ex


def collate(examples: list[Example], layout: Layout, chunk_size: int, question_loss_share: float,
            rng: random.Random) -> dict[str, torch.Tensor]:
    """Pads a batch into tensors: ids, positions, segment ids, roles and the denoising targets."""
    rows = []
    for ex in examples:
        if ex.plain:
            n = 1 + len(ex.answer_ids)
            rows.append(([layout.bos] + ex.answer_ids, list(range(n)), [-3] * n, [ROLE_ANSWER] * n,
                         [False] + [True] * (n - 1)))
            continue
        ids, pos, seg, role = [], [], [], []
        if not ex.scoring:
            p = len(layout.prefix)
            ids += layout.prefix
            pos += list(range(p))
            seg += [0] * p
            role += [ROLE_PREFIX] * p
            base = p
        else:
            base = 0
        for j, chunk in enumerate(ex.chunks):
            c_ids = [layout.bos] + chunk
            ids += c_ids
            start = base + j * chunk_size if not ex.scoring else 0
            pos += list(range(start, start + len(c_ids)))
            seg += [j + 1] * len(c_ids)
            role += [ROLE_CHUNK] * len(c_ids)
        q = layout.query_head + ex.question_ids + layout.query_tail
        q_start = base + len(ex.chunks) * chunk_size if not ex.scoring else len(ex.chunks[0]) + 1
        q_lo = len(ids) + len(layout.query_head)
        q_hi = q_lo + len(ex.question_ids)
        ids += q
        pos += list(range(q_start, q_start + len(q)))
        seg += [-2] * len(q)
        role += [ROLE_QUERY] * len(q)
        a_lo = len(ids)
        ids += ex.answer_ids
        a_start = q_start + len(q)
        pos += list(range(a_start, a_start + len(ex.answer_ids)))
        seg += [-3] * len(ex.answer_ids)
        role += [ROLE_ANSWER] * len(ex.answer_ids)
        target = [False] * len(ids)
        for i in range(a_lo, len(ids)):
            target[i] = True
        if ex.scoring or rng.random() < question_loss_share:
            for i in range(q_lo, q_hi):
                target[i] = True
        rows.append((ids, pos, seg, role, target))
    t = max(len(r[0]) for r in rows)
    b = len(rows)
    out = {"ids": torch.full((b, t), layout.pad), "positions": torch.zeros(b, t, dtype=torch.long),
           "segments": torch.full((b, t), -1), "roles": torch.full((b, t), ROLE_PAD),
           "targets": torch.zeros(b, t, dtype=torch.bool)}
    for i, (ids, pos, seg, role, target) in enumerate(rows):
        n = len(ids)
        out["ids"][i, :n] = torch.tensor(ids)
        out["positions"][i, :n] = torch.tensor(pos)
        out["segments"][i, :n] = torch.tensor(seg)
        out["roles"][i, :n] = torch.tensor(role)
        out["targets"][i, :n] = torch.tensor(target)
    return out


def attention_mask(roles: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
    """bool [B, 1, T, T] reproducing inference: prefix and each chunk see only themselves, the
    query sees prefix, chunks and query, the answer sees everything; padding is never a key."""
    r_row, r_key = roles[:, :, None], roles[:, None, :]
    same_seg = segments[:, :, None] == segments[:, None, :]
    allowed = ((r_row == ROLE_PREFIX) & (r_key == ROLE_PREFIX)) \
        | ((r_row == ROLE_CHUNK) & same_seg) \
        | ((r_row == ROLE_QUERY) & (r_key >= ROLE_PREFIX) & (r_key <= ROLE_QUERY)) \
        | ((r_row == ROLE_ANSWER) & (r_key >= ROLE_PREFIX))
    pad_rows = (roles == ROLE_PAD)[:, :, None]
    first_key = torch.zeros_like(allowed)
    first_key[..., 0] = True
    allowed = torch.where(pad_rows, first_key, allowed)  # padding rows: any visible key, never read
    return allowed[:, None]
