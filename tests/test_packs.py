"""Packs (tkg.store.packs): the rows a global step reads of every partition, from a few files
instead of one per partition, always the partition files' rows as they are now."""

from __future__ import annotations

import os
import time
from datetime import date

import duckdb
import pyarrow as pa
import pytest

from tkg.core.versions import Stamp, stamped
from tkg.store import manifest, packs
from tkg.store.packs import PACKS, packed
from tkg.store.parquet import ParquetStore

ASSET = "temporal_events"  # an asset with a heavy column: its packs leave the embedding out
SCHEMA = pa.schema([("event_id", pa.string()), ("company", pa.string()), ("quarter", pa.date32()),
                    ("created_at", pa.timestamp("us", tz="UTC")), ("score", pa.float32()), ("tags", pa.list_(pa.string())),
                    ("embedding", pa.list_(pa.float32()))])


def _write(store: ParquetStore, company: str, quarter: str, events: int, tag: str = "a") -> str:
    relative = f"{ASSET}/company={company}/quarter={quarter}/{ASSET}.parquet"
    rows = [{"event_id": f"{company}-{quarter}-{n}-{tag}", "company": company, "quarter": date.fromisoformat(quarter),
             "created_at": None if n % 3 == 0 else pa.scalar(1_600_000_000_000_000 + n, pa.timestamp("us", tz="UTC")).as_py(),
             "score": n / 7, "tags": [tag, str(n)] if n % 2 else [], "embedding": [float(n), 1.0]} for n in range(events)]
    store.write(store.absolute(relative), stamped(pa.Table.from_pylist(rows, schema=SCHEMA), Stamp(ASSET, "code", {"n": tag})))
    return relative


def _read(store: ParquetStore) -> tuple[list, list]:
    """What packed() gives for every partition now, and what the files themselves hold (the
    light columns), each as sorted rows and column types."""
    manifest.stamped_files(store, [ASSET])  # what a run of the global steps lists first
    files = store.partition_files(ASSET)
    with duckdb.connect() as connection:
        got = packed(store, connection, files)
        light = [column for column in SCHEMA.names if column != "embedding"]
        want = connection.read_parquet([str(path) for path in files]).select(*light)
        assert got.columns == light and got.types == want.types
        return sorted(got.fetchall(), key=repr), sorted(want.fetchall(), key=repr)


def _packs(store: ParquetStore) -> list[str]:
    folder = store.parquet_root / PACKS / ASSET
    return sorted(path.name for path in folder.glob("*.index.parquet")) if folder.is_dir() else []


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(packs, "MIN_FILES", 3)
    store = ParquetStore(tmp_path)
    for company in ("AAA", "BBB"):
        for quarter in ("2019-01-01", "2019-04-01"):
            _write(store, company, quarter, 5)
    return store


def test_packed_rows_are_the_files_rows_through_rewrites_additions_and_removals(store):
    got, want = _read(store)
    assert got == want and len(got) == 20
    assert len(_packs(store)) == 1  # four files, past MIN_FILES: packed on the first read

    # one partition rewritten (other rows), one removed, two added (under MIN_FILES: read from their files)
    time.sleep(0.01)
    _write(store, "AAA", "2019-01-01", 4, tag="b")
    store.delete(store.absolute(f"{ASSET}/company=BBB/quarter=2019-04-01/{ASSET}.parquet"))
    _write(store, "CCC", "2019-01-01", 2)
    got, want = _read(store)
    assert got == want and len(got) == 16 and any(row[0].endswith("-b") for row in got)
    assert len(_packs(store)) == 1

    # a quarter's worth of new partitions is packed before it is read; the rows stay the files'
    for company in ("DDD", "EEE", "FFF"):
        _write(store, company, "2019-07-01", 3)
    got, want = _read(store)
    assert got == want and len(got) == 25
    assert len(_packs(store)) == 2


def test_packs_fold_when_too_many_or_mostly_stale_and_the_folded_go_after_a_grace(store, monkeypatch):
    monkeypatch.setattr(packs, "MAX_PACKS", 2)
    _read(store)
    for quarter in ("2019-07-01", "2019-10-01"):
        for company in ("AAA", "BBB", "CCC"):
            _write(store, company, quarter, 2)
        _read(store)
    assert len(_packs(store)) == 3
    for company in ("AAA", "BBB", "CCC"):
        _write(store, company, "2020-01-01", 2)
    got, want = _read(store)  # a fourth pack would pass MAX_PACKS: everything is folded into one
    assert got == want and len(got) == 38
    assert len(_packs(store)) == 4  # the three folded ones stay for the steps still reading them
    monkeypatch.setattr(packs, "GRACE_SECONDS", 0)
    got, want = _read(store)
    assert got == want and len(_packs(store)) == 1

    # most of the rows rewritten since: folded again
    time.sleep(0.01)
    for path in store.partition_files(ASSET)[:-2]:
        company, quarter = (part.split("=")[1] for part in str(path).split("/")[-3:-1])
        _write(store, company, quarter, 1, tag="c")
    got, want = _read(store)
    assert got == want and len(_packs(store)) == 2
    got, want = _read(store)
    assert got == want and len(_packs(store)) == 1


def test_a_damaged_or_foreign_pack_is_not_used(store):
    _read(store)
    (index,) = (store.parquet_root / PACKS / ASSET).glob("*.index.parquet")
    data = index.with_name(index.name.replace(".index", ""))
    with open(data, "r+b") as handle:  # cut short, as by a full disk
        handle.truncate(os.path.getsize(data) // 2)
    got, want = _read(store)
    assert got == want and len(_packs(store)) == 2  # the damaged one is passed over, the files packed again

    # files of another schema (another tkg wrote them): the packs of the old one serve none of
    # them, and while the store holds both schemas the files are read as they are
    for number, path in enumerate(store.partition_files(ASSET)):
        if number == 2:
            manifest.stamped_files(store, [ASSET])
            with duckdb.connect() as connection:
                rows = packed(store, connection, store.partition_files(ASSET))
                assert set(rows.columns) == set(SCHEMA.names) - {"embedding"} and len(rows.fetchall()) == 12
            assert len(_packs(store)) == 2
        company, quarter = (part.split("=")[1] for part in str(path).split("/")[-3:-1])
        table = pa.table({"event_id": [f"{company}{quarter}"], "company": [company], "embedding": [[0.5]]})
        store.write(path, stamped(table, Stamp(ASSET, "code-2", {})))
    manifest.stamped_files(store, [ASSET])
    with duckdb.connect() as connection:
        rows = packed(store, connection, store.partition_files(ASSET))
        assert rows.columns == ["event_id", "company"]
        assert sorted(rows.fetchall()) == sorted((f"{c}{q}", c) for c in ("AAA", "BBB") for q in ("2019-01-01", "2019-04-01"))


def test_the_heavy_columns_are_never_read_through_a_pack(store):
    manifest.stamped_files(store, [ASSET])
    with duckdb.connect() as connection:
        rows = packed(store, connection, store.partition_files(ASSET))
        with pytest.raises(duckdb.BinderException, match="embedding"):
            rows.select("embedding").fetchall()


def test_a_pack_that_cannot_be_written_leaves_the_rows_read_from_the_files(store, caplog):
    (store.parquet_root / PACKS).mkdir()
    (store.parquet_root / PACKS / ASSET).write_text("not a folder")
    got, want = _read(store)
    assert got == want and len(got) == 20
    assert "could not write a pack of temporal_events" in caplog.text
