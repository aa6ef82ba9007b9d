"""`tkg explore`: the read-only explorer page over the published tkg.duckdb (tkg.explore)."""

from __future__ import annotations

from typing import Annotated

import typer

from tkg.cli.app import HOME_OPTION, UsageError, app, command, console
from tkg.settings import Settings

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@app.command()
@command
def explore(
    home: HOME_OPTION = None,
    port: Annotated[int, typer.Option("--port", "-p", metavar="PORT", min=0, max=65535, help="Port of the page")] = 8765,
    host: Annotated[str, typer.Option(metavar="HOST", help="Interface to listen on (anything but loopback shares the "
                                                           "graph with the network)")] = "127.0.0.1",
) -> None:
    """Serve a read-only page over tkg.duckdb: search, an entity's timeline as of a date, a
    company's officers, calls and guidance, and the statement behind every fact."""
    import uvicorn

    from tkg.explore.server import create_app

    settings = Settings.resolve(home=home)
    hint = "tkg build" if home is None else f"tkg build --home {home}"
    if host not in LOOPBACK:
        console.print(f"[yellow]listening on {host}: anyone who reaches this machine can read the graph[/]")
    if not settings.warehouse.exists():
        console.print(f"[yellow]{settings.warehouse} does not exist yet; the page says so until `{hint}` publishes it[/]")
    try:
        config = uvicorn.Config(create_app(settings.warehouse, hint), host=host, port=port, log_level="warning",
                                access_log=False)
    except ValueError as error:
        raise UsageError(str(error)) from None
    server = uvicorn.Server(config)
    console.print(f"tkg explore: http://{host if ':' not in host else f'[{host}]'}:{port}/ over {settings.warehouse} (Ctrl-C stops)")
    server.run()
