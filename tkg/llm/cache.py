"""A response cache shared by partitions, runs and processes: SQLite in WAL mode on one
machine, or a PostgreSQL table shared by many (TKG_CACHE=postgresql://...).

Keys are sha256 of (stage, model, prompt-template hash, settings, normalised input), so a
rematerialisation with a warm cache makes no request, and editing a prompt misses only the
calls that prompt shapes. Both stores hold the same rows under the same keys. The cache lives
beside the data, never inside tkg.duckdb.
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


class PostgresResponseCache:
    """The same cache in a PostgreSQL table (`tkg_llm_responses`), for workers on several
    machines: an answer one worker paid for is a hit for all. Needs psycopg2 (tkg[distributed])."""

    TABLE = "tkg_llm_responses"

    def __init__(self, dsn: str) -> None:
        try:
            import psycopg2
        except ImportError as error:
            raise RuntimeError("TKG_CACHE names a PostgreSQL database, but psycopg2 is not installed; "
                               "pip install 'tkg[distributed]'") from error
        self._connect = lambda: psycopg2.connect(dsn)
        self._local = threading.local()
        with self._connection() as connection, connection.cursor() as cursor:
            # Workers starting together would race on CREATE TABLE IF NOT EXISTS; one at a time.
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.TABLE,))
            cursor.execute(f"CREATE TABLE IF NOT EXISTS {self.TABLE} (key TEXT PRIMARY KEY, stage TEXT, model TEXT, "
                           "response TEXT NOT NULL, created_at DOUBLE PRECISION)")

    def _connection(self):
        connection = getattr(self._local, "connection", None)
        if connection is None or connection.closed:
            connection = self._connect()
            self._local.connection = connection
        return connection

    def _run(self, sql: str, parameters: tuple = ()) -> list[tuple]:
        with self._connection() as connection, connection.cursor() as cursor:  # one transaction
            cursor.execute(sql, parameters)
            return cursor.fetchall() if cursor.description else []

    def get(self, key: str) -> object | None:
        rows = self._run(f"SELECT response FROM {self.TABLE} WHERE key = %s", (key,))
        return json.loads(rows[0][0]) if rows else None

    def put(self, key: str, stage: str, model: str, response: object) -> None:
        self._run(f"INSERT INTO {self.TABLE} (key, stage, model, response, created_at) VALUES (%s, %s, %s, %s, %s) "
                  "ON CONFLICT (key) DO UPDATE SET response = EXCLUDED.response, created_at = EXCLUDED.created_at",
                  (key, stage, model, json.dumps(response), time.time()))

    def __len__(self) -> int:
        return self._run(f"SELECT count(*) FROM {self.TABLE}")[0][0]


def open_cache(home: str | Path, location: str | None = None) -> ResponseCache | PostgresResponseCache:
    """The response cache: `location` (the settings' TKG_CACHE) when it is a postgresql:// URL,
    else the SQLite file `<home>/cache/llm_responses.sqlite`."""
    if location and location.startswith(("postgresql://", "postgres://")):
        return PostgresResponseCache(location)
    if location:
        raise ValueError("TKG_CACHE must be a postgresql:// URL (a shared cache); leave it unset for the local "
                         "SQLite cache under TKG_HOME")
    return ResponseCache(Path(home) / "cache" / "llm_responses.sqlite")
