"""The store's manifest of stamps (tkg.store.manifest): what it answers after files change."""

from __future__ import annotations

import pyarrow as pa

from tkg.core.versions import Stamp, stamped
from tkg.store import manifest
from tkg.store.parquet import ParquetStore, listings_held


def _write(store: ParquetStore, relative: str, stamp: Stamp) -> None:
    store.write(store.absolute(relative), stamped(pa.table({"x": [1, 2]}), stamp))


def _stamps(store: ParquetStore, folders: list[str]) -> dict[str, Stamp | None]:
    return {listed.path: listed.stamp for listed in manifest.stamped_files(store, folders)}


def test_stamps_follow_the_files_through_rewrites_additions_and_removals(tmp_path):
    store = ParquetStore(tmp_path)
    first = {f"stage/shard={n:02d}/stage.parquet": Stamp("stage", "code-1", {"up": f"v{n}"}) for n in range(3)}
    for path, stamp in first.items():
        _write(store, path, stamp)
    assert {path: stamp.version for path, stamp in _stamps(store, ["stage"]).items()} == \
        {path: stamp.version for path, stamp in first.items()}
    assert store.is_file(store.absolute(manifest.manifest_of("stage")))

    # one file rewritten, one added, one removed: only those change, the others come from the manifest
    rewritten = Stamp("stage", "code-2", {"up": "v1-new"}, parts={"01": "abc"})
    _write(store, "stage/shard=01/stage.parquet", rewritten)
    added = Stamp("stage", "code-1", {"up": "v3"})
    _write(store, "stage/shard=03/stage.parquet", added)
    store.delete(store.absolute("stage/shard=02/stage.parquet"))
    now = _stamps(store, ["stage"])
    assert sorted(now) == ["stage/shard=00/stage.parquet", "stage/shard=01/stage.parquet", "stage/shard=03/stage.parquet"]
    assert now["stage/shard=00/stage.parquet"].version == first["stage/shard=00/stage.parquet"].version
    assert (now["stage/shard=01/stage.parquet"].version, now["stage/shard=01/stage.parquet"].parts) == \
        (rewritten.version, {"01": "abc"})
    assert now["stage/shard=03/stage.parquet"].version == added.version

    # what the manifest file holds is each file's stamp, read back by a process that never saw it
    manifest._LAST_READ.clear()
    on_disk = store.read(store.absolute(manifest.manifest_of("stage"))).to_pydict()
    held = {path: Stamp.from_json(text).version for path, text in zip(on_disk["path"], on_disk["stamp"])}
    assert held == {path: stamp.version for path, stamp in now.items()}
    assert _stamps(store, ["stage"]) == now


def test_a_process_holding_an_older_manifest_reads_the_new_one(tmp_path):
    """A process that read a manifest before another rewrote it sees the new stamps, not its
    own parsed copy of the old ones (only unchanged stamp texts are reused)."""
    store = ParquetStore(tmp_path)
    _write(store, "a/a.parquet", Stamp("a", "code", {}))
    _write(store, "b/x.parquet", Stamp("b", "code", {"a": "1"}))
    _write(store, "b/y.parquet", Stamp("b", "code", {"a": "1", "n": "y"}))
    manifest.stamped_files(store, ["a", "b"])
    older = dict(manifest._LAST_READ)
    _write(store, "b/y.parquet", Stamp("b", "code", {"a": "2"}))
    manifest.stamped_files(store, ["b"])  # the other process learns the new file and rewrites b's manifest
    manifest._LAST_READ.clear()
    manifest._LAST_READ.update(older)  # this process still holds its older reads
    known = manifest._read_manifest(store, manifest.manifest_of("b"))
    assert known["b/y.parquet"].stamp.inputs == {"a": "2"}
    (_, before) = older[str(store.absolute(manifest.manifest_of("b")))]
    assert known["b/x.parquet"].stamp is before["b/x.parquet"].stamp  # an unchanged stamp is not parsed again


def test_each_folder_has_its_own_manifest_and_an_older_single_one_is_removed(tmp_path):
    """Reading one folder parses and rewrites that folder's manifest alone: a shard step, which
    reads the global steps' folders, never pays for the partitions' stamps."""
    store = ParquetStore(tmp_path)
    _write(store, "parts/company=A/parts.parquet", Stamp("parts", "code", {}))
    _write(store, "glob/glob.parquet", Stamp("glob", "code", {"parts": "1"}))
    store.write(store.absolute(manifest.LEGACY_MANIFEST), pa.table({"path": ["parts/company=A/parts.parquet"]}))
    assert [listed.path for listed in manifest.stamped_files(store, ["glob"])] == ["glob/glob.parquet"]
    assert not store.is_file(store.absolute(manifest.manifest_of("parts")))
    assert not store.is_file(store.absolute(manifest.LEGACY_MANIFEST))
    manifest.stamped_files(store, ["parts", "glob"])
    parts_manifest = store.absolute(manifest.manifest_of("parts"))
    written = store.filesystem.get_file_info(str(parts_manifest)).mtime_ns
    _write(store, "glob/glob.parquet", Stamp("glob", "code", {"parts": "2"}))
    manifest._LAST_READ.clear()
    assert _stamps(store, ["parts", "glob"])["glob/glob.parquet"].inputs == {"parts": "2"}
    assert store.filesystem.get_file_info(str(parts_manifest)).mtime_ns == written  # not rewritten
    assert store.read(store.absolute(manifest.manifest_of("glob"))).column("path").to_pylist() == ["glob/glob.parquet"]
    assert len(manifest._LAST_READ) == 2  # both folders' manifests held

    other = ParquetStore(tmp_path / "other")
    _write(other, "glob/glob.parquet", Stamp("glob", "code", {}))
    manifest.stamped_files(other, ["glob"])
    assert list(manifest._LAST_READ) == [str(other.absolute(manifest.manifest_of("glob")))]  # the first store forgotten


def test_folders_held_are_listed_once_inside_and_afresh_after(tmp_path):
    """Inside `listings_held` (a run of the global steps, which writes no partition), a
    partition folder is listed once: later listings under it (file lists, identities, the
    manifests' stamps) answer from that one, and a file written meanwhile is seen once the hold
    ends. A folder not held is listed afresh each time; a hold inside another of the same store
    changes nothing."""
    store = ParquetStore(tmp_path)
    stamp = Stamp("events", "code-1", {"up": "v1"})
    _write(store, "events/company=A/quarter=2020-01-01/events.parquet", stamp)
    _write(store, "step/shard=00/step.parquet", Stamp("step", "code-1", {"events": "x"}))
    later_partition = "events/company=B/quarter=2020-01-01/events.parquet"
    with listings_held(store, ["events"]):
        assert [store.relative(path) for path in store.partition_files("events")] == \
            ["events/company=A/quarter=2020-01-01/events.parquet"]
        _write(store, later_partition, stamp)
        _write(store, "step/shard=01/step.parquet", Stamp("step", "code-1", {"events": "y"}))
        with listings_held(store, ["step"]):  # the outer hold stands: "step" is not held
            assert len(store.partition_files("events")) == 1
            assert sorted(_stamps(store, ["events"])) == ["events/company=A/quarter=2020-01-01/events.parquet"]
            assert store.identities([later_partition]) == {}
            assert sorted(_stamps(store, ["step"])) == ["step/shard=00/step.parquet", "step/shard=01/step.parquet"]
    assert len(store.partition_files("events")) == 2
    assert later_partition in _stamps(store, ["events"])
    assert set(store.identities([later_partition])) == {later_partition}
