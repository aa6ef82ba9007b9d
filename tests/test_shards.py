"""The global half split into shards: the same graph whatever the shard count, the cross-shard
cases handled exactly, a change reruns only the shards (and blocks) it touches, and a shard
that cannot run fails alone with a clear message."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml

from tests.conftest import needs_corpus, run_tkg
from tests.test_warehouse import published_rows
from tkg.build import catalog
from tkg.build.catalog import raw_tables
from tkg.build.graph import finish_graph
from tkg.build.stages import (
    PROCESS_BASE,
    SHARD_MEMORY_FACTOR,
    Runtime,
    _duckdb_memory_named,
    run_global,
    shard_input,
    stale_work,
)
from tkg.build.state import HalfBuilt, partitions_listed_once, read_state
from tkg.core.machine import (
    DUCKDB_FLOOR_BYTES,
    DUCKDB_SHARE_OF_ROOM,
    MemoryExceeded,
    duckdb_size_bytes,
    memory_watch,
    resident_bytes,
    room_for_duckdb,
    usable_cores,
)
from tkg.core.companies import DEFAULT_COMPANIES_FILE
from tkg.core.results import StageIncomplete
from tkg.invalidate import stages as invalidate_stages
from tkg.settings import Settings
from tkg.store import packs
from tkg.store.parquet import ParquetStore
from tkg.store.splits import read_chains, shard_rows
from tkg.store.warehouse import publish

# The tables the global half publishes, each sorted by all of its columns.
GRAPH_TABLES = [
    ("canonical_entities", "canonical_entities"), ("canonical_entities", "entity_resolution"),
    ("invalidated_events", "event_invalidations"), ("invalidated_events", "invalidation_judgments"),
    ("invalidated_events", "figure_invalidations"), ("fact_relevance", "fact_relevance"),
]
COMPANIES = ("INTC", "AMD")  # two companies' partitions of the real corpus: quick, and blocks span shards


def _runtime(home: Path, shards: int) -> Runtime:
    return Runtime.open(Settings.resolve(home=home, backend="offline", embeddings="wordllama", shards=shards))


def _graph(home: Path) -> dict[str, list[tuple]]:
    """The global half's tables, each sorted; of the canonical entities, the live ones (an id a
    merge retired stays in the registry, with `merged_into`, for whoever stored it, and so does
    an id whose mentions were all withdrawn, with no mention)."""
    store = ParquetStore(home)
    graph = {}
    for stage, table in GRAPH_TABLES:
        rows = store.read(store.global_path(stage, table)).to_pylist()
        if table == "canonical_entities":
            rows = [row for row in rows if row["merged_into"] is None and row["mention_count"] > 0]
        graph[f"{stage}.{table}"] = sorted(tuple(row.values()) for row in rows)
    return graph


def _shard_files(home: Path) -> dict[str, float]:
    """Every shard step's files with their modification times."""
    root = home / "parquet"
    return {str(path.relative_to(root)): path.stat().st_mtime_ns for stage in catalog.GLOBAL if stage.sharded
            for path in (root / stage.name).glob("shard=*/*.parquet")}


@pytest.fixture(scope="module")
def two_companies(corpus_home, tmp_path_factory) -> Path:
    """The partitions of two companies of the real corpus (copied from the session's build),
    with no global step run yet."""
    home = tmp_path_factory.mktemp("two_companies")
    for stage in catalog.PARTITIONED:
        for company in COMPANIES:
            shutil.copytree(corpus_home / "parquet" / stage.name / f"company={company}",
                            home / "parquet" / stage.name / f"company={company}")
    return home


def _copy(home: Path, target: Path) -> Path:
    shutil.copytree(home, target)
    return target


@needs_corpus
def test_the_shard_count_changes_the_files_not_the_graph(two_companies, tmp_path):
    graphs = {}
    for shards in (1, 3, 7):
        home = _copy(two_companies, tmp_path / f"shards{shards}")
        finish_graph(_runtime(home, shards))
        graphs[shards] = _graph(home)
        if shards == 7:
            # the case the merges exist for: events whose blocks lie in several shards
            assert sum(len(found) > 1 for found in _event_shards(home).values()) > 10
            retirements = (home / "parquet" / "judged_pairs").glob("shard=*/retirements.parquet")
            assert sum(ParquetStore(home).read(path).num_rows > 0 for path in retirements) >= 2
    assert graphs[1]["invalidated_events.event_invalidations"]  # something was retired
    assert graphs[3] == graphs[1]
    assert graphs[7] == graphs[1]


def _merged_registry(home: Path, tmp_path: Path) -> Path:
    """The company registry with one more alias: the organisation (seen in the store, not yet a
    registry company) with the most mentions becomes an alias of the company whose calls
    mention it most. Resolution then merges the two entities."""
    store = ParquetStore(home)
    canonical = store.read(store.global_path("canonical_entities")).to_pylist()
    organisations = {row["canonical_id"]: row["name"] for row in canonical
                     if row["type"] == "Organization" and row["source"] == "mentions"}
    mapping = store.global_path("canonical_entities", "entity_resolution")
    mentions = duckdb.sql(f"""SELECT r.canonical_id, e.company
                              FROM read_parquet('{home}/parquet/entities/*/*/*.parquet', hive_partitioning = true) e
                              JOIN read_parquet('{mapping}') r USING (entity_id)""").fetchall()
    counts = Counter(row for row in mentions if row[0] in organisations)
    (merged_id, company), _ = counts.most_common(1)[0]
    registry = yaml.safe_load(DEFAULT_COMPANIES_FILE.read_text())
    for entry in registry["companies"]:
        if entry["ticker"] == company:
            entry["aliases"] = [*entry["aliases"], organisations[merged_id]]
    path = tmp_path / "companies.yaml"
    path.write_text(yaml.safe_dump(registry))
    return path


def _event_shards(home: Path) -> dict[str, set[str]]:
    """Each fact's shards (those of its blocks), from fact_blocks' split."""
    store = ParquetStore(home)
    version = store.stamp(store.global_path("fact_blocks")).version
    folder = home / "parquet" / "fact_blocks" / f"v={version}" / "facts"
    rows = duckdb.sql(f"""SELECT event_id, list(DISTINCT shard ORDER BY shard)
                          FROM read_parquet('{folder}/*/*.parquet', hive_partitioning = true) GROUP BY event_id""").fetchall()
    return {event_id: set(shards) for event_id, shards in rows}


