"""Pictures and export of the built sample graph: timeline and neighbourhood PNGs, GraphML, the
growth chart and its place in the warehouse asset's metadata. Counts are checked against SQL
written here, independently of tkg.answer.pictures."""

from __future__ import annotations

import base64
import io
import re
import shutil
from datetime import datetime, timedelta, timezone

import dagster as dg
import matplotlib.dates as mdates
import matplotlib.image as mpimg
import networkx as nx
import pytest

from tests.conftest import needs_corpus
from tkg.answer.pictures import (
    MAX_BARS,
    PNG_SIGNATURE,
    export_graphml,
    growth_chart,
    subgraph_network,
    subgraph_png,
    timeline_figure,
    timeline_png,
)
from tkg.answer.query import Graph

COMPANY = "Helio Robotics, Inc."  # the sample's richest entity: revenue, guidance, products and offices held at it
PERSON = "Dana Whitfield"  # was CFO until a later call retired it
AS_OF = "2024-03-01"
AS_OF_END = "2024-03-01 23:59:59.999999+00"  # a date stands for its last moment, as in the query layer


@pytest.fixture(scope="module")
def graph(sample_home):
    with Graph.open(sample_home / "tkg.duckdb") as opened:
        yield opened


def scalar(graph: Graph, sql: str, parameters: dict | None = None):
    return graph.connection.execute(sql, parameters or {}).fetchone()[0]


def assert_png(data: bytes) -> tuple[int, int]:
    assert len(data) > 1000
    assert data[:8] == PNG_SIGNATURE
    pixels = mpimg.imread(io.BytesIO(data), format="png")
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    return pixels.shape[0], pixels.shape[1]


def history_counts(graph: Graph, name: str) -> tuple[int, int]:
    """Timeline entries of an entity in fact_history (facts about it, and offices held at it),
    and how many of them a later statement retired."""
    return graph.connection.execute(
        """
        SELECT count(*), count(*) FILTER (WHERE retired_by IS NOT NULL AND ended_at IS NOT NULL)
        FROM fact_history
        WHERE subject = $name OR object = $name OR (predicate = 'HOLDS_ROLE' AND object LIKE '% of ' || $name)
        """, {"name": name}).fetchone()


def bars_of(figure) -> list:
    (axes,) = figure.axes
    return [patch for container in axes.containers for patch in container.patches]


@pytest.mark.parametrize("name", [COMPANY, PERSON])
def test_timeline_png_has_one_bar_per_entry(graph, name, tmp_path):
    expected, retired = history_counts(graph, name)
    assert 0 < expected <= MAX_BARS
    match, entries, _ = graph.timeline(name)
    path = tmp_path / "timeline.png"
    assert timeline_png(match, entries, path) == expected
    assert_png(path.read_bytes())

    figure, bars = timeline_figure(match, entries)
    assert bars == len(bars_of(figure)) == expected
    (axes,) = figure.axes
    markers = sum(len(line.get_xdata()) for line in axes.get_lines() if line.get_marker() == "X")
    assert markers == retired
    if name == PERSON:
        assert retired >= 1  # the CFO office ended by a later statement
    assert {entry.predicate for entry in entries} <= {text.get_text() for text in axes.get_legend().get_texts()}
    open_bars = [patch for patch in bars_of(figure) if patch.get_hatch()]
    assert len(open_bars) == sum(entry.ended_at is None for entry in entries)


def test_timeline_keeps_the_most_recent_bars(graph, tmp_path):
    match, entries, _ = graph.timeline(COMPANY)
    older = [entry.__class__(**{**entry.__dict__, "began_at": entry.began_at - timedelta(days=400)}) for entry in entries]
    many = older + entries + entries
    assert len(many) > MAX_BARS
    assert timeline_png(match, many, tmp_path / "many.png", dpi=40) == MAX_BARS
    figure, bars = timeline_figure(match, many)
    assert bars == len(bars_of(figure)) == MAX_BARS
    assert f"the latest {MAX_BARS} of {len(many)} facts" in figure.axes[0].get_title(loc="left")
    # the shifted copies are the oldest, so none of them is drawn
    earliest_drawn = min(patch.get_x() for patch in bars_of(figure))
    assert mdates.num2date(earliest_drawn) >= min(entry.began_at for entry in entries) - timedelta(seconds=1)


