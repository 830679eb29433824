"""The timeline picture as one self-contained HTML page: inline CSS and script, nothing fetched.

The page opens fitted to the window, with an overview strip of the whole call under the header; the
wheel, a drag, the overview and the keyboard zoom and pan it, and keys step to the next or previous
barge-in, drop, tool call or finding. It draws only what is in view (windowed DOM): per lane row, the
items inside the visible time range, and where several would fall on the same few pixels, one cluster
element standing for them (a click zooms into it). A one-hour call of 50,000 events stays at a few
thousand elements whatever the zoom. Lanes are packed here, in time (no two items of a row overlap in
time), so any zoom keeps items of a row apart; a label is clipped with an ellipsis inside its own bar
(a marker's label runs at most to the next item of its row).

Event content is user data, so every string is HTML-escaped, the items and events ride in a JSON block
whose ``<`` are escaped, the script writes them with ``textContent`` only, and a Content-Security-Policy
lets nothing run but the page's own script (by its hash) and nothing load at all, so a transcript that
reads ``</script>`` or ``<img onerror=…>`` stays text.
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
MAX_ROWS: Final = 12
"""Rows a lane packs into at most; past them, items share the last row (and cluster where they meet)."""
MAX_LABEL: Final = 200
"""Characters of a label carried for the chart (clipped to its bar anyway); the details show the whole text."""

BARGE_IN: Final = ("interruption", "cut")
"""Item kinds drawn as a line across every lane: an interruption that cut a reply, a playout cut."""

_CSS: Final = """
*{box-sizing:border-box}
html,body{margin:0;height:100%}
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1f2430;
background:#fff;display:flex;flex-direction:column;overflow:hidden}
.ct-head{padding:10px 18px 4px;flex:0 0 auto}
.ct-head h1{font-size:18px;margin:0 0 2px;word-break:break-all}
.ct-meta,.ct-latency{margin:0;color:#555c6b}
.ct-latency b{color:#1f2430;font-weight:600}
.ct-legend{list-style:none;margin:6px 0 0;padding:0;display:flex;flex-wrap:wrap;gap:4px 14px;color:#3b4252}
.ct-legend li{display:flex;align-items:center;gap:6px}
.ct-sw{display:inline-block;width:26px;height:12px;border-radius:3px}
.ct-tools{display:flex;flex-wrap:wrap;gap:6px;align-items:center;margin:6px 0 0}
.ct-tools button{font:12px system-ui,sans-serif;padding:2px 8px;border:1px solid #c9ced8;border-radius:4px;
background:#f6f7f9;cursor:pointer}
.ct-tools .ct-keys{color:#6b7280;font-size:12px}
.ct-overview{position:relative;height:44px;margin:6px 18px 4px calc(18px + var(--cap));flex:0 0 auto;
border:1px solid #c9ced8;border-radius:4px;background:#fbfbfc;cursor:pointer}
.ct-overview canvas{position:absolute;left:0;top:0;width:100%;height:100%}
.ct-window{position:absolute;top:-1px;bottom:-1px;border:2px solid #1c7ed6;background:rgba(28,126,214,.10);
border-radius:3px;cursor:grab}
.ct-chart{position:relative;flex:1 1 auto;overflow-y:auto;overflow-x:hidden;user-select:none;cursor:grab;
padding-bottom:4px}
.ct-chart.ct-dragging{cursor:grabbing}
.ct-axis{position:relative;height:24px;border-bottom:1px solid #c9ced8;margin-left:var(--cap);overflow:hidden}
.ct-tick{position:absolute;bottom:0;height:7px;border-left:1px solid #9aa1ae}
.ct-tick span{position:absolute;bottom:8px;left:-30px;width:60px;text-align:center;font-size:11px;color:#6b7280}
.ct-lane{display:flex;border-bottom:1px solid #eceef2}
.ct-caption{flex:0 0 var(--cap);width:var(--cap);margin:0;padding:5px 10px;font-size:12px;font-weight:600;
color:#3b4252;background:#f6f7f9;border-right:1px solid #dfe3ea;z-index:3}
.ct-track{position:relative;flex:1 1 auto;overflow:hidden}
.ct-overlay{position:absolute;top:24px;bottom:0;left:var(--cap);right:0;pointer-events:none;overflow:hidden;z-index:2}
.ct-band{position:absolute;top:0;bottom:0;
background:repeating-linear-gradient(90deg,rgba(224,49,49,.07) 0 6px,rgba(224,49,49,.12) 6px 12px);
border-left:2px solid #e03131;border-right:2px solid #2f9e44}
.ct-bargein{position:absolute;top:0;bottom:0;width:0;border-left:2px dashed #f76707;opacity:.85}
.ct-item{position:absolute;z-index:1;height:20px;cursor:pointer;white-space:nowrap;outline:none;overflow:hidden}
.ct-item:hover,.ct-item:focus-visible{z-index:2}
.ct-item:hover .ct-label,.ct-item:focus-visible .ct-label{text-decoration:underline}
.ct-selected{z-index:2;box-shadow:inset 0 0 0 2px #1f2430}
.ct-span{border-radius:4px;border:1px solid #7b8494;background:#e9ecf1}
.ct-label{position:absolute;left:5px;right:3px;top:1px;font-size:12px;pointer-events:none;overflow:hidden;
text-overflow:ellipsis;white-space:nowrap}
.ct-mark .ct-label{left:15px;right:0}
.ct-dot{position:absolute;left:0;top:4px;width:12px;height:12px;border-radius:50%;background:#7b8494}
.ct-cluster{background:#868e96;border:1px solid #495057;border-radius:2px;font-size:10px;
color:#fff;text-align:center;line-height:18px}
.ct-speech{background:#a5d8ff;border-color:#339af0}
.ct-final .ct-dot{background:#0c8599}.ct-final .ct-label{color:#0b5964;font-weight:600}
.ct-typed .ct-dot{background:#0c8599;border-radius:2px}.ct-typed .ct-label{color:#0b5964;font-weight:600}
.ct-interim .ct-dot{background:#0c8599;width:4px;height:14px;left:4px;top:3px;border-radius:2px;opacity:.6}
.ct-reply{background:transparent;border:0}
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
.ct-effect .ct-dot{background:#5f3dc4;border-radius:2px}.ct-effect .ct-label{color:#5f3dc4;font-weight:600}
.ct-finding .ct-dot{background:#c92a2a;border-radius:2px;transform:rotate(45deg) scale(.8)}
.ct-finding .ct-label{color:#c92a2a;font-weight:700;font-family:ui-monospace,"DejaVu Sans Mono",monospace}
.ct-details{flex:0 0 auto;max-height:32vh;overflow:auto;background:#fbfbfc;border-top:2px solid #c9ced8;
padding:6px 18px}
.ct-details h2{font-size:14px;margin:2px 0 6px;white-space:pre-wrap;word-break:break-word}
.ct-hint{color:#6b7280;margin:4px 0}
.ct-event{margin:0 0 6px;padding:6px 8px;background:#fff;border:1px solid #e3e6eb;border-radius:4px;
font:12px/1.35 ui-monospace,"DejaVu Sans Mono",Menlo,monospace;white-space:pre-wrap;word-break:break-word}
"""

_SCRIPT: Final = """
(() => {
  const data = JSON.parse(document.getElementById("ct-data").textContent);
  const items = data.items, D = Math.max(data.duration, 1);
  const chart = document.getElementById("ct-chart"), axis = document.getElementById("ct-axis");
  const overlay = document.getElementById("ct-overlay"), panel = document.getElementById("ct-details");
  const overview = document.getElementById("ct-overview"), win = document.getElementById("ct-window");
  const tracks = [...document.querySelectorAll(".ct-track")];
  const CELL = 4;  // pixels: items closer than this in a row are drawn as one cluster
  const BIN = 8;  // pixels: a cluster starts no more than this far from its first item (density, not a smear)
  // rows[lane][row] = item indexes in time order; within a row items never overlap in time
  const rows = data.lanes.map(l => Array.from({length: l[2]}, () => []));
  items.forEach((it, i) => rows[it.l][it.r].push(i));
  // the latest end so far along each row (rising), for a binary search of the first item in view
  const ends = rows.map(lane => lane.map(row => {
    let m = -1e18;
    return row.map(i => (m = Math.max(m, end(items[i]))));
  }));
  function end(it) { return it.e === null ? it.s : it.e; }
  const kinds = {
    "b": items.map((it, i) => i).filter(i => data.bargein.includes(items[i].k)),
    "d": items.map((it, i) => i).filter(i => items[i].k === "dropped"),
    "t": items.map((it, i) => i).filter(i => items[i].k === "tool"),
    "f": items.map((it, i) => i).filter(i => items[i].k === "finding"),
  };
  const view = {t0: 0, t1: D};
  let selected = null;

  const width = () => Math.max(tracks[0].clientWidth, 50);
  const scale = () => width() / (view.t1 - view.t0);
  const clampView = () => {
    const span = Math.min(Math.max(view.t1 - view.t0, 20), D * 1.01 + 1);
    const margin = span * 0.005;
    const t0 = Math.max(Math.min(view.t0, D + margin - span), -margin);
    view.t0 = t0; view.t1 = t0 + span;
  };
  const fit = () => { view.t0 = -D * 0.005; view.t1 = D * 1.005; draw(); };
  const zoom = (factor, at) => {
    const t = at === undefined ? (view.t0 + view.t1) / 2 : at;
    view.t0 = t - (t - view.t0) * factor; view.t1 = t + (view.t1 - t) * factor; clampView(); draw();
  };
  const pan = (ms) => { view.t0 += ms; view.t1 += ms; clampView(); draw(); };
  const center = (t, span) => {
    const s = span === undefined ? view.t1 - view.t0 : span;
    view.t0 = t - s / 2; view.t1 = t + s / 2; clampView(); draw();
  };

  const el = (tag, cls) => { const e = document.createElement(tag); if (cls) e.className = cls; return e; };
  const first = (arr, t) => { let lo = 0, hi = arr.length; while (lo < hi) { const m = (lo + hi) >> 1;
    if (arr[m] < t) lo = m + 1; else hi = m; } return lo; };

  function drawItem(i, x, w, nextX) {
    const it = items[i];
    const box = el("div", "ct-item");
    box.dataset.i = String(i);
    box.tabIndex = 0;
    box.setAttribute("role", "button");
    box.setAttribute("aria-label", it.t);
    const label = el("span", "ct-label");
    if (it.e === null) {
      box.classList.add("ct-mark", "ct-" + it.k);
      const room = Math.max(Math.min(nextX - x - 4, 260), 12);
      box.style.left = (x - 6).toFixed(1) + "px";
      box.style.width = room.toFixed(1) + "px";
      box.append(el("span", "ct-dot"));
      label.textContent = it.x;
      label.hidden = room < 20;  // too little room for any text: the details have it
    } else {
      box.classList.add("ct-span", "ct-" + it.k);
      if (it.st) box.classList.add("ct-s-" + it.st);
      if (it.o) box.classList.add("ct-open");
      box.style.left = x.toFixed(1) + "px";
      box.style.width = w.toFixed(1) + "px";
      if (it.k === "reply") {
        const total = it.h.length + it.u.length, part = total ? 100 * it.h.length / total : 100;
        if (part > 0) { const h = el("div", "ct-h"); h.style.width = part.toFixed(1) + "%"; box.append(h); }
        if (part < 100) { const u = el("div", "ct-u"); u.style.width = (100 - part).toFixed(1) + "%"; box.append(u); }
        const ht = el("span", "ct-ht"), ut = el("span", "ct-ut");
        ht.textContent = total ? it.h : "(no text)"; ut.textContent = it.u;
        label.append(ht, ut);
      } else {
        label.textContent = it.x;
      }
      label.hidden = w < 16;
    }
    box.append(label);
    if (i === selected) box.classList.add("ct-selected");
    return box;
  }

  function drawCluster(from, to, count, t0, t1) {
    const box = el("div", "ct-item ct-cluster");
    box.style.left = from.toFixed(1) + "px";
    box.style.width = Math.max(to - from, CELL).toFixed(1) + "px";
    box.dataset.t0 = String(t0); box.dataset.t1 = String(t1);
    box.title = count + " items: click to zoom in";
    box.style.opacity = Math.min(0.3 + Math.log2(count) / 7, 1).toFixed(2);
    if (to - from > 24) box.textContent = String(count);
    return box;
  }

  function draw() {
    const k = scale(), t0 = view.t0, t1 = view.t1, W = width();
    const X = (t) => (t - t0) * k;
    tracks.forEach((track, lane) => {
      const out = [];
      rows[lane].forEach((row, r) => {
        const top = 3 + r * 26;
        let j = first(ends[lane][r], t0 - 1);
        let cl = null;  // the cluster being gathered: [left, right, count, t0, t1]
        let lastRight = -1e9;
        const flush = () => {
          if (!cl) return;
          const c = drawCluster(cl[0], cl[1], cl[2], cl[3], cl[4]);
          c.style.top = top + "px";
          out.push(c);
          cl = null;
        };
        for (; j < row.length; j++) {
          const i = row[j], it = items[i];
          if (it.s > t1) break;
          const x = X(it.s);
          const w = it.e === null ? 12 : Math.max(X(it.e) - x, CELL);
          const left = it.e === null ? x - 6 : x;
          if (left < lastRight + CELL && out.length && (cl || out[out.length - 1].dataset.i !== undefined)) {
            if (!cl) {  // the item drawn last becomes the start of a cluster
              const prev = out.pop();
              const pi = Number(prev.dataset.i), p = items[pi];
              cl = [p.e === null ? X(p.s) - 6 : X(p.s), lastRight, 1, p.s, end(p)];
            } else if (left - cl[0] >= BIN) {  // a cluster stands for one bin: a new one starts here
              flush();
              cl = [left, left + w, 1, it.s, end(it)];
              lastRight = cl[1];
              continue;
            }
            cl[1] = Math.max(cl[1], left + w); cl[2] += 1; cl[4] = Math.max(cl[4], end(it));
            lastRight = cl[1];
            continue;
          }
          flush();
          const next = j + 1 < row.length ? X(items[row[j + 1]].s) : W + 300;
          const box = drawItem(i, x, w, next);
          box.style.top = top + "px";
          out.push(box);
          lastRight = it.e === null ? x + 6 : x + w;  // a marker's label gives way to what follows it
        }
        flush();
      });
      track.replaceChildren(...out);
    });
    const marks = [];
    for (const [s, e] of data.dropped) {
      if (e < t0 || s > t1) continue;
      const band = el("div", "ct-band");
      band.style.left = X(s).toFixed(1) + "px";
      band.style.width = Math.max(X(e) - X(s), 2).toFixed(1) + "px";
      marks.push(band);
    }
    let lastLine = -1e9;
    const lines = [];
    for (const i of kinds.b) {
      const t = items[i].s;
      if (t < t0 || t > t1) continue;
      const x = X(t);
      if (x - lastLine < 10) continue;
      const line = el("div", "ct-bargein");
      line.style.left = x.toFixed(1) + "px";
      lines.push(line);
      lastLine = x;
    }
    if (lines.length > 60) for (const line of lines) line.style.opacity = "0.3";  // many: a texture, not a wall
    marks.push(...lines);
    overlay.replaceChildren(...marks);
    drawAxis(k, t0, t1, X);
    win.style.left = (100 * Math.max(t0, 0) / D).toFixed(2) + "%";
    win.style.width = Math.max(100 * (Math.min(t1, D) - Math.max(t0, 0)) / D, 0.4).toFixed(2) + "%";
  }

  const STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 15000, 30000, 60000,
                 120000, 300000, 600000, 900000, 1800000, 3600000];
  const tick = (ms) => {
    if (ms < 60000) return (ms / 1000).toFixed(3).replace(/0+$/, "").replace(/[.]$/, "") + "s";
    const s = Math.round(ms / 1000), h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60, r = s % 60;
    const mm = h ? String(m).padStart(2, "0") : String(m);
    return (h ? h + ":" : "") + mm + ":" + String(r).padStart(2, "0");
  };
  function drawAxis(k, t0, t1, X) {
    const step = STEPS.find(s => s * k >= 90) || 3600000;
    const out = [];
    for (let t = Math.max(0, Math.ceil(t0 / step) * step); t <= t1; t += step) {
      const d = el("div", "ct-tick"), s = el("span");
      d.style.left = X(t).toFixed(1) + "px";
      s.textContent = tick(t);
      d.append(s);
      out.push(d);
    }
    axis.replaceChildren(...out);
  }

  function drawOverview() {
    const canvas = document.getElementById("ct-ov");
    const w = overview.clientWidth, h = overview.clientHeight;
    canvas.width = w; canvas.height = h;
    const g = canvas.getContext("2d");
    const lanes = data.lanes.length, lh = h / lanes;
    const colors = ["#495057", "#339af0", "#0c8599", "#4263eb", "#2f9e44", "#5f3dc4", "#f76707", "#c92a2a"];
    for (const it of items) {
      g.fillStyle = colors[it.l % colors.length];
      const x = it.s / D * w, x2 = end(it) / D * w;
      g.fillRect(x, it.l * lh + 1, Math.max(x2 - x, 1), Math.max(lh - 2, 1));
    }
    g.fillStyle = "rgba(224,49,49,.25)";
    for (const [s, e] of data.dropped) g.fillRect(s / D * w, 0, Math.max((e - s) / D * w, 2), h);
  }

  const show = (i) => {
    panel.replaceChildren();
    if (i === null) {
      const hint = el("p", "ct-hint");
      hint.textContent = "Hover over or click an item to see its events.";
      panel.append(hint);
      return;
    }
    const item = items[i];
    const head = el("h2");
    head.textContent = item.t;
    panel.append(head);
    for (const seq of item.q) {
      const pre = el("pre", "ct-event");
      pre.dataset.seq = String(seq);
      pre.textContent = JSON.stringify(data.events[String(seq)], null, 2);
      panel.append(pre);
    }
  };
  const select = (i) => {
    selected = i;
    for (const e of document.querySelectorAll(".ct-selected")) e.classList.remove("ct-selected");
    if (i !== null) {
      const box = document.querySelector('.ct-item[data-i="' + i + '"]');
      if (box) { box.classList.add("ct-selected"); box.focus({preventScroll: true}); }
    }
    show(i);
  };
  const step = (key, back) => {
    const list = kinds[key];
    if (!list.length) return;
    const at = selected !== null ? items[selected].s : (back ? view.t1 : view.t0);
    let pick;
    if (back) pick = [...list].reverse().find(i => items[i].s < at || (items[i].s === at && i < (selected ?? -1)));
    else pick = list.find(i => items[i].s > at || (items[i].s === at && i > (selected ?? -1)));
    if (pick === undefined) pick = back ? list[list.length - 1] : list[0];
    const it = items[pick], mid = (it.s + end(it)) / 2;
    let span = Math.max(Math.min(view.t1 - view.t0, 60000), (end(it) - it.s) * 1.6);
    center(mid, span);
    // where it shares its pixels with neighbours (drawn as a cluster), zoom in until it stands alone
    for (let n = 0; n < 12 && !document.querySelector('.ct-item[data-i="' + pick + '"]'); n++) {
      span = Math.max(span / 3, 20);
      center(mid, span);
    }
    select(pick);
  };

  chart.addEventListener("click", (e) => {
    if (moved) return;
    const box = e.target.closest(".ct-item");
    if (!box) return;
    if (box.dataset.t0 !== undefined) {
      const a = Number(box.dataset.t0), b = Number(box.dataset.t1);
      center((a + b) / 2, Math.max((b - a) * 1.3, 20));
      return;
    }
    const i = Number(box.dataset.i);
    select(selected === i ? null : i);
  });
  chart.addEventListener("mouseover", (e) => {
    const box = e.target.closest(".ct-item");
    if (box && box.dataset.i !== undefined) show(Number(box.dataset.i));
  });
  chart.addEventListener("mouseout", (e) => {
    const box = e.target.closest(".ct-item");
    if (box && !box.contains(e.relatedTarget)) show(selected);
  });
  chart.addEventListener("keydown", (e) => {
    const box = e.target.closest && e.target.closest(".ct-item");
    if (box && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); box.click(); }
  });
  chart.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = tracks[0].getBoundingClientRect();
    if (Math.abs(e.deltaX) > Math.abs(e.deltaY) || e.shiftKey) {
      pan((e.deltaX || e.deltaY) / scale());
    } else {
      zoom(Math.exp(e.deltaY * 0.002), view.t0 + (e.clientX - r.left) / scale());
    }
  }, {passive: false});
  let dragFrom = null, moved = false;
  chart.addEventListener("mousedown", (e) => { dragFrom = [e.clientX, view.t0, view.t1]; moved = false; });
  window.addEventListener("mousemove", (e) => {
    if (dragFrom === null) return;
    const dx = e.clientX - dragFrom[0];
    if (Math.abs(dx) > 3) { moved = true; chart.classList.add("ct-dragging"); }
    if (!moved) return;
    const ms = dx / (width() / (dragFrom[2] - dragFrom[1]));
    view.t0 = dragFrom[1] - ms; view.t1 = dragFrom[2] - ms; clampView(); draw();
  });
  window.addEventListener("mouseup", () => {
    dragFrom = null; chart.classList.remove("ct-dragging");
    setTimeout(() => { moved = false; }, 0);
  });
  let ovDrag = false;
  const ovMove = (e) => {
    const r = overview.getBoundingClientRect();
    center((e.clientX - r.left) / r.width * D);
  };
  overview.addEventListener("mousedown", (e) => { ovDrag = true; ovMove(e); e.preventDefault(); });
  window.addEventListener("mousemove", (e) => { if (ovDrag) ovMove(e); });
  window.addEventListener("mouseup", () => { ovDrag = false; });
  document.addEventListener("keydown", (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const key = e.key.toLowerCase();
    if (key in kinds) { step(key, e.shiftKey); e.preventDefault(); return; }
    const span = view.t1 - view.t0;
    if (e.key === "ArrowRight") pan(span * 0.2);
    else if (e.key === "ArrowLeft") pan(-span * 0.2);
    else if (e.key === "+" || e.key === "=" || e.key === "ArrowUp") zoom(0.5);
    else if (e.key === "-" || e.key === "_" || e.key === "ArrowDown") zoom(2);
    else if (e.key === "0" || e.key === "Home") fit();
    else if (e.key === "Escape") select(null);
    else return;
    e.preventDefault();
  });
  for (const b of document.querySelectorAll("[data-nav]")) {
    b.addEventListener("click", () => {
      const [key, dir] = b.dataset.nav.split(":");
      if (key === "fit") fit(); else if (key === "zoom") zoom(dir === "in" ? 0.5 : 2); else step(key, dir === "prev");
    });
  }
  window.addEventListener("resize", () => { drawOverview(); draw(); });
  window.calltape = {view: () => [view.t0, view.t1], duration: D};
  drawOverview();
  fit();
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

_FIGURES: Final = (
    ("user_stopped_to_agent_speech", "response"),
    ("interruption_to_agent_stopped", "talk-over"),
    ("reply_to_first_text", "first text"),
)

_NAV: Final = (
    ("b", "barge-in"),
    ("d", "drop"),
    ("t", "tool call"),
    ("f", "finding"),
)


def render_html(picture: Picture) -> str:
    """The page for ``picture``: one string, no external resource."""
    lane_index = {lane: n for n, (lane, _) in enumerate(LANES)}
    packed = {lane: _pack([i for i in picture.items if i.lane == lane]) for lane, _ in LANES}
    records: list[dict[str, Any]] = []
    lanes: list[tuple[str, str, int]] = []
    for lane, caption in LANES:
        placed = packed[lane]
        rows = max((row for _, row in placed), default=0) + 1
        for item, row in placed:
            records.append(_record(item, lane_index[lane], row))
        lanes.append((lane, caption, rows))
    sections = "".join(
        f'<section class="ct-lane" data-lane="{lane}" style="height:{rows * ROW + 6}px">'
        f'<h2 class="ct-caption">{escape(caption)}</h2>'
        f'<div class="ct-track" style="height:{rows * ROW + 6}px"></div></section>'
        for lane, caption, rows in lanes
    )
    data = orjson.dumps(
        {
            "duration": picture.duration_ms,
            "lanes": lanes,
            "items": records,
            "dropped": picture.dropped,
            "bargein": list(BARGE_IN),
            "events": picture.events,
        },
        option=orjson.OPT_NON_STR_KEYS,
    )
    data = data.replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(b"&", b"\\u0026")
    title = f"calltape · {picture.session}"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head>\n"
        f'<body style="--cap:{LABEL_COLUMN}px">'
        f"{_header(picture)}"
        '<div id="ct-overview" class="ct-overview" title="the whole call: click or drag to move the view">'
        '<canvas id="ct-ov"></canvas><div id="ct-window" class="ct-window"></div></div>'
        f'<div id="ct-chart" class="ct-chart"><div id="ct-axis" class="ct-axis"></div>{sections}'
        '<div id="ct-overlay" class="ct-overlay"></div></div>'
        '<aside id="ct-details" class="ct-details" aria-live="polite"></aside>\n'
        f'<script type="application/json" id="ct-data">{data.decode()}</script>\n'
        f"<script>{_SCRIPT}</script></body></html>\n"
    )


def _record(item: Item, lane: int, row: int) -> dict[str, Any]:
    """One item as the script reads it (short keys: a long call has tens of thousands)."""
    record: dict[str, Any] = {
        "l": lane,
        "r": row,
        "s": item.start_ms,
        "e": max(item.end_ms, item.start_ms) if item.end_ms is not None else None,
        "k": item.kind,
        "t": item.title,
        "x": _shorten(item.label),
        "q": item.seqs,
    }
    if item.status:
        record["st"] = item.status
    if item.open:
        record["o"] = 1
    if item.kind == "reply":
        record["h"], record["u"] = item.heard, item.unheard
    return record


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def _pack(items: list[Item]) -> list[tuple[Item, int]]:
    """Each item on the first row of its lane where it overlaps nothing in time (a marker takes its
    instant): any zoom keeps the items of a row apart (an interim transcript goes under its speech)."""
    ends: list[int] = []
    placed = []
    for item in sorted(items, key=lambda i: (i.start_ms, i.seqs[0])):
        end = item.end_ms if item.end_ms is not None else item.start_ms
        row = next((r for r, last in enumerate(ends) if last < item.start_ms), len(ends))
        if row >= MAX_ROWS:
            row = MAX_ROWS - 1
            ends[row] = max(ends[row], end)
        elif row == len(ends):
            ends.append(end)
        else:
            ends[row] = end
        placed.append((item, row))
    return placed


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
    rules = sorted({f["rule"] for f in picture.findings})
    parts.append(f"{len(picture.findings)} finding(s)" + (f": {', '.join(rules)}" if rules else ""))
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
        ("border-left:2px dashed #f76707;width:2px", "barge-in"),
    ]
    items = "".join(f'<li><span class="ct-sw" style="{style}"></span>{escape(text)}</li>' for style, text in legend)
    nav = "".join(
        f'<button type="button" data-nav="{key}:prev" title="previous {noun} (Shift+{key.upper()})">◀</button>'
        f'<button type="button" data-nav="{key}:next" title="next {noun} ({key.upper()})">{escape(noun)} ▶</button>'
        for key, noun in _NAV
    )
    zoom = (
        '<button type="button" data-nav="zoom:in" title="zoom in (+)">+</button>'
        '<button type="button" data-nav="zoom:out" title="zoom out (-)">-</button>'
        '<button type="button" data-nav="fit:" title="the whole call (0)">fit</button>'
    )
    keys = (
        '<span class="ct-keys">wheel: zoom · drag or ←/→: pan · +/-/0: zoom, fit · '
        "B/D/T/F: next barge-in, drop, tool call, finding (Shift: previous)</span>"
    )
    return (
        f'<header class="ct-head"><h1>{escape(picture.session)}</h1>'
        f'<p class="ct-meta">{escape(" · ".join(parts))}</p>'
        f'<p class="ct-latency">{_latency(picture.latency)}</p>'
        f'<ul class="ct-legend">{items}</ul><div class="ct-tools">{zoom}{nav}{keys}</div></header>'
    )


def _latency(figures: dict[str, Any]) -> str:
    """The call's latency figures, one line: p50/p95 (and count) of each."""
    if not figures:
        return ""
    parts = []
    for figure, noun in _FIGURES:
        f = figures.get(figure) or {}
        if f.get("count"):
            parts.append(f"{noun} <b>p50 {_ms(f['p50'])} · p95 {_ms(f['p95'])}</b> ({f['count']})")
        else:
            parts.append(f"{noun} —")
    for name, f in sorted((figures.get("tool_duration") or {}).items()):
        parts.append(f"{escape(name)} <b>p50 {_ms(f['p50'])}</b> ({f['count']})")
    return "latency: " + " · ".join(parts)


def _ms(ms: int | None) -> str:
    if ms is None:
        return "—"
    return f"{ms}ms" if ms < 1000 else f"{ms / 1000:.1f}s"


def _duration(ms: int) -> str:
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    minutes, seconds = divmod(ms // 1000, 60)
    if minutes >= 60:
        hours, minutes = divmod(minutes, 60)
        return f"{hours}h{minutes:02d}m{seconds:02d}s"
    return f"{minutes}m{seconds:02d}s"
