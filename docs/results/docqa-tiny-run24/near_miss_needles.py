"""Near-miss needle questions: a haystack with one key's magic number, asked for another key."""
import random, sys
from app.defaults import answer_params, model_defaults
from engine import Engine
from training.tasks import REPEAT_HAYSTACK
from pathlib import Path
model = Path(sys.argv[1]); n = int(sys.argv[2])
eng = Engine.from_pretrained(model, device="cpu"); d = model_defaults(model)
rng = random.Random(5)
words = "amber quiet violet blue red silver golden crimson lunar solar harbor falcon badger walrus heron otter lynx maple cedar river".split()
nf = same = other = 0
for i in range(n):
    k1 = f"{rng.choice(words)}-{rng.choice(words)}"; k2 = k1
    while k2 == k1: k2 = f"{rng.choice(words)}-{rng.choice(words)}"
    v = str(rng.randrange(1_000_000, 9_999_999))
    filler = [REPEAT_HAYSTACK] * 12
    filler.insert(rng.randrange(len(filler)), f"One of the special magic numbers for {k1} is: {v}.")
    doc = eng.prefill_text(" ".join(filler), d.chunk_size)
    r = eng.answer(doc, f"What is the special magic number for {k2} mentioned in the provided text?", answer_params(d))
    t = r.text.strip()
    if t.lower() == "not found": nf += 1
    elif t == v: same += 1
    else: other += 1
print(f"{model}: {n} near-miss needle questions: not found {nf}, the other key's value {same}, something else {other}")
