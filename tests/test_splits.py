"""Split tables stored as chains of segments (tkg.store.splits): whatever history wrote them,
a shard reads the rows of the latest version, in key order, with the fingerprint a whole write
of those rows gives."""

from __future__ import annotations

import random

import duckdb
import pyarrow as pa
import pytest

from tkg.store.parquet import ParquetStore
from tkg.store.splits import (DELTA_SHARE, MAX_SEGMENTS, Replaced, Split, SplitRows, read_chains, shard_changes_since,
                              shard_rows, write_splits)

SHARDS = ["00", "01", "02"]
SCHEMA = pa.schema([("event_id", pa.string()), ("dynamic", pa.bool_()), ("group", pa.int8()),
                    ("score", pa.float32()), ("embedding", pa.list_(pa.float32()))])
KEY = ("event_id", "dynamic")


def _write(store: ParquetStore, version: str, rows: list[dict], previous: str | None):
    with duckdb.connect() as connection:
        table = pa.Table.from_pylist(rows, schema=SCHEMA.append(pa.field("shard", pa.string())))
        split = Split("facts", SCHEMA, KEY, connection.from_arrow(table))
        return write_splits(store, connection, "step", version, [split], previous, SHARDS)


def _read(store: ParquetStore, version: str) -> dict[str, list[tuple]]:
    with duckdb.connect() as connection:
        found = {}
        for shard in SHARDS:
            rows = shard_rows(store, connection, "step", version, "facts", shard, SCHEMA.names)
            found[shard] = [] if rows is None else sorted(rows.fetchall(), key=lambda row: (row[0], row[1]))
        return found


def _expected(rows: list[dict]) -> dict[str, list[tuple]]:
    return {shard: sorted((tuple(row[name] for name in SCHEMA.names) for row in rows if row["shard"] == shard),
                          key=lambda row: (row[0], row[1])) for shard in SHARDS}


def _row(random_: random.Random, number: int) -> dict:
    return {"event_id": f"e{number:04d}", "dynamic": random_.random() < 0.5, "group": random_.randrange(5),
            "score": float(random_.randrange(1000)) / 8, "embedding": [float(random_.randrange(9)) for _ in range(4)],
            "shard": random_.choice(SHARDS)}


def test_a_chain_of_increments_reads_and_fingerprints_as_one_whole_write(tmp_path):
    """Thirty states, each a few rows added, removed, changed in place or moved to another
    shard: each written as a delta on the one before (until the chain is folded), read back
    in key order exactly as written whole, with the same fingerprints."""
    random_ = random.Random(7)
    rows = [_row(random_, number) for number in range(400)]
    store, whole = ParquetStore(tmp_path / "chain"), ParquetStore(tmp_path / "whole")
    previous, kinds, numbers = None, [], iter(range(400, 10**6))
    for state in range(30):
        if state:
            for _ in range(random_.randrange(10, 60)):
                action = random_.random()
                if action < 0.4:
                    rows.append(_row(random_, next(numbers)))
                elif action < 0.6 and rows:
                    rows.pop(random_.randrange(len(rows)))
                elif action < 0.8 and rows:
                    rows[random_.randrange(len(rows))]["score"] += 1.0
                elif rows:
                    rows[random_.randrange(len(rows))]["shard"] = random_.choice(SHARDS)
        version = f"{state:02d}"
        before = len(rows) if previous is None else before_rows
        written = _write(store, version, rows, previous)
        reference = _write(whole, version, rows, None)
        assert not reference.delta
        assert _read(store, version) == _expected(rows) == _read(whole, version)
        assert written.parts == reference.parts
        chain = read_chains(store, "step", version)["facts"]
        assert written.keep == set(chain.segments) and chain.segments[-1] == version
        assert len(chain.segments) <= MAX_SEGMENTS and sum(chain.delta_rows) <= DELTA_SHARE * before
        kinds.append(written.delta)
        previous, before_rows = version, len(rows)
    assert kinds[0] is False and sum(kinds) >= 20  # mostly deltas
    assert kinds.count(False) > len(kinds) // MAX_SEGMENTS + 1  # folded back into whole versions, not only when long


