"""Helpers of the fault suite: documents, the real CLI in subprocesses, file snapshots, read-only views."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLI_ENV = {"GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": str(REPO)}
NEEDLE_Q = "What is the special magic number for amber-falcon mentioned in the provided text?"
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def text_doc(needle: str, marker: str = "", repeats: int = 4) -> bytes:
    """A short text document: filler, a needle, filler, and a marker sentence found nowhere else."""
    return (FILLER * repeats + needle + " " + FILLER * repeats + marker).encode()


DOC_A = text_doc("One of the special magic numbers for amber-falcon is: 6150382.",
                 "The quay inspector signs the ledger at noon.")
DOC_B = text_doc("One of the special magic numbers for silver-heron is: 4417093.",
                 "The ferry timetable changes every spring equinox.")


def cli(*args: str, timeout: float = 600, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """`docqa ARGS` in a new process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "ui.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=os.environ | CLI_ENV | (env or {}), stdin=subprocess.DEVNULL,
                          **kw)


def run(*args: str) -> subprocess.CompletedProcess:
    """`docqa ARGS` in this process: the same code as `cli`, without an interpreter and torch to
    start for each call. `cli` is for what needs a process of its own (a kill, a resource limit)."""
    from ui.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def no_traceback(res: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout, res.stderr[-3000:]


def library_files(root: Path) -> dict[str, str]:
    """sha256 of every document, upload and KV file: what must survive any fault."""
    out = {}
    for sub in ("documents", "uploads", "kv"):
        for path in sorted((root / sub).rglob("*")):
            if path.is_file():
                out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@contextlib.contextmanager
def read_only_view(folder: Path, view: Path):
    """`folder` mounted read-only at `view` (a bind mount: also read-only for root)."""
    view.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", str(folder), str(view)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        yield view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)
