"""What the app would show with AnswerParams.confirm_with_lone_reading, from traced_pdfs.py's runs:
an answer is kept only where some chunk read alone confirms the joint answer
(engine.method.reading.confirmed); the rest become "not found". An estimate: without confirmation
the lone readings stopped once two chunks answered, so a later chunk that would have confirmed was
not read (the app with confirmation reads on until one confirms or none are left).

    python docs/results/docqa-tiny-eval/answer-gating-2026-12-07/confirmed_from_traces.py DIR...
"""
import json
import sys
from pathlib import Path

from engine.method.reading import confirmed

for folder in map(Path, sys.argv[1:]):
    rows = [json.loads(line) for line in (folder / "results.jsonl").open()]
    traces = [json.loads(line) for line in (folder / "traces.jsonl").open()]
    for part, held_out in (("held-out", True), ("seen", False), ("all", None)):
        both = [(r, t) for r, t in zip(rows, traces, strict=True) if held_out is None or r["held_out"] == held_out]
        for rule, kept in (("as is", lambda t: True),
                           ("confirmed", lambda t: not t["lone"] or confirmed(t["joint"], t["lone"], "not found"))):
            answerable = [(r, t) for r, t in both if r["answers"]]
            unanswerable = [(r, t) for r, t in both if not r["answers"]]
            right = sum(r["right"] and kept(t) for r, t in answerable)
            wrong = sum(not r["not_found"] and not (r["answers"] and r["right"]) and kept(t) for r, t in both)
            refused = sum(r["not_found"] or not kept(t) for r, t in unanswerable)
            missed = sum(r["not_found"] or not kept(t) for r, t in answerable)
            print(f"| {folder.name} | {part} | {rule} | {right}/{len(answerable)} | {wrong} | "
                  f"{refused}/{len(unanswerable)} | {missed} |")