def test_timeline_without_entries_is_a_clear_error(graph, tmp_path):
    match = graph.entity(COMPANY)
    with pytest.raises(ValueError, match="no facts to draw"):
        timeline_png(match, [], tmp_path / "empty.png")
    assert not (tmp_path / "empty.png").exists()


def test_subgraph_png_counts_the_neighbourhood(graph, tmp_path):
    entity = graph.entity(COMPANY).canonical_id
    pairs = """
        SELECT DISTINCT subject_id, object_id FROM facts
        WHERE (subject_id = $id OR object_id = $id) AND object_id IS NOT NULL {when}
          AND length(trim(subject)) > 2 AND regexp_matches(subject, '[A-Za-z]')
          AND length(trim(object)) > 2 AND regexp_matches(object, '[A-Za-z]')
    """
    when = ("AND coalesce(valid_at, call_date::TIMESTAMPTZ) <= $at::TIMESTAMPTZ "
            "AND (invalid_at IS NULL OR invalid_at > $at::TIMESTAMPTZ)")

    # the officers: each person linked to the office, each office to the company
    held = ("SELECT DISTINCT person_id, office_id FROM officer_tenures WHERE organization = $name AND {when}")
    still = "ended_at IS NULL"
    at = "started_at <= $at::TIMESTAMPTZ AND (ended_at IS NULL OR ended_at > $at::TIMESTAMPTZ)"

    def expected(facts: str, offices: str, parameters: dict) -> tuple[int, int]:
        people = held.format(when=offices)
        drawn = scalar(graph, f"SELECT count(*) FROM (SELECT subject_id FROM ({facts}) UNION SELECT object_id FROM ({facts}) "
                              f"UNION SELECT person_id FROM ({people}) UNION SELECT office_id FROM ({people}))", parameters)
        edges = scalar(graph, f"SELECT (SELECT count(*) FROM ({facts})) + (SELECT count(*) FROM ({people})) "
                              f"+ (SELECT count(DISTINCT office_id) FROM ({people}))", parameters)
        return drawn, edges

    everything = pairs.format(when="")
    path = tmp_path / "subgraph.png"
    assert subgraph_png(graph, COMPANY, path) == expected(everything, still, {"id": entity, "name": COMPANY})
    assert_png(path.read_bytes())

    then = pairs.format(when=when)
    drawn = subgraph_png(graph, COMPANY, tmp_path / "then.png", as_of=AS_OF, dpi=40)
    assert drawn == expected(then, at, {"id": entity, "name": COMPANY, "at": AS_OF_END})
    assert 0 < drawn[1] < expected(everything, still, {"id": entity, "name": COMPANY})[1]

    # a star around the company
    assert subgraph_png(graph, COMPANY, tmp_path / "five.png", limit=5, people=0, dpi=40) == (6, 5)
    with pytest.raises(ValueError, match="no facts valid at 2000-01-01"):
        subgraph_png(graph, COMPANY, tmp_path / "never.png", as_of="2000-01-01")


def test_subgraph_shows_people_offices_and_figure_values(graph):
    """Around a company: who holds which office at it (not ended), and each figure with its value."""
    match = graph.entity(COMPANY)
    network = subgraph_network(graph, match)
    holders = {(person, title) for person, title in graph.connection.execute(
        "SELECT person, title FROM officer_tenures WHERE organization = ? AND ended_at IS NULL", [COMPANY]).fetchall()}
    assert holders and holders == {(network.nodes[person]["name"], network.nodes[office]["label"])
                                   for person, office in network.edges if network.nodes[person]["kind"] == "Person"}
    assert all(network.has_edge(office, match.canonical_id) for office, kind in network.nodes(data="kind") if kind == "Office")
    revenue = next(node for node, name in network.nodes(data="name") if name == "Helio revenue Q3 2024")
    assert network.nodes[revenue]["value"] == "$361 million" and "$361 million" in network.nodes[revenue]["label"]
    # at a date, the CFO then (Dana Whitfield, until July 2024) rather than now (Marcus J. Ortega)
    then = {network_name for _, network_name in subgraph_network(graph, match, as_of="2024-03-01").nodes(data="name")}
    assert "Dana Whitfield" in then and "Marcus J. Ortega" not in then


