"""Ingest under faults: killed at each stage, a full disk, encrypted PDFs, several files at once."""

from __future__ import annotations

import io
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest
from faultkit import CLI_ENV, DOC_A, NEEDLE_Q, REPO, cli, library_files, no_traceback, run, text_doc
from fpdf import FPDF
from pypdf import PdfReader, PdfWriter

from app.ingest import IngestError, extract

SECRET = "The vault combination for the east archive is 90210."


def pdf_bytes(pages: int, extra: str = "") -> bytes:
    pdf = FPDF()
    pdf.set_creation_date(datetime(2026, 1, 1, tzinfo=timezone.utc))
    pdf.set_font("Helvetica", size=10)
    for p in range(pages):
        pdf.add_page()
        pdf.multi_cell(0, 5, f"Page {p + 1}. " + "The pilot boats reviewed the quay repairs with the crew. " * 24
                       + (extra if p == pages // 2 else ""))
    return bytes(pdf.output())


def _running_stage(data) -> str:
    try:
        conn = sqlite3.connect(f"file:{data / 'docqa.sqlite'}?mode=ro", uri=True, timeout=1)
        rows = conn.execute("SELECT stage FROM jobs WHERE state = 'running'").fetchall()
        conn.close()
        return rows[0][0] if rows else ""
    except sqlite3.Error:
        return ""


@pytest.mark.parametrize("stage", ["extracting", "encoding", "writing"])
def test_killed_ingest_leaves_nothing_half_stored(library, tmp_path, stage):
    data, ids = library
    before = library_files(data)
    pdf = tmp_path / "long.pdf"
    pdf.write_bytes(pdf_bytes(24))
    proc = subprocess.Popen([sys.executable, "-m", "ui.cli", "ingest", str(pdf), "--data-dir", str(data),
                             "--device", "cpu"], cwd=REPO, env=os.environ | CLI_ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        hit = any(data.glob("kv/*/*.tmp-*")) if stage == "writing" else _running_stage(data).startswith(stage)
        if hit:
            break
        time.sleep(0.002 if stage == "writing" else 0.02)
    assert proc.poll() is None, f"the ingest ended before reaching {stage}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    listing = run("list", "--data-dir", str(data), "--device", "cpu")  # recovery runs at open
    assert "long.pdf" not in listing.stdout and "a.txt" in listing.stdout, listing.stdout
    assert library_files(data) == before  # the half document is gone, the others untouched
    assert not list(data.rglob("*.tmp-*"))
    again = run("ingest", str(pdf), "--data-dir", str(data), "--device", "cpu")
    assert again.returncode == 0 and "added: long.pdf" in again.stdout, again.stdout + again.stderr


def _file_size_limit(max_bytes: int):
    def limit() -> None:  # a full disk, as the writer sees it: EFBIG past this size (SIGXFSZ is ignored)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return limit


def test_full_disk_keeps_nothing_of_the_document_and_spares_other_questions(library, tmp_path,
                                                                           bundled_service_factory):
    data, ids = library
    big, small = tmp_path / "big.txt", tmp_path / "small.txt"
    big.write_bytes(text_doc("The harbour pilot on duty is named Ines Varga.", repeats=400))  # ~25 MB of KV
    small.write_bytes(text_doc("One of the special magic numbers for quiet-lynx is: 7711234."))
    res = cli("ingest", str(big), str(small), "--data-dir", str(data), "--device", "cpu",
              preexec_fn=_file_size_limit(12 << 20))
    no_traceback(res)
    assert res.returncode == 1 and "big.txt" in res.stderr and "no space left" in res.stderr, res.stderr
    assert "Nothing of it was kept" in res.stderr
    assert "added: small.txt" in res.stdout  # the files after the failed one are still added
    assert "1 of 2 files not added" in res.stderr
    listing = run("list", "--data-dir", str(data), "--device", "cpu").stdout
    assert "big.txt" not in listing and "small.txt" in listing
    service = bundled_service_factory(data)
    assert {d.record.name for d in service.documents(include_failed=True)} == {"a.txt", "b.md", "small.txt"}
    held = {p.name.split(".")[0] for p in (data / "documents").iterdir()} | {p.name for p in (data / "kv").iterdir()}
    assert held == {d.record.id for d in service.documents()}  # no text, description or KV of big.txt
    assert not list(data.rglob("*.tmp-*"))
    every = [d.record.id for d in service.documents()]
    assert service.answer(NEEDLE_Q, every).answer == "6150382"
    info, added = service.ingest(big.read_bytes(), "big.txt")  # room again: adding it again stores it
    assert added and info.record.status == "ready" and info.cached


def _encrypted(algorithm: str, user: str, owner: str = "owner-pw") -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf_bytes(2, SECRET))))
    writer.encrypt(user_password=user, owner_password=owner, algorithm=algorithm)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@pytest.mark.parametrize("algorithm", ["AES-128", "AES-256", "RC4-128"])
