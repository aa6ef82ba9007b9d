"""The facts invalidation compares and their blocks, split by shard: the `fact_blocks` step.

A fact is a FACT, non-ATEMPORAL event with triplets. Its links are the (canonical entity,
predicate group) of its triplets' subjects and objects; a link shared by two facts or more is a
block, compared in the shard a stable hash of the block names. The step writes each shard's
facts (with their text and exact vectors), block members and canonical triplets
(tkg.store.splits).

A first run reads every fact. A run after one (the same code and settings, with its memos)
reads what changed since. A fact's rows depend on its partition's events and triplets, on how
its triplets' entities resolve (their canonical id and name), and on which of its links are
blocks. So the facts written again are
- the dirty ones: of a partition whose events or triplets changed, came or went, or with a
  triplet whose subject's or object's resolution changed (a merge, a split, a new name);
- the facts of a link whose count of facts crossed two: a dirty fact joined or left it, so it
  became a block or stopped being one.
Every other fact keeps its rows: its links are the same, and each of them is still a block or
still is not. The rows written again replace the affected facts' rows of the last version
(`Replaced`), so the result is the rows a first run writes.

Three memos hold what the next run compares with (tables.FACT_LINKS, FACT_ENTITIES,
FACT_PARTITIONS): every fact's links with its partition, every entity's resolution (hashed),
and every partition's file versions with its number of facts.
"""

from __future__ import annotations

import uuid
from collections import Counter
from contextlib import suppress
from datetime import date
from typing import Any

import duckdb
import pyarrow as pa
from duckdb.sqltypes import BLOB, FLOAT

from tkg.core import tables
from tkg.core.ids import short_version
from tkg.core.results import StageJob, StageResult
from tkg.invalidate.candidates import vector_blobs
from tkg.invalidate.invalidation import LINKS_SQL, fact_event_parameters, fact_events_sql, register_predicate_groups
from tkg.store.manifest import scan, stamped_files
from tkg.store.packs import partition_rows
from tkg.store.parquet import partition_of
from tkg.store.splits import Replaced, SplitRows
from tkg.store.warehouse import apply_model, model

# What the facts split copies from the events, the bulk of its bytes, as SQL over them: the
# statement, and the embedding as its exact vector (rounded once here, for every shard step
# that reads it). A fact's row is told changed or not by the version of the partition file
# they come from, not by reading them.
HEAVY_FACT_COLUMNS = {"statement": "e.statement", "vector": "vector_blob(e.embedding) AS vector"}
LIGHT_FACT_COLUMNS = tuple(name for name in tables.FACTS.names if name not in HEAVY_FACT_COLUMNS)


def sql_version() -> str:
    """A version of the SQL a fact's rows are made with (the `triplets` model, the facts' query,
    the links'): part of the step's code version, so a change to it reads every fact again
    rather than only the dirty ones."""
    return short_version(model("triplets").sha256, fact_events_sql(), LINKS_SQL)


def shard_sql(key_sql: str, shards: int) -> str:
    """A DuckDB expression: the shard ('00', '01', ...) of a key, a stable hash (md5) of its text."""
    width = max(2, len(str(shards - 1)))
    return f"lpad(CAST((('0x' || left(md5({key_sql}), 8))::UBIGINT % {shards}) AS VARCHAR), {width}, '0')"


def partition_view(job: StageJob, name: str, asset: str, schema: pa.Schema) -> None:
    """View `name` over every partition of `asset`, its light columns (tkg.store.packs; empty,
    with `schema`'s, before there is one)."""
    partition_rows(job.store, job.connection, asset, schema).create_view(name, replace=True)


