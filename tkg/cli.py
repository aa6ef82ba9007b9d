"""The `tkg` command: build the graph incrementally with Dagster, query it, open the UI.

Exit status: 0 done; 1 something could not be built (what was built before is kept, and
tkg.duckdb is not replaced by a worse one); 2 a usage mistake (the message names the fix);
3 built and published, but source rows were skipped or a partial result was kept;
130 interrupted (nothing half-done is published; a rerun finishes the job).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from enum import Enum
from functools import wraps
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# Typer labels every argument with its Python type ('QUERY <str>'); the metavars and help say
# what an argument is, so the label is dropped.
typer.core.TyperArgument.display_type_rich = lambda self, ctx: None

app = typer.Typer(help="tkg: temporal knowledge graphs from earnings-call transcripts.", no_args_is_help=True,
                  pretty_exceptions_enable=False, rich_markup_mode=None)
# Long lines are not wrapped: messages stay one line each in logs and pipes.
console = Console(stderr=True, soft_wrap=True)

EXIT_FAILED, EXIT_USAGE, EXIT_SKIPPED, EXIT_INTERRUPTED = 1, 2, 3, 130


class UsageError(Exception):
    """A mistake in how tkg was called; the message says what to do instead."""


@dataclass
class _State:
    debug: bool = False


state = _State()


@app.callback()
def main(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")] = False) -> None:
    import logging
    state.debug = debug
    # Per-item warnings (a dropped chunk, a retry) are summed up per partition; --debug shows them.
    logging.getLogger("tkg").setLevel(logging.DEBUG if debug else logging.ERROR)


def command(function: Callable) -> Callable:
    """Turn errors into one clear line and an exit status (the traceback with --debug)."""

    @wraps(function)
    def wrapper(*args, **kwargs):
        from tkg.answer.query import QueryError
        from tkg.build.state import HalfBuilt
        from tkg.ingest.sources import SourceError

        try:
            return function(*args, **kwargs)
        except typer.Exit:
            raise
        except BrokenPipeError:  # `tkg sql ... | head` stopped reading: end quietly, as Unix tools do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        except KeyboardInterrupt:
            console.print("[red]interrupted: nothing half-done was published; rerun the command to finish[/]")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except (UsageError, SourceError, QueryError, FileNotFoundError) as error:
            if state.debug:
                raise
            console.print(f"[red]error:[/] {error}")
            raise typer.Exit(EXIT_USAGE) from None
        except HalfBuilt as error:
            if state.debug:
                raise
            console.print(f"[red]error:[/] {error}")
            raise typer.Exit(EXIT_FAILED) from None
        except Exception as error:  # noqa: BLE001 - one line for the user, the traceback with --debug
            if state.debug:
                raise
            console.print(f"[red]error:[/] {type(error).__name__}: {error} (run with --debug for the traceback)")
            raise typer.Exit(EXIT_FAILED) from None

    return wrapper


HOME_OPTION = Annotated[Optional[Path], typer.Option(
    "--home", metavar="DIR", help="Data folder (Parquet, caches, tkg.duckdb, Dagster runs). Default: $TKG_HOME or ./tkg_data")]
SOURCE_OPTION = Annotated[str, typer.Option(
    metavar="SOURCE", help="'sample' (bundled), a .parquet/.jsonl/.csv file with company,date,transcript, or 'hf' "
                           "for jlh-ibm/earnings_call")]
COMPANY_OPTION = Annotated[Optional[list[str]], typer.Option("--company", "-c", metavar="TICKER", help="Only these tickers (repeatable)")]


@dataclass
class Context:
    """Where everything lives for one command; passed to resources, never written to os.environ."""

    home: Path
    dagster_home: Path
    warehouse: Path


def _context(home: Path | None) -> Context:
    home = (home or Path(os.environ.get("TKG_HOME", "tkg_data"))).expanduser().resolve()
    warehouse = Path(os.environ.get("TKG_DUCKDB") or home / "tkg.duckdb").expanduser().resolve()
    # DAGSTER_HOME if the user set one, else the instance inside tkg's data folder.
    dagster_home = Path(os.environ["DAGSTER_HOME"]).expanduser().resolve() if os.environ.get("DAGSTER_HOME") else home / "dagster_home"
    return Context(home=home, dagster_home=dagster_home, warehouse=warehouse)


def _parse_date(value: str | None, option: str) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise UsageError(f"{option} {value!r} is not a date; write it as YYYY-MM-DD, e.g. {option} 2017-01-31") from None


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# Offline, a worker process pays about three seconds to start (imports, the embedding model):
# worth it only for about this much transcript text to build.
TEXT_PER_WORKER = 2_000_000


def auto_workers(plan, loaded, backend) -> int:
    """Worker processes for a build when --workers is not given: one per core for the LLM
    path (partitions wait on the provider), and offline as many as the text to build keeps busy."""
    partitions = len(plan.work)
    if backend.resolved_backend() != "offline":
        return max(1, min(usable_cores(), partitions))
    text = sum(len(row.text) for work in plan.work for row in loaded.rows_for(*work.partition))
    return max(1, min(usable_cores(), partitions, -(-text // TEXT_PER_WORKER)))


@app.command()
@command
def build(
    source: SOURCE_OPTION = "sample",
    company: COMPANY_OPTION = None,
    since: Annotated[Optional[str], typer.Option(metavar="DATE", help="Only calls on or after this date (YYYY-MM-DD)")] = None,
    until: Annotated[Optional[str], typer.Option(metavar="DATE", help="Only calls on or before this date (YYYY-MM-DD)")] = None,
    home: HOME_OPTION = None,
    workers: Annotated[Optional[int], typer.Option(
        min=1, metavar="N", help="Worker processes building partitions (default: as many as the work keeps busy, at most "
                                 "one per core)")] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild every selected partition and the global steps, changed or not")] = False,
    allow_partial: Annotated[bool, typer.Option(
        "--allow-partial", help="Keep what a stage extracted when the provider left items unanswered, and publish; "
                                "the output lists what is missing and the next build retries it")] = False,
) -> None:
    """Build what changed: new or changed calls, stages whose code (prompt, model, rules) changed,
    then resolution, invalidation and tkg.duckdb. Says 'up to date' when nothing did."""
    first, last = _parse_date(since, "--since"), _parse_date(until, "--until")
    if first and last and first > last:
        raise UsageError(f"--since {since} is after --until {until}; swap them")
    wanted = _check_companies(company)
    where = _context(home)
    with _exclusive(where):
        _build(where, source, wanted, first, last, workers, force, allow_partial)


def _exclusive(where: Context):
    """One build at a time per data folder: a second waits for the first, then finds most of
    its work done."""
    from tkg.store.parquet import locked

    return locked(where.home / ".build.lock", lambda pid: console.print(
        f"another tkg build (pid {pid}) is running on {where.home}; waiting for it to finish"))


def _build(where: Context, source: str, wanted: set[str], first: date | None, last: date | None, workers: int | None,
           force: bool, allow_partial: bool) -> None:
    from tkg.build.runner import prestart, spec_for
    from tkg.ingest.sources import describe
    from tkg.store.parquet import remove_orphaned_temporaries, storage_uri

    removed = remove_orphaned_temporaries(where.home)
    if removed:
        console.print(f"removed {len(removed)} temporary file(s) a killed build left behind")

    loaded, selection, backend, plan = _plan(where, source, wanted, force, allow_partial, first, last)
    for problem in loaded.problems:
        console.print(f"[yellow]source row skipped: {problem}[/]")
    for duplicate in loaded.duplicates:
        console.print(f"[yellow]duplicate source row: {duplicate}[/]")
    if not selection and not loaded.problems:
        raise UsageError(f"no calls in {describe(source)} match the filters; check --company, --since and --until")
    for partition, problems in plan.held.items():
        console.print(f"[yellow]{partition[0]}|{partition[1].isoformat()} kept as built: a source row of it cannot be read[/]")
    skipped = bool(loaded.problems)
    if plan.up_to_date:
        console.print(f"up to date: {len(plan.current)} partition(s) of {describe(source)} and {where.warehouse}")
        raise typer.Exit(EXIT_SKIPPED if skipped else 0)

    if plan.work:
        console.print(f"building {len(plan.work)} of {len(selection)} partition(s) from {describe(source)} into {where.home} "
                      f"({len(plan.current)} up to date)")
    else:
        console.print(f"all {len(plan.current)} partition(s) up to date; refreshing the graph: {'; '.join(plan.global_reasons)}")
    console.print(f"extraction: {backend.describe()}")
    report = BuildRecord(started=time.perf_counter(), partitions=len(plan.work))
    workers = min(workers or auto_workers(plan, loaded, backend), max(1, len(plan.work)))
    report.workers = workers
    if plan.work:  # the workers start up while Dagster does
        prestart(spec_for(backend, source, workers, _log_level(), storage_uri(where.home)), workers)
    try:
        defs, instance = _dagster(where, *_resources(where, source, backend))
        report.mark("dagster_setup")
        failed = _ingest(defs, instance, plan, workers, report) if plan.work else []
        report.mark("partitions")
        report.failed = dict(failed)
        if failed and not allow_partial:
            console.print(f"[red]{len(failed)} partition(s) failed and kept their last good output; {where.warehouse} was "
                          "not refreshed:[/]")
            for key, error in failed:
                console.print(f"[red]  {key}: {error}[/]")
            console.print("rerun `tkg build` to retry them (answers already received are cached)")
            raise typer.Exit(EXIT_FAILED)
        error = _refresh(defs, instance, report)
        report.mark("global_steps")
        if error:
            report.failed["global steps"] = error
            console.print(f"[red]the global steps failed, {where.warehouse} keeps its last good contents: {error}[/]")
            raise typer.Exit(EXIT_FAILED)
        report.status = "published"
    finally:
        report.write(where.home / "last_build.json")
    partial = _print_counts(where.warehouse)
    console.print(f"done in {time.perf_counter() - report.started:.1f}s ({report.summary()}): {where.warehouse}")
    if failed or partial or skipped:
        raise typer.Exit(EXIT_SKIPPED)


@dataclass
class BuildRecord:
    """Where a build's time went, written to $TKG_HOME/last_build.json for whoever watches an
    unattended build (and for benchmarks/bench_build.py)."""

    started: float
    partitions: int
    workers: int = 1
    status: str = "failed"
    stage_seconds: float = 0.0  # tkg's own stage work, summed over the workers
    seconds: dict[str, float] = field(default_factory=dict)
    steps: dict[str, float] = field(default_factory=dict)  # the global steps, from Dagster's step stats
    failed: dict[str, str] = field(default_factory=dict)
    _last: float = 0.0

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = round(now - (self._last or self.started), 3)
        self._last = now

    def summary(self) -> str:
        parts = [f"{phase.replace('_', ' ')} {seconds:.1f}s" for phase, seconds in self.seconds.items()]
        if self.stage_seconds:
            parts.append(f"stage work {self.stage_seconds:.1f}s in {self.workers} worker(s)")
        return ", ".join(parts)

    def write(self, path: Path) -> None:
        import json

        self.seconds["total"] = round(time.perf_counter() - self.started, 3)
        record = {"status": self.status, "partitions": self.partitions, "workers": self.workers,
                  "stage_seconds": round(self.stage_seconds, 3), "seconds": self.seconds, "global_steps": self.steps,
                  "failed": self.failed}
        path.write_text(json.dumps(record, indent=1) + "\n")


def _log_level() -> str:
    """Of tkg's loggers: per-item warnings (a dropped chunk, a retry) are summed up per partition."""
    return "DEBUG" if state.debug else "ERROR"