@needs_corpus
def test_an_entity_merge_reruns_what_it_touches_and_equals_a_fresh_build(two_companies, tmp_path, monkeypatch):
    """A user adds an alias to the company registry: two canonical entities become one, the
    facts about them move to the merged entity's blocks (and shards). The rerun keeps every
    shard and block the merge did not touch, and its graph equals a build from nothing."""
    home = _copy(two_companies, tmp_path / "home")
    finish_graph(_runtime(home, 5), publish_to=home / "tkg.duckdb")
    shards_before = _event_shards(home)
    files_before = _shard_files(home)

    monkeypatch.setenv("TKG_COMPANIES", str(_merged_registry(home, tmp_path)))
    runtime = _runtime(home, 5)
    assert stale_work(runtime, catalog.stage("canonical_entities")) == ["*"]
    report = finish_graph(runtime, publish_to=home / "tkg.duckdb")
    moved = {event for event, shards in _event_shards(home).items() if shards_before.get(event, shards) != shards}
    assert moved, "the merge moved no fact to another shard"
    files_after = _shard_files(home)
    untouched = [path for path, mtime in files_after.items() if files_before.get(path) == mtime]
    assert untouched, "every shard was rebuilt"
    assert report.counts["blocks_kept"] > report.counts["blocks_ranked"] > 0

    store = ParquetStore(home)
    retired = [row for row in store.read(store.global_path("canonical_entities")).to_pylist() if row["merged_into"]]
    assert retired, "the merged entity's id is kept, pointing at the entity it joined"

    # fact_blocks read the facts of the merged entities' mentions and of the blocks they made or
    # unmade, and wrote each shard's rows as a build from nothing writes them
    assert report.counts["entities_resolved_again"] > 0 and report.counts["fact_blocks_read_whole"] == 0
    assert report.counts["fact_events_dirty"] > 0 and report.counts["fact_events_read"] > 0

    fresh = _copy(two_companies, tmp_path / "fresh")
    fresh_report = finish_graph(_runtime(fresh, 5), publish_to=fresh / "tkg.duckdb")
    assert report.counts["fact_events_read"] < fresh_report.counts["fact_events_read"] / 2
    assert _graph(home) == _graph(fresh)
    assert _split_tables(home, 5) == _split_tables(fresh, 5)
    assert _fact_blocks_summary(home) == _fact_blocks_summary(fresh)
    # the published facts: the moved facts' rows replaced in place (their subject or object is
    # the merged entity now), equal to the fresh build's
    replaced = re.match(r"([\d,]+) event\(s\) replaced", report.publish.in_place["facts"])
    assert replaced and 0 < int(replaced[1].replace(",", "")) < report.publish.raw_rows["events"]
    assert all(published_rows(home / "tkg.duckdb")[name] == published_rows(fresh / "tkg.duckdb")[name]
               for name in ("main.facts", "raw.entity_resolution", "raw.event_invalidations"))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_shard_over_its_memory_limit_fails_alone_and_a_rerun_finishes_only_it(sample_home, tmp_path):
    home = _copy(sample_home, tmp_path / "home")
    published = _digest(home / "tkg.duckdb")
    published_at = (home / "tkg.duckdb").stat().st_mtime_ns
    store = ParquetStore(home)
    env = {"TKG_SHARDS": "3"}
    # the global steps up to fact_blocks, at three shards, to learn each shard's size
    runtime = _runtime(home, 3)
    for stage in catalog.GLOBAL[: catalog.GLOBAL.index(catalog.stage("fact_blocks")) + 1]:
        for shard in stale_work(runtime, stage):
            run_global(runtime, stage, None if shard == "*" else shard)
    version = store.stamp(store.global_path("fact_blocks")).version
    sizes = {shard: shard_input(store, catalog.stage("candidate_ranks"), shard, {"fact_blocks": version})[1]
             for shard in ("00", "01", "02")}
    biggest = max(sizes, key=sizes.get)
    assert sum(size == sizes[biggest] for size in sizes.values()) == 1, sizes
    limit = PROCESS_BASE + int(SHARD_MEMORY_FACTOR * sorted(sizes.values())[-2]) + 1

    failed = run_tkg(home, "build", env={**env, "TKG_MEMORY_LIMIT": f"{limit}B"})
    assert failed.returncode != 0
    assert f"candidate_ranks shard {biggest} is too big" in failed.stderr + failed.stdout
    assert "TKG_SHARDS" in failed.stderr + failed.stdout
    assert _digest(home / "tkg.duckdb") == published  # the last good graph stays published
    ranks = {shard: home / "parquet" / "candidate_ranks" / f"shard={shard}" / "candidate_ranks.parquet" for shard in sizes}
    assert ranks[biggest].stat().st_mtime_ns < published_at  # not written: still the 8-shard build's
    others = {shard: path.stat().st_mtime_ns for shard, path in ranks.items() if shard != biggest}
    assert all(mtime > published_at for mtime in others.values())  # the two other shards ran and are kept

    run_tkg(home, "build", env=env, check=True)
    assert {shard: ranks[shard].stat().st_mtime_ns for shard in others} == others  # not run again
    assert ranks[biggest].stat().st_mtime_ns > published_at
    assert _digest(home / "tkg.duckdb") != published
    assert store.read(store.global_path("invalidated_events", "event_invalidations")).num_rows > 0

    # Its inputs unchanged since, the shard is kept as it is even under the limit it does not fit
    # (nothing is read): a step before it that ran again with the same result (a build recording
    # every shard as current) must not fail on it.
    low = Runtime.open(replace(_runtime(home, 3).settings, memory_limit=f"{limit}B"))
    rebuilt = ranks[biggest].stat().st_mtime_ns
    kept = run_global(low, catalog.stage("candidate_ranks"), biggest)
    assert "kept as it is" in " ".join(kept.notes) and ranks[biggest].stat().st_mtime_ns == rebuilt


