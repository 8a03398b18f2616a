"""SQLite through sqlite-utils: connections, health checks and numbered migrations.

Every connection gets WAL (concurrent readers, one writer, also across processes), foreign keys on
(SQLite leaves them off by default), secure delete (a deleted document's text is overwritten in the
file, not left in free pages) and a 30 s busy timeout. Connections are never shared between
threads: `DocumentStore` keeps one per thread. A read-only data folder gets read-only connections.
"""

from __future__ import annotations

import fcntl
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from sqlite_utils import Database, Migrations

from storage.chunk_index import CHUNK_INDEX_DDL
from storage.errors import DatabaseError, ReadOnlyError

migrations = Migrations("docqa")


def connect(path: str | Path, read_only: bool = False) -> Database:
    """Opens the database with WAL, foreign keys and a busy timeout; applies pending migrations
    (read-only: none may be pending)."""
    path = Path(path)
    if read_only:
        db = Database(open_read_only(path))
        if migrations.pending(db):
            raise ReadOnlyError(f"the library in {path.parent} was written by an older version of docqa and its "
                                "folder is read-only: open it once from a writable folder to upgrade it")
        return db
    conn = sqlite3.connect(str(path), timeout=30.0)
    db = Database(conn)
    db.execute("PRAGMA foreign_keys = ON")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("PRAGMA secure_delete = ON")
    if db.journal_mode != "wal":
        db.enable_wal()
    # Two processes starting at once must not both apply the same migration.
    with open(path.with_suffix(".migrate.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        migrations.apply(db)
    return db


def open_read_only(path: Path) -> sqlite3.Connection:
    """A connection that never writes. On a read-only filesystem a WAL database without its -shm
    file cannot take read locks; nobody can write there either, so it is opened as immutable."""
    last: Exception | None = None
    for flags in ("mode=ro", "immutable=1"):
        try:
            conn = sqlite3.connect(f"file:{quote(str(path))}?{flags}", uri=True, timeout=30.0, check_same_thread=False)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError as exc:  # cannot open or lock: try the next way
            last = exc
        except sqlite3.DatabaseError as exc:  # opened, and what it holds is not a sound database
            raise DatabaseError(f"the library database {path} is damaged ({exc})") from None
    raise DatabaseError(f"cannot open the library database {path} read-only: {last}")


@dataclass(frozen=True)
class DatabaseHealth:
    state: str  # "absent" (no file or 0 bytes) | "no_library" (SQLite, without our tables) | "damaged" | "ok"
    detail: str = ""


def database_health(path: Path) -> DatabaseHealth:
    """What the file at `path` is, read without writing anything (no WAL, no migrations)."""
    if not path.exists() or path.stat().st_size == 0:
        return DatabaseHealth("absent", "missing" if not path.exists() else "empty (0 bytes)")
    try:
        conn = open_read_only(path)
    except DatabaseError as exc:
        return DatabaseHealth("damaged", str(exc).partition(" (")[2].rstrip(")") or str(exc))
    try:
        check = [row[0] for row in conn.execute("PRAGMA quick_check")]
        if check != ["ok"]:
            return DatabaseHealth("damaged", "; ".join(check[:3]))
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "documents" not in tables:
            return DatabaseHealth("no_library", "it holds no document table")
        return DatabaseHealth("ok")
    except sqlite3.DatabaseError as exc:
        return DatabaseHealth("damaged", str(exc))
    finally:
        conn.close()


def _run_statements(db: Database, sql: str) -> None:
    """Runs `;`-separated statements one by one: executescript() would COMMIT the migration's
    transaction first, and a crash then could leave tables without their migration record."""
    for statement in sql.split(";"):
        if statement.strip():
            db.execute(statement)


@migrations()
def m001_initial(db: Database) -> None:
    _run_statements(db, """
    CREATE TABLE documents (
        id TEXT PRIMARY KEY,                 -- sha256 of the uploaded bytes
        name TEXT NOT NULL,
        mime TEXT NOT NULL,
        size_bytes INTEGER NOT NULL,
        page_count INTEGER NOT NULL,
        text_chars INTEGER NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('ingesting', 'ready', 'failed')),
        error TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    ) STRICT;
    CREATE TABLE pages (
        document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
        page_index INTEGER NOT NULL,
        label TEXT NOT NULL,                 -- the printed page label ("iv", "12")
        char_start INTEGER NOT NULL,
        char_end INTEGER NOT NULL,
        has_text INTEGER NOT NULL,
        PRIMARY KEY (document_id, page_index)
    ) STRICT;
    CREATE TABLE kv_caches (
        id INTEGER PRIMARY KEY,
        document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
        model_fingerprint TEXT NOT NULL,
        chunk_size INTEGER NOT NULL,
        dtype TEXT NOT NULL,
        num_chunks INTEGER NOT NULL,
        num_tokens INTEGER NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('ready', 'evicted')),
        folder TEXT NOT NULL,                -- relative to the data folder
        bytes INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        last_used_at TEXT NOT NULL,
        UNIQUE (document_id, model_fingerprint, chunk_size, dtype)
    ) STRICT;
    CREATE TABLE kv_files (
        cache_id INTEGER NOT NULL REFERENCES kv_caches(id) ON DELETE CASCADE,
        shard INTEGER NOT NULL,
        path TEXT NOT NULL,                  -- relative to the data folder
        bytes INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        chunk_start INTEGER NOT NULL,
        chunk_end INTEGER NOT NULL,
        PRIMARY KEY (cache_id, shard)
    ) STRICT;
    CREATE TABLE chunks (
        cache_id INTEGER NOT NULL REFERENCES kv_caches(id) ON DELETE CASCADE,
        ordinal INTEGER NOT NULL,
        document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
        token_start INTEGER NOT NULL,        -- content tokens of the document, [start, end)
        token_end INTEGER NOT NULL,
        char_start INTEGER NOT NULL,
        char_end INTEGER NOT NULL,
        page_start INTEGER NOT NULL,         -- page indices, inclusive
        page_end INTEGER NOT NULL,
        text TEXT NOT NULL,
        PRIMARY KEY (cache_id, ordinal)
    ) STRICT;
    CREATE INDEX chunks_by_document ON chunks(document_id);
    CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        title TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    ) STRICT;
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        question TEXT NOT NULL,
        answer TEXT NOT NULL,
        documents TEXT NOT NULL,             -- JSON list of document ids
        params TEXT NOT NULL,                -- JSON
        selected_chunks TEXT NOT NULL,       -- JSON list of {document, chunk, score, pages}
        timings TEXT NOT NULL,               -- JSON
        created_at TEXT NOT NULL
    ) STRICT;
    """)


@migrations()
def m002_jobs(db: Database) -> None:
    """Ingestion progress, kept in SQLite so that a page refresh (or another client) still sees it."""
    _run_statements(db, """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        stage TEXT NOT NULL,
        fraction REAL NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('running', 'done', 'failed')),
        error TEXT,
        started_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    ) STRICT
    """)


@migrations()
def m003_collections(db: Database) -> None:
    """Named sets of documents, asked together."""
    _run_statements(db, """
    CREATE TABLE collections (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        created_at TEXT NOT NULL
    ) STRICT;
    CREATE TABLE collection_documents (
        collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
        document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
        PRIMARY KEY (collection_id, document_id)
    ) STRICT
    """)


@migrations()
def m004_kv_chunking(db: Database) -> None:
    """How a cache's chunks were cut. Caches written before the cut was recorded used the fixed cut
    ('fixed'); a reader asking for another cut does not find them and prefills again, and the new
    cache replaces the old one (one cache per document, model, chunk size and dtype)."""
    db.execute("ALTER TABLE kv_caches ADD COLUMN chunking TEXT NOT NULL DEFAULT 'fixed'")


@migrations()
def m005_deletions(db: Database) -> None:
    """Documents being deleted: the rows go in one transaction with this mark, the files after it;
    a crash in between leaves the mark, and recovery finishes removing the files it names."""
    db.execute("CREATE TABLE deleted_documents (id TEXT PRIMARY KEY, deleted_at TEXT NOT NULL) STRICT")


@migrations()
def m006_chunk_index(db: Database) -> None:
    """A full-text index (SQLite FTS5, BM25 ranking) over every chunk's text, for the first stage
    of chunk selection (storage.chunk_index). `chunks` gets an INTEGER PRIMARY KEY first: an FTS5
    index over another table refers to its rows by rowid, and only an INTEGER PRIMARY KEY keeps a
    row's rowid through VACUUM. Triggers keep the index in step with every insert and delete
    (cascaded deletes included)."""
    _run_statements(db, """
    CREATE TABLE chunks_new (
        id INTEGER PRIMARY KEY,
        cache_id INTEGER NOT NULL REFERENCES kv_caches(id) ON DELETE CASCADE,
        ordinal INTEGER NOT NULL,
        document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
        token_start INTEGER NOT NULL,
        token_end INTEGER NOT NULL,
        char_start INTEGER NOT NULL,
        char_end INTEGER NOT NULL,
        page_start INTEGER NOT NULL,
        page_end INTEGER NOT NULL,
        text TEXT NOT NULL,
        UNIQUE (cache_id, ordinal)
    ) STRICT;
    INSERT INTO chunks_new (cache_id, ordinal, document_id, token_start, token_end, char_start, char_end,
                            page_start, page_end, text)
        SELECT cache_id, ordinal, document_id, token_start, token_end, char_start, char_end, page_start,
               page_end, text FROM chunks ORDER BY cache_id, ordinal;
    DROP TABLE chunks;
    ALTER TABLE chunks_new RENAME TO chunks;
    CREATE INDEX chunks_by_document ON chunks(document_id)
    """)
    db.execute(CHUNK_INDEX_DDL)
    db.execute("INSERT INTO chunk_index (chunk_index) VALUES ('rebuild')")
    # Trigger bodies hold semicolons: each is one statement.
    db.execute("CREATE TRIGGER chunks_indexed AFTER INSERT ON chunks BEGIN "
               "INSERT INTO chunk_index (rowid, text) VALUES (new.id, new.text); END")
    db.execute("CREATE TRIGGER chunks_unindexed AFTER DELETE ON chunks BEGIN "
               "INSERT INTO chunk_index (chunk_index, rowid, text) VALUES ('delete', old.id, old.text); END")


@migrations()
def m007_answer_details(db: Database) -> None:
    """What an answer showed besides its text and sources, so that a conversation reopened after a
    restart shows it again: the warning ("not found"), every candidate chunk's score (the relevance
    plot) and the BOS-anchor attention of the chosen chunks. Older answers get none."""
    db.execute("ALTER TABLE messages ADD COLUMN warning TEXT")
    db.execute("ALTER TABLE messages ADD COLUMN scores TEXT NOT NULL DEFAULT '[]'")   # JSON list of dicts
    db.execute("ALTER TABLE messages ADD COLUMN anchors TEXT NOT NULL DEFAULT '[]'")  # JSON [chunk][layer]


@migrations()
def m008_job_counts(db: Database) -> None:
    """An ingest's progress in pages and chunks (done of total) and when its current stage began,
    so the library can show "page 12 of 60", "chunk 3 of 40" and the time left."""
    for column in ("pages_done", "pages_total", "chunks_done", "chunks_total"):
        db.execute(f"ALTER TABLE jobs ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE jobs ADD COLUMN stage_started_at TEXT")


@migrations()
def m009_document_names(db: Database) -> None:
    """The other names a document was added under: the same bytes uploaded again under another name
    are the same document, and that name must find it too (`documents.name` stays its first)."""
    _run_statements(db, """
    CREATE TABLE document_names (
        document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        added_at TEXT NOT NULL,
        PRIMARY KEY (document_id, name)
    ) STRICT
    """)


@migrations()
def m010_conversation_origin(db: Database) -> None:
    """Which face asked a conversation's questions ('web', 'api', 'cli'), so that the web page lists
    its own conversations, not every API call. Those asked before were the web page's."""
    db.execute("ALTER TABLE conversations ADD COLUMN origin TEXT NOT NULL DEFAULT 'web'")