@needs_corpus
@pytest.mark.slow
def test_subgraph_around_intel_on_the_corpus_has_no_nameless_nodes(corpus_home):
    """Issue 25: `tkg export --around Intel` drew 40 metric names without values and nodes such as
    '7560' and 'IT'; now its officers with their offices, figures with values, and no nameless node."""
    with Graph.open(corpus_home / "tkg.duckdb") as corpus:
        network = subgraph_network(corpus, corpus.entity("Intel"))
    names = dict(network.nodes(data="name"))
    assert not [name for name in names.values() if len(name.strip()) <= 2 or not re.search(r"[A-Za-z]", name)]
    kinds = dict(network.nodes(data="kind"))
    assert {"Robert H. Swan", "George S. Davis"} <= {names[node] for node, kind in kinds.items() if kind == "Person"}
    assert {"CEO", "CFO"} <= {label for node, label in network.nodes(data="label") if kinds[node] == "Office"}
    valued = [value for node, value in network.nodes(data="value") if kinds[node] == "Metric" and value]
    assert len(valued) >= 10 and all(re.search(r"\d", value) for value in valued)


def test_graphml_round_trips_with_the_sql_counts(graph, tmp_path):
    nodes = scalar(graph, "SELECT count(*) FROM (SELECT canonical_id FROM canonical_entities WHERE merged_into IS NULL "
                          "UNION SELECT subject_id FROM facts WHERE object_id IS NOT NULL "
                          "UNION SELECT object_id FROM facts WHERE object_id IS NOT NULL)")
    edges = scalar(graph, "SELECT count(*) FROM facts WHERE subject_id IS NOT NULL AND object_id IS NOT NULL")
    path = tmp_path / "graph.graphml"
    assert export_graphml(graph, path) == (nodes, edges)

    read = nx.read_graphml(path, force_multigraph=True)
    assert read.is_directed()
    assert (read.number_of_nodes(), read.number_of_edges()) == (nodes, edges)
    # a retired fact keeps its dates and the statement that asserts it, as strings
    event, subject, target, valid_at, invalid_at = graph.connection.execute(
        "SELECT event_id, subject_id, object_id, valid_at, invalid_at FROM facts "
        "WHERE invalidated_by IS NOT NULL AND object_id IS NOT NULL ORDER BY triplet_id LIMIT 1").fetchone()
    (attributes,) = [data for data in read.get_edge_data(subject, target).values() if data["event_id"] == event]
    assert datetime.fromisoformat(attributes["valid_at"]) == valid_at
    assert datetime.fromisoformat(attributes["invalid_at"]) == invalid_at
    assert attributes["predicate"] and attributes["statement"]
    assert read.nodes[subject]["name"] and read.nodes[subject]["type"]
    current = next(data for _, _, data in read.edges(data=True) if data["invalid_at"] == "")
    assert current["predicate"]

    then = scalar(graph, "SELECT count(*) FROM facts WHERE subject_id IS NOT NULL AND object_id IS NOT NULL "
                         "AND coalesce(valid_at, call_date::TIMESTAMPTZ) <= $at::TIMESTAMPTZ "
                         "AND (invalid_at IS NULL OR invalid_at > $at::TIMESTAMPTZ)", {"at": AS_OF_END})
    assert 0 < then < edges
    assert export_graphml(graph, tmp_path / "then.graphml", as_of=AS_OF) == (nodes, then)
    assert nx.read_graphml(tmp_path / "then.graphml", force_multigraph=True).number_of_edges() == then
    moment = datetime(2024, 3, 1, 23, 59, 59, tzinfo=timezone.utc)
    for _, _, data in nx.read_graphml(tmp_path / "then.graphml", force_multigraph=True).edges(data=True):
        assert datetime.fromisoformat(data["valid_at"]) <= moment
        assert data["invalid_at"] == "" or datetime.fromisoformat(data["invalid_at"]) > moment


def test_growth_chart_is_a_png(graph):
    width_height = assert_png(growth_chart(graph.connection))
    assert width_height[1] > width_height[0]


def test_warehouse_metadata_carries_the_growth_chart(sample_home, tmp_path):
    from tkg_assets.assets.warehouse import _growth_markdown

    copy = tmp_path / "tkg.duckdb"  # another connection (with another configuration) holds the sample open
    shutil.copyfile(sample_home / "tkg.duckdb", copy)
    context = dg.build_asset_context()
    value = _growth_markdown(context, copy)
    assert isinstance(value, dg.MarkdownMetadataValue)
    found = re.fullmatch(r"!\[facts and retirements per quarter\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", value.md_str)
    assert found
    assert_png(base64.b64decode(found.group(1)))
    assert len(found.group(1)) < 100_000  # small enough for the event log

    assert _growth_markdown(context, tmp_path / "missing.duckdb") is None  # a warning, not a failure