def test_a_shard_step_reads_the_global_steps_alone_and_refuses_one_older_than_what_it_reads(sample_home, tmp_path):
    """A shard step reads none of the partitions' stamps (112,000 files at 5M events, for each
    of a quarter's shard runs): a half-built partition stops the global steps, not a shard
    whose rows did not change. A global step it reads that is older than the global step that
    one reads still stops it, naming both."""
    home = _copy(sample_home, tmp_path / "home")
    runtime = _runtime(home, 8)
    ranks = home / "parquet" / "candidate_ranks" / "shard=00" / "candidate_ranks.parquet"
    built = ranks.stat().st_mtime_ns
    partitions = sorted((home / "parquet" / "triplets").glob("company=*/quarter=*"))
    first, last = partitions[0], partitions[-1]
    (first / "triplets.parquet").unlink()  # a build stopped between two stages of this partition
    with pytest.raises(HalfBuilt, match="half-built"):
        run_global(runtime, catalog.stage("fact_blocks"))
    kept = run_global(runtime, catalog.stage("candidate_ranks"), "00")
    assert "kept as it is" in " ".join(kept.notes) and ranks.stat().st_mtime_ns == built

    # the partition whole again, and another one gone: canonical_entities runs again, fact_blocks not yet
    shutil.copy(sample_home / first.relative_to(home) / "triplets.parquet", first / "triplets.parquet")
    for stage in catalog.PARTITIONED:
        shutil.rmtree(home / "parquet" / stage.name / last.relative_to(home / "parquet" / "triplets"))
    run_global(runtime, catalog.stage("canonical_entities"))
    with pytest.raises(HalfBuilt, match="candidate_ranks shard 00 cannot run yet: fact_blocks older than its inputs"):
        run_global(runtime, catalog.stage("candidate_ranks"), "00")
    assert ranks.stat().st_mtime_ns == built


def test_a_run_of_the_global_steps_lists_the_partitions_once_and_the_global_steps_each_time(sample_home, tmp_path):
    """The global steps write no partition, so their run lists the partitions' stamps once
    (partitions_listed_once; at 5M events each listing is 129,000 files) and reads its own
    steps' stamps each time: a partition changed meanwhile is seen by the next run, a global
    step that wrote meanwhile at once."""
    home = _copy(sample_home, tmp_path / "home")
    store = ParquetStore(home)
    before = read_state(store, catalog.shard_keys(8))
    partition = sorted(before.partitions)[0]
    with partitions_listed_once(store):
        assert read_state(store, catalog.shard_keys(8)).partitions == before.partitions
        store.partition_path("triplets", *partition).unlink()  # another run rebuilding it
        shutil.rmtree(home / "parquet" / "fact_relevance")
        shutil.rmtree(home / "parquet" / "judged_pairs" / "shard=03")
        inside = read_state(store, catalog.shard_keys(8))
        assert inside.partitions == before.partitions  # the listing of the run's first read
        assert inside.globals["fact_relevance"] is None and before.globals["fact_relevance"] is not None
        assert inside.shards["judged_pairs"]["03"] is None and inside.shards["judged_pairs"]["02"] is not None
        assert read_state(ParquetStore(tmp_path / "other")).partitions == {}  # another store is listed as it is
    after = read_state(store, catalog.shard_keys(8))
    assert after.partitions[partition]["triplets"] is None
    assert {key: stamps for key, stamps in after.partitions.items() if key != partition} == \
        {key: stamps for key, stamps in before.partitions.items() if key != partition}


def test_a_global_step_past_its_duckdb_memory_fails_named_and_keeps_the_published_graph(sample_home, tmp_path):
    """DuckDB's own out-of-memory error (what it could not spill passed TKG_STEP_MEMORY) names
    the step, its setting and the way past it, with no traceback; the last good graph stays,
    and a rerun with the default finishes the job."""
    home = _copy(sample_home, tmp_path / "home")
    published = _digest(home / "tkg.duckdb")
    shutil.rmtree(home / "parquet" / "canonical_entities")
    failed = run_tkg(home, "build", env={"TKG_STEP_MEMORY": "4MB"})
    assert failed.returncode != 0
    output = failed.stderr + failed.stdout
    assert "canonical_entities: DuckDB needed more than TKG_STEP_MEMORY=4MB" in output and "raise TKG_STEP_MEMORY" in output
    assert "Traceback" not in output
    assert _digest(home / "tkg.duckdb") == published
    run_tkg(home, "build", check=True)
    assert (home / "parquet" / "canonical_entities").exists() and _digest(home / "tkg.duckdb") != published


def test_a_spill_past_its_disk_limit_stops_with_a_message_naming_it(tmp_path, monkeypatch):
    """A global step's DuckDB spills at most TKG_STEP_DISK (unset: half the disk's free space),
    and a step that needs more stops naming the setting, never filling the disk."""
    monkeypatch.setenv("TKG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TKG_STEP_DISK", raising=False)
    settings = Settings.resolve()
    with settings.spilling_connection() as connection:
        allowed = connection.execute("SELECT current_setting('max_temp_directory_size')").fetchall()[0][0]
    half = shutil.disk_usage(tmp_path).free / 2
    assert 0.8 * half < duckdb_size_bytes(allowed) < 1.2 * half

    monkeypatch.setenv("TKG_STEP_DISK", "2MB")
    settings = Settings.resolve().with_changes(step_memory="40MB")
    with pytest.raises(MemoryExceeded, match=r"a step: DuckDB spilled more than TKG_STEP_DISK=2MB to disk .*raise TKG_STEP_DISK"):
        with settings.spilling_connection() as connection, _duckdb_memory_named("a step", settings, None):
            connection.execute("SET threads = 1")
            connection.execute("CREATE TABLE sorted AS SELECT range AS i, md5(range::VARCHAR) AS s FROM range(3000000) ORDER BY s")

    monkeypatch.setenv("TKG_STEP_DISK", "lots")
    with pytest.raises(ValueError, match="TKG_STEP_DISK='lots' is not a size"):
        Settings.resolve()


