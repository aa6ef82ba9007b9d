"""A global step's tables split by shard, stored as a chain of segments, so that a run whose
rows barely changed writes what changed rather than every row again.

A new quarter changes about as many rows of these tables as it adds events (about 5%): the
facts, blocks and selections of the earlier quarters stay as they were. So a version of a split
table is either
- whole: every row, in `v=<version>/<table>/shard=<key>/`; or
- a delta on the version before it: the rows that are new or changed (`<table>/shard=<key>/`)
  and the hashes that name the earlier rows that are gone or changed (`<table>.deleted/shard=<key>/`).

`v=<version>/chain.parquet` names, per table, its key and the versions a reader stacks (the
whole one first, this one last). Each row carries two hashes, of its key and of its columns (or
of what determines them, `Split.hashed`): together (128 bits) they name the row. A shard's rows
are the rows of each segment that no later segment deleted; a key names at most one row in a
shard. So the next run tells changed rows from unchanged ones, and a reader drops deleted rows,
by joining integers, without reading the rows' columns. A shard's
fingerprint is its rows' count and the sum of their row hashes, so it does not depend on how the
rows came to be stored: a cold build writes one whole version, and the same rows after ten
increments have the same fingerprint. Rows come in no set order either way (the shard steps sort
what they compare). A chain is folded into a new whole version when it has `MAX_SEGMENTS`
segments or its deltas hold more than `DELTA_SHARE` of the rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import pyarrow as pa

from tkg.core.ids import short_hash
from tkg.store.parquet import ParquetStore, relation_batches

ROW_HASH = "_row_hash"
KEY_HASH = "_key_hash"
IDENTITY = f"{KEY_HASH}, {ROW_HASH}"  # what names a row of a shard: two independent 64-bit hashes
DELETED = ".deleted"
CHAIN_FILE = "chain.parquet"
MAX_SEGMENTS = 12
DELTA_SHARE = 0.5
_CHAIN = pa.schema([("table_name", pa.string()), ("key", pa.list_(pa.string())), ("segments", pa.list_(pa.string())),
                    ("delta_rows", pa.list_(pa.int64()))])


@dataclass(frozen=True)
class Split:
    """One table a step splits by shard: its rows (a DuckDB relation with a `shard` column),
    the columns readers get, and the key that names a row within a shard.

    A row's hash covers `hashed` (by default its columns). A table with heavy columns may
    instead give its rows without them, hashing light ones that determine them (the facts hash
    the version of the partition file their text and vector come from, not the vector), and
    give `rows_for`: the whole rows (with `shard` and `hashed`) of the (shard, key) pairs in
    the named table, read from only where they are. So the heavy columns are read for the rows
    written alone: the changed ones, or every one when the version is written whole."""

    name: str
    schema: pa.Schema
    key: tuple[str, ...]
    rows: Any
    hashed: tuple[str, ...] = ()
    rows_for: Callable[[str], Any] | None = None
    replaces: Replaced | None = None

    def __post_init__(self) -> None:
        if self.replaces is not None and self.rows_for is not None:
            raise ValueError(f"{self.name}: rows that replace groups of the last version are given whole, not through rows_for")
        if self.replaces is not None and self.replaces.column not in self.key:
            raise ValueError(f"{self.name}: the rows replace groups of {self.replaces.column!r}, which is not in its key "
                             f"{self.key}: a kept row could share a key with a new one")

    @property
    def hash_sql(self) -> str:
        return f"hash({_quoted(self.hashed or tuple(self.schema.names))})"

    @property
    def key_hash_sql(self) -> str:  # another function of the key than the row hash's (a constant first)
        return f"hash('key', {_quoted(self.key)})"


@dataclass(frozen=True)
class Replaced:
    """Rows given as a change to the last version: the rows are those of some groups (the
    values of `column`, a key column, listed in the table `groups` on the connection), and
    every row of the last version outside those groups stands as it is. A step that knows
    which groups changed so hashes, compares and holds only theirs."""

    column: str
    groups: str


@dataclass(frozen=True)
class SplitRows:
    """What a step gives for a table it splits (see `Split`): its rows, and optionally the
    columns that stand for them in the row hash, how to read chosen rows from only where
    they are, and the groups the rows replace in the last version."""

    relation: Any
    hashed: tuple[str, ...] = ()
    rows_for: Callable[[str], Any] | None = None
    replaces: Replaced | None = None

    def split(self, name: str, schema: pa.Schema, key: tuple[str, ...]) -> Split:
        return Split(name, schema, key, self.relation, self.hashed, self.rows_for, self.replaces)


@dataclass(frozen=True)
class Chain:
    """What a version of a split table stacks: its key, its segments (the whole one first) and
    how many rows each segment wrote as a delta (0 for the whole one)."""

    key: tuple[str, ...]
    segments: tuple[str, ...]
    delta_rows: tuple[int, ...]


@dataclass(frozen=True)
class Written:
    """A version written: each shard's fingerprint, the versions it stacks (the ones to keep),
    whether it is a delta, and how many rows it wrote (with the deleted ones, for a delta)."""

    parts: dict[str, str]
    keep: set[str]
    delta: bool
    rows: int


def chain_path(store: ParquetStore, asset: str, version: str) -> PurePath:
    return store.parquet_root / asset / f"v={version}" / CHAIN_FILE


def read_chains(store: ParquetStore, asset: str, version: str) -> dict[str, Chain]:
    """The chain of each table of `version` ({} for a version written without one)."""
    path = chain_path(store, asset, version)
    if not store.is_file(path):
        return {}
    return {row["table_name"]: Chain(tuple(row["key"]), tuple(row["segments"]), tuple(row["delta_rows"]))
            for row in store.read(path).to_pylist()}


def _quoted(names: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def _segments(store: ParquetStore, asset: str, version: str, table: str) -> tuple[str, ...]:
    """The versions a reader of `table` at `version` stacks (the version alone when it has no chain)."""
    chain = read_chains(store, asset, version).get(table)
    return chain.segments if chain else (version,)


def rewrites_stacked(store: ParquetStore, asset: str, previous: str, version: str) -> bool:
    """Whether writing `version` replaces files that `previous` stacks: the same version again,
    or one of its chain's (an earlier state come back)."""
    return version == previous or any(version in chain.segments for chain in read_chains(store, asset, previous).values())


