"""The timeline picture as one self-contained HTML page: inline CSS and script, nothing fetched.

Layout is done here, in pixels, so the page needs no layout script: every lane packs its items into
as many rows as it takes for no label to cover another. Event content is user data, so every string
is HTML-escaped, the events ride in a JSON block whose ``<`` are escaped, the script writes them with
``textContent`` only, and a Content-Security-Policy lets nothing run but the page's own script (by its
hash) and nothing load at all, so a transcript that reads ``</script>`` or ``<img onerror=…>`` stays text.
"""

from __future__ import annotations

import base64
import hashlib
from html import escape
from typing import Any, Final

import orjson

from calltape.events import format_time
from calltape.picture.lanes import LANES, Item, Picture

LABEL_COLUMN: Final = 150
"""Width of the lane captions, pixels."""
ROW: Final = 26
"""Height of one row of a lane, pixels."""
CHAR: Final = 7.0
"""Estimated width of one label character (12px sans-serif), pixels; generous, so labels never overlap."""
MAX_LABEL: Final = 64
"""Characters of a label drawn on the chart; the details show the whole text."""
GAP: Final = 8
MIN_SPAN: Final = 6
DOT: Final = 12

_CSS: Final = """
*{box-sizing:border-box}
body{margin:0;font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1f2430;
background:#fff;padding-bottom:42vh}
.ct-head{padding:14px 18px 6px}
.ct-head h1{font-size:18px;margin:0 0 2px;word-break:break-all}
.ct-meta{margin:0;color:#555c6b}
.ct-legend{list-style:none;margin:8px 0 0;padding:0;display:flex;flex-wrap:wrap;gap:6px 16px;color:#3b4252}
.ct-legend li{display:flex;align-items:center;gap:6px}
.ct-sw{display:inline-block;width:26px;height:12px;border-radius:3px}
.ct-scroll{overflow-x:auto;padding:0 0 8px}
.ct-chart{position:relative}
.ct-axis{position:relative;height:24px;border-bottom:1px solid #c9ced8;margin-left:var(--cap)}
.ct-tick{position:absolute;bottom:0;height:7px;border-left:1px solid #9aa1ae}
.ct-tick span{position:absolute;bottom:8px;left:-30px;width:60px;text-align:center;font-size:11px;color:#6b7280}
.ct-lane{display:flex;border-bottom:1px solid #eceef2}
.ct-caption{position:sticky;left:0;z-index:3;flex:0 0 var(--cap);width:var(--cap);margin:0;padding:5px 10px;
font-size:12px;font-weight:600;color:#3b4252;background:#f6f7f9;border-right:1px solid #dfe3ea}
.ct-track{position:relative;flex:0 0 auto}
.ct-band{position:absolute;top:24px;bottom:0;z-index:0;pointer-events:none;
background:repeating-linear-gradient(90deg,rgba(224,49,49,.07) 0 6px,rgba(224,49,49,.12) 6px 12px);
border-left:2px solid #e03131;border-right:2px solid #2f9e44}
.ct-item{position:absolute;z-index:1;height:20px;cursor:pointer;white-space:nowrap;outline:none}
.ct-item:hover,.ct-item:focus-visible{z-index:2}
.ct-item:hover .ct-label,.ct-item:focus-visible .ct-label{text-decoration:underline}
.ct-selected{z-index:2;box-shadow:0 0 0 2px #1f2430}
.ct-span{border-radius:4px;border:1px solid #7b8494;background:#e9ecf1}
.ct-label{position:absolute;left:5px;top:1px;font-size:12px;pointer-events:none}
.ct-mark .ct-label{left:16px}
.ct-dot{position:absolute;left:0;top:4px;width:12px;height:12px;border-radius:50%;background:#7b8494}
.ct-speech{background:#a5d8ff;border-color:#339af0}
.ct-final .ct-dot{background:#0c8599}.ct-final .ct-label{color:#0b5964;font-weight:600}
.ct-typed .ct-dot{background:#0c8599;border-radius:2px}.ct-typed .ct-label{color:#0b5964;font-weight:600}
.ct-interim{width:12px}
.ct-interim .ct-dot{background:#0c8599;width:4px;height:14px;left:4px;top:3px;border-radius:2px;opacity:.6}
.ct-reply{background:transparent;border:0;overflow:visible}
.ct-reply .ct-h,.ct-reply .ct-u{position:absolute;top:0;bottom:0}
.ct-h{left:0;background:#bac8ff;border:1px solid #4263eb;border-radius:4px 0 0 4px}
.ct-u{right:0;background:repeating-linear-gradient(135deg,#fff 0 4px,#dbe4ff 4px 8px);
border:1px dashed #748ffc;border-radius:0 4px 4px 0}
.ct-s-heard .ct-h{border-radius:4px}
.ct-s-unheard .ct-u{border-radius:4px}
.ct-reply .ct-label{color:#1f2430}
.ct-ht{font-weight:600;color:#1b2a6b}
.ct-ut{font-style:italic;color:#6b7280;text-decoration:line-through;text-decoration-color:#adb5bd}
.ct-tool .ct-label{font-weight:600}
.ct-s-completed{background:#d3f9d8;border-color:#2f9e44}
.ct-s-error,.ct-s-timeout{background:#ffe3e3;border-color:#e03131}
.ct-s-unknown{background:#ffe8cc;border-color:#e8590c;border-width:2px}
.ct-s-cancelled{background:#fff3bf;border-color:#f08c00}
.ct-s-in_progress{background:#d0ebff;border-color:#1c7ed6}
.ct-s-excluded{background:repeating-linear-gradient(135deg,#fff 0 4px,#e9ecef 4px 8px);border:1px dashed #868e96}
.ct-s-excluded .ct-label{color:#868e96;font-style:italic}
.ct-effect .ct-label{font-weight:600}
.ct-effect.ct-s-done{background:#d3f9d8;border-color:#2f9e44}
.ct-effect.ct-s-failed{background:#ffe3e3;border-color:#e03131}
.ct-effect.ct-s-started{background:#d0ebff;border-color:#1c7ed6}
.ct-open{border-right-style:dashed;border-top-right-radius:0;border-bottom-right-radius:0}
.ct-interruption .ct-dot,.ct-cut .ct-dot{background:#f76707}
.ct-interruption .ct-label,.ct-cut .ct-label{color:#d9480f;font-weight:600}
.ct-ignored .ct-dot{background:#ced4da}.ct-ignored .ct-label{color:#868e96}
.ct-started .ct-dot,.ct-ended .ct-dot{background:#495057}
.ct-dropped .ct-dot{background:#e03131}.ct-dropped .ct-label{color:#c92a2a;font-weight:700}
.ct-resumed .ct-dot{background:#2f9e44}.ct-resumed .ct-label{color:#2b8a3e;font-weight:700}
.ct-handoff .ct-dot{background:#ae3ec9}.ct-handoff .ct-label{color:#862e9c;font-weight:700}
.ct-instructions .ct-dot{background:#be4bdb}
.ct-redacted .ct-dot{background:#212529}
.ct-details{position:fixed;left:0;right:0;bottom:0;max-height:40vh;overflow:auto;z-index:5;
background:#fbfbfc;border-top:2px solid #c9ced8;padding:8px 18px;box-shadow:0 -2px 8px rgba(0,0,0,.06)}
.ct-details h2{font-size:14px;margin:2px 0 6px;white-space:pre-wrap;word-break:break-word}
.ct-hint{color:#6b7280;margin:4px 0}
.ct-event{margin:0 0 6px;padding:6px 8px;background:#fff;border:1px solid #e3e6eb;border-radius:4px;
font:12px/1.35 ui-monospace,"DejaVu Sans Mono",Menlo,monospace;white-space:pre-wrap;word-break:break-word}
"""

