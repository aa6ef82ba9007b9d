"""Server-rendered SVG: timeline bars, guidance steps and the subgraph. Every text goes through
markupsafe's escape; every link is a plain URL built by the caller."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date, datetime, timezone

from markupsafe import Markup, escape

LABEL_WIDTH = 340
WIDTH = 1100
ROW = 24


def moment(value: date | datetime | None) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return datetime(value.year, value.month, value.day, tzinfo=timezone.utc)


def short(text: str | None, width: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


@dataclass
class Bar:
    label: str
    start: datetime
    end: datetime | None  # None: still holds
    href: str
    title: str
    css: str  # held / past / later
    retired_href: str | None = None
    retired_title: str | None = None
    fact_id: str = ""


class Axis:
    """Maps times onto x between the label column and the right edge."""

    def __init__(self, first: datetime, last: datetime, left: int = LABEL_WIDTH, right: int = WIDTH - 20) -> None:
        span = max((last - first).total_seconds(), 86400.0)
        pad = span * 0.04
        self.first = first.timestamp() - pad
        self.last = last.timestamp() + pad
        self.left, self.right = left, right

    def x(self, when: datetime) -> float:
        return self.left + (when.timestamp() - self.first) / (self.last - self.first) * (self.right - self.left)

    def ticks(self) -> list[tuple[float, str]]:
        start = datetime.fromtimestamp(self.first, timezone.utc)
        end = datetime.fromtimestamp(self.last, timezone.utc)
        months = (end.year - start.year) * 12 + end.month - start.month
        step = 3 if months <= 36 else 12 if months <= 144 else 24
        year, month = start.year, ((start.month - 1) // step) * step + 1 if step < 12 else 1
        out = []
        while True:
            tick = datetime(year, month, 1, tzinfo=timezone.utc)
            if tick > end:
                break
            if tick >= start:
                out.append((self.x(tick), tick.strftime("%Y-%m") if step < 12 else str(year)))
            month += step
            while month > 12:
                month -= 12
                year += 1
        return out


def _grid(axis: Axis, height: int, top: int) -> list[str]:
    parts = []
    for x, label in axis.ticks():
        parts.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{height - 18}"/>')
        parts.append(f'<text class="tick" x="{x:.1f}" y="{height - 4}" text-anchor="middle">{escape(label)}</text>')
    return parts


def timeline(bars: list[Bar], as_of: datetime | None, last_seen: datetime) -> Markup:
    """One row per bar: a label, then a bar from its start to its end (to the edge, faded, while
    it still holds), a mark where a statement retired it, and the as-of line."""
    if not bars:
        return Markup('<p class="empty">No facts about this entity.</p>')
    ends = [b.end for b in bars if b.end] + [last_seen] + ([as_of] if as_of else [])
    axis = Axis(min([b.start for b in bars] + ([as_of] if as_of else [])), max(ends))
    top = 8
    height = top + ROW * len(bars) + 26
    parts = [f'<svg class="timeline" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
             f'role="img" aria-label="facts over time">']
    parts += _grid(axis, height, top)
    for index, bar in enumerate(bars):
        y = top + index * ROW
        x1 = axis.x(bar.start)
        x2 = axis.x(bar.end) if bar.end else axis.right
        parts.append(f'<text class="label" x="{LABEL_WIDTH - 8}" y="{y + 15}" text-anchor="end">'
                     f'{escape(short(bar.label, 46))}</text>')
        open_end = "" if bar.end else " open"
        parts.append(f'<a class="bar {bar.css}{open_end}" href="{escape(bar.href)}" data-fact="{escape(bar.fact_id)}" '
                     f'data-label="{escape(bar.label)}"><title>{escape(bar.title)}</title>'
                     f'<rect x="{x1:.1f}" y="{y + 4}" width="{max(x2 - x1, 4):.1f}" height="{ROW - 8}" rx="3"/></a>')
        if bar.retired_href:
            parts.append(f'<a class="retired" href="{escape(bar.retired_href)}"><title>{escape(bar.retired_title or "")}</title>'
                         f'<path d="M{x2:.1f},{y + 2} l5,{ROW / 2 - 2} l-5,{ROW / 2 - 2} l-5,-{ROW / 2 - 2} z"/></a>')
    if as_of is not None:
        x = min(max(axis.x(as_of), axis.left), axis.right)
        parts.append(f'<line class="asof" x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{height - 18}"/>')
    parts.append("</svg>")
    return Markup("".join(parts))


def steps(points: list[tuple[datetime, float, str]], actual: float | None, as_text) -> Markup:
    """A guidance chain: value against call date as steps (each guidance stands until the next
    call), the reported actual as a dashed line."""
    if not points:
        return Markup("")
    width, height, left, right, top, bottom = 420, 150, 70, 410, 12, 124
    values = [p[1] for p in points] + ([actual] if actual is not None else [])
    low, high = smallest, largest = min(values), max(values)
    if high == low:
        low, high = low - abs(low) * 0.05 - 1e-9, high + abs(high) * 0.05 + 1e-9
    pad = (high - low) * 0.15
    low, high = low - pad, high + pad
    first, last = points[0][0], points[-1][0]
    span = max((last - first).total_seconds(), 1.0)
    end = last.timestamp() + span * 0.25 if len(points) > 1 else last.timestamp() + 86400 * 90

    def x(when: datetime) -> float:
        return left + (when.timestamp() - first.timestamp()) / (end - first.timestamp()) * (right - left)

    def y(value: float) -> float:
        return bottom - (value - low) / (high - low) * (bottom - top)

    parts = [f'<svg class="steps" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-label="guidance by call">',
             f'<line class="axis" x1="{left}" x2="{right}" y1="{bottom}" y2="{bottom}"/>']
    path = []
    for index, (when, value, _) in enumerate(points):
        nxt = x(points[index + 1][0]) if index + 1 < len(points) else right
        path.append(f"{'M' if index == 0 else 'L'}{x(when):.1f},{y(value):.1f} L{nxt:.1f},{y(value):.1f}")
    parts.append(f'<path class="step" d="{" ".join(path)}"/>')
    for when, value, label in points:
        parts.append(f'<circle class="point" cx="{x(when):.1f}" cy="{y(value):.1f}" r="4"><title>{escape(label)}</title></circle>')
        parts.append(f'<text class="tick" x="{x(when):.1f}" y="{bottom + 16}" text-anchor="middle">{when:%Y-%m-%d}</text>')
    if actual is not None:
        parts.append(f'<line class="actual" x1="{left}" x2="{right}" y1="{y(actual):.1f}" y2="{y(actual):.1f}"/>')
        parts.append(f'<text class="actual-label" x="{right}" y="{y(actual) - 4:.1f}" text-anchor="end">actual '
                     f'{escape(as_text(actual))}</text>')
    for value in sorted({smallest, largest}):
        parts.append(f'<text class="tick" x="{left - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{escape(as_text(value))}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


@dataclass
class Node:
    key: str
    label: str
    kind: str  # Person, Organization, Role, Metric, figure, ...
    href: str | None


@dataclass
class Edge:
    source: str
    target: str
    label: str


def subgraph(center: Node, nodes: list[Node], edges: list[Edge]) -> Markup:
    """The entity in the middle, its neighbours on a circle (figures on an outer ring), each edge
    labelled with its predicate and value."""
    width, height = 1300, 860
    cx, cy = width / 2, height / 2
    merged: dict[tuple[str, str], list[str]] = {}
    for edge in edges:  # one line per pair of nodes, its labels joined (an officer's several offices)
        labels = merged.setdefault((edge.source, edge.target), [])
        if edge.label not in labels:
            labels.append(edge.label)
    edges = [Edge(source, target, ", ".join(labels)) for (source, target), labels in merged.items()]
    order = {"person": 0, "role": 1, "organization": 2}
    nodes = sorted(nodes, key=lambda n: (order.get(n.kind.lower(), 3), n.label))
    inner = [n for n in nodes if n.kind != "figure"]
    outer = [n for n in nodes if n.kind == "figure"]
    where = {center.key: (cx, cy)}
    # Two rings (entities, then figures) on ellipses as wide as the labels are long; every other
    # node of a ring sits a little further in, so neighbouring labels do not overlap.
    for ring, (rx, ry), turn in ((inner, (360, 240), 0.0), (outer, (520, 375), 0.5)):
        for index, node in enumerate(ring):
            angle = 2 * math.pi * (index + turn) / max(len(ring), 1) - math.pi / 2
            scale = 1.0 if index % 2 == 0 or len(ring) < 8 else 0.78
            where[node.key] = (cx + rx * scale * math.cos(angle), cy + ry * scale * math.sin(angle))
    parts = [f'<svg class="subgraph" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-label="subgraph">']
    for edge in edges:
        if edge.source not in where or edge.target not in where:
            continue
        (x1, y1), (x2, y2) = where[edge.source], where[edge.target]
        parts.append(f'<line class="edge" x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}"/>')
    for edge in edges:  # labels over every line, near the outer end where the lines are apart
        if edge.source not in where or edge.target not in where:
            continue
        (x1, y1), (x2, y2) = where[edge.source], where[edge.target]
        lx, ly = x1 + (x2 - x1) * 0.62, y1 + (y2 - y1) * 0.62
        parts.append(f'<text class="edge-label" x="{lx:.1f}" y="{ly - 3:.1f}" text-anchor="middle">'
                     f'{escape(short(edge.label, 34))}</text>')
    for node in [center, *nodes]:
        x, y = where[node.key]
        text = escape(short(node.label, 38))
        box = 7.2 * len(short(node.label, 38)) + 16
        kind = "center" if node is center else node.kind.lower()
        shape = (f'<rect x="{x - box / 2:.1f}" y="{y - 13:.1f}" width="{box:.1f}" height="26" rx="13"/>'
                 f'<text x="{x:.1f}" y="{y + 5:.1f}" text-anchor="middle">{text}</text>')
        if node.href:
            parts.append(f'<a class="node {escape(kind)}" href="{escape(node.href)}"><title>{escape(node.label)} '
                         f'({escape(node.kind)})</title>{shape}</a>')
        else:
            parts.append(f'<g class="node {escape(kind)}"><title>{escape(node.label)}</title>{shape}</g>')
    parts.append("</svg>")
    return Markup("".join(parts))