def shard_files(store: ParquetStore, asset: str, version: str, table: str, shard: str) -> list[PurePath]:
    """Every file a shard's rows of `table` are read from (its segments' rows and deletions)."""
    segments = _segments(store, asset, version, table)
    return [path for segment in segments for name in (table, table + DELETED)
            for path in store.split_files(asset, segment, name, shard)]


def _deleted(store: ParquetStore, connection: Any, asset: str, table: str, shard: str, segments: tuple[str, ...],
             name: str) -> str | None:
    """View `name` of the identities of the shard's rows that `segments` deleted, or None when
    they deleted none."""
    deleted = [path for segment in segments for path in store.split_files(asset, segment, table + DELETED, shard)]
    if not deleted:
        return None
    store.relation(connection, deleted).create_view(name, replace=True)
    return name


def _segment_rows(store: ParquetStore, connection: Any, asset: str, table: str, shard: str, segments: tuple[str, ...],
                  number: int, columns: list[str], view: str) -> str | None:
    """A query of the shard's rows segment `number` wrote (view `<view>_<number>`), over
    `columns`; None when it wrote none."""
    files = store.split_files(asset, segments[number], table, shard)
    if not files:
        return None
    store.relation(connection, files).create_view(f"{view}_{number}", replace=True)
    return f"SELECT {_quoted(columns)} FROM {view}_{number}"


