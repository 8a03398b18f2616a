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
from faultkit import CLI_ENV, DOC_A, NEEDLE_Q, REPO, cli, library_files, no_traceback, text_doc
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
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "ingest", str(pdf), "--data-dir", str(data),
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
    listing = cli("list", "--data-dir", str(data), "--device", "cpu")  # recovery runs at open
    assert "long.pdf" not in listing.stdout and "a.txt" in listing.stdout, listing.stdout
    assert library_files(data) == before  # the half document is gone, the others untouched
    assert not list(data.rglob("*.tmp-*"))
    again = cli("ingest", str(pdf), "--data-dir", str(data), "--device", "cpu")
    assert again.returncode == 0 and "added: long.pdf" in again.stdout, again.stdout + again.stderr


def _file_size_limit(max_bytes: int):
    def limit() -> None:  # a full disk, as the writer sees it: EFBIG past this size (SIGXFSZ is ignored)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return limit


def test_full_disk_marks_the_document_failed_and_spares_other_questions(library, tmp_path, bundled_service_factory):
    data, ids = library
    big, small = tmp_path / "big.txt", tmp_path / "small.txt"
    big.write_bytes(text_doc("The harbour pilot on duty is named Ines Varga.", repeats=160))  # ~40 MB of KV
    small.write_bytes(text_doc("One of the special magic numbers for quiet-lynx is: 7711234."))
    res = cli("ingest", str(big), str(small), "--data-dir", str(data), "--device", "cpu",
              preexec_fn=_file_size_limit(12 << 20))
    no_traceback(res)
    assert res.returncode == 1 and "big.txt" in res.stderr and "no space left" in res.stderr, res.stderr
    assert "added: small.txt" in res.stdout  # the files after the failed one are still added
    assert "1 of 2 files not added" in res.stderr
    listing = cli("list", "--data-dir", str(data), "--device", "cpu").stdout
    assert "big.txt" in listing and "FAILED" in listing and "add it again to retry" in listing
    service = bundled_service_factory(data)
    askable = {d.record.name for d in service.documents()}
    assert askable == {"a.txt", "b.md", "small.txt"}  # "all documents" leaves the failed one out
    every = [d.record.id for d in service.documents()]
    assert service.answer(NEEDLE_Q, every).answer == "6150382"
    failed = next(d for d in service.documents(include_failed=True) if d.record.name == "big.txt")
    with pytest.raises(ValueError, match="could not be stored .* add it again to retry"):
        service.answer("Who is the harbour pilot on duty?", [failed.record.id])
    info, added = service.ingest(big.read_bytes(), "big.txt")  # room again: the retry stores it
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


def test_several_files_each_reported(tmp_path):
    good, empty, binary, cut = (tmp_path / n for n in ("good.txt", "empty.md", "blob.txt", "cut.pdf"))
    good.write_bytes(DOC_A)
    empty.write_bytes(b"  \n")
    binary.write_bytes(b"\x00\x01\x02" * 100)
    cut.write_bytes(pdf_bytes(2)[:700])
    res = cli("ingest", str(cut), str(empty), str(binary), str(good), "--data-dir", str(tmp_path / "d"),
              "--device", "cpu")
    no_traceback(res)
    assert res.returncode == 1 and "added: good.txt" in res.stdout
    for line in ("cut.pdf: the PDF is damaged", "empty.md: empty.md is empty", "blob.txt: blob.txt is a binary file",
                 "3 of 4 files not added"):
        assert line in res.stderr, res.stderr
