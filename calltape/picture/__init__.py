"""The timeline picture (SPEC section 7): a session's lanes on one time axis, as one HTML page.

Used by ``calltape show --html`` and by ``calltape serve``; built from the context fold only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from calltape.events import Event
from calltape.picture.html import CSP, render_html
from calltape.picture.lanes import LANES, Item, Picture, build_picture

__all__ = ["CSP", "LANES", "Item", "Picture", "build_picture", "render_html", "timeline_html"]


if TYPE_CHECKING:
    from calltape.eventstore import SessionInfo


def timeline_html(events: list[Event], info: SessionInfo | None = None) -> str:
    """The self-contained HTML page of one session's events (in seq order); ``info`` adds the
    session's status, agent, epoch, tenant and event count to the heading."""
    header = {}
    if info is not None:
        header = {
            "status": info.status,
            "agent": info.agent,
            "epoch": info.epoch,
            "tenant": info.tenant,
            "events": info.last_seq,
        }
        if events and (events[-1].seq or 0) < info.last_seq:
            header["upto"] = events[-1].seq
    return render_html(build_picture(events, header))
