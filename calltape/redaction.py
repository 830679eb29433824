"""Redaction: sensitive spans in what callers say and tools return, replaced by a label before they are stored.

A card number read aloud arrives as words ("four two four two …"), in groups, and often split across
several transcript chunks of one user turn, so checking each string alone is not enough. Three parts:

* :func:`find_spans` finds the spans of one string: ``card`` (13-19 digits passing the Luhn check, as
  numerals or spoken digit words, in groups separated by spaces, dashes, dots or commas), ``ssn``
  (3-2-4 digit groups), ``phone`` (10-15 digits, ``+`` allowed), ``email``, and the user's own patterns.
* :class:`Redactor` applies them to every string the projection can show: transcripts, user text, agent
  text and ``heard``, instructions, tool arguments and outputs (every string leaf of their JSON, and
  every integer leaf of 13-19 digits passing Luhn: a card number a tool wrote as a number becomes the
  string ``"[card]"``). Ids (``reply``, ``call``, tool names) are never touched.
* :class:`RedactingStream` is the writer's stateful side: it holds back a user chunk that *ends* in digits,
  and the rest of that user turn with it, until the turn is over (the session's first event that is not
  the user speaking: the agent's answer, a tool, the end), then decides over the turn's transcripts as a
  whole, so no part of a card number is written before calltape knows whether it is one, however long
  the caller pauses between the groups.

Nothing here logs or raises with the text it looks at; counts leave, values never do.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from msgspec.structs import replace

from calltape.errors import RedactionError as RedactionError  # re-exported: public here since v0.1
from calltape.events import Event, now_ms

Kind = Literal["card", "email", "phone", "ssn"]
KINDS: tuple[Kind, ...] = ("card", "email", "phone", "ssn")
"""The built-in kinds, all on by default."""

_DIGIT_WORDS = {
    "zero": "0",
    "oh": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
}
_REPEAT_WORDS = {"double": 2, "triple": 3}

# One token of a digit run: numerals, a digit word, or "double"/"triple" before one. Separators between
# tokens: spaces, dashes, dots, commas (how STT writes "4242-4242" or "four, two, four").
_TOKEN = re.compile(
    r"\d+|\b(?:" + "|".join(sorted({*_DIGIT_WORDS, *_REPEAT_WORDS}, key=len, reverse=True)) + r")\b",
    re.IGNORECASE,
)
_SEPARATOR = re.compile(r"[\s\-.,()]*")
_DIGIT_WORD_ALTERNATION = "|".join(sorted({*_DIGIT_WORDS, *_REPEAT_WORDS}, key=len, reverse=True))
_ANY_DIGIT = re.compile(r"\d")
_WORD_SET = frozenset(_DIGIT_WORDS)
_PUNCTUATION_TO_SPACE = str.maketrans(",.-!?;:()", "         ")


def _maybe_sensitive(text: str) -> bool:
    """A cheap first look (C-level scans only): most reply deltas have no digit, no digit word and no
    "@", and need nothing more."""
    if "@" in text or _ANY_DIGIT.search(text) is not None:
        return True
    return not _WORD_SET.isdisjoint(text.lower().translate(_PUNCTUATION_TO_SPACE).split())


_ENDS_IN_DIGIT = re.compile(r"(?:\d|\b(?:" + _DIGIT_WORD_ALTERNATION + r"))[\s\-.,]*$", re.IGNORECASE)
_EMAIL = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+")
_SSN = re.compile(r"(?<![\d-])\d{3}[- ]\d{2}[- ]\d{4}(?![\d-])")


@dataclass(frozen=True, slots=True)
class _Run:
    """A maximal run of digits in a string: each digit with the span of the token it came from."""

    digits: str
    spans: tuple[tuple[int, int], ...]
    start: int
    end: int
    plus: bool


def _runs(text: str) -> list[_Run]:
    runs: list[_Run] = []
    digits: list[str] = []
    spans: list[tuple[int, int]] = []
    start = end = -1
    repeat = 1
    for m in _TOKEN.finditer(text):
        gap = text[end : m.start()] if end >= 0 else ""
        if end >= 0 and _SEPARATOR.fullmatch(gap) is None:
            if digits:
                runs.append(_Run("".join(digits), tuple(spans), start, end, text[max(0, start - 1) : start] in "+("))
            digits, spans, start, repeat = [], [], -1, 1
        word = m.group().lower()
        if word in _REPEAT_WORDS:
            repeat = _REPEAT_WORDS[word]
            if start < 0:
                start = m.start()
            end = m.end()
            continue
        value = _DIGIT_WORDS.get(word, word)
        if start < 0:
            start = m.start()
        for ch in value * repeat:
            digits.append(ch)
            spans.append((m.start(), m.end()))
        repeat = 1
        end = m.end()
    if digits:
        runs.append(_Run("".join(digits), tuple(spans), start, end, text[max(0, start - 1) : start] in "+("))
    return runs


def luhn(digits: str) -> bool:
    """The Luhn checksum every payment card number passes."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def card_windows(digits: str) -> list[tuple[int, int]]:
    """Where card numbers lie in one run of digits: the whole run when it has 13 to 19 digits and passes
    Luhn; in a longer run (a card read together with its expiry or code) every ``[i, j)`` of 13 to 19
    digits that passes. A run of 13-19 digits that fails Luhn is kept: it is not a card number."""
    n = len(digits)
    if n < 13:
        return []
    if n <= 19:
        return [(0, n)] if luhn(digits) else []
    found = []
    for i in range(n - 12):
        for j in range(i + 13, min(n, i + 19) + 1):
            if luhn(digits[i:j]):
                found.append((i, j))
    return found