def test_the_rows_changed_since_a_version_the_chain_stacks_are_read_from_the_later_segments(tmp_path):
    """Against any earlier version its chain stacks, a version gives the rows written since
    and the rows deleted since: every row it holds that the earlier one did not, and the
    reverse (a row that left a shard and came back is in both, the same row). Against a version
    it does not stack (the chain was folded in between), it cannot tell."""
    random_ = random.Random(11)
    rows = [_row(random_, number) for number in range(300)]
    store, states, previous, columns = ParquetStore(tmp_path), {}, None, ["event_id", "dynamic", "group", "score"]
    numbers = iter(range(300, 10**6))
    for state in range(16):
        for _ in range(random_.randrange(5, 40) if state else 0):
            action = random_.random()
            if action < 0.4:
                rows.append(_row(random_, next(numbers)))
            elif action < 0.6:
                rows.pop(random_.randrange(len(rows)))
            elif action < 0.8:
                rows[random_.randrange(len(rows))]["score"] += 1.0
            else:
                rows[random_.randrange(len(rows))]["shard"] = random_.choice(SHARDS)
        version = f"{state:02d}"
        _write(store, version, rows, previous)
        states[version] = {shard: {tuple(row[name] for name in columns) for row in rows if row["shard"] == shard}
                           for shard in SHARDS}
        previous = version
    told = untold = 0
    with duckdb.connect() as connection:
        for version in states:
            segments = read_chains(store, "step", version)["facts"].segments
            for since in states:
                if since > version:
                    continue
                for shard in SHARDS:
                    changes = shard_changes_since(store, connection, "step", version, "facts", shard, since, columns)
                    if since not in segments:
                        assert changes is None
                        untold += 1
                        continue
                    added, gone = ({tuple(row) for row in rows.fetchall()} if rows is not None else set() for rows in changes)
                    now, then = states[version][shard], states[since][shard]
                    assert added <= now and gone <= then
                    assert added - gone == now - then and gone - added == then - now
                    told += 1
    assert told > 3 * len(states) * len(SHARDS) and untold > 0


def test_a_delta_writes_only_what_changed(tmp_path):
    random_ = random.Random(3)
    rows = [_row(random_, number) for number in range(1000)]
    store = ParquetStore(tmp_path)
    assert _write(store, "a", rows, None).rows == 1000
    rows[5]["score"] += 1.0  # changed: its old row deleted, the new one written
    del rows[9]  # deleted
    rows.append(_row(random_, 5000))  # added
    written = _write(store, "b", rows, "a")
    assert written.delta and written.rows == 4 and written.keep == {"a", "b"}
    assert _read(store, "b") == _expected(rows)
    assert _read(store, "a") != _read(store, "b")  # the version it stands on is as it was


def _write_replacing(store: ParquetStore, version: str, rows: list[dict], changed: set[str], previous: str | None):
    """Write the rows of the events in `changed` alone, as replacing theirs in `previous`."""
    with duckdb.connect() as connection:
        given = pa.Table.from_pylist([row for row in rows if row["event_id"] in changed],
                                     schema=SCHEMA.append(pa.field("shard", pa.string())))
        connection.register("changed_events", pa.table({"event_id": pa.array(sorted(changed), pa.string())}))
        split = Split("facts", SCHEMA, KEY, connection.from_arrow(given), replaces=Replaced("event_id", "changed_events"))
        return write_splits(store, connection, "step", version, [split], previous, SHARDS)