def _resources(where: Context, source: str, backend):
    """The Dagster resources for these settings (passed directly, never through os.environ)."""
    from resources.tkg import TkgStorage, TranscriptSource, extraction_backend_from_env

    return (TkgStorage(home=str(where.home), duckdb_path=str(where.warehouse)), TranscriptSource(source=source),
            extraction_backend_from_env(**backend.as_fields()))


def _dagster(where: Context, storage, source, extraction):
    import logging

    from tkg_assets.definitions import build_definitions
    from tkg_assets.instance import fail_orphaned_runs, open_instance

    logging.getLogger("alembic").setLevel(logging.WARNING)  # Dagster's first-run schema migration chatter
    instance = open_instance(where.dagster_home)
    orphaned = fail_orphaned_runs(instance)
    if orphaned:
        console.print(f"marked {len(orphaned)} run(s) of killed builds as failed")
    return build_definitions(storage, source, extraction), instance


# The progress bar and the summary say enough; the run log in Dagster keeps every event.
_QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def _ingest(defs, instance, plan, workers: int, report: BuildRecord) -> list[tuple[str, str]]:
    """Run the build_partitions job; the failed partitions with their reasons."""
    from tkg_assets import batch
    from tkg_assets.instance import run_in_process, run_tags

    failed: list[tuple[str, str]] = []
    partial: list[tuple[str, dict]] = []
    config = {"stages": {work.key: sorted(work.stages) for work in plan.work},
              "reasons": {work.key: work.reason for work in plan.work}, "workers": workers,
              "log_level": _log_level()}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task("partitions", total=len(plan.work))

        def observe(outcome) -> None:
            report.stage_seconds += outcome.seconds
            if not outcome.ok:
                failed.append((outcome.key, outcome.error))
            lacking = {k: v for report in outcome.reports for k, v in report.missing.items()}
            if lacking:
                partial.append((outcome.key, lacking))
            progress.update(task, advance=1, description=f"partition {outcome.key} {'done' if outcome.ok else 'FAILED'}")

        batch.observers.append(observe)
        try:
            result = run_in_process(defs, "build_partitions", instance, tags=run_tags(),
                                    run_config={**_QUIET, "ops": {"build_stale_partitions": {"config": config}}})
        finally:
            batch.observers.remove(observe)
    error = _failure(result, "build_partitions")
    if error and not failed:  # the run itself failed, not a partition: nothing may be refreshed
        failed.append(("build_partitions", error))
    for key, lacking in partial:
        console.print(f"[yellow]{key} kept a partial result: {', '.join(f'{n} {k}' for k, n in sorted(lacking.items()))}; "
                      "the next build retries what is missing[/]")
    return failed


