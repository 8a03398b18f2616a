"""`docqa-tools eval-pdfs`: questions typed in people's own words about real PDFs, asked through the app.

Each question (tools/data/pdf_questions.jsonl) was written by reading one page of a real manual
that a Debian documentation package installs, rephrased the way a user who has not read that page
would ask, with its answer a short span of that page; a few per document ask what the document
does not say ("no_answer"). The PDFs go through the app's own path: `DocQA.ingest` (extraction,
sentence-aligned chunks, prefill, KV files, the BM25 index) and `DocQA.answer` (the prefilter, the
scorer, static decoding, the abstention rule), with the model's defaults, so a row is what a user
with that PDF would have been shown.

The sources are split by *document source*: a held-out source's text is not in the training
corpus (`training.corpus`: Debian's man, info, README and HTML documentation), a seen one's is (the
same manual as info pages). `corpus_overlap` measures it: the share of the PDF's 8-word runs found
in the corpus. Questions are never trained on, whatever the source.

Scores: an answerable question is right when the shown answer holds one of its accepted answers as
whole words (case, quotes and spacing ignored); "not found" when the app shows none; a no-answer
question is right when it shows none. Also whether the answer's page was among the passages cited
(retrieval) and among the chunks the scorer saw (the BM25 prefilter).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

QUESTIONS_FILE = Path(__file__).parent / "data" / "pdf_questions.jsonl"
ANSWER_KINDS = ("number", "name", "identifier", "value", "phrase")
NO_ANSWER = "no_answer"
SHINGLE_WORDS = 8  # a run of this many words found in the corpus counts as seen text
HELD_OUT_MAX_OVERLAP = 0.1  # a held-out source with more of its runs in the corpus is warned about
BM25_RANKS = 4  # BM25's best chunks a row looks through for the answer (as many as the app cites at most)


@dataclass(frozen=True)
class PdfSource:
    name: str
    package: str  # the Debian package that installs it (scripts/install_eval_pdfs.sh)
    path: Path  # where the package puts it; a .gz is read decompressed
    held_out: bool  # its text is not in the training corpus (see corpus_overlap)
    title: str
    sha256: str = ""  # of the PDF the questions were written from (another version moves pages)


# `held_out` says whether a source's text stays out of the training corpus: the held-out sources'
# packages are HELD_OUT_PACKAGES, which training.corpus never reads (0-4% of their 8-word runs are
# still found there: common phrases); the seen sources' manuals are in it as info or HTML pages
# (69-90%). `--corpus` measures it again against any corpus; the measured shares are in each
# results folder's meta.json (docs/results/docqa-tiny-eval/pdfs-*/).
SOURCES: dict[str, PdfSource] = {s.name: s for s in (
    PdfSource("valgrind", "valgrind", Path("/usr/share/doc/valgrind/valgrind_manual.pdf.gz"), True,
              "Valgrind documentation (397 pages; valgrind 1:3.19.0-1)",
              "63d1bf4d27c78a5dd6a142d5e7311138b15e8cffc3e9f8839a27eede28b1984e"),
    PdfSource("crc-doc", "zlib1g-dev", Path("/usr/share/doc/zlib1g-dev/crc-doc.1.0.pdf.gz"), True,
              "A CRC computation note from zlib (29 pages; zlib1g-dev 1:1.2.13.dfsg-1)",
              "064f9252d6e2e15ea56c2bd18e160e5c9c84bcd137c11a7af497aaa511ace998"),
    PdfSource("mime-spec", "shared-mime-info", Path("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf"),
              True, "Shared MIME-info Database specification (17 pages; shared-mime-info 2.2-1)",
              "4d9666c46b4d367a12e2922f4f3b114396c377106c57bbc934d03320e6888002"),
    PdfSource("debian-faq", "debian-faq", Path("/usr/share/doc/debian/FAQ/debian-faq.en.pdf.gz"), False,
              "The Debian GNU/Linux FAQ (73 pages; debian-faq 11.1)",
              "ea67ca925863324d97a30b5c926aed95efc687c689aa16788c9bed54525c0b47"),
    PdfSource("nettle", "nettle-dev", Path("/usr/share/doc/nettle-dev/nettle.pdf.gz"), False,
              "Nettle cryptographic library manual (111 pages; nettle-dev 3.8.1-2)",
              "fa0c6394acde69113eb33202a4c9ba33a4858429f2d735bc2707d41112da98f5"),
    PdfSource("bashref", "bash-doc", Path("/usr/share/doc/bash/bashref.pdf"), False,
              "Bash Reference Manual (196 pages; bash-doc 5.2.15-2)",
              "104971d389c0b9b7a261b0b3070a53b0d8cce6db1ffddefcc8423ddda92acd87"),
    PdfSource("bzip2", "bzip2-doc", Path("/usr/share/doc/bzip2/manual.pdf.gz"), False,
              "bzip2 manual (38 pages; bzip2-doc 1.0.8)",
              "1dd1f12b3dcb0894481708881ed8d052c769f3820c06839c702c8cfad973d7d3"),
    PdfSource("libtasn1", "libtasn1-doc", Path("/usr/share/doc/libtasn1-doc/libtasn1.pdf"), False,
              "libtasn1 manual (36 pages; libtasn1-doc 4.19.0-2+deb12u1)",
              "3917eb460d87e275f9792b3597029873fd77890ed3ccebe40bbc5a3a7ee516d3"),
)}


@dataclass(frozen=True)
class PdfQuestion:
    source: str
    question: str
    answers: list[str]  # accepted spans of the page; empty for a no-answer question
    page: int | None  # 1-based physical page holding the answer
    kind: str  # ANSWER_KINDS or NO_ANSWER
    evidence: str  # the page's text holding the answer (for a no-answer question: what was searched)

    @property
    def answerable(self) -> bool:
        return self.kind != NO_ANSWER


def load_questions(path: Path = QUESTIONS_FILE, sources: dict[str, PdfSource] = SOURCES) -> list[PdfQuestion]:
    """The question file, checked: known sources and kinds, answers where (and only where) answerable."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            q = PdfQuestion(**json.loads(line))
        except (TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}:{n}: not a question record ({e})") from None
        if q.source not in sources:
            raise ValueError(f"{path}:{n}: unknown source {q.source!r}")
        if q.kind not in (*ANSWER_KINDS, NO_ANSWER):
            raise ValueError(f"{path}:{n}: unknown kind {q.kind!r}")
        if q.answerable != bool(q.answers) or q.answerable != (q.page is not None):
            raise ValueError(f"{path}:{n}: an answerable question needs answers and a page, a no-answer one neither")
        if any(not a.strip() for a in q.answers):
            raise ValueError(f"{path}:{n}: an empty accepted answer")
        out.append(q)
    return out


