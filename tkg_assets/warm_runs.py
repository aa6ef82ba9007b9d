"""A run's process starts warm: forked from a process that has already loaded tkg's code.

Dagster's code server starts each run in a new interpreter (`multiprocessing`'s "spawn"), which
then imports Dagster, tkg's code location and the modules its steps load (chonkie for chunking,
the local embedding model): about 4 CPU-seconds before the run's first step, paid again by
every run of a UI backfill, and on two cores paid out of the time of the runs working beside it.

tkg's code server starts runs through `multiprocessing`'s "forkserver" instead: one process,
started as the code server loads tkg's code, imports those modules once (`tkg_assets.warm`;
about 300 MB, shared with the runs forked from it), and each run is forked from it. The
forkserver is a new interpreter that imports tkg's code from the installed package when it
starts, a few seconds after the code server did: Dagster's "Reload" starts a new code server,
and with it a new forkserver, so an edit to tkg's code reaches runs at a reload, as it reaches
the UI (without the forkserver, a run imported whatever was on disk when it started). A run
still reads the source and the store when it starts, as before.

A forked run dies with the forkserver (the forkserver reports its runs' exits to the code
server, which would otherwise report a run whose forkserver died as failed while it worked on).
The forkserver runs no work and no Python thread; the native helper threads its libraries
start at import (jemalloc's background purge, polars' spill cleaner, the BLAS pool) are idle
when it forks. tests/test_warm_runs.py starts runs through a real code server, builds a
partition in one, and kills the forkserver under a working run.

Every process that loads tkg's code location or instance imports `tkg_assets`, which applies
this where Dagster's code server is loaded; only a code server starts runs through it. If a
Dagster release changes how its code server starts runs, runs start as Dagster starts them and
a warning says so.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import sys
from multiprocessing import forkserver
from typing import Any

PRELOAD = ["tkg_assets.warm"]
# Set in a code server that has started its forkserver, and so in the forkserver and the runs
# (they inherit it): none of them starts another.
STARTED = "TKG_WARM_RUNS_STARTED"
log = logging.getLogger(__name__)


@functools.cache
def run_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context a code server starts runs with: a forkserver that has
    imported PRELOAD."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


class _RunContext:
    """`DagsterApiServer._mp_ctx`, the context its StartRun starts a run's process with. A data
    descriptor on the class wins over the value the server's __init__ stored on itself, so
    servers created before tkg's code was imported start their runs warm too."""

    def __get__(self, server: Any, owner: type | None = None) -> multiprocessing.context.BaseContext:
        return run_context()

    def __set__(self, server: Any, value: Any) -> None:
        """Dagster's __init__ sets "spawn"; runs use run_context() whatever it set."""


def _server_class() -> type | None:
    """Dagster's code server class, if this process has loaded it (a code server has, before
    it loads tkg's code); None elsewhere."""
    server = sys.modules.get("dagster._grpc.server")
    return None if server is None else server.DagsterApiServer


def start_runs_warm() -> None:
    """Make Dagster's code server start runs from the forkserver (see the module docstring);
    idempotent. A process that has not loaded Dagster's code server (tkg build, the CLI) is
    left as it is."""
    server = _server_class()
    if server is None or isinstance(server.__dict__.get("_mp_ctx"), _RunContext):
        return
    if "_mp_ctx" not in server.__init__.__code__.co_names:
        log.warning("this Dagster release's code server no longer starts runs through `_mp_ctx`: runs start as "
                    "Dagster starts them (tkg_assets/warm_runs.py has nothing to do; remove it)")
        return
    server._mp_ctx = _RunContext()


def start_forkserver_now() -> None:
    """In a code server that starts runs warm, start the forkserver now (tkg_assets.definitions
    calls this once tkg's code is loaded), so that it has loaded tkg's code before the first
    run asks for it: the code server waits for it while it starts a run. Elsewhere nothing."""
    server = _server_class()
    if server is None or not isinstance(server.__dict__.get("_mp_ctx"), _RunContext) or os.environ.get(STARTED):
        return
    os.environ[STARTED] = "1"
    try:
        run_context()
        forkserver.ensure_running()  # returns at once; the forkserver imports PRELOAD on its own
    except OSError as error:  # the first run tries again, and fails with Dagster's own error if it cannot
        log.warning(f"the process runs are forked from could not start now: {error}")
