"""Build many partitions at once, in worker processes, for `tkg build`.

Each worker rebuilds whole partitions (`tkg.build.stages.build_partition`): every stale stage of a
partition in memory, then its files, so a failure, a Ctrl-C or a kill leaves each partition
either as it was or fully rebuilt. Workers die with the process that started them (Linux
`PR_SET_PDEATHSIG`, and a watchdog elsewhere) and ignore Ctrl-C, which the parent handles by
stopping them all. Nothing here imports dagster; the Dagster op that records the results
(`tkg_assets.batch`) drives this module.

Some lines are news the caller shows while it waits (the notices: a Batch API job submitted, its
progress): whichever process builds the partition, the `NOTICE_LOGGERS` lines reach the caller
of `run_partitions` as they come (in its own thread when workers build), for the CLI and
Dagster's run log.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from tkg.build import catalog
from tkg.build.stages import Runtime, build_partition, run_global
from tkg.core.results import StageIncomplete
from tkg.ingest.sources import load_source
from tkg.settings import Settings

log = logging.getLogger(__name__)

# Loggers whose INFO lines are the build's notices (see the module docstring).
NOTICE_LOGGERS = ("tkg.llm.batch",)
# How often a caller waiting on partitions passes the notices on.
NOTICE_POLL_S = 0.5
Notice = Callable[[str], None]


class _NoticeHandler(logging.Handler):
    """Puts each line of a notice logger on a sink: the worker pool's queue, or `_Direct`."""

    def __init__(self, sink: Any) -> None:
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink.put(record.getMessage())
        except Exception:  # noqa: BLE001 - a notice must never break a build
            self.handleError(record)


def _send_notices(sink: Any) -> list[tuple[logging.Logger, logging.Handler, int, bool]]:
    """From now on the notice loggers' INFO lines go to `sink` (and not on to the root handlers,
    which would show them a second time); what it changed, to undo."""
    saved = []
    for name in NOTICE_LOGGERS:
        logger = logging.getLogger(name)
        handler = _NoticeHandler(sink)
        saved.append((logger, handler, logger.level, logger.propagate))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return saved


@contextmanager
def _notices_to(sink: Any) -> Iterator[None]:
    """While inside, the notice loggers' INFO lines go to `sink`."""
    saved = _send_notices(sink)
    try:
        yield
    finally:
        for logger, handler, level, propagate in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate


class _Direct:
    """A sink that passes each notice on at once, one at a time, from whichever thread logs it."""

    def __init__(self, on_notice: Notice | None) -> None:
        self.on_notice, self.lock = on_notice, threading.Lock()

    def put(self, line: str) -> None:
        if self.on_notice is not None:
            with self.lock:
                self.on_notice(line)


def _pass_on(notices: Any, on_notice: Notice | None) -> None:
    """Hand every notice waiting on the queue to `on_notice` (in the caller's thread)."""
    while True:
        try:
            line = notices.get_nowait()
        except (queue.Empty, OSError, ValueError):
            return
        if on_notice is not None:
            on_notice(line)


@dataclass(frozen=True)
class PartitionTask:
    company: str
    quarter: date
    stages: tuple[str, ...]
    reason: str

    @property
    def key(self) -> str:
        return f"{self.company}|{self.quarter.isoformat()}"


@dataclass(frozen=True)
class ShardTask:
    stage: str
    shard: str

    @property
    def key(self) -> str:
        return f"{self.stage} shard {self.shard}"


@dataclass(frozen=True)
class GlobalTask:
    stage: str

    @property
    def key(self) -> str:
        return self.stage


@dataclass
class StageReport:
    """What a Dagster materialisation of one stage of one partition needs, as plain data."""

    stage: str
    rows: int
    columns: list[tuple[str, str]]
    path: str  # where the table was written; "" when nothing was (a partition without a call)
    stamp: str  # Stamp.to_json()
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    input_versions: dict[str, str] = field(default_factory=dict)  # see StageResult.input_versions


