"""eval-pdfs with each answer's reading trace kept: the joint reading (all chosen chunks together),
each chosen chunk read alone, and which one the app answered with. Asks which agreement of those
readings tells a right answer from a made-up one (`confirmed_from_traces.py` beside it), so that a
model that reads more (runs 31-32b) could show "not found" where no chunk alone confirms its answer.

    python docs/results/docqa-tiny-eval/answer-gating-2026-12-07/traced_pdfs.py MODEL OUT_DIR

Writes OUT_DIR/results.jsonl (eval-pdfs' rows) and OUT_DIR/traces.jsonl (one per question, same
order); runs 31, 32 and 32b's are in the folders beside it (CPU, 2026-12-07)."""
import json
import sys
from pathlib import Path

import app.service as service_module
from tools import pdf_questions

model, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
traces = []
build = service_module.DocQA._build_result


def keep_trace(self, res, *args, **kwargs):
    tr = res.trace
    traces.append({"joint": joint.pop("text", res.text), "final": res.text, "lone": list(tr.lone_answers),
                   "answered_from": tr.answered_from, "lone_failed": tr.lone_failed,
                   "selected_scores": list(tr.selected_scores)})
    return build(self, res, *args, **kwargs)


service_module.DocQA._build_result = keep_trace
joint = {}  # the question's joint reading (the final text where no lone readings ran)
answer_of_service = service_module.DocQA.answer


def answer_fresh(self, *args, **kwargs):
    joint.clear()  # the passage-alone reading of the question before may have left one
    return answer_of_service(self, *args, **kwargs)


service_module.DocQA.answer = answer_fresh
import engine.method.answer as answer_module  # noqa: E402

choose = answer_module.choose_lone_reading


def keep_joint(text, alone, abstain):
    joint.setdefault("text", text)
    return choose(text, alone, abstain)


answer_module.choose_lone_reading = keep_joint
rows = pdf_questions.evaluate(model, out, device="cpu",
                              progress=lambda line: print(line, file=sys.stderr, flush=True))
(out / "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in traces))
print(pdf_questions.summarize(rows))