def test_encrypted_pdfs_open_with_their_password(algorithm):
    data = _encrypted(algorithm, "s3cret")
    with pytest.raises(IngestError) as err:
        extract(data, "locked.pdf", 2 << 20)
    assert err.value.code == "needs_password" and "encrypted" in str(err.value)
    with pytest.raises(IngestError) as err:
        extract(data, "locked.pdf", 2 << 20, password="wrong")
    assert err.value.code == "wrong_password" and "encrypted" in str(err.value)
    for password in ("s3cret", "owner-pw"):
        doc = extract(data, "locked.pdf", 2 << 20, password=password)
        assert SECRET in doc.text and doc.encrypted


def test_owner_password_only_pdf_opens_without_a_password():
    doc = extract(_encrypted("AES-256", ""), "restricted.pdf", 2 << 20)
    assert SECRET in doc.text


def test_a_deleted_encrypted_pdf_needs_its_password_again(tmp_path, bundled_service_factory):
    service = bundled_service_factory(tmp_path / "data")
    data = _encrypted("AES-256", "s3cret")
    info, added = service.ingest(data, "locked.pdf", password="s3cret")
    assert added and service.delete(info.record.id)
    for password, code in ((None, "needs_password"), ("wrong", "wrong_password")):
        with pytest.raises(IngestError) as err:
            service.ingest(data, "locked.pdf", password=password)
        assert err.value.code == code
    assert service.documents() == []


def _scanned_pdf() -> bytes:
    pdf = FPDF()
    pdf.add_page()
    pdf.rect(20, 20, 100, 60)  # a drawing, no text layer
    return bytes(pdf.output())


def test_several_files_each_reported(tmp_path):
    files = {"cut.pdf": pdf_bytes(2)[:700], "empty.md": b"  \n", "blob.txt": b"\x00\x01\x02" * 100,
             "latin.txt": "Caf\xe9 cr\xe8me, na\xefve fa\xe7ade.".encode("latin-1"), "scan.pdf": _scanned_pdf(),
             "good.txt": DOC_A}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    res = run("ingest", *(str(tmp_path / n) for n in files), "--data-dir", str(tmp_path / "d"), "--device", "cpu")
    no_traceback(res)
    assert res.returncode == 1 and "added: good.txt" in res.stdout
    for line in ("cut.pdf: the PDF is damaged", "empty.md: it is empty", "blob.txt: it is a binary file",
                 "latin.txt: it is neither a PDF nor UTF-8 text", "scan.pdf: the PDF has no text layer",
                 "5 of 6 files not added"):
        assert line in res.stderr, res.stderr
    assert "cannot be read (" not in res.stderr  # the parser's own words go to the log only
    listing = run("list", "--data-dir", str(tmp_path / "d"), "--device", "cpu").stdout
    assert [line.split()[1] for line in listing.splitlines()] == ["good.txt"]  # nothing else half-stored


HOSTILE_NAMES = ["../../../etc/passwd", "..\\..\\boot.ini", "<img src=x onerror=alert(1)>.md", "a" * 400 + ".txt",
                 ".hidden", "; rm -rf ~.txt", "\u202egnp.txt", ""]


def test_hostile_names_are_reduced_to_safe_ones(tmp_path, bundled_service_factory):
    data = tmp_path / "data"
    service = bundled_service_factory(data)
    stored = []
    for i, name in enumerate(HOSTILE_NAMES):
        info, added = service.ingest(text_doc(f"One of the special magic numbers for name-{i} is: {1000 + i}."), name)
        assert added and "/" not in info.record.name and info.record.name
        stored.append(info.record.id)
    outside = {p for p in tmp_path.rglob("*") if not p.is_relative_to(data)}
    assert outside == set()  # nothing written beside the data folder
    assert all(len(p.name) < 80 for p in data.rglob("*"))  # stored under generated names only
    every = [d.record.id for d in service.documents()]
    for hostile in ("'); DROP TABLE documents; --", "<script>alert(1)</script>", "\x00\u202e\U0001f600 ?"):
        assert isinstance(service.answer(hostile, every).answer, str)  # an answer, not a crash
    assert len(service.documents()) == len(HOSTILE_NAMES)  # and the library is whole
    question = "What is the special magic number for name-2 mentioned in the provided text?"
    assert service.answer(question, [stored[2]]).answer == "1002"