def raw_view(job: StageJob, name: str, schema: pa.Schema, files: list | None = None) -> None:
    """`raw.<name>` over the files of a global stage, or over every partition of the stage
    `name` (its light columns, tkg.store.packs) when no files are given; empty, with `schema`,
    when there are none."""
    job.connection.execute("CREATE SCHEMA IF NOT EXISTS raw")
    if files is None:
        relation = partition_rows(job.store, job.connection, name, schema)
    else:
        relation = scan(job.store, job.connection, files) if files else job.connection.from_arrow(schema.empty_table())
    relation.create_view(f"_raw_{name}", replace=True)
    job.connection.execute(f"CREATE OR REPLACE VIEW raw.{name} AS SELECT * FROM _raw_{name}")


def count_rows(connection: duckdb.DuckDBPyConnection, table: str) -> int:
    return connection.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]


def register_vector_blobs(connection: duckdb.DuckDBPyConnection) -> None:
    """SQL function `vector_blob(embedding)`: tkg.invalidate.candidates.vector_blobs, a vector
    of DuckDB rows at a time."""
    with suppress(duckdb.InvalidInputException):  # registered before on this connection
        connection.remove_function("vector_blob")
    connection.create_function("vector_blob", vector_blobs, [duckdb.list_type(FLOAT)], BLOB, type="arrow")


def fact_blocks(job: StageJob) -> StageResult:
    """The facts and their blocks, split by shard: every fact on a first run, the facts whose
    rows may have changed on a run after one (see the module docstring)."""
    connection = job.connection
    raw_view(job, "triplets", tables.TRIPLETS)
    raw_view(job, "entity_resolution", tables.ENTITY_RESOLUTION,
             [job.store.global_path("canonical_entities", "entity_resolution")])
    raw_view(job, "canonical_entities", tables.CANONICAL_ENTITIES, [job.store.global_path("canonical_entities")])
    apply_model(connection, model("triplets"), record=False)  # the view `triplets`, canonical ids and names
    partition_view(job, "all_events", "temporal_events", tables.EVENTS)
    register_predicate_groups(connection)
    register_vector_blobs(connection)
    connection.register("partition_sources", _partition_sources(job))
    # each entity's resolution as a fact's rows read it: its canonical id and that entity's name
    connection.execute("""CREATE TEMP TABLE entity_states AS
                          SELECT hash(r.entity_id) AS entity_hash, hash(r.canonical_id, c.name) AS resolution_hash
                          FROM raw.entity_resolution r LEFT JOIN raw.canonical_entities c USING (canonical_id)""")
    # two entities of one hash (a duplicate id, or a collision) cannot be told apart: the next run reads every fact
    unique = connection.execute("SELECT count(*) = count(DISTINCT entity_hash) FROM entity_states").fetchall()[0][0]
    previous = _memos(job) if unique else None
    counts = _changed_facts(job, previous) if previous is not None else _every_fact(job)
    summary = connection.sql("SELECT shard::INTEGER AS shard, table_name, rows FROM summary ORDER BY ALL"
                             ).to_arrow_table().cast(tables.SHARD_SUMMARY)
    hashed = (*LIGHT_FACT_COLUMNS, "_source")
    if previous is None:
        # the rows without their text and vectors (what tells a changed row from an unchanged
        # one), read whole only for the rows written
        light = ", ".join(f"f.{name}" for name in LIGHT_FACT_COLUMNS)
        facts = SplitRows(connection.sql(f"""SELECT {light}, s.shard, c.source AS _source FROM facts f
                                             JOIN fact_shards s USING (event_id) JOIN fact_sources c USING (event_id)"""),
                          hashed=hashed, rows_for=lambda wanted: _whole_facts(job, wanted))
        replaced = None
    else:  # the affected facts' rows, whole, in place of theirs in the last version
        replaced = Replaced("event_id", "affected")
        facts = SplitRows(_whole_facts(job, "fact_shards"), hashed=hashed, replaces=replaced)
    splits = {
        "facts": facts,
        "members": SplitRows(connection.sql(f"SELECT {', '.join(tables.BLOCK_MEMBERS.names)}, shard FROM members"),
                             replaces=replaced),
        "triplets": SplitRows(connection.sql(f"""SELECT {', '.join('t.' + name for name in tables.RESOLVED_TRIPLETS.names)}, s.shard
                                                  FROM resolved_triplets t JOIN fact_shards s USING (event_id)"""),
                              replaces=replaced),
    }
    totals = dict(connection.execute("SELECT table_name, sum(rows)::BIGINT FROM summary GROUP BY ALL").fetchall())
    counts.update({"fact_events": connection.execute("SELECT coalesce(sum(facts), 0)::BIGINT FROM partitions_now").fetchall()[0][0],
                   "block_memberships": totals.get("members", 0), "blocks": totals.get("blocks", 0)})
    memos = {"fact_links": connection.table("links_now"), "fact_entities": connection.table("entity_states"),
             "fact_partitions": connection.table("partitions_now")}
    if not unique:  # none: every entity is new to the next run
        memos["fact_entities"] = tables.FACT_ENTITIES.empty_table()
    return StageResult(summary, tables={"fact_blocks": summary, **memos}, counts=counts, shard_tables=splits)


