"""Parquet is the system of record: one file per (asset, company, quarter), replaced atomically.

Partitioned steps never touch the DuckDB file, so partition runs can go fully parallel; global
steps read the files through an in-memory DuckDB connection (no file lock either).
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import socket
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path, PurePath, PurePosixPath

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from tkg.core.machine import process_alive
from tkg.core.versions import Stamp, read_stamp, read_stamp_from

# A global step's tables split by shard (`ParquetStore.write_split`): what may wait in memory
# before it is written, and the most rows a row group of theirs holds.
SPLIT_BUFFER_BYTES = 256 * 2**20
SPLIT_ROW_GROUP = 65536

# Temporary files carry the host and process that write them, so a later run can tell the
# leftovers of a killed writer from the files of a writer that is still at work.
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<host>[^.]+)-(?P<pid>\d+)\.[0-9a-f]{8}(?P<suffix>\.tmp|\.building)(?:\.wal)?$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def temporary_path(target: Path, suffix: str = ".tmp") -> Path:
    """A unique temporary name beside `target`, for writing it and then swapping it in."""
    return target.with_name(f".{target.name}.{_host()}-{os.getpid()}.{secrets.token_hex(4)}{suffix}")



def remove_orphaned_temporaries(root: Path) -> list[Path]:
    """Delete the temporary files that writers on this host left behind when they were killed
    (their process is gone); files of writers still running are left alone."""
    removed = []
    host = _host()
    if not root.exists():
        return removed
    for path in root.rglob(".*"):
        match = _TEMPORARY.match(path.name)
        if match and match["host"] == host and not process_alive(int(match["pid"])):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


@contextmanager
def locked(path: Path, waiting: Callable[[str], None] | None = None) -> Iterator[None]:
    """An exclusive lock on `path` (created if needed) for the duration of the block. When
    another process holds it, `waiting` is told who (the pid it wrote) before blocking."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                handle.seek(0)
                waiting(handle.read().strip() or "?")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)



def _s3_filesystem() -> pafs.S3FileSystem:
    """pyarrow's S3 client with the standard AWS settings: credentials and region from the usual
    variables and files, and AWS_ENDPOINT_URL for S3-compatible stores (MinIO, Ceph, R2, moto)."""
    options = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        options.update(endpoint_override=host.rstrip("/") if host else endpoint, scheme=scheme if host else "https")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    return pafs.S3FileSystem(**options)


def open_location(uri: str) -> tuple[pafs.FileSystem, str]:
    """A filesystem and the path inside it for a folder URI: a local path, file://, or s3://."""
    if uri.startswith("s3://"):
        bucket_and_prefix = uri.removeprefix("s3://").strip("/")
        if not bucket_and_prefix:
            raise ValueError(f"{uri!r} names no bucket; use s3://bucket/prefix")
        return _s3_filesystem(), bucket_and_prefix
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]+:", uri) and not uri.startswith("file://"):  # a scheme, not a folder
        raise ValueError(f"unsupported storage URI {uri!r}: use a local folder or s3://bucket/prefix")
    return pafs.LocalFileSystem(), str(Path(uri.removeprefix("file://")).expanduser().resolve())


def mtime_ns(info: pafs.FileInfo) -> int:
    """A listed file's modification time in nanoseconds (-1 when the filesystem gives none)."""
    if info.mtime_ns is not None:
        return int(info.mtime_ns)
    return int(info.mtime.timestamp() * 1e9) if info.mtime is not None else -1


def _glob_regex(pattern: str) -> re.Pattern:
    """A glob over '/'-separated paths: `*` within one folder, `**/` across any number."""
    parts = []
    for token in re.split(r"(\*\*/|\*)", pattern):
        parts.append("(?:[^/]+/)*" if token == "**/" else "[^/]*" if token == "*" else re.escape(token))
    return re.compile("".join(parts) + r"\Z")


_PARTITION = re.compile(r"/company=([^/]+)/quarter=(\d{4}-\d{2}-\d{2})/")


def partition_of(path: str) -> tuple[str, str]:
    """The (company, quarter) of a partition file's path (as the store names it, or relative)."""
    found = _PARTITION.search(path)
    if found is None:
        raise ValueError(f"{path} is not in a company=/quarter= folder")
    return found[1], found[2]