def _normalised(text: str) -> str:
    text = re.sub("[\u2018\u2019]", "'", re.sub("[\u201c\u201d]", '"', text))
    text = re.sub("[\u2010-\u2015\u2212]", "-", text)  # hyphens, dashes and the minus sign
    return " ".join(text.lower().split())


def holds_answer(text: str, answers: Iterable[str]) -> bool:
    """Pure: whether `text` holds one of `answers` as whole words: not inside a longer word,
    identifier or number ("16" is not in "160", "1.16" or "16,000"; "REAL" not in "ASN1_REAL");
    case, curly quotes, dashes and spacing ignored."""
    norm = _normalised(text)
    return any(a.strip() and re.search(r"(?<![\w.,])" + re.escape(_normalised(a)) + r"(?![\w]|[.,]\w)", norm)
               for a in answers)


def read_pdf(source: PdfSource) -> bytes:
    """The installed PDF's bytes; a missing package is a clear error naming it."""
    if not source.path.exists():
        raise FileNotFoundError(f"{source.path} is missing: install the Debian package {source.package} "
                                "(scripts/install_eval_pdfs.sh installs every source)")
    data = source.path.read_bytes()
    return gzip.decompress(data) if source.path.suffix == ".gz" else data


def pdf_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def corpus_overlap(text: str, corpus_words: set[str]) -> float:
    """Pure: the share of `text`'s consecutive SHINGLE_WORDS-word runs (stepping a run at a time)
    that occur in the corpus (`corpus_shingles`)."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    runs = [" ".join(words[i:i + SHINGLE_WORDS]) for i in range(0, len(words) - SHINGLE_WORDS + 1, SHINGLE_WORDS)]
    return sum(r in corpus_words for r in runs) / max(1, len(runs))


def corpus_shingles(corpus_dir: Path) -> set[str]:
    """Every SHINGLE_WORDS-word run of a corpus folder that training.prepare wrote (its .txt.xz shards)."""
    import lzma

    shards = sorted(corpus_dir.glob("*.txt.xz"))
    if not shards:
        raise FileNotFoundError(f"no corpus shards (*.txt.xz) in {corpus_dir}")
    out: set[str] = set()
    for shard in shards:
        with lzma.open(shard, "rt") as f:
            words = re.findall(r"[a-z0-9]+", f.read().lower())
        out.update(" ".join(words[i:i + SHINGLE_WORDS]) for i in range(len(words) - SHINGLE_WORDS + 1))
    return out


@dataclass(frozen=True)
class PdfAnswerRow:
    source: str
    held_out: bool
    kind: str
    question: str
    answers: list[str]
    page: int | None
    shown: str  # the answer as the app shows it ("" when it shows none)
    warning: str | None
    right: bool  # answerable: holds an accepted answer, not flagged as possibly made up; no-answer: shows none
    not_found: bool  # the app showed no answer
    page_cited: bool | None  # a cited passage on the answer's page holds an answer (None: no-answer question)
    page_candidate: bool | None  # a chunk the scorer saw lies on the answer's page
    seconds: float
    error: str | None = None
    cited_pages: list[str] = field(default_factory=list)  # the cited passages' page labels, as shown
    page_cited_first: bool | None = None  # the passage cited first is such a passage
    ungrounded: bool = False  # shown with the app's "may not come from the documents" warning
    # The model reading only the passage holding the answer (`read_passage_alone`): reading without
    # selection. None: a no-answer question, or no single chunk holds an accepted answer.
    passage_alone: str | None = None
    passage_alone_right: bool | None = None
    # Retrieval by BM25 alone, the baseline the app's selection should beat: the rank (0 = best) of
    # the first chunk `_holds` the answer among BM25's BM25_RANKS best of the document; None: not there.
    bm25_rank: int | None = None


def _page_within(page_index: int, spans: Iterable[tuple[int, int]]) -> bool:
    return any(start <= page_index <= end for start, end in spans)


def _holds(q: PdfQuestion, passage) -> bool:
    """Whether `passage` (anything with page_start, page_end and text: a citation, a chunk) lies on
    the answer's page and holds an accepted answer: the passage a reader needs, not a neighbour."""
    return passage.page_start <= q.page - 1 <= passage.page_end and holds_answer(passage.text, q.answers)


