"""Dagster's SQLite event log, with its connections reused.

The stock `SqliteEventLogStorage` opens a new SQLite connection for every statement it runs
(creating a SQLAlchemy engine each time, and one more to check that a table exists) and
closes it; closing the last connection to a WAL database checkpoints the WAL. Recording the
~1,100 materialisations of a corpus build spent most of its time there. This subclass keeps
a connection open per recently used shard (the index and the latest runs), remembers which
tables exist, and commits with `synchronous=NORMAL` (durable across a crash of the process,
as WAL guarantees; the last commits can be lost only on power loss). What it writes, and
where, is unchanged: the webserver and daemon read the same files as with the stock class.
It is used through tkg's instance configuration (tkg/config/dagster.yaml).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    SQLITE_BUSY_TIMEOUT_SECONDS,
    SqliteEventLogStorage,
)
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import QueuePool


def _relaxed_sync(connection, _record) -> None:
    connection.execute("PRAGMA synchronous=NORMAL")


class ReusingSqliteEventLogStorage(SqliteEventLogStorage):
    """`SqliteEventLogStorage` that reuses one engine per shard."""

    MAX_OPEN_SHARDS = 8

    def __init__(self, base_dir: str, inst_data=None) -> None:
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._tables: set[str] = set()
        super().__init__(base_dir, inst_data)

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        return cls(inst_data=inst_data, **config_value)

    def _engine(self, shard: str) -> Engine:
        engine = self._engines.pop(shard, None)
        if engine is None:
            engine = create_engine(self.conn_string_for_shard(shard), poolclass=QueuePool, pool_size=1, max_overflow=4,
                                   connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False})
            event.listen(engine, "connect", _relaxed_sync)
        self._engines[shard] = engine  # most recently used last
        while len(self._engines) > self.MAX_OPEN_SHARDS:
            _, oldest = self._engines.popitem(last=False)
            oldest.dispose()
        return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock:
            engine = self._engine(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as connection:
                with connection.begin():
                    yield connection

    def has_table(self, table_name: str) -> bool:
        # Tables are only ever added (by migrations), so a table once seen stays.
        if table_name not in self._tables and super().has_table(table_name):
            self._tables.add(table_name)
        return table_name in self._tables

    def dispose(self) -> None:
        super().dispose()
        self._dispose_engines()

    def wipe(self) -> None:
        self._dispose_engines()  # the files are deleted: no connection may outlive them
        super().wipe()

    def _dispose_engines(self) -> None:
        for engine in self._engines.values():
            engine.dispose()
        self._engines.clear()