def _standing(store: ParquetStore, connection: Any, asset: str, table: str, shard: str, segments: tuple[str, ...],
              first: int, columns: list[str], view: str) -> list[str]:
    """Queries of the shard's rows each of `segments[first:]` wrote that no later segment
    deleted, over `columns`."""
    parts = []
    for number in range(first, len(segments)):
        select = _segment_rows(store, connection, asset, table, shard, segments, number, columns, view)
        if select is None:
            continue
        later = _deleted(store, connection, asset, table, shard, segments[number + 1:], f"{view}_{number}_deleted")
        parts.append(select + (f" ANTI JOIN {later} USING ({IDENTITY})" if later else ""))
    return parts


def shard_rows(store: ParquetStore, connection: Any, asset: str, version: str, table: str, shard: str,
               columns: list[str]) -> Any | None:
    """One shard's rows of a split table (a DuckDB relation over `columns`, in no set order:
    the shard steps sort what they compare), or None when the shard has none."""
    segments = _segments(store, asset, version, table)
    parts = _standing(store, connection, asset, table, shard, segments, 0, columns, f"_split_{table}_{shard}")
    return connection.sql(" UNION ALL ".join(parts)) if parts else None


def shard_changes_since(store: ParquetStore, connection: Any, asset: str, version: str, table: str, shard: str,
                        since: str, columns: list[str]) -> tuple[Any | None, Any | None] | None:
    """One shard's rows of a split table that changed between two versions of its chain, as
    DuckDB relations over `columns` (None for no rows): the rows `version` holds that `since`
    did not (written by the segments after `since`), and the rows `since` held that `version`
    does not (deleted by those segments). None when `version` does not stack on `since` (its
    chain was folded since, or `since` is not of it): then only every row tells."""
    segments = _segments(store, asset, version, table)
    if since not in segments:
        return None
    start = segments.index(since) + 1
    view = f"_since_{table}_{shard}"
    added = _standing(store, connection, asset, table, shard, segments, start, columns, view)
    gone = []
    deleted_since = _deleted(store, connection, asset, table, shard, segments[start:], f"{view}_deleted_since")
    if deleted_since is not None:  # the rows `since` held (no segment up to it deleted them) that were deleted after it
        for number in range(start):
            select = _segment_rows(store, connection, asset, table, shard, segments, number, columns, view)
            if select is None:
                continue
            before = _deleted(store, connection, asset, table, shard, segments[number + 1:start], f"{view}_{number}_before")
            gone.append(select + (f" ANTI JOIN {before} USING ({IDENTITY})" if before else "")
                        + f" SEMI JOIN {deleted_since} USING ({IDENTITY})")
    return tuple(connection.sql(" UNION ALL ".join(parts)) if parts else None for parts in (added, gone))


def version_rows(store: ParquetStore, connection: Any, asset: str, version: str, table: str, shard_keys: list[str],
                 columns: list[str], name: str) -> str | None:
    """Every shard's rows of a split table over `columns`, with their `shard`: the name of a
    view (`name`, built on views `<name>_<shard>`), or None when no shard has rows."""
    selects = []
    for shard in shard_keys:
        rows = shard_rows(store, connection, asset, version, table, shard, columns)
        if rows is not None:
            rows.create_view(f"{name}_{shard}", replace=True)
            selects.append(f"SELECT '{shard}' AS shard, * FROM {name}_{shard}")
    if not selects:
        return None
    connection.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {' UNION ALL '.join(selects)}")
    return name


def _usable_chains(store: ParquetStore, asset: str, splits: list[Split], previous: str) -> dict[str, Chain] | None:
    """The previous version's chains, if the new version can stand on them: every table has
    one with the same key and columns, and every version they stack is there (the new version
    is not one of them: see `rewrites_stacked`)."""
    chains = read_chains(store, asset, previous)
    for split in splits:
        chain = chains.get(split.name)
        if chain is None or chain.key != split.key:
            return None
    segments = {segment for chain in chains.values() for segment in chain.segments}
    if any(not store.is_file(chain_path(store, asset, segment)) for segment in segments):
        return None
    return chains


