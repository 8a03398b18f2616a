"""The first stage of chunk selection: BM25 over every chunk's text (SQLite FTS5).

The `chunk_index` table (migration m006) indexes `chunks.text` with the Porter stemmer; a question
becomes an OR of its content words, and FTS5's bm25() ranks the chunks of the caches asked for.
The predictive scorer then scores only the top M of them, so a question's cost is bounded by M,
not by the size of the documents (`app.prefilter` has the candidate rules).

Pure over its inputs: `fts_query` is a function of the question, `search` of the database's
contents.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# Words that carry no topic: matching them ranks chunks by how common English they hold.
STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her
here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not
now of off on once only or other our ours ourselves out over own same she should so some such than that
the their theirs them themselves then there these they this those through to too under until up very was
we were what when where which while who whom why will with would you your yours yourself yourselves
tell me please give find say said mentioned provided text document documents passage according
""".split())
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# The index's definition, shared by the store's migration and by `index_texts`.
CHUNK_INDEX_DDL = ("CREATE VIRTUAL TABLE chunk_index USING fts5(text, content='chunks', content_rowid='id', "
                   "tokenize='porter unicode61')")


@dataclass(frozen=True)
class IndexHit:
    cache_id: int
    ordinal: int  # the chunk's index in its cache
    bm25: float  # FTS5's bm25(): lower is a better match (it is negated BM25)


def query_terms(question: str, max_terms: int = 32) -> list[str]:
    """The question's content words, lower-cased, first occurrence order, at most `max_terms`."""
    words = [w.lower() for w in _WORD.findall(question)]
    terms = [w for w in dict.fromkeys(words) if w not in STOPWORDS and (len(w) > 1 or w.isdigit())]
    return terms[:max_terms]


def fts_query(question: str) -> str | None:
    """An FTS5 MATCH expression: any of the question's content words (each quoted, so that no word
    is read as an FTS5 operator); None when the question has none."""
    terms = query_terms(question)
    return " OR ".join(f'"{t}"' for t in terms) if terms else None


def search(conn, question: str, cache_ids: Sequence[int], limit: int) -> list[IndexHit]:
    """The `limit` best BM25 matches of the question among the chunks of `cache_ids`, best first.

    `conn`: anything with sqlite3's `execute` (a sqlite-utils Database or a sqlite3 Connection)."""
    match = fts_query(question)
    if match is None or not cache_ids or limit <= 0:
        return []
    marks = ",".join("?" * len(cache_ids))
    rows = conn.execute(
        f"SELECT c.cache_id, c.ordinal, bm25(chunk_index) AS score FROM chunk_index "
        f"JOIN chunks c ON c.id = chunk_index.rowid "
        f"WHERE chunk_index MATCH ? AND c.cache_id IN ({marks}) ORDER BY score LIMIT ?",
        [match, *cache_ids, limit]).fetchall()
    return [IndexHit(int(a), int(b), float(s)) for a, b, s in rows]


def index_texts(texts: Sequence[str], cache_id: int = 0):
    """An in-memory index of `texts` (chunk ordinals 0..n-1 of cache `cache_id`), searchable with
    `search`: the store's index without a store, for evaluations and benchmarks."""
    import sqlite3

    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE chunks (id INTEGER PRIMARY KEY, cache_id INTEGER, ordinal INTEGER, text TEXT)")
    conn.execute(CHUNK_INDEX_DDL)
    conn.executemany("INSERT INTO chunks (cache_id, ordinal, text) VALUES (?, ?, ?)",
                     [(cache_id, i, t) for i, t in enumerate(texts)])
    conn.execute("INSERT INTO chunk_index (chunk_index) VALUES ('rebuild')")
    return conn
