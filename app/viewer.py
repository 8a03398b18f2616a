"""The document viewer: a cited page as an image with the chunk's text outlined on it, or for
text and Markdown documents the passage around the chunk with the chunk marked.

A chunk is known by its character span in the document's extracted text (`app.pdf_text`:
PDFium's, normalised; pypdf's where PDFium could not read the file, and for documents stored
before). The page image and the character boxes come from PDFium (`app.page_render`, in a child
process), whose raw characters differ from that text in whitespace, line breaks, hyphenation and
ligatures. The pure functions here bridge the two: the chunk's span is cut by page
(`spans_on_pages`), each page's part is aligned to PDFium's characters (`align_texts`,
`matched_indices`), and their boxes are merged into one rectangle a line (`line_boxes`) as
fractions of the page (`to_fractions`). A passage that cannot be placed confidently is not outlined
(a wrong highlight is worse than none); the viewer then says so and shows the passage as text.
"""

from __future__ import annotations

import base64
import difflib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from app.pdf_text import _LIGATURES
from storage import PageSpan

RENDER_TIMEOUT_S = 30.0
PAGE_WIDTH_PX = 900  # the page image's width; the browser scales it to the panel
MIN_PLACED = 0.6  # the share of a passage's characters found on the page needed to outline it
MAX_GAP = 8  # unmatched PDFium characters bridged between two matched ones (hyphens, spaces)
TEXT_WINDOW = 3000  # characters a text document's part shows (its "page")


class ViewerError(ValueError):
    """A page that cannot be shown, with a sentence a person understands."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Box:
    """A highlight rectangle as fractions of the displayed page, origin top-left (0-1)."""
    left: float
    top: float
    width: float
    height: float


@dataclass(frozen=True)
class PageView:
    document_id: str
    document: str
    kind: str  # "pdf" (an image with boxes) or "text" (a passage with the chunk marked)
    page_index: int  # physical page (pdf) or part (text), 0-based
    page_count: int
    label: str  # the printed page label ("iv", "42"), or "part 2 of 7"
    png: bytes | None = None  # the page image (pdf)
    boxes: list[Box] = field(default_factory=list)  # the chunk's lines on this page (pdf)
    # The text shown (text documents, or a PDF page whose passage could not be outlined): runs of
    # (text, marked) in order.
    passage: list[tuple[str, bool]] = field(default_factory=list)
    note: str = ""  # why the passage is not outlined, or what the highlight covers


# ---- pure mapping functions ---------------------------------------------------------------------

def spans_on_pages(char_start: int, char_end: int, pages: list[PageSpan]) -> dict[int, tuple[int, int]]:
    """The part of the document span [char_start, char_end) on each page it touches, as spans
    local to that page's text: {page index: (start, end)}. Page separators belong to no page."""
    out = {}
    for p in pages:
        a, b = max(char_start, p.char_start), min(char_end, p.char_end)
        if a < b:
            out[p.index] = (a - p.char_start, b - p.char_start)
    return out


def _compact(text: str, expand_ligatures: bool) -> tuple[str, list[int]]:
    """`text` without whitespace, case-folded, with each kept character's index in `text`."""
    chars, where = [], []
    for i, ch in enumerate(text):
        if ch.isspace() or ch == "\x00":
            continue
        out = _LIGATURES.get(ch, ch) if expand_ligatures else ch
        for c in out.casefold():
            chars.append(c)
            where.append(i)
    return "".join(chars), where


def align_texts(ours: str, theirs: str) -> list[int]:
    """For each character of `ours`, the index of the same character in `theirs`, or -1.

    Whitespace is ignored on both sides (extractors disagree most about it), case is folded and
    ligatures in `theirs` are expanded (`ours` was normalised at ingest). Identical compact texts
    map one to one; otherwise the longest matching blocks (difflib) are used."""
    a, a_at = _compact(ours, expand_ligatures=True)
    b, b_at = _compact(theirs, expand_ligatures=True)
    out = [-1] * len(ours)
    if a == b:
        for x, y in zip(a_at, b_at, strict=True):
            out[x] = y
        return out
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            out[a_at[block.a + k]] = b_at[block.b + k]
    return out


def matched_indices(alignment: list[int], start: int, end: int, ours: str, theirs: str) -> tuple[list[int], float]:
    """The indices in `theirs` that the span [start, end) of `ours` covers, and the share of the
    span's visible characters found there. Short runs of unmatched characters between two matched
    ones (a hyphen at a line end) are bridged so lines stay whole."""
    visible = [i for i in range(start, end) if not ours[i].isspace()]
    hits = sorted({alignment[i] for i in visible if alignment[i] >= 0})
    share = sum(alignment[i] >= 0 for i in visible) / len(visible) if visible else 0.0
    out = []
    for j, idx in enumerate(hits):
        if j and 1 < idx - hits[j - 1] <= MAX_GAP:
            out.extend(range(hits[j - 1] + 1, idx))
        out.append(idx)
    return [i for i in out if not theirs[i].isspace()], share