def _memos(job: StageJob) -> dict[str, Any] | None:
    """The last output's summary and memos, when it has them all (a run after a first one)."""
    names = ("fact_blocks", "fact_links", "fact_entities", "fact_partitions")
    if not all(name in job.previous for name in names):
        return None
    return {name: job.store.relation(job.connection, [job.previous[name]]) for name in names}


def _facts_and_links(connection: duckdb.DuckDBPyConnection, chosen: str | None) -> None:
    """Temp tables `resolved_triplets`, `facts` and `links` of the events in table `chosen`
    (its `event_id`), or of every event. The raw views the `triplets` model reads are narrowed
    to the chosen events' triplets and entities first."""
    if chosen is None:
        events = "all_events"
    else:
        connection.execute(f"CREATE OR REPLACE TEMP TABLE chosen_triplets AS SELECT * FROM _raw_triplets SEMI JOIN {chosen} USING (event_id)")
        connection.execute("""CREATE OR REPLACE TEMP TABLE chosen_resolution AS SELECT * FROM _raw_entity_resolution
                              WHERE entity_id IN (SELECT subject_entity_id FROM chosen_triplets
                                                  UNION ALL SELECT object_entity_id FROM chosen_triplets)""")
        connection.execute("CREATE OR REPLACE VIEW raw.triplets AS SELECT * FROM chosen_triplets")
        connection.execute("CREATE OR REPLACE VIEW raw.entity_resolution AS SELECT * FROM chosen_resolution")
        connection.execute(f"CREATE OR REPLACE TEMP TABLE chosen_events AS SELECT * FROM all_events SEMI JOIN {chosen} USING (event_id)")
        events = "chosen_events"
    connection.execute(f"CREATE OR REPLACE TEMP VIEW events AS SELECT * FROM {events}")
    # resolved once: the facts' keys, their links and the split all read it
    connection.execute(f"CREATE OR REPLACE TEMP TABLE resolved_triplets AS SELECT {', '.join(tables.RESOLVED_TRIPLETS.names)} FROM triplets")
    # the facts without their text and vectors (the bulk of their bytes), which only the split
    # reads, from the partitions' files (`_whole_facts`)
    connection.execute(f"CREATE OR REPLACE TEMP TABLE facts AS {fact_events_sql()}", fact_event_parameters())
    connection.execute(f"CREATE OR REPLACE TEMP TABLE links AS {LINKS_SQL}")