def _refresh(defs, instance, report: BuildRecord | None = None) -> str | None:
    """Run the global steps; None on success, else the first failure's message."""
    from tkg_assets.instance import run_in_process, run_tags

    result = run_in_process(defs, "refresh_graph", instance, run_config=_QUIET, tags=run_tags())
    if report is not None:
        report.steps = {stats.step_key: round(stats.end_time - stats.start_time, 3)
                        for stats in instance.get_run_step_stats(result.run_id) if stats.end_time and stats.start_time}
    return _failure(result, "refresh_graph")


def _failure(result, job_name: str) -> str | None:
    """None for a successful run, else the first step failure's message. A run stopped by
    Ctrl-C (Dagster records it and returns) is re-raised as KeyboardInterrupt."""
    import dagster as dg
    from dagster._core.execution.plan.objects import ErrorSource

    if result.success:
        return None
    for event in result.all_events:
        data = event.step_failure_data if event.is_step_failure else None
        if data is not None and data.error_source == ErrorSource.INTERRUPT:
            raise KeyboardInterrupt
        if data is not None and data.error is not None:
            error = data.error
            while error.cause is not None and error.cls_name in ("DagsterExecutionStepExecutionError",):
                error = error.cause  # Dagster's wrapper: the user code's own error says what is wrong
            message = error.message.strip().splitlines()[-1]
            return f"{event.step_key}: {message if error.cls_name in message else f'{error.cls_name}: {message}'}"
    if any(event.event_type == dg.DagsterEventType.RUN_CANCELED for event in result.all_events):
        raise KeyboardInterrupt
    return f"the {job_name} run failed; see `tkg dev` for its log"