def _previous_hashes(store: ParquetStore, connection: Any, asset: str, split: Split, chain: Chain,
                     shard_keys: list[str]) -> None:
    """Temp table `_before_<name>`: (shard, key hash, row hash) of every row of the previous
    version, or for a split that replaces groups of it, of the rows of those groups (every
    row's in `_before_all_<name>`)."""
    column = [split.replaces.column] if split.replaces else []
    rows = version_rows(store, connection, asset, chain.segments[-1], split.name, shard_keys, [*column, KEY_HASH, ROW_HASH],
                        f"_before_rows_{split.name}")
    query = (f"SELECT * FROM {rows}" if rows else
             f"SELECT shard, {_quoted(column)}, 0::UBIGINT AS {KEY_HASH}, 0::UBIGINT AS {ROW_HASH} FROM _given_{split.name} "
             "WHERE false" if column else f"SELECT * FROM _now_{split.name} WHERE false")
    if not split.replaces:
        connection.execute(f"CREATE OR REPLACE TEMP TABLE _before_{split.name} AS {query}")
        return
    connection.execute(f"CREATE OR REPLACE TEMP TABLE _before_all_{split.name} AS {query}")
    connection.execute(f"""CREATE OR REPLACE TEMP TABLE _before_{split.name} AS SELECT shard, {IDENTITY}
                           FROM _before_all_{split.name} SEMI JOIN {split.replaces.groups} USING ("{split.replaces.column}")""")


def _replaced_rows(store: ParquetStore, connection: Any, asset: str, previous: str, split: Split,
                   shard_keys: list[str], held: bool) -> None:
    """`_rows_<name>` of a split that replaces groups of `previous`: every row with its hashes,
    the previous version's outside the groups (in the shard they are in, with the hashes they
    were written with: what a row hashes may not be among its columns, `Split.hashed`) and the
    split's rows. A view, or a table when `held` (the version written is one `previous` stacks,
    whose files the write removes before it reads them)."""
    columns = _quoted([*split.schema.names, "shard"])
    parts = [f"SELECT {columns}, {split.key_hash_sql} AS {KEY_HASH}, {split.hash_sql} AS {ROW_HASH} FROM _given_{split.name}"]
    kept = version_rows(store, connection, asset, previous, split.name, shard_keys, [*split.schema.names, KEY_HASH, ROW_HASH],
                        f"_kept_{split.name}")
    if kept:
        parts.insert(0, f'SELECT {columns}, {IDENTITY} FROM {kept} ANTI JOIN {split.replaces.groups} '
                        f'USING ("{split.replaces.column}")')
    connection.execute(f"CREATE OR REPLACE TEMP {'TABLE' if held else 'VIEW'} _rows_{split.name} AS {' UNION ALL '.join(parts)}")


def _with(schema: pa.Schema, *fields: tuple[str, pa.DataType]) -> pa.Schema:
    for name, kind in fields:
        schema = schema.append(pa.field(name, kind))
    return schema


