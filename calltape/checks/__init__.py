"""Checking recorded calls against the barge-in rules of SPEC section 7.

``calltape check`` and :func:`calltape.testing.assert_invariants` both run these rules, through
:func:`check_events`; each rule is one function registered under its contract id in :data:`RULES`.
"""

from calltape.checks.context import context_problems
from calltape.checks.facts import SessionFacts, collect
from calltape.checks.rules import RULES, CheckOptions, Rule, Violation, rule
from calltape.checks.runner import (
    CHUNK,
    SessionReport,
    check_events,
    check_facts,
    number_session,
    read_jsonl,
    sweep_parallel,
    sweep_store,
    to_events,
)
from calltape.errors import CheckInputError

__all__ = [
    "CHUNK",
    "RULES",
    "CheckInputError",
    "CheckOptions",
    "Rule",
    "SessionFacts",
    "SessionReport",
    "Violation",
    "check_events",
    "check_facts",
    "collect",
    "context_problems",
    "number_session",
    "read_jsonl",
    "rule",
    "sweep_parallel",
    "sweep_store",
    "to_events",
]
