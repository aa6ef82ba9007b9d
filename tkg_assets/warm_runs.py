"""A run's process starts warm: forked from a process that has already loaded tkg's code.

Dagster's code server starts each run in a new interpreter (`multiprocessing`'s "spawn"), which
then imports Dagster, tkg's code location and the modules its steps load (chonkie for chunking,
the local embedding model): about 4 CPU-seconds before the run's first step, paid again by
every run of a UI backfill, and on two cores paid out of the time of the runs working beside it.

tkg's code server starts runs through `multiprocessing`'s "forkserver" instead: one process
imports those modules once (`tkg_assets.warm`), and each run is forked from it. Under `dagster
dev` (`tkg dev`) the code server starts that process as soon as it has loaded tkg's code, so
even a backfill's first run starts warm; elsewhere (a deploy's code server, whose runs may be
started by another launcher, a Kubernetes Job say) it starts at the first run the server starts. A forked run runs the same code on the same definitions as the code server
loaded; nothing it does reaches the other runs or the forkserver. The forkserver runs no work
and no Python thread: the native helper threads its libraries start at import (jemalloc's
background purge, polars' spill cleaner, the BLAS pool) are idle when it forks, so no lock is
held for a child to inherit (the hazard of forking a process with threads). Reloading the code
location starts a new code server, and with it a new forkserver, so a run never executes older
code than the server shows; a run still reads the source and the store when it starts, as before.

Every process that loads tkg's code location or instance imports `tkg_assets`, which applies
this (a process that is not a code server is left as it is); only a code server starts runs,
so only a code server starts the forkserver.
tests/test_warm_runs.py starts runs through a real code server.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from multiprocessing import forkserver
from typing import Any

PRELOAD = ["tkg_assets.warm"]
# Set in a code server that has started its forkserver, and so in the forkserver and the runs
# (they inherit it): none of them starts another.
STARTED = "TKG_WARM_RUNS_STARTED"
_context: multiprocessing.context.BaseContext | None = None


def run_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context a code server starts runs with: a forkserver that has
    imported PRELOAD."""
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        _context = context
    return _context


class _RunContext:
    """`DagsterApiServer._mp_ctx`, the context its StartRun starts a run's process with. A data
    descriptor on the class wins over the value the server's __init__ stored on itself, so
    servers created before tkg's code was imported start their runs warm too."""

    def __get__(self, server: Any, owner: type | None = None) -> multiprocessing.context.BaseContext:
        return run_context()

    def __set__(self, server: Any, value: Any) -> None:
        """Dagster's __init__ sets "spawn"; runs use run_context() whatever it set."""


def start_runs_warm() -> None:
    """Make Dagster's code server start runs from the forkserver (see the module docstring);
    idempotent. A code server has imported its module before it loads tkg's code; a process
    that has not (tkg build, the CLI) starts no run through it, and is left as it is."""
    server = sys.modules.get("dagster._grpc.server")
    if server is None:
        return
    DagsterApiServer = server.DagsterApiServer
    if "_mp_ctx" not in DagsterApiServer.__init__.__code__.co_names:
        raise RuntimeError("this Dagster release's code server no longer starts runs through `_mp_ctx`; "
                           "remove tkg_assets.warm_runs")
    DagsterApiServer._mp_ctx = _RunContext()  # type: ignore[attr-defined]


def start_forkserver_now() -> None:
    """Under `dagster dev`, in a code server that starts runs warm, start the forkserver now
    (tkg_assets.definitions calls this once tkg's code is loaded); elsewhere nothing."""
    server = sys.modules.get("dagster._grpc.server")
    if (server is None or not isinstance(server.DagsterApiServer.__dict__.get("_mp_ctx"), _RunContext)
            or not os.environ.get("DAGSTER_IS_DEV_CLI") or os.environ.get(STARTED)):
        return
    os.environ[STARTED] = "1"
    run_context()
    forkserver.ensure_running()  # returns at once; the forkserver imports PRELOAD on its own