def _members_sql(links: str, events: str | None, shards: int) -> str:
    """The block members (with their shard) among `links` of the events in table `events`, or of
    every event: their links that two events or more of `links` share."""
    shard = shard_sql("canonical_id || '|' || predicate_group", shards)
    if events is None:
        return f"""
            WITH blocks AS (  -- a block's shard hashed once, not once per member
                SELECT canonical_id, predicate_group, {shard} AS shard
                FROM {links} GROUP BY canonical_id, predicate_group HAVING count(DISTINCT event_id) > 1)
            SELECT l.canonical_id, l.predicate_group, l.event_id, b.shard
            FROM {links} l JOIN blocks b USING (canonical_id, predicate_group)"""
    return f"""
        WITH mine AS (SELECT canonical_id, predicate_group, event_id FROM {links} SEMI JOIN {events} USING (event_id)),
        blocks AS (
            SELECT canonical_id, predicate_group, {shard} AS shard
            FROM {links} SEMI JOIN (SELECT DISTINCT canonical_id, predicate_group FROM mine) USING (canonical_id, predicate_group)
            GROUP BY canonical_id, predicate_group HAVING count(DISTINCT event_id) > 1)
        SELECT m.canonical_id, m.predicate_group, m.event_id, b.shard FROM mine m JOIN blocks b USING (canonical_id, predicate_group)"""


def _every_fact(job: StageJob) -> Counter:
    """Every fact read (a first run): temp tables `facts`, `resolved_triplets`, `members`,
    `fact_shards`, `fact_sources`, the memos' `links_now` and `partitions_now`, and `summary`."""
    connection, shards = job.connection, job.shards
    _facts_and_links(connection, None)
    _members_and_sources(connection, "links", None, shards)
    connection.execute("""CREATE TEMP TABLE links_now AS
                          SELECT l.event_id, l.canonical_id, l.predicate_group, f.company, f.quarter FROM links l JOIN facts f USING (event_id)""")
    connection.execute("""CREATE TEMP TABLE partitions_now AS
                          SELECT p.*, coalesce(f.facts, 0) AS facts FROM partition_sources p
                          LEFT JOIN (SELECT company, quarter, count(*) AS facts FROM facts GROUP BY ALL) f USING (company, quarter)""")
    connection.execute(f"""
        CREATE TEMP TABLE summary AS
        SELECT shard, 'members' AS table_name, count(*) AS rows FROM members GROUP BY shard
        UNION ALL SELECT shard, 'facts', count(*) FROM fact_shards GROUP BY shard
        UNION ALL SELECT shard, 'blocks', count(*) FROM (SELECT DISTINCT shard, canonical_id, predicate_group FROM members) GROUP BY shard""")
    return Counter(fact_events_read=count_rows(connection, "facts"), fact_blocks_read_whole=1)