def passage_holding(q: PdfQuestion, chunks) -> str | None:
    """The text of the first of `chunks` (storage.store.ChunkRecord) that `_holds` the answer; None
    when no single chunk does (an answer cut between two)."""
    return next((c.text for c in chunks if _holds(q, c)), None)


def read_passage_alone(service, question: str, passage: str, params=None) -> str:
    """The model's answer over `passage` alone (the app's prefill of it as a document of its own,
    every chunk of it chosen), with `params` (default: the service's): what the model reads when
    selection is perfect, so a wrong answer here is the reader's, not the retrieval's. A copying
    model's garbled copy is mended as the app shows it (`app.service.answer_warning`)."""
    from dataclasses import replace

    from app.kv_service import prefill_text
    from app.service import Citation, answer_warning

    with service.scheduler.turn():  # the model between two of the scheduler's steps
        doc, _ = prefill_text(service.engine, passage, service.defaults.chunk_size)
        params = replace(params or service.params(), top_k=doc.num_chunks, auto_k=False)
        text = service.engine.answer(doc, question, params).text
    shown, _ = answer_warning(text, [Citation("passage", "passage", 0, "", 0.0, passage, char_start=0,
                                              char_end=len(passage))], 0.0, None,
                              service.defaults.extractive_answers, service.defaults.abstain_answer)
    return shown or text  # the model's "not found" as it said it


