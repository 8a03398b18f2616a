"""Whether an answer is written in its passages (app/grounding.py), and the app's flag on one that is not."""

from __future__ import annotations

from app.grounding import (
    Passage,
    answer_in_passages,
    answer_items,
    closest_span,
    completed_at_word_end,
    joined_passages,
    without_repeated_items,
)


def _p(text: str, start: int = -1, document: str = "d1") -> Passage:
    return Passage(document, start, start + len(text) if start >= 0 else -1, text)


def test_a_copied_answer_passes_whatever_its_case_spacing_and_outer_punctuation():
    passages = [_p("Tickets for the Hesk regatta cost 8,320 euros.\n\nFiles: src/x"), _p("The key is 'A–7'.")]
    for answer in ("8,320 euros", "8,320 Euros.", "  8,320\neuros ", "\u2018a-7\u2019"):
        assert answer_in_passages(answer, passages), answer
    assert answer_in_passages("", passages)  # nothing claimed


def test_a_value_in_no_passage_is_flagged():
    passages = [_p("The Pellow salad needs 32 minutes in the oven."), _p("Belgian waffles are served at noon.")]
    assert not answer_in_passages("Belgium", passages)
    assert not answer_in_passages("7,160 euros", passages)


def test_a_list_answer_passes_when_each_item_is_found_anywhere():
    assert answer_items("PDF, JSON and PNG.") == ["pdf", "json", "png"]
    assert answer_items("7,160 euros") == ["7,160 euros"]
    passages = [_p("It reads PDF and JSON files."), _p("Pictures are saved as PNG.")]
    assert answer_in_passages("PDF, JSON and PNG", passages)
    assert not answer_in_passages("PDF, JSON and TIFF", passages)


def test_passages_that_follow_each_other_are_read_as_one_text():
    """A value cut by a chunk boundary is found when both chunks are chosen, in any order."""
    first, second = "The inspector is Kofi Far", "ouk, since May."
    passages = [_p(second, 25), _p(first, 0)]
    assert joined_passages(passages) == ["the inspector is kofi farouk, since may."]
    assert answer_in_passages("Kofi Farouk", passages)
    apart = [_p(first, 0), _p(second, 40)]  # not adjacent: a gap of text between them
    assert not answer_in_passages("Kofi Farouk", apart)
    other_document = [_p(first, 0), _p(second, 25, document="d2")]
    assert not answer_in_passages("Kofi Farouk", other_document)


def test_a_garbled_copy_is_the_span_it_was_copying_and_nothing_else_is():
    """A few characters of a long copy wrong: the passage's own span; an answer of another meaning,
    another number or unit, another word count, a short answer or a sentence: no span."""
    passages = [_p("Helgrind is a thread error detector. Pass --zero-before=function to zero costs."),
                _p("The timeout is 100 milliseconds, and CRC-32C is the checksum (see 'ms_print'). "
                   "Call malloc() first. It reads gzip, bzip2 and lzma archives; Windows is supported."),
                _p("Release 12 is enabled by default, with --enable-foo; the maximum size is 100 ms of audio.")]
    assert closest_span("a thread error Silector", passages) == "a thread error detector"
    assert closest_span("--zero-bables=function", passages) == "--zero-before=function"
    assert closest_span("100 millisecnds", passages) == "100 milliseconds"
    assert closest_span("ms_prin", passages) == "ms_print"  # the span's outer quotes and bracket dropped
    assert closest_span("mallocc()", passages) == "malloc()"  # its own brackets kept
    assert closest_span("100 millisecnds", [_p("\uff11\uff10\uff10 milliseconds")]) == "\uff11\uff10\uff10 milliseconds"
    for other in ("1000 milliseconds", "Release 1.2", "CRC-23C", "CRC-32X",  # numbers and what holds digits
                  "100 MB",  # a short word: another unit
                  "gzip, bzip2 and xz", "not supported",  # a word more, a word less, another value
                  "disabled by default", "--disable-foo", "the minimum size",  # opposites
                  "a heap profiler", "CRC-3", ""):  # nothing like it; too short to say what it copied
        assert closest_span(other, passages) is None, other
    sentence = "Helgrind is a thread error detector that finds data races in programs using POSIX threads very well"
    assert closest_span(sentence, passages) is None  # more than MAX_SPAN_WORDS words


