"""Redaction's cost on the recorder's hot path: microseconds per event of realistic calls.

    python -m bench.redaction            # about 20 s

The events of 50 generated calls (``bench/workload.py``: interim transcripts, streamed reply deltas,
playout progress, tool calls; its vocabulary is rich in digit words, "four two seven") go through a
:class:`~calltape.redaction.RedactingStream` with every built-in kind on: the time per event is what
redaction adds to ``emit`` (median of 5 repeats). ``card_calls`` repeats it with a card number read aloud
in every user turn, the worst case (every transcript is parsed for digits and held). For scale, the same
run times ``make_event``, which ``emit`` already pays.
"""

from __future__ import annotations

import statistics
import sys
import time

import orjson

from bench.workload import call_timeline
from calltape.events import Event, make_event
from calltape.redaction import Redactor


def _events(card: bool) -> list[Event]:
    events: list[Event] = []
    for seed in range(50):
        for kind, data in call_timeline(seed, 400):
            if card and kind == "user.transcript":
                data = {**data, "text": data["text"] + " four two four two four two four two"}
            events.append(make_event(f"s{seed}", kind, data))
    return events


def _per_event_us(events: list[Event], redactor: Redactor) -> float:
    stream = redactor.stream()
    push = stream.push
    t0 = time.perf_counter()
    for e in events:
        push(e)
    stream.release()
    return (time.perf_counter() - t0) / len(events) * 1e6


def measure(repeats: int = 5) -> dict[str, float]:
    """Microseconds per event that redaction adds to ``emit`` (median of ``repeats``), for ordinary calls
    and for calls with a card number read aloud in every user turn."""
    report: dict[str, float] = {}
    for name, card in (("plain_calls", False), ("card_calls", True)):
        events = _events(card)
        runs = [_per_event_us(events, Redactor()) for _ in range(repeats)]
        report[f"{name}_us_per_event"] = round(statistics.median(runs), 2)
    t0 = time.perf_counter()
    for e in _events(False)[:5000]:
        make_event(e.session, e.type, e.data)
    report["make_event_us_per_event"] = round((time.perf_counter() - t0) / 5000 * 1e6, 2)
    return report


if __name__ == "__main__":
    sys.stdout.write(orjson.dumps(measure(), option=orjson.OPT_INDENT_2).decode() + "\n")
