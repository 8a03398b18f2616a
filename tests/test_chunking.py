"""Chunking: BOS-prefixed chunks, cut at sentence starts where they can be (engine/method/chunking.py)."""

from __future__ import annotations

import pytest
import torch

from engine.method.chunking import chunk_starts, chunk_tokens, token_breaks


def test_chunks_keep_every_token_and_start_with_bos():
    ids = torch.arange(100, 137)  # 37 tokens
    ch = chunk_tokens(ids, chunk_size=8, bos_id=1, pad_id=0)
    assert ch.num_chunks == 6  # ceil(37 / 7)
    assert (ch.tokens[:, 0] == 1).all()
    assert ch.lengths.tolist() == [8, 8, 8, 8, 8, 3]
    content = torch.cat([ch.tokens[i, 1:n] for i, n in enumerate(ch.lengths.tolist())])
    assert torch.equal(content, ids)
    assert ch.content_starts.tolist() == [0, 7, 14, 21, 28, 35]
    assert chunk_tokens([], 8, 1, 0).num_chunks == 0
    with pytest.raises(ValueError, match="at least 2"):
        chunk_tokens(ids, 1, 1, 0)


def test_chunks_cut_at_sentence_starts():
    """With sentence starts, a chunk ends before the sentence that would not fit; nothing is lost."""
    ids = torch.arange(100, 137)  # 37 tokens; sentences start at 5, 12, 20 and 30
    ch = chunk_tokens(ids, chunk_size=8, bos_id=1, pad_id=0, breaks=[5, 12, 20, 30])
    assert ch.content_starts.tolist() == [0, 5, 12, 19, 26, 30]  # 19 and 26: sentence 12-20 is too long
    assert ch.lengths.tolist() == [6, 8, 8, 8, 5, 8]
    assert (ch.tokens[0, 6:] == 0).all() and (ch.tokens[:, 0] == 1).all()  # padded after the cut
    content = torch.cat([ch.tokens[i, 1:n] for i, n in enumerate(ch.lengths.tolist())])
    assert torch.equal(content, ids)
    # A break too early (under min_fill) is not taken: the chunk would be mostly padding.
    assert chunk_tokens(ids, 8, 1, 0, breaks=[2]).content_starts.tolist() == [0, 7, 14, 21, 28, 35]
    with pytest.raises(ValueError, match="min_fill"):
        chunk_tokens(ids, 8, 1, 0, breaks=[5], min_fill=0.0)


@pytest.mark.parametrize("seed", range(5))
def test_short_sentences_never_straddle_chunks(seed):
    """The property the cut exists for: every sentence of at most span - min_fill tokens lies
    inside one chunk (a needle split in two leaves no chunk with both its key and its value)."""
    g = torch.Generator().manual_seed(seed)
    n, span, min_fill = 3000, 127, 63
    lengths = torch.randint(3, 90, (200,), generator=g)
    breaks = torch.cumsum(lengths, 0)
    breaks = breaks[breaks < n].tolist()
    starts = chunk_starts(n, span, breaks, min_fill)
    ends = [*starts[1:], n]
    assert starts[0] == 0 and all(0 < e - s <= span for s, e in zip(starts, ends, strict=True))
    for a, b in zip([0, *breaks], [*breaks, n], strict=True):
        if b - a <= span - min_fill:
            assert any(s <= a and b <= e for s, e in zip(starts, ends, strict=True)), (a, b)


def test_token_breaks_map_characters_to_the_tokens_holding_them():
    offsets = [(0, 3), (3, 9), (9, 10), (10, 14), (14, 20)]  # e.g. "The", " magic", ".", " One", " of it"
    assert token_breaks([10, 11, 3, 25], offsets) == [3, 3, 1]  # a space-led token holds the start
    assert chunk_starts(0, 7, [1, 2]) == []
