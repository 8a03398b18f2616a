"""The pretraining corpus: each source's text, English only, deduplicated, held-out kinds apart."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from training.corpus import (
    Deduplicator,
    KindStats,
    _translated,
    build,
    html_to_text,
    info_to_text,
    is_english,
    normalise,
    read_shard,
    roff_to_text,
)

ENGLISH = ("The daemon reads its configuration file at start and listens on the port given there. "
           "If the file is missing, the default values are used and a warning is written to the log. ") * 4
LICENCE = ("Permission is hereby granted, free of charge, to any person obtaining a copy of this software and "
           "associated documentation files, to deal in the Software without restriction. ") * 3

MAN = r'''.\" a comment that is dropped
.TH FROBD 8 "2026" "frobd 1.2"
.SH NAME
frobd \- the frobnication daemon
.SH DESCRIPTION
.B frobd
listens on port \fB7070\fR by default.
.PP
It reads \fI/etc/frobd.conf\fP at start\(emonce.
'''


def test_manual_page_source_becomes_its_words():
    text = normalise(roff_to_text(MAN))
    assert "frobd - the frobnication daemon" in text
    assert "listens on port 7070 by default." in text and "/etc/frobd.conf at start\u2014once." in text
    assert "comment" not in text and ".TH" not in text and "\\f" not in text


# What pod2man and mdoc write: a macro definition, a condition's body, point-size escapes around an
# acronym, .IP's indent argument, .TP's indent, font-alternating and mdoc flag macros.
POD2MAN = r'''.de Vb \" Begin verbatim text
.ft CW
nf
..
.if n \{\
.    ds C` ""
.\}
\{\
.SH "OPTIONS"
.IP "\fB\-newcert\fR" 4
.IX Item "-newcert"
Creates a new \s-1CA\s0 certificate; see
.BR openssl (1).
.TP 8
\fB\-\-all\fR
do not ignore entries starting with \(aq.\(aq
.It Fl v Ar file
Verbose; see
.Xr ls 1 .
'''


def test_manual_page_macros_and_escapes_leave_no_debris():
    text = normalise(roff_to_text(POD2MAN))
    assert "OPTIONS\n\n-newcert Creates a new CA certificate; see openssl(1)." in text
    assert "--all do not ignore entries starting with '.'" in text
    assert "-v file Verbose; see ls(1)." in text
    for debris in ("-1CA0", "\\{", "\\}", "ft CW", "nf", " 4", " 8", "Vb", "ds C"):
        assert debris not in text, debris


def test_info_and_html_lose_their_markup():
    info = "\x1fFile: x.info, Node: Top\nThe find command searches.\n* Menu:\n* Intro:: First.\n"
    assert normalise(info_to_text(info)) == "The find command searches."
    page = ("<html><head><title>t</title><script>var x=1;</script></head><body><nav>Next</nav>"
            "<h1>Options</h1><p>Use <code>-v</code> to see more.</p></body></html>")
    assert normalise(html_to_text(page)) == "Options\n\nUse -v to see more."


def test_only_english_is_kept():
    assert is_english(ENGLISH)
    assert not is_english("El servei llegeix el fitxer de configuració a l'inici i escolta al port indicat. " * 5)
    assert not is_english("يقرأ البرنامج ملف الإعداد عند البدء " * 20 + "The file is read at start.")
    assert _translated(Path("/usr/share/doc/debian-handbook/html/de-DE/ch01.html"))
    assert _translated(Path("/usr/share/doc/debian-reference-common/docs/ch01.fr.html"))
    assert not _translated(Path("/usr/share/doc/debian-handbook/html/en-US/ch01.html"))
    assert not _translated(Path("/usr/share/doc/python3.11/html/library/os.path.html"))


def test_documents_and_paragraphs_are_kept_once():
    dedup, stats = Deduplicator(), KindStats()
    doc = ENGLISH + "\n\n" + LICENCE
    assert dedup.filter(doc, stats) == doc
    assert dedup.filter(doc, stats) is None and stats.duplicate_documents == 1
    other = "A different opening paragraph about the daemon and the files it reads at start.\n\n" + ENGLISH
    assert dedup.filter(other + "\n\n" + ENGLISH, stats) is None  # only one short new paragraph is left
    assert stats.duplicate_paragraphs == 2


def test_build_keeps_held_out_kinds_apart(tmp_path):
    doc_root, man_root, info_root = tmp_path / "doc", tmp_path / "man", tmp_path / "info"
    (doc_root / "frobd").mkdir(parents=True)
    (doc_root / "frobd" / "copyright").write_text(LICENCE + "\n\n" + ENGLISH)
    (doc_root / "frobd" / "README.gz").write_bytes(gzip.compress((ENGLISH + "\n\nThe README also says that the "
                                                                  "daemon can run in the foreground.").encode()))
    (man_root / "man8").mkdir(parents=True)
    (man_root / "man8" / "frobd.8.gz").write_bytes(gzip.compress((MAN + ENGLISH.replace("daemon", "service")).encode()))
    info_root.mkdir()
    manifest = build(tmp_path / "out", ("man", "info", "readme", "licences"),
                     roots={"doc_root": doc_root, "man_root": man_root, "info_root": info_root})
    assert manifest.held_out_kinds == ("licences",)
    assert manifest.kinds["licences"].documents == 1 and manifest.kinds["man"].documents == 1
    # The README repeats the licence file's English paragraph: it stays in the held-out shard only.
    assert manifest.kinds["readme"].documents == 0 and manifest.kinds["readme"].duplicate_paragraphs == 1
    licences = read_shard(tmp_path / "out" / manifest.shards["licences"][0])
    assert licences == [normalise(LICENCE + "\n\n" + ENGLISH)]
    assert "frobnication" in read_shard(tmp_path / "out" / manifest.shards["man"][0])[0]
    assert (tmp_path / "out" / "manifest.json").exists()


def test_build_leaves_out_the_held_out_packages_files(tmp_path):
    """A file dpkg lists for a held-out package (a PDF source of `docqa-tools eval-pdfs`) is read
    by no kind; the same text from another package is."""
    from training.corpus import HELD_OUT_PACKAGES

    doc_root = tmp_path / "doc"
    for package in ("frobd", HELD_OUT_PACKAGES[0]):
        (doc_root / package).mkdir(parents=True)
        (doc_root / package / "README").write_text(f"{ENGLISH}\n\nThe {package} README ends here, so it does.")
    dpkg = tmp_path / "dpkg"
    dpkg.mkdir()
    (dpkg / f"{HELD_OUT_PACKAGES[0]}:amd64.list").write_text(f"/.\n{doc_root / HELD_OUT_PACKAGES[0] / 'README'}\n")
    manifest = build(tmp_path / "out", ("readme",), roots={"doc_root": doc_root}, dpkg_info=dpkg)
    assert manifest.files_of_held_out_packages == 1 and manifest.kinds["readme"].files == 1
    text = read_shard(tmp_path / "out" / manifest.shards["readme"][0])[0]
    assert "frobd README" in text and HELD_OUT_PACKAGES[0] not in text
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["files_of_held_out_packages"] == 1
    (dpkg / f"{HELD_OUT_PACKAGES[0]}:amd64.list").unlink()  # its folder is there, dpkg knows nothing of it
    with pytest.raises(RuntimeError, match="dpkg lists no files"):
        build(tmp_path / "out2", ("readme",), roots={"doc_root": doc_root}, dpkg_info=dpkg)


def test_build_reads_the_systems_folders_by_default(tmp_path):
    """No roots given (what `python -m training.corpus` does): the system's folders, whatever is
    installed; a licence file is on every Debian system."""
    manifest = build(tmp_path / "out", ("licences",), max_chars_per_kind=1)
    assert manifest.kinds["licences"].documents == 1