@dataclass
class PartitionOutcome:
    """How a task (a partition's stages, or one shard of a shard stage) went."""

    task: PartitionTask | ShardTask
    reports: list[StageReport] = field(default_factory=list)
    error: str | None = None  # one line
    detail: str | None = None  # the traceback, for --debug and the run log
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def key(self) -> str:
        return self.task.key


def report_of(stage: str, result) -> StageReport:
    table = result.table
    return StageReport(stage=stage, rows=table.num_rows if result.rows is None else result.rows,
                       columns=[(f.name, str(f.type)) for f in table.schema],
                       path=str(result.path) if result.path is not None else "",
                       stamp=result.stamp.to_json(), counts={key: int(value) for key, value in result.counts.items()},
                       notes=list(result.notes), metadata=dict(result.metadata),
                       missing={key: int(value) for key, value in result.missing.items()},
                       input_versions=dict(result.input_versions))


# --- in a worker -----------------------------------------------------------------------------

_RUNTIMES: dict[str, Any] = {}


def _identity(settings: Settings) -> str:
    return f"{settings!r} cache={settings.cache!r}"  # the cache URL is left out of repr


def _runtime(settings: Settings) -> Runtime:
    """One runtime (providers, code versions, store) per process and settings."""
    identity = _identity(settings)
    if identity not in _RUNTIMES:
        _RUNTIMES[identity] = Runtime.open(settings)
    return _RUNTIMES[identity]


def build_one(settings: Settings, task: PartitionTask | ShardTask | GlobalTask) -> PartitionOutcome:
    """Rebuild one partition's stale stages, or run one shard of a shard stage; every error is
    caught and described."""
    started = time.perf_counter()
    outcome = PartitionOutcome(task)
    try:
        if isinstance(task, (ShardTask, GlobalTask)):
            result = run_global(_runtime(settings), catalog.stage(task.stage), getattr(task, "shard", None))
            outcome.reports = [report_of(task.stage, result)]
        else:
            runtime, loaded = _runtime(settings), load_source(settings.source)
            _refuse_held(runtime, loaded, task)
            partition = (task.company, task.quarter)
            # The task names every stage to rebuild: a plan closes them downstream itself, and a
            # Dagster run builds exactly the assets it was asked for.
            results = build_partition(runtime, partition, set(task.stages), loaded.rows_for(*partition),
                                      downstream=False, without_call=loaded.without_call(*partition))
            outcome.reports = [report_of(stage, result) for stage, result in results.items()]
    except StageIncomplete as error:
        outcome.error = str(error)
    except Exception as error:  # noqa: BLE001 - one partition's failure must not stop the others
        outcome.error = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        outcome.detail = traceback.format_exc()
    outcome.seconds = time.perf_counter() - started
    return outcome


def _refuse_held(runtime: Runtime, loaded, task: PartitionTask) -> None:
    """A partition built before whose source row turned unreadable keeps what it was built from:
    rebuilding its source stage would drop that call. The plan of `tkg build` holds such
    partitions itself; a Dagster run asked for them gets this error, naming the row."""
    partition = (task.company, task.quarter)
    held = loaded.problem_partitions().get(partition)
    if not held:
        return
    for stage in catalog.PARTITIONED:
        if stage.outside_inputs and stage.name in task.stages \
                and runtime.store.is_file(runtime.store.partition_path(stage.name, *partition)):
            raise StageIncomplete(stage.name, task.key, "a source row of this partition cannot be read ("
                                  + "; ".join(map(str, held)) + "); fix the row to rebuild it")


