"""training.parsed_questions: questions in people's order from a dependency parse (spaCy's small
English pipeline, installed with the dev and train extras), and the parsed_qa training task."""

import random

import pytest

from training.parsed_questions import load_parser, parsed_question_examples, questions_of, wordings

spacy = pytest.importorskip("spacy", reason="the parsed questions need spaCy (pip install -e '.[train]')")


@pytest.fixture(scope="module")
def parser():
    return load_parser()


def _asked(parser, sentence):
    return [(q.shape, q.answer, q.question) for q in questions_of(parser(sentence))]


@pytest.mark.parametrize(("sentence", "asked"), [
    ("You may use up to 100 extra suppression files.",
     [("count", "100", "How many extra suppression files may I use?")]),
    ("The key expires after 30 days.", [("count", "30", "After how many days does the key expire?")]),
    ("The library uses CRC-32C for checksums.", [("object", "CRC-32C", "What does the library use for checksums?")]),
    ("The default port is 8080.", [("copula", "8080", "What is the default port?")]),
    ("The author of the program is John Smith.", [("copula", "John Smith", "Who is the author of the program?")]),
    # a value naming the noun before it, however the parse attached the two; a framing phrase and a
    # coordinated clause left out
    ("By default, the daemon listens on port 8080 and accepts 64 connections.",
     [("which", "8080", "On which port does the daemon listen?")]),
    ("The wrapper library is released under the MIT license.",
     [("which", "MIT", "Under which license is the wrapper library released?")]),
    # quotes left out, the comma kept on its word; "you" asked as "me" where it is no subject
    ("Each \u2018data\u2019 is either a \u2018bytes\u2019, or a tuple.",
     [("subject", "data", "What is either a bytes, or a tuple?")]),
    ("If you give this option more than twice, 'diff' reports an error.",
     [("subject", "diff", "What reports an error?")]),
    ("Otherwise OpenSSL will prompt you, possibly many times, if the key is encrypted.",
     [("subject", "OpenSSL", "What will prompt me possibly many times?")]),
    # a bare "what" or "who" leaves its preposition where it stood; "in <year>" is asked with "when"
    ("The wrapper library was written by Julian Seward in 2002.",
     [("preposition", "Julian Seward", "Who was the wrapper library written by in 2002?"),
      ("preposition", "2002", "When was the wrapper library written by Julian Seward?")]),
    # a parenthetical left out of the question
    ("The secret key is always 128 bits (16 octets).", [("count", "128", "How many bits is the secret key always?")]),
])
def test_questions_put_the_wh_phrase_first_and_invert_the_clause(parser, sentence, asked):
    assert _asked(parser, sentence) == asked
    for _, answer, _ in asked:
        assert answer in sentence


@pytest.mark.parametrize("sentence", [
    "It uses 4 threads by default.",  # a pronoun subject: "What does it use?" asks nothing answerable
    "See the changelog(1) for a full list of changes.",  # the blank is part of a token ("changelog(1)")
    "When the file is missing, the tool prints an error.",  # nothing to ask
])
def test_sentences_a_question_cannot_be_put_to_ask_nothing(parser, sentence):
    assert _asked(parser, sentence) == []


def test_wordings_keep_the_wh_phrase_and_vary_the_rest(parser):
    [question] = questions_of(parser("You may use up to 100 extra suppression files."))
    seen = set()
    for seed in range(30):
        made = wordings(question, random.Random(seed))
        assert made[0] == "How many extra suppression files may I use?"
        assert made[1] == "how many extra suppression files may I use"
        assert all(w.lower().startswith("how many extra suppression files") for w in made)
        assert len(made) == len(set(made))
        seen |= set(made)
    assert "How many extra suppression files may I employ?" in seen  # a same-meaning swap, some of the time


def test_parsed_questions_over_sources_hold_their_answer_once_in_their_context():
    manuals = ["The daemon is configured in one file. The default port of the daemon is 8080. Restart it to apply.",
               "The library uses CRC-32C for checksums. Checksums are checked on read.",
               "The default port is 8080 here, and the old port 8080 is kept too."]  # twice: ambiguous
    encyclopedia = iter(["The bridge over the river was designed by Anna Tarn in the old style."])
    items = parsed_question_examples({"corpus": manuals, "hotpotqa": encyclopedia}, seed=0)
    assert {(i["source"], i["answer"], i["questions"][0]) for i in items} == {
        ("corpus", "8080", "What is the default port of the daemon?"),
        ("corpus", "CRC-32C", "What does the library use for checksums?"),
        ("hotpotqa", "Anna Tarn", "Who was the bridge over the river designed by in the old style?")}
    for item in items:
        assert item["context"].count(item["answer"]) == 1
        assert item["questions"][1] == item["questions"][0][0].lower() + item["questions"][0][1:-1]
    port = next(i for i in items if i["answer"] == "8080")
    assert port["context"] == ("The daemon is configured in one file. The default port of the daemon is 8080. "
                               "Restart it to apply.")
