"""The `tkg` command: build the graph in-process with Dagster, query it, open the UI."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(help="tkg: temporal knowledge graphs from earnings-call transcripts.", no_args_is_help=True)
console = Console(stderr=True)

HOME_OPTION = Annotated[
    Optional[Path], typer.Option("--home", help="Data folder (Parquet, caches, tkg.duckdb, Dagster runs). Default: $TKG_HOME or ./tkg_data")
]


def _configure(home: Path | None, source: str | None = None) -> Path:
    """Point tkg and Dagster at one persistent folder, so `dagster dev` later shows these runs."""
    home = (home or Path(os.environ.get("TKG_HOME", "tkg_data"))).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["TKG_HOME"] = str(home)
    dagster_home = Path(os.environ.setdefault("DAGSTER_HOME", str(home / "dagster_home")))
    dagster_home.mkdir(parents=True, exist_ok=True)
    instance_config = dagster_home / "dagster.yaml"
    if not instance_config.exists():
        # tkg runs offline by default: no usage statistics leave the machine unless you turn them on.
        instance_config.write_text("telemetry:\n  enabled: false\n")
    if source is not None:
        os.environ["TKG_SOURCE"] = source
    return home


@app.command()
def build(
    source: Annotated[str, typer.Option(help="'sample' (bundled), a .parquet/.jsonl/.csv file, or 'hf' for jlh-ibm/earnings_call")] = "sample",
    company: Annotated[Optional[list[str]], typer.Option("--company", "-c", help="Only these tickers (repeatable)")] = None,
    since: Annotated[Optional[str], typer.Option(help="Only calls on or after this date (YYYY-MM-DD)")] = None,
    until: Annotated[Optional[str], typer.Option(help="Only calls on or before this date (YYYY-MM-DD)")] = None,
    home: HOME_OPTION = None,
    workers: Annotated[int, typer.Option(min=1, help="Partitions materialised at once, each run in its own process")] = 1,
) -> None:
    """Materialise every partition of the source, then resolution, invalidation and the warehouse."""
    home = _configure(home, source)
    import logging

    import dagster as dg

    logging.getLogger("alembic").setLevel(logging.WARNING)  # Dagster's first-run schema migration chatter

    from tkg.sources import load_source, quarter_start
    from tkg_assets.definitions import defs

    loaded = load_source(source)
    wanted = {c.upper() for c in company or []}
    first = date.fromisoformat(since) if since else date.min
    last = date.fromisoformat(until) if until else date.max
    rows = [r for r in loaded.rows if (not wanted or r.company in wanted) and first <= r.call_date <= last]
    from tkg.companies import load_companies

    unknown = sorted({r.company for r in rows} - set(load_companies()))
    if unknown:
        console.print(f"[yellow]skipping {', '.join(unknown)}: not in the company registry (tkg/config/companies.yaml)[/]")
        rows = [r for r in rows if r.company not in unknown]
    keys = sorted({(r.company, quarter_start(r.call_date)) for r in rows}, key=lambda k: (k[1], k[0]))
    if not keys:
        console.print(f"[red]nothing to build: no calls in {loaded.name} match the filters[/]")
        raise typer.Exit(1)
    for note in loaded.skipped:
        console.print(f"[yellow]source row skipped: {note}[/]")
    console.print(f"building {len(rows)} calls in {len(keys)} partitions from {loaded.name} into {home}")
    console.print(f"extraction: {defs.resources['extraction'].describe()}")

    if workers > 1:
        # The request limit is per process: split it so that all workers together keep to it.
        total = int(os.environ.get("TKG_MAX_IN_FLIGHT", "16"))
        os.environ["TKG_MAX_IN_FLIGHT"] = str(max(1, total // workers))
    instance = dg.DagsterInstance.get()
    failed: list[str] = []
    started = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("partitions", total=len(keys))
        for key, success in _ingest(keys, workers, instance):
            if not success:
                failed.append(key)
            progress.update(task, description=f"partition {key} {'done' if success else 'FAILED'}")
            progress.advance(task)
        progress.update(task, description="resolution, invalidation, warehouse")
        refresh = defs.resolve_job_def("refresh_graph").execute_in_process(instance=instance, raise_on_error=False, run_config=_QUIET)
    elapsed = time.perf_counter() - started
    if failed:
        console.print(f"[red]{len(failed)} partition(s) failed: {', '.join(failed)}; see `tkg dev` for the run logs[/]")
    if not refresh.success:
        console.print("[red]the refresh_graph run failed; see `tkg dev` for the run log[/]")
        raise typer.Exit(1)
    _print_counts(home)
    console.print(f"done in {elapsed:.1f}s: {home / 'tkg.duckdb'}")
    if failed:
        raise typer.Exit(1)


_QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}  # the progress bar says enough


def _ingest(keys: list[tuple[str, date]], workers: int, instance) -> Iterator[tuple[str, bool]]:
    """Run the ingest_partition job once per (ticker, quarter), yielding (key, success) as runs end.
    With workers > 1 the runs go to a pool of spawned processes sharing DAGSTER_HOME, as
    `dagster dev`'s run workers do."""
    if workers == 1:
        for ticker, quarter in keys:
            yield _ingest_one(ticker, quarter, instance)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_ingest_one, ticker, quarter): f"{ticker}|{quarter}" for ticker, quarter in keys}
        for future in as_completed(futures):
            try:
                yield future.result()
            except Exception as error:  # a worker process died: the other partitions carry on
                console.print(f"[red]partition {futures[future]}: worker failed: {error!r}[/]")
                yield futures[future], False