def relation_batches(relation: duckdb.DuckDBPyRelation, schema: pa.Schema) -> pa.RecordBatchReader:
    """A relation's columns of `schema`, streamed as batches cast to it (never held whole)."""
    reader = relation.select(*(f'"{name}"' for name in schema.names)).fetch_arrow_reader(batch_size=65536)
    return pa.RecordBatchReader.from_batches(schema, (batch.cast(schema) for batch in reader))


@dataclass
class _HeldListings:
    """The store whose folders `listings_held` holds, which top folders, and each one's files
    once listed (relative path -> size and modification time)."""

    root: str
    folders: frozenset[str]
    files: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)


_HELD: ContextVar[_HeldListings | None] = ContextVar("tkg_held_listings", default=None)


@contextmanager
def listings_held(store: ParquetStore, folders: Iterable[str]) -> Iterator[None]:
    """Within: each of `folders` (top folders of the store, e.g. the partitioned stages') is
    listed once, at the first listing of anything under it, and later listings under it
    (`ParquetStore.listing`, `folder_files`, `identities`) take their files from that one.
    For work that writes nothing under those folders: a global step, which lists every
    partition of several stages several times (16,082 partitions a stage at 5M events, a third
    of a second each time). A file written under them meanwhile by another run is seen by the
    next holder, as one written just after. Inside a hold of the same store, a new one changes
    nothing."""
    before = _HELD.get()
    if before is not None and before.root == str(store.parquet_root):
        yield
        return
    _HELD.set(_HeldListings(str(store.parquet_root), frozenset(folders)))
    try:
        yield
    finally:  # set, not reset: a generator's frame may close in another context than it began in
        _HELD.set(before)


