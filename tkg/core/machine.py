"""The machine a process runs on: its usable cores, whether a process is still alive, and a
watch on this process's memory."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


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
    try:
        yield
    except MemoryExceeded:
        raise
    except BaseException as error:
        if passed.is_set():  # what the stop interrupted
            raise MemoryExceeded(message) from error
        raise
    finally:
        done.set()
        watcher.join()
        signal.signal(signal.SIGUSR1, previous)
