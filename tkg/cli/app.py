"""The `tkg` command's application: its options, its errors and exit statuses. The commands
live in tkg.cli.building (build, status, remove, dev), tkg.cli.answers (sql, ask, facts,
timeline, export) and tkg.cli.exploring (explore).

Exit status: 0 done; 1 something could not be built (what was built before is kept, and
tkg.duckdb is not replaced by a worse one); 2 a usage mistake (the message names the fix);
3 built and published, but source rows were skipped or a partial result was kept;
130 interrupted (nothing half-done is published; a rerun finishes the job).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from functools import wraps
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

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
SOURCE_OPTION = Annotated[Optional[str], typer.Option(
    metavar="SOURCE", help="'sample' (bundled), a .parquet/.jsonl/.csv file with company,date,transcript, or 'hf' "
                           "for jlh-ibm/earnings_call. Default: $TKG_SOURCE, else the source this data folder was last "
                           "built from (built_from.json), else 'sample'")]
BUILT_FROM = "built_from.json"  # in the data folder: the source its graph was last built from


def remember_source(home: Path, source: str) -> None:
    """Record what `home` was built from, so status, remove, dev and the next build compare
    against the same source rather than the bundled sample."""
    import json

    from tkg.ingest.sources import source_path

    path = source_path(source)
    recorded = source if path is None or source in ("", "sample") else str(path.resolve())
    temporary = home / f".{BUILT_FROM}.{os.getpid()}"
    temporary.write_text(json.dumps({"source": recorded}) + "\n")
    os.replace(temporary, home / BUILT_FROM)


def chosen_source(home: Path | None, source: str | None) -> str | None:
    """--source if given; else None when TKG_SOURCE is set (Settings reads it); else the source
    the data folder was last built from; else None (the bundled sample)."""
    import json

    from tkg.settings import Settings

    if source is not None or os.environ.get("TKG_SOURCE"):
        return source
    record = Settings.resolve(home=home).home / BUILT_FROM
    try:
        remembered = json.loads(record.read_text())["source"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"{record} is not what tkg writes; delete it, or pass --source") from None
    return str(remembered)
COMPANY_OPTION = Annotated[Optional[list[str]], typer.Option("--company", "-c", metavar="TICKER", help="Only these tickers (repeatable)")]


def parse_date(value: str | None, option: str) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise UsageError(f"{option} {value!r} is not a date; write it as YYYY-MM-DD, e.g. {option} 2017-01-31") from None
