"""candidate_selection selects again only the incoming facts whose ranks changed, and only when
every shard's changes are known to be since the ranks it last read (tkg.invalidate.stages):
anything it cannot tell makes it select every fact. The result equals a cold selection either
way (tests/test_shards.py checks that on the real corpus)."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from tkg.core import tables
from tkg.core.results import StageIncomplete, StageJob
from tkg.core.versions import Stamp, stamped
from tkg.invalidate.stages import _changed_incoming, candidate_selection
from tkg.store.parquet import ParquetStore

SHARDS = ["00", "01"]


def _ranks(store: ParquetStore, shard: str, build: str, since: str | None, events: list[str]) -> str:
    """Write a shard's candidate ranks as a run of `build` would, with the incoming events it
    changed since the version `since`; return its version."""
    stamp = Stamp("candidate_ranks", "code", {"build": build, "shard": shard})
    changes = pa.table({"since_version": [since] * (len(events) + 1), "incoming_event_id": [None, *events]},
                       schema=tables.RANK_CHANGES)
    store.write(store.shard_path("candidate_ranks", shard, "rank_changes"), stamped(changes, stamp))
    store.write(store.shard_path("candidate_ranks", shard), stamped(tables.CANDIDATE_RANKS.empty_table(), stamp))
    return stamp.version


def _selection_read(store: ParquetStore, read: dict[str, str]) -> dict[str, object]:
    """A last selection's output files (what StageJob.previous holds) that read `read`."""
    path = store.global_path("candidate_selection", "ranks_read")
    store.write(path, pa.table({"shard": list(read), "version": list(read.values())}, schema=tables.SHARDS_READ))
    return {"ranks_read": path, "candidate_selection": store.global_path("candidate_selection")}


def _changed(store: ParquetStore, previous: dict, read: dict[str, str]) -> list[str] | None:
    changed = _changed_incoming(StageJob(None, {}, None, store=store, shard_keys=SHARDS, previous=previous), read)
    return None if changed is None else sorted(changed.column("incoming_event_id").to_pylist())


def test_only_the_changes_since_the_ranks_last_read_are_selected_again(tmp_path):
    store = ParquetStore(tmp_path)
    first = {shard: _ranks(store, shard, "1", None, ["a", "b"]) for shard in SHARDS}
    assert _changed(store, {}, first) is None  # no last selection: every fact
    previous = _selection_read(store, first)
    assert _changed(store, previous, first) == []  # nothing changed
    second = {"00": _ranks(store, "00", "2", first["00"], ["c", "d"]), "01": first["01"]}
    assert _changed(store, previous, second) == ["c", "d"]
    both = {"00": second["00"], "01": _ranks(store, "01", "2", first["01"], ["d", "e"])}
    assert _changed(store, previous, both) == ["c", "d", "e"]


def test_a_selection_that_cannot_tell_what_changed_selects_every_fact(tmp_path):
    store = ParquetStore(tmp_path)
    first = {shard: _ranks(store, shard, "1", None, []) for shard in SHARDS}
    previous = _selection_read(store, first)
    second = _ranks(store, "00", "2", first["00"], ["c"])
    third = _ranks(store, "00", "3", second, ["d"])  # ranks rebuilt twice since the last selection
    assert _changed(store, previous, {"00": third, "01": first["01"]}) is None
    assert _changed(store, previous, {"00": first["00"]}) is None  # another set of shards
    # the changes file is another run's than the ranks read (a run that failed between its files)
    _ranks(store, "01", "4", first["01"], ["x"])
    assert _changed(store, previous, {"00": first["00"], "01": "some other version"}) is None
    store.delete(store.shard_path("candidate_ranks", "00", "rank_changes"))
    assert _changed(store, previous, {"00": third, "01": first["01"]}) is None


def test_ranks_whose_base_another_run_named_stop_the_selection(tmp_path):
    """A shard's ranks are its base and the changes since it (tkg.invalidate.stages.stack_ranks):
    a `rank_base` of another run than the shard's `candidate_ranks` (a run that stopped between
    its files) is never read as the shard's rows; the selection stops, naming the shard."""
    store = ParquetStore(tmp_path)
    for shard in SHARDS:
        _ranks(store, shard, "1", None, [])
    other = Stamp("candidate_ranks", "code", {"build": "2", "shard": "01"})
    base = pa.table({"file": ["v=0123/candidate_ranks.parquet"], "rows": [0]}, schema=tables.SHARD_BASE)
    store.write(store.shard_path("candidate_ranks", "01", "rank_base"), stamped(base, other))
    with duckdb.connect() as connection:
        job = StageJob(None, {}, None, store=store, connection=connection, shard_keys=SHARDS)
        with pytest.raises(StageIncomplete, match="shard 01's candidate ranks are half-written"):
            candidate_selection(job)