class ParquetStore:
    """Reads and writes the Parquet system of record: a local folder (`<home>/parquet`) or an
    object store (TKG_STORAGE=s3://bucket/prefix).

    Paths are in the store's filesystem: a `Path` for a local store, a bucket-relative
    `PurePosixPath` for S3. Local writes go to a temporary file that is then renamed over the
    target; an S3 PUT (or a completed multipart upload) replaces an object at once. Either way
    a reader sees the old file or the new one, never half. `home` stays local: locks, caches
    and the Dagster instance live there.
    """

    def __init__(self, home: str | os.PathLike, storage: str | None = None) -> None:
        """The store of data folder `home`: `storage` (a folder or s3://bucket/prefix, see
        tkg.settings), else `<home>/parquet`."""
        self.root = Path(home).expanduser().resolve()
        self.uri = storage or str(self.root / "parquet")
        self.filesystem, base = open_location(self.uri)
        self.is_local = isinstance(self.filesystem, pafs.LocalFileSystem)
        self.parquet_root: PurePath = Path(base) if self.is_local else PurePosixPath(base)

    def __repr__(self) -> str:
        return f"ParquetStore({self.uri!r})"

    def display(self, path: PurePath) -> str:
        """`path` as a user would type it: a local path or an s3:// URI."""
        return str(path) if self.is_local else f"s3://{path}"

    def partition_path(self, asset: str, company: str, quarter: date | str) -> PurePath:
        quarter_text = quarter.isoformat() if isinstance(quarter, date) else quarter
        return self.parquet_root / asset / f"company={company}" / f"quarter={quarter_text}" / f"{asset}.parquet"

    def global_path(self, asset: str, table: str | None = None) -> PurePath:
        return self.parquet_root / asset / f"{table or asset}.parquet"

    def shard_path(self, asset: str, shard: str, table: str | None = None) -> PurePath:
        """A sharded asset's table for one shard."""
        return self.parquet_root / asset / f"shard={shard}" / f"{table or asset}.parquet"

    def split_folder(self, asset: str, version: str, table: str) -> PurePath:
        """Where a global step writes one of its tables split by shard (`shard=<key>/` under it),
        in a folder of its own version: its stamp file commits it, readers follow the stamp."""
        return self.parquet_root / asset / f"v={version}" / table

    def split_files(self, asset: str, version: str, table: str, shard: str) -> list[PurePath]:
        """One shard's files of a table a global step split by shard."""
        folder = self.split_folder(asset, version, table)
        return self.files(f"{folder.relative_to(self.parquet_root).as_posix()}/shard={shard}/*.parquet")

    def write_split(self, folder: PurePath, data: pa.RecordBatchReader, buffer_bytes: int = SPLIT_BUFFER_BYTES) -> None:
        """Write `data` (with a string column `shard`) as one file per shard,
        `<folder>/shard=<key>/part-0.parquet` (the key in the path, not in the file), streaming;
        what the folder held before is replaced.

        At most `buffer_bytes` of rows wait in memory: each batch is cut by shard and appended
        to its shard's buffer, and the largest buffer is written out as a row group whenever
        they hold more. (Arrow's dataset writer queues up to 8M rows whatever their width: on
        the facts of 5M events, with their vectors, several GB.)

        On a local disk the files are written to a folder beside it, which replaces it once they
        are all written: a write stopped half-way (killed, out of memory or disk) leaves what the
        folder held, which a version stacking it still reads."""
        final = folder
        if self.is_local:
            for left in Path(folder.parent).glob(f".writing-*-{folder.name}"):  # of a write killed half-way
                self.delete_folder(left)
            folder = folder.parent / f".writing-{secrets.token_hex(6)}-{folder.name}"
        else:
            self.delete_folder(folder)
        writers: dict[str, pq.ParquetWriter] = {}
        buffers: dict[str, list[pa.RecordBatch]] = {}
        sizes: dict[str, int] = {}
        schema = data.schema.remove(data.schema.get_field_index("shard"))

        def flush(shard: str) -> None:
            rows = pa.Table.from_batches(buffers.pop(shard), schema)
            sizes.pop(shard)
            writer = writers.get(shard)
            if writer is None:
                shard_folder = f"{folder}/shard={shard}"
                self.filesystem.create_dir(shard_folder, recursive=True)
                writer = writers[shard] = pq.ParquetWriter(f"{shard_folder}/part-0.parquet", schema, filesystem=self.filesystem,
                                                           compression="zstd", use_dictionary=dictionary_columns(schema))
            writer.write_table(rows, row_group_size=SPLIT_ROW_GROUP)

        written = False
        try:
            for batch in data:
                if not batch.num_rows:
                    continue
                order = pc.sort_indices(batch.column("shard"))
                keys, rows = batch.column("shard").take(order), batch.drop_columns(["shard"])
                counts = {row["values"]: row["counts"] for row in pc.value_counts(keys).to_pylist()}
                start = 0
                for shard in pc.unique(keys).to_pylist():  # sorted keys: in their order
                    # a copy of the shard's rows, so the buffer holds them and not the whole batch
                    part = rows.take(order.slice(start, counts[shard]))
                    start += counts[shard]
                    buffers.setdefault(shard, []).append(part)
                    sizes[shard] = sizes.get(shard, 0) + part.nbytes
                while sizes and sum(sizes.values()) > buffer_bytes:
                    flush(max(sizes, key=sizes.__getitem__))
            for shard in sorted(buffers):
                flush(shard)
            written = True
        finally:
            for writer in writers.values():
                writer.close()
            if folder != final and not written:  # stopped half-way: the folder stays as it was
                self.delete_folder(folder)
        if folder != final:
            self.delete_folder(final)
            if writers:
                os.replace(folder, final)

    def delete_folder(self, folder: PurePath) -> None:
        """Remove a folder and everything under it; a folder that is not there is fine."""
        try:
            self.filesystem.delete_dir(str(folder))
        except FileNotFoundError:
            pass

    def versions_of(self, asset: str) -> list[str]:
        """The versions of split tables an asset's folder holds (`v=<version>` folders)."""
        selector = pafs.FileSelector(str(self.parquet_root / asset), recursive=False, allow_not_found=True)
        return sorted(info.base_name.removeprefix("v=") for info in self.filesystem.get_file_info(selector)
                      if info.type == pafs.FileType.Directory and info.base_name.startswith("v="))

    def usage_path(self, step: str, company: str | None = None, quarter: date | None = None,
                   shard: str | None = None) -> PurePath:
        """Where one step's LLM accounting goes: per partition, per shard, or one file for a global step."""
        folder = self.parquet_root / "llm_calls" / step
        if company is not None and quarter is not None:
            folder = folder / f"company={company}" / f"quarter={quarter.isoformat()}"
        elif shard is not None:
            folder = folder / f"shard={shard}"
        return folder / "llm_calls.parquet"

    def relative(self, path: PurePath | str) -> str:
        """A path of the store as it is named relative to the Parquet root ('/'-separated)."""
        return str(path).removeprefix(str(self.parquet_root) + "/")

    def absolute(self, relative: str) -> PurePath:
        """The path of the store that `relative` (as `relative()` gives it) names."""
        return self.parquet_root / relative

    def files(self, pattern: str) -> list[PurePath]:
        """The files under the Parquet root whose relative path matches `pattern` (a glob:
        `*` within a folder, `**/` across folders), sorted."""
        return sorted(self.listing(pattern))

    def listing(self, pattern: str) -> dict[PurePath, tuple[int, int]]:
        """`files(pattern)` with each file's size and modification time (ns), from one listing
        of the folder before the first wildcard: what tells a rewritten file from an unchanged one."""
        fixed = pattern.split("*", 1)[0].rpartition("/")[0]  # the folder before the first wildcard
        matcher = _glob_regex(pattern)
        return {self.absolute(relative): identity for relative, identity in self.folder_files(fixed).items()
                if matcher.match(relative) and not relative.rsplit("/", 1)[-1].startswith(".")}

    def folder_files(self, folder: str) -> dict[str, tuple[int, int]]:
        """Every file under `folder` (relative to the Parquet root; '' for all of it), by its
        relative path, with its size and modification time (ns): one listing, or the one
        `listings_held` holds of its top folder."""
        held = self._held()
        top = folder.strip("/").split("/", 1)[0]
        if held is None or top not in held.folders:
            return self._list(folder)
        if top not in held.files:
            held.files[top] = self._list(top)
        inside = folder.strip("/") + "/"
        return {relative: identity for relative, identity in held.files[top].items() if relative.startswith(inside)}

    def _held(self) -> _HeldListings | None:
        """The listings `listings_held` holds for this store, if any."""
        held = _HELD.get()
        return held if held is not None and held.root == str(self.parquet_root) else None

    def _list(self, folder: str) -> dict[str, tuple[int, int]]:
        base = self.parquet_root / folder if folder.strip("/") else self.parquet_root
        selector = pafs.FileSelector(str(base), recursive=True, allow_not_found=True)
        return {self.relative(info.path): (int(info.size or 0), mtime_ns(info))
                for info in self.filesystem.get_file_info(selector) if info.type == pafs.FileType.File}

    def identities(self, relative: list[str]) -> dict[str, tuple[int, int]]:
        """The size and modification time (ns) of each of these files (relative paths) that
        is there now: from the listing `listings_held` holds of their top folder, else one
        look at each."""
        held = self._held()
        tops = {path.split("/", 1)[0] for path in relative}
        if held is not None and tops <= held.folders:
            listed: dict[str, tuple[int, int]] = {}
            for top in tops:
                listed.update(self.folder_files(top))
            return {path: listed[path] for path in relative if path in listed}
        infos = self.filesystem.get_file_info([str(self.absolute(path)) for path in relative])
        return {path: (int(info.size or 0), mtime_ns(info)) for path, info in zip(relative, infos)
                if info.type == pafs.FileType.File}

    def partition_files(self, asset: str) -> list[PurePath]:
        """Every partition file of a partitioned asset."""
        return self.files(f"{asset}/company=*/quarter=*/{asset}.parquet")

    def metadata(self, path: PurePath) -> pq.FileMetaData:
        """A Parquet file's footer: its rows, row groups and their sizes, without reading data."""
        with self.filesystem.open_input_file(str(path)) as handle:
            return pq.read_metadata(handle)

    def is_file(self, path: PurePath) -> bool:
        return self.filesystem.get_file_info(str(path)).type == pafs.FileType.File

    def delete(self, path: PurePath) -> None:
        """Remove a file; a file that is already gone is fine."""
        try:
            self.filesystem.delete_file(str(path))
        except FileNotFoundError:
            pass

    def write(self, path: PurePath, table: pa.Table | pa.RecordBatchReader) -> PurePath:
        """Write `table` to `path` atomically: a reader sees the old file or the new one, never
        half. A RecordBatchReader is written batch by batch, never held whole in memory."""
        if not self.is_local:
            _write_parquet(table, str(path), self.filesystem)
            return path
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = temporary_path(path)
        try:
            _write_parquet(table, str(temporary), None)
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        return path

    def read(self, path: PurePath) -> pa.Table:
        return pq.read_table(str(path), filesystem=self.filesystem)

    def stamp(self, path: PurePath) -> Stamp | None:
        """The stamp of the file at `path` (None when absent or written without one)."""
        if self.is_local:
            return read_stamp(path)
        try:
            with self.filesystem.open_input_file(str(path)) as handle:
                return read_stamp_from(handle)
        except FileNotFoundError:
            return None

    def relation(self, connection: duckdb.DuckDBPyConnection, files: list[PurePath], uniform: bool = False
                 ) -> duckdb.DuckDBPyRelation:
        """The files as one DuckDB relation, columns matched by name, scanned lazily (only the
        columns and rows a query needs, out of core). A local store is scanned by DuckDB itself;
        an object store through a pyarrow dataset (DuckDB's httpfs extension cannot be assumed
        to be installed). `uniform`: the caller knows every file has the same columns, so the
        files' schemas need not all be read and matched first (seconds for thousands of files)."""
        if self.is_local:
            return connection.read_parquet([str(f) for f in files], union_by_name=not uniform)
        schemas = [pq.read_schema(str(f), filesystem=self.filesystem) for f in (files[:1] if uniform else files)]
        dataset = pads.dataset([str(f) for f in files], filesystem=self.filesystem, format="parquet",
                               schema=pa.unify_schemas(schemas, promote_options="permissive"))
        return connection.from_arrow(dataset)

    def read_all(self, asset: str, schema: pa.Schema, columns: list[str] | None = None) -> pa.Table:
        """Every partition of `asset` as one table (empty, with `schema`, when nothing is written yet)."""
        files = self.partition_files(asset)
        if not files:
            empty = schema.empty_table()
            return empty.select(columns) if columns else empty
        with duckdb.connect() as connection:
            relation = self.relation(connection, files)
            if columns:
                relation = relation.select(*(duckdb.ColumnExpression(c) for c in columns))
            return relation.to_arrow_table()


