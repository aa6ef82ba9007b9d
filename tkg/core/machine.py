"""The machine a process runs on: its usable cores, whether a process is still alive, and a
watch on this process's memory."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import duckdb
import pyarrow as pa


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (a process of another user counts as alive). A
    process that exited but was not reaped (a zombie: a killed build's worker, in a container
    whose first process does not reap orphans) does not run, though a signal still reaches it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        pass
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether `pid` exited and waits to be reaped (False where /proc is not there)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]  # the state follows the name, which may hold ')'


def resident_bytes() -> int:
    """This process's resident memory now (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@contextmanager
def memory_released() -> Iterator[None]:
    """Once the work inside ends, however it ends, give the system back what it freed but the
    allocators keep: the pages Arrow's pool (mimalloc, jemalloc) holds for reuse and, with
    glibc, malloc's free heap (numpy's arrays, Python's objects). The memory watch counts
    resident memory, so a step that follows another in the same process (the global steps in
    one run, the shards a worker takes one after another) then starts from what it holds, not
    from what the step before it peaked at. (No garbage collection: a step's objects are freed
    as it returns, and a full collection costs 50 ms and more in a process with a big heap, a
    test run's, at every step.)"""
    try:
        yield
    finally:
        pa.default_memory_pool().release_unused()
        trim = _malloc_trim()
        if trim is not None:
            trim(0)


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, where the process's C library is glibc."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # another C library (musl, macOS): nothing to trim
        return None


# The limits of the memory watches running in this process, innermost last.
_watched_limits: list[int] = []

# What a DuckDB query may take of the memory a watch leaves the process (`room_for_duckdb`):
# DuckDB overshoots its limit a little, and Arrow batches of the query's result sit beside it.
DUCKDB_SHARE_OF_ROOM = 0.6
DUCKDB_FLOOR_BYTES = 256 * 2**20
# Size units, upper-cased: the settings' ('4GB', '1.5GiB') and DuckDB's ('953.6 MiB', '0 bytes').
SIZE_UNITS = {"": 1, "B": 1, "BYTES": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
              "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def duckdb_size_bytes(shown: str) -> int:
    """DuckDB's way of showing a size ('1.8 GiB', '953.6 MiB') in bytes."""
    number, _, unit = shown.strip().partition(" ")
    return int(float(number) * SIZE_UNITS[unit.upper()])


@contextmanager
def room_for_duckdb(connection: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """For the work inside: `connection`'s DuckDB memory limit lowered, if need be, to a share of
    what the memory watch around it (`memory_watch`) leaves beside the process's other memory
    (what it holds besides DuckDB's own buffers). A step whose Python objects already hold much
    of its limit (resolution's names at 10M events) then has DuckDB spill sooner instead of the
    process passing the limit. Without a watch, or with room to spare, nothing changes. The
    limit is then set back to the one the connection was made with
    (tkg.store.parquet.spilling_connection records it), else to DuckDB's rounding of it. A
    DuckDB out-of-memory error inside carries a note of the room it was given."""
    resident = resident_bytes()
    if not _watched_limits or not resident:
        yield
        return
    shown, given, held = connection.execute("SELECT current_setting('memory_limit'), getvariable('tkg_memory_limit'), "
                                            "(SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory())").fetchall()[0]
    other = max(0, resident - int(held))
    room = max(DUCKDB_FLOOR_BYTES, int((_watched_limits[-1] - other) * DUCKDB_SHARE_OF_ROOM))
    if room >= duckdb_size_bytes(shown):
        yield
        return
    connection.execute(f"SET memory_limit = '{room}B'")
    try:
        yield
    except duckdb.OutOfMemoryException as error:
        error.add_note(f"{DUCKDB_ROOM_NOTE}{room}")
        raise
    finally:
        connection.execute("SET memory_limit = $limit", {"limit": given or shown})


# How room_for_duckdb notes the room it gave on a DuckDB out-of-memory error (bytes follow).
DUCKDB_ROOM_NOTE = "tkg: DuckDB was given "


def duckdb_room_given(error: BaseException) -> int | None:
    """The room room_for_duckdb gave the DuckDB work that failed with `error`, if it lowered it."""
    for note in getattr(error, "__notes__", []):
        if note.startswith(DUCKDB_ROOM_NOTE):
            return int(note[len(DUCKDB_ROOM_NOTE):])
    return None


class MemoryExceeded(RuntimeError):
    """The watched work passed its memory limit and was stopped."""


@contextmanager
def memory_watch(limit: int, what: str, interrupt: Callable[[], None] | None = None, every: float = 0.5) -> Iterator[None]:
    """Stop the work inside when this process's resident memory passes `limit` bytes: the main
    thread gets MemoryExceeded naming `what` (through SIGUSR1, delivered once its current C call
    returns, and `interrupt`, which stops such a call: a DuckDB connection's), and should it
    still grow past 1.5 x the limit the process exits, rather than take the machine's memory
    from everything else. Watches only from the main thread (where the stop can be delivered)."""
    if threading.current_thread() is not threading.main_thread() or not resident_bytes():
        yield
        return
    done, passed = threading.Event(), threading.Event()
    message = f"{what}: resident memory passed {limit / 1e9:.1f} GB; stopped"

    def stop(signum, frame) -> None:
        raise MemoryExceeded(message)

    def watch() -> None:
        while not done.wait(every):
            resident = resident_bytes()
            if resident > limit and not passed.is_set():
                passed.set()
                if interrupt is not None:
                    interrupt()
                os.kill(os.getpid(), signal.SIGUSR1)
            elif resident > limit * 1.5:
                sys.stderr.write(f"{what}: resident memory {resident / 1e9:.1f} GB, past 1.5 x its limit; stopping the process\n")
                os._exit(70)

    previous = signal.signal(signal.SIGUSR1, stop)
    watcher = threading.Thread(target=watch, name="memory-watch", daemon=True)
    watcher.start()
    _watched_limits.append(limit)
    try:
        yield
    except MemoryExceeded:
        raise
    except BaseException as error:
        if passed.is_set():  # what the stop interrupted
            raise MemoryExceeded(message) from error
        raise
    finally:
        _watched_limits.pop()
        done.set()
        watcher.join()
        signal.signal(signal.SIGUSR1, previous)
