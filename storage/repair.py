"""`docqa doctor` and `docqa repair`: what is wrong with a data folder, and putting it right.

The database is never recreated silently over a library (see `DocumentStore._check_database`);
these are the explicit ways back. Repair deletes nothing it cannot account for: a damaged database
is moved aside, files no row can be rebuilt for are moved to `lost+found/`.

Repair, in order:
1. a missing, empty or damaged database is moved aside and restored from its backup
   (`docqa.sqlite.bak`, retaken after every change to the library), else started anew;
2. documents whose files are there but whose rows are not (added after the backup, or with no
   backup at all) are added back from their text and description files (`<id>.json`); their KV
   is recomputed on first use;
3. rows whose files are gone: a document without its text is marked failed, a KV cache with a
   missing or truncated file is marked evicted (recomputed on first use);
4. KV folders of documents that cannot be rebuilt go to `lost+found/`.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from storage.db import connect, database_health
from storage.kv_files import KVFileError, check_shard
from storage.store import BACKUP_FILE, DB_FILE, DocumentStore, PageSpan

_MIME_BY_SUFFIX = {".pdf": "application/pdf", ".md": "text/markdown", ".markdown": "text/markdown",
                   ".txt": "text/plain"}


@dataclass
class RepairReport:
    database: str  # the database's state before, in words
    problems: list[str] = field(default_factory=list)  # what is wrong (doctor) or was (repair)
    actions: list[str] = field(default_factory=list)  # what repair did

    @property
    def healthy(self) -> bool:
        return not self.problems


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _database_words(path: Path) -> tuple[str, bool]:
    """The database file's state in words, and whether it is sound."""
    health = database_health(path)
    if health.state == "ok":
        return "ok", True
    words = {"absent": health.detail, "no_library": "holds no library", "damaged": f"damaged ({health.detail})"}
    return words[health.state], False


def diagnose(root: str | Path) -> RepairReport:
    """What `repair` would find, changing nothing."""
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        return RepairReport("absent", [f"{root} is not a folder"])
    state, ok = _database_words(root / DB_FILE)
    report = RepairReport(state)
    if not ok:
        backup_state, backup_ok = _database_words(root / BACKUP_FILE)
        report.problems.append(f"the database {root / DB_FILE} is {state}; repair restores it from "
                               + ("its backup" if backup_ok else f"the files (the backup is {backup_state})"))
        return report
    store = DocumentStore(root, run_recovery=False) if not _read_only(root) else None
    if store is None:
        report.problems.append(f"{root} is read-only: it can be read and asked, not checked or repaired")
        return report
    _check_rows(store, report, apply=False)
    unknown = store.stored_document_ids() - {r["id"] for r in store.db.query("SELECT id FROM documents")}
    if unknown:
        report.problems.append(f"{len(unknown)} document(s) have files but no database row: "
                               + ", ".join(sorted(i[:12] for i in unknown)))
    return report


def repair(root: str | Path) -> RepairReport:
    """Puts the data folder right (see the module's steps); returns what was wrong and what was done."""
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        return RepairReport("absent", [f"{root} is not a folder"])
    if _read_only(root):
        return RepairReport("unknown", [f"{root} is read-only: nothing can be repaired there"])
    state, ok = _database_words(root / DB_FILE)
    report = RepairReport(state)
    db_path = root / DB_FILE
    if not ok:
        report.problems.append(f"the database was {state}")
        stamp = _stamp()
        for suffix in ("", "-wal", "-shm"):
            path = root / f"{DB_FILE}{suffix}"
            if path.exists():
                aside = root / f"{DB_FILE}.damaged-{stamp}{suffix}"
                path.rename(aside)
                report.actions.append(f"moved {path.name} aside to {aside.name}")
        backup = root / BACKUP_FILE
        _, backup_ok = _database_words(backup)
        if backup_ok:
            shutil.copyfile(backup, db_path)
            taken = datetime.fromtimestamp(backup.stat().st_mtime, timezone.utc).isoformat(timespec="seconds")
            report.actions.append(f"restored the database from its backup of {taken}")
        else:
            report.actions.append("started a new database (no usable backup)")
        connect(db_path).conn.close()  # migrations: the tables exist before the store checks them
    store = DocumentStore(root)
    _adopt_documents(store, report)
    _check_rows(store, report, apply=True)
    store.backup()
    return report


def _read_only(root: Path) -> bool:
    return not os.access(root, os.W_OK)


def _adopt_documents(store: DocumentStore, report: RepairReport) -> None:
    known = {r["id"] for r in store.db.query("SELECT id FROM documents")}
    lost = store.root / "lost+found" / _stamp()
    for doc_id in sorted(store.stored_document_ids() - known):
        text_path = store.root / "documents" / f"{doc_id}.txt"
        if not text_path.exists():
            kv = store.root / "kv" / doc_id
            if kv.exists():
                lost.mkdir(parents=True, exist_ok=True)
                kv.rename(lost / doc_id)
                report.actions.append(f"moved the KV files of unknown document {doc_id[:12]} to "
                                      f"{lost.relative_to(store.root)}/ (no text to rebuild it from)")
            for upload in store.uploads_of(doc_id):
                report.problems.append(f"document {doc_id[:12]}: only its original file is left "
                                       f"(uploads/{upload.name}); add that file again")
            continue
        text = text_path.read_text(encoding="utf-8")
        about_path = store.root / "documents" / f"{doc_id}.json"
        uploads = store.uploads_of(doc_id)
        if about_path.exists():
            about = json.loads(about_path.read_text())
            name, mime, size = about["name"], about["mime"], about["size_bytes"]
            pages = [PageSpan(**p) for p in about["pages"]]
        else:  # a document stored before description files were written: one page, a generated name
            suffix = uploads[0].suffix if uploads else ".txt"
            name, mime = f"{doc_id[:12]}{suffix}", _MIME_BY_SUFFIX.get(suffix, "text/plain")
            size = uploads[0].stat().st_size if uploads else len(text.encode())
            pages = [PageSpan(0, "1", 0, len(text), bool(text.strip()))]
        store.add_document(doc_id, name, mime, size, text, pages)
        report.problems.append(f"document {name} ({doc_id[:12]}) had files but no database row")
        report.actions.append(f"added {name} back to the library" + ("" if about_path.exists() else
                              " (without its page numbers: it predates description files)"))


def _check_rows(store: DocumentStore, report: RepairReport, apply: bool) -> None:
    for record in store.list_documents(("ready", "failed")):
        if record.status == "ready" and not (store.root / "documents" / f"{record.id}.txt").exists():
            report.problems.append(f"document {record.name} ({record.id[:12]}): its text file is missing")
            if apply:
                store.set_status(record.id, "failed", "its text file is missing; add the file again")
                report.actions.append(f"marked {record.name} failed (add it again)")
        for cache in store.caches_of(record.id):
            if cache.status != "ready":
                continue
            try:
                for shard in cache.files:
                    check_shard(store.root, shard, verify_hash=False)
            except KVFileError as exc:
                report.problems.append(f"document {record.name}: {exc}")
                if apply:
                    store.mark_evicted(cache.id)
                    report.actions.append(f"dropped the damaged KV cache of {record.name} (recomputed on first use)")
