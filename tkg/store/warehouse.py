"""Publish `tkg.duckdb`: a new database file, swapped into place atomically.

The Parquet files are copied into tables in a `raw` schema, and every `sql/*.sql` model (views
and macros) is created on top, in dependency order. Copying rather than viewing the Parquet
makes each published file a consistent snapshot: a user holding it open read-only keeps
querying the old snapshot while the pipeline rewrites Parquet and publishes the next one, and
the file can be moved or shared without the Parquet tree. The pipeline itself never holds a
lock on `tkg.duckdb`; only the publish step (and a SQL model re-applying its SQL) writes, to
a temporary copy, and swaps it in with `os.replace`.

Publishing is incremental: the file records the Parquet files each raw table was loaded from,
with their size and time (`raw.loaded_files`). The next publish starts from a copy of the last
file and, per table, keeps it when none of its files changed, replaces the rows of the
partitions whose files changed or went, applies the changes a global step wrote beside its
table since the version loaded last (the judgments: a new quarter changes a few of millions), or
reloads it whole (another global step's table, the usage, a table whose columns changed, or one
where most partitions changed). Every model is then re-applied, except the `facts` table, whose
rows of the events that changed are replaced in place (`FactsInPlace`). A file published by
other SQL models, or one whose free space has grown past a third, is built fresh instead. The
rows are the same either way.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path, PurePath

import duckdb
import pyarrow as pa

from tkg.core.ids import short_version
from tkg.core.paths import sql_dir
from tkg.core.versions import Stamp
from tkg.store.manifest import scan
from tkg.store.parquet import ParquetStore, partition_of, temporary_path


@dataclass(frozen=True)
class RawTable:
    """A table of the `raw` schema and the Parquet it is loaded from."""

    name: str
    asset: str
    schema: pa.Schema
    file: str | None = None  # set for global assets (one file); partitioned assets glob
    pattern: str | None = None  # a glob under the Parquet root, for tables written by several steps
    dropped: tuple[str, ...] = ()  # columns of the files not copied (the mentions' vectors: half the file, read by no view)
    # A global asset's table of this one's changes since its last version (tables.JUDGMENT_CHANGES,
    # beside `file`): applied to the rows loaded last instead of reloading every row.
    changes: str | None = None


# Bump when publishing changes (every SQL model's text is part of the code version too).
WAREHOUSE_VERSION = "warehouse-4"


def warehouse_code_version(models: list[SqlModel] | None = None) -> str:
    """The published file's code version: it covers every SQL model."""
    return short_version(WAREHOUSE_VERSION, *(model.sha256 for model in (load_models() if models is None else models)))


