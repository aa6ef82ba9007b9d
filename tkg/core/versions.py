"""Data versions: what each Parquet file was built from, stored inside the file.

Every file tkg writes carries, in its Parquet schema metadata, a *stamp*: the stage's code
version, the versions of the inputs it was built from, and its own version, a hash of those.
A stage's version is therefore known before it runs (from its code version and its inputs'
versions), which is what makes builds incremental: a partition is rebuilt from the first
stage whose expected version differs from the stamped one. The stamp travels with the data
(one atomic file), so a killed build can never leave a file that claims to be newer than it is.

These versions are also the Dagster data versions of the materialisations, so the UI shows
the same staleness as `tkg build` and `tkg status`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

_KEY = b"tkg.stamp"


def version_of(stage: str, code_version: str, inputs: dict[str, str]) -> str:
    """A stage output's version: a hash of what produced it."""
    payload = json.dumps([stage, code_version, sorted(inputs.items())], separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def combine(versions: dict[str, str]) -> str:
    """One version for many (e.g. every partition of an asset, for a global step's input)."""
    payload = "\n".join(f"{key}={value}" for key, value in sorted(versions.items()))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Stamp:
    """What a file was built from. `missing` counts the items a stage could not produce
    (only ever set when a partial result was asked for); such a file is stale until rebuilt.
    `parts`, for a global step that splits its tables by shard, is a fingerprint of each
    shard's rows: what a shard step reads of it, so a shard whose rows did not change is not
    rebuilt when another shard's did (it is not part of the version)."""

    stage: str
    code_version: str
    inputs: dict[str, str]
    missing: dict[str, int] = field(default_factory=dict)
    parts: dict[str, str] = field(default_factory=dict)
    # A fingerprint of the columns the file was written with (set by `stamped`): files of one
    # schema can be scanned without matching every file's columns by name.
    schema: str = field(default="", compare=False)

    @cached_property  # read for every file of the store at each step's start: hashed once per stamp
    def version(self) -> str:
        return version_of(self.stage, self.code_version, self.inputs)

    @property
    def complete(self) -> bool:
        return not any(self.missing.values())

    def to_json(self) -> str:
        data = {"stage": self.stage, "code_version": self.code_version, "inputs": self.inputs,
                "missing": self.missing, "version": self.version}
        if self.parts:
            data["parts"] = self.parts
        if self.schema:
            data["schema"] = self.schema
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Stamp:
        data = json.loads(text)
        stamp = cls(data["stage"], data["code_version"], dict(data["inputs"]), dict(data.get("missing") or {}),
                    dict(data.get("parts") or {}), data.get("schema") or "")
        if isinstance(data.get("version"), str):  # as `to_json` wrote it: not hashed again for every file at every start
            stamp.__dict__["version"] = data["version"]
        return stamp


def stamped(table: pa.Table, stamp: Stamp) -> pa.Table:
    """`table` with `stamp` (and the fingerprint of its columns) in its schema metadata (kept by Parquet)."""
    metadata = dict(table.schema.metadata or {})
    columns = hashlib.sha256(table.schema.remove_metadata().to_string().encode()).hexdigest()[:16]
    metadata[_KEY] = replace(stamp, schema=columns).to_json().encode()
    return table.replace_schema_metadata(metadata)


def stamp_of_schema(schema: pa.Schema) -> Stamp | None:
    raw = (schema.metadata or {}).get(_KEY)
    return Stamp.from_json(raw) if raw else None


def read_stamp(path: Path) -> Stamp | None:
    """The stamp of a Parquet file, or None when the file is absent or was written without one.

    Planning a build reads the stamps of every file (a thousand for the corpus), so the stamp
    is first looked up in the raw footer, where Parquet keeps key-value metadata as Thrift
    strings; anything unexpected falls back to a full schema read."""
    try:
        with open(path, "rb") as handle:
            return read_stamp_from(handle)
    except FileNotFoundError:
        return None


def read_stamp_from(handle) -> Stamp | None:
    """The stamp of the Parquet file open in `handle` (seekable, binary: a local file or a
    pyarrow input stream from an object store)."""
    footer = _footer(handle)
    if footer is not None:
        stamp = _stamp_in_footer(footer)
        if stamp is not None:
            return stamp
    handle.seek(0)
    return stamp_of_schema(pq.read_schema(handle))


def _footer(handle) -> bytes | None:
    handle.seek(0, 2)
    size = handle.tell()
    if size < 12:
        return None
    handle.seek(size - 8)
    tail = handle.read(8)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or length <= 0 or length > size - 12:
        return None
    handle.seek(size - 8 - length)
    return handle.read(length)


def _stamp_in_footer(footer: bytes) -> Stamp | None:
    """The stamp after its key in a Thrift compact KeyValue: a field header, a varint length, the value."""
    at = footer.find(_KEY)
    if at < 0:
        return None
    position = at + len(_KEY) + 1  # skip the value's field header
    length = shift = 0
    while position < len(footer):
        byte = footer[position]
        position += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    try:
        return Stamp.from_json(footer[position:position + length])
    except (ValueError, KeyError, TypeError):
        return None