def test_duckdb_gets_a_share_of_the_room_a_memory_watch_leaves_and_its_limit_back(tmp_path, monkeypatch):
    """A global step whose Python objects already hold much of TKG_MEMORY_LIMIT (resolution's
    names at 10M events) gives its big DuckDB work a share of what the watch leaves beside them
    (DuckDB's own buffers not counted as theirs), not the whole TKG_STEP_MEMORY, and DuckDB
    spills sooner; the limit the connection was made with comes back exactly, however often;
    with room to spare, or no watch, nothing changes; and what DuckDB cannot fit in the room is
    named as such."""
    monkeypatch.setenv("TKG_HOME", str(tmp_path / "home"))
    settings = Settings.resolve().with_changes(step_memory="1907MiB", memory_limit="4GB")
    with settings.spilling_connection() as connection:
        def limit() -> int:
            return duckdb_size_bytes(connection.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])

        def other() -> int:  # the process's memory besides DuckDB's buffers
            return resident_bytes() - connection.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchall()[0][0]

        given = limit()
        with room_for_duckdb(connection):
            assert limit() == given
        room = 600 * 2**20
        with memory_watch(other() + room, "a step", connection.interrupt):
            for _ in range(3):
                with room_for_duckdb(connection):
                    assert DUCKDB_FLOOR_BYTES <= limit() <= DUCKDB_SHARE_OF_ROOM * (room + 2**27) < given
                    sorted_rows = connection.execute("SELECT count(*) FROM (SELECT md5(range::VARCHAR) AS s FROM range(2000000) "
                                                     "ORDER BY s)").fetchall()[0][0]
                    assert sorted_rows == 2_000_000
                assert limit() == given
            with pytest.raises(MemoryExceeded, match=r"a step: DuckDB needed more than the 0\.\d+ GB its other memory left it "
                                                     r"under TKG_MEMORY_LIMIT=4GB .*raise TKG_MEMORY_LIMIT"):
                with _duckdb_memory_named("a step", settings, None), room_for_duckdb(connection):
                    connection.execute("SELECT list(range) FROM range(200000000)").fetchall()  # one list: no spilling it
            assert limit() == given
        with memory_watch(other() + 64 * 2**30, "a roomy step", connection.interrupt), room_for_duckdb(connection):
            assert limit() == given


# Work whose memory is all freed when it returns, then what the process holds: once with
# nothing given back, once inside memory_released (as run_global runs a step), in a process of
# its own (pytest's would blur the numbers).
_FREED_WORK = """
import gc, sys
import numpy as np, pyarrow as pa, pyarrow.compute as pc
from tkg.core.machine import memory_released, resident_bytes

def work():  # Arrow buffers in many chunks (a step's tables) and Python objects (its names)
    numbers = pa.chunked_array([pa.array(np.arange(50_000, dtype=np.float64)) for _ in range(2_000)])
    texts = [str(i) * 5 for i in range(2_000_000)]
    return len(pc.cast(numbers, pa.float32())) + len(texts)

start = resident_bytes()
work()
gc.collect()
kept = resident_bytes()
with memory_released():
    work()
print(start, kept, resident_bytes())
"""


