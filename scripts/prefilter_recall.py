"""Recall of the BM25 prefilter alone: the share of answer-holding chunks among its M candidates
(tools.evaluation.prefiltered), per task family, length and M, over `docqa-tools eval-data` folders. Needs
only the model's tokenizer: the chunks are cut as prefill_text cuts them, no forward pass runs.

    python scripts/prefilter_recall.py    # .ruler-data/dev (4K, 16K) and .ruler-data/long (32K, 64K)
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from app.defaults import BUNDLED_MODEL  # noqa: E402
from app.kv_service import chunk_records  # noqa: E402
from engine import DocumentKV  # noqa: E402
from engine.method.chunking import chunk_tokens, token_breaks  # noqa: E402
from engine.method.sentences import sentence_starts  # noqa: E402
from tools import ruler  # noqa: E402
from tools.evaluation import answer_chunks, prefiltered  # noqa: E402

TASKS = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue", "niah_multiquery",
         "lookup_family", "lookup_paraphrase", "lookup_framing", "qa_1", "qa_2"]
SETS = ((Path(".ruler-data/dev"), [4096, 16384], TASKS), (Path(".ruler-data/long"), [32768, 65536], TASKS[:9]))
SIZES = (8, 16, 32, 64)


def main() -> None:
    tok = PreTrainedTokenizerFast.from_pretrained(str(BUNDLED_MODEL))
    recall = collections.defaultdict(list)
    for folder, lengths, tasks in SETS:
        for s in ruler.load(folder, tasks, lengths):
            enc = tok(s.context, add_special_tokens=False, return_offsets_mapping=True)
            offsets = enc["offset_mapping"]
            chunks = chunk_tokens(enc["input_ids"], 128, 0, 1, token_breaks(sentence_starts(s.context), offsets))
            empty = torch.zeros(1, chunks.num_chunks, 1, 128, 1)  # no KV is needed, only the cut
            doc = DocumentKV(empty, empty, chunks.lengths, chunks.tokens, chunks.content_starts)
            texts = [c.text for c in chunk_records(doc, offsets, s.context, [])]
            holding = answer_chunks(s, offsets, doc.content_starts)
            if holding:
                for m in SIZES:
                    seen = set(prefiltered(doc, texts, s.question, m)[0])
                    recall[(s.task.split("_")[0], s.length, m)].append(len(holding & seen) / len(holding))
    print("| family | length | " + " | ".join(f"M = {m}" for m in SIZES) + " |")
    print("|---|---|" + "---|" * len(SIZES))
    for family, length in sorted({k[:2] for k in recall}):
        cells = [recall[(family, length, m)] for m in SIZES]
        print(f"| {family} | {length // 1024}K | " + " | ".join(f"{100 * sum(c) / len(c):.1f}%" for c in cells)
              + f" | (n={len(cells[0])})")


if __name__ == "__main__":
    main()
