"""Pictures of a published graph, and an export: an entity's timeline and neighbourhood as PNGs,
the whole graph as GraphML, and a chart of facts and retirements per quarter.

    from tkg.answer.query import Graph
    from tkg.answer.pictures import timeline_png
    with Graph.open() as graph:
        match, entries, _ = graph.timeline("Robert H. Swan")
        timeline_png(match, entries, Path("swan.png"))

Everything draws on matplotlib `Figure` objects with the Agg canvas: no window, no pyplot state
left behind, no network (the fonts are matplotlib's bundled DejaVu). The queries are read-only and
parameterised, like the query layer's.
"""

from __future__ import annotations

import io
import sys
import textwrap
from collections import defaultdict
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import matplotlib

if "matplotlib.pyplot" not in sys.modules:  # networkx draws through pyplot: never an interactive backend
    matplotlib.use("Agg")

import duckdb  # noqa: E402
import matplotlib.dates as mdates  # noqa: E402
import networkx as nx  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from tkg.answer.query import EntityMatch, Graph, TimelineEntry, utc  # noqa: E402

MAX_BARS = 60
"""A timeline draws at most this many bars (the most recent ones) so each stays readable."""

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# one colour per predicate of the vocabulary, stable across pictures; others get the rest of tab20
_PREDICATE_COLOURS = {
    "HOLDS_ROLE": "#1f77b4", "HAS_REVENUE": "#2ca02c", "TARGETS": "#ff7f0e", "INCREASED": "#17becf",
    "DECREASED": "#d62728", "LAUNCHED": "#9467bd", "INVESTS_IN": "#8c564b", "COLLABORATES_WITH": "#e377c2",
}
_SPARE_COLOURS = ["#7f7f7f", "#bcbd22", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94"]
_TYPE_COLOURS = {"Person": "#9ecae1", "Office": "#c6dbef", "Organization": "#fdae6b", "Product": "#a1d99b", "Metric": "#dadaeb"}


def _colour(predicate: str, spare: dict[str, str]) -> str:
    if predicate in _PREDICATE_COLOURS:
        return _PREDICATE_COLOURS[predicate]
    if predicate not in spare:
        spare[predicate] = _SPARE_COLOURS[len(spare) % len(_SPARE_COLOURS)]
    return spare[predicate]


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: Path | io.BytesIO, dpi: int) -> None:
    figure.savefig(path, format="png", dpi=dpi, bbox_inches="tight")


def _moment(value: date | datetime | None) -> datetime | None:
    return utc(value) if value is not None else None


def _short(text: str | None, width: int) -> str:
    return textwrap.shorten(" ".join(str(text or "").split()), width=width, placeholder="…") if text else ""


# --- timeline ----------------------------------------------------------------------------------


def _bar_label(entry: TimelineEntry, match: EntityMatch) -> str:
    """What the bar says: the other end of the fact (the object, or the subject when the entity is
    the object) and its value."""
    other = entry.object if entry.subject == match.name else entry.subject
    if entry.object and entry.subject != match.name and entry.object != match.name:
        other = f"{entry.subject} → {entry.object}"  # an office held at the entity, say
    label = _short(other, 48)
    if entry.value and entry.value != other:
        label = f"{label} = {_short(entry.value, 24)}" if label else _short(entry.value, 24)
    return label or entry.predicate


