"""Packs: the rows of every partition of an asset gathered in a few files, so that a global step
reading every partition opens a few files rather than one per partition.

At 5M events a partitioned asset has 16,082 files, and DuckDB spends ten times longer opening
them than reading their rows: four columns of every event take 4.5 CPU-s from the partition
files and 0.45 from one file holding the same rows. The global steps read every partition of
several assets a dozen times in a run, cold or after one new quarter.

A pack is two files under `_packs/<asset>/` beside the stages' folders:
- `<id>.parquet`: the rows of some partition files, each with the file it came from
  (`_pack_file`, its path relative to the store's root). Only the asset's light columns:
  an embedding or a chunk's text (`HEAVY`) is most of the bytes and is read for the rows a
  step chose, from the partition files;
- `<id>.index.parquet`, written after it: each file packed with the size and modification
  time it had when it was read, and its rows; and what the pack is (`_Meta`).

A reader (`packed`) asks for some partition files. A pack serves a file when it holds it with
the size and time the file has now (as the store's manifests tell a rewritten file from an
unchanged one); every other file is read as it is, and when there are many of them (a cold
pass, a quarter's worth) they are packed first, so the next step reads them from the pack. The
rows are the files' rows either way; only the files they are read from differ. Packs are
folded into one when there are too many or they hold mostly files rewritten since. A folded
pack is removed a while after (`GRACE_SECONDS`), so a step still reading it is not cut short.
A pack that is unreadable, or written by another tkg or for other columns, is not used.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from tkg.store.manifest import scan, schema_fingerprints
from tkg.store.parquet import ParquetStore, temporary_path

PACKS = "_packs"
PACK_VERSION = "packs-1"
# Per asset, the columns left out of its packs: the bulk of its bytes, which the global steps read
# for chosen rows only (the vectors of the facts and mentions they compare, the participants
# lists' text) or never (the statements' text, which the events carry too).
HEAVY = {"temporal_events": ("embedding",), "entities": ("embedding",), "chunks": ("text",), "transcripts": ("text",),
         "statements": ("statement",)}
SOURCE = "_pack_file"
MIN_FILES = 64  # files not in a pack worth packing before they are read
MAX_PACKS = 8  # more packs than this are folded into one
DEAD_SHARE = 0.5  # or when more than this share of their rows are of files rewritten or gone since
GRACE_SECONDS = 600  # how long a folded pack stays for the steps still reading it
_INDEX = pa.schema([("path", pa.string()), ("size", pa.int64()), ("mtime_ns", pa.int64()), ("rows", pa.int64())])
_names = itertools.count()
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Meta:
    """What a pack is: of which asset and tkg pack format, for files of which schema (their
    stamps' fingerprint), with which columns; the packs it folded; its data file's size."""

    asset: str
    schema: str
    columns: tuple[str, ...]
    folds: tuple[str, ...]
    data_size: int
    version: str = PACK_VERSION

    def to_json(self) -> str:
        return json.dumps({"version": self.version, "asset": self.asset, "schema": self.schema,
                           "columns": list(self.columns), "folds": list(self.folds), "data_size": self.data_size})

    @classmethod
    def from_json(cls, text: str) -> _Meta:
        value = json.loads(text)
        return cls(value["asset"], value["schema"], tuple(value["columns"]), tuple(value["folds"]),
                   int(value["data_size"]), value["version"])


@dataclass
class _Pack:
    id: str
    data: Path
    index: Path
    meta: _Meta
    files: dict[str, tuple[int, int, int]]  # relative path -> (size, mtime_ns, rows)
    written_at: float  # the index's modification time


def partition_rows(store: ParquetStore, connection: Any, asset: str, schema: pa.Schema) -> Any:
    """Every partition's rows of `asset` over its light columns (`packed`), or none with
    `schema`'s light columns before there is a partition."""
    files = store.partition_files(asset)
    if files:
        return packed(store, connection, files)
    return connection.from_arrow(schema.empty_table().select(light_columns(asset, schema.names)))


def light_columns(asset: str, columns: list[str]) -> list[str]:
    """`columns` (an asset's, in order) without the ones its packs leave out."""
    heavy = HEAVY.get(asset, ())
    return [column for column in columns if column not in heavy]


def packed(store: ParquetStore, connection: Any, files: list[PurePath]) -> Any:
    """The rows of `files` (partition files of one asset, none missing) over the asset's light
    columns: a DuckDB relation on `connection`, read from the asset's packs for the files they
    hold as the files are now, and from the files for the others (packed first when there are
    `MIN_FILES` of them). The same rows as `scan(...).select(light columns)`, in no set order."""
    if not files:
        raise ValueError("packed() needs at least one file")
    asset = store.relative(files[0]).split("/", 1)[0]
    fingerprints = schema_fingerprints(store, files)
    names = pq.read_schema(str(files[0])).names if store.is_local else []
    if not store.is_local or len(fingerprints) != 1 or None in fingerprints or "filename" in names:
        # an object store, files of several schemas (or unknown to the manifests), or a column the
        # packs' own would shadow: the files are read as they are
        whole = scan(store, connection, files)
        return whole.select(_quoted(light_columns(asset, whole.columns)))
    schema = next(iter(fingerprints))
    columns = light_columns(asset, names)
    folder = Path(store.parquet_root) / PACKS / asset
    now = store.identities([store.relative(path) for path in files])
    missing = [path for path in files if store.relative(path) not in now]
    if missing:
        raise FileNotFoundError(f"{len(missing)} partition file(s) of {asset} are gone, e.g. {missing[0]}")
    packs = _packs(folder, asset, schema, columns)
    _remove_folded(packs)
    packs = [pack for pack in packs if pack.id not in {folded for other in packs for folded in other.meta.folds}]
    held = _current(store, packs, now)
    served = _served(packs, held, now)
    loose = sorted(set(now) - {path for paths in served.values() for path in paths})
    try:
        if _fold_due(packs, held):
            pack = _write_pack(store, connection, folder, asset, schema, columns,
                               {**held, **{path: now[path] for path in loose}}, packs)
            packs, served = [pack], {pack.id: [path for path in pack.files if path in now]}
            loose = []
        elif len(loose) >= MIN_FILES:
            pack = _write_pack(store, connection, folder, asset, schema, columns, {path: now[path] for path in loose}, [])
            packs.append(pack)
            served[pack.id] = list(pack.files)
            loose = []
    except (OSError, duckdb.Error) as error:  # a pack only saves time: the rows are read as they stand
        log.warning("could not write a pack of %s (%s); reading its files", asset, str(error).splitlines()[0])
    return _relation(store, connection, packs, served, loose, columns)


def _packs(folder: Path, asset: str, schema: str, columns: list[str]) -> list[_Pack]:
    """The usable packs in `folder` (oldest first): whole, of `asset` and this tkg's format, for
    files of `schema` and these columns. The others (damaged, or for files another tkg wrote)
    are removed once they are `GRACE_SECONDS` old."""
    packs = []
    for index in sorted(folder.glob("*.index.parquet")) if folder.is_dir() else []:
        data = index.with_name(index.name.removesuffix(".index.parquet") + ".parquet")
        try:
            written_at = index.stat().st_mtime
            table = pq.read_table(index)
            meta = _Meta.from_json((table.schema.metadata or {})[b"tkg_pack"].decode())
            usable = (meta.version, meta.asset, meta.schema, list(meta.columns)) == (PACK_VERSION, asset, schema, columns) \
                and data.stat().st_size == meta.data_size
        except (OSError, KeyError, ValueError, pa.ArrowInvalid):
            usable = False
        if usable:
            rows = table.to_pydict()
            files = {path: (size, mtime, count) for path, size, mtime, count in
                     zip(rows["path"], rows["size"], rows["mtime_ns"], rows["rows"])}
            packs.append(_Pack(data.name.removesuffix(".parquet"), data, index, meta, files, written_at))
        elif _older_than_grace(index):
            for path in (index, data):
                path.unlink(missing_ok=True)
    indexed = {pack.data.name for pack in packs} | {path.name.replace(".index", "") for path in folder.glob("*.index.parquet")}
    for data in folder.glob("*.parquet") if folder.is_dir() else []:  # a writer stopped before its index
        if not data.name.endswith(".index.parquet") and data.name not in indexed and _older_than_grace(data):
            data.unlink(missing_ok=True)
    return packs


def _older_than_grace(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime >= GRACE_SECONDS
    except OSError:
        return False


def _remove_folded(packs: list[_Pack]) -> None:
    """Remove the packs another pack folded, once it has stood for `GRACE_SECONDS`."""
    by_id = {pack.id: pack for pack in packs}
    for pack in packs:
        if time.time() - pack.written_at < GRACE_SECONDS:
            continue
        for folded in pack.meta.folds:
            if folded in by_id:
                for path in (by_id[folded].index, by_id[folded].data):  # the index first: no reader takes it up again
                    path.unlink(missing_ok=True)


def _current(store: ParquetStore, packs: list[_Pack], now: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Every file a pack holds as it is now (asked for or not): what a fold keeps."""
    others = sorted({path for pack in packs for path in pack.files} - set(now))
    current = {**store.identities(others), **now} if others else now
    return {path: current[path] for pack in packs for path, (size, mtime, _) in pack.files.items()
            if current.get(path) == (size, mtime)}


def _served(packs: list[_Pack], held: dict[str, tuple[int, int]], now: dict[str, tuple[int, int]]) -> dict[str, list[str]]:
    """Per pack, the files asked for that it serves: those it holds as they are now, each from
    the oldest pack that holds it."""
    served: dict[str, list[str]] = {}
    taken: set[str] = set()
    for pack in packs:
        paths = [path for path in pack.files if path in now and path in held and path not in taken
                 and pack.files[path][:2] == now[path]]
        taken.update(paths)
        served[pack.id] = paths
    return served


def _fold_due(packs: list[_Pack], held: dict[str, tuple[int, int]]) -> bool:
    """Too many packs, or packs whose rows are mostly of files rewritten or gone since (or held twice)."""
    if len(packs) > MAX_PACKS:
        return True
    total = sum(rows for pack in packs for _, _, rows in pack.files.values())
    live, seen = 0, set()
    for pack in packs:
        for path, (size, mtime, rows) in pack.files.items():
            if held.get(path) == (size, mtime) and path not in seen:
                seen.add(path)
                live += rows
    return total > 0 and total - live > DEAD_SHARE * total


def _write_pack(store: ParquetStore, connection: Any, folder: Path, asset: str, schema: str, columns: list[str],
                files: dict[str, tuple[int, int]], folded: list[_Pack]) -> _Pack:
    """A new pack of `files` (relative path -> size and time now), read from the packs it folds
    where they hold them as they are and from the files themselves otherwise; its index is
    written last."""
    folder.mkdir(parents=True, exist_ok=True)
    pack_id = f"{time.time_ns():020d}-{secrets.token_hex(4)}"
    data, index = folder / f"{pack_id}.parquet", folder / f"{pack_id}.index.parquet"
    served = _served(folded, files, files)
    in_packs = {path for paths in served.values() for path in paths}
    rows = _relation(store, connection, folded, served, sorted(set(files) - in_packs), columns, with_source=True)
    temporary = temporary_path(data)
    try:
        rows.create_view("_pack_rows", replace=True)
        connection.execute(f"COPY (SELECT * FROM _pack_rows) TO '{_sql_text(temporary)}' "
                           "(FORMAT parquet, COMPRESSION zstd)")
        os.replace(temporary, data)
    finally:
        temporary.unlink(missing_ok=True)
    counts = dict(connection.execute(f"SELECT {SOURCE}, count(*) FROM read_parquet($data) GROUP BY ALL",
                                     {"data": str(data)}).fetchall())
    meta = _Meta(asset, schema, tuple(columns), tuple(pack.id for pack in folded), data.stat().st_size)
    listed = sorted(files)
    table = pa.table({"path": listed, "size": [files[path][0] for path in listed],
                      "mtime_ns": [files[path][1] for path in listed], "rows": [counts.get(path, 0) for path in listed]},
                     schema=_INDEX.with_metadata({"tkg_pack": meta.to_json()}))
    store.write(index, table)
    return _Pack(pack_id, data, index, meta, {path: (*files[path], counts.get(path, 0)) for path in listed},
                 index.stat().st_mtime)


def _relation(store: ParquetStore, connection: Any, packs: list[_Pack], served: dict[str, list[str]], loose: list[str],
              columns: list[str], with_source: bool = False) -> Any:
    """The rows of the files `served` from each pack and of the `loose` files, over `columns`
    (and `_pack_file` when `with_source`)."""
    selected = _quoted([*columns, *([SOURCE] if with_source else [])])
    parts = []
    for pack in packs:
        paths = served.get(pack.id, [])
        if not paths:
            continue
        source = f"read_parquet('{_sql_text(pack.data)}')"
        if len(paths) < len(pack.files):  # some of its files are rewritten, gone or not asked for
            name = f"_pack_files_{next(_names)}"
            connection.register(name, pa.table({SOURCE: pa.array(paths, pa.string())}))
            source += f" SEMI JOIN {name} USING ({SOURCE})"
        parts.append(f"SELECT {selected} FROM {source}")
    if loose:
        name = f"_pack_loose_{next(_names)}"
        start = len(str(store.parquet_root).rstrip("/")) + 2  # the relative path, after the root and its '/'
        connection.read_parquet([str(store.absolute(path)) for path in loose], filename=True).create_view(name, replace=True)
        source = f'substr("filename", {start}) AS {SOURCE}' if with_source else ""
        parts.append(f"SELECT {', '.join(filter(None, [_quoted(columns), source]))} FROM {name}")
    return connection.sql(" UNION ALL ".join(parts))


def _quoted(columns: list[str]) -> str:
    return ", ".join(f'"{column}"' for column in columns)


def _sql_text(path: PurePath) -> str:
    return str(path).replace("'", "''")
