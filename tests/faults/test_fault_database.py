"""The library database: missing, emptied, damaged, read-only. Nothing stored is ever lost."""

from __future__ import annotations

import sqlite3

import pytest
from faultkit import NEEDLE_Q, library_files, no_traceback, read_only_view, run


def _break(db_path, how: str) -> None:
    if how == "missing":
        db_path.unlink()
        for suffix in ("-wal", "-shm"):
            db_path.with_name(db_path.name + suffix).unlink(missing_ok=True)
    elif how == "emptied":  # `: > DATA/docqa.sqlite`
        db_path.write_bytes(b"")
    elif how == "replaced":  # a valid SQLite file without the library's tables
        db_path.unlink()
        sqlite3.connect(db_path).execute("CREATE TABLE other (x)").connection.commit()
    elif how == "damaged":  # "database disk image is malformed"
        conn = sqlite3.connect(db_path)  # the log folded in first: the damage is then in what is read
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        data = bytearray(db_path.read_bytes())
        data[100:4096 * 3] = b"\xa5" * (4096 * 3 - 100)
        db_path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["missing", "emptied", "replaced", "damaged"])
def test_a_broken_database_is_an_error_then_repaired_from_its_backup(library, how):
    data, ids = library
    before = library_files(data)
    _break(data / "docqa.sqlite", how)
    for command in (["list"], ["ingest", str(data / "documents" / f"{ids['a.txt']}.txt")]):
        res = run(*command, "--data-dir", str(data), "--device", "cpu")
        assert res.returncode == 1, (command, res.stdout, res.stderr)
        assert "docqa repair --data-dir" in res.stderr and "Nothing was changed" in res.stderr
        no_traceback(res)
    assert library_files(data) == before  # start-up recovery deleted nothing
    doctor = run("doctor", "--data-dir", str(data))
    assert doctor.returncode == 1 and "repair restores it from its backup" in doctor.stdout
    res = run("repair", "--data-dir", str(data))
    assert res.returncode == 0 and "restored the database from its backup" in res.stdout, res.stdout + res.stderr
    assert list(data.glob("docqa.sqlite.damaged-*")) or how == "missing"  # moved aside, never deleted
    listing = run("list", "--data-dir", str(data), "--device", "cpu")
    assert "a.txt" in listing.stdout and "b.md" in listing.stdout and "not cached" not in listing.stdout
    res = run("ask", "a.txt", NEEDLE_Q, "--data-dir", str(data), "--device", "cpu")
    assert res.returncode == 0 and res.stdout.strip() == "6150382", res.stderr
    assert run("doctor", "--data-dir", str(data)).returncode == 0


def test_without_a_backup_repair_rebuilds_the_library_from_its_files(library):
    data, ids = library
    (data / "docqa.sqlite").write_bytes(b"")
    (data / "docqa.sqlite.bak").unlink()
    res = run("repair", "--data-dir", str(data))
    assert res.returncode == 0 and "started a new database" in res.stdout and "added a.txt back" in res.stdout
    listing = run("list", "--data-dir", str(data), "--device", "cpu")
    assert "a.txt" in listing.stdout and "b.md" in listing.stdout, listing.stdout + listing.stderr
    res = run("ask", "a.txt", NEEDLE_Q, "--data-dir", str(data), "--device", "cpu")  # the KV is recomputed
    assert res.returncode == 0 and res.stdout.strip() == "6150382", res.stderr


def test_start_up_recovery_keeps_files_it_cannot_account_for(library, bundled_service_factory):
    data, ids = library
    stray = data / "documents" / ("f" * 64 + ".txt")  # a document the database does not know
    stray.write_text("Kept: somebody's text.")
    service = bundled_service_factory(data)
    assert service.store.last_recovery["unaccounted"] == 1 and stray.exists()
    assert len(service.documents()) == 2


def test_read_only_data_folder_answers_from_stored_kv(library, tmp_path):
    data, ids = library
    with read_only_view(data, tmp_path / "ro") as ro:
        listing = run("list", "--data-dir", str(ro), "--device", "cpu")
        assert listing.returncode == 0 and "a.txt" in listing.stdout and "read-only" in listing.stdout, listing.stderr
        no_traceback(listing)
        res = run("ask", "a.txt", NEEDLE_Q, "--data-dir", str(ro), "--device", "cpu")
        assert res.returncode == 0 and res.stdout.strip() == "6150382", res.stderr
        for command in (["ingest", str(tmp_path / "x.txt")], ["rm", "a.txt"]):
            (tmp_path / "x.txt").write_text("A new note.")
            res = run(*command, "--data-dir", str(ro), "--device", "cpu")
            assert res.returncode == 1 and "read-only" in res.stderr, res.stderr
            no_traceback(res)
        assert "a.txt" in run("list", "--data-dir", str(ro), "--device", "cpu").stdout


def test_rm_with_an_empty_or_short_name_deletes_nothing(library):
    data, ids = library
    for name in ("", "  ", ids["a.txt"][:2]):
        res = run("rm", name, "--data-dir", str(data), "--device", "cpu")
        assert res.returncode == 2, (name, res.stdout, res.stderr)
        no_traceback(res)
    listing = run("list", "--data-dir", str(data), "--device", "cpu").stdout
    assert "a.txt" in listing and "b.md" in listing
    assert run("rm", ids["a.txt"][:8], "--data-dir", str(data), "--device", "cpu").returncode == 0
    assert "a.txt" not in run("list", "--data-dir", str(data), "--device", "cpu").stdout