def timeline_figure(match: EntityMatch, entries: list[TimelineEntry], max_bars: int = MAX_BARS) -> tuple[Figure, int]:
    """The timeline figure and the number of bars on it (see `timeline_png`)."""
    if not entries:
        raise ValueError(f"{match.name!r} has no facts to draw a timeline of (no entries were given)")
    if max_bars < 1:
        raise ValueError(f"max_bars must be at least 1, got {max_bars}")
    ordered = sorted(entries, key=lambda e: (_moment(e.began_at) or datetime.min.replace(tzinfo=timezone.utc),
                                             e.predicate, e.subject, e.object or ""))
    shown = ordered[-max_bars:]  # the most recent ones
    # open periods run to the latest date the entries know of
    known = [m for e in ordered for m in (_moment(e.began_at), _moment(e.last_restated_on), _moment(e.ended_at)) if m]
    horizon = max(known)
    first = min(_moment(e.began_at) or horizon for e in shown)
    span = max(horizon - first, timedelta(days=30))
    least = span / 150  # a fact that began and ended (or was last seen) the same day still shows

    figure = _figure(12, 1.6 + 0.32 * len(shown))
    axes = figure.add_subplot()
    spare: dict[str, str] = {}
    rows: dict[str, list[tuple[int, datetime, datetime, bool]]] = defaultdict(list)
    retirements: list[tuple[datetime, int]] = []
    for position, entry in enumerate(shown):
        start = _moment(entry.began_at) or horizon
        end = _moment(entry.ended_at)
        is_open = end is None
        finish = horizon if is_open else end
        if finish - start < least:
            finish = start + least
        rows[entry.predicate].append((position, start, finish, is_open))
        if entry.retired_by and end is not None:
            retirements.append((end, position))

    for predicate, bars in sorted(rows.items()):
        colour = _colour(predicate, spare)
        positions = [b[0] for b in bars]
        lefts = [mdates.date2num(b[1]) for b in bars]
        widths = [mdates.date2num(b[2]) - mdates.date2num(b[1]) for b in bars]
        container = axes.barh(positions, widths, left=lefts, height=0.6, color=colour, edgecolor=colour,
                              label=predicate)
        for patch, bar in zip(container.patches, bars):
            if bar[3]:  # still holds: faded and hatched, no closing edge
                patch.set_alpha(0.45)
                patch.set_hatch("///")
    if retirements:
        axes.plot([mdates.date2num(moment) for moment, _ in retirements], [position for _, position in retirements],
                  linestyle="none", marker="X", markersize=9, color="black", zorder=5)

    axes.set_yticks(range(len(shown)), [_bar_label(e, match) for e in shown], fontsize=8)
    axes.set_ylim(len(shown) - 0.4, -0.6)  # oldest at the top
    axes.xaxis_date()
    axes.xaxis.set_major_formatter(mdates.ConciseDateFormatter(axes.xaxis.get_major_locator()))
    axes.grid(axis="x", linestyle=":", alpha=0.6)
    axes.axvline(mdates.date2num(horizon), color="grey", linewidth=0.8, linestyle="--")
    pad = (horizon - first) / 40 + timedelta(days=1)
    axes.set_xlim(mdates.date2num(first - pad), mdates.date2num(horizon + pad))

    handles = [Patch(facecolor=_colour(p, spare), label=p) for p in sorted(rows)]
    handles.append(Patch(facecolor="white", edgecolor="grey", hatch="///", label=f"still holds (to {horizon:%Y-%m-%d})"))
    if retirements:
        handles.append(Line2D([], [], linestyle="none", marker="X", color="black", label="retired by a later statement"))
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    count = f"the latest {len(shown)} of {len(entries)} facts" if len(shown) < len(entries) else f"{len(shown)} facts"
    axes.set_title(f"{match.name} ({match.type}): {count}", fontsize=11, loc="left")
    return figure, len(shown)


def timeline_png(match: EntityMatch, entries: list[TimelineEntry], path: Path, dpi: int = 100) -> int:
    """A PNG of an entity's timeline (`Graph.timeline`): one horizontal bar per entry from
    `began_at` to `ended_at`, coloured by predicate, labelled with the object and value. Bars of
    facts that still hold run to the latest date the entries know of, faded and hatched; a black
    X marks where a later statement retired a fact. At most MAX_BARS bars, the most recent (the
    title says so). Returns the number of bars drawn; ValueError when there are no entries."""
    figure, bars = timeline_figure(match, entries)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _save(figure, path, dpi)
    return bars


# --- neighbourhood -----------------------------------------------------------------------------


def _valid_at(as_of: Any) -> datetime | None:
    """As in the query layer: a date means its last moment, and a fact is valid at a moment when
    it began (valid_at, else its call date) at or before it and was not yet invalid."""
    return utc(as_of, end_of_day=True) if as_of is not None else None


_VALID_AT_SQL = ("($as_of IS NULL OR (coalesce(valid_at, call_date::TIMESTAMPTZ) <= $as_of "
                 "AND (invalid_at IS NULL OR invalid_at > $as_of)))")


# A node drawn needs a name: not a number ('7560'), a lone symbol or a two-letter fragment ('IT').
_NAMED_SQL = ("length(trim({column})) > 2 AND regexp_matches({column}, '[[:alpha:]]')")