def write_splits(store: ParquetStore, connection: Any, asset: str, version: str, splits: list[Split],
                 previous: str | None, shard_keys: list[str]) -> Written:
    """Write a version of `asset`'s split tables: a delta on `previous` (the version the store
    holds now) when it can stand on it and the chain stays small, else whole.

    A row is unchanged when a row of the previous version in its shard has the same key hash
    and row hash (two independent 64-bit hashes; the row hash covers the key or what stands
    for it). Files keep both hashes, so telling changed rows apart joins integers and reads no
    column but the keys of the previous version."""
    # a version the previous one stacks (the same inputs again, or an earlier state come back) is
    # written whole, over files that its rows kept from the previous version are read from first
    rewritten = previous is not None and rewrites_stacked(store, asset, previous, version)
    chains = None if previous is None or rewritten else _usable_chains(store, asset, splits, previous)
    for split in splits:
        split.rows.create_view(f"_given_{split.name}", replace=True)
        if split.replaces is None:
            connection.execute(f"CREATE OR REPLACE TEMP VIEW _rows_{split.name} AS SELECT * FROM _given_{split.name}")
        elif previous is None:
            raise ValueError(f"{asset}: {split.name}'s rows replace groups of a last version, and there is none")
        else:
            _replaced_rows(store, connection, asset, previous, split, shard_keys, held=rewritten)
    delta = chains is not None
    if delta:
        for split in splits:
            connection.execute(f"""CREATE OR REPLACE TEMP TABLE _now_{split.name} AS
                                   SELECT shard, {split.key_hash_sql} AS {KEY_HASH}, {split.hash_sql} AS {ROW_HASH}
                                   FROM _given_{split.name}""")
            # a key naming two rows of a shard cannot be a delta's (a false alarm only writes whole)
            unique = connection.execute(f"SELECT count(*) = count(DISTINCT (shard, {KEY_HASH})) "
                                        f"FROM _now_{split.name}").fetchall()[0][0]
            delta = delta and unique
    delta_rows: dict[str, int] = {}  # per table, the rows a delta writes (new, and deleted)
    if delta:
        changed = before = 0
        for split in splits:
            _previous_hashes(store, connection, asset, split, chains[split.name], shard_keys)
            # the rows on one side alone, in one join: new (now, not before) and gone (before, not now)
            connection.execute(f"""CREATE OR REPLACE TEMP TABLE _diff_{split.name} AS
                                   SELECT coalesce(n.shard, b.shard) AS shard, coalesce(n.{KEY_HASH}, b.{KEY_HASH}) AS {KEY_HASH},
                                          coalesce(n.{ROW_HASH}, b.{ROW_HASH}) AS {ROW_HASH}, n.shard IS NOT NULL AS new
                                   FROM _now_{split.name} n FULL JOIN _before_{split.name} b
                                       ON n.shard = b.shard AND n.{KEY_HASH} = b.{KEY_HASH} AND n.{ROW_HASH} = b.{ROW_HASH}
                                   WHERE n.shard IS NULL OR b.shard IS NULL""")
            for name, side in (("new", ""), ("gone", "NOT ")):
                connection.execute(f"CREATE OR REPLACE TEMP VIEW _{name}_{split.name} AS "
                                   f"SELECT shard, {IDENTITY} FROM _diff_{split.name} WHERE {side}new")
            before += _count(connection, f"_before_all_{split.name}" if split.replaces else f"_before_{split.name}")
            delta_rows[split.name] = _count(connection, f"_new_{split.name}") + _count(connection, f"_gone_{split.name}")
            changed += delta_rows[split.name] + sum(chains[split.name].delta_rows)
        delta = len(chains[splits[0].name].segments) < MAX_SEGMENTS and changed <= DELTA_SHARE * before
    new_chains = {}
    for split in splits:
        folder = store.split_folder(asset, version, split.name)
        file_schema = _with(split.schema, (KEY_HASH, pa.uint64()), (ROW_HASH, pa.uint64()), ("shard", pa.string()))
        if delta and split.rows_for is None:
            # the new rows are among the given ones, named by their key hash (unique in a shard)
            rows = connection.sql(f"""SELECT r.* EXCLUDE (_key_now), n.{KEY_HASH}, n.{ROW_HASH}
                                      FROM (SELECT *, {split.key_hash_sql} AS _key_now FROM _given_{split.name}) r
                                      JOIN _new_{split.name} n ON n.shard = r.shard AND n.{KEY_HASH} = r._key_now""")
        elif delta:
            # the keys of the new rows (a pass over the rows' key columns alone), which the split
            # reads whole from where they are
            key = _quoted(split.key)
            connection.execute(f"""CREATE OR REPLACE TEMP TABLE _wanted_{split.name} AS
                                   SELECT r.shard, {key}, n.{KEY_HASH}, n.{ROW_HASH}
                                   FROM (SELECT shard, {key}, {split.key_hash_sql} AS {KEY_HASH} FROM _given_{split.name}) r
                                   JOIN _new_{split.name} n USING (shard, {KEY_HASH})""")
            split.rows_for(f"_wanted_{split.name}").create_view(f"_rows_for_{split.name}", replace=True)
            rows = connection.sql(f"SELECT r.*, n.{KEY_HASH}, n.{ROW_HASH} FROM _rows_for_{split.name} r "
                                  f"JOIN _wanted_{split.name} n USING (shard, {key})")
        if delta:
            store.write_split(folder, relation_batches(rows, file_schema))
            gone_schema = pa.schema([(KEY_HASH, pa.uint64()), (ROW_HASH, pa.uint64()), ("shard", pa.string())])
            store.write_split(store.split_folder(asset, version, split.name + DELETED),
                              relation_batches(connection.table(f"_gone_{split.name}"), gone_schema))
            chain = chains[split.name]
            new_chains[split.name] = Chain(split.key, (*chain.segments, version), (*chain.delta_rows, delta_rows[split.name]))
        else:
            source = f"_rows_{split.name}"
            if split.rows_for is not None:  # the given rows are light: every one read whole
                split.rows_for(f"_given_{split.name}").create_view(f"_rows_for_{split.name}", replace=True)
                source = f"(SELECT * FROM _rows_for_{split.name} SEMI JOIN _given_{split.name} USING (shard, {_quoted(split.key)}))"
            rows = connection.sql(f"SELECT * FROM {source}" if split.replaces else  # hashed already
                                  f"SELECT *, {split.key_hash_sql} AS {KEY_HASH}, {split.hash_sql} AS {ROW_HASH} FROM {source}")
            store.write_split(folder, relation_batches(rows, file_schema))
            store.delete_folder(store.split_folder(asset, version, split.name + DELETED))
            new_chains[split.name] = Chain(split.key, (version,), (0,))
    store.write(chain_path(store, asset, version), pa.table({
        "table_name": list(new_chains), "key": [list(chain.key) for chain in new_chains.values()],
        "segments": [list(chain.segments) for chain in new_chains.values()],
        "delta_rows": [list(chain.delta_rows) for chain in new_chains.values()]}, schema=_CHAIN))
    parts, rows = _fingerprints(store, connection, asset, version, splits, shard_keys, delta)
    keep = {segment for chain in new_chains.values() for segment in chain.segments}
    return Written(parts, keep, delta, sum(delta_rows.values()) if delta else rows)