@dataclass(frozen=True)
class SqlModel:
    """One `sql/*.sql` file: a view or macro of the SQL surface, and an asset of its own."""

    name: str
    path: Path
    sql: str
    depends_on: tuple[str, ...]  # other models
    upstream_assets: tuple[str, ...]  # pipeline assets whose tables it reads
    description: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()

    @property
    def kind(self) -> str:
        """What the model creates: VIEW, TABLE or MACRO."""
        found = re.search(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(VIEW|TABLE|MACRO)\b", self.sql, re.IGNORECASE)
        return found[1].upper() if found else "VIEW"

    @property
    def is_macro(self) -> bool:
        return self.kind == "MACRO"


def load_models(directory: Path | None = None) -> list[SqlModel]:
    """All SQL models, in dependency order.

    Header comments declare lineage, as dbt's refs and sources do: `-- depends_on: a, b` names
    other models, `-- upstream_assets: x, y` the pipeline assets whose tables the model reads,
    and `-- description: ...` says what it holds.
    """
    directory = directory or sql_dir()

    def header(text: str, key: str) -> tuple[str, ...]:
        match = re.search(rf"^--\s*{key}:\s*(.*)$", text, re.MULTILINE)
        return tuple(item.strip() for item in match[1].split(",") if item.strip()) if match else ()

    models = {}
    for path in sorted(directory.glob("*.sql")):
        text = path.read_text()
        description = re.search(r"^--\s*description:\s*(.*)$", text, re.MULTILINE)
        models[path.stem] = SqlModel(
            name=path.stem, path=path, sql=text, depends_on=header(text, "depends_on"),
            upstream_assets=header(text, "upstream_assets"), description=description[1].strip() if description else "",
        )
    ordered: list[SqlModel] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in {m.name for m in ordered} or name not in models:
            return
        if name in visiting:
            raise ValueError(f"sql/{name}.sql is part of a dependency cycle; check its '-- depends_on:' header")
        visiting.add(name)
        for dependency in models[name].depends_on:
            visit(dependency)
        visiting.discard(name)
        ordered.append(models[name])

    for name in models:
        visit(name)
    return ordered


def _raw_source(store: ParquetStore, raw: RawTable) -> dict[PurePath, tuple[int, int]]:
    """The files `raw` is loaded from, with their size and modification time."""
    if raw.pattern:
        return store.listing(raw.pattern)
    if raw.file:
        return store.listing(f"{raw.asset}/{raw.file}.parquet")
    return store.listing(f"{raw.asset}/company=*/quarter=*/{raw.asset}.parquet")


# How much Parquet (on disk) one INSERT of a raw table reads. DuckDB stores a table in row groups
# of ROW_GROUP_ROWS. Rows wait in memory until their row group is full or the statement ends, so
# a table of wide rows is loaded LOAD_PIECE_BYTES at a time: one statement over every transcript
# of 5M events held their 1 GB of text in one unfinished row group and ran out of memory. But a
# statement that appends to the row group an earlier one left part-full writes that row group
# again, so a table of narrow rows (one row group of them in at most WIDE_ROW_GROUP_BYTES of
# Parquet) is loaded NARROW_PIECE_BYTES at a time. A fresh publish of the 1M-event store loaded
# its events in 24.5-26.6 s in 14 pieces and 9.1-12.2 s in one, into a file 25% smaller
# (benchmarks/README.md).
LOAD_PIECE_BYTES = 64 * 2**20
NARROW_PIECE_BYTES = 2**30
ROW_GROUP_ROWS = 122_880
WIDE_ROW_GROUP_BYTES = 256 * 2**20
SAMPLED_FOOTERS = 16  # about this many files' footers tell a table's Parquet per row


def _pieces(files: dict[PurePath, int], limit: int) -> list[list[PurePath]]:
    """`files` (path: size) in order, cut into runs of at most `limit` bytes (at least one file each)."""
    pieces: list[list[PurePath]] = []
    size = 0
    for path in sorted(files):
        if not pieces or size + files[path] > limit:
            pieces.append([])
            size = 0
        pieces[-1].append(path)
        size += files[path]
    return pieces


def piece_bytes(store: ParquetStore, files: dict[PurePath, int]) -> int:
    """How much of `files` (path: size) one INSERT reads: NARROW_PIECE_BYTES when one row group's
    rows take at most WIDE_ROW_GROUP_BYTES of Parquet (as a sample of the files' footers tells),
    else LOAD_PIECE_BYTES."""
    if sum(files.values()) <= LOAD_PIECE_BYTES:
        return LOAD_PIECE_BYTES  # one piece either way: no footer is read
    ordered = sorted(files)
    sample = ordered[::max(1, len(ordered) // SAMPLED_FOOTERS)]
    rows = sum(store.metadata(path).num_rows for path in sample)
    if rows and sum(files[path] for path in sample) / rows * ROW_GROUP_ROWS <= WIDE_ROW_GROUP_BYTES:
        return NARROW_PIECE_BYTES
    return LOAD_PIECE_BYTES


def _insert_files(connection: duckdb.DuckDBPyConnection, store: ParquetStore, raw: RawTable, files: dict[PurePath, int]) -> None:
    """Insert the rows of `files` (path: size) into `raw.<name>`, columns matched by name (a
    column the files lack is NULL), in pieces of at most `piece_bytes` of Parquet, in order."""
    for piece in _pieces(files, piece_bytes(store, files)):
        source = scan(store, connection, piece)  # noqa: F841 (read by name in the SQL below: a relation, or an object store's dataset)
        connection.execute(f"INSERT INTO raw.{raw.name} BY NAME SELECT {_kept_columns(raw)} FROM source")


def _kept_columns(raw: RawTable) -> str:
    return f"* EXCLUDE ({', '.join(raw.dropped)})" if raw.dropped else "*"


def _load_raw(connection: duckdb.DuckDBPyConnection, store: ParquetStore, raw: RawTable, files: dict[PurePath, int]) -> None:
    # The table has every column of today's schema, in its order: columns that files written by
    # an older tkg lack are NULL there, and a view over the table never misses one.
    connection.register("empty", raw.schema.empty_table())
    create = f"CREATE OR REPLACE TABLE raw.{raw.name} AS SELECT * FROM empty"
    if files:
        source = scan(store, connection, sorted(files))  # noqa: F841 (its columns only: LIMIT 0)
        connection.execute(f"{create} UNION ALL BY NAME (SELECT {_kept_columns(raw)} FROM source LIMIT 0)")
        _insert_files(connection, store, raw, files)
    else:
        connection.execute(create)
    connection.unregister("empty")


def _same_columns(connection: duckdb.DuckDBPyConnection, raw: RawTable) -> bool:
    """Whether the published table has exactly the columns, and types, of today's schema."""
    def columns(relation: str) -> list[tuple[str, str]]:
        return [(row[0], row[1]) for row in connection.execute(f"DESCRIBE {relation}").fetchall()]

    connection.register("expected", raw.schema.empty_table())
    try:
        return columns(f"raw.{raw.name}") == columns("expected")
    except duckdb.CatalogException:  # not published yet
        return False
    finally:
        connection.unregister("expected")


def _update_raw(connection: duckdb.DuckDBPyConnection, store: ParquetStore, raw: RawTable,
                now: dict[str, tuple[int, int]], before: dict[str, tuple[int, int]], loaded_version: str | None = None) -> str:
    """Bring one raw table of a copied file up to the store: what was done, in a few words.
    `loaded_version`: the version of the file a table with changes was loaded from."""
    same_columns = _same_columns(connection, raw)
    if now == before and same_columns:
        return "kept"
    if raw.changes and same_columns and len(now) == 1 and now.keys() == before.keys():
        applied = _apply_changes(connection, store, raw, store.absolute(next(iter(now))), loaded_version)
        if applied is not None:
            return applied
    partitioned = raw.file is None and raw.pattern is None
    touched = _touched_partitions(now, before) if partitioned else []
    if partitioned and same_columns and len(touched) * 2 <= max(len(now), 1):
        connection.register("touched", _partition_table(touched))
        connection.execute(f"DELETE FROM raw.{raw.name} AS t USING touched AS p WHERE t.company = p.company AND t.quarter = p.quarter")
        connection.unregister("touched")
        replaced = set(touched)
        rebuilt = {store.absolute(path): size for path, (size, _) in now.items() if partition_of(path) in replaced}
        try:
            _insert_files(connection, store, raw, rebuilt)
            return f"{len(touched)} partition(s) replaced"
        except duckdb.BinderException:  # files with columns the table lacks: loaded whole, as fresh
            pass
    _load_raw(connection, store, raw, {store.absolute(path): size for path, (size, _) in now.items()})
    return "reloaded"


def _touched_partitions(now: dict[str, tuple[int, int]], before: dict[str, tuple[int, int]]) -> list[tuple[str, str]]:
    """The (company, quarter) of every partition file of a table that changed, came or went
    since it was loaded (`before`)."""
    changed = [path for path, identity in now.items() if before.get(path) != identity]
    return sorted({partition_of(path) for path in (*changed, *(set(before) - set(now)))})


def _partition_table(partitions: list[tuple[str, str]]) -> pa.Table:
    return pa.table({"company": pa.array([company for company, _ in partitions], pa.string()),
                     "quarter": pa.array([date.fromisoformat(quarter) for _, quarter in partitions], pa.date32())})


def _apply_changes(connection: duckdb.DuckDBPyConnection, store: ParquetStore, raw: RawTable, path: PurePath,
                   loaded_version: str | None) -> str | None:
    """Apply the table's changes (`raw.changes`) to the rows of the version loaded last, when
    they are the changes from exactly that version to the file's: what was done, or None when
    they are not (the table is then reloaded). A row gone is deleted by all of its columns; the
    table must then hold as many rows as the file, else nothing is applied."""
    changes_path = store.global_path(raw.asset, raw.changes)
    if loaded_version is None or not store.is_file(changes_path):
        return None
    file_stamp, changes_stamp = store.stamp(path), store.stamp(changes_path)
    if file_stamp is None or changes_stamp is None or changes_stamp.version != file_stamp.version:
        return None  # written by another run than the file
    changes = store.relation(connection, [changes_path])  # noqa: F841 (read by name in the SQL below)
    if connection.execute("SELECT list(DISTINCT since_version) FROM changes").fetchall()[0][0] != [loaded_version]:
        return None  # not since the version loaded
    columns = raw.schema.names
    matched = " AND ".join(f't."{name}" IS NOT DISTINCT FROM g."{name}"' for name in columns)
    selected = ", ".join(f'"{name}"' for name in columns)
    connection.execute("BEGIN TRANSACTION")
    try:
        gone = connection.execute(f"DELETE FROM raw.{raw.name} AS t USING (SELECT {selected} FROM changes WHERE gone) AS g "
                                  f"WHERE {matched}").fetchall()[0][0]
        new = connection.execute(f"INSERT INTO raw.{raw.name} BY NAME SELECT {selected} FROM changes WHERE NOT gone"
                                 ).fetchall()[0][0]
        rows = connection.execute(f"SELECT count(*) FROM raw.{raw.name}").fetchall()[0][0]
        if rows != store.metadata(path).num_rows:  # a row gone matched several (duplicates): reloaded instead
            connection.execute("ROLLBACK")
            return None
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    return f"{gone:,} row(s) deleted, {new:,} inserted"


# `facts` (sql/facts.sql) is the one table among the models, and a new quarter changes a few of
# its rows: a copied file keeps it and replaces the rows of the events that changed, instead of
# joining every row again. A fact's row is a function of its event's rows in the partitioned
# tables below, and of the rows keyed in the global ones that the row reads. Its relevance, which
# moves on every row when the latest call does, is updated in place.
FACTS_MODEL = "facts"
FACT_PARTITIONED = ("events", "triplets", "transcripts")
# per global table: its key, what a facts row reads of it (over its alias `{t}`), and the events
# whose rows read a key (from the view `changed` of the keys whose rows changed, came or went)
FACT_GLOBAL = {
    "event_invalidations": ("event_id", "ROW({t}.invalid_at, {t}.expired_at, {t}.invalidated_by, {t}.end_evidence, "
                                        "{t}.end_reason)", "SELECT key FROM changed"),
    "fact_relevance": ("event_id", "{t}.archive_reason IS NULL", "SELECT key FROM changed"),
    "entity_resolution": ("entity_id", "{t}.canonical_id",
                          "SELECT event_id FROM raw.triplets SEMI JOIN changed ON subject_entity_id = key "
                          "UNION ALL SELECT event_id FROM raw.triplets SEMI JOIN changed ON object_entity_id = key"),
    "canonical_entities": ("canonical_id", "{t}.name",  # the rows naming it now are the facts rows holding its id
                           "SELECT event_id FROM main.facts SEMI JOIN changed ON subject_id = key "
                           "UNION ALL SELECT event_id FROM main.facts SEMI JOIN changed ON object_id = key"),
}
# Past this share of the events changed, the table is built again instead.
MAX_FACT_CHANGES = 0.5


class FactsInPlace:
    """Updating the `facts` table of a copied file for the events that changed (see FACTS_MODEL).

    `prepare` runs before the raw tables are updated: it notes the events of the partitions
    about to be replaced, and keeps each global table about to be reloaded as
    `raw._before_<name>`. `collect` runs after: it adds the replaced partitions' events now,
    and the events whose rows read a key of a global table whose row changed, and drops the
    kept tables. `apply` then deletes those events' rows and inserts them again from the
    model's own query, with the views `events` and `triplets` narrowed to them."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, kept: list[str]) -> None:
        self.connection, self.kept = connection, kept

    @classmethod
    def prepare(cls, connection: duckdb.DuckDBPyConnection, models: list[SqlModel], sources: dict[str, dict[str, tuple[int, int]]],
                before: dict[str, dict[str, tuple[int, int]]]) -> FactsInPlace | None:
        """None when the copied file has no `facts` table to keep (or lacks a table it reads), or
        the model is not a table made by one query."""
        facts = next((m for m in models if m.name == FACTS_MODEL), None)
        if facts is None or facts.kind != "TABLE" or _table_query(facts) is None or not connection.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'main' AND table_name = ? "
                "AND table_type = 'BASE TABLE'", [FACTS_MODEL]).fetchall()[0][0]:
            return None
        kept = [name for name in FACT_GLOBAL if sources.get(name) != before.get(name)]
        published = {name for (name,) in connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'raw'").fetchall()}
        if not {*kept, *FACT_PARTITIONED} <= published:  # a table the file does not hold yet: built again
            return None
        partitions = sorted({partition for name in FACT_PARTITIONED
                             for partition in _touched_partitions(sources.get(name, {}), before.get(name, {}))})
        connection.register("_fact_partition_rows", _partition_table(partitions))
        connection.execute("CREATE TEMP TABLE _fact_partitions AS SELECT * FROM _fact_partition_rows")
        connection.unregister("_fact_partition_rows")
        connection.execute("CREATE TEMP TABLE _fact_events AS SELECT e.event_id FROM raw.events e "
                           "SEMI JOIN _fact_partitions p ON e.company = p.company AND e.quarter = p.quarter")
        for name in kept:
            connection.execute(f"ALTER TABLE raw.{name} RENAME TO _before_{name}")
        return cls(connection, kept)

    def collect(self, done: dict[str, str]) -> bool:
        """Whether `facts` can be updated in place (`done`: what the publish did to each raw
        table): no partitioned table it reads was reloaded whole, and at most MAX_FACT_CHANGES
        of the events changed."""
        connection = self.connection
        try:
            if any(done.get(name) == "reloaded" for name in FACT_PARTITIONED):  # else kept, or by partition
                return False
            connection.execute("INSERT INTO _fact_events SELECT e.event_id FROM raw.events e "
                               "SEMI JOIN _fact_partitions p ON e.company = p.company AND e.quarter = p.quarter")
            for name in self.kept:
                key, value, events = FACT_GLOBAL[name]
                connection.execute(f"""
                    INSERT INTO _fact_events SELECT * FROM (
                        WITH changed AS (
                            SELECT coalesce(n.{key}, o.{key}) AS key FROM raw.{name} n FULL JOIN raw._before_{name} o ON n.{key} = o.{key}
                            WHERE n.{key} IS NULL OR o.{key} IS NULL OR ({value.format(t="n")}) IS DISTINCT FROM ({value.format(t="o")}))
                        {events})""")
            connection.execute("CREATE TEMP TABLE _fact_scope AS SELECT DISTINCT event_id FROM _fact_events")
            changed, events = connection.execute("SELECT count(*), (SELECT count(*) FROM raw.events) FROM _fact_scope").fetchall()[0]
            return changed <= MAX_FACT_CHANGES * events
        except (duckdb.BinderException, duckdb.CatalogException):  # a table's columns changed: built again
            return False
        finally:
            for name in self.kept:
                connection.execute(f"DROP TABLE IF EXISTS raw._before_{name}")

    def apply(self, facts: SqlModel) -> str:
        """Replace the changed events' rows of `facts` and update every row's relevance: what
        was done, in a few words."""
        connection = self.connection
        events = connection.execute("SELECT count(*) FROM _fact_scope").fetchall()[0][0]
        deleted = connection.execute("DELETE FROM main.facts WHERE event_id IN (SELECT event_id FROM _fact_scope)").fetchall()[0][0]
        database = connection.execute("SELECT current_database()").fetchall()[0][0]
        try:  # temporary views come first in name resolution: the model's query reads these
            for view in ("events", "triplets"):
                connection.execute(f'CREATE TEMP VIEW {view} AS SELECT v.* FROM _fact_scope JOIN "{database}".main.{view} v '
                                   "USING (event_id)")
            inserted = connection.execute(f"INSERT INTO main.facts {_table_query(facts)}").fetchall()[0][0]
        finally:
            for view in ("events", "triplets"):
                connection.execute(f"DROP VIEW IF EXISTS temp.main.{view}")
        relevance = 0  # the rows inserted have today's; the others move only when the table was reloaded
        if "fact_relevance" in self.kept:
            relevance = connection.execute("UPDATE main.facts AS f SET relevance = r.relevance FROM raw.fact_relevance r WHERE "
                                           "f.event_id = r.event_id AND f.relevance IS DISTINCT FROM r.relevance").fetchall()[0][0]
        _record_model(connection, facts)
        return (f"{events:,} event(s) replaced ({deleted:,} row(s) deleted, {inserted:,} inserted), "
                f"{relevance:,} relevance(s) updated")


def _table_query(sql_model: SqlModel) -> str | None:
    """The query a table model creates its table from (None when it is not one statement of
    that shape)."""
    found = re.search(rf"\bCREATE\s+OR\s+REPLACE\s+TABLE\s+\"?{sql_model.name}\"?\s+AS\b(.*)$", sql_model.sql,
                      re.IGNORECASE | re.DOTALL)
    query = found[1].strip().removesuffix(";") if found else None
    return query if query and ";" not in query else None


def register_raw(connection: duckdb.DuckDBPyConnection, raw_tables: dict[str, pa.Table]) -> None:
    """Expose in-memory Arrow tables as `raw.<name>` so the SQL models can run on them."""
    connection.execute("CREATE SCHEMA IF NOT EXISTS raw")
    for name, table in raw_tables.items():
        connection.register(f"_arrow_{name}", table)
        connection.execute(f"CREATE OR REPLACE VIEW raw.{name} AS SELECT * FROM _arrow_{name}")


def model(name: str) -> SqlModel:
    for candidate in load_models():
        if candidate.name == name:
            return candidate
    raise KeyError(f"no SQL model sql/{name}.sql")


def apply_model(connection: duckdb.DuckDBPyConnection, sql_model: SqlModel, record: bool = True) -> None:
    if sql_model.kind != "MACRO":  # a model that became a table (or a view) replaces what it was
        existing = connection.execute(
            "SELECT table_type FROM information_schema.tables WHERE table_schema = 'main' AND table_name = ?",
            [sql_model.name]).fetchone()
        if existing and existing[0] != ("BASE TABLE" if sql_model.kind == "TABLE" else "VIEW"):
            connection.execute(f'DROP {"VIEW" if existing[0] == "VIEW" else "TABLE"} main."{sql_model.name}"')
    connection.execute(sql_model.sql)
    if record:
        _record_model(connection, sql_model)


def _record_model(connection: duckdb.DuckDBPyConnection, sql_model: SqlModel) -> None:
    connection.execute("INSERT OR REPLACE INTO raw.sql_models VALUES (?, ?, ?)",
                       [sql_model.name, sql_model.sha256, sql_model.description])


@dataclass
class PublishResult:
    path: Path
    raw_rows: dict[str, int] = field(default_factory=dict)
    models: list[str] = field(default_factory=list)
    size_bytes: int = 0
    stamp: Stamp | None = None
    incremental: bool = False  # updated from a copy of the last file rather than built fresh
    tables: dict[str, str] = field(default_factory=dict)  # what was done to each raw table
    in_place: dict[str, str] = field(default_factory=dict)  # what was done to each model table updated in place
    # seconds each part took: the copy of the last file, each raw table and model, the checkpoint
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        """How the file was made, in a line: 'fresh', or what an incremental publish changed."""
        if not self.incremental:
            return "fresh"
        done = Counter(what if what in ("kept", "reloaded") else "updated" for what in self.tables.values())
        return (f"incremental: {done['updated']} table(s) updated (by partition or by their changes), "
                f"{done['reloaded']} reloaded, {done['kept']} kept"
                + "".join(f"; {name} updated in place" for name in self.in_place))


@dataclass
class _Clock:
    """Adds the seconds each named part takes to `seconds`."""

    seconds: dict[str, float]

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - started, 3)


def _swap_in(temporary: Path, target: Path) -> None:
    os.replace(temporary, target)
    wal = temporary.with_name(temporary.name + ".wal")
    if wal.exists():
        wal.unlink()


# The oldest storage format DuckDB 1.x reads: the published file opens in any DuckDB 1.0+
# client (the CLI, Python, R, DBeaver), not only in the release that wrote it.
STORAGE_COMPATIBILITY = {"storage_compatibility_version": "v1.0.0"}


def published_stamp(target: Path) -> Stamp | None:
    """The stamp a published file was built with (None if absent or older than stamps)."""
    if not Path(target).exists():
        return None
    try:
        with duckdb.connect(str(target), read_only=True) as connection:
            row = connection.execute("SELECT value FROM raw.build_info WHERE key = 'stamp'").fetchone()
    except duckdb.Error:
        return None
    return Stamp.from_json(row[0]) if row else None


# What each raw table was loaded from: the next publish compares it with the store.
# `version`: the stamp's of the file of a table with changes (RawTable.changes), which they name.
LOADED_FILES = pa.schema([("table_name", pa.string()), ("path", pa.string()), ("size", pa.int64()), ("mtime_ns", pa.int64()),
                          ("version", pa.string())])
# A copied file whose free space passes this share is built fresh instead (replaced rows leave
# free blocks behind; DuckDB reuses them, but a file rebuilt now and then stays compact).
MAX_FREE_SHARE = 1 / 3


def _loaded_files(target: Path, code_version: str) -> tuple[dict[str, dict[str, tuple[int, int]]], dict[str, str]] | None:
    """What the published file's raw tables were loaded from, and the version loaded of each
    table with changes; or None when it cannot be updated in place: absent, unreadable,
    published by other SQL models or another tkg, or too sparse."""
    if not target.exists():
        return None
    try:
        with duckdb.connect(str(target), read_only=True) as connection:
            published = connection.execute("SELECT value FROM raw.build_info WHERE key = 'code_version'").fetchone()
            if published is None or published[0] != code_version:
                return None
            total, free = connection.execute("SELECT total_blocks, free_blocks FROM pragma_database_size()").fetchone()
            if total and free / total > MAX_FREE_SHARE:
                return None
            rows = connection.execute("SELECT table_name, path, size, mtime_ns, version FROM raw.loaded_files").fetchall()
    except duckdb.Error:
        return None
    loaded: dict[str, dict[str, tuple[int, int]]] = {}
    versions: dict[str, str] = {}
    for table, path, size, mtime, version in rows:
        loaded.setdefault(table, {})[path] = (size, mtime)
        if version is not None:
            versions[table] = version
    return loaded, versions


def _version(store: ParquetStore, files: dict[str, tuple[int, int]]) -> str | None:
    """The stamp's version of a table's one file (None for none, several, or one without a stamp)."""
    if len(files) != 1:
        return None
    stamp = store.stamp(store.absolute(next(iter(files))))
    return stamp.version if stamp is not None else None


def publish(store: ParquetStore, target: Path, raw_tables: list[RawTable], models: list[SqlModel] | None = None,
            stamp: Stamp | None = None, check: Callable[[duckdb.DuckDBPyConnection], None] | None = None,
            info: dict[str, str] | None = None, memory_limit: str | None = None, disk_limit: str | None = None
            ) -> PublishResult:
    """Publish the Parquet tree (`raw_tables`, the stage catalog's) and every model onto `target`:
    from a copy of the last published file, updated where the store changed since (see the
    module's docstring), or a fresh file when that cannot be done.

    `info` adds rows to `raw.build_info` (e.g. `embedder`: what the statement vectors are, so a
    query embeds questions in the same space).

    `check` runs on the finished file before the swap; if it raises, the file is discarded and
    `target` keeps its last good contents. `memory_limit` (a DuckDB size) bounds what the load
    holds in memory; past it DuckDB writes to the file and its temporary folder, at most
    `disk_limit` of the latter."""
    target = Path(target).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    models = load_models() if models is None else models
    code_version = warehouse_code_version(models)
    sources = {raw.name: {store.relative(path): identity for path, identity in _raw_source(store, raw).items()}
               for raw in raw_tables}
    # the version of the file of each table with changes (the next publish applies its changes to it)
    versions = {raw.name: _version(store, sources[raw.name]) for raw in raw_tables if raw.changes}
    last = _loaded_files(target, code_version)
    before, versions_before = last if last is not None else (None, {})
    temporary = temporary_path(target, ".building")
    result = PublishResult(path=target, stamp=stamp, incremental=before is not None)
    try:
        clock = _Clock(result.seconds)
        if before is not None:
            with clock("copy"):
                shutil.copyfile(target, temporary)
        config = {**STORAGE_COMPATIBILITY, **({"memory_limit": memory_limit} if memory_limit else {}),
                  **({"max_temp_directory_size": disk_limit} if disk_limit else {})}
        with duckdb.connect(str(temporary), config=config) as connection:
            if before is None:
                connection.execute("CREATE SCHEMA raw")
                connection.execute("CREATE TABLE raw.sql_models (name VARCHAR PRIMARY KEY, sql_sha256 VARCHAR, description VARCHAR)")
            connection.execute("CREATE OR REPLACE TABLE raw.build_info (key VARCHAR PRIMARY KEY, value VARCHAR)")
            build_info = {"code_version": code_version, **({"stamp": stamp.to_json()} if stamp is not None else {}), **(info or {})}
            connection.executemany("INSERT INTO raw.build_info VALUES (?, ?)", list(build_info.items()))
            facts = FactsInPlace.prepare(connection, models, sources, before) if before is not None else None
            for raw in raw_tables:
                with clock(f"raw.{raw.name}"):
                    if before is None:
                        files = {store.absolute(path): size for path, (size, _) in sources[raw.name].items()}
                        _load_raw(connection, store, raw, files)
                        result.tables[raw.name] = "loaded"
                    else:
                        result.tables[raw.name] = _update_raw(connection, store, raw, sources[raw.name],
                                                              before.get(raw.name, {}), versions_before.get(raw.name))
                result.raw_rows[raw.name] = connection.execute(f"SELECT count(*) FROM raw.{raw.name}").fetchall()[0][0]
            for table in sorted(set(before or {}) - set(sources)):  # a table tkg no longer publishes
                connection.execute(f"DROP TABLE IF EXISTS raw.{table}")
            if facts is not None and not facts.collect(result.tables):
                facts = None
            connection.register("loaded", pa.Table.from_pylist(
                [{"table_name": name, "path": path, "size": size, "mtime_ns": mtime, "version": versions.get(name)}
                 for name, files in sources.items() for path, (size, mtime) in files.items()], schema=LOADED_FILES))
            connection.execute("CREATE OR REPLACE TABLE raw.loaded_files AS SELECT * FROM loaded")
            connection.unregister("loaded")
            for model in models:
                with clock(f"model.{model.name}"):
                    if facts is not None and model.name == FACTS_MODEL:
                        result.in_place[model.name] = facts.apply(model)
                    else:
                        apply_model(connection, model)
                result.models.append(model.name)
            connection.execute("INSERT INTO raw.build_info VALUES ('publish', ?)", [result.summary()])
            if check is not None:
                check(connection)
            with clock("checkpoint"):
                connection.execute("CHECKPOINT")
        _swap_in(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
        temporary.with_name(temporary.name + ".wal").unlink(missing_ok=True)
    result.size_bytes = target.stat().st_size
    return result


def applied_sha256s(target: Path) -> dict[str, str]:
    """The hash of the SQL a published file holds for each model."""
    if not Path(target).exists():
        return {}
    with duckdb.connect(str(target), read_only=True) as connection:
        return dict(connection.execute("SELECT name, sql_sha256 FROM raw.sql_models").fetchall())


def applied_sha256(target: Path, model: SqlModel) -> str | None:
    return applied_sha256s(target).get(model.name)


def reapply_model(target: Path, model: SqlModel) -> None:
    """Re-create one model in a copy of the published file and swap the copy in."""
    target = Path(target).resolve()
    temporary = temporary_path(target, ".building")
    try:
        shutil.copyfile(target, temporary)
        with duckdb.connect(str(temporary)) as connection:
            apply_model(connection, model)
            connection.execute("CHECKPOINT")
        _swap_in(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
        temporary.with_name(temporary.name + ".wal").unlink(missing_ok=True)


@dataclass
class ModelDescription:
    row_count: int | None
    columns: list[tuple[str, str]]


def describe_models(target: Path, models: list[SqlModel]) -> dict[str, ModelDescription]:
    """Row count and column schema of each published view (macros have neither), read over one connection."""
    described = {}
    with duckdb.connect(str(target), read_only=True) as connection:
        for model in models:
            if model.is_macro:
                described[model.name] = ModelDescription(None, [])
                continue
            columns = connection.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = 'main' AND table_name = ? ORDER BY ordinal_position", [model.name]
            ).fetchall()
            count = connection.execute(f'SELECT count(*) FROM main."{model.name}"').fetchone()[0] if columns else None
            described[model.name] = ModelDescription(count, [(name, kind) for name, kind in columns])
    return described


def describe_model(target: Path, model: SqlModel) -> ModelDescription:
    return describe_models(target, [model])[model.name]
