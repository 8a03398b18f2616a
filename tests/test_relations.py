"""Relation families and their fixed split: nothing held out can reach a training sample."""

from __future__ import annotations

import hashlib
import random
import re

import pytest

from training.relations import (
    FRAMINGS,
    HELD_OUT_DRESSINGS,
    HELD_OUT_FRAMINGS,
    LIST_KINDS,
    LOWER_CASE_VALUE_KINDS,
    NOT_FOUND,
    TRAIN_DRESSINGS,
    can_put_value_first,
    draw_fact,
    dress,
    families,
    frame,
    held_out_samples,
    near_subject,
    put_value_first,
    split,
    subject,
    value,
    value_first_form,
)

PARAGRAPHS = [f"Paragraph {i} of a real manual describes the options of a program and its files." for i in range(40)]


def test_at_least_200_families_each_well_formed():
    every = families()
    assert len(every) >= 200 and len({f.id for f in every}) == len(every)
    assert sum(f.is_list for f in every) >= 8
    for f in every:
        assert "{v}" in f.fact and ("{s}" in f.fact or "{S}" in f.fact), f.id
        assert all("{s}" in q for q in (f.question, *f.paraphrases)), f.id
        assert f.paraphrases, f.id


def test_near_subjects_share_a_word_and_are_never_the_asked_one():
    rng = random.Random(4)
    for kind in ("place", "person", "service", "vessel", "route", "project", "event", "product"):
        for _ in range(20):
            asked = subject(kind, rng)
            avoid = {subject(kind, rng)}
            near = near_subject(asked, kind, rng, avoid=avoid)
            assert near != asked and near not in avoid
            stems = [{w[:4] for w in re.findall(r"[a-z]+", s.lower())} - {"the"} for s in (asked, near)]
            assert stems[0] & stems[1], (asked, near)


def test_the_split_is_fixed_and_by_kind():
    a, b = split(), split()
    assert a == b
    held = sorted(f.id for f in a.held_out_families)
    assert len(held) >= 40 and not set(held) & {f.id for f in a.train_families}
    # A change to the table or the seed changes the held-out set: the model card names this digest.
    assert hashlib.sha256(",".join(held).encode()).hexdigest()[:12] == "208ecd665003"
    assert set(a.train_framings).isdisjoint(HELD_OUT_FRAMINGS) and set(a.train_framings) | set(HELD_OUT_FRAMINGS) \
        == set(FRAMINGS)
    for f in a.train_families:
        assert set(a.train_wordings(f)).isdisjoint(a.held_out_wordings(f))
        plain_only = f.id in a.held_out_paraphrases
        assert a.train_wordings(f) == ((f.question,) if plain_only else (f.question, *f.paraphrases))
    assert a.held_out_paraphrases <= {f.id for f in a.train_families} and len(a.held_out_paraphrases) >= 30
    for f in a.held_out_families:
        assert a.held_out_wordings(f) == (f.question, *f.paraphrases)


def test_values_are_spans_of_their_fact():
    rng = random.Random(0)
    for f in families():
        for _ in range(5):
            fact = draw_fact(f, rng)
            assert fact.value in fact.sentence and fact.sentence[0].isupper(), (f.id, fact.sentence)
            assert f.value_kind not in LIST_KINDS or fact.value.count(",") == 1 and " and " in fact.value


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower())) - {"the", "of", "is", "a", "s", "v", "what", "which", "who"}


def test_paraphrases_share_fewer_words_with_the_fact():
    every = families()
    plain = sum(len(_words(f.question) & _words(f.fact)) for f in every) / len(every)
    para = sum(len(_words(p) & _words(f.fact)) for f in every for p in f.paraphrases) / sum(len(f.paraphrases)
                                                                                              for f in every)
    assert para < 0.6 * plain


def test_held_out_samples_ask_only_held_out_wordings():
    sp = split()
    samples = held_out_samples([PARAGRAPHS], 300, seed=5, no_answer_share=0.2)
    train_framings = set(sp.train_framings)
    for s in samples:
        assert s.framing in HELD_OUT_FRAMINGS and s.framing not in train_framings
        if s.answer == NOT_FOUND:
            assert s.depth == -1.0
        else:
            assert s.answer in s.document
        assert s.question.endswith("?") or s.question.endswith(".")
    assert 0.1 < sum(s.answer == NOT_FOUND for s in samples) / len(samples) < 0.3
    held = {f.id for f in sp.held_out_families}
    assert {s.held_out for s in samples} == {"family", "paraphrase", "framing"}
    for s in samples:
        assert (s.family in held) == (s.held_out == "family")
    assert frame("What is it?", "Tell me {ql}") == "Tell me what is it?"


