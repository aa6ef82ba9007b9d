"""The `tkg` commands that read the published graph: sql, ask, facts, timeline, export."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from tkg.cli.app import HOME_OPTION, UsageError, app, command, console
from tkg.settings import Settings


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


@app.command()
@command
def sql(
    query: Annotated[Optional[str], typer.Argument(metavar="QUERY", help="SQL to run; omit for an interactive prompt")] = None,
    home: HOME_OPTION = None,
    output: Annotated[OutputFormat, typer.Option("--format", metavar="FORMAT",
                                                 help="table (for reading), or every row as csv or json (for scripts)")] = OutputFormat.table,
    max_rows: Annotated[int, typer.Option("--max-rows", metavar="N", min=0, help="Rows a table shows (0: all)")] = 40,
) -> None:
    """Query tkg.duckdb read-only. Never blocks the pipeline, and writes nothing on disk."""
    import duckdb

    warehouse = Settings.resolve(home=home).warehouse
    if not warehouse.exists():
        raise UsageError(f"{warehouse} does not exist; run `tkg build` first (or pass --home)")
    with duckdb.connect(str(warehouse), read_only=True) as connection:
        connection.execute("SET TimeZone = 'UTC'")
        if query:
            try:
                relation = connection.sql(query)
                if relation is not None:
                    _print_relation(relation, output, max_rows)
            except duckdb.Error as error:
                raise UsageError(f"{str(error).splitlines()[0]} (in the query; the views are listed in the README)") from None
            return
        console.print(f"{warehouse} (read-only). End statements with ';', quit with Ctrl-D.")
        buffer = ""
        while True:
            try:
                line = input("tkg> " if not buffer else "...> ")
            except EOFError:
                break
            buffer += line + "\n"
            if buffer.strip().endswith(";"):
                try:
                    relation = connection.sql(buffer)
                    if relation is not None:
                        _print_relation(relation, output, max_rows)
                except duckdb.Error as error:
                    console.print(f"[red]{error}[/]")
                buffer = ""


def _print_relation(relation, output: OutputFormat, max_rows: int) -> None:
    import csv
    import json

    if output is OutputFormat.table:
        relation.show(max_width=10_000, max_rows=max_rows or 10**12)
        return
    columns, rows = relation.columns, relation.fetchall()
    if output is OutputFormat.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        json.dump([dict(zip(columns, row)) for row in rows], sys.stdout, default=str, indent=1)
        sys.stdout.write("\n")



ENTITY_ARGUMENT = Annotated[str, typer.Argument(metavar="ENTITY", help="A name, alias, ticker or canonical id")]
JSON_OPTION = Annotated[bool, typer.Option("--json", help="One JSON object on stdout, for scripts")]
PREDICATE_OPTION = Annotated[Optional[str], typer.Option(
    "--predicate", "-p", metavar="PREDICATE", help="Only this predicate (e.g. HOLDS_ROLE; a near miss is mapped and said)")]


def _graph(settings: Settings):
    from tkg.answer.query import Graph

    if not settings.warehouse.exists():
        raise UsageError(f"{settings.warehouse} does not exist; run `tkg build` first (or pass --home)")
    return Graph.open(settings.warehouse)


def _print_json(document: object) -> None:
    import json

    json.dump(document, sys.stdout, default=str, indent=1)
    sys.stdout.write("\n")


def _print_facts(out, facts, title: str) -> None:
    """Facts as numbered entries that read at any terminal width: the triplet, its validity and
    evidence (company, call, event id), then the statement."""
    out.print(f"[bold]{title}[/]")
    if not facts:
        out.print("  (none)")
    for rank, fact in enumerate(facts, 1):
        target = fact.object or ""
        if fact.value and fact.value != target:
            target += f" ({fact.value})" if target else fact.value
        valid = (f"{fact.valid_at:%Y-%m-%d}" if fact.valid_at else "?") + " → " + (
            f"{fact.invalid_at:%Y-%m-%d}" if fact.invalid_at else "")
        triplet = f"{fact.subject} [cyan]{fact.predicate}[/] {target}" if fact.predicate else "(a statement without a triplet)"
        out.print(f"{rank:>3}. {triplet}")
        out.print(f"     valid {valid} · {fact.company} call {fact.call_date:%Y-%m-%d} · event {fact.event_id}"
                  + (f" · score {fact.score:g}" if fact.score is not None else ""), style="dim")
        out.print(f"     “{fact.statement}”")


def _said_mapping(choice) -> None:
    if choice is not None and not choice.exact:
        console.print(f"[yellow]predicate {choice.asked!r} is not in the vocabulary; using {choice.predicate} "
                      f"(match {choice.score:.0f}/100)[/]")


@app.command()
@command
def ask(
    question: Annotated[str, typer.Argument(metavar="QUESTION", help="A question in plain words, quoted")],
    home: HOME_OPTION = None,
    as_json: JSON_OPTION = False,
    limit: Annotated[int, typer.Option("--limit", "-n", metavar="N", min=1, max=100, help="Facts to show")] = 10,
    offline: Annotated[bool, typer.Option("--offline", help="Answer by retrieval only, even when a model is configured")] = False,
) -> None:
    """Answer a question from the graph, citing the facts. With a model configured (OPENAI_API_KEY
    or OPENAI_BASE_URL), a planner and a tool-calling agent write the answer; without one, the
    facts that answer it are ranked and shown."""
    from tkg.answer.ask import answer_offline

    settings = Settings.resolve(home=home)
    with _graph(settings) as graph:
        if not offline and not settings.offline:
            from tkg.answer.agent import answer_with_model

            result = answer_with_model(graph, question, settings, limit=limit)
        else:
            result = answer_offline(graph, question, limit=limit)
    if as_json:
        _print_json(result.as_dict())
        return
    from rich.console import Console

    out = Console(soft_wrap=True)
    out.print(f"[bold]{question}[/]")
    out.print(result.answer if result.answer else f"[italic]{result.note}[/]")
    if result.answer and result.note:
        out.print(f"[dim]{result.note}[/]")
    out.print("[bold]plan[/]")
    for step, task in enumerate(result.plan, 1):
        out.print(f"  {step}. {task}")
    out.print("[bold]tool calls[/]")
    for call in result.tool_calls:
        arguments = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items() if v is not None)
        out.print(f"  {call.tool}({arguments}) → {call.results} result(s)" + (f" [red]{call.error}[/]" if call.error else ""))
    _print_facts(out, result.facts, "facts, best first")


@app.command()
@command
def facts(
    entity: ENTITY_ARGUMENT,
    predicate: PREDICATE_OPTION = None,
    as_of: Annotated[Optional[str], typer.Option("--as-of", metavar="DATE", help="Facts valid on this date")] = None,
    start: Annotated[Optional[str], typer.Option("--from", metavar="DATE", help="Window start")] = None,
    end: Annotated[Optional[str], typer.Option("--to", metavar="DATE", help="Window end")] = None,
    history: Annotated[bool, typer.Option("--history", help="Also facts that ended inside the window")] = False,
    home: HOME_OPTION = None,
    as_json: JSON_OPTION = False,
) -> None:
    """The facts about an entity valid in a window (or on a date), one row per fact, newest first."""
    if as_of and (start or end):
        raise UsageError("--as-of names one date; use it alone, or --from/--to for a window")
    if as_of:
        start = end = as_of
    with _graph(Settings.resolve(home=home)) as graph:
        answer = graph.factual_qa(entity, start, end, predicate=predicate, history=history)
    _said_mapping(answer.predicate)
    if as_json:
        _print_json({"entity": answer.entity.__dict__, "predicate": answer.predicate.__dict__ if answer.predicate else None,
                     "start": answer.start, "end": answer.end, "history": history,
                     "facts": [fact.as_dict() for fact in answer.facts]})
        return
    window = (f" on {as_of}" if as_of else f" from {start or 'the start'} to {end or 'now'}") if (as_of or start or end) else ""
    entity_line = f"{answer.entity.name} ({answer.entity.type}, {answer.entity.canonical_id})"
    if answer.entity.how not in ("id", "name"):
        entity_line += f", matched as {answer.entity.how} {answer.entity.matched!r}"
    from rich.console import Console

    _print_facts(Console(soft_wrap=True), answer.facts, f"{entity_line}: {len(answer.facts)} fact(s){window}")


@app.command()
@command
def timeline(
    entity: ENTITY_ARGUMENT,
    predicate: PREDICATE_OPTION = None,
    png: Annotated[Optional[Path], typer.Option("--png", metavar="FILE", help="Also draw the timeline to this PNG")] = None,
    home: HOME_OPTION = None,
    as_json: JSON_OPTION = False,
) -> None:
    """An entity's facts over time: one row per fact and continuous period, with when it began,
    was last restated and was retired, and by which statement."""
    with _graph(Settings.resolve(home=home)) as graph:
        match, entries, choice = graph.timeline(entity, predicate)
    _said_mapping(choice)
    if png is not None:
        from tkg.answer.pictures import timeline_png

        try:
            bars = timeline_png(match, entries, png)
        except ValueError as error:  # nothing to draw
            raise UsageError(str(error)) from None
        console.print(f"wrote {png} ({bars} bar(s))")
    if as_json:
        _print_json({"entity": match.__dict__, "entries": [entry.as_dict() for entry in entries]})
        return
    from rich.console import Console

    out = Console(soft_wrap=True)
    out.print(f"[bold]{match.name} ({match.type}, {match.canonical_id}): {len(entries)} fact(s) over time[/]")
    for entry in entries:
        target = " / ".join(dict.fromkeys(filter(None, (entry.object, entry.value))))
        began = f"{entry.began_at:%Y-%m-%d}" if entry.began_at else "?"
        ended = f"{entry.ended_at:%Y-%m-%d}" if entry.ended_at else "now"
        out.print(f"{began} → {ended:<10}  {entry.subject} [cyan]{entry.predicate}[/] {target}")
        out.print(f"{'':>25}restated {entry.restatements}x, last on {entry.last_restated_on:%Y-%m-%d} "
                  f"({entry.company}); first: “{entry.first_statement}”", style="dim")
        if entry.retired_by:
            out.print(f"{'':>25}[red]retired[/] by “{entry.retired_by_statement}” [dim][{entry.retired_by}][/]")


@app.command()
@command
def export(
    graphml: Annotated[Optional[Path], typer.Option("--graphml", metavar="FILE",
                                                    help="Write the whole graph as GraphML (Gephi, yEd, networkx)")] = None,
    png: Annotated[Optional[Path], typer.Option("--png", metavar="FILE", help="Draw the entities around --around to a PNG")] = None,
    around: Annotated[Optional[str], typer.Option("--around", metavar="ENTITY", help="The entity at the centre of --png")] = None,
    as_of: Annotated[Optional[str], typer.Option("--as-of", metavar="DATE", help="Only the facts valid on this date")] = None,
    home: HOME_OPTION = None,
) -> None:
    """Export the graph (canonical entities as nodes, facts as edges with their validity) as
    GraphML, or draw the neighbourhood of one entity."""
    from tkg.answer.pictures import export_graphml, subgraph_png
    from tkg.answer.query import utc

    if graphml is None and png is None:
        raise UsageError("say what to write: --graphml FILE, or --png FILE --around ENTITY")
    if (png is None) != (around is None):
        raise UsageError("--png and --around go together: --png FILE --around ENTITY")
    moment = utc(as_of, end_of_day=True) if as_of else None
    valid = f" valid on {as_of}" if as_of else ""
    with _graph(Settings.resolve(home=home)) as graph:
        if graphml is not None:
            nodes, edges = export_graphml(graph, graphml, as_of=moment)
            console.print(f"wrote {graphml}: {nodes} node(s), {edges} edge(s){valid}")
        if png is not None:
            try:
                nodes, edges = subgraph_png(graph, around, png, as_of=moment)
            except ValueError as error:  # nothing around it (at that date)
                raise UsageError(str(error)) from None
            console.print(f"wrote {png}: {nodes} entities around {around}, {edges} edge(s){valid}")