def subgraph_rows(graph: Graph, match: EntityMatch, as_of: Any = None, limit: int = 40) -> list[dict[str, Any]]:
    """The entity's edges: one row per (subject, object) pair it is part of, from the facts table
    (valid at `as_of` if given), the most recently stated `limit` pairs, with their predicates and
    the value each last stated ('HAS_REVENUE' '$19.7 billion', 'INCREASED' '20%'). Pairs with a nameless end (a number, a
    two-letter fragment) are left out."""
    return graph.rows(
        f"""
        WITH latest AS (
            SELECT subject_id, any_value(subject) AS subject, object_id, any_value(object) AS object, predicate,
                   arg_max(value, (call_date, triplet_id)) FILTER (WHERE value IS NOT NULL) AS value, max(call_date) AS last_stated
            FROM facts
            WHERE (subject_id = $id OR object_id = $id) AND subject_id IS NOT NULL AND object_id IS NOT NULL
              AND {_VALID_AT_SQL} AND {_NAMED_SQL.format(column="subject")} AND {_NAMED_SQL.format(column="object")}
            GROUP BY subject_id, object_id, predicate
        )
        SELECT subject_id, any_value(subject) AS subject, object_id, any_value(object) AS object,
               list(predicate ORDER BY predicate) AS predicates, list(value ORDER BY predicate) AS "values",
               max(last_stated) AS last_stated
        FROM latest
        GROUP BY subject_id, object_id
        ORDER BY last_stated DESC, subject_id, object_id
        LIMIT $limit
        """,
        {"id": match.canonical_id, "as_of": _valid_at(as_of), "limit": int(limit)},
    )


def officer_rows(graph: Graph, match: EntityMatch, as_of: Any = None, limit: int = 12) -> list[dict[str, Any]]:
    """The people holding an office at the entity (or the offices the entity, a person, holds):
    one row per (person, office), held at `as_of` if given, else still held, the most recently
    started first."""
    return graph.rows(
        """
        SELECT person_id, any_value(person) AS person, office_id, any_value(office) AS office, arg_min(title, (started_at, fact_id)) AS title,
               any_value(organization) AS organization, min(started_at) AS started_at
        FROM officer_tenures
        WHERE (organization = $name OR person_id = $id) AND person_id IS NOT NULL AND office_id IS NOT NULL
          AND CASE WHEN $as_of IS NULL THEN ended_at IS NULL
                   ELSE started_at <= $as_of AND (ended_at IS NULL OR ended_at > $as_of) END
        GROUP BY person_id, office_id
        ORDER BY started_at DESC, person_id, office_id
        LIMIT $limit
        """,
        {"name": match.name, "id": match.canonical_id, "as_of": _valid_at(as_of), "limit": int(limit)},
    )


_CHANGES = {"INCREASED", "DECREASED"}


def subgraph_network(graph: Graph, match: EntityMatch, as_of: Any = None, limit: int = 40, people: int = 12) -> nx.DiGraph:
    """The neighbourhood of one entity as a graph to draw: its facts (`subgraph_rows`), a figure's
    node labelled with its value, and the people holding offices at it, each person linked to the
    office and the office to the entity (`officer_rows`). Node attributes: name, label, kind."""
    network = nx.DiGraph()
    rows = subgraph_rows(graph, match, as_of, limit)
    ids = {row[side] for row in rows for side in ("subject_id", "object_id")}
    kinds = dict(graph.connection.execute(
        "SELECT canonical_id, type FROM canonical_entities WHERE list_contains($ids, canonical_id)", {"ids": list(ids)}).fetchall())
    for row in rows:
        stated = list(zip(row["predicates"], row["values"]))
        # a figure's node shows its level ('$19.7 billion'); a change ('INCREASED 20%') stays on the edge
        level = next((value for predicate, value in stated if value and predicate not in _CHANGES), None)
        for side in ("subject", "object"):
            node = row[f"{side}_id"]
            value = level if side == "object" else None
            label = f"{_short(row[side], 32)}\n{_short(value, 24)}" if value else _short(row[side], 32)
            if node not in network or value:
                network.add_node(node, name=row[side], label=label, value=value, kind=kinds.get(node, ""))
        network.add_edge(row["subject_id"], row["object_id"],
                         label="\n".join(f"{predicate} {_short(value, 24)}" if value and value != level else predicate
                                         for predicate, value in stated))
    for row in officer_rows(graph, match, as_of, people) if people else []:
        network.add_node(row["person_id"], name=row["person"], label=_short(row["person"], 32), value=None, kind="Person")
        network.add_node(row["office_id"], name=row["office"], label=_short(row["title"], 32), value=None, kind="Office")
        network.add_edge(row["person_id"], row["office_id"], label=f"HOLDS_ROLE since {row['started_at']:%Y-%m}")
        if row["organization"] == match.name:
            network.add_edge(row["office_id"], match.canonical_id, label="office at")
    if match.canonical_id in network:
        network.nodes[match.canonical_id].update(name=match.name, label=_short(match.name, 32), kind=match.type or "")
    return network


