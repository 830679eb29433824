"""What an adapter tells the model about a guarded tool call that gave no result."""

from __future__ import annotations

from calltape.runtime.toolspec import ToolOutcome

__all__ = ["outcome_message"]


def outcome_message(outcome: ToolOutcome) -> str:
    """What the model is told for a guarded call that did not complete (its output is not a result)."""
    if outcome.status == "error":
        output = outcome.output
        detail = output.get("error") if isinstance(output, dict) else output
        return str(detail) if detail else "the tool failed"
    if outcome.status == "unknown" and outcome.ran:  # a cancel-policy body cut by the barge-in
        return "the tool call was cancelled by the interruption; whether it took effect is unknown"
    return {
        "timeout": "the tool timed out",
        "cancelled": "the tool call was cancelled",
        "unknown": "the outcome of this tool call is unknown; it was not run again",
    }.get(outcome.status, f"the tool call ended as {outcome.status}")