def _print_counts(path: Path) -> bool:
    """Row counts of the published file; True when it was published from a partial result."""
    import duckdb

    from tkg.store.warehouse import published_stamp

    with duckdb.connect(str(path), read_only=True) as connection:
        table = Table("table", "rows", title=str(path))
        for name in ("transcripts", "chunks", "statements", "events", "triplets", "entities", "canonical_entities",
                     "facts", "metrics", "invalidation_judgments"):
            table.add_row(name, f"{connection.execute(f'SELECT count(*) FROM {name}').fetchone()[0]:,}")
        invalidated = connection.execute("SELECT count(*) FROM events WHERE invalidated_by IS NOT NULL").fetchone()[0]
        table.add_row("events invalidated", f"{invalidated:,}")
    console.print(table)
    stamp = published_stamp(path)
    if stamp is not None and stamp.missing:
        console.print(f"[yellow]published from a partial result: {stamp.missing}[/]")
        return True
    return False


def _plan(where: Context, source: str, wanted: set[str] | None = None, force: bool = False, allow_partial: bool = False,
          since: date | None = None, until: date | None = None):
    """Load the source and plan a build: (loaded source, selection, backend, plan)."""
    from tkg.build.graph import partitions_of
    from tkg.build.plan import plan_build
    from tkg.build.state import global_code_versions
    from tkg.ingest.sources import load_source
    from tkg.providers import Backend
    from tkg.store.parquet import ParquetStore
    from tkg.store.warehouse import published_stamp

    loaded = load_source(source)
    selection = partitions_of(loaded, wanted or None, since, until)
    backend = Backend(home=str(where.home), allow_partial=allow_partial)
    plan = plan_build(ParquetStore(where.home), loaded, selection, backend.code_versions(),
                      global_code_versions(backend.judge_code_version()), force=force,
                      warehouse_stamp=published_stamp(where.warehouse))
    return loaded, selection, backend, plan


