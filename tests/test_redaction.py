"""Redaction rules (SPEC section 6): cards by Luhn, spoken or written, split across chunks; email, phone,
ssn and the user's own patterns; only shown text is rewritten, ids never."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calltape.events import make_event
from calltape.redaction import RedactionError, Redactor, luhn

CARD = "4242424242424242"
WORDS = {str(i): w for i, w in enumerate("zero one two three four five six seven eight nine".split())}


def spoken(digits: str) -> str:
    return " ".join(WORDS[d] for d in digits)


def card_numbers() -> st.SearchStrategy[str]:
    """Random 13-19 digit numbers made Luhn-valid by their check digit."""

    def complete(body: str) -> str:
        for check in "0123456789":
            if luhn(body + check):
                return body + check
        raise AssertionError

    return st.integers(12, 18).flatmap(lambda n: st.text("0123456789", min_size=n, max_size=n)).map(complete)


@pytest.mark.parametrize(
    "text",
    [
        f"my card is {CARD} thanks",
        "my card is 4242 4242 4242 4242 thanks",
        "my card is 4242-4242-4242-4242.",
        f"my card is {spoken(CARD)} thanks",
        "it's four two four two, four two four two, four two four two, four two four two",
    ],
)
def test_cards_written_or_spoken_are_masked(text: str) -> None:
    redactor = Redactor()
    counts: Counter[str] = Counter()
    out = redactor.text(text, counts)
    assert "[card]" in out
    assert "4242" not in out and "four two four two" not in out
    assert counts["card"] == 1


def test_double_and_triple_are_read_as_repeats() -> None:
    number = "4000000000000002"
    assert luhn(number)
    text = "four triple zero, triple zero zero, zero zero zero zero, zero zero zero two"
    assert Redactor().text(text) == "[card]"


@given(card_numbers(), st.sampled_from([" ", "-", "  ", ", "]), st.integers(2, 5))
@settings(max_examples=200, deadline=None)
def test_any_luhn_number_in_any_grouping_is_masked(number: str, sep: str, group: int) -> None:
    grouped = sep.join(number[i : i + group] for i in range(0, len(number), group))
    for text in (f"card {grouped} ok", f"card {spoken(number)} ok"):
        out = Redactor(kinds=("card",)).text(text)
        assert not any(c.isdigit() for c in out)
        assert out.startswith("card [card]") and out.endswith(" ok")


def test_a_number_that_fails_luhn_is_kept() -> None:
    assert Redactor(kinds=("card",)).text("order 4242424242424241") == "order 4242424242424241"


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("write to jane.doe+calls@example.co.uk please", "email"),
        ("call me on +1 415-555-0123", "phone"),
        ("my number is (415) 555 0123", "phone"),
        ("ssn 123-45-6789", "ssn"),
    ],
)
def test_other_builtin_kinds(text: str, label: str) -> None:
    out = Redactor().text(text)
    assert f"[{label}]" in out
    assert "555" not in out and "6789" not in out and "example" not in out


def test_user_patterns_and_bad_rules() -> None:
    redactor = Redactor(kinds=("card",), patterns={"account": r"ACC-\d{6}"})
    assert redactor.text("account ACC-123456 and card 4242424242424242") == "account [account] and card [card]"
    with pytest.raises(RedactionError, match="unknown redaction kind"):
        Redactor(kinds=("cards",))
    with pytest.raises(RedactionError, match="not a valid regular expression"):
        Redactor(patterns={"x": "("})


def test_only_shown_text_is_rewritten() -> None:
    redactor = Redactor()
    call = make_event(
        "s",
        "tool.call",
        {"call": "4242424242424242", "name": "pay", "arguments": {"card": CARD, "nested": [{"email": "a@b.io"}]}},
    )
    out = redactor.event(call)
    assert out.data["call"] == CARD  # an id, never rewritten
    assert out.data["arguments"] == {"card": "[card]", "nested": [{"email": "[email]"}]}
    result = redactor.event(make_event("s", "tool.result", {"call": "c", "output": f"charged {CARD}"}))
    assert result.data["output"] == "charged [card]"
    untouched = make_event("s", "user.text", {"text": "hello"})
    assert redactor.event(untouched) is untouched


@pytest.mark.parametrize("number", [4242424242424242, 378282246310005, 6011111111111117, -4242424242424242])
def test_a_card_written_as_a_number_is_masked(number: int) -> None:
    """Issue 26 item 10: an integer leaf of 13-19 digits passing Luhn is a card, as its digits in text are."""
    counts: Counter[str] = Counter()
    call = make_event("s", "tool.call", {"call": "c", "name": "pay", "arguments": {"card": number, "cvc": 123}})
    assert Redactor().event(call, counts).data["arguments"] == {"card": "[card]", "cvc": 123}
    assert counts == Counter(card=1)
    result = make_event("s", "tool.result", {"call": "c", "output": number})
    assert Redactor().event(result).data["output"] == "[card]"


@pytest.mark.parametrize("number", [4242424242424241, 424242424242, 1764000000001])
def test_numbers_that_are_not_cards_are_kept(number: int) -> None:
    assert not luhn(str(number)) or not 13 <= len(str(number)) <= 19
    result = make_event("s", "tool.result", {"call": "c", "output": {"n": number, "flag": True}})
    assert Redactor().event(result).data["output"] == {"n": number, "flag": True}
    unwanted = make_event("s", "tool.result", {"call": "c", "output": 4242424242424242})
    assert Redactor(kinds=("email",)).event(unwanted).data["output"] == 4242424242424242


def chunks(*texts: str, final: bool = True) -> list:
    return [make_event("s", "user.transcript", {"text": t, "final": final}) for t in texts]


def test_a_card_split_across_final_chunks_is_masked_on_both_sides() -> None:
    events = [
        make_event("s", "user.speech.started", {}),
        *chunks("my card is four two four two", "four two four two four two four two", "four two four two"),
        make_event("s", "user.speech.stopped", {}),
    ]
    out = Redactor().events(events)
    texts = [e.data["text"] for e in out if e.type == "user.transcript"]
    assert all("four" not in t for t in texts), texts
    assert texts[0] == "my card is [card]"
    assert [e.id for e in out] == [e.id for e in events]  # nothing lost, nothing reordered


def test_a_card_split_across_interim_chunks_is_masked() -> None:
    first = f"my card is {spoken(CARD[:4])}"
    events = [*chunks(first, f"my card is {spoken(CARD)}", final=False), *chunks(f"my card is {spoken(CARD)}")]
    out = Redactor().events(events)
    assert all("four" not in e.data["text"] for e in out), [e.data["text"] for e in out]


def test_digits_that_do_not_become_a_card_are_kept() -> None:
    events = [*chunks("my zip is nine four one one oh"), make_event("s", "agent.reply.started", {"reply": "r"})]
    out = Redactor().events(events)
    assert out[0].data["text"] == "my zip is nine four one one oh"


def test_stream_holds_a_chunk_ending_in_digits_until_the_user_turn_ends() -> None:
    stream = Redactor().stream()
    first, second = chunks("my code is one two three", "four five six")
    assert stream.push(first) == []  # might continue into a card: held
    assert stream.push(make_event("s", "user.speech.stopped", {})) == []  # a pause is not the end of the turn
    assert stream.push(second) == []  # the turn goes on: held with it
    assert stream.holding == 3
    out = stream.push(make_event("s", "agent.reply.started", {"reply": "r"}))  # the turn is over: all out, in order
    assert [e.type for e in out] == ["user.transcript", "user.speech.stopped", "user.transcript", "agent.reply.started"]
    assert [e.data.get("text") for e in out[::2]] == ["my code is one two three", "four five six"]
    assert stream.holding == 0


def test_a_card_read_with_pauses_is_decided_over_the_whole_turn() -> None:
    """Issue 26 item 11: the halves of a card, with the pauses a caller makes between them (and the
    speech-stopped/started events a VAD puts there), are masked on both sides."""
    stream = Redactor().stream()
    out: list = []
    for event in [
        make_event("s", "user.speech.started", {}),
        *chunks("my card is four two four two four two four two"),
        make_event("s", "user.speech.stopped", {}),
        make_event("s", "user.speech.started", {}),
        *chunks("uh hold on", "four two four two four two four two"),
        make_event("s", "user.speech.stopped", {}),
    ]:
        out += stream.push(event)
    assert [e.type for e in out] == ["user.speech.started"]  # nothing of the turn is out before its end
    out += stream.push(make_event("s", "agent.reply.started", {"reply": "r"}))
    texts = [e.data["text"] for e in out if e.type == "user.transcript"]
    assert texts == ["my card is [card]", "uh hold on", "[card]"]


def test_a_turn_let_out_before_it_is_decided_has_its_trailing_digits_masked() -> None:
    stream = Redactor().stream()
    assert stream.push(chunks("my card is four two four two four two four two")[0]) == []
    assert stream.push(chunks("my pin is one two")[0]) == []
    out = stream.release()  # a flush, close, or the turn held past hold_ms: the rest may never come
    assert [e.data["text"] for e in out] == ["my card is [card]", "my pin is one two"]  # under 4 digits: kept
    assert stream.counts["card"] == 1
    rest = stream.push(chunks("four two four two four two four two, thanks")[0])  # the other half, same turn
    assert [e.data["text"] for e in rest] == ["[card], thanks"]
    stream.push(make_event("s", "agent.reply.started", {"reply": "r"}))  # the turn is over
    assert stream.push(chunks("four two four two, thanks")[0])[0].data["text"] == "four two four two, thanks"
    decided = Redactor().events(chunks("my zip is nine four one one oh"))  # the whole input: decided
    assert decided[0].data["text"] == "my zip is nine four one one oh"


def test_stream_masks_both_sides_of_a_seam() -> None:
    stream = Redactor().stream()
    first, second = chunks("card four two four two four two four two", "four two four two four two four two")
    assert stream.push(first) == []
    assert stream.push(second) == []  # joined, the digits are a card: both masked; the turn goes on
    out = stream.push(make_event("s", "agent.reply.started", {"reply": "r"}))
    assert [e.data.get("text") for e in out] == ["card [card]", "[card]", None]