def test_rows_given_for_the_groups_that_changed_read_and_fingerprint_as_a_whole_write(tmp_path):
    """Twenty-four states, each written from the rows of the events that changed alone (added,
    removed, changed in place, moved to another shard, or given again unchanged): read back
    exactly as every row written whole, with the same fingerprints; big changes fold the
    chain into a whole version built from the last version's other rows."""
    random_ = random.Random(11)
    rows = [_row(random_, number) for number in range(300)]
    store, whole = ParquetStore(tmp_path / "chain"), ParquetStore(tmp_path / "whole")
    _write(store, "00", rows, None)
    previous, kinds, numbers = "00", [], iter(range(300, 10**6))
    for state in range(1, 25):
        changed = set()
        for _ in range(random_.randrange(5, 30) if state % 6 else 200):
            action = random_.random()
            if action < 0.3:
                rows.append(_row(random_, next(numbers)))
                changed.add(rows[-1]["event_id"])
            elif action < 0.45 and rows:
                changed.add(rows.pop(random_.randrange(len(rows)))["event_id"])
            elif rows:
                row = rows[random_.randrange(len(rows))]
                if action < 0.65:
                    row["score"] += 1.0
                elif action < 0.8:
                    row["shard"] = random_.choice(SHARDS)
                elif action < 0.9:
                    row["dynamic"] = not row["dynamic"]  # another key in the same group
                changed.add(row["event_id"])  # else given again as it was
        version = f"{state:02d}"
        written = _write_replacing(store, version, rows, changed, previous)
        reference = _write(whole, version, rows, None)
        assert _read(store, version) == _expected(rows) == _read(whole, version)
        assert written.parts == reference.parts
        kinds.append(written.delta)
        previous = version
    assert 0 < sum(kinds) < len(kinds)  # deltas, and folds
    # the last version written again from nothing changed: its own rows, read before its files go
    again = _write_replacing(store, previous, rows, set(), previous)
    assert not again.delta and _read(store, previous) == _expected(rows) and again.parts == reference.parts


def test_an_earlier_version_that_comes_back_is_written_from_rows_read_before_its_files_go(tmp_path):
    """A quarter added and then taken away again: the inputs, and so the version, are the first
    one's again, which the last version stacks as its base. Its rows are written whole over
    that base's files, from the last version's rows read before those files are removed."""
    random_ = random.Random(3)
    rows = [_row(random_, number) for number in range(200)]
    store = ParquetStore(tmp_path)
    _write(store, "a", rows, None)
    added = [_row(random_, number) for number in range(900, 920)]
    assert _write_replacing(store, "b", rows + added, {row["event_id"] for row in added}, "a").delta
    assert read_chains(store, "step", "b")["facts"].segments == ("a", "b")
    again = _write_replacing(store, "a", rows, {row["event_id"] for row in added}, "b")
    assert not again.delta and again.keep == {"a"}
    assert _read(store, "a") == _expected(rows)
    assert again.parts == _write(ParquetStore(tmp_path / "whole"), "a", rows, None).parts


def test_rows_that_replace_groups_need_the_group_in_their_key_and_a_last_version(tmp_path):
    with pytest.raises(ValueError, match="'group', which is not in its key"):
        Split("facts", SCHEMA, KEY, None, replaces=Replaced("group", "groups"))
    with pytest.raises(ValueError, match="given whole, not through rows_for"):  # kept rows could not be read whole
        Split("facts", SCHEMA, KEY, None, rows_for=lambda wanted: None, replaces=Replaced("event_id", "groups"))
    with pytest.raises(ValueError, match="replace groups of a last version, and there is none"):
        _write_replacing(ParquetStore(tmp_path), "a", [], set(), None)


def test_what_cannot_be_a_delta_is_written_whole(tmp_path):
    """The same version again, a previous version whose segments are gone, and a key that
    names two rows of a shard are each written whole, and read as written."""
    random_ = random.Random(5)
    rows = [_row(random_, number) for number in range(200)]
    store = ParquetStore(tmp_path)
    _write(store, "a", rows, None)
    rows.append(_row(random_, 900))
    assert _write(store, "b", rows, "a").delta
    again = _write(store, "b", rows, "b")
    assert not again.delta and again.keep == {"b"} and _read(store, "b") == _expected(rows)

    rows.append(_row(random_, 901))
    assert _write(store, "c", rows, "b").delta
    store.delete_folder(store.parquet_root / "step" / "v=b")
    rows.append(_row(random_, 902))
    assert not _write(store, "d", rows, "c").delta
    assert _read(store, "d") == _expected(rows)

    twin = dict(rows[0], score=rows[0]["score"] + 1)  # the same key in the same shard, twice
    doubled = rows + [twin]
    written = _write(store, "e", doubled, "d")
    assert not written.delta
    assert sorted(_read(store, "e")[twin["shard"]]) == sorted(_expected(doubled)[twin["shard"]])


