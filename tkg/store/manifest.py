"""What the store holds, without opening every file: manifests of the files' stamps.

Every Parquet file carries its stamp (tkg.core.versions): that stays the truth. Reading them
all costs one open per file, 112,000 files at 5M events. A manifest keeps each file's stamp
beside its size and modification time, one per top folder of the store (a stage's folder:
`_manifest/<folder>.parquet` under the store's root), so a reader of a few folders (a shard
step reads only the global steps') parses and rewrites only their stamps, never the
partitions'. A reader lists the folders it asks about (one listing each, no file opened), takes
the stamps of unchanged files from their manifests and reads the footers of new or changed
files only, then rewrites the manifest of a folder it learned something about.

Writers never touch a manifest, so builds running side by side never race on one: a file
written after its manifest was is simply read again, and two readers that both rewrite it
each write a true snapshot. A file is "unchanged" when its size and modification time are;
a file rewritten within the same clock tick to exactly the same size would be missed, which
the store's atomic replace (a new file, a new inode, a new time) makes practically impossible
on local disks; object stores give one-second times, so there size and time both must match.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from tkg.core.versions import Stamp
from tkg.store.parquet import ParquetStore, mtime_ns

MANIFESTS = "_manifest"
LEGACY_MANIFEST = f"{MANIFESTS}/stamps.parquet"  # an older tkg's one manifest of every folder: removed when seen
_SCHEMA = pa.schema([("path", pa.string()), ("size", pa.int64()), ("mtime_ns", pa.int64()), ("stamp", pa.string())])


@dataclass(frozen=True)
class Listed:
    """A file of the store with its stamp."""

    path: str  # relative to the store's root, '/'-separated
    stamp: Stamp | None


@dataclass(frozen=True)
class _Entry:
    """What the manifest knows of a file: its size and time, its stamp, and the stamp's text as
    the manifest holds it (kept, so that rewriting the manifest serialises no stamp again)."""

    size: int
    mtime_ns: int
    stamp: Stamp | None
    text: str | None


def manifest_of(folder: str) -> str:
    """The manifest that holds the stamps of the files under `folder` (its top folder's)."""
    return f"{MANIFESTS}/{folder.strip('/').split('/')[0]}.parquet"


def stamped_files(store: ParquetStore, folders: list[str], wanted: Callable[[str], bool] = lambda path: True) -> list[Listed]:
    """Every Parquet file under `folders` (relative to the store's root) whose path is `wanted`,
    with its stamp, sorted by path. Footers are read only for files a manifest does not know
    in their current size and time; a manifest is rewritten when it learned something."""
    found: dict[str, dict[str, tuple[int, int]]] = {}  # by manifest: each file's size and time
    listed: dict[str, tuple[str, ...]] = {}  # by manifest: the folders listed
    for folder in folders:
        manifest = manifest_of(folder)
        files = found.setdefault(manifest, {})
        listed[manifest] = (*listed.get(manifest, ()), folder.rstrip("/") + "/")
        for relative, identity in store.folder_files(folder).items():
            name = relative.rsplit("/", 1)[-1]
            if name.endswith(".parquet") and not name.startswith(".") and wanted(relative):
                files[relative] = identity
    stamps: dict[str, Stamp | None] = {}
    for manifest, files in found.items():
        known = _read_manifest(store, manifest)
        learned = False
        for path, (size, mtime) in files.items():
            entry = known.get(path)
            if entry is not None and entry.size == size and entry.mtime_ns == mtime:
                stamps[path] = entry.stamp
            else:
                stamps[path] = store.stamp(store.absolute(path))
                known[path] = _Entry(size, mtime, stamps[path], stamps[path].to_json() if stamps[path] is not None else None)
                learned = True
        gone = [path for path in known if path.startswith(listed[manifest]) and path not in files]
        for path in gone:
            del known[path]
        if learned or gone:
            _write_manifest(store, manifest, known)
    return [Listed(path, stamps[path]) for path in sorted(stamps)]


def scan(store: ParquetStore, connection: Any, files: list[PurePath]) -> Any:
    """`store.relation` over `files`, told the files are uniform when the manifests know every
    one of them written with the same columns (their stamps' schema fingerprints), as every
    partition of a stage written by one tkg is."""
    schemas = schema_fingerprints(store, files)
    return store.relation(connection, files, uniform=len(schemas) == 1 and None not in schemas)


def schema_fingerprints(store: ParquetStore, files: list[PurePath]) -> set[str | None]:
    """The schema fingerprints of the files' stamps as the manifests know them (None for a
    file they do not know, or whose stamp has none)."""
    manifests: dict[str, dict[str, _Entry]] = {}
    schemas: set[str | None] = set()
    for path in files:
        relative = store.relative(path)
        manifest = manifest_of(relative)
        if manifest not in manifests:
            manifests[manifest] = _read_manifest(store, manifest)
        entry = manifests[manifest].get(relative)
        schemas.add(entry.stamp.schema or None if entry is not None and entry.stamp is not None else None)
    return schemas


# The manifests this process read last, by their files' paths, with their sizes and times: a
# folder's stamps are parsed once, not at every scan. When a manifest changed (a step wrote
# files, a reader learned them), only the stamps whose text changed are parsed again. Only one
# store's manifests are held: a process that turns to another store forgets the last one's.
_LAST_READ: dict[str, tuple[tuple[int, int], dict[str, _Entry]]] = {}


def _read_manifest(store: ParquetStore, manifest: str) -> dict[str, _Entry]:
    path = store.absolute(manifest)
    info = store.filesystem.get_file_info(str(path))
    if info.type != pafs.FileType.File:
        return {}
    identity = (int(info.size or 0), mtime_ns(info))
    cached = _LAST_READ.get(str(path))
    if cached is not None and cached[0] == identity:
        return dict(cached[1])
    try:
        table = store.read(path)
    except (FileNotFoundError, OSError, pa.ArrowInvalid):  # unreadable: rebuilt from the files
        return {}
    if table.schema.names != _SCHEMA.names:
        return {}
    before = cached[1] if cached is not None else {}
    columns = table.to_pydict()
    known = {}
    for name, size, mtime, text in zip(columns["path"], columns["size"], columns["mtime_ns"], columns["stamp"]):
        previous = before.get(name)
        stamp = previous.stamp if previous is not None and previous.text == text else (Stamp.from_json(text) if text else None)
        known[name] = _Entry(size, mtime, stamp, text)
    _remember(str(path), identity, known)
    return dict(known)


def _write_manifest(store: ParquetStore, manifest: str, known: dict[str, _Entry]) -> None:
    """Write `known` as `manifest`, and remember it as this process's last read of it (an older
    tkg's single manifest, which no reader would look at again, is removed)."""
    entries = dict(sorted(known.items()))
    table = pa.table({
        "path": list(entries), "size": [entry.size for entry in entries.values()],
        "mtime_ns": [entry.mtime_ns for entry in entries.values()], "stamp": [entry.text for entry in entries.values()],
    }, schema=_SCHEMA)
    path = store.write(store.absolute(manifest), table)
    info = store.filesystem.get_file_info(str(path))
    _remember(str(path), (int(info.size or 0), mtime_ns(info)), entries)
    if store.is_file(store.absolute(LEGACY_MANIFEST)):
        store.delete(store.absolute(LEGACY_MANIFEST))


def _remember(path: str, identity: tuple[int, int], entries: dict[str, _Entry]) -> None:
    """Hold `entries` as the last read of the manifest at `path`, and forget the manifests of
    any other store."""
    folder = path.rsplit("/", 1)[0]
    for other in [held for held in _LAST_READ if held.rsplit("/", 1)[0] != folder]:
        del _LAST_READ[other]
    _LAST_READ[path] = (identity, entries)