def subgraph_png(graph: Graph, entity: str | EntityMatch, path: Path, as_of: Any = None, limit: int = 40,
                 dpi: int = 100, people: int = 12) -> tuple[int, int]:
    """A PNG of the entities around one entity (`subgraph_network`: its facts valid at `as_of` if
    given, at most `limit` neighbour pairs, the most recently stated; figures with their values;
    at most `people` officers with their offices), drawn in rings around it (offices, people, the
    rest), nodes coloured by kind and edges labelled with their predicates. Returns (nodes, edges);
    ValueError when the entity has no such facts or offices."""
    if int(limit) < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    match = entity if isinstance(entity, EntityMatch) else graph.entity(entity)
    network = subgraph_network(graph, match, as_of, limit, people)
    if not network.number_of_edges():
        when = f" valid at {_valid_at(as_of):%Y-%m-%d}" if as_of is not None else ""
        raise ValueError(f"{match.name!r} has no facts{when} linking it to another entity")
    kinds = nx.get_node_attributes(network, "kind")

    size = min(18.0, 7 + 0.15 * network.number_of_nodes())
    figure = _figure(size, size * 0.75)
    axes = figure.add_subplot()
    axes.set_axis_off()
    axes.margins(0.12)
    # rings around the entity: its offices, the people holding them, then everything else (figures, products, ...)
    rings = [[match.canonical_id], [node for node in network if kinds.get(node) == "Office"],
             [node for node in network if kinds.get(node) == "Person" and node != match.canonical_id]]
    rings.append([node for node in network if not any(node in ring for ring in rings)])
    layout = nx.shell_layout(network, nlist=[ring for ring in rings if ring])
    colours = ["#e6550d" if node == match.canonical_id else _TYPE_COLOURS.get(kinds.get(node, ""), "#d9d9d9")
               for node in network.nodes]
    nx.draw_networkx_nodes(network, layout, ax=axes, node_color=colours, node_size=520, edgecolors="#555555")
    nx.draw_networkx_edges(network, layout, ax=axes, arrows=True, arrowstyle="-|>", arrowsize=12, edge_color="#888888",
                           node_size=520)
    nx.draw_networkx_labels(network, layout, ax=axes, font_size=7, labels=nx.get_node_attributes(network, "label"))
    nx.draw_networkx_edge_labels(network, layout, ax=axes, font_size=6, font_color="#444444",
                                 edge_labels=nx.get_edge_attributes(network, "label"))
    legend = [Patch(facecolor="#e6550d", label=match.name)]
    legend += [Patch(facecolor=colour, label=kind) for kind, colour in _TYPE_COLOURS.items() if kind in kinds.values()]
    axes.legend(handles=legend, loc="lower left", fontsize=8, frameon=False)
    when = f" valid at {_valid_at(as_of):%Y-%m-%d}" if as_of is not None else ""
    capped = f" (the {limit} most recently stated facts)" if network.degree(match.canonical_id) >= int(limit) else ""
    axes.set_title(f"{match.name}: {network.number_of_nodes() - 1} entities around it{when}{capped}", fontsize=11, loc="left")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _save(figure, path, dpi)
    return network.number_of_nodes(), network.number_of_edges()


# --- GraphML -----------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A GraphML attribute value: ISO strings for dates, "" for None."""
    if value is None:
        return ""
    if isinstance(value, (date, datetime)):
        return value.isoformat()
    return value


_EDGE_ATTRIBUTES = ("predicate", "value", "valid_at", "invalid_at", "event_id", "statement", "company", "call_date",
                    "triplet_id")