def _changed_facts(job: StageJob, previous: dict[str, Any]) -> Counter:
    """The facts whose rows may have changed since the last output (see the module docstring),
    read alone: the same temp tables as `_every_fact`, of the affected facts (table `affected`),
    and every fact's memos."""
    connection, shards = job.connection, job.shards
    for name, relation in previous.items():
        relation.create_view(f"last_{name}", replace=True)
    connection.execute("""CREATE TEMP TABLE changed_partitions AS
                          SELECT company, quarter FROM partition_sources n FULL JOIN last_fact_partitions o USING (company, quarter)
                          WHERE n.events_source IS DISTINCT FROM o.events_source OR n.triplets_source IS DISTINCT FROM o.triplets_source
                             OR n.company IS NULL OR o.company IS NULL""")
    connection.execute("""CREATE TEMP TABLE changed_entities AS
                          SELECT coalesce(n.entity_hash, o.entity_hash) AS entity_hash
                          FROM entity_states n FULL JOIN last_fact_entities o USING (entity_hash)
                          WHERE n.resolution_hash IS DISTINCT FROM o.resolution_hash OR n.entity_hash IS NULL OR o.entity_hash IS NULL""")
    # dirty: the facts (and events) of changed partitions, then and now; the events of a
    # partition without a file (read with a new source each time, as a first run reads them);
    # and the events with a triplet whose entity resolves differently
    parts = ["SELECT event_id FROM last_fact_links SEMI JOIN changed_partitions USING (company, quarter)",
             "SELECT event_id FROM all_events SEMI JOIN changed_partitions USING (company, quarter)",
             "SELECT event_id FROM all_events ANTI JOIN (SELECT company, quarter FROM partition_sources "
             "WHERE events_source IS NOT NULL) USING (company, quarter)"]
    if count_rows(connection, "changed_entities"):
        parts += [f"SELECT event_id FROM _raw_triplets WHERE hash({column}) IN (SELECT entity_hash FROM changed_entities)"
                  for column in ("subject_entity_id", "object_entity_id")]
    connection.execute(f"CREATE TEMP TABLE dirty AS SELECT DISTINCT event_id FROM ({' UNION ALL '.join(parts)})")
    _facts_and_links(connection, "dirty")
    connection.execute("""CREATE TEMP TABLE links_now AS
                          SELECT * FROM last_fact_links ANTI JOIN dirty USING (event_id)
                          UNION ALL SELECT l.event_id, l.canonical_id, l.predicate_group, f.company, f.quarter
                                    FROM links l JOIN facts f USING (event_id)""")
    # the links a dirty fact had or has, with their facts' count then and now: one that crossed
    # two became a block or stopped being one, for every fact of it
    shard = shard_sql("canonical_id || '|' || predicate_group", shards)
    connection.execute(f"""
        CREATE TEMP TABLE touched AS
        WITH blocks AS (SELECT DISTINCT canonical_id, predicate_group FROM (
                            SELECT canonical_id, predicate_group FROM last_fact_links SEMI JOIN dirty USING (event_id)
                            UNION ALL SELECT canonical_id, predicate_group FROM links))
        SELECT b.canonical_id, b.predicate_group, {shard} AS shard,
               coalesce(t.facts, 0) AS facts_then, coalesce(n.facts, 0) AS facts_now
        FROM blocks b
        LEFT JOIN (SELECT canonical_id, predicate_group, count(DISTINCT event_id) AS facts FROM last_fact_links
                   SEMI JOIN blocks USING (canonical_id, predicate_group) GROUP BY ALL) t USING (canonical_id, predicate_group)
        LEFT JOIN (SELECT canonical_id, predicate_group, count(DISTINCT event_id) AS facts FROM links_now
                   SEMI JOIN blocks USING (canonical_id, predicate_group) GROUP BY ALL) n USING (canonical_id, predicate_group)""")
    connection.execute("""
        CREATE TEMP TABLE affected AS
        SELECT event_id FROM dirty
        UNION SELECT event_id FROM links_now
              SEMI JOIN (SELECT * FROM touched WHERE (facts_then > 1) != (facts_now > 1)) USING (canonical_id, predicate_group)""")
    crossing = count_rows(connection, "affected") - count_rows(connection, "dirty")
    if crossing:  # their rows whole too (their links are the same: the chosen events' are read again)
        _facts_and_links(connection, "affected")
    _members_and_sources(connection, "links_now", "affected", shards)
    connection.execute(f"CREATE TEMP TABLE members_then AS {_members_sql('last_fact_links', 'affected', shards)}")
    connection.execute("""CREATE TEMP TABLE partitions_now AS
                          SELECT p.*, CASE WHEN x.company IS NULL THEN coalesce(o.facts, 0) ELSE coalesce(c.facts, 0) END AS facts
                          FROM partition_sources p
                          LEFT JOIN changed_partitions x USING (company, quarter)
                          LEFT JOIN last_fact_partitions o USING (company, quarter)
                          LEFT JOIN (SELECT company, quarter, count(*) AS facts FROM facts GROUP BY ALL) c USING (company, quarter)""")
    # the summary: the last one, less the affected facts' rows then, plus theirs now
    connection.execute("""
        CREATE TEMP TABLE summary AS
        SELECT shard, table_name, sum(rows)::BIGINT AS rows FROM (
            SELECT shard, table_name, rows FROM last_fact_blocks
            UNION ALL SELECT shard::INTEGER, 'members', count(*) FROM members GROUP BY shard
            UNION ALL SELECT shard::INTEGER, 'members', -count(*) FROM members_then GROUP BY shard
            UNION ALL SELECT shard::INTEGER, 'facts', count(*) FROM fact_shards GROUP BY shard
            UNION ALL SELECT shard::INTEGER, 'facts', -count(*) FROM (SELECT DISTINCT event_id, shard FROM members_then) GROUP BY shard
            UNION ALL SELECT shard::INTEGER, 'blocks', count(*) FILTER (facts_now > 1) - count(*) FILTER (facts_then > 1)
                      FROM touched GROUP BY shard)
        GROUP BY shard, table_name HAVING sum(rows) != 0""")
    return Counter(fact_events_read=count_rows(connection, "facts"), fact_events_dirty=count_rows(connection, "dirty"),
                   fact_events_crossing=crossing, entities_resolved_again=count_rows(connection, "changed_entities"),
                   fact_partitions_changed=count_rows(connection, "changed_partitions"))


