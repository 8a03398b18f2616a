"""What the app would show with AnswerParams.confirm_with_lone_reading, from traced_pdfs.py's runs:
the joint answer is shown only where some chunk read alone confirms it
(engine.method.reading.confirmed); the rest become "not found". An estimate: without confirmation
the lone readings stopped once two chunks answered, so a later chunk that would have confirmed was
not read (the app with confirmation reads on until one confirms or none are left).

    python docs/results/docqa-tiny-eval/answer-gating-2026-12-07/confirmed_from_traces.py DIR...
"""
import json
import sys
from pathlib import Path

from engine.method.reading import confirmed
from tools.pdf_questions import holds_answer


def shown(row: dict, trace: dict, confirming: bool) -> str | None:
    """The answer the app shows (None: "not found"): as traced, or with confirmation the joint
    answer where a chunk alone confirms it (the app's grounding of a copy is left out here)."""
    if not confirming or not trace["lone"]:  # no lone readings ran: nothing changes
        return None if row["not_found"] else row["shown"]
    return trace["joint"] if confirmed(trace["joint"], trace["lone"], "not found") else None


for folder in map(Path, sys.argv[1:]):
    rows = [json.loads(line) for line in (folder / "results.jsonl").open()]
    traces = [json.loads(line) for line in (folder / "traces.jsonl").open()]
    for part, held_out in (("held-out", True), ("seen", False), ("all", None)):
        both = [(r, t) for r, t in zip(rows, traces, strict=True) if held_out is None or r["held_out"] == held_out]
        for rule, confirming in (("as is", False), ("confirmed", True)):
            answers = [(r, shown(r, t, confirming)) for r, t in both]
            right = sum(a is not None and bool(r["answers"]) and holds_answer(a, r["answers"])
                        and not (not confirming and r["ungrounded"]) for r, a in answers)
            wrong = sum(a is not None for _, a in answers) - right
            refused = sum(a is None for r, a in answers if not r["answers"])
            missed = sum(a is None for r, a in answers if r["answers"])
            print(f"| {folder.name} | {part} | {rule} | {right}/{sum(bool(r['answers']) for r, _ in both)} | "
                  f"{wrong} | {refused}/{sum(not r['answers'] for r, _ in both)} | {missed} |")
