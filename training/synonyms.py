"""Synonyms of English words from WordNet 3.0's database files, for rewording training questions.

People rarely ask with the words a manual uses ("How many additional suppression files can I give
valgrind?" over "You may use up to 100 extra suppression files."). WordNet's synsets give, for a
word, the words that name the same concept. Only a word's most frequent sense per part of speech is
used (the first synset its index line lists, by tagged frequency), in the part of speech it is
most often tagged with: rarer senses swap in words that change the question's meaning ("give" as a
noun -> "springiness", "file" as a verb -> "register").

The database comes from Debian's `wordnet-base` package (/usr/share/wordnet, the WordNet 3.0
licence: use, copy and distribute freely with the notice); `build_synonyms` runs at data
preparation, and training reads the JSON it writes, so the training machine needs no WordNet.

    python -m training.synonyms --out .device-data/synonyms.json.xz
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
from pathlib import Path

WORDNET_DIR = Path("/usr/share/wordnet")
PARTS_OF_SPEECH = ("noun", "verb", "adj", "adv")
# A lemma worth swapping: one lowercase word of letters (WordNet joins multi-word lemmas with "_").
_WORD = re.compile(r"^[a-z][a-z-]*[a-z]$")
# Adjective lemmas carry a syntactic marker in the data files: "extra(a)", "galore(ip)".
_ADJECTIVE_MARKER = re.compile(r"\((a|p|ip)\)$")
# Function words WordNet also lists (as nouns and adverbs: "an" for actinon, "do" for ditto):
# swapping one changes nothing a reader matches on, or garbles the question. Not shared with
# storage.chunk_index's BM25 stopwords: training may import only the engine, and that list also
# drops question words ("tell", "find").
FUNCTION_WORDS = frozenset("""a an the and or but if of to in on at by for with from as is are was were be been being am
do does did done doing have has had having i me my we our you your he him his she her it its they them their this that
these those what which who whom whose when where why how not no yes can could may might must shall should will would
there here than then so too very just also only about into over under up down out off again once all any both each
few more most other some such own same""".split())


def _first_senses(index_file: Path) -> dict[str, tuple[int, int]]:
    """lemma -> (how many of its senses' uses are tagged in WordNet's corpus, byte offset of its most
    frequent synset), from an index.<pos> file."""
    out = {}
    for line in index_file.read_text(encoding="latin-1").splitlines():
        if line.startswith(" "):  # the licence at the top of each file
            continue
        fields = line.split()
        # lemma pos synset_cnt p_cnt [ptr_symbol x p_cnt] sense_cnt tagsense_cnt offset...
        pointers = int(fields[3])
        out[fields[0]] = int(fields[4 + pointers + 1]), int(fields[4 + pointers + 2])
    return out


def _synset_words(data: bytes, offset: int) -> list[str]:
    """The lemmas of the synset at `offset` of a data.<pos> file: offset lex_filenum ss_type w_cnt
    (two hex digits) then w_cnt pairs of word and lex_id."""
    line = data[offset:data.index(b"\n", offset)].decode("latin-1").split()
    count = int(line[3], 16)
    return [_ADJECTIVE_MARKER.sub("", line[4 + 2 * i]).lower() for i in range(count)]


def build_synonyms(wordnet_dir: Path = WORDNET_DIR) -> dict[str, list[str]]:
    """word -> its synonyms: the other one-word lemmas of its sense (its most frequent, in its most
    often tagged part of speech; the first in PARTS_OF_SPEECH on a tie), for every one-word lemma
    that has any, neither side a function word. Some are rare words ("indite" for "write"): a user
    may keep only those common in its text (training.reworded_questions keeps one-token words)."""
    if not (wordnet_dir / "index.noun").is_file():
        raise FileNotFoundError(f"no WordNet database in {wordnet_dir}: install Debian's wordnet-base package")
    best: dict[str, tuple[int, str, int]] = {}  # lemma -> (tagged uses, pos, offset)
    for pos in PARTS_OF_SPEECH:
        for lemma, (tagged, offset) in _first_senses(wordnet_dir / f"index.{pos}").items():
            if _WORD.match(lemma) and lemma not in FUNCTION_WORDS and (lemma not in best or tagged > best[lemma][0]):
                best[lemma] = tagged, pos, offset
    data = {pos: (wordnet_dir / f"data.{pos}").read_bytes() for pos in PARTS_OF_SPEECH}
    synonyms = {}
    for lemma, (_, pos, offset) in sorted(best.items()):
        others = sorted({w for w in _synset_words(data[pos], offset)
                         if w != lemma and _WORD.match(w) and w not in FUNCTION_WORDS})
        if others:
            synonyms[lemma] = others
    return synonyms


def write_synonyms(synonyms: dict[str, list[str]], path: Path) -> None:
    """As JSON, xz-compressed where the name ends in .xz."""
    text = json.dumps(synonyms, separators=(",", ":"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(lzma.compress(text.encode()) if path.suffix == ".xz" else text.encode())


def read_synonyms(path: Path) -> dict[str, list[str]]:
    raw = path.read_bytes()
    return json.loads(lzma.decompress(raw) if path.suffix == ".xz" else raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write (.xz: compressed)")
    ap.add_argument("--wordnet", type=Path, default=WORDNET_DIR, help="WordNet's dict folder (index.* and data.*)")
    args = ap.parse_args()
    synonyms = build_synonyms(args.wordnet)
    write_synonyms(synonyms, args.out)
    print(f"{len(synonyms)} words with synonyms -> {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
