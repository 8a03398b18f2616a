"""Near-miss needle questions: a short haystack holding one key's magic number, asked for another
key's. The right answer is the model's abstain answer ("not found"); the worst is the other key's.

    PYTHONPATH=. .venv/bin/python docs/results/docqa-tiny-run24/near_miss_needles.py MODEL_DIR 30
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from pathlib import Path

from app.defaults import answer_params, model_defaults
from engine import Engine
from training.tasks import REPEAT_HAYSTACK

WORDS = ("amber quiet violet blue red silver golden crimson lunar solar harbor falcon badger walrus heron "
         "otter lynx maple cedar river").split()


def main() -> None:
    model, count = Path(sys.argv[1]), int(sys.argv[2])
    engine, defaults = Engine.from_pretrained(model, device="cpu"), model_defaults(model)
    rng = random.Random(5)
    outcomes: Counter[str] = Counter()
    for _ in range(count):
        held = asked = f"{rng.choice(WORDS)}-{rng.choice(WORDS)}"
        while asked == held:
            asked = f"{rng.choice(WORDS)}-{rng.choice(WORDS)}"
        value = str(rng.randrange(1_000_000, 9_999_999))
        filler = [REPEAT_HAYSTACK] * 12  # about 1,000 tokens
        filler.insert(rng.randrange(len(filler)), f"One of the special magic numbers for {held} is: {value}.")
        doc = engine.prefill_text(" ".join(filler), defaults.chunk_size)
        question = f"What is the special magic number for {asked} mentioned in the provided text?"
        text = engine.answer(doc, question, answer_params(defaults)).text.strip()
        outcomes["not found" if text.lower() == "not found" else "the other key's value" if text == value
                 else "something else"] += 1
    print(f"{model}: {count} near-miss needle questions: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))


if __name__ == "__main__":
    main()