def graph_network(graph: Graph, as_of: Any = None) -> nx.MultiDiGraph:
    """The whole graph as a networkx MultiDiGraph (see `export_graphml`)."""
    network = nx.MultiDiGraph()
    for canonical_id, name, kind, mentions in graph.connection.execute(
            "SELECT canonical_id, name, type, coalesce(mention_count, 0) FROM canonical_entities "
            "WHERE merged_into IS NULL ORDER BY canonical_id").fetchall():
        network.add_node(canonical_id, name=name or "", type=kind or "", mentions=int(mentions))
    facts = graph.rows(
        f"""
        SELECT subject_id, subject, object_id, object, {', '.join(_EDGE_ATTRIBUTES)}
        FROM facts
        WHERE subject_id IS NOT NULL AND object_id IS NOT NULL AND {_VALID_AT_SQL}
        ORDER BY triplet_id
        """,
        {"as_of": _valid_at(as_of)},
    )
    for fact in facts:
        for end, name in (("subject_id", "subject"), ("object_id", "object")):
            if fact[end] not in network:  # not a canonical entity (should not happen): keep the edge anyway
                network.add_node(fact[end], name=fact[name] or "", type="", mentions=0)
        network.add_edge(fact["subject_id"], fact["object_id"], key=fact["triplet_id"],
                         **{name: _plain(fact[name]) for name in _EDGE_ATTRIBUTES})
    return network


def export_graphml(graph: Graph, path: Path, as_of: Any = None) -> tuple[int, int]:
    """The whole graph as GraphML: canonical entities as nodes (name, type, mentions), facts as
    directed edges subject -> object keyed by triplet id (predicate, value, valid_at, invalid_at,
    event_id, statement, company, call_date; dates as ISO strings, None as ""). With `as_of`,
    only the facts valid then (every entity stays a node). Facts without an object entity are
    left out. Returns (nodes, edges)."""
    network = graph_network(graph, as_of)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nx.write_graphml(network, str(path))
    return network.number_of_nodes(), network.number_of_edges()


# --- growth chart ------------------------------------------------------------------------------


def growth_counts(connection: duckdb.DuckDBPyConnection) -> dict[date, tuple[int, int]]:
    """Per quarter: facts (by the quarter of their call) and retirements (facts invalidated by a
    later statement, by the quarter of invalid_at, in UTC)."""
    counts: dict[date, list[int]] = defaultdict(lambda: [0, 0])
    for quarter, facts in connection.execute(
            "SELECT date_trunc('quarter', call_date)::DATE, count(*) FROM facts "
            "WHERE call_date IS NOT NULL GROUP BY 1").fetchall():
        counts[quarter][0] = facts
    for quarter, retired in connection.execute(
            "SELECT date_trunc('quarter', timezone('UTC', invalid_at))::DATE, count(*) FROM facts "
            "WHERE invalidated_by IS NOT NULL AND invalid_at IS NOT NULL GROUP BY 1").fetchall():
        counts[quarter][1] = retired
    return {quarter: (value[0], value[1]) for quarter, value in sorted(counts.items())}


def growth_chart(connection: duckdb.DuckDBPyConnection, dpi: int = 80) -> bytes:
    """A small PNG of facts and retirements per quarter (see `growth_counts`), as bytes."""
    counts = growth_counts(connection)
    figure = _figure(8, 3)
    axes = figure.add_subplot()
    if counts:
        quarters = list(counts)
        labels = [f"{q.year} Q{(q.month - 1) // 3 + 1}" for q in quarters]
        positions = range(len(quarters))
        axes.bar(positions, [counts[q][0] for q in quarters], color="#4c72b0", label="facts (quarter of the call)")
        axes.plot(positions, [counts[q][1] for q in quarters], color="#dd5555", marker="o", markersize=4,
                  label="retired (quarter of invalid_at)")
        step = max(1, len(quarters) // 12)
        axes.set_xticks(list(positions)[::step], labels[::step], fontsize=8, rotation=30, ha="right")
        axes.legend(fontsize=8, frameon=False, loc="upper left")
    else:
        axes.text(0.5, 0.5, "no facts yet", ha="center", va="center", transform=axes.transAxes)
    axes.set_title("facts and retirements per quarter", fontsize=10, loc="left")
    axes.grid(axis="y", linestyle=":", alpha=0.6)
    buffer = io.BytesIO()
    _save(figure, buffer, dpi)
    return buffer.getvalue()