def die_with_parent(parent: int) -> None:
    """Make this process die when `parent` does, even if the parent is killed with -9."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:  # for platforms without PR_SET_PDEATHSIG
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="tkg-parent-watch", daemon=True).start()


def _worker_init(parent: int, log_level: str, notices: Any) -> None:
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C stops
    logging.getLogger("tkg").setLevel(log_level)
    _send_notices(notices)  # for the worker's whole life


# --- in the parent ---------------------------------------------------------------------------


def _warm(settings: Settings) -> None:
    """Load what a build needs (modules, the local embedding model, the source) before the first
    task. The local model warms up: a paid embedder would make a request nobody accounts for."""
    _runtime(settings).providers.chunk_embedder.embed(["warm up"])
    load_source(settings.source)


def _new_pool(settings: Settings, workers: int, log_level: str) -> ProcessPoolExecutor:
    context = multiprocessing.get_context("spawn")
    notices = context.Queue()
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_worker_init,
                               initargs=(os.getpid(), log_level, notices))
    pool.notices = notices  # type: ignore[attr-defined]  # what run_partitions passes on
    for _ in range(workers):
        pool.submit(_warm, settings)
    return pool


_prestarted: dict[tuple[str, int, str], ProcessPoolExecutor] = {}


def prestart(settings: Settings, workers: int, log_level: str = "WARNING") -> None:
    """Start (and warm up) the worker processes now, while the caller sets up Dagster: the
    seconds they take to start then overlap with that set-up. `run_partitions` with the same
    settings, worker count and log level takes them over. `settings` are one worker's
    (Settings.for_workers)."""
    if workers > 1 and (_identity(settings), workers, log_level) not in _prestarted:
        _prestarted[(_identity(settings), workers, log_level)] = _new_pool(settings, workers, log_level)


def run_partitions(settings: Settings, tasks: list[PartitionTask] | list[ShardTask], workers: int,
                   log_level: str = "WARNING", on_notice: Notice | None = None) -> Iterator[PartitionOutcome]:
    """Run `tasks` (partitions to build, or shards of a shard stage), yielding each outcome as it
    lands; `on_notice` gets the notices (see the module docstring) meanwhile. With one worker
    the tasks run in this process; otherwise in `workers` spawned processes, so each shard's
    memory is its own. On KeyboardInterrupt (or when the caller
    stops iterating) the workers are killed at once and nothing more starts."""
    if workers <= 1 or len(tasks) <= 1:
        # Built on this thread (where a memory watch can stop it), so the notices are passed on
        # from the thread that logs them.
        with _notices_to(_Direct(on_notice)):
            for task in tasks:
                yield build_one(settings, task)
        return
    pool = (_prestarted.pop((_identity(settings), workers, log_level), None)
            or _new_pool(settings, min(workers, len(tasks)), log_level))
    pending: dict[Future, PartitionTask] = {}
    waiting = list(tasks)
    finished = False
    try:
        # Two partitions per worker are queued, so a worker never waits while the caller records
        # a result, and a stop loses little more than the partitions being built.
        while waiting or pending:
            while waiting and len(pending) < 2 * workers:
                task = waiting.pop(0)
                pending[pool.submit(build_one, settings, task)] = task
            done, _ = wait(pending, timeout=NOTICE_POLL_S, return_when=FIRST_COMPLETED)
            _pass_on(pool.notices, on_notice)
            outcomes = []
            for future in done:
                task = pending.pop(future)
                try:
                    outcomes.append(future.result())
                except Exception as error:  # the worker process died (killed, out of memory)
                    outcomes.append(PartitionOutcome(task, error=f"the worker building it died ({type(error).__name__}: {error})"))
            while waiting and len(pending) < 2 * workers:  # refill before the caller takes its time
                task = waiting.pop(0)
                pending[pool.submit(build_one, settings, task)] = task
            yield from outcomes
        _pass_on(pool.notices, on_notice)
        finished = True
    finally:
        if finished:
            pool.shutdown(wait=True)
        else:
            kill_workers(pool)


def kill_workers(pool: ProcessPoolExecutor) -> None:
    """Stop every worker now (Python 3.11 has no public call for it)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        try:
            process.kill()
        except (OSError, ValueError):
            pass
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.join(timeout=5)