def test_the_bundled_model_abstains_as_it_was_trained_to():
    from app.defaults import BUNDLED_MODEL, model_defaults

    assert model_defaults(BUNDLED_MODEL).abstain_answer == NOT_FOUND


def _fragments(dressing: tuple[str, str]) -> list[str]:
    """The fixed words of a dressing (its blanks left out): what shows it in a text."""
    return [part.strip(" ,") for half in dressing for part in re.split(r"\{\w+\}", half) if part.strip(" ,")]


def test_a_dressed_fact_keeps_its_sentence_inside_a_lead_and_a_trailing_clause():
    every = {f.id: f for f in families()}
    rng = random.Random(3)
    fact = draw_fact(every["place/01"], rng)  # "The access code for {s} is {v}."
    dressed = dress(fact, ("As of {year}, ", ", {rel} was confirmed in {month}"), rng)
    assert re.fullmatch(rf"As of 20\d\d, the access code for {re.escape(fact.subject)} is {fact.value}, which was "
                        r"confirmed in [A-Z][a-z]+\.", dressed.sentence), dressed.sentence
    person = draw_fact(every["place/05"], rng)  # "The manager of {s} is {v}."
    assert dress(person, ("", ", {rel} signed the new {thing} contract"), rng).sentence.startswith(
        person.sentence[:-1] + ", who signed the new ")
    assert dress(fact, ("", ""), rng).sentence == fact.sentence


def test_held_out_dressings_are_never_trained_on_and_the_form_set_uses_only_them():
    assert not set(TRAIN_DRESSINGS) & set(HELD_OUT_DRESSINGS) and len(HELD_OUT_DRESSINGS) >= 3
    held_words = {w for d in HELD_OUT_DRESSINGS for w in _fragments(d)}
    assert not held_words & {w for d in TRAIN_DRESSINGS for w in _fragments(d)}
    sp = split()
    samples = held_out_samples([PARAGRAPHS], 60, seed=5, kind="form")
    for s in samples:
        assert s.held_out == "form" and s.framing in HELD_OUT_FRAMINGS and s.answer in s.fact
        assert any(all(w in s.fact for w in _fragments(d)) for d in HELD_OUT_DRESSINGS), s.fact
        family = next(f for f in sp.train_families if f.id == s.family)
        assert not sp.held_out_wordings(family)  # a training family asked in a training wording


def test_a_fact_stated_value_first_says_the_same_relation():
    assert value_first_form("The manager of {s} is {v}.") == "{v} is the manager of {s}."
    assert value_first_form("The access codes for {s} are {v}.") == "{v} are the access codes for {s}."
    every = {f.id: f for f in families()}
    fact = draw_fact(every["place/05"], random.Random(4))  # "The manager of {s} is {v}."
    assert put_value_first(fact).sentence == f"{fact.value} is the manager of {fact.subject}."
    opens = every["place/03"]  # "{S} opens every day at {v}.": no value-first form
    assert not can_put_value_first(opens) and put_value_first(draw_fact(opens, random.Random(4))).value_first is False
    with pytest.raises(ValueError, match="cannot be put value first"):
        value_first_form(opens.fact)
    assert not can_put_value_first(every["place/12"])  # a wifi password ("amber") cannot start a sentence


def test_values_of_kinds_that_may_begin_a_sentence_never_begin_with_a_small_letter():
    rng = random.Random(9)
    for kind in {f.value_kind for f in families()} - LOWER_CASE_VALUE_KINDS:
        assert not any(value(kind, rng)[0].islower() for _ in range(200)), kind


def test_the_value_first_set_asks_training_families_about_facts_stated_value_first():
    sp = split()
    samples = held_out_samples([PARAGRAPHS], 60, seed=7, kind="value_first")
    assert sum(s.answer == NOT_FOUND for s in samples) == 0
    for s in samples:
        assert s.held_out == "value_first" and s.framing in HELD_OUT_FRAMINGS
        assert s.fact.startswith(s.answer + " "), s.fact
        family = next(f for f in sp.train_families if f.id == s.family)
        assert can_put_value_first(family) and not sp.held_out_wordings(family)
    assert len({s.family for s in samples}) > 20