def test_what_a_step_freed_goes_back_to_the_system_before_the_next_step(tmp_path):
    """The global steps of a run share one process, and a worker takes shard after shard, while
    the memory watch counts resident memory: what the allocators keep of a step's freed memory
    (Arrow's pool, malloc's heap) would count against the next one. Inside memory_released,
    which every global step and shard runs in, it goes back to the system when the work ends."""
    ran = subprocess.run([sys.executable, "-c", _FREED_WORK], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    start, kept, released = map(int, ran.stdout.split())
    assert kept - start > 300 * 2**20, (start, kept)  # freed, but still the process's
    assert released - start < (kept - start) / 4, (start, kept, released)


def test_a_pool_of_workers_shares_the_cores_between_their_duckdb_connections(tmp_path, monkeypatch):
    """A shard step's shards run in one worker process per core: each worker's DuckDB takes its
    share of the cores, not every core (two workers of two threads each on two cores pay to
    share them: 6% more CPU for a judged_pairs shard at 1M events). Alone, a step has them all."""
    monkeypatch.setenv("TKG_HOME", str(tmp_path / "home"))
    settings = Settings.resolve()

    def threads(chosen: Settings) -> int:
        with chosen.spilling_connection() as connection:
            return int(connection.execute("SELECT current_setting('threads')").fetchall()[0][0])

    with duckdb.connect() as connection:
        every_core = int(connection.execute("SELECT current_setting('threads')").fetchall()[0][0])
    assert threads(settings) == threads(settings.for_workers(1)) == every_core
    assert threads(settings.for_workers(2)) == max(1, usable_cores() // 2)
    assert threads(settings.for_workers(4 * usable_cores())) == 1


def test_a_memory_setting_that_is_not_a_size_is_named(tmp_path):
    completed = run_tkg(tmp_path / "home", "build", env={"TKG_MEMORY_LIMIT": "4 gigs"})
    assert completed.returncode != 0
    assert "TKG_MEMORY_LIMIT='4 gigs' is not a size; give one like 4GB" in completed.stderr
    assert "Traceback" not in completed.stderr
    assert not (tmp_path / "home" / "parquet").exists()  # nothing was built


# The outputs of the shard steps, whose rows an increment keeps per block or judge case.
MEMOISED_TABLES = [("candidate_ranks", "ranked_members"), ("candidate_ranks", "candidate_ranks"),
                   ("judged_pairs", "judgments"), ("judged_pairs", "retirements"),
                   ("judged_pairs", "paired_events"), ("judged_pairs", "paired_units")]


def _shard_outputs(home: Path) -> dict[str, object]:
    """Every shard step's output tables, their rows in order (they are stored in none); a
    shard's candidate ranks and judgments as they stack (its base and the changes since,
    tkg.invalidate.stages.stack_ranks and stack_judgments)."""
    store = ParquetStore(home)
    return {f"{stage}/{path.parent.name}/{table}": (_stacked(store, path, STACKED[table]) if table in STACKED
                                                    else _in_order(store.read(path).replace_schema_metadata(None)))
            for stage, table in MEMOISED_TABLES for path in sorted((home / "parquet" / stage).glob(f"shard=*/{table}.parquet"))}


def _in_order(table: pa.Table) -> pa.Table:
    return table.sort_by([(name, "ascending") for name in table.column_names])


STACKED = {"candidate_ranks": invalidate_stages.stack_ranks, "judgments": invalidate_stages.stack_judgments}


def _stacked(store: ParquetStore, path: Path, stack) -> object:
    with duckdb.connect() as connection:
        stack(store, connection, [path.parent.name.removeprefix("shard=")], "rows", "test")
        return connection.sql("SELECT * FROM rows ORDER BY ALL").to_arrow_table()


@needs_corpus
def test_a_new_quarter_reuses_unchanged_blocks_and_pairs_and_equals_a_cold_build(two_companies, tmp_path, monkeypatch):
    """Each block's ranks and each pair's verdict are kept from the last build when their
    inputs did not change; a block the new quarter only adds to ranks only its new pairs; the
    other blocks and pairs it touches are recomputed. The
    increment's tables equal a cold build's on the same partitions, row for row and in order.
    The increment also withdraws one earlier call, whose facts leave their blocks. The global
    steps read the partitions through packs (tkg.store.packs) as a big store's do: the first
    build packs every partition, and the increment reads the withdrawn call's rows no more
    and the new quarter's from their files."""
    monkeypatch.setattr(packs, "MIN_FILES", 4)  # two companies' calls: few enough to be read as files
    # two companies' quarter changes more of a shard's ranks than a big store's: written as changes all the same
    monkeypatch.setattr(invalidate_stages, "RANKS_DELTA_SHARE", 1.0)
    monkeypatch.setattr(invalidate_stages, "JUDGMENTS_DELTA_SHARE", 1.0)
    calls = sorted((two_companies / "parquet" / "transcripts").glob("company=*/quarter=*"))
    newest = max(path.name for path in calls)
    withdrawn = calls[0].relative_to(two_companies / "parquet" / "transcripts")
    home = tmp_path / "home"
    shutil.copytree(two_companies, home, ignore=lambda folder, names: [name for name in names if name == newest])
    first = finish_graph(_runtime(home, 3), publish_to=home / "tkg.duckdb")
    assert first.publish.tables["invalidation_judgments"] == "loaded"
    for folder in (two_companies / "parquet").glob(f"*/company=*/{newest}"):
        shutil.copytree(folder, home / folder.relative_to(two_companies))
    for folder in (home / "parquet").glob(f"*/{withdrawn}"):
        shutil.rmtree(folder)
    # one shard's last output as an older tkg wrote it, without what its pairs were made from:
    # still trusted for its verdicts, and that shard pairs every unit again
    for memo in ("paired_events", "paired_units"):
        (home / "parquet" / "judged_pairs" / "shard=01" / f"{memo}.parquet").unlink()
    # another shard's last output as written before shards recorded the selection version they
    # read: its units are told from every selected row's digest, as they were then
    (home / "parquet" / "judged_pairs" / "shard=02" / "versions_read.parquet").unlink()
    # and a table this tkg no longer writes (the pairs' fingerprints had a file of their own),
    # which the shard's next run removes
    obsolete = home / "parquet" / "judged_pairs" / "shard=01" / "judged_fingerprints.parquet"
    shutil.copyfile(obsolete.with_name("retirements.parquet"), obsolete)

    report = finish_graph(_runtime(home, 3), publish_to=home / "tkg.duckdb")
    assert len(list((home / "parquet" / packs.PACKS / "temporal_events").glob("*.index.parquet"))) == 1
    assert not obsolete.exists()
    assert report.counts["blocks_kept"] > report.counts["blocks_grown"] > 0  # grown: only the new pairs ranked
    assert report.counts["pairs_kept"] > report.counts["pairs_judged_now"] > 0
    # selected again: only the incoming facts whose ranks changed in some shard
    assert report.counts["selected_every_fact"] == 0
    assert 0 < report.counts["incoming_selected"] <= report.counts["incoming_changed"]

    cold = _copy(two_companies, tmp_path / "cold")
    for folder in (cold / "parquet").glob(f"*/{withdrawn}"):
        shutil.rmtree(folder)
    cold_report = finish_graph(_runtime(cold, 3))
    assert cold_report.counts["blocks_kept"] == cold_report.counts["blocks_grown"] == cold_report.counts["pairs_kept"] == 0
    assert cold_report.counts["selected_every_fact"] == 1
    assert cold_report.counts["incoming_selected"] > report.counts["incoming_selected"]
    # paired again: only the units (two facts) whose selected rows or events changed (every
    # unit of shard 01, which lost its memo); a cold build pairs every one
    assert cold_report.counts["pairs_made_now"] == cold_report.counts["candidate_pairs"]
    assert 0 < report.counts["pairs_made_now"] < report.counts["candidate_pairs"]
    assert 0 < report.counts["units_paired_now"] < cold_report.counts["units_paired_now"]
    # the units of shard 00 told from the selected rows written and deleted since the version
    # it last read, not from every row's digest (shard 01 lost its memo, shard 02 its record)
    assert report.counts["units_told_by_changed_rows"] == 1 and cold_report.counts["units_told_by_changed_rows"] == 0
    # the ranks: the increment wrote each shard's changes on its base, the cold build every row
    assert report.counts["ranks_written_whole"] == 0 and cold_report.counts["ranks_written_whole"] == 3
    # the judgments too: the pairs judged or dropped written as changes on each shard's base
    assert report.counts["judgments_written_whole"] == 0 and cold_report.counts["judgments_written_whole"] == 3
    judgment_changes = [ParquetStore(home).read(path) for path in (home / "parquet" / "judged_pairs").glob("shard=*/judgments.parquet")]
    assert 0 < sum(rows.num_rows for rows in judgment_changes) < report.counts["judged_pairs"] / 2
    assert any(pc.any(rows["gone"]).as_py() for rows in judgment_changes)
    increment, built = _shard_outputs(home), _shard_outputs(cold)
    assert increment.keys() == built.keys() and len(built) == 3 * len(MEMOISED_TABLES)
    assert [name for name in built if not increment[name].equals(built[name])] == []
    changes = [ParquetStore(home).read(path).num_rows for path in (home / "parquet" / "candidate_ranks").glob("shard=*/candidate_ranks.parquet")]
    assert all(rows > 0 for rows in changes) and sum(changes) < report.counts["ranked"]
    assert _graph(home) == _graph(cold)
    # resolution's memo: the new calls' entity files added, the withdrawn call's gone
    # (tests/test_resolution.py has the evidence added to)
    assert report.counts["evidence_partitions_added"] == len(COMPANIES)
    assert report.counts["evidence_partitions_stale"] == 1
    # the spoken forms: only the new calls' text read, the others' forms kept; linked as a cold build links them
    assert report.counts["spoken_calls_read"] == len(COMPANIES)
    every_call = duckdb.sql(f"SELECT count(DISTINCT transcript_id) FROM '{cold}/parquet/chunks/*/*/chunks.parquet'").fetchall()
    assert cold_report.counts["spoken_calls_read"] == every_call[0][0] > 20
    spoken = [ParquetStore(root).read(root / "parquet" / "spoken_mentions" / "spoken_mentions.parquet")
              .replace_schema_metadata(None) for root in (home, cold)]
    assert spoken[0].num_rows > 0 and spoken[0].equals(spoken[1])
    # the split tables: written as deltas on the last build (both global steps that split), a
    # cold build's rows in the same order, and the same fingerprint per shard
    assert report.counts["split_written_as_delta"] == 2 and cold_report.counts["split_written_as_delta"] == 0
    assert 0 < report.counts["split_rows_written"] < cold_report.counts["split_rows_written"] / 4
    assert _split_tables(home) == _split_tables(cold)
    # fact_blocks read the facts the quarter's and the withdrawn call's partitions changed, and
    # those of the blocks they made or unmade; a cold build reads every fact
    assert report.counts["fact_blocks_read_whole"] == 0 and cold_report.counts["fact_blocks_read_whole"] == 1
    assert report.counts["fact_partitions_changed"] == len(COMPANIES) + 1
    assert report.counts["fact_events_dirty"] > 0
    assert 0 < report.counts["fact_events_read"] < cold_report.counts["fact_events_read"] / 2
    assert _fact_blocks_summary(home) == _fact_blocks_summary(cold)
    # the figure revisions: only the guidance the quarter's figures (and the withdrawn call's)
    # may retire differently revised again, with the memo a cold build writes
    assert 0 < report.counts["figures_revised_again"] < cold_report.counts["figures_revised_again"]
    memos = [ParquetStore(root).read(root / "parquet" / "invalidated_events" / "revision_figures.parquet")
             .replace_schema_metadata(None) for root in (home, cold)]
    assert memos[0].num_rows > 0 and memos[0].equals(memos[1])
    # the published judgments: the changes since the last publish applied (the pairs judged
    # again gone and new, the revisions' too), equal to a fresh publish of the same store
    applied = re.fullmatch(r"([\d,]+) row\(s\) deleted, ([\d,]+) inserted", report.publish.tables["invalidation_judgments"])
    assert applied and 0 < int(applied[1].replace(",", "")) and 0 < int(applied[2].replace(",", "")) \
        < report.publish.raw_rows["invalidation_judgments"] / 2
    assert report.counts["judgments_changed"] == sum(int(number.replace(",", "")) for number in applied.groups())
    # facts: the rows of the events the quarter added, withdrew, re-resolved or retired replaced
    # in place, and every row's relevance moved to the new latest call
    in_place = re.fullmatch(r"([\d,]+) event\(s\) replaced \(([\d,]+) row\(s\) deleted, ([\d,]+) inserted\), "
                            r"([\d,]+) relevance\(s\) updated", report.publish.in_place["facts"])
    replaced, deleted, inserted, moved = (int(number.replace(",", "")) for number in in_place.groups())
    assert 0 < replaced < report.publish.raw_rows["events"] / 2 and deleted > 0 and inserted > 0 and moved > 0
    fresh = publish(ParquetStore(home), tmp_path / "fresh.duckdb", raw_tables())
    assert fresh.tables["invalidation_judgments"] == "loaded" and fresh.in_place == {}
    assert published_rows(home / "tkg.duckdb") == published_rows(fresh.path)

    # another call withdrawn from both: the increment's ranks take its changes into the changes
    # they hold since their base, and stack as the cold build's (one change on a whole base) do
    second = calls[1].relative_to(two_companies / "parquet" / "transcripts")
    for root in (home, cold):
        for folder in (root / "parquet").glob(f"*/{second}"):
            shutil.rmtree(folder)
    # the cold build's fact_blocks output as an older tkg wrote it, without its memos: still
    # trusted, and read whole once
    for memo in ("fact_links", "fact_entities", "fact_partitions"):
        (cold / "parquet" / "fact_blocks" / f"{memo}.parquet").unlink()
    again, cold_again = finish_graph(_runtime(home, 3)), finish_graph(_runtime(cold, 3))
    assert again.counts["fact_blocks_read_whole"] == 0 and cold_again.counts["fact_blocks_read_whole"] == 1
    assert again.counts["incoming_changed"] > 0
    assert again.counts["ranks_written_whole"] == cold_again.counts["ranks_written_whole"] == 0
    assert again.counts["judgments_written_whole"] == cold_again.counts["judgments_written_whole"] == 0
    assert again.counts["units_told_by_changed_rows"] == cold_again.counts["units_told_by_changed_rows"] == 3
    increment, built = _shard_outputs(home), _shard_outputs(cold)
    assert [name for name in built if not increment[name].equals(built[name])] == []
    assert _split_tables(home) == _split_tables(cold)
    assert _fact_blocks_summary(home) == _fact_blocks_summary(cold)
    # one base per shard, the first build's, which both increments' changes stand on
    assert len(list((home / "parquet" / "candidate_ranks").glob("shard=*/v=*"))) == 3
    assert len(list((home / "parquet" / "judged_pairs").glob("shard=*/v=*"))) == 3

    # the call back in both: the inputs of the state before, so the same versions, which the
    # versions now stack as their base (the selection's rows are read before those files go)
    for root in (home, cold):
        for folder in (two_companies / "parquet").glob(f"*/{second}"):
            shutil.copytree(folder, root / folder.relative_to(two_companies))
    back = finish_graph(_runtime(home, 3), publish_to=home / "tkg.duckdb")
    cold_back = finish_graph(_runtime(cold, 3))
    assert back.counts["incoming_changed"] > 0 and cold_back.counts["incoming_changed"] > 0
    # the selection written whole again (a version come back): no shard can tell its units from changed rows
    assert back.counts["units_told_by_changed_rows"] == cold_back.counts["units_told_by_changed_rows"] == 0
    increment, built = _shard_outputs(home), _shard_outputs(cold)
    assert [name for name in built if not increment[name].equals(built[name])] == []
    assert _split_tables(home) == _split_tables(cold)
    assert _graph(home) == _graph(cold)
    # published in place over the first increment's file: as a fresh publish of the same store
    fresh = publish(ParquetStore(home), tmp_path / "fresh_back.duckdb", raw_tables())
    assert published_rows(home / "tkg.duckdb") == published_rows(fresh.path)


@needs_corpus
def test_a_state_come_back_whose_write_stops_half_way_is_rebuilt_from_nothing(two_companies, tmp_path, monkeypatch):
    """Two calls added one after the other, then the second taken away: the global steps' inputs
    are the first's again, so their split versions come back, and are written whole over the
    folders of that version, which the last output stacks as a delta. A run stopped after a
    folder was replaced (here: the selection's chain file cannot be written) must not leave the
    last output trusted over it: the next run starts from nothing and gives the graph the state
    had before, not the earlier rows twice."""
    calls = sorted((two_companies / "parquet" / "transcripts").glob("company=*/quarter=*"))
    first, second = (call.relative_to(two_companies / "parquet" / "transcripts") for call in calls[-2:])
    home = _copy(two_companies, tmp_path / "home")
    for call in (first, second):
        for folder in (home / "parquet").glob(f"*/{call}"):
            shutil.rmtree(folder)

    def add(call: Path) -> None:
        for folder in (two_companies / "parquet").glob(f"*/{call}"):
            shutil.copytree(folder, home / folder.relative_to(two_companies))

    finish_graph(_runtime(home, 3))
    add(first)
    assert finish_graph(_runtime(home, 3)).counts["split_written_as_delta"] == 2
    graph, split = _graph(home), _split_tables(home)
    store = ParquetStore(home)
    came_back = store.stamp(store.global_path("candidate_selection")).version
    add(second)
    assert finish_graph(_runtime(home, 3)).counts["split_written_as_delta"] == 2
    assert came_back in read_chains(store, "candidate_selection", store.stamp(store.global_path("candidate_selection")).version
                                    )["selected"].segments
    for folder in (home / "parquet").glob(f"*/{second}"):
        shutil.rmtree(folder)
    write = ParquetStore.write

    def stopped(self, path, table):
        if path.name == "chain.parquet" and path.parent.parent.name == "candidate_selection":
            raise OSError("No space left on device")
        return write(self, path, table)

    with monkeypatch.context() as patch:
        patch.setattr(ParquetStore, "write", stopped)
        with pytest.raises(Exception, match="No space left"):
            finish_graph(_runtime(home, 3))
    assert (home / "parquet" / "candidate_selection" / f"v={came_back}" / "selected").is_dir()  # replaced, whole
    assert not store.is_file(store.global_path("candidate_selection"))  # the last output no longer trusted
    again = finish_graph(_runtime(home, 3))
    assert again.counts["selected_every_fact"] == 1
    assert _graph(home) == graph and _split_tables(home) == split


def _fact_blocks_summary(home: Path) -> tuple[list[tuple], dict[str, pa.Table]]:
    """fact_blocks' summary (per shard, its rows of each table and its blocks) and its memos."""
    store = ParquetStore(home)
    memos = {name: _in_order(store.read(store.global_path("fact_blocks", name)).replace_schema_metadata(None))
             for name in ("fact_links", "fact_entities", "fact_partitions")}
    return sorted(tuple(row.values()) for row in store.read(store.global_path("fact_blocks")).to_pylist()), memos


def _split_tables(home: Path, shards: int = 3) -> dict[str, object]:
    """Every shard's rows of every split table, as the shard steps read them, and each
    splitting step's fingerprint per shard."""
    store = ParquetStore(home)
    keys = catalog.shard_keys(shards)
    found = {}
    with duckdb.connect() as connection:
        for stage in catalog.GLOBAL:
            if not stage.shard_tables:
                continue
            stamp = store.stamp(store.global_path(stage.name))
            found[f"{stage.name} fingerprints"] = stamp.parts
            for table, shard in ((table, shard) for table in stage.shard_tables for shard in keys):
                rows = shard_rows(store, connection, stage.name, stamp.version, table.name, shard, table.schema.names)
                found[f"{stage.name}/{table.name}/{shard}"] = sorted(rows.fetchall()) if rows is not None else None
    return found


def test_a_split_table_is_written_by_shard_in_order_within_its_memory_budget(tmp_path):
    """`write_split` files each shard's rows, in the order they came, without the shard column,
    however the batches mix shards; past its buffer budget it writes row groups as it goes
    rather than holding the stream."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 20_000
    shard = [f"{(i * 7919) % 5:02d}" for i in range(rows)]
    data = pa.table({"event_id": [f"e{i:05d}" for i in range(rows)], "vector": [[float(i)] * 8 for i in range(rows)],
                     "shard": shard})
    store = ParquetStore(tmp_path)
    folder = store.parquet_root / "fact_blocks" / "v=1" / "facts"
    store.write_split(folder, pa.RecordBatchReader.from_batches(data.schema, data.to_batches(max_chunksize=999)),
                      buffer_bytes=64 * 1024)
    for key in sorted(set(shard)):
        files = store.split_files("fact_blocks", "1", "facts", key)
        assert [path.name for path in files] == ["part-0.parquet"]
        written = pq.ParquetFile(str(files[0]))
        assert written.schema_arrow.names == ["event_id", "vector"]
        assert written.metadata.num_row_groups > 1  # flushed as it went
        expected = data.filter(pa.compute.equal(data.column("shard"), key)).drop_columns(["shard"])
        assert written.read().equals(expected)
    assert not store.split_files("fact_blocks", "1", "facts", "05")


def test_a_split_write_stopped_half_way_leaves_the_folder_as_it_was(tmp_path):
    """A version rewritten in place (one a later version stacks) whose write fails half-way,
    its rows' stream broken after some shards were written, keeps its earlier files whole and
    leaves no half-written folder; the next write replaces them, and removes what a write
    killed half-way left."""
    import pyarrow as pa

    store = ParquetStore(tmp_path)
    folder = store.parquet_root / "candidate_selection" / "v=1" / "selected"
    first = pa.table({"event_id": [f"e{i}" for i in range(300)], "shard": [f"{i % 3:02d}" for i in range(300)]})
    store.write_split(folder, pa.RecordBatchReader.from_batches(first.schema, first.to_batches()))

    def broken():
        yield from first.slice(0, 200).to_batches(max_chunksize=50)
        raise OSError("the disk is full")

    with pytest.raises(OSError, match="disk is full"):
        store.write_split(folder, pa.RecordBatchReader.from_batches(first.schema, broken()), buffer_bytes=1)
    assert sorted(path.name for path in folder.parent.iterdir()) == ["selected"]
    for key in ("00", "01", "02"):
        assert ParquetStore(tmp_path).read(store.split_files("candidate_selection", "1", "selected", key)[0]).num_rows == 100
    killed = folder.parent / ".writing-0123456789ab-selected" / "shard=00"  # what a kill -9 half-way leaves
    killed.mkdir(parents=True)
    second = first.slice(0, 30)
    store.write_split(folder, pa.RecordBatchReader.from_batches(second.schema, second.to_batches()))
    assert sorted(path.name for path in folder.parent.iterdir()) == ["selected"]
    assert sum(store.read(path).num_rows for key in ("00", "01", "02")
               for path in store.split_files("candidate_selection", "1", "selected", key)) == 30


def test_a_shard_rewritten_with_the_same_version_reloads_the_published_judgments(sample_home, tmp_path):
    """The judgments' changes name what changed since the shards' files read last: an
    unchanged set of shards gives no change to apply, but a shard rebuilt from nothing (its
    inputs unchanged, so its version too, but its file rewritten, and an LLM judge asked again
    may answer otherwise) gives changes that cannot be told, and the publish reloads the table."""
    home = _copy(sample_home, tmp_path / "home")
    runtime, target = _runtime(home, 8), home / "tkg.duckdb"
    judged, invalidated = catalog.stage("judged_pairs"), catalog.stage("invalidated_events")

    run_global(runtime, invalidated)  # the shards as they were: nothing changed since
    assert publish(runtime.store, target, raw_tables()).tables["invalidation_judgments"] == "0 row(s) deleted, 0 inserted"

    shard = home / "parquet" / "judged_pairs" / "shard=00"
    version = ParquetStore(home).stamp(shard / "judgments.parquet").version
    shutil.rmtree(shard)
    run_global(runtime, judged, "00")
    assert ParquetStore(home).stamp(shard / "judgments.parquet").version == version
    run_global(runtime, invalidated)
    assert publish(runtime.store, target, raw_tables()).tables["invalidation_judgments"] == "reloaded"
    fresh = publish(runtime.store, tmp_path / "fresh.duckdb", raw_tables())
    assert published_rows(target) == published_rows(fresh.path)


def test_judgments_without_their_base_stop_the_retirements_naming_the_shard(sample_home, tmp_path):
    """A shard's judgments are the changes since its base (tkg.invalidate.stages.stack_judgments):
    a shard whose base was removed is never read as if its changes were every judgment; the
    retirements stop, naming the shard and the folder to remove, and removing it heals the graph."""
    home = _copy(sample_home, tmp_path / "home")
    runtime = _runtime(home, 8)
    invalidated = catalog.stage("invalidated_events")
    before = ParquetStore(home).read(ParquetStore(home).global_path("invalidated_events", "invalidation_judgments"))
    shard = home / "parquet" / "judged_pairs" / "shard=02"
    (shard / "judgment_base.parquet").unlink()
    with pytest.raises(StageIncomplete, match=f"shard 02's judgments have no base .*remove the folder {re.escape(str(shard))}"):
        run_global(runtime, invalidated)
    shutil.rmtree(shard)
    run_global(runtime, catalog.stage("judged_pairs"), "02")
    run_global(runtime, invalidated)
    after = ParquetStore(home).read(ParquetStore(home).global_path("invalidated_events", "invalidation_judgments"))
    assert after.num_rows > 0 and _in_order(after.replace_schema_metadata(None)).equals(_in_order(before.replace_schema_metadata(None)))


@needs_corpus
def test_facts_archived_by_a_new_quarter_leave_the_facts_in_place_as_a_fresh_publish_leaves_them(two_companies, tmp_path,
                                                                                                 monkeypatch):
    """With archiving on, a new call moves "now" forward, so opinions and predictions pass
    their time-to-live: the publish moves their rows from `facts` to `facts_archive` in place,
    and the file equals a fresh publish of the same store."""
    settings = tmp_path / "retention.yaml"
    settings.write_text(yaml.safe_dump({"enabled": True, "ttl_days": {"OPINION": 400, "PREDICTION": 400}}))
    monkeypatch.setenv("TKG_RETENTION", str(settings))
    newest = max(path.name for path in (two_companies / "parquet" / "transcripts").glob("company=*/quarter=*"))
    home = tmp_path / "home"
    shutil.copytree(two_companies, home, ignore=lambda folder, names: [name for name in names if name == newest])
    finish_graph(_runtime(home, 3), publish_to=home / "tkg.duckdb")

    def archived() -> set[str]:
        with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
            return {event for (event,) in connection.execute("SELECT DISTINCT event_id FROM facts_archive").fetchall()}

    before = archived()
    assert before  # the time-to-live archives facts already
    for folder in (two_companies / "parquet").glob(f"*/company=*/{newest}"):
        shutil.copytree(folder, home / folder.relative_to(two_companies))
    report = finish_graph(_runtime(home, 3), publish_to=home / "tkg.duckdb")
    after = archived()
    assert before < after  # archived by the new quarter, and none brought back
    replaced = re.match(r"([\d,]+) event\(s\) replaced", report.publish.in_place["facts"])
    assert replaced and int(replaced[1].replace(",", "")) >= len(after - before)
    with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
        left = connection.execute("SELECT count(*) FROM facts WHERE event_id IN (SELECT event_id FROM facts_archive)").fetchall()
    assert left == [(0,)]
    fresh = publish(ParquetStore(home), tmp_path / "fresh.duckdb", raw_tables())
    assert fresh.in_place == {}
    assert published_rows(home / "tkg.duckdb") == published_rows(fresh.path)