def _members_and_sources(connection: duckdb.DuckDBPyConnection, links: str, events: str | None, shards: int) -> None:
    """Temp tables `members` (of the events in `events`, or of every event, `_members_sql`),
    `fact_shards` (each fact's shards) and `fact_sources`: each fact's source, the version of
    the partition file its text and vector are read from (an event whose file is not found by
    its company and quarter gets a source of this run's: changed)."""
    connection.execute(f"CREATE TEMP TABLE members AS {_members_sql(links, events, shards)}")
    connection.execute("CREATE TEMP TABLE fact_shards AS SELECT DISTINCT event_id, shard FROM members")
    connection.execute("""CREATE OR REPLACE TEMP TABLE fact_sources AS
                          SELECT f.event_id, f.company, f.quarter, coalesce(v.events_source, $unmatched) AS source
                          FROM facts f LEFT JOIN partition_sources v USING (company, quarter)""",
                       {"unmatched": f"unmatched:{uuid.uuid4()}"})


def _whole_facts(job: StageJob, wanted: str) -> Any:
    """The facts rows (with their shard and source) of the partitions that hold the facts in
    table `wanted`, with their text and vectors read from those partitions' files alone (the
    split keeps the rows it wants of them)."""
    store, connection = job.store, job.connection
    partitions = connection.execute(f"SELECT DISTINCT company, quarter FROM fact_sources SEMI JOIN {wanted} "
                                    "USING (event_id) ORDER BY ALL").fetchall()
    files = [store.partition_path("temporal_events", company, quarter) for company, quarter in partitions]
    (scan(store, connection, files) if files else connection.from_arrow(tables.EVENTS.empty_table())
     ).create_view("wanted_events", replace=True)
    whole = ", ".join(HEAVY_FACT_COLUMNS.get(name, f"f.{name}") for name in tables.FACTS.names)
    return connection.sql(f"""SELECT {whole}, s.shard, c.source AS _source
                              FROM facts f JOIN fact_shards s USING (event_id) JOIN fact_sources c USING (event_id)
                              JOIN wanted_events e USING (event_id)""")


def _partition_sources(job: StageJob) -> pa.Table:
    """(company, quarter, events_source, triplets_source): the version of each partition's
    temporal_events and triplets file, from its stamp (a file without one gets a source of its
    own each time, so its rows always count as changed)."""
    found: dict[tuple[str, date], dict[str, str]] = {}
    for asset in ("temporal_events", "triplets"):
        for listed in stamped_files(job.store, [asset]):
            company, quarter = partition_of(listed.path)
            source = listed.stamp.version if listed.stamp is not None else f"unstamped:{uuid.uuid4()}"
            found.setdefault((company, date.fromisoformat(quarter)), {})[asset] = source
    keys = sorted(found)
    return pa.table({"company": pa.array([company for company, _ in keys], pa.string()),
                     "quarter": pa.array([quarter for _, quarter in keys], pa.date32()),
                     "events_source": pa.array([found[key].get("temporal_events") for key in keys], pa.string()),
                     "triplets_source": pa.array([found[key].get("triplets") for key in keys], pa.string())})
