"""The published file as the explorer reads it: opened read-only, reopened when a build
replaces it.

`tkg build` publishes by writing a new file and swapping it in with os.replace, so the path may
point at a new inode between two requests. Each request stats the path; when the file changed,
a fresh read-only connection is opened and later requests use it, while requests still running
keep their cursor on the old file (its inode lives until its last connection closes). Nothing
is ever written, and DuckDB's external access is off (Graph.open), so no request can read any
other file.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from tkg.answer.query import Graph, QueryError

# What the pages read; a file without them is not a (complete) tkg graph.
REQUIRED = ("facts", "fact_history", "facts_as_of", "officer_tenures", "metrics", "metrics_as_of", "entity_aliases",
            "canonical_entities", "events", "chunks", "transcripts")


class NotPublished(Exception):
    """No usable tkg.duckdb: the message says how to build one."""


@dataclass
class _Generation:
    key: tuple[int, int, int]
    graph: Graph
    aliases: list


class Published:
    def __init__(self, path: Path, home_hint: str | None = None) -> None:
        self.path = Path(path)
        self.home_hint = home_hint or "tkg build"
        self._lock = threading.Lock()
        self._current: _Generation | None = None

    def _how_to_build(self) -> str:
        return f"run `{self.home_hint}` to build it, then reload this page"

    def graph(self) -> Graph:
        """A Graph on its own cursor of the current file (one per request: DuckDB cursors are
        not shared between threads)."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            raise NotPublished(f"{self.path} does not exist yet; {self._how_to_build()}") from None
        key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if self._current is None or self._current.key != key:
                self._current = self._open(key)
            current = self._current
        graph = Graph(current.graph.connection.cursor(), self.path)
        graph._aliases = current.aliases  # loaded once per file, shared by every request on it
        return graph

    def _open(self, key: tuple[int, int, int]) -> _Generation:
        try:
            graph = Graph.open(self.path)
        except QueryError as error:
            raise NotPublished(f"{self.path} cannot be read as a tkg graph ({error}); {self._how_to_build()}") from None
        names = {row[0] for row in graph.connection.execute(
            "SELECT table_name FROM information_schema.tables UNION SELECT function_name FROM duckdb_functions() "
            "WHERE function_type = 'table_macro'").fetchall()}
        missing = [name for name in REQUIRED if name not in names]
        if missing:
            graph.close()
            raise NotPublished(f"{self.path} is not a complete tkg graph (it lacks {', '.join(missing)}); "
                               f"{self._how_to_build()}")
        # The previous generation is not closed here: requests still running hold cursors on it,
        # and it closes when the last of them is gone.
        return _Generation(key, graph, graph._alias_rows())