def _fingerprints(store: ParquetStore, connection: Any, asset: str, version: str, splits: list[Split],
                  shard_keys: list[str], delta: bool) -> tuple[dict[str, str], int]:
    """Each shard's fingerprint (shards without rows left out), and the rows of every shard:
    per table, its row count and the sum of its rows' hashes, so the same rows give the same
    fingerprint however they are stored."""
    sums: dict[str, list[str]] = {}
    total_rows = 0
    for split in splits:
        if delta and split.replaces:  # every row the previous version held, less the gone, and the new
            totals = connection.execute(f"""
                SELECT shard, sum(rows)::BIGINT, sum(total) FROM (
                    SELECT shard, count(*) AS rows, sum({ROW_HASH}) AS total FROM _before_all_{split.name} GROUP BY shard
                    UNION ALL SELECT shard, -count(*), -sum({ROW_HASH}) FROM _gone_{split.name} GROUP BY shard
                    UNION ALL SELECT shard, count(*), sum({ROW_HASH}) FROM _new_{split.name} GROUP BY shard)
                GROUP BY shard""").fetchall()
        elif delta:
            totals = connection.execute(f"SELECT shard, count(*), sum({ROW_HASH}) FROM _now_{split.name} "
                                        "GROUP BY shard").fetchall()
        else:
            totals = []
            for shard in shard_keys:
                files = store.split_files(asset, version, split.name, shard)
                if files:
                    store.relation(connection, files).create_view("_written_rows", replace=True)
                    totals.append((shard, *connection.execute(
                        f"SELECT count(*), sum({ROW_HASH}) FROM _written_rows").fetchall()[0]))
        for shard, rows, total in totals:
            if rows:
                sums.setdefault(shard, []).append(f"{split.name}:{rows}:{total}")
                total_rows += rows
    return {shard: short_hash("|".join(sums[shard])) for shard in shard_keys if shard in sums}, total_rows


def _count(connection: Any, table: str) -> int:
    return connection.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
