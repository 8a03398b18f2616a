"""docqa-tools probe-denoising: a PDF's text masked chunk by chunk and predicted in one forward."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
import torch
from fpdf import FPDF

from app.defaults import BUNDLED_MODEL
from tools import denoising_probe as dp
from tools import pdf_questions as pq

TEXT = ("The server keeps its state in one file. The default port is 8080 for every new installation. "
        "Clients connect to it over plain TCP, and each client is served by a thread of its own. ") * 12


def test_windows_are_bos_prefixed_runs_of_the_text_without_overlap_and_seeded():
    ids = list(range(10, 110))  # 100 tokens: 11 runs of 9
    got = dp.text_windows(ids, chunk_size=10, bos=0, count=4, seed=5)
    assert got.shape == (4, 10) and (got[:, 0] == 0).all()
    starts = [int(w[1]) - 10 for w in got]
    assert all(s % 9 == 0 for s in starts) and starts == sorted(set(starts))
    for w in got:
        assert w[1:].tolist() == list(range(int(w[1]), int(w[1]) + 9))  # consecutive tokens of the text
    assert torch.equal(got, dp.text_windows(ids, 10, 0, 4, seed=5))
    assert len(dp.text_windows(ids, 10, 0, count=50, seed=5)) == 11  # no more than the text holds
    assert dp.text_windows(ids[:5], 10, 0, 4, seed=5).shape == (0, 10)


def test_masked_positions_take_the_share_of_each_window_and_never_its_bos():
    windows = torch.zeros(6, 21, dtype=torch.long)
    masked = dp.masked_positions(windows, 0.5, torch.Generator().manual_seed(1))
    assert (masked.sum(1) == 10).all() and not masked[:, 0].any()
    assert torch.equal(masked, dp.masked_positions(windows, 0.5, torch.Generator().manual_seed(1)))
    assert not torch.equal(masked, dp.masked_positions(windows, 0.5, torch.Generator().manual_seed(2)))


def test_the_summary_pools_sources_by_their_masked_tokens():
    rows = [dp.DenoisingRow("a", True, 0.15, 2, 100, 0.5, 2.0), dp.DenoisingRow("b", True, 0.15, 2, 300, 0.1, 4.0),
            dp.DenoisingRow("c", False, 0.15, 1, 10, 1.0, 0.0)]
    lines = dp.summarize(rows).splitlines()
    assert "| **held-out sources** | | 15% | 4 | **20.0%** | 3.500 |" in lines
    assert "| **seen sources** | | 15% | 1 | **100.0%** | 0.000 |" in lines


@pytest.mark.slow
def test_a_probe_of_a_pdf_scores_every_masked_token_the_same_batched_or_alone(tmp_path):
    """The bundled model over a generated PDF: rows per mask share with the masked-token count the
    share gives; the batched forwards score as window-by-window ones; an unknown source is refused."""
    pdf = FPDF()
    pdf.set_creation_date(datetime(2026, 1, 1, tzinfo=timezone.utc))
    pdf.add_page()
    pdf.set_font("Helvetica", size=11)
    pdf.multi_cell(0, 6, TEXT)
    (tmp_path / "m.pdf").write_bytes(bytes(pdf.output()))
    catalogue = {"m": pq.PdfSource("m", "none", tmp_path / "m.pdf", True, "a test manual")}
    rows = dp.probe(BUNDLED_MODEL, ["m"], windows_per_source=3, device="cpu", catalogue=catalogue)
    assert [(r.source, r.held_out, r.mask_share, r.windows) for r in rows] == [("m", True, 0.15, 3),
                                                                               ("m", True, 0.5, 3)]
    chunk = json.loads((BUNDLED_MODEL / "docqa.json").read_text())["chunk_size"]
    assert [r.masked_tokens for r in rows] == [3 * round(s * (chunk - 1)) for s in (0.15, 0.5)]
    assert all(0.0 <= r.accuracy <= 1.0 and r.cross_entropy > 0 for r in rows)

    from engine.engine import Engine

    engine = Engine.from_pretrained(BUNDLED_MODEL, device="cpu")
    ids = engine.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    windows = dp.text_windows(ids, chunk, engine.config.bos_token_id, 3, seed=0)
    masked = dp.masked_positions(windows, 0.5, torch.Generator().manual_seed(0))
    batched, alone = dp.denoise(engine, windows, masked), dp.denoise(engine, windows, masked, batch=1)
    assert batched[:2] == alone[:2] and batched[2] == pytest.approx(alone[2], rel=1e-4)
    assert batched[:2] == (rows[1].masked_tokens, round(rows[1].accuracy * rows[1].masked_tokens))

    dp.write(rows, tmp_path / "out")
    assert len((tmp_path / "out" / "rows.jsonl").read_text().splitlines()) == 2
    with pytest.raises(ValueError, match="unknown source"):
        dp.probe(BUNDLED_MODEL, ["nope"], catalogue=catalogue)