@functools.cache
def _worker_instance():
    import dagster as dg

    return dg.DagsterInstance.get()


def _ingest_one(ticker: str, quarter: date, instance=None) -> tuple[str, bool]:
    import logging

    from tkg_assets.definitions import defs
    from tkg_assets.partitions import partition_key

    logging.getLogger("alembic").setLevel(logging.WARNING)
    key = partition_key(ticker, quarter)
    result = defs.resolve_job_def("ingest_partition").execute_in_process(
        partition_key=key, instance=instance or _worker_instance(), raise_on_error=False, run_config=_QUIET)
    return str(key), result.success


def _warehouse_path(home: Path) -> Path:
    return Path(os.environ.get("TKG_DUCKDB") or home / "tkg.duckdb")


def _print_counts(home: Path) -> None:
    import duckdb

    path = _warehouse_path(home)
    with duckdb.connect(str(path), read_only=True) as connection:
        table = Table("table", "rows", title=str(path))
        for name in ("transcripts", "chunks", "statements", "events", "triplets", "entities", "canonical_entities",
                     "facts", "invalidation_judgments"):
            table.add_row(name, f"{connection.execute(f'SELECT count(*) FROM {name}').fetchone()[0]:,}")
        invalidated = connection.execute("SELECT count(*) FROM events WHERE invalidated_by IS NOT NULL").fetchone()[0]
        table.add_row("events invalidated", f"{invalidated:,}")
    console.print(table)


@app.command()
def sql(
    query: Annotated[Optional[str], typer.Argument(help="SQL to run; omit for an interactive prompt")] = None,
    home: HOME_OPTION = None,
) -> None:
    """Query tkg.duckdb read-only (never blocks the pipeline)."""
    import duckdb

    home = _configure(home)
    path = _warehouse_path(home)
    if not path.exists():
        console.print(f"[red]{path} does not exist; run `tkg build` first[/]")
        raise typer.Exit(1)
    with duckdb.connect(str(path), read_only=True) as connection:
        connection.execute("SET TimeZone = 'UTC'")
        if query:
            connection.sql(query).show(max_width=10_000)
            return
        console.print(f"{path} (read-only). End statements with ';', quit with Ctrl-D.")
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
                        relation.show(max_width=10_000)
                except duckdb.Error as error:
                    console.print(f"[red]{error}[/]")
                buffer = ""


@app.command()
def dev(home: HOME_OPTION = None) -> None:
    """Open the Dagster UI on this data folder (`dagster dev -w workspace.yaml`)."""
    _configure(home)
    workspace = Path("workspace.yaml")
    target = ["-w", str(workspace)] if workspace.exists() else ["-m", "tkg_assets.definitions"]
    os.execvp("dagster", ["dagster", "dev", *target])


if __name__ == "__main__":
    sys.exit(app())