def dictionary_columns(schema: pa.Schema) -> bool | list[str]:
    """The columns worth a dictionary: all (True) but the unsigned integers, which in tkg are
    hashes (of rows, keys and pairs), every value its own, so a dictionary only costs time. All
    of them when a column is nested: Parquet names its leaves (`aliases.list.element`), not it."""
    hashes = {field.name for field in schema if pa.types.is_unsigned_integer(field.type)}
    if not hashes or any(pa.types.is_nested(field.type) for field in schema):
        return True
    return [name for name in schema.names if name not in hashes]


def _write_parquet(data: pa.Table | pa.RecordBatchReader, where: str, filesystem: pafs.FileSystem | None) -> None:
    with pq.ParquetWriter(where, data.schema, filesystem=filesystem, compression="zstd",
                          use_dictionary=dictionary_columns(data.schema)) as writer:
        if isinstance(data, pa.Table):
            writer.write_table(data)
            return
        for batch in data:
            writer.write_batch(batch)


def spilling_connection(temporary_folder: Path, memory_limit: str, disk_limit: str,
                        threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection for the global steps' set work: it stays under
    `memory_limit` by spilling to `temporary_folder` (sorts, joins and aggregates larger than
    memory run out of core), at most `disk_limit` of it, and keeps rows in the order queries
    ask for; `threads`, unset, is one per core."""
    temporary_folder.mkdir(parents=True, exist_ok=True)
    connection = duckdb.connect(config={"memory_limit": memory_limit, "temp_directory": str(temporary_folder),
                                        "max_temp_directory_size": disk_limit, "preserve_insertion_order": True,
                                        **({"threads": threads} if threads else {})})
    # the limit as given, for a lowered one to be set back exactly (tkg.core.machine.room_for_duckdb)
    connection.execute("SET VARIABLE tkg_memory_limit = $limit", {"limit": memory_limit})
    return connection


def _object(uri: str) -> tuple[pafs.FileSystem, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an object URI; give s3://bucket/key")
    return open_location(uri)


def upload(local_file: Path, uri: str) -> None:
    """Copy a local file to an object (s3://bucket/key), replacing it: readers of the object see
    the old file or the new one."""
    filesystem, key = _object(uri)
    pafs.copy_files(str(local_file), key, destination_filesystem=filesystem)


def download(uri: str, local_file: Path) -> bool:
    """Copy an object over a local file, atomically; False (and the file untouched) when the
    object does not exist."""
    filesystem, key = _object(uri)
    if filesystem.get_file_info(key).type != pafs.FileType.File:
        return False
    local_file.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(local_file)
    try:
        pafs.copy_files(key, str(temporary), source_filesystem=filesystem)
        os.replace(temporary, local_file)
    finally:
        temporary.unlink(missing_ok=True)
    return True