_SCRIPT: Final = """
(() => {
  const data = JSON.parse(document.getElementById("ct-data").textContent);
  const panel = document.getElementById("ct-details");
  let selected = null;
  const show = (i) => {
    panel.replaceChildren();
    if (i === null) {
      const hint = document.createElement("p");
      hint.className = "ct-hint";
      hint.textContent = "Hover over or click an item to see its events.";
      panel.append(hint);
      return;
    }
    const item = data.items[i];
    const head = document.createElement("h2");
    head.textContent = item.title;
    panel.append(head);
    for (const seq of item.seqs) {
      const pre = document.createElement("pre");
      pre.className = "ct-event";
      pre.dataset.seq = String(seq);
      pre.textContent = JSON.stringify(data.events[String(seq)], null, 2);
      panel.append(pre);
    }
  };
  const pick = (el) => {
    if (selected) selected.classList.remove("ct-selected");
    selected = el === selected ? null : el;
    if (selected) selected.classList.add("ct-selected");
    show(selected ? Number(selected.dataset.i) : null);
  };
  for (const el of document.querySelectorAll(".ct-item")) {
    el.addEventListener("click", () => pick(el));
    el.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); pick(el); }
    });
    el.addEventListener("mouseenter", () => show(Number(el.dataset.i)));
    el.addEventListener("mouseleave", () => show(selected ? Number(selected.dataset.i) : null));
  }
  show(null);
})();
"""

