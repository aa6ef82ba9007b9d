"""A response cache shared by partitions, runs and processes: SQLite in WAL mode.

Keys are sha256 of (stage, model, prompt-template hash, settings, normalised input), so a
rematerialisation with a warm cache makes no request, and editing a prompt misses only the
calls that prompt shapes. The cache lives beside the data, never inside tkg.duckdb.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path


def cache_key(stage: str, model: str, template_sha256: str, settings: str, normalised_input: str) -> str:
    return hashlib.sha256("\x1f".join((stage, model, template_sha256, settings, normalised_input)).encode()).hexdigest()


def normalise(text: str) -> str:
    return " ".join(text.split())


class ResponseCache:
    """Get and put JSON responses by key; safe across threads and processes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._connection() as connection:
            connection.execute(
                "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, stage TEXT, model TEXT, "
                "response TEXT NOT NULL, created_at REAL)"
            )

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA busy_timeout=30000")
            connection.execute("PRAGMA synchronous=NORMAL")
            self._local.connection = connection
        return connection

    def get(self, key: str) -> object | None:
        row = self._connection().execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, stage: str, model: str, response: object) -> None:
        self._connection().execute(
            "INSERT OR REPLACE INTO responses (key, stage, model, response, created_at) VALUES (?, ?, ?, ?, ?)",
            (key, stage, model, json.dumps(response), time.time()),
        )

    def __len__(self) -> int:
        return self._connection().execute("SELECT count(*) FROM responses").fetchone()[0]