def find_spans(
    text: str, kinds: Iterable[str] = KINDS, patterns: Mapping[str, re.Pattern[str]] | None = None
) -> list[tuple[int, int, str]]:
    """The sensitive spans of one string as ``(start, end, label)``, without overlaps, in order."""
    wanted = set(kinds)
    spans: list[tuple[int, int, str]] = []
    if not patterns and not _maybe_sensitive(text):
        return spans
    if wanted & {"card", "phone"}:
        for run in _runs(text):
            if "card" in wanted:
                for i, j in card_windows(run.digits):
                    spans.append((run.spans[i][0], run.spans[j - 1][1], "card"))
            if "phone" in wanted and 10 <= len(run.digits) <= 15:
                spans.append((run.start - (1 if run.plus else 0), run.end, "phone"))
    if "ssn" in wanted:
        spans += [(m.start(), m.end(), "ssn") for m in _SSN.finditer(text)]
    if "email" in wanted and "@" in text:
        spans += [(m.start(), m.end(), "email") for m in _EMAIL.finditer(text)]
    for label, pattern in (patterns or {}).items():
        spans += [(m.start(), m.end(), label) for m in pattern.finditer(text) if m.end() > m.start()]
    return _merge(spans)


_PRIORITY = {"card": 0, "ssn": 1, "phone": 2, "email": 3}


