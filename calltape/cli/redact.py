"""``calltape redact``: rewrite stored sessions under the redaction rules (SPEC section 6)."""

from __future__ import annotations

from typing import Annotated

import typer

from calltape.cli.common import opened_store, out, run, write_json


def redact(
    ctx: typer.Context,
    sessions: Annotated[list[str], typer.Argument(metavar="SESSION", help="The sessions to rewrite.")],
    kinds: Annotated[
        str,
        typer.Option("--kinds", metavar="KINDS", help="Comma-separated: card, email, phone, ssn, or all."),
    ] = "all",
    pattern: Annotated[
        list[str] | None,
        typer.Option("--pattern", metavar="LABEL=REGEX", help="Your own rule (repeatable): spans become [LABEL]."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Counts as JSON.")] = False,
) -> None:
    """Replace card numbers, emails, phone numbers and SSNs in stored sessions with a label, in place.

    Transcripts, user and agent text, what was heard, and tool arguments and outputs are rewritten; the
    session's snapshots are dropped (rebuilt on next use); a session.redacted event records the kinds and
    the number of spans, never the values.
    """
    from calltape.errors import CliError
    from calltape.eventstore.redact_stored import redact_session
    from calltape.redaction import KINDS, Redactor

    patterns: dict[str, str] = {}
    for item in pattern or []:
        label, sep, regex = item.partition("=")
        if not sep or not label or not regex:
            raise CliError("--pattern takes LABEL=REGEX, for example --pattern 'account=ACC-[0-9]{6}'")
        patterns[label] = regex
    names = [k.strip() for k in kinds.split(",") if k.strip()]
    redactor = Redactor(kinds=KINDS if names == ["all"] else tuple(names), patterns=patterns)

    async def rewrite() -> list[dict[str, object]]:
        async with opened_store(ctx) as store:
            for session in sessions:  # every session must exist before any is rewritten
                if await store.session_info(session) is None:
                    from calltape.errors import SessionNotFound

                    raise SessionNotFound(session)
            reports = [await redact_session(store, session, redactor) for session in sessions]
        return [{"session": r.session, "events": r.events, "spans": r.spans} for r in reports]

    reports = run(rewrite())
    if as_json:
        write_json(reports)
        return
    for report in reports:
        spans = report["spans"]
        assert isinstance(spans, dict)
        total = sum(spans.values())
        detail = ", ".join(f"{n} {label}" for label, n in sorted(spans.items())) or "nothing found"
        line = f"{report['session']}: {report['events']} event(s) rewritten, {total} span(s): {detail}"
        out().print(line, markup=False)