def ask_all(service, questions: list[PdfQuestion], pdfs: dict[str, bytes], sources: dict[str, PdfSource] = SOURCES,
            progress: Callable[[str], None] = print, overrides: dict | None = None) -> list[PdfAnswerRow]:
    """Ingests every source's PDF (`pdfs`, by source) into `service` (an app.service.DocQA), then asks the questions,
    with the model's defaults changed by `overrides` (app.defaults.ModelDefaults fields), if any.
    Every question is asked of the same library: BM25's statistics are the library's, so a
    question's candidates would depend on which documents had been added before it."""
    from app.service import UNGROUNDED_WARNING

    params = service.params(**overrides) if overrides else None
    ids, chunks = {}, {}  # chunks: per source, (cache id, ordinal) -> ChunkRecord
    for name in dict.fromkeys(q.source for q in questions):
        start = time.perf_counter()
        info, _ = service.ingest(pdfs[name], f"{name}.pdf")
        ids[name] = info.record.id
        chunks[name] = {(cache.id, c.ordinal): c for cache in service.store.caches_of(info.record.id)
                        if cache.status == "ready" for c in service.store.chunks(cache.id)}
        progress(f"{name}: {info.record.page_count} pages, {info.tokens} tokens, {info.chunks} chunks "
                 f"({time.perf_counter() - start:.1f} s)")
    rows = []
    for q in questions:
        held_out = sources[q.source].held_out
        t = time.perf_counter()
        try:
            res = service.answer(q.question, [ids[q.source]], params=params)
        except (ValueError, RuntimeError) as e:  # one question's failure is its row, not the run's end
            rows.append(PdfAnswerRow(q.source, held_out, q.kind, q.question, q.answers, q.page, "", None,
                                     False, False, None, None, time.perf_counter() - t, str(e)))
            continue
        seconds = time.perf_counter() - t
        not_found = not res.answer.strip()
        ungrounded = res.warning == UNGROUNDED_WARNING
        right = holds_answer(res.answer, q.answers) and not ungrounded if q.answerable else not_found
        holding = candidate = first = alone = alone_right = bm25 = None
        if q.answerable:
            holding = any(_holds(q, c) for c in res.citations)
            first = bool(res.citations) and _holds(q, res.citations[0])
            candidate = _page_within(q.page - 1, ((s["page_start"], s["page_end"]) for s in res.scores))
            hits = service.store.search_chunks(q.question, sorted({c for c, _ in chunks[q.source]}), BM25_RANKS)
            bm25 = next((r for r, h in enumerate(hits) if _holds(q, chunks[q.source][h.cache_id, h.ordinal])), None)
            passage = passage_holding(q, chunks[q.source].values())
            if passage is not None:
                alone = read_passage_alone(service, q.question, passage, params)
                alone_right = holds_answer(alone, q.answers)
        rows.append(PdfAnswerRow(q.source, held_out, q.kind, q.question, q.answers, q.page, res.answer,
                                 res.warning, right, not_found, holding, candidate, seconds,
                                 cited_pages=[c.pages for c in res.citations], page_cited_first=first,
                                 ungrounded=ungrounded, passage_alone=alone, passage_alone_right=alone_right,
                                 bm25_rank=bm25))
        progress(f"  {'right' if right else 'WRONG'} {q.source}: {q.question!r} -> {res.answer[:50]!r} "
                 f"(expected {q.answers[:2] if q.answerable else 'not found'}; its passage "
                 f"{'cited' if holding else 'not cited' if holding is not None else '-'}; {seconds:.1f} s"
                 + (f"; its passage alone -> {alone[:40]!r}" if alone is not None else "") + ")")
    return rows


def _percent(rows: list[PdfAnswerRow], what: Callable[[PdfAnswerRow], bool | None]) -> str:
    return f"{100 * sum(bool(what(r)) for r in rows) / len(rows):.0f}%" if rows else "-"


def _share(rows: list[PdfAnswerRow], what: Callable[[PdfAnswerRow], bool | None]) -> str:
    """"75% (3/4)"; "-" for no rows."""
    return f"{_percent(rows, what)} ({sum(bool(what(r)) for r in rows)}/{len(rows)})" if rows else "-"


def summarize(rows: list[PdfAnswerRow]) -> str:
    """Markdown: held-out sources first; answerable questions by source and by kind, then no-answer ones."""
    out = []
    for held_out, title in ((True, "Held-out sources (text not in the training corpus)"),
                            (False, "Seen sources (their text is in the training corpus; the questions are not)")):
        group = [r for r in rows if r.held_out == held_out]
        if not group:
            continue
        answerable = [r for r in group if r.kind != NO_ANSWER]
        out += [f"### {title}", "",
                "| source | questions | right | shown \"not found\" | a passage holding it cited (first) | "
                "its page among scored | right reading its passage alone | BM25 alone: in its top 4 (first) |",
                "|---|---|---|---|---|---|---|---|"]
        for name in [*dict.fromkeys(r.source for r in answerable), "all"]:
            part = answerable if name == "all" else [r for r in answerable if r.source == name]
            out.append(f"| {'**all**' if name == 'all' else name} | {len(part)} | {_share(part, lambda r: r.right)} | "
                       f"{_share(part, lambda r: r.not_found)} | {_share(part, lambda r: r.page_cited)} "
                       f"({_percent(part, lambda r: r.page_cited_first)}) | "
                       f"{_share(part, lambda r: r.page_candidate)} | "
                       f"{_share([r for r in part if r.passage_alone is not None], lambda r: r.passage_alone_right)} | "
                       f"{_share(part, lambda r: r.bm25_rank is not None)} "
                       f"({_percent(part, lambda r: r.bm25_rank == 0)}) |")
        out += ["", "| answer kind | questions | right |", "|---|---|---|"]
        for kind in ANSWER_KINDS:
            part = [r for r in answerable if r.kind == kind]
            if part:
                out.append(f"| {kind} | {len(part)} | {_share(part, lambda r: r.right)} |")
        flagged = [r for r in answerable if r.ungrounded]
        if flagged:
            out += ["", f"Answers shown with the \"may not come from the documents\" warning (never counted right): "
                        f"{len(flagged)}, of which holding an accepted answer: "
                        f"{sum(holds_answer(r.shown, r.answers) for r in flagged)}"]
        unanswerable = [r for r in group if r.kind == NO_ANSWER]
        if unanswerable:
            out += ["", f"No-answer questions shown \"not found\": {_share(unanswerable, lambda r: r.right)}"]
        errors = [r for r in group if r.error]
        if errors:
            out += ["", f"Questions that failed: {len(errors)} ({errors[0].error})"]
        out.append("")
    seconds = sorted(r.seconds for r in rows)
    if seconds:
        out.append(f"Seconds a question (the app's answer call): median {seconds[len(seconds) // 2]:.2f}, "
                   f"max {seconds[-1]:.2f}.")
    return "\n".join(out)