def _merge(spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Overlapping spans become one, labelled by the strongest kind (card over ssn over phone …)."""
    spans.sort()
    merged: list[tuple[int, int, str]] = []
    for start, end, label in spans:
        if merged and start < merged[-1][1]:
            s0, e0, l0 = merged[-1]
            best = min((l0, label), key=lambda k: _PRIORITY.get(k, 9))
            merged[-1] = (s0, max(e0, end), best)
        else:
            merged.append((start, end, label))
    return merged


def apply_spans(text: str, spans: Sequence[tuple[int, int, str]]) -> str:
    """``text`` with each span replaced by ``[label]``."""
    out: list[str] = []
    pos = 0
    for start, end, label in spans:
        out.append(text[pos:start])
        out.append(f"[{label}]")
        pos = end
    out.append(text[pos:])
    return "".join(out)


# Which data fields hold text the projection shows. Everything under tool arguments/outputs/state is
# walked to its string leaves; ids and names are never rewritten (nor an effect's key: at most once
# depends on it, and it names the action, as an order id does).
_TEXT_FIELDS: dict[str, tuple[str, ...]] = {
    "user.transcript": ("text",),
    "user.text": ("text",),
    "agent.text": ("text",),
    "agent.speech.progress": ("heard",),
    "agent.speech.ended": ("heard",),
    "interruption": ("heard",),
    "agent.instructions": ("text",),
    "session.started": ("instructions",),
    "agent.handoff": ("instructions",),
    "tool.call": ("arguments",),
    "tool.progress": ("state", "message"),
    "tool.result": ("output",),
    "tool.effect": ("output",),
}
_USER_TEXT = frozenset({"user.transcript", "user.text"})
_USER_TURN = _USER_TEXT | {"user.speech.started", "user.speech.stopped"}
"""The events of a user's turn: a held turn goes on through them (a pause is not its end)."""
UNDECIDED_DIGITS = 4
"""A held chunk let out before its turn was decided has a trailing run of this many digits or more
masked: a card's groups are four digits; fewer reveal too little of one to matter."""
_CARD_LOW, _CARD_HIGH = 10**12, 10**19
"""An integer with 13 to 19 digits (that passes Luhn) is a card number written as a JSON number."""


@dataclass(slots=True)
class Redactor:
    """The rules: which built-in kinds, and the user's own patterns (label → regular expression)."""

    kinds: tuple[str, ...] = KINDS
    patterns: Mapping[str, str] = field(default_factory=dict)
    hold_ms: int = 30_000
    """On write, the longest a user turn that may still be reading a card number is held back before it
    is written anyway, its undecided digits masked (see :class:`RedactingStream`)."""
    _compiled: dict[str, re.Pattern[str]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown:
            raise RedactionError(f"unknown redaction kind '{unknown[0]}' (built-in kinds: {', '.join(KINDS)})")
        for label, pattern in self.patterns.items():
            if not re.fullmatch(r"[A-Za-z0-9_\-]+", label):
                raise RedactionError("a redaction label must be letters, digits, '_' or '-'")
            try:
                self._compiled[label] = re.compile(pattern)
            except re.error:
                raise RedactionError(f"the redaction pattern for '{label}' is not a valid regular expression") from None

    @classmethod
    def parse(cls, spec: str | None) -> Redactor | None:
        """From ``--redact``/``$CALLTAPE_REDACT``: ``card,email`` or ``all``; ``None``/empty for no redaction."""
        if not spec or not spec.strip():
            return None
        names = [k.strip() for k in spec.split(",") if k.strip()]
        return cls(kinds=KINDS if names == ["all"] else tuple(names))

    @property
    def labels(self) -> tuple[str, ...]:
        """Every label this redactor writes."""
        return (*self.kinds, *self._compiled)

    def text(self, text: str, counts: Counter[str] | None = None) -> str:
        """One string, redacted; spans found are added to ``counts``."""
        spans = find_spans(text, self.kinds, self._compiled)
        if not spans:
            return text
        if counts is not None:
            counts.update(label for _, _, label in spans)
        return apply_spans(text, spans)

    def _value(self, value: Any, counts: Counter[str]) -> Any:
        if isinstance(value, str):
            return self.text(value, counts)
        if type(value) is int and _CARD_LOW <= abs(value) < _CARD_HIGH and "card" in self.kinds:
            if luhn(str(abs(value))):  # a card number a tool wrote as a JSON number
                counts["card"] += 1
                return "[card]"
            return value
        if isinstance(value, dict):
            return {k: self._value(v, counts) for k, v in value.items()}
        if isinstance(value, list):
            return [self._value(v, counts) for v in value]
        return value

    def event(self, event: Event, counts: Counter[str] | None = None) -> Event:
        """The event with every shown string redacted (the same object when nothing matched)."""
        fields = _TEXT_FIELDS.get(event.type)
        if not fields:
            return event
        data = event.data
        new: dict[str, Any] | None = None
        found: Counter[str] | None = None
        for name in fields:
            value = data.get(name)
            if value is None:
                continue
            if isinstance(value, str) and not self._compiled and not _maybe_sensitive(value):
                continue  # the common case, decided without building anything
            if found is None:
                found = Counter()
            redacted = self._value(value, found)
            if redacted != value:
                if new is None:
                    new = dict(data)
                new[name] = redacted
        if new is None:
            return event
        if counts is not None and found:
            counts.update(found)
        return replace(event, data=new)

    def stream(self, hold_ms: int | None = None) -> RedactingStream:
        """The writer's side, with per-session memory of a user turn that may still be reading digits."""
        return RedactingStream(self, self.hold_ms if hold_ms is None else hold_ms)

    def events(self, events: Iterable[Event], counts: Counter[str] | None = None) -> list[Event]:
        """A whole batch in order (an import, a rewrite): chunks split across events are found too."""
        stream = self.stream()
        out: list[Event] = []
        for event in events:
            out += stream.push(event)
        out += stream.release(decided=True)  # the whole input is known: nothing more can join a turn
        if counts is not None:
            counts.update(stream.counts)
        return out


@dataclass(slots=True)
class _Held:
    event: Event
    at_ms: int


class RedactingStream:
    """Redacts events in log order, holding back a user turn that may still be reading a card number.

    A card is read in groups, over several chunks, with pauses: "four two four two" … "four two …". A user
    chunk whose text ends in a digit run is held, and every later event of the same user turn is held
    behind it (more transcripts, interim or final, typed text, ``user.speech.started``/``stopped``: a pause
    the VAD calls the end of speech does not end the turn). Each chunk that arrives is joined at its seams
    with the held ones, and digits that join into a card number are masked on both sides. The session's
    first event that is not the user's turn (the agent answering, a tool, an interruption, the end) decides
    the turn: it is let out with everything held, in order. Holding never reorders a session.

    ``release()`` lets held turns out before they are decided (a flush, a durable append of a user event,
    close, or a turn held longer than ``hold_ms``). Such a turn might still have become a card, so every
    held chunk's trailing run of :data:`UNDECIDED_DIGITS` or more digits is masked as ``[card]``, and so is
    the run the turn's next chunk begins with (it may be the other half): no half of a card number
    reaches the database in clear, at the price of a number read just before a flush.
    """

    def __init__(self, redactor: Redactor, hold_ms: int = 30_000) -> None:
        self.redactor = redactor
        self.hold_ms = hold_ms
        self.counts: Counter[str] = Counter()
        self._held: dict[str, list[_Held]] = {}
        self._cut: set[str] = set()
        """Sessions whose turn was let out undecided, still going: the digits a chunk of theirs begins
        with may complete a card whose first part was masked, so they are masked too."""

    @property
    def holding(self) -> int:
        """Events held back, across sessions."""
        return sum(len(h) for h in self._held.values())

    def push(self, event: Event) -> list[Event]:
        """The events ready to write now, in order (possibly none, possibly earlier held ones too)."""
        redacted = self.redactor.event(event, self.counts)
        redacted.redacted = True
        if event.session in self._cut:
            if event.type in _USER_TEXT:
                redacted = self._mask_undecided(redacted, leading=True)
            elif event.type not in _USER_TURN:
                self._cut.discard(event.session)  # the turn is over
        held = self._held.get(event.session)
        if held:
            if event.type in _USER_TEXT:
                redacted = self._mask_seams(held, redacted, _user_text(event))
            if event.type in _USER_TURN:
                held.append(_Held(redacted, now_ms()))  # the turn goes on: decided as a whole at its end
                return []
            out = [h.event for h in held] + [redacted]
            del self._held[event.session]
            return out
        if event.type in _USER_TEXT and "card" in self.redactor.kinds and _ends_in_digits(_user_text(redacted)):
            self._held[event.session] = [_Held(redacted, now_ms())]
            return []
        return [redacted]

    def _mask_seams(self, held: list[_Held], incoming: Event, raw: str) -> Event:
        """Joins the trailing digits of the held chunks and the leading digits of the incoming one; masks
        every digit of them that lies in a Luhn-valid window. Interim transcripts repeat earlier text, so
        a held interim is also masked where its digits reappear inside a card found in the incoming one."""
        pieces: list[tuple[int, _Run]] = []  # (held index, its trailing run)
        for index, h in enumerate(held):
            runs = _runs(_user_text(h.event))
            if runs and runs[-1].end == len(_user_text(h.event).rstrip(" .,-")):
                pieces.append((index, runs[-1]))
        text = _user_text(incoming)
        lead = _runs(text)
        head = lead[0] if lead and not text[: lead[0].start].strip(" .,-") else None
        joined = "".join(run.digits for _, run in pieces) + (head.digits if head else "")
        masks: dict[int, list[tuple[int, int]]] = {}
        offsets: list[tuple[int, _Run, int]] = []
        pos = 0
        for index, run in pieces:
            offsets.append((index, run, pos))
            pos += len(run.digits)
        if head is not None:
            offsets.append((-1, head, pos))
        for i, j in card_windows(joined):
            for index, run, base in offsets:
                lo, hi = max(i, base), min(j, base + len(run.digits))
                if lo < hi:
                    masks.setdefault(index, []).append((run.spans[lo - base][0], run.spans[hi - base - 1][1]))
        # A card found whole in the incoming interim: a held interim's digits inside it are masked too.
        card_digits = [run.digits[i:j] for run in _runs(raw) for i, j in card_windows(run.digits)]
        for index, run in pieces:
            if any(run.digits and run.digits in c for c in card_digits):
                masks.setdefault(index, []).append((run.start, run.end))
        for index, spans in masks.items():
            target = incoming if index == -1 else held[index].event
            new_text = apply_spans(_user_text(target), _merge([(s, e, "card") for s, e in spans]))
            self.counts["card"] += 1
            updated = replace(target, data={**target.data, "text": new_text})
            if index == -1:
                incoming = updated
            else:
                held[index] = _Held(updated, held[index].at_ms)
        return incoming

    def release(
        self, session: str | None = None, *, older_than_ms: int | None = None, decided: bool = False
    ) -> list[Event]:
        """Lets held turns out: of one session, of all, or only those held longer than ``older_than_ms``.
        Unless ``decided`` (nothing more can join them: the end of an import), their undecided trailing
        digits are masked first (see the class)."""
        out: list[Event] = []
        now = now_ms()
        for key in [session] if session is not None else list(self._held):
            held = self._held.get(key)
            if not held:
                continue
            if older_than_ms is not None and now - held[0].at_ms < older_than_ms:
                continue
            out += [h.event if decided else self._mask_undecided(h.event) for h in held]
            del self._held[key]
            if not decided:
                self._cut.add(key)
        return out

    def _mask_undecided(self, event: Event, *, leading: bool = False) -> Event:
        """A chunk of a turn let out before it was decided: its trailing digit run (``leading``: the run
        it begins with, in a chunk that comes after), if long enough to be part of a card number,
        becomes ``[card]``."""
        if event.type not in _USER_TEXT:
            return event
        text = _user_text(event)
        runs = _runs(text)
        if not runs:
            return event
        run = runs[0] if leading else runs[-1]
        at_edge = not text[: run.start].strip(" .,-") if leading else run.end == len(text.rstrip(" .,-"))
        if not at_edge or len(run.digits) < UNDECIDED_DIGITS:
            return event
        self.counts["card"] += 1
        masked = apply_spans(text, [(run.start, run.end, "card")])
        return replace(event, data={**event.data, "text": masked})


def _user_text(event: Event) -> str:
    value = event.data.get("text")
    return value if isinstance(value, str) else ""


def _ends_in_digits(text: str) -> bool:
    return _ENDS_IN_DIGIT.search(text[-24:]) is not None