_SCRIPT_HASH: Final = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()

CSP: Final = (
    "default-src 'none'; "
    f"script-src 'sha256-{_SCRIPT_HASH}'; "
    "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
)
"""Nothing loads from anywhere and only the page's own script runs (also sent as a header when served)."""

_TICKS: Final = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 15_000, 30_000, 60_000)


def render_html(picture: Picture) -> str:
    """The page for ``picture``: one string, no external resource."""
    scale = _scale(picture.duration_ms)
    packed = [(lane, caption, _pack([i for i in picture.items if i.lane == lane], scale)) for lane, caption in LANES]
    rightmost = max((_extent(item, scale)[1] for _, _, placed in packed for item, _ in placed), default=0.0)
    width = int(max(picture.duration_ms * scale + 60, rightmost + 24))  # room for the last labels
    lanes, records = [], []
    for lane, caption, placed in packed:
        rows = max((row for _, row in placed), default=0) + 1
        html = []
        for item, row in placed:
            records.append({"title": item.title, "seqs": item.seqs})
            html.append(_item_html(item, len(records) - 1, row, scale))
        lanes.append(
            f'<section class="ct-lane" data-lane="{lane}" style="height:{rows * ROW + 6}px">'
            f'<h2 class="ct-caption">{escape(caption)}</h2>'
            f'<div class="ct-track" style="width:{width}px;height:{rows * ROW + 6}px">{"".join(html)}</div></section>'
        )
    bands = "".join(
        f'<div class="ct-band" style="left:{LABEL_COLUMN + start * scale:.1f}px;'
        f'width:{max((end - start) * scale, 2):.1f}px"></div>'
        for start, end in picture.dropped
    )
    data = orjson.dumps({"items": records, "events": picture.events}, option=orjson.OPT_NON_STR_KEYS)
    data = data.replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(b"&", b"\\u0026")
    title = f"calltape · {picture.session}"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head>\n<body>"
        f"{_header(picture)}"
        f'<div class="ct-scroll"><div class="ct-chart" style="--cap:{LABEL_COLUMN}px;width:{LABEL_COLUMN + width}px">'
        f"{_axis(picture.duration_ms, scale, width)}{''.join(lanes)}{bands}</div></div>"
        '<aside id="ct-details" class="ct-details" aria-live="polite"></aside>\n'
        f'<script type="application/json" id="ct-data">{data.decode()}</script>\n'
        f"<script>{_SCRIPT}</script></body></html>\n"
    )


def _scale(duration_ms: int) -> float:
    """Pixels per millisecond: a short call fills about 1,100 px, a long one gets 40 px a second."""
    return max(1100 / max(duration_ms, 1), 0.04) if duration_ms < 750_000 else 30_000 / duration_ms


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def _label_px(text: str) -> float:
    return len(text) * CHAR + 10 if text else 0


def _extent(item: Item, scale: float) -> tuple[float, float]:
    """Left and right edge, pixels, of everything the item draws (its label included)."""
    x = item.start_ms * scale
    if item.end_ms is None:
        label = _shorten(item.label)
        return x - DOT / 2, x + DOT / 2 + (6 + _label_px(label) if label else 0)
    width = max((item.end_ms - item.start_ms) * scale, MIN_SPAN)
    text = _shorten(item.heard + item.unheard) if item.kind == "reply" else _shorten(item.label)
    return x, x + max(width, _label_px(text))


def _pack(items: list[Item], scale: float) -> list[tuple[Item, int]]:
    """Each item on the first row of its lane where it covers nothing already drawn."""
    ends: list[float] = []
    placed = []
    for item in sorted(items, key=lambda i: (i.start_ms, i.seqs[0])):
        if item.kind == "interim":  # a thin tick over the speech it came from
            placed.append((item, 0))
            continue
        left, right = _extent(item, scale)
        row = next((r for r, end in enumerate(ends) if end + GAP <= left), len(ends))
        if row == len(ends):
            ends.append(right)
        else:
            ends[row] = right
        placed.append((item, row))
    return placed