def _check_companies(company: list[str] | None) -> set[str]:
    from tkg.core.companies import load_companies

    wanted = {c.strip().upper() for c in company or []}
    unknown = sorted(wanted - set(load_companies()))
    if unknown:
        raise UsageError(f"unknown company {', '.join(unknown)}; the registry knows {', '.join(sorted(load_companies()))} "
                         "(add companies to tkg/config/companies.yaml or TKG_COMPANIES)")
    return wanted


@app.command()
@command
def status(
    source: SOURCE_OPTION = "sample",
    company: COMPANY_OPTION = None,
    home: HOME_OPTION = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, for scripts")] = False,
) -> None:
    """What is built, stale or missing, per company and quarter, and whether tkg.duckdb is current."""
    import json

    where = _context(home)
    loaded, selection, _, plan = _plan(where, source, _check_companies(company))
    rows: list[dict] = []
    for partition in plan.current:
        rows.append({"partition": partition, "state": "built", "reason": ""})
    for work in plan.work:
        rows.append({"partition": work.partition, "state": "missing" if work.reason == "new" else "stale", "reason": work.reason})
    for partition, problems in plan.held.items():
        rows.append({"partition": partition, "state": "kept", "reason": "a source row cannot be read: " + "; ".join(map(str, problems))})
    for partition in plan.stored_elsewhere:
        rows.append({"partition": partition, "state": "not in source", "reason": "built, but the source has no call for it"})
    rows.sort(key=lambda row: (row["partition"][0], row["partition"][1]))
    graph = "up to date" if not plan.global_reasons else "; ".join(plan.global_reasons)
    if as_json:
        print(json.dumps({"source": loaded.name, "warehouse": str(where.warehouse), "graph": graph,
                          "skipped_rows": loaded.skipped,
                          "partitions": [{"company": r["partition"][0], "quarter": r["partition"][1].isoformat(),
                                          "state": r["state"], "reason": r["reason"]} for r in rows]}, indent=1))
        return
    summary = Table("company", "built", "stale", "missing", "kept", "not in source", title=f"{loaded.name} in {where.home}")
    for ticker in sorted({row["partition"][0] for row in rows}):
        mine = [row["state"] for row in rows if row["partition"][0] == ticker]
        summary.add_row(ticker, *(str(mine.count(state)) for state in ("built", "stale", "missing", "kept", "not in source")))
    Console(soft_wrap=True).print(summary)
    for row in rows:
        if row["state"] != "built":
            print(f"{row['partition'][0]}|{row['partition'][1].isoformat()}  {row['state']}: {row['reason']}")
    for problem in loaded.problems:
        print(f"source row skipped: {problem}")
    print(f"graph ({where.warehouse}): {graph}")


