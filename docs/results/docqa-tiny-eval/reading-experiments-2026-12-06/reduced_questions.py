"""Run 26 reading each answerable PDF question over the passage holding its answer, as asked and with
the words the passage lacks dropped (function words kept):

    python docs/results/docqa-tiny-eval/reading-experiments-2026-12-06/reduced_questions.py models/docqa-tiny

Rows and totals: passage-alone-reduced-questions.jsonl."""
import json
import re
import sys
from pathlib import Path

from tools.pdf_questions import (
    SOURCES,
    app_over,
    holds_answer,
    load_questions,
    passage_holding,
    read_passage_alone,
    read_pdf,
)

KEEP = set("""a an the and or of to in on at by for with from as is are was were be been do does did have has had i me
my
we you your it its they this that these those what which who whom whose when where why how can could may might must
should will would many much""".split())

def reduce(question, passage):
    p = passage.lower()
    out = []
    for w in re.findall(r"\S+", question):
        core = re.sub(r"^[^\w$/.-]+|[^\w]+$", "", w).lower()
        if not core or core in KEEP or core in p:
            out.append(w)
    q = " ".join(out)
    return q if q.endswith("?") else q + "?"

qs = [q for q in load_questions() if q.answerable]
with app_over(Path(sys.argv[1]), "cpu") as service:
    chunks = {}
    for name in dict.fromkeys(q.source for q in qs):
        info, _ = service.ingest(read_pdf(SOURCES[name]), f"{name}.pdf")
        chunks[name] = [c for cache in service.store.caches_of(info.record.id) if cache.status == "ready"
                        for c in service.store.chunks(cache.id)]
    rows = []
    for q in qs:
        p = passage_holding(q, chunks[q.source])
        if p is None:
            continue
        rq = reduce(q.question, p)
        a0 = read_passage_alone(service, q.question, p)
        a1 = read_passage_alone(service, rq, p) if rq != q.question else a0
        rows.append(dict(held=SOURCES[q.source].held_out, q=q.question, rq=rq, a0=a0, a1=a1,
                         r0=holds_answer(a0, q.answers), r1=holds_answer(a1, q.answers), exp=q.answers[0]))
        print(json.dumps(rows[-1]), flush=True)
    for held in (True, False):
        part = [r for r in rows if r["held"] == held]
        print(f"held_out={held}: as asked {sum(r['r0'] for r in part)}/{len(part)}, "
              f"reduced {sum(r['r1'] for r in part)}/{len(part)}, "
              f"reduced not found {sum(r['a1'].startswith('not found') for r in part)}")
