"""Questions reworded as people ask: WordNet's synonyms read from its real file format, rewordings
that keep the answer's words and vary as people's questions do, and the sampler using them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from training.reworded_questions import OPENINGS, one_token_words, reword, topic_names
from training.synonyms import build_synonyms, read_synonyms, write_synonyms

# WordNet 3.0's format: index.<pos> lines "lemma pos synset_cnt p_cnt [ptrs] sense_cnt tagsense_cnt
# offsets..." (a licence indented by spaces first), data.<pos> lines at those byte offsets,
# "offset lex_filenum ss_type w_cnt(hex) word lex_id ... | gloss".
_LICENCE = "  1 This software and database is being provided to you, the LICENSEE, by\n"


def _write_wordnet(folder: Path, synsets: dict[str, list[tuple[list[str], dict[str, int]]]]) -> None:
    """synsets: pos -> [(words, {lemma: tagged uses of this, its first, sense})]; every lemma's
    first synset is the first listed that names it."""
    for pos in ("noun", "verb", "adj", "adv"):
        data, offsets, index = _LICENCE, {}, {}
        for words, tagged in synsets.get(pos, []):
            offset = len(data.encode("latin-1"))
            marker = "(a)" if pos == "adj" else ""
            line = f"{offset:08d} 00 {pos[0]} {len(words):02x} " + " ".join(f"{w}{marker} 0" for w in words)
            data += line + " 000 | a gloss\n"
            for w in words:
                offsets.setdefault(w, []).append(offset)
                index.setdefault(w, tagged.get(w, 0))
        (folder / f"data.{pos}").write_text(data, encoding="latin-1")
        lines = [f"{w} {pos[0]} {len(o)} 1 @ {len(o)} {index[w]} " + " ".join(f"{x:08d}" for x in o)
                 for w, o in sorted(offsets.items())]
        (folder / f"index.{pos}").write_text(_LICENCE + "".join(line + "\n" for line in lines), encoding="latin-1")


def test_synonyms_come_from_each_words_usual_sense_and_part_of_speech(tmp_path):
    _write_wordnet(tmp_path, {
        "adj": [(["extra", "additional"], {"extra": 3, "additional": 5})],
        # "give" is tagged far more often as a verb: its noun sense ("springiness") is not used.
        "noun": [(["give", "springiness"], {"give": 1}), (["file", "data_file"], {"file": 9}),
                 (["an", "actinon"], {})],
        "verb": [(["give"], {"give": 80}), (["use", "utilize", "employ"], {"use": 40}),
                 (["use", "exploit"], {}),  # a rarer sense: never used
                 (["file", "register"], {"file": 2})],
    })
    synonyms = build_synonyms(tmp_path)
    assert synonyms["additional"] == ["extra"] and synonyms["extra"] == ["additional"]
    assert synonyms["use"] == ["employ", "utilize"]
    assert "give" not in synonyms  # its verb sense has no other word
    assert "file" not in synonyms  # as a noun (its usual part of speech) only "data_file", two words
    assert "an" not in synonyms and "actinon" not in synonyms.get("an", [])  # function words are left alone
    write_synonyms(synonyms, tmp_path / "s.json.xz")
    assert read_synonyms(tmp_path / "s.json.xz") == synonyms
    with pytest.raises(FileNotFoundError, match="wordnet-base"):
        build_synonyms(tmp_path / "missing")


SYNONYMS = {"additional": ["extra"], "use": ["employ", "indite"], "file": ["register"], "level": ["degree"],
            "home": ["place"], "world": ["universe"]}


def _common(word: str) -> bool:
    return word != "indite"


def test_rewordings_keep_the_answers_words_and_vary_as_people_ask():
    rng = random.Random(0)
    question, answer = "How many additional suppression files may I use?", "100"
    context = "Valgrind reads suppressions. You may use up to 100 additional suppression files with Valgrind."
    seen = [reword(question, answer, context, SYNONYMS, _common, rng) for _ in range(400)]
    assert len(set(seen)) > 40
    assert any("extra suppression" in q for q in seen) and any("employ" in q for q in seen)
    assert not any("indite" in q for q in seen)  # not common in the text: never swapped in
    assert any("Valgrind" in q for q in seen)  # the name the context is about
    assert any(q.startswith(OPENINGS) for q in seen)
    assert any(not q.endswith("?") for q in seen) and any(q.endswith("?") for q in seen)
    assert any(q[0].islower() for q in seen)
    # A dropped word takes its space with it, also the last one ("... for this?").
    ends = [reword("What is the maximum value for this?", "5", "", {}, _common, rng) for _ in range(300)]
    assert any("for this" not in q for q in ends) and not any("  " in q or q != q.strip() for q in seen + ends)
    # Whatever changed, the question still asks about the same thing.
    assert all("suppression" in q and ("how many" in q.lower()) for q in seen)
    # The answer's own words are never swapped: they are what the question asks for.
    asked = [reword("Which file holds the home level?", "home level", "A file holds the home level.", SYNONYMS,
                    _common, rng) for _ in range(200)]
    assert all("home level" in q for q in asked) and any("register" in q for q in asked)


def test_rewording_leaves_names_and_identifiers_alone():
    rng = random.Random(1)
    for _ in range(200):
        q = reword("Which company called LEVEL4 did the World Bank fund?", "Acme", "Acme and LEVEL4.", SYNONYMS,
                   _common, rng)
        assert "LEVEL4" in q and "World Bank" in q, q


def test_topic_names_are_repeated_names_the_question_lacks():
    context = ("Valgrind checks memory. With bzip2 and Valgrind you can test. The tool is fast. Memory "
               "is checked. bzip2 compresses. READ_ONLY and READ_ONLY again. World and World.")
    names = topic_names(context, "How fast is the tool?", "fast", words={"world": ["universe"]})
    assert names[:2] == ["Valgrind", "bzip2"] or names[:2] == ["bzip2", "Valgrind"]
    assert "The" not in names and "Memory" not in names  # sentence openings are no names
    assert "READ_ONLY" not in names  # identifiers in capitals are values, not topics
    assert "World" not in names  # an English word capitalised
    assert topic_names(context, "What does Valgrind check?", "memory", words={"world": []}) == ["bzip2"]


@pytest.mark.parametrize(("task", "items_key"), [("sentence_qa", "sentence_questions"),
                                                 ("parsed_qa", "parsed_questions")])
def test_the_sampler_rewords_its_share_of_questions_and_nothing_else(task, items_key):
    from test_training import TOK, _corpus, _flat

    from app.defaults import BUNDLED_MODEL
    from training import relations
    from training.tasks import TaskSampler
    from training.train import make_layout, model_config

    items = [{"context": f"Options are read at start. The default timeout is {i} seconds. Restart to apply.",
              "answer": str(i), "questions": ["What is the default timeout?"]} for i in range(20)]
    corpus = _corpus() | {"text_paragraphs": _flat([TOK.encode(f" Paragraph {i} of plain text.").ids
                                                    for i in range(50)]), items_key: items}
    layout = make_layout(BUNDLED_MODEL, model_config(TOK))
    synonyms = {"timeout": ["limit"], "default": ["standard"]}

    def sampler(**options):
        return TaskSampler(corpus, lambda s: TOK.encode(s).ids, TOK.decode, layout, 128, 64, seed=5,
                           task_weights={task: 1}, **options)

    reworded = sampler(reword_share=0.5, synonyms=synonyms)
    asked = []
    for _ in range(200):
        ex = reworded.sample(4, scoring_share=0.0)
        asked.append(TOK.decode(ex.question_ids))
        answer = TOK.decode([t for t in ex.answer_ids if t != layout.eos]).strip()
        # Rewording changes the question, never whether or what it answers.
        if answer != relations.NOT_FOUND:
            assert any(f"default timeout is {answer} seconds" in TOK.decode(c) for c in ex.chunks)
    plain = sum(q == "What is the default timeout?" for q in asked)
    assert 60 < plain < 160 and any("standard timeout" in q for q in asked) and any("limit" in q for q in asked)
    # A share of 0 draws the stream of the runs before rewording existed.
    before, now = sampler(), sampler(reword_share=0.0, synonyms=synonyms)
    for _ in range(50):
        assert before.sample(4) == now.sample(4)
    with pytest.raises(ValueError, match="synonym map"):
        sampler(reword_share=0.5)
    with pytest.raises(ValueError, match="reword_share"):
        sampler(reword_share=2.0, synonyms=synonyms)


def test_common_words_are_those_one_token_of_the_models_tokenizer_holds():
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(__file__).resolve().parents[1] / "models/docqa-tiny/tokenizer.json"))
    common = one_token_words(lambda text: tokenizer.encode(text).ids)
    assert common("default") and not common("suppression") and not common("galore")