def _quarter_argument(value: str) -> date:
    """'2017-01-01' (any day of the quarter) or '2017Q1'."""
    from tkg.core.partitions import quarter_start

    text = value.strip().upper()
    if len(text) == 6 and text[4] == "Q" and text[:4].isdigit() and text[5] in "1234":
        return date(int(text[:4]), 3 * (int(text[5]) - 1) + 1, 1)
    try:
        return quarter_start(date.fromisoformat(text))
    except ValueError:
        raise UsageError(f"{value!r} is not a quarter; write 2017Q1 or a date in it, e.g. 2017-01-01") from None


@app.command()
@command
def remove(
    company: Annotated[str, typer.Argument(metavar="COMPANY", help="Ticker, e.g. AMD")],
    quarter: Annotated[str, typer.Argument(metavar="QUARTER", help="2017Q1, or any date in the quarter")],
    source: SOURCE_OPTION = "sample",
    home: HOME_OPTION = None,
) -> None:
    """Delete one partition's outputs and republish the graph without it: facts that only its
    calls had retired are open again. Use it to correct a bad source or honour a deletion request."""
    from tkg.build.state import PARTITIONED_STAGES, stored_partitions
    from tkg.core.partitions import key_of
    from tkg.ingest.sources import describe, load_source
    from tkg.store.parquet import ParquetStore

    where = _context(home)
    partition = (company.strip().upper(), _quarter_argument(quarter))
    key = key_of(*partition)
    store = ParquetStore(where.home)
    if partition not in stored_partitions(store):
        raise UsageError(f"nothing is built for {key}; `tkg status` lists what is")
    with _exclusive(where):
        retired_by_it = _retired_by(where.warehouse, *partition)
        for stage in PARTITIONED_STAGES:
            store.delete(store.partition_path(stage, *partition))
        for path in store.files(f"llm_calls/*/company={partition[0]}/quarter={partition[1].isoformat()}/*.parquet"):
            store.delete(path)
        console.print(f"removed {key}")
        _, _, backend, _ = _plan(where, source)
        # Dagster's SQLite event log cannot forget one partition's materialisations
        # (wipe_asset_partitions is not implemented for it): they stay in the run history.
        defs, instance = _dagster(where, *_resources(where, source, backend))
        error = _refresh(defs, instance)
        if error:
            console.print(f"[red]the global steps failed, {where.warehouse} keeps its last contents: {error}[/]")
            raise typer.Exit(EXIT_FAILED)
    still_retired = _still_retired(where.warehouse, retired_by_it)
    console.print(f"republished {where.warehouse}: of the {len(retired_by_it)} fact(s) {key} had retired, "
                  f"{len(retired_by_it) - len(still_retired)} are open again and {len(still_retired)} are retired by other calls")
    if load_source(source).rows_for(*partition):
        console.print(f"[yellow]{describe(source)} still holds calls of {key}: remove them there, or the next "
                      "`tkg build` brings the partition back[/]")


def _still_retired(warehouse: Path, events: set[str]) -> set[str]:
    import duckdb

    with duckdb.connect(str(warehouse), read_only=True) as connection:
        return {row[0] for row in connection.execute(
            "SELECT event_id FROM events WHERE invalidated_by IS NOT NULL AND event_id IN (SELECT unnest(?::VARCHAR[]))",
            [sorted(events)]).fetchall()}