def known_sources(names: Iterable[str], sources: dict[str, PdfSource] = SOURCES) -> list[str]:
    """`names` as a list, each checked to be one of `sources` (a clear error naming the others)."""
    names = list(names)
    unknown = sorted(set(names) - set(sources))
    if unknown:
        raise ValueError(f"unknown source(s) {', '.join(unknown)}; choose from {', '.join(sources)}")
    return names


@contextmanager
def app_over(model_dir: Path, device: str | None, data_dir: Path | None = None, prefilter: int | None = None):
    """An app.service.DocQA over the library in `data_dir`, else over a temporary folder removed
    after; closed on leaving."""
    from app.service import DocQA, ServiceConfig

    library = data_dir or Path(tempfile.mkdtemp(prefix="docqa-eval-pdfs-"))
    try:
        service = DocQA(ServiceConfig(data_dir=library, model_dir=model_dir, device=device,
                                      prefilter_chunks=prefilter))
        try:
            yield service
        finally:
            service.close()
    finally:
        if data_dir is None:
            shutil.rmtree(library, ignore_errors=True)


def evaluate(model_dir: Path, out_dir: Path, questions_file: Path = QUESTIONS_FILE,
             only: list[str] | None = None, device: str | None = None, data_dir: Path | None = None,
             corpus_dir: Path | None = None, progress: Callable[[str], None] = print,
             sources: dict[str, PdfSource] = SOURCES, overrides: dict | None = None,
             prefilter: int | None = None) -> list[PdfAnswerRow]:
    """Runs the set (`only` these sources, if given) through a fresh app (its library in
    `data_dir`, else a temporary folder removed after; a library holding other documents changes
    BM25's statistics, so the numbers are comparable only over the same documents), with the
    model's defaults changed by `overrides` and the BM25 prefilter's M by `prefilter` (None: the
    model's), and writes results.jsonl, summary.md and meta.json under `out_dir`."""
    questions = load_questions(questions_file, sources)
    if only:
        known_sources(only, sources)
        questions = [q for q in questions if q.source in only]
    out_dir.mkdir(parents=True, exist_ok=True)
    meta: dict = {"model": str(model_dir), "questions": str(questions_file), "overrides": overrides or {},
                  "prefilter": prefilter, "library": str(data_dir) if data_dir else "fresh", "sources": {}}
    pdfs = {name: read_pdf(sources[name]) for name in dict.fromkeys(q.source for q in questions)}  # before the model
    for name, data in pdfs.items():
        digest = pdf_digest(data)
        meta["sources"][name] = {"sha256": digest, "held_out": sources[name].held_out}
        if sources[name].sha256 and digest != sources[name].sha256:
            progress(f"warning: {sources[name].path} is not the PDF the questions were written from (another "
                     f"version of {sources[name].package}?): its pages may have moved")
    if corpus_dir is not None:
        from app.ingest import extract_pdf

        seen = corpus_shingles(corpus_dir)
        for name, data in pdfs.items():
            overlap = corpus_overlap(extract_pdf(data).text, seen)
            meta["sources"][name]["corpus_overlap"] = round(overlap, 3)
            progress(f"{name}: {overlap:.0%} of its {SHINGLE_WORDS}-word runs are in the corpus "
                     f"({'held out' if sources[name].held_out else 'seen'})")
            if sources[name].held_out and overlap > HELD_OUT_MAX_OVERLAP:
                progress(f"warning: {name} is counted as held out, yet {overlap:.0%} of it is in this corpus")
    with app_over(model_dir, device, data_dir, prefilter) as service:
        meta["device"] = str(service.engine.device)
        rows = ask_all(service, questions, pdfs, sources, progress, overrides)
    (out_dir / "results.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    (out_dir / "summary.md").write_text(summarize(rows) + "\n")
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return rows