def line_boxes(boxes: list[tuple[float, float, float, float]]) -> list[tuple[float, float, float, float]]:
    """Character boxes (left, bottom, right, top in PDF points, in reading order) merged into one
    box a line: a character joins the current box when it overlaps it vertically by at least half
    its height and does not jump far left or right of it."""
    lines: list[list[float]] = []
    for left, bottom, right, top in boxes:
        if right <= left or top <= bottom:  # a generated character without a glyph
            continue
        if lines:
            cur = lines[-1]
            overlap = min(top, cur[3]) - max(bottom, cur[1])
            height = top - bottom
            near = left >= cur[0] - height and left <= cur[2] + 3 * height
            if overlap >= 0.5 * min(height, cur[3] - cur[1]) and near:
                cur[0], cur[1], cur[2], cur[3] = min(cur[0], left), min(cur[1], bottom), max(cur[2], right), max(
                    cur[3], top)
                continue
        lines.append([left, bottom, right, top])
    return [tuple(b) for b in lines]


def to_fractions(box: tuple[float, float, float, float], width_pt: float, height_pt: float) -> Box:
    """A box in PDF points (origin bottom-left) as fractions of the page image (origin top-left)."""
    left, bottom, right, top = box
    return Box(round(left / width_pt, 5), round((height_pt - top) / height_pt, 5),
               round((right - left) / width_pt, 5), round((top - bottom) / height_pt, 5))


def passage_runs(text: str, window: tuple[int, int], marks: list[tuple[int, int]]) -> list[tuple[str, bool]]:
    """`text[window]` as runs of (text, marked), the marked spans clipped to the window."""
    lo, hi = window
    cuts = sorted({lo, hi, *(min(max(x, lo), hi) for span in marks for x in span)})
    runs = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        if a < b:
            inside = any(s <= a and b <= e for s, e in marks)
            if runs and runs[-1][1] == inside:
                runs[-1] = (runs[-1][0] + text[a:b], inside)
            else:
                runs.append((text[a:b], inside))
    return runs


def text_part(text_len: int, part: int, size: int = TEXT_WINDOW) -> tuple[int, int]:
    """The character span of part `part` (0-based) of a text of `text_len` characters."""
    return part * size, min(text_len, (part + 1) * size)


def part_count(text_len: int, size: int = TEXT_WINDOW) -> int:
    return max(1, -(-text_len // size))


# ---- rendering ----------------------------------------------------------------------------------

def render_pdf_page(path: Path, page_index: int, width_px: int = PAGE_WIDTH_PX, password: str | None = None,
                    timeout_s: float = RENDER_TIMEOUT_S) -> dict:
    """The page drawn by PDFium in a child process (`app.page_render`): its reply as a dict with
    `png` decoded to bytes. Raises ViewerError (out of range, damaged, encrypted, too slow)."""
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([repo, env.get("PYTHONPATH", "")])
    request = json.dumps({"path": str(path), "page": page_index, "width_px": width_px, "password": password})
    try:
        done = subprocess.run([sys.executable, "-m", "app.page_render"], input=request.encode(), capture_output=True,
                              timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise ViewerError("timeout", f"drawing page {page_index + 1} took longer than {timeout_s:.0f} s") from None
    try:
        reply = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (IndexError, ValueError, UnicodeDecodeError):
        raise ViewerError("corrupt", f"the PDF renderer stopped unexpectedly on page {page_index + 1}") from None
    if not reply.get("ok"):
        raise ViewerError(reply.get("code", "corrupt"), reply.get("message", "the page cannot be drawn"))
    reply["png"] = base64.b64decode(reply["png"])
    return reply


def outline(page_text: str, local_span: tuple[int, int], rendered: dict) -> tuple[list[Box], float]:
    """The chunk's part of one page (`local_span` of our `page_text`) as line boxes on the page
    PDFium drew (`rendered`, from `render_pdf_page`), and the share of it that was placed."""
    alignment = align_texts(page_text, rendered["text"])
    indices, share = matched_indices(alignment, *local_span, page_text, rendered["text"])
    chars = [tuple(rendered["boxes"][i]) for i in indices]
    boxes = [to_fractions(b, rendered["width_pt"], rendered["height_pt"]) for b in line_boxes(chars)]
    return boxes, share
