"""Run 26 over one passage of the Valgrind manual (retyped), asked the same question in twelve
wordings: which changes make it say "not found".

    python docs/results/docqa-tiny-eval/reading-experiments-2026-12-06/suppression_variants.py

Output: suppression-variants-run26.txt."""
from dataclasses import replace
from pathlib import Path

from app.kv_service import prefill_text
from tools.pdf_questions import app_over

passage = ("--suppressions=<filename> [default: $PREFIX/lib/valgrind/default.supp] Specifies an extra file from "
           "which to read descriptions of errors to suppress. You may use up to 100 extra suppression files.")
qs = ["How many extra suppression files may I use?",
      "How many additional suppression files may I use?",
      "How many extra suppression files can I use?",
      "How many extra suppression files can I give?",
      "How many extra suppression files may I use at most?",
      "How many extra suppression files may I use with valgrind?",
      "How many extra suppression files can I give valgrind?",
      "How many additional suppression files can I give valgrind at most?",
      "What is the maximum number of extra suppression files?",
      "how many suppression files can valgrind read",
      "Up to how many extra suppression files may I use?",
      "What is the limit on suppression files?"]
with app_over(Path("models/docqa-tiny"), "cpu") as service, service.scheduler.turn():
    doc, _ = prefill_text(service.engine, passage, service.defaults.chunk_size)
    params = replace(service.params(), top_k=doc.num_chunks, auto_k=False)
    for q in qs:
        print(repr(service.engine.answer(doc, q, params).text), "<-", q)
