"""Run 26 reading each PDF question over the passage holding its answer, with its abstain answer's first
token (" not", "not") pushed down by BIAS in every logit row: is there an answer behind the refusal?

    python docs/results/docqa-tiny-eval/reading-experiments-2026-12-06/abstain_bias.py models/docqa-tiny 0 3 100

Stopped after 14 valgrind questions (abstain-bias-run26.txt): with the bias at 100 the answer becomes
"found found", not the span."""
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

model = Path(sys.argv[1])
biases = [float(b) for b in sys.argv[2:]]
qs = [q for q in load_questions() if q.answerable]
with app_over(model, "cpu") as service:
    tok = service.engine.tokenizer
    nf_ids = [541, 4272]
    print("not found ids", nf_ids, [tok.decode([i]) for i in nf_ids])
    chunks = {}
    for name in dict.fromkeys(q.source for q in qs):
        info, _ = service.ingest(read_pdf(SOURCES[name]), f"{name}.pdf")
        chunks[name] = [c for cache in service.store.caches_of(info.record.id) if cache.status == "ready"
                        for c in service.store.chunks(cache.id)]
    head = service.engine.model.lm_head
    state = {"bias": 0.0}
    def hook(mod, inp, out):
        if state["bias"]:
            out[..., nf_ids] -= state["bias"]
        return out
    head.register_forward_hook(hook)
    res = {b: [] for b in biases}
    for q in qs:
        p = passage_holding(q, chunks[q.source])
        if p is None:
            continue
        for b in biases:
            state["bias"] = b
            a = read_passage_alone(service, q.question, p)
            res[b].append((SOURCES[q.source].held_out, holds_answer(a, q.answers), a[:40], q.answers[0][:30]))
        print(q.source, [r[-1][2] for r in res.values()], "|", q.answers[0][:30], flush=True)
    for b, rows in res.items():
        ho = [r for r in rows if r[0]]
        se = [r for r in rows if not r[0]]
        print(f"bias {b}: held-out {sum(r[1] for r in ho)}/{len(ho)}  seen {sum(r[1] for r in se)}/{len(se)}  "
              f"nf {sum(r[2].startswith('not found') for r in rows)}/{len(rows)}")