def test_a_value_cut_inside_its_last_word_is_completed_as_the_passages_write_it():
    """A decoder that ended the answer a few characters early shows the passage's whole word or
    number; never where the cut text also stands whole, or where the passages complete it two ways."""
    passages = [_p("The Hesk ferry costs 1,840 euros a year."), _p("Staff: Dmitri Dahl, Ravi Ferreira and Caleb Sato.")]
    assert completed_at_word_end("1,84", passages) == "1,840"
    assert completed_at_word_end("Dmitri Dahl, Ravi Ferreira and Caleb S", passages) == \
        "Dmitri Dahl, Ravi Ferreira and Caleb Sato"
    assert completed_at_word_end("caleb  s", passages) == "caleb  sato"  # the answer's own case and spacing kept
    assert completed_at_word_end("COMSP", [_p("Set COMSPEC, or os.path.join works.")]) == "COMSPEC"
    assert completed_at_word_end("os.pa", [_p("Set COMSPEC, or os.path.join works.")]) == "os.path.join"
    for whole in ("1,840", "1,840 euros", "Caleb Sato", "ferry", "1,84."):
        assert completed_at_word_end(whole, passages) == whole, whole
    assert completed_at_word_end("32", [_p("On 32 June it cost 3210 euros.")]) == "32"  # "32" stands whole too
    assert completed_at_word_end("58", [_p("Ports 581 and 589.")]) == "58"  # two completions: which is not known
    assert completed_at_word_end("5", [_p("It holds 50 items.")]) == "5"  # one character: "5" and "50" differ
    # A cut at a word's end is no cut: the separator after it does not join the next word on.
    for answer, passage in (("10", "waits 10-15 seconds"), ("1", "Version 1.5"), ("2024", "on 2024-01-15"),
                            ("64", "a 64-bit build"), ("10", "at 10:30"), ("usr", "in /usr/local/bin"),
                            ("port 80", "port 80.Then")):
        assert completed_at_word_end(answer, [_p(passage)]) == answer, answer
    assert completed_at_word_end("84", passages) == "84"  # not a word's start: not a cut copy of "1,840"
    assert completed_at_word_end("", passages) == ""
    # A number cut where one chunk ends and the next begins.
    assert completed_at_word_end("1,8", [_p("It costs 1,8", 0), _p("40 euros.", 12)]) == "1,840"


def test_a_list_value_given_twice_is_shown_once():
    """A decoder that commits one value into two slots of a list: the value once, in the order
    first given, with the list's own separators; values equal but for case, spacing or outer
    punctuation are one; a number with a comma is one value; a sentence is left as written."""
    assert without_repeated_items("4011687, 2686493, 8689127, 8689127") == "4011687, 2686493, 8689127"
    assert without_repeated_items("6022724, 8164575, 6022724 and 1363390") == "6022724, 8164575 and 1363390"
    assert without_repeated_items("Rye, goat cheese and rye.") == "Rye, goat cheese"
    assert without_repeated_items("a; b; A") == "a; b"
    assert without_repeated_items("7, 8, and 8") == "7, 8"  # the Oxford comma's "and 8" is the value 8
    for unchanged in ("1,840 euros", "PDF, JSON and PNG.", "salt or pepper", "", "x, y, z"):
        assert without_repeated_items(unchanged) == unchanged
    sentence = "The cache, the index and the cache are rebuilt at start, so the first run is slow and so on"
    assert without_repeated_items(sentence) == sentence


def test_the_app_flags_an_answer_its_passages_do_not_hold():
    """What the answer shows (app.service.answer_warning): "not found" as no answer with a
    warning; a made-up value from a copying model flagged, the same from another model not; a
    weak best score warned of."""
    from app.service import UNCONFIRMED_WARNING, Citation, answer_warning

    passage = "Tickets for the Hesk regatta cost 8,320 euros. The Ulla night takes place in Bergen."
    citations = [Citation("d1", "report.pdf", 3, "12", -0.4, passage, char_start=0, char_end=len(passage))]
    assert answer_warning("8,320 euros", citations, -0.4, -1.5, True, "not found") == ("8,320 euros", None)
    assert answer_warning("8,32", citations, -0.4, -1.5, True, "not found") == ("8,320", None)
    assert answer_warning("8,32", citations, -0.4, -1.5, False, "not found") == ("8,32", None)
    shown, warning = answer_warning("Belgium", citations, -0.4, -1.5, True, "not found")
    assert shown == "Belgium" and "none of the chosen passages contains it" in warning
    assert answer_warning("Belgium", citations, -0.4, -1.5, False, "not found") == ("Belgium", None)
    # A garbled copy from a copying model shows as the passage's span, unflagged; not from another model.
    assert answer_warning("the Hesk regata", citations, -0.4, -1.5, True, "not found") == ("the Hesk regatta", None)
    assert answer_warning("the Hesk regata", citations, -0.4, -1.5, False, "not found") == ("the Hesk regata", None)
    shown, warning = answer_warning("Not found.", citations, -0.4, -1.5, True, "not found")
    assert shown == "" and warning.startswith("Not found")
    # A value read twice in a list is shown once.
    assert answer_warning("8,320 euros, Bergen and 8,320 euros", citations, -0.4, -1.5, True, "not found") == \
        ("8,320 euros, Bergen", None)
    # An answer no chosen passage read alone confirmed: not found, and the warning says why.
    assert answer_warning("not found", citations, -0.4, -1.5, True, "not found", unconfirmed=True) == \
        ("", UNCONFIRMED_WARNING) != ("", warning)
    # A model with no abstain answer: "not found" is an answer like any other (here, not in the passage).
    shown, warning = answer_warning("Not found.", citations, -0.4, -1.5, True, None)
    assert shown == "Not found." and "none of the chosen passages" in warning
    shown, warning = answer_warning("Bergen", citations, -2.0, -1.5, True, "not found")
    assert shown == "Bergen" and "may not contain" in warning