def _retired_by(warehouse: Path, company: str, quarter: date) -> set[str]:
    """Events that events of this partition retire, in the published file."""
    import duckdb

    if not warehouse.exists():
        return set()
    with duckdb.connect(str(warehouse), read_only=True) as connection:
        return {row[0] for row in connection.execute(
            "SELECT e.event_id FROM events e JOIN raw.events r ON r.event_id = e.invalidated_by "
            "WHERE r.company = ? AND r.quarter = ?", [company, quarter]).fetchall()}


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

    where = _context(home)
    if not where.warehouse.exists():
        raise UsageError(f"{where.warehouse} does not exist; run `tkg build` first (or pass --home)")
    with duckdb.connect(str(where.warehouse), read_only=True) as connection:
        connection.execute("SET TimeZone = 'UTC'")
        if query:
            try:
                relation = connection.sql(query)
                if relation is not None:
                    _print_relation(relation, output, max_rows)
            except duckdb.Error as error:
                raise UsageError(f"{str(error).splitlines()[0]} (in the query; the views are listed in the README)") from None
            return
        console.print(f"{where.warehouse} (read-only). End statements with ';', quit with Ctrl-D.")
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


@app.command()
@command
def dev(
    home: HOME_OPTION = None,
    port: Annotated[int, typer.Option("--port", "-p", metavar="PORT", min=1, max=65535, help="Port of the UI")] = 3000,
    host: Annotated[str, typer.Option(metavar="HOST", help="Interface the UI listens on")] = "127.0.0.1",
) -> None:
    """Open the Dagster UI (`dg dev`) on this data folder, with the runs `tkg build` made."""
    from tkg_assets.instance import open_instance

    where = _context(home)
    open_instance(where.dagster_home).dispose()
    project = Path(__file__).resolve().parent.parent
    environment = {**os.environ, "DAGSTER_HOME": str(where.dagster_home), "TKG_HOME": str(where.home)}
    if (project / "pyproject.toml").exists() and shutil.which("dg"):
        # A source checkout: dg finds the code location in pyproject.toml ([tool.dg]).
        os.chdir(project)
        os.execvpe("dg", ["dg", "dev", "--port", str(port), "--host", host], environment)
    # An installed wheel has no project folder: point Dagster at the module instead.
    os.execvpe("dagster", ["dagster", "dev", "-m", "tkg_assets.definitions", "-p", str(port), "-h", host], environment)


# --- answers -----------------------------------------------------------------------------------

ENTITY_ARGUMENT = Annotated[str, typer.Argument(metavar="ENTITY", help="A name, alias, ticker or canonical id")]
JSON_OPTION = Annotated[bool, typer.Option("--json", help="One JSON object on stdout, for scripts")]
PREDICATE_OPTION = Annotated[Optional[str], typer.Option(
    "--predicate", "-p", metavar="PREDICATE", help="Only this predicate (e.g. HOLDS_ROLE; a near miss is mapped and said)")]


def _graph(home: Path | None):
    from tkg.answer.query import Graph

    where = _context(home)
    if not where.warehouse.exists():
        raise UsageError(f"{where.warehouse} does not exist; run `tkg build` first (or pass --home)")
    return Graph.open(where.warehouse)


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
    from tkg.providers import Backend

    with _graph(home) as graph:
        if not offline and Backend().resolved_backend() != "offline":
            from tkg.answer.agent import answer_with_model

            result = answer_with_model(graph, question, limit=limit)
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
    with _graph(home) as graph:
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
    with _graph(home) as graph:
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
    with _graph(home) as graph:
        if graphml is not None:
            nodes, edges = export_graphml(graph, graphml, as_of=moment)
            console.print(f"wrote {graphml}: {nodes} node(s), {edges} edge(s){valid}")
        if png is not None:
            try:
                nodes, edges = subgraph_png(graph, around, png, as_of=moment)
            except ValueError as error:  # nothing around it (at that date)
                raise UsageError(str(error)) from None
            console.print(f"wrote {png}: {nodes} entities around {around}, {edges} edge(s){valid}")

if __name__ == "__main__":
    sys.exit(app())