def test_a_table_with_heavy_columns_is_hashed_by_what_stands_for_them_and_read_where_it_changed(tmp_path):
    """A split given without its heavy column, hashing a light one that stands for it (a source
    version for the vector), is asked through `rows_for` for every row's key when written whole,
    and for the changed rows' keys alone in a delta; a heavy column that changed without its
    source is not seen (by design: the source stands for it)."""
    random_ = random.Random(11)
    rows = [dict(_row(random_, number), source="s1") for number in range(300)]
    store = ParquetStore(tmp_path)
    asked = []

    def write(version: str, previous: str | None):
        with duckdb.connect() as connection:
            connection.register("given", pa.Table.from_pylist(rows))

            def rows_for(wanted: str):
                asked.append(sorted(connection.table(wanted).select("shard", "event_id", "dynamic").fetchall()))
                return connection.sql(f"SELECT * FROM given SEMI JOIN {wanted} USING (shard, event_id, dynamic)")

            split = SplitRows(connection.sql("SELECT * EXCLUDE (embedding) FROM given"),
                              hashed=("event_id", "dynamic", "group", "score", "source"),
                              rows_for=rows_for).split("facts", SCHEMA, KEY)
            return write_splits(store, connection, "step", version, [split], previous, SHARDS)

    write("a", None)
    assert asked == [sorted((row["shard"], row["event_id"], row["dynamic"]) for row in rows)]  # whole: every row, once
    assert sorted(_read(store, "a")[rows[0]["shard"]]) == sorted(_expected(rows)[rows[0]["shard"]])
    asked.clear()
    rows[3]["embedding"], rows[3]["source"] = [9.0] * 4, "s2"  # its source changed: rewritten
    rows[4]["embedding"] = [9.0] * 4  # the same source: taken as unchanged
    rows.append(dict(_row(random_, 999), source="s1"))
    assert write("b", "a").delta
    assert asked == [sorted((row["shard"], row["event_id"], row["dynamic"]) for row in (rows[3], rows[-1]))]
    stored = {row[0]: row for shard in _read(store, "b").values() for row in shard}
    assert stored[rows[3]["event_id"]][-1] == [9.0] * 4 and stored[rows[4]["event_id"]][-1] != [9.0] * 4


def test_hash_columns_are_written_without_a_dictionary_and_the_others_with_one(tmp_path):
    """Unsigned integers are hashes in tkg, every value its own: a dictionary for them only costs
    time. Text keeps its dictionary, and so does every column of a table with a nested one
    (Parquet names a nested column's leaves, which a list of column names would miss)."""
    import pyarrow.parquet as pq

    store = ParquetStore(tmp_path)
    flat = pa.table({"name": ["a", "b"] * 500, "row_hash": pa.array(range(1000), pa.uint64())})
    nested = flat.append_column("aliases", pa.array([["x", "y"]] * 1000, pa.list_(pa.string())))
    for name, table in (("flat", flat), ("nested", nested)):
        for as_stream in (False, True):
            path = store.write(store.global_path(f"{name}_{as_stream}"),
                               pa.RecordBatchReader.from_batches(table.schema, table.to_batches()) if as_stream else table)
            group = pq.ParquetFile(str(path)).metadata.row_group(0)
            encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}
            assert "RLE_DICTIONARY" in encodings["name"]
            assert ("RLE_DICTIONARY" in encodings["row_hash"]) == (name == "nested")
            if name == "nested":
                assert "RLE_DICTIONARY" in encodings["aliases.list.element"]
