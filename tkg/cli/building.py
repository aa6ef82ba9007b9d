"""The `tkg` commands that build and look after the graph: build, status, remove, dev.

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
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from tkg.build import catalog
from tkg.build.runner import prestart
from tkg.cli.app import (
    COMPANY_OPTION,
    EXIT_FAILED,
    EXIT_SKIPPED,
    HOME_OPTION,
    SOURCE_OPTION,
    UsageError,
    app,
    chosen_source,
    command,
    console,
    parse_date,
    remember_source,
    state,
)
from tkg.core.machine import usable_cores
from tkg.core.paths import PACKAGE_DIR
from tkg.ingest.sources import describe
from tkg.providers import fingerprints
from tkg.settings import Settings
from tkg.store.parquet import locked, remove_orphaned_temporaries

# What a build's summary counts in the published file.
_COUNTED_VIEWS = ("transcripts", "chunks", "statements", "events", "triplets", "entities", "canonical_entities", "facts",
                  "metrics", "invalidation_judgments")

# Offline, a worker process pays about three seconds to start (imports, the embedding model):
# worth it only for about this much transcript text to build.
TEXT_PER_WORKER = 2_000_000


def auto_workers(plan, loaded, settings: Settings) -> int:
    """Worker processes for a build when --workers is not given: one per core for the LLM
    path (partitions wait on the provider), and offline as many as the text to build keeps busy."""
    partitions = len(plan.work)
    if not settings.offline:
        return max(1, min(usable_cores(), partitions))
    text = sum(len(row.text) for work in plan.work for row in loaded.rows_for(*work.partition))
    return max(1, min(usable_cores(), partitions, -(-text // TEXT_PER_WORKER)))



@app.command()
@command
def build(
    source: SOURCE_OPTION = None,
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
    llm_mode: Annotated[Optional[str], typer.Option(
        "--llm-mode", metavar="MODE", help="sync: requests as they come; batch: each LLM stage through OpenAI's Batch API "
                                           "at half price, answers within 24 h, resumable (TKG_LLM_MODE)")] = None,
) -> None:
    """Build what changed: new or changed calls, stages whose code (prompt, model, rules) changed,
    then resolution, invalidation and tkg.duckdb. Says 'up to date' when nothing did."""
    first, last = parse_date(since, "--since"), parse_date(until, "--until")
    if first and last and first > last:
        raise UsageError(f"--since {since} is after --until {until}; swap them")
    wanted = _check_companies(company)
    if llm_mode is not None and llm_mode not in ("sync", "batch"):
        raise UsageError(f"--llm-mode must be sync or batch, got {llm_mode!r}")
    settings = Settings.resolve(home=home, source=chosen_source(home, source), allow_partial=allow_partial or None,
                                llm_mode=llm_mode)
    with _exclusive(settings):
        _build(settings, wanted, first, last, workers, force)


def _exclusive(settings: Settings):
    """One build at a time per data folder: a second waits for the first, then finds most of
    its work done."""
    return locked(settings.home / ".build.lock", lambda pid: console.print(
        f"another tkg build (pid {pid}) is running on {settings.home}; waiting for it to finish"))


def _build(settings: Settings, wanted: set[str], first: date | None, last: date | None, workers: int | None,
           force: bool) -> None:
    source = settings.source
    removed = remove_orphaned_temporaries(settings.home)
    if removed:
        console.print(f"removed {len(removed)} temporary file(s) a killed build left behind")

    loaded, selection, plan = _plan(settings, wanted, force, first, last)
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
        remember_source(settings.home, source)
        console.print(f"up to date: {len(plan.current)} partition(s) of {describe(source)} and {settings.warehouse}")
        raise typer.Exit(EXIT_SKIPPED if skipped else 0)

    if plan.work:
        console.print(f"building {len(plan.work)} of {len(selection)} partition(s) from {describe(source)} into {settings.home} "
                      f"({len(plan.current)} up to date)")
    else:
        console.print(f"all {len(plan.current)} partition(s) up to date; refreshing the graph: {'; '.join(plan.global_reasons)}")
    console.print(f"extraction: {settings.describe()}")
    report = BuildRecord(started=time.perf_counter(), partitions=len(plan.work))
    workers = min(workers or auto_workers(plan, loaded, settings), max(1, len(plan.work)))
    report.workers = workers
    if plan.work:  # the workers start up while Dagster does
        prestart(settings.for_workers(workers), workers, _log_level())
    progress = _BuildProgress(len(plan.work), report)
    try:
        defs, instance = _dagster(settings, progress.observe)
        report.mark("dagster_setup")
        failed = _ingest(defs, instance, plan, workers, progress) if plan.work else []
        report.mark("partitions")
        report.failed = dict(failed)
        if failed and not settings.allow_partial:
            console.print(f"[red]{len(failed)} partition(s) failed and kept their last good output; {settings.warehouse} was "
                          "not refreshed:[/]")
            for key, error in failed:
                console.print(f"[red]  {key}: {error}[/]")
            console.print("rerun `tkg build` to retry them (answers already received are cached)")
            raise typer.Exit(EXIT_FAILED)
        error = _refresh(defs, instance, max(1, min(usable_cores(), settings.shards)), report)
        report.mark("global_steps")
        if error:
            report.failed["global steps"] = error
            console.print(f"[red]the global steps failed, {settings.warehouse} keeps its last good contents: {error}[/]")
            raise typer.Exit(EXIT_FAILED)
        report.status = "published"
        remember_source(settings.home, source)
    finally:
        report.write(settings.home / "last_build.json")
    partial = _print_counts(settings.warehouse)
    console.print(f"done in {time.perf_counter() - report.started:.1f}s ({report.summary()}): {settings.warehouse}")
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


def _dagster(settings: Settings, progress: Callable | None = None):
    """The definitions for `settings` (passed directly, never through os.environ) and the instance."""
    import logging

    from tkg_assets.definitions import build_definitions
    from tkg_assets.instance import fail_orphaned_runs, open_instance

    logging.getLogger("alembic").setLevel(logging.WARNING)  # Dagster's first-run schema migration chatter
    instance = open_instance(settings.dagster_home)
    orphaned = fail_orphaned_runs(instance)
    if orphaned:
        console.print(f"marked {len(orphaned)} run(s) of killed builds as failed")
    return build_definitions(settings, progress=progress) if progress else build_definitions(settings), instance


# The progress bar and the summary say enough; the run log in Dagster keeps every event.
_QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


class _BuildProgress:
    """Follows the partitions of `build_partitions` as they land (the op's `progress` resource):
    a progress bar, the stage seconds, and what failed or was kept partial."""

    def __init__(self, total: int, report: BuildRecord) -> None:
        self.total, self.report = total, report
        self.failed: list[tuple[str, str]] = []
        self.partial: list[tuple[str, dict]] = []
        self.bar: Progress | None = None
        self.task = None

    def observe(self, outcome) -> None:
        if isinstance(outcome, str):  # a notice: a Batch API job submitted, its progress
            (self.bar.console if self.bar is not None else console).print(outcome, markup=False, highlight=False)
            return
        self.report.stage_seconds += outcome.seconds
        if not outcome.ok:
            self.failed.append((outcome.key, outcome.error))
        lacking = {k: v for stage in outcome.reports for k, v in stage.missing.items()}
        if lacking:
            self.partial.append((outcome.key, lacking))
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=f"partition {outcome.key} {'done' if outcome.ok else 'FAILED'}")


def _ingest(defs, instance, plan, workers: int, progress: _BuildProgress) -> list[tuple[str, str]]:
    """Run the build_partitions job; the failed partitions with their reasons."""
    from tkg_assets.instance import run_failure, run_in_process, run_tags

    config = {"stages": {work.key: sorted(work.stages) for work in plan.work},
              "reasons": {work.key: work.reason for work in plan.work}, "workers": workers,
              "log_level": _log_level()}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as bar:
        progress.bar, progress.task = bar, bar.add_task("partitions", total=progress.total)
        try:
            result = run_in_process(defs, "build_partitions", instance, tags=run_tags(),
                                    run_config={**_QUIET, "ops": {"build_stale_partitions": {"config": config}}})
        finally:
            progress.bar = None
    failed = list(progress.failed)
    error = run_failure(result, "build_partitions")
    if error and not failed:  # the run itself failed, not a partition: nothing may be refreshed
        failed.append(("build_partitions", error))
    for key, lacking in progress.partial:
        console.print(f"[yellow]{key} kept a partial result: {', '.join(f'{n} {k}' for k, n in sorted(lacking.items()))}; "
                      "the next build retries what is missing[/]")
    return failed


def _refresh(defs, instance, workers: int = 1, report: BuildRecord | None = None) -> str | None:
    """Run the global half (global steps in this process, shards in `workers` processes), then
    publish; None on success, else the first failure's message."""
    from tkg_assets.instance import run_failure, run_in_process, run_tags

    config = {**_QUIET, "ops": {"refresh_global_steps": {"config": {"workers": workers, "log_level": _log_level()}}}}
    for job_name, run_config in (("refresh_graph", config), ("publish_graph", _QUIET)):
        result = run_in_process(defs, job_name, instance, run_config=run_config, tags=run_tags())
        if report is not None:
            report.steps.update({stats.step_key: round(stats.end_time - stats.start_time, 3)
                                 for stats in instance.get_run_step_stats(result.run_id) if stats.end_time and stats.start_time})
        error = run_failure(result, job_name)
        if error:
            return error
    return None


def _print_counts(path: Path) -> bool:
    """Row counts of the published file; True when it was published from a partial result."""
    import duckdb

    from tkg.store.warehouse import published_stamp

    with duckdb.connect(str(path), read_only=True) as connection:
        table = Table("table", "rows", title=str(path))
        for name in _COUNTED_VIEWS:
            table.add_row(name, f"{connection.execute(f'SELECT count(*) FROM {name}').fetchone()[0]:,}")
        invalidated = connection.execute("SELECT count(*) FROM events WHERE invalidated_by IS NOT NULL").fetchone()[0]
        table.add_row("events invalidated", f"{invalidated:,}")
        how = connection.execute("SELECT value FROM raw.build_info WHERE key = 'publish'").fetchall()
        if how:
            table.caption = f"publish: {how[0][0]}"
    console.print(table)
    stamp = published_stamp(path)
    if stamp is not None and stamp.missing:
        console.print(f"[yellow]published from a partial result: {stamp.missing}[/]")
        return True
    return False


def _plan(settings: Settings, wanted: set[str] | None = None, force: bool = False, since: date | None = None,
          until: date | None = None):
    """Load the source and plan a build: (loaded source, selection, plan)."""
    from tkg.build.graph import partitions_of
    from tkg.build.plan import plan_build
    from tkg.ingest.sources import load_source
    from tkg.store.warehouse import published_stamp

    loaded = load_source(settings.source)
    selection = partitions_of(loaded, wanted or None, since, until)
    plan = plan_build(settings.store(), loaded, selection, catalog.code_versions(fingerprints(settings)), force=force,
                      warehouse_stamp=published_stamp(settings.warehouse), shards=settings.shards)
    return loaded, selection, plan


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
    source: SOURCE_OPTION = None,
    company: COMPANY_OPTION = None,
    home: HOME_OPTION = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, for scripts")] = False,
) -> None:
    """What is built, stale or missing, per company and quarter, and whether tkg.duckdb is current."""
    import json

    settings = Settings.resolve(home=home, source=chosen_source(home, source))
    loaded, selection, plan = _plan(settings, _check_companies(company))
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
        print(json.dumps({"source": loaded.name, "warehouse": str(settings.warehouse), "graph": graph,
                          "skipped_rows": loaded.skipped,
                          "partitions": [{"company": r["partition"][0], "quarter": r["partition"][1].isoformat(),
                                          "state": r["state"], "reason": r["reason"]} for r in rows]}, indent=1))
        return
    summary = Table("company", "built", "stale", "missing", "kept", "not in source", title=f"{loaded.name} in {settings.home}")
    for ticker in sorted({row["partition"][0] for row in rows}):
        mine = [row["state"] for row in rows if row["partition"][0] == ticker]
        summary.add_row(ticker, *(str(mine.count(state)) for state in ("built", "stale", "missing", "kept", "not in source")))
    Console(soft_wrap=True).print(summary)
    for row in rows:
        if row["state"] != "built":
            print(f"{row['partition'][0]}|{row['partition'][1].isoformat()}  {row['state']}: {row['reason']}")
    for problem in loaded.problems:
        print(f"source row skipped: {problem}")
    print(f"graph ({settings.warehouse}): {graph}")


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
    source: SOURCE_OPTION = None,
    home: HOME_OPTION = None,
) -> None:
    """Delete one partition's outputs and republish the graph without it: facts that only its
    calls had retired are open again. Use it to correct a bad source or honour a deletion request."""
    from tkg.build.state import stored_partitions
    from tkg.core.partitions import key_of
    from tkg.ingest.sources import describe, load_source

    settings = Settings.resolve(home=home, source=chosen_source(home, source))
    source = settings.source
    partition = (company.strip().upper(), _quarter_argument(quarter))
    key = key_of(*partition)
    store = settings.store()
    if partition not in stored_partitions(store):
        raise UsageError(f"nothing is built for {key}; `tkg status` lists what is")
    with _exclusive(settings):
        retired_by_it = _retired_by(settings.warehouse, *partition)
        for name in catalog.PARTITIONED_NAMES:
            store.delete(store.partition_path(name, *partition))
        for path in store.files(f"llm_calls/*/company={partition[0]}/quarter={partition[1].isoformat()}/*.parquet"):
            store.delete(path)
        console.print(f"removed {key}")
        # Dagster's SQLite event log cannot forget one partition's materialisations
        # (wipe_asset_partitions is not implemented for it): they stay in the run history.
        defs, instance = _dagster(settings)
        error = _refresh(defs, instance)
        if error:
            console.print(f"[red]the global steps failed, {settings.warehouse} keeps its last contents: {error}[/]")
            raise typer.Exit(EXIT_FAILED)
    still_retired = _still_retired(settings.warehouse, retired_by_it)
    console.print(f"republished {settings.warehouse}: of the {len(retired_by_it)} fact(s) {key} had retired, "
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



@app.command()
@command
def dev(
    home: HOME_OPTION = None,
    port: Annotated[int, typer.Option("--port", "-p", metavar="PORT", min=1, max=65535, help="Port of the UI")] = 3000,
    host: Annotated[str, typer.Option(metavar="HOST", help="Interface the UI listens on")] = "127.0.0.1",
) -> None:
    """Open the Dagster UI (`dg dev`) on this data folder, with the runs `tkg build` made."""
    from tkg_assets.instance import open_instance

    settings = Settings.resolve(home=home)
    open_instance(settings.dagster_home).dispose()
    project = PACKAGE_DIR.parent
    environment = {**os.environ, "DAGSTER_HOME": str(settings.dagster_home), "TKG_HOME": str(settings.home)}
    remembered = chosen_source(home, None)
    if remembered is not None:  # the UI's partitions are those of the source this folder was built from
        environment["TKG_SOURCE"] = remembered
    # Programs beside the running Python come first: `.venv/bin/tkg dev` (or a pipx install)
    # works without activating the environment, for dg and for the dagster processes it starts.
    environment["PATH"] = os.pathsep.join([str(scripts_folder()), environment.get("PATH", "")]).rstrip(os.pathsep)
    dg_program = program("dg")
    if (project / "pyproject.toml").exists() and dg_program:
        # A source checkout: dg finds the code location in pyproject.toml ([tool.dg]).
        os.chdir(project)
        os.execve(dg_program, [dg_program, "dev", "--port", str(port), "--host", host], environment)
    dagster_program = program("dagster")
    if dagster_program is None:
        raise UsageError(f"neither dg nor dagster is installed beside {sys.executable} or on PATH; "
                         "install tkg's dependencies (pip install -e .) into that environment")
    # An installed wheel has no project folder: point Dagster at the module instead.
    os.execve(dagster_program, [dagster_program, "dev", "-m", "tkg_assets.definitions", "-p", str(port), "-h", host],
              environment)


def scripts_folder() -> Path:
    """Where the running Python's environment keeps its programs (not resolved: a venv's python
    is a link to the system's, and its programs sit beside the link)."""
    return Path(sys.executable).parent


def program(name: str) -> str | None:
    """A program of this environment: beside the running Python first, then on PATH. Every
    command that starts another program finds it this way."""
    beside = scripts_folder() / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)