def _item_html(item: Item, index: int, row: int, scale: float) -> str:
    x = item.start_ms * scale
    top = 3 + row * ROW
    status = f" ct-s-{escape(item.status)}" if item.status else ""
    common = f'data-i="{index}" tabindex="0" role="button" aria-label="{escape(item.title)}"'
    if item.end_ms is None:
        left, right = _extent(item, scale)
        return (
            f'<div class="ct-item ct-mark ct-{item.kind}" {common} '
            f'style="left:{left:.1f}px;top:{top}px;width:{right - left:.1f}px">'
            f'<span class="ct-dot"></span><span class="ct-label">{escape(_shorten(item.label))}</span></div>'
        )
    width = max((item.end_ms - item.start_ms) * scale, MIN_SPAN)
    opened = " ct-open" if item.open else ""
    style = f'style="left:{x:.1f}px;top:{top}px;width:{width:.1f}px"'
    if item.kind != "reply":
        return (
            f'<div class="ct-item ct-span ct-{item.kind}{status}{opened}" {common} {style}>'
            f'<span class="ct-label">{escape(_shorten(item.label))}</span></div>'
        )
    total = len(item.heard) + len(item.unheard)
    heard_part = 100.0 if total == 0 else 100.0 * len(item.heard) / total
    text = _shorten(item.heard + item.unheard)
    heard_text = text[: len(item.heard)]
    unheard_text = text[len(item.heard) :]
    if total == 0:
        heard_text = "(no text)"
    bars = ""
    if heard_part > 0:
        bars += f'<div class="ct-h" style="width:{heard_part:.1f}%"></div>'
    if heard_part < 100:
        bars += f'<div class="ct-u" style="width:{100 - heard_part:.1f}%"></div>'
    return (
        f'<div class="ct-item ct-span ct-reply{status}{opened}" {common} {style}>{bars}'
        f'<span class="ct-label"><span class="ct-ht">{escape(heard_text)}</span>'
        f'<span class="ct-ut">{escape(unheard_text)}</span></span></div>'
    )


def _axis(duration_ms: int, scale: float, width: int) -> str:
    step = next((s for s in _TICKS if s * scale >= 80), 60_000 * max(1, int(80 / scale / 60_000) + 1))
    ticks = []
    t = 0
    while t * scale <= width - 40:
        ticks.append(f'<div class="ct-tick" style="left:{t * scale:.1f}px"><span>{_tick(t)}</span></div>')
        t += step
    return f'<div class="ct-axis" style="width:{width}px">{"".join(ticks)}</div>'


def _tick(ms: int) -> str:
    if ms < 60_000:
        seconds = f"{ms / 1000:.3f}".rstrip("0").rstrip(".")
        return f"{seconds}s"
    minutes, rest = divmod(ms // 1000, 60)
    return f"{minutes}:{rest:02d}"


def _header(picture: Picture) -> str:
    h: dict[str, Any] = picture.header
    parts = [str(h[k]) for k in ("status",) if h.get(k)]
    for key, noun in (("agent", "agent"), ("epoch", "epoch"), ("tenant", "tenant")):
        if h.get(key) is not None:
            parts.append(f"{noun} {h[key]}")
    if h.get("events") is not None:
        parts.append(f"{h['events']} events")
    if h.get("upto") is not None:
        parts.append(f"shown up to seq {h['upto']}")
    parts.append(f"started {format_time(picture.first_at_ms)}")
    parts.append(f"lasted {_duration(picture.duration_ms)}")
    legend = [
        ("background:#a5d8ff;border:1px solid #339af0", "user speaking"),
        ("background:#bac8ff;border:1px solid #4263eb", "reply text heard"),
        (
            "background:repeating-linear-gradient(135deg,#fff 0 4px,#dbe4ff 4px 8px);border:1px dashed #748ffc",
            "generated, not heard",
        ),
        ("background:#d3f9d8;border:1px solid #2f9e44", "tool completed, effect done"),
        ("background:#ffe8cc;border:2px solid #e8590c", "outcome unknown"),
        ("background:#fff3bf;border:1px solid #f08c00", "cancelled"),
        ("background:#ffe3e3;border:1px solid #e03131", "error / timeout, effect failed"),
        ("background:rgba(224,49,49,.15);border-left:2px solid #e03131", "dropped"),
    ]
    items = "".join(f'<li><span class="ct-sw" style="{style}"></span>{escape(text)}</li>' for style, text in legend)
    return (
        f'<header class="ct-head"><h1>{escape(picture.session)}</h1>'
        f'<p class="ct-meta">{escape(" · ".join(parts))}</p><ul class="ct-legend">{items}</ul></header>'
    )


def _duration(ms: int) -> str:
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    minutes, seconds = divmod(ms // 1000, 60)
    return f"{minutes}m{seconds:02d}s"
