"""The one backoff schedule: doubling up to a ceiling, back to the start after a success."""

from __future__ import annotations

from calltape._backoff import Backoff


def test_delays_double_up_to_the_ceiling_and_reset() -> None:
    backoff = Backoff(0.05, 0.3)
    assert [backoff.next() for _ in range(5)] == [0.05, 0.1, 0.2, 0.3, 0.3]
    backoff.reset()
    assert backoff.next() == 0.05
