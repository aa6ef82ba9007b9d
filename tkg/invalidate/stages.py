"""The global half of invalidation and retention, as stages that scale past one process.

Comparisons happen inside blocks: the facts that share a canonical entity under a predicate
group. The blocks are split into shards by a stable hash of the block, and each heavy step runs
once per shard, on that shard's rows alone (one process, its memory bounded by its shard):

    fact_blocks (global)        the facts, their blocks and shards; each shard's facts, block
                                members and canonical triplets written in a folder of its own;
                                only the facts whose rows may have changed are read again
                                (tkg.invalidate.blocks)
    candidate_ranks (shard)     rank: each incoming fact's best candidate facts in the shard,
                                and which incoming facts' ranks changed since its last output;
                                stored as a base and the changes since it (`stack_ranks`)
    candidate_selection (global) select: each incoming fact's top k over every shard, sent to
                                the shard of the smallest block holding both (the exact merge of
                                an event whose blocks span shards); only the facts whose ranks
                                changed are selected again
    judged_pairs (shard)        pair and judge: each primary's earliest retirer in the shard; only
                                the units (two facts) whose selected rows or events changed are
                                paired again, and only the pairs whose events changed are judged;
                                stored as a base and the changes since it (`stack_judgments`)
    invalidated_events (global) retire: the earliest retirer over every shard (the exact merge
                                of a primary judged in several shards), and figure revisions;
                                only the guidance a changed figure may retire differently is
                                revised again (tkg.invalidate.revising)

Set work (joins, blocking, the merges) runs as DuckDB SQL that spills to disk past the step's
memory (TKG_STEP_MEMORY); embeddings are read only by the shard steps, for the facts they
compare (a block whose members did not change is told so by the hashes of their rows), as the
exact vectors `fact_blocks` rounded once for every step that reads them. An
entity merge or split in resolution moves facts between blocks, and so between shards:
`fact_blocks` reads again the facts of every entity that resolves differently, and puts them
in their blocks by the current canonical ids, so a moved fact is compared in its new blocks
and nowhere else. Results never depend on the number of shards.
"""

from __future__ import annotations

import uuid
from collections import Counter

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from tkg.core import policy, tables
from tkg.core.results import StageIncomplete, StageJob, StageResult
from tkg.core.versions import stamp_of_schema
from tkg.invalidate.blocks import count_rows, partition_view, raw_view, shard_sql
from tkg.invalidate.candidates import merge_ranks, pair_candidates, rank_candidates, select_ranked
from tkg.invalidate.invalidation import (
    EARLIEST_RETIRER_SQL,
    involved_events,
    judge_pairs,
    retirements,
)
from tkg.invalidate.positions import (
    ABSENCE,
    LISTINGS_SQL,
    Listing,
    STATEMENT,
    PositionEnd,
    end_positions,
    listing_table,
    listings_from_rows,
)
from tkg.invalidate.retention import retention_settings, score_facts
from tkg.invalidate.revising import RevisedFigures, revise_since
from tkg.invalidate.revisions import READ_COLUMNS, READ_SCHEMA
from tkg.store.manifest import scan
from tkg.store.packs import packed, partition_rows
from tkg.store.parquet import relation_batches
from tkg.store.splits import ROW_HASH, Replaced, SplitRows, shard_changes_since, shard_rows, version_rows
from tkg.store.warehouse import apply_model, model

# Bump when the phases change how they split, rank, select or pair.
INVALIDATION_VERSION = "sharded-invalidation-6"
# Bump when a shard's judgments change what they store for the shard's next run (judged_pairs).
PAIRS_VERSION = "shard-judgments-3"
# Bump when the rules of tkg.invalidate.positions change.
POSITIONS_VERSION = "positions-8"


def _split(job: StageJob, asset: str, table: str, schema: pa.Schema, chosen_sql: str = "") -> pa.Table:
    """This job's shard of a table a global step split by shard, as `schema`: every row, or the
    rows `chosen_sql` (a join on the shard's rows, `_rows`) keeps."""
    rows = shard_rows(job.store, job.connection, asset, job.versions[asset], table, job.shard, schema.names)
    if rows is None:
        return schema.empty_table()
    rows.create_view("_rows", replace=True)
    return job.connection.sql(f"SELECT * FROM _rows {chosen_sql}").to_arrow_table().cast(schema)


def candidate_ranks(job: StageJob) -> StageResult:
    """Rank, in one shard: each incoming fact's best candidate facts per type in each of the
    shard's blocks. A block's ranks depend on its members alone, and each member's fact has a
    fingerprint (`ranked_members`), so against the shard's last output a block is
    - kept: the same members with the same fingerprints; its rows are kept;
    - grown: every earlier member unchanged, and new ones (a new quarter's facts): only the
      pairs with a new member are ranked, and merged with its earlier rows (`merge_ranks`);
    - ranked in full otherwise (a member changed or left, or the block is new).
    The ranks are written as changes on the last output's base (`stack_ranks`)."""
    connection, rules, store = job.connection, policy.POLICY, job.store
    # a fact's fingerprint is its row's hash in the split (which stands for its vector too), so
    # the vectors are read only for the facts of the blocks ranked now
    fact_hashes = shard_rows(job.store, connection, "fact_blocks", job.versions["fact_blocks"], "facts", job.shard,
                             ["event_id", ROW_HASH])
    if fact_hashes is None:
        fact_hashes = connection.from_arrow(pa.table({"event_id": pa.array([], pa.string()), ROW_HASH: pa.array([], pa.uint64())}))
    fact_hashes.create_view("fact_hashes", replace=True)
    members = _split(job, "fact_blocks", "members", tables.BLOCK_MEMBERS)
    connection.register("shard_members", members)
    ranked_members = connection.sql(f"""
        SELECT m.canonical_id, m.predicate_group, m.event_id, f.{ROW_HASH} AS fingerprint
        FROM shard_members m JOIN fact_hashes f USING (event_id)""").to_arrow_table().cast(tables.RANKED_MEMBERS)
    connection.register("current_members", ranked_members)
    folder = store.shard_path("candidate_ranks", job.shard).parent
    if job.previous:
        store.relation(connection, [job.previous["ranked_members"]]).create_view("previous_members", replace=True)
        base = stack_ranks(store, connection, [job.shard], "previous_ranks", "candidate_ranks")[job.shard]
    else:
        connection.from_arrow(tables.RANKED_MEMBERS.empty_table()).create_view("previous_members", replace=True)
        connection.from_arrow(tables.CANDIDATE_RANKS.empty_table()).create_view("previous_ranks", replace=True)
        base = None
    _drop_bases(store, folder, keep=base)
    connection.execute("""
        CREATE TEMP TABLE block_states AS
        WITH now AS (SELECT canonical_id, predicate_group, count(*) AS members FROM current_members GROUP BY ALL),
             before AS (SELECT canonical_id, predicate_group, count(*) AS members FROM previous_members GROUP BY ALL),
             same AS (SELECT canonical_id, predicate_group, count(*) AS members FROM current_members
                      JOIN previous_members USING (canonical_id, predicate_group, event_id, fingerprint) GROUP BY ALL)
        SELECT canonical_id, predicate_group,
               CASE WHEN same.members = before.members AND same.members = now.members THEN 'kept'
                    WHEN same.members = before.members THEN 'grown' ELSE 'ranked' END AS state
        FROM now LEFT JOIN before USING (canonical_id, predicate_group) LEFT JOIN same USING (canonical_id, predicate_group)""")
    connection.execute("""
        CREATE TEMP TABLE reranked AS
        SELECT m.event_id, m.canonical_id, m.predicate_group, b.state,
               p.event_id IS NULL AS fresh
        FROM current_members m JOIN block_states b USING (canonical_id, predicate_group)
        LEFT JOIN previous_members p USING (canonical_id, predicate_group, event_id)
        WHERE b.state <> 'kept'""")
    facts = _split(job, "fact_blocks", "facts", tables.RANKED_FACTS, "SEMI JOIN reranked USING (event_id)")
    connection.register("reranked_facts", facts)
    parts = {}
    for state in ("ranked", "grown"):
        links = connection.sql("SELECT event_id, canonical_id, predicate_group, fresh FROM reranked WHERE state = $state "
                               "ORDER BY ALL", params={"state": state}).to_arrow_table()
        connection.register("part_links", links)
        part_facts = connection.sql("SELECT * FROM reranked_facts SEMI JOIN part_links USING (event_id)").to_arrow_table()
        parts[state] = rank_candidates(part_facts.cast(tables.RANKED_FACTS), links, rules.min_cosine, rules.top_k,
                                       fresh="fresh" if state == "grown" else None)
    connection.register("ranked_in_full", parts["ranked"])
    connection.register("grown_delta", parts["grown"])
    # an earlier block's rows, kept as they are unless a new member gave an incoming event new
    # candidates (then merged with them); most of a grown block's old events reach no new one
    connection.execute(f"""
        CREATE TEMP VIEW previous_kept AS
        SELECT {', '.join('r.' + name for name in tables.CANDIDATE_RANKS.names)} FROM previous_ranks r
        JOIN block_states b ON r.block_entity = b.canonical_id AND r.block_group = b.predicate_group
        WHERE b.state IN ('kept', 'grown')""")
    connection.execute("""CREATE TEMP TABLE touched AS
                          SELECT DISTINCT block_entity, block_group, incoming_event_id, candidate_dynamic FROM grown_delta""")
    connection.execute("""
        CREATE TEMP VIEW touched_parts AS
        SELECT * FROM previous_kept SEMI JOIN touched USING (block_entity, block_group, incoming_event_id, candidate_dynamic)
        UNION ALL SELECT * FROM grown_delta""")
    connection.register("merged", merge_ranks(connection, "touched_parts", rules.top_k).to_arrow_table())
    connection.execute("""
        CREATE TEMP VIEW ranks_now AS
        SELECT * FROM previous_kept ANTI JOIN touched USING (block_entity, block_group, incoming_event_id, candidate_dynamic)
        UNION ALL SELECT * FROM ranked_in_full
        UNION ALL SELECT * FROM merged""")
    # the incoming events whose rows are not the last output's: of blocks ranked in full, merged
    # with a new member's pairs, or gone (an earlier row of a block neither kept nor grown)
    changed = connection.sql("""
        SELECT incoming_event_id FROM ranked_in_full UNION SELECT incoming_event_id FROM touched
        UNION SELECT r.incoming_event_id FROM previous_ranks r ANTI JOIN block_states b
              ON r.block_entity = b.canonical_id AND r.block_group = b.predicate_group AND b.state IN ('kept', 'grown')
        ORDER BY incoming_event_id""").to_arrow_table().column(0)
    connection.register("changed_now", pa.table({"incoming_event_id": changed}))
    since = store.stamp(job.previous["candidate_ranks"]).version if job.previous else None
    rank_changes = pa.table({"since_version": pa.array([since] * (len(changed) + 1), pa.string()),
                             "incoming_event_id": pa.concat_arrays([pa.nulls(1, pa.string()), *changed.cast(pa.string()).chunks])})
    last_base = base
    base, changes, ranked = _ranks_written(store, connection, folder, job.shard, base)
    states = dict(connection.execute("SELECT state, count(*) FROM block_states GROUP BY state").fetchall())
    return StageResult(tables.CANDIDATE_RANKS.empty_table(), rows=ranked,
                       tables={"ranked_members": ranked_members, "rank_changes": rank_changes,
                               "rank_base": _base_table(base),
                               "candidate_ranks": changes},
                       counts=Counter({"facts": count_rows(connection, "fact_hashes"), "facts_read": facts.num_rows,
                                       "ranked": ranked, "blocks": sum(states.values()),
                                       "blocks_kept": states.get("kept", 0), "blocks_grown": states.get("grown", 0),
                                       "blocks_ranked": states.get("ranked", 0), "incoming_changed": len(changed),
                                       "ranks_written_whole": int(base is not last_base)}))


# A shard's candidate ranks are stored as a base and the changes since it. The base holds every
# row as ranked when the shard was last written whole (`v=<id>/candidate_ranks.parquet` in the
# shard's folder, named by its `rank_base`). The shard's `candidate_ranks` holds, for each incoming
# event whose rows changed since then, a row naming it (its fact_key NULL) and its rows now. So a
# quarter writes the rows it changed, not the shard's every row (1.2 million at 5M events), and the
# shard is written whole again once its changes hold more than RANKS_DELTA_SHARE of the base's rows.
RANKS_DELTA_SHARE = 0.25
RANK_COLUMNS = ", ".join(tables.CANDIDATE_RANKS.names)
# A base's rows carry their shard: the selection reads every shard's base in one scan, and drops
# the rows of the incoming facts each shard's changes replace by (shard, incoming fact).
BASE_RANKS = pa.schema([*tables.CANDIDATE_RANKS, ("_shard", pa.string())])
_RANK_ORDER = "ORDER BY block_entity, block_group, incoming_event_id, candidate_dynamic, fact_key"


def stack_ranks(store, connection: duckdb.DuckDBPyConnection, shards: list[str], name: str, reader: str
                ) -> dict[str, dict | None]:
    """View `name`: the candidate ranks of `shards` as stored. Every shard's base (or the file of
    every row an older tkg wrote) in one scan (`{name}_whole`), less the incoming events each
    shard's changes replace, and the changes' rows (`{name}_changes`). Returns each shard's base
    (its `rank_base` row; None for an older tkg's file). A shard whose rank_base is of another
    run than its candidate_ranks (a run stopped between the two) stops `reader`."""
    whole, changes, replaced, bases = [], [], [], {}
    for shard in shards:
        path = store.shard_path("candidate_ranks", shard)
        bases[shard] = _shard_base(store, "candidate_ranks", shard, "candidate_ranks", "rank_base", reader)
        if bases[shard] is None:
            whole.append(path)
            continue
        whole.append(path.parent / bases[shard]["file"])
        if store.metadata(path).num_rows:
            changes.append(path)
            ids = store.relation(connection, [path]).filter("fact_key IS NULL").select("incoming_event_id").to_arrow_table()
            replaced.append(ids.append_column("_shard", pa.array([shard] * ids.num_rows, pa.string())))
    (store.relation(connection, whole) if whole else connection.from_arrow(tables.CANDIDATE_RANKS.empty_table())
     ).create_view(f"{name}_whole", replace=True)
    (store.relation(connection, changes) if changes else connection.from_arrow(tables.CANDIDATE_RANKS.empty_table())
     ).create_view(f"{name}_changes", replace=True)
    if not changes:
        connection.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT {RANK_COLUMNS} FROM {name}_whole")
        return bases
    connection.register(f"{name}_replaced", pa.concat_tables(replaced))
    connection.execute(f"""CREATE OR REPLACE TEMP VIEW {name} AS
                           SELECT {RANK_COLUMNS} FROM {name}_whole ANTI JOIN {name}_replaced USING (_shard, incoming_event_id)
                           UNION ALL SELECT {RANK_COLUMNS} FROM {name}_changes WHERE fact_key IS NOT NULL""")
    return bases


def _shard_base(store, asset: str, shard: str, table: str, base_table: str, reader: str) -> dict | None:
    """The base a shard's `table` (its changes) is stacked on: its `base_table` row (tables.SHARD_BASE),
    or None when there is none. A base of another run than the changes (a run that stopped between
    its files) stops `reader`."""
    path, base = store.shard_path(asset, shard, table), store.shard_path(asset, shard, base_table)
    if not store.is_file(base):
        return None
    if store.stamp(base) != store.stamp(path):
        raise StageIncomplete(reader, None, f"shard {shard}'s {table.replace('_', ' ')} are half-written (its {base_table} "
                              f"and {table} files are of two runs); run {asset} again")
    return store.read(base).to_pylist()[0]


def _base_table(base: dict) -> pa.Table:
    """A shard's `*_base` table: the one row naming its base (tables.SHARD_BASE)."""
    return pa.table({"file": [base["file"]], "rows": [base["rows"]]}, schema=tables.SHARD_BASE)


def _ranks_written(store, connection: duckdb.DuckDBPyConnection, folder, shard: str, base: dict | None
                   ) -> tuple[dict, pa.Table, int]:
    """The shard's ranks now (`ranks_now`) as a base and its changes (`stack_ranks`): on the last
    output's base (`base`, its views `previous_ranks_*`) with the changes of the incoming events
    in `changed_now` merged into its changes; or, without one or past RANKS_DELTA_SHARE of it, a
    new base of every row. Returns the base, the changes and the shard's rows."""
    if base is not None:
        connection.execute(f"""
            CREATE TEMP TABLE rank_changes_now AS
            SELECT {RANK_COLUMNS} FROM previous_ranks_changes ANTI JOIN changed_now USING (incoming_event_id)
            UNION ALL BY NAME SELECT incoming_event_id FROM changed_now  -- a row naming each (its other columns NULL)
            UNION ALL BY NAME SELECT {RANK_COLUMNS} FROM ranks_now SEMI JOIN changed_now USING (incoming_event_id)""")
        if count_rows(connection, "rank_changes_now") <= RANKS_DELTA_SHARE * base["rows"]:
            ranked = connection.execute(f"""
                SELECT (SELECT count(*) FROM previous_ranks_whole ANTI JOIN rank_changes_now USING (incoming_event_id))
                     + (SELECT count(*) FROM rank_changes_now WHERE fact_key IS NOT NULL)""").fetchall()[0][0]
            changes = connection.sql(f"SELECT * FROM rank_changes_now {_RANK_ORDER}").to_arrow_table()
            return base, changes.cast(tables.CANDIDATE_RANKS), ranked
    file = f"v={uuid.uuid4().hex[:16]}/candidate_ranks.parquet"
    rows = connection.sql(f"SELECT *, $shard AS _shard FROM ranks_now {_RANK_ORDER}", params={"shard": shard})
    written = store.write(folder / file, relation_batches(rows, BASE_RANKS))
    rows = store.metadata(written).num_rows
    return {"file": file, "rows": rows}, tables.CANDIDATE_RANKS.empty_table(), rows


def _drop_bases(store, folder, keep: dict | None) -> None:
    """Remove the shard's bases but `keep` (the last output's): ones its later outputs replaced,
    or that a run which failed before its output was written left."""
    kept = keep["file"].split("/", 1)[0] if keep else None
    for info in store.filesystem.get_file_info(pafs.FileSelector(str(folder), allow_not_found=True)):
        name = info.path.rsplit("/", 1)[-1]
        if info.type == pafs.FileType.Directory and name.startswith("v=") and name != kept:
            store.delete_folder(folder / name)


def candidate_selection(job: StageJob) -> StageResult:
    """Select, over every shard: each incoming fact's top k, sent to the shard that pairs it.

    An incoming fact's selection is a function of its rank rows in every shard. Each shard's
    ranks name the incoming facts whose rows changed since the shard's last output
    (`rank_changes`); when every shard's changes are since the ranks this step last read
    (`ranks_read`), only those facts are selected again and the others keep their rows from
    the step's last version. Otherwise (the first run, a shard whose ranks were rebuilt twice
    in between) every fact is selected."""
    store, connection = job.store, job.connection
    files = {shard: store.shard_path("candidate_ranks", shard) for shard in job.shard_keys
             if store.is_file(store.shard_path("candidate_ranks", shard))}
    read = {shard: store.stamp(path).version for shard, path in files.items()}
    stack_ranks(store, connection, list(files), "ranks", "candidate_selection")
    changed = _changed_incoming(job, read)
    top_k = policy.POLICY.top_k
    if changed is None:
        select_ranked(connection, "ranks", top_k).create_view("ranked", replace=True)
    else:
        connection.register("changed_incoming", changed)
        connection.execute("CREATE TEMP VIEW changed_ranks AS "
                           "SELECT * FROM ranks SEMI JOIN changed_incoming USING (incoming_event_id)")
        select_ranked(connection, "changed_ranks", top_k).create_view("ranked", replace=True)
    # computed once (the split and its summary both read it)
    connection.execute(f"""CREATE TEMP TABLE selected AS
                           SELECT *, {shard_sql("block_entity || '|' || block_group", job.shards)} AS shard FROM ranked""")
    counts = ["SELECT shard, count(*) AS rows FROM selected GROUP BY shard"]
    # the rows of the facts selected again replace theirs in the last version; the others' rows stand
    split = SplitRows(connection.sql("SELECT * FROM selected"),
                      replaces=None if changed is None else Replaced("incoming_event_id", "changed_incoming"))
    if changed is not None:
        earlier = version_rows(store, connection, "candidate_selection", store.stamp(job.previous["candidate_selection"]).version,
                               "selected", job.shard_keys, ["incoming_event_id"], "earlier_selected")
        if earlier:
            counts.append(f"SELECT shard, count(*) FROM {earlier} ANTI JOIN changed_incoming USING (incoming_event_id) "
                          "GROUP BY shard")
    summary = connection.sql(f"SELECT shard::INTEGER AS shard, 'selected' AS table_name, sum(rows)::BIGINT AS rows "
                             f"FROM ({' UNION ALL '.join(counts)}) GROUP BY shard HAVING sum(rows) > 0 ORDER BY shard"
                             ).to_arrow_table().cast(tables.SHARD_SUMMARY)
    ranks_read = pa.table({"shard": sorted(read), "version": [read[key] for key in sorted(read)]}, schema=tables.SHARDS_READ)
    return StageResult(summary, tables={"ranks_read": ranks_read, "candidate_selection": summary}, shard_tables={"selected": split},
                       counts=Counter({"selected": int(pc.sum(summary.column("rows")).as_py() or 0),
                                       "incoming_selected": count_rows(connection, "(SELECT DISTINCT incoming_event_id FROM selected)"),
                                       "selected_every_fact": int(changed is None)}))


def _changed_incoming(job: StageJob, read: dict[str, str]) -> pa.Table | None:
    """The incoming events whose ranks changed in some shard since this step's last output read
    them (`read`: each shard's ranks version now), or None when that cannot be told."""
    if not job.previous:
        return None
    store = job.store
    before = {row["shard"]: row["version"] for row in store.read(job.previous["ranks_read"]).to_pylist()}
    if before.keys() != read.keys():
        return None
    changes = []
    for shard, version in read.items():
        if version == before[shard]:
            continue
        path = store.shard_path("candidate_ranks", shard, "rank_changes")
        if not store.is_file(path):
            return None
        rows = store.read(path)
        stamp = stamp_of_schema(rows.schema)
        if stamp is None or stamp.version != version or rows.num_rows == 0 or rows["since_version"][0].as_py() != before[shard]:
            return None  # written by another run than the ranks read now, or not since the ranks read last
        changes.append(rows.column("incoming_event_id").drop_null())
    events = pa.chunked_array([chunk for column in changes for chunk in column.chunks], pa.string())
    return pa.table({"incoming_event_id": pc.unique(events) if len(events) else pa.array([], pa.string())})


def judged_pairs(job: StageJob) -> StageResult:
    """Pair and judge, in one shard: the judge pairs of the facts selected for this shard, the
    verdict on each, and each primary's earliest retirer.

    The pairs of two facts A and B (their events as primary and secondary, either way round)
    depend on the selected rows that link an event of one to the other alone, and on the
    events of A and B (tkg.invalidate.candidates.pair_candidates). So against the shard's last
    output, a unit {A, B} is paired again only when those rows changed or an event of A or B
    did (`paired_units`, `paired_events`); the pairs of every other unit are kept, and only the
    facts of the units paired again are read with their vectors. The rows that changed are the
    ones the selection wrote or deleted since the version the last output read (`versions_read`,
    CHANGED_UNITS_SQL); when its chain was folded since, every row's unit digest tells.

    A verdict depends on its pair alone (the rule judge judges each pair by itself; the LLM
    judge asks for a primary's candidates at once but keeps each verdict per pair,
    tkg.llm.extractor.LLMJudge), so a pair whose fingerprint (the pair, and what the judge reads
    of its two events) is the one it had in the last output keeps its verdict, and only the
    other pairs are judged: the pairs made again, and kept pairs whose events' triplets changed.
    Each judgment is stored with its fingerprint and its unit (tables.SHARD_JUDGMENTS), which
    the next run compares. The last output's judgments are read whole to find the few this run
    looks at again (TOUCHED_PAIRS_SQL), and once more for the earliest retirers; what is written
    is the changes since the shard's base (`stack_judgments`)."""
    connection, store = job.connection, job.store
    base = _previous_judgments(job)
    facts, paired, chained = _pairs_made_now(job)
    # the pairs to fingerprint: the ones made now, and the last output's that stand but whose events' triplets changed
    pair_columns = ", ".join(paired.schema.names)
    connection.execute(f"""CREATE TEMP TABLE shard_pairs AS SELECT {pair_columns} FROM paired_now
                           UNION ALL SELECT {pair_columns} FROM touched_pairs WHERE NOT dropped""")
    connection.execute("""CREATE TEMP TABLE pair_events AS SELECT primary_event_id AS event_id FROM shard_pairs
                          UNION SELECT secondary_event_id FROM shard_pairs""")
    connection.register("paired_facts", facts)
    more = _split(job, "fact_blocks", "facts", tables.FACTS,
                  "SEMI JOIN pair_events USING (event_id) ANTI JOIN paired_facts USING (event_id)")
    pair_facts = pa.concat_tables([facts, more]) if more.num_rows else facts
    connection.register("shard_facts", pair_facts)
    triplets = _split(job, "fact_blocks", "triplets", tables.RESOLVED_TRIPLETS, "SEMI JOIN pair_events USING (event_id)")
    connection.register("shard_triplets", triplets)
    connection.execute(f"CREATE TEMP TABLE shard_fingerprints AS {PAIR_FINGERPRINTS_SQL}")
    # a touched pair of the last output keeps its verdict when it is fingerprinted now as it was;
    # the other touched pairs are gone, and every pair fingerprinted now that is not one of those is judged
    connection.execute("""CREATE TEMP TABLE matched AS SELECT primary_event_id, secondary_event_id FROM shard_fingerprints
                          SEMI JOIN touched_pairs USING (primary_event_id, secondary_event_id, fingerprint)""")
    changed = connection.sql("SELECT * FROM shard_pairs ANTI JOIN matched USING (primary_event_id, secondary_event_id)")
    judged, _, judge_counts = judge_pairs(changed.to_arrow_table().cast(paired.schema), pair_facts, triplets,
                                          job.providers.judge)
    connection.register("judged_rows", judged)
    connection.execute("""CREATE TEMP TABLE judged_now AS SELECT j.*, f.fingerprint, f.unit
                          FROM judged_rows j JOIN shard_fingerprints f USING (primary_event_id, secondary_event_id)""")
    connection.execute(f"""CREATE TEMP TABLE gone_judgments AS
                           SELECT {SHARD_JUDGMENT_COLUMNS} FROM touched_pairs ANTI JOIN matched USING ({PAIR_KEY})""")
    connection.execute(f"""CREATE TEMP VIEW shard_judgments AS
                           SELECT {SHARD_JUDGMENT_COLUMNS} FROM previous_judgments ANTI JOIN gone_judgments USING ({PAIR_KEY})
                           UNION ALL SELECT {SHARD_JUDGMENT_COLUMNS} FROM judged_now""")
    folder = store.shard_path("judged_pairs", job.shard).parent
    _drop_bases(store, folder, keep=base)
    last_base = base
    base, delta = _judgments_written(job, folder, base)
    retired = (connection.sql(EARLIEST_RETIRER_SQL.format(judgments="shard_judgments", events="event_states"))
               .to_arrow_table().cast(tables.RETIREMENTS))
    pairs, true_verdicts = connection.execute("SELECT count(*), coalesce(count_if(invalidates), 0) FROM shard_judgments").fetchall()[0]
    counts = Counter({"candidate_pairs": pairs, "judged_pairs": pairs, "true_verdicts": true_verdicts,
                      "pairs_kept": pairs - count_rows(connection, "judged_now"), "pairs_judged_now": judge_counts["judged_pairs"],
                      "pairs_made_now": paired.num_rows, "units_paired_now": count_rows(connection, "repaired_units"),
                      "facts_read": pair_facts.num_rows, "judgments_written_whole": int(base is not last_base),
                      "units_told_by_changed_rows": int(chained)})
    return StageResult(retired, counts=counts, metadata={"judge": job.providers.judge.name}, tables={
        "judgments": delta,
        "judgment_base": _base_table(base),
        "judgment_changes": _judgment_changes_since(job),
        "retirements": retired,
        "paired_events": connection.sql("SELECT event_id, fact_key, fact_hash, triplets_hash FROM event_states"),
        "paired_units": connection.sql("SELECT unit, digest FROM paired_units_now"),
        "versions_read": pa.table({"asset": list(job.versions), "version": list(job.versions.values())},
                                  schema=tables.SPLITS_READ)})


def _judgment_changes_since(job: StageJob) -> duckdb.DuckDBPyRelation:
    """The shard's judgments against its last output (tables.JUDGMENT_CHANGES): the rows of
    the pairs not kept from it are gone, the pairs judged now are new; when there is no last
    output, only a row saying so."""
    connection = job.connection
    since = job.store.stamp(job.previous["judgments"]).version if "judgments" in job.previous else None
    parts = [f"SELECT true AS gone, {JUDGMENT_COLUMNS} FROM gone_judgments",
             f"SELECT false AS gone, {JUDGMENT_COLUMNS} FROM judged_now"]
    return _judgment_changes(connection, "judgment_changes", since, parts if since is not None else [])


JUDGMENT_COLUMNS = ", ".join(tables.INVALIDATION_JUDGMENTS.names)


def _judgment_changes(connection: duckdb.DuckDBPyConnection, name: str, since: str | None,
                      parts: list[str]) -> duckdb.DuckDBPyRelation:
    """Temp table `name` of tables.JUDGMENT_CHANGES: a first row naming `since` (the version the
    changes are since, None when unknown), then the rows of `parts` (queries of `gone` and the
    judgment's columns)."""
    no_judgment = ", ".join(f"NULL AS {column}" for column in tables.INVALIDATION_JUDGMENTS.names)
    changed = "".join(f" UNION ALL SELECT $since, gone, {JUDGMENT_COLUMNS} FROM ({part})" for part in parts)
    connection.execute(f"CREATE TEMP TABLE {name} AS SELECT $since AS since_version, NULL::BOOLEAN AS gone, {no_judgment}"
                       f"{changed}", {"since": since})
    return connection.table(name)


# A shard's judgments are stored as a base and the changes since it, as its ranks are. The base
# (`v=<id>/judgments.parquet` in the shard's folder, named by its `judgment_base`) holds every
# judgment as of the shard's last write whole; the shard's `judgments` holds the changes since
# (tables.SHARD_JUDGMENT_DELTA): a row per pair of the base gone since (`gone`), and per pair
# judged since, as judged now. A quarter judges about 3% of a shard's pairs again, so it writes
# those rather than every judgment of the shard (900,000 at 5M events), which a base holds in no
# set order (every reader joins or aggregates them). The shard is written whole again once its
# changes hold more than JUDGMENTS_DELTA_SHARE of the base's rows.
JUDGMENTS_DELTA_SHARE = 0.25
SHARD_JUDGMENT_COLUMNS = ", ".join(tables.SHARD_JUDGMENTS.names)
PAIR_KEY = "primary_event_id, secondary_event_id"


def stack_judgments(store, connection: duckdb.DuckDBPyConnection, shards: list[str], name: str, reader: str
                    ) -> dict[str, dict]:
    """View `name`: the judgments of `shards` as stored (tables.SHARD_JUDGMENTS), each shard's
    base less the pairs its changes name, with the changes' rows now; `{name}_changes_<shard>`,
    the shard's changes. Returns each shard's base. A shard whose base is missing, or of another
    run than its changes, stops `reader`."""
    selects, bases = [], {}
    for shard in shards:
        path = store.shard_path("judged_pairs", shard, "judgments")
        base = _shard_base(store, "judged_pairs", shard, "judgments", "judgment_base", reader)
        if base is None:
            raise StageIncomplete(reader, None, f"shard {shard}'s judgments have no base (its judgment_base file is "
                                  f"missing); remove the folder {path.parent} and run judged_pairs again")
        bases[shard] = base
        store.relation(connection, [path.parent / base["file"]]).create_view(f"{name}_base_{shard}", replace=True)
        store.relation(connection, [path]).create_view(f"{name}_changes_{shard}", replace=True)
        select = f"SELECT {SHARD_JUDGMENT_COLUMNS} FROM {name}_base_{shard}"
        if store.metadata(path).num_rows:
            select += (f" ANTI JOIN {name}_changes_{shard} USING ({PAIR_KEY})"
                       f" UNION ALL SELECT {SHARD_JUDGMENT_COLUMNS} FROM {name}_changes_{shard} WHERE NOT gone")
        selects.append(select)
    if not selects:
        connection.from_arrow(tables.SHARD_JUDGMENTS.empty_table()).create_view(name, replace=True)
        return bases
    connection.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {' UNION ALL '.join(selects)}")
    return bases


def _previous_judgments(job: StageJob) -> dict | None:
    """View `previous_judgments`: the shard's judgments in its last output (none without one),
    and that output's base (`stack_judgments`)."""
    if "judgments" not in job.previous:
        job.connection.from_arrow(tables.SHARD_JUDGMENTS.empty_table()).create_view("previous_judgments", replace=True)
        return None
    return stack_judgments(job.store, job.connection, [job.shard], "previous_judgments", "judged_pairs")[job.shard]


def _judgments_written(job: StageJob, folder, base: dict | None) -> tuple[dict, duckdb.DuckDBPyRelation | pa.Table]:
    """The shard's judgments now (`shard_judgments`) as a base and its changes (`stack_judgments`):
    on the last output's base (`base`), its changes with those of this run (`gone_judgments`,
    `judged_now`) merged in; or, without one or past JUDGMENTS_DELTA_SHARE of it, a new base of
    every judgment and no changes."""
    store, connection = job.store, job.connection
    if base is not None:
        connection.execute(f"""
            CREATE TEMP TABLE judgment_delta AS
            SELECT gone, {SHARD_JUDGMENT_COLUMNS} FROM previous_judgments_changes_{job.shard}
                ANTI JOIN (SELECT {PAIR_KEY} FROM gone_judgments UNION ALL SELECT {PAIR_KEY} FROM judged_now) USING ({PAIR_KEY})
            UNION ALL SELECT true, {SHARD_JUDGMENT_COLUMNS} FROM gone_judgments ANTI JOIN judged_now USING ({PAIR_KEY})
            UNION ALL SELECT false, {SHARD_JUDGMENT_COLUMNS} FROM judged_now""")
        if count_rows(connection, "judgment_delta") <= JUDGMENTS_DELTA_SHARE * base["rows"]:
            return base, connection.table("judgment_delta")
    file = f"v={uuid.uuid4().hex[:16]}/judgments.parquet"
    written = store.write(folder / file, relation_batches(connection.table("shard_judgments"), tables.SHARD_JUDGMENTS))
    return {"file": file, "rows": store.metadata(written).num_rows}, tables.SHARD_JUDGMENT_DELTA.empty_table()


def _pairs_made_now(job: StageJob) -> tuple[pa.Table, pa.Table, bool]:
    """The facts read with their vectors and the pairs made from them (`paired_now` on the
    connection): every unit's on the first run (or after a last output without its memo), the
    repaired units' on the others; `touched_pairs`, the last output's pairs looked at again
    (see judged_pairs); and whether the units were told from the selected rows that changed
    (CHANGED_UNITS_SQL) rather than from every row's digest."""
    connection = job.connection
    _shard_view(job, "fact_blocks", "facts", tables.FACTS, ["event_id", "fact_key", "valid_at"], "fact_rows")
    _shard_view(job, "fact_blocks", "triplets", tables.RESOLVED_TRIPLETS, ["event_id"], "triplet_rows")
    _shard_view(job, "candidate_selection", "selected", tables.CANDIDATE_RANKS, ["incoming_event_id", "fact_key"],
                "selection_rows")
    connection.execute(EVENT_STATES_SQL)
    for name, schema in (("paired_events", tables.PAIRED_EVENTS), ("paired_units", tables.PAIRED_UNITS)):
        (job.store.relation(connection, [job.previous[name]]) if name in job.previous
         else connection.from_arrow(schema.empty_table())).create_view(f"previous_{name}", replace=True)
    incremental = "paired_events" in job.previous
    chained = False
    if incremental:
        connection.execute(DIRTY_KEYS_SQL)
        chained = "paired_units" in job.previous and _selection_changes(job)
    if chained:
        connection.execute(CHANGED_UNITS_SQL)
    else:
        connection.execute(UNIT_STATES_SQL.replace("{touched}", TOUCHED_SQL if incremental else "true"))
        connection.execute("CREATE TEMP VIEW paired_units_now AS SELECT unit, digest FROM unit_states")
        if incremental:
            connection.execute(REPAIRED_UNITS_SQL)
    if incremental:
        connection.execute(REPAIRED_ROWS_SQL)
        facts = _split(job, "fact_blocks", "facts", tables.FACTS, "SEMI JOIN repaired_keys USING (fact_key)")
        selected = _split(job, "candidate_selection", "selected", tables.CANDIDATE_RANKS,
                          "SEMI JOIN repaired_selections USING (incoming_event_id, fact_key)")
        connection.execute(TOUCHED_PAIRS_SQL)
    else:  # every pair of the last output (one an older tkg wrote without its memo) is made again or gone
        connection.execute("""CREATE TEMP TABLE repaired_units AS SELECT unit FROM unit_states;
                              CREATE TEMP TABLE touched_pairs AS SELECT *, true AS dropped FROM previous_judgments""")
        facts = _split(job, "fact_blocks", "facts", tables.FACTS)
        selected = _split(job, "candidate_selection", "selected", tables.CANDIDATE_RANKS)
    paired = pair_candidates(facts, selected, policy.POLICY.min_cosine)
    connection.register("paired_now", paired)
    return facts, paired, chained


def _selection_changes(job: StageJob) -> bool:
    """Views `selection_added` and `selection_gone`: the shard's selected rows written and
    deleted since the version its last output read (`versions_read`); False when that cannot
    be told (no such record, or a selection written whole since)."""
    if "versions_read" not in job.previous:
        return False
    since = {row["asset"]: row["version"] for row in job.store.read(job.previous["versions_read"]).to_pylist()
             }.get("candidate_selection")
    changes = None if since is None else shard_changes_since(
        job.store, job.connection, "candidate_selection", job.versions["candidate_selection"], "selected", job.shard, since,
        ["incoming_event_id", "fact_key"])
    if changes is None:
        return False
    empty = pa.schema([tables.CANDIDATE_RANKS.field("incoming_event_id"), tables.CANDIDATE_RANKS.field("fact_key")]).empty_table()
    for name, rows in zip(("selection_added", "selection_gone"), changes):
        (rows if rows is not None else job.connection.from_arrow(empty)).create_view(name, replace=True)
    return True


def _shard_view(job: StageJob, asset: str, table: str, schema: pa.Schema, columns: list[str], name: str) -> None:
    """View `name`: this job's shard of a split table (of `schema`) over `columns` and its rows'
    hashes, empty when the shard has none."""
    rows = shard_rows(job.store, job.connection, asset, job.versions[asset], table, job.shard, [*columns, ROW_HASH])
    if rows is None:
        empty = pa.schema([*(schema.field(column) for column in columns), (ROW_HASH, pa.uint64())]).empty_table()
        rows = job.connection.from_arrow(empty)
    rows.create_view(name, replace=True)


# What a shard's pairs were made from (see judged_pairs): each fact with the hash of its row and
# of its triplets (`event_states`), and per unit of two facts a digest of the selected rows that
# link them, whichever way round (`unit_states`). A digest is a count and a sum of row hashes:
# it does not depend on the order or the files the rows come in. A unit is named by a hash of
# its two keys; two units sharing one would only be paired again together.
UNIT_SQL = "hash(least({a}, {b}), greatest({a}, {b}))"
EVENT_STATES_SQL = f"""
    CREATE TEMP TABLE event_states AS
    WITH triplet_sums AS (SELECT event_id, hash(count(*), sum({ROW_HASH})) AS triplets_hash FROM triplet_rows GROUP BY event_id)
    SELECT f.event_id, f.fact_key, f.valid_at, f.{ROW_HASH} AS fact_hash, coalesce(t.triplets_hash, 0)::UBIGINT AS triplets_hash
    FROM fact_rows f LEFT JOIN triplet_sums t USING (event_id)"""
# (`touched`: the row links a fact one of whose events changed, came or left, a `dirty_keys` one)
UNIT_STATES_SQL = f"""
    CREATE TEMP TABLE selection_units AS
    SELECT s.incoming_event_id, s.fact_key, {UNIT_SQL.format(a="e.fact_key", b="s.fact_key")} AS unit,
           s.{ROW_HASH} AS row_hash, {{touched}} AS touched
    FROM selection_rows s JOIN event_states e ON e.event_id = s.incoming_event_id;
    CREATE TEMP TABLE unit_states AS
    SELECT unit, hash(count(*), sum(row_hash)) AS digest, bool_or(touched) AS touched FROM selection_units GROUP BY unit"""
TOUCHED_SQL = "e.fact_key IN (SELECT fact_key FROM dirty_keys) OR s.fact_key IN (SELECT fact_key FROM dirty_keys)"

# The units paired again: those whose selected rows changed (or are new, or gone), and those
# holding a fact one of whose events changed, came or left; the selected rows and the facts
# that pair them.
# (each a row of one side that the other lacks, in one join of the two rather than an EXCEPT each way)
DIRTY_KEYS_SQL = """
    CREATE TEMP TABLE dirty_keys AS
    SELECT DISTINCT coalesce(n.fact_key, b.fact_key) AS fact_key
    FROM event_states n FULL JOIN previous_paired_events b
        ON n.event_id = b.event_id AND n.fact_key = b.fact_key AND n.fact_hash = b.fact_hash
    WHERE n.event_id IS NULL OR b.event_id IS NULL"""
REPAIRED_UNITS_SQL = """
    CREATE TEMP TABLE unit_changes AS
    SELECT coalesce(n.unit, b.unit) AS unit, n.unit IS NOT NULL AS now
    FROM unit_states n FULL JOIN previous_paired_units b ON n.unit = b.unit AND n.digest = b.digest
    WHERE n.unit IS NULL OR b.unit IS NULL;
    CREATE TEMP TABLE repaired_units AS
    SELECT unit FROM unit_states WHERE touched UNION SELECT unit FROM unit_changes WHERE now;
    CREATE TEMP TABLE dirty_units AS
    SELECT unit FROM repaired_units UNION SELECT unit FROM unit_changes WHERE NOT now"""
# The same units told from the rows that changed rather than from every row's digest, when the
# shard's last output says which version of the selection it read (`_selection_changes`): a
# unit's digest changes only when a row joins or leaves it, and a row does so only when the
# selection wrote or deleted it since (`selection_added`, `selection_gone`) or when it links a
# dirty key (its incoming fact's key changed, came or left, or its candidate's did). Those rows'
# units, by their incoming fact's key now and as last paired, are dirty; the ones that have
# rows now are paired again, with their digests counted from every row they have now. Every
# other unit keeps its digest (`paired_units_now`).
CHANGED_UNITS_SQL = f"""
    CREATE TEMP TABLE changed_events AS
    SELECT event_id FROM event_states SEMI JOIN dirty_keys USING (fact_key)
    UNION SELECT event_id FROM previous_paired_events SEMI JOIN dirty_keys USING (fact_key);
    CREATE TEMP TABLE moved_rows AS
    SELECT incoming_event_id, fact_key FROM selection_added
    UNION ALL SELECT incoming_event_id, fact_key FROM selection_gone
    UNION ALL SELECT incoming_event_id, fact_key FROM selection_rows
        WHERE fact_key IN (SELECT fact_key FROM dirty_keys) OR incoming_event_id IN (SELECT event_id FROM changed_events);
    CREATE TEMP TABLE dirty_unit_keys AS
    SELECT DISTINCT {UNIT_SQL.format(a="e.fact_key", b="m.fact_key")} AS unit, e.fact_key AS a, m.fact_key AS b
    FROM moved_rows m JOIN (SELECT event_id, fact_key FROM event_states
                            UNION SELECT event_id, fact_key FROM previous_paired_events) e ON e.event_id = m.incoming_event_id;
    CREATE TEMP TABLE dirty_units AS SELECT DISTINCT unit FROM dirty_unit_keys;
    CREATE TEMP TABLE selection_units AS
    WITH unit_keys AS (SELECT a AS fact_key FROM dirty_unit_keys UNION SELECT b FROM dirty_unit_keys)
    SELECT * FROM (
        SELECT s.incoming_event_id, s.fact_key, {UNIT_SQL.format(a="e.fact_key", b="s.fact_key")} AS unit, s.{ROW_HASH} AS row_hash
        FROM (SELECT * FROM selection_rows SEMI JOIN unit_keys USING (fact_key)) s
        JOIN (SELECT event_id, fact_key FROM event_states SEMI JOIN unit_keys USING (fact_key)) e
            ON e.event_id = s.incoming_event_id)
    SEMI JOIN dirty_units USING (unit);
    CREATE TEMP TABLE unit_states AS SELECT unit, hash(count(*), sum(row_hash)) AS digest FROM selection_units GROUP BY unit;
    CREATE TEMP TABLE repaired_units AS SELECT unit FROM unit_states;
    CREATE TEMP VIEW paired_units_now AS
    SELECT unit, digest FROM previous_paired_units ANTI JOIN dirty_units USING (unit)
    UNION ALL SELECT unit, digest FROM unit_states"""
# The selected rows of the units paired again, and the facts that pair them.
REPAIRED_ROWS_SQL = """
    CREATE TEMP TABLE repaired_selections AS
    SELECT incoming_event_id, fact_key FROM selection_units SEMI JOIN repaired_units USING (unit);
    CREATE TEMP TABLE repaired_keys AS
    SELECT e.fact_key FROM repaired_selections s JOIN event_states e ON e.event_id = s.incoming_event_id
    UNION SELECT fact_key FROM repaired_selections"""

# The last output's pairs this run looks at again (`touched_pairs`, with their judgments), found
# in one pass over them: those that do not stand (`dropped`: a fact of the pair is a dirty key,
# one of its events was one of a dirty key's in the last output, or their unit, stored with the
# judgment, is paired again), and those that stand but whose events' triplets changed, which
# are fingerprinted again. Every other pair keeps its fingerprint and verdict as they are.
TOUCHED_PAIRS_SQL = """
    CREATE TEMP TABLE touched_pairs AS
    WITH dirty_events AS (SELECT event_id FROM previous_paired_events SEMI JOIN dirty_keys USING (fact_key)),
    triplets_changed AS (SELECT event_id FROM (SELECT event_id, triplets_hash FROM event_states
                                               EXCEPT SELECT event_id, triplets_hash FROM previous_paired_events)),
    marked AS (  -- a pair whose state is unknown (a NULL) counts as dropped
        SELECT *, coalesce(unit IN (SELECT unit FROM dirty_units)
                           OR primary_event_id IN (SELECT event_id FROM dirty_events)
                           OR secondary_event_id IN (SELECT event_id FROM dirty_events), true) AS dropped,
               coalesce(primary_event_id IN (SELECT event_id FROM triplets_changed)
                        OR secondary_event_id IN (SELECT event_id FROM triplets_changed), true) AS rechecked
        FROM previous_judgments)
    SELECT * EXCLUDE (rechecked) FROM marked WHERE dropped OR rechecked"""


# A fingerprint of each judge pair (a 64-bit hash, compared only with the same pair's last one):
# the pair (its cosine, shared entity and group are in its judgment) and what the judge reads of
# its two events (the fact's columns besides the vector, which only the pairing reads, and its
# canonical triplets, in a fixed order); and the pair's unit.
PAIR_FINGERPRINTS_SQL = f"""
    WITH triplet_hashes AS (
        SELECT event_id, string_agg(hash({', '.join(tables.RESOLVED_TRIPLETS.names)})::VARCHAR, ',' ORDER BY triplet_id) AS h
        FROM shard_triplets GROUP BY event_id),
    event_hashes AS (
        SELECT f.event_id, f.fact_key, hash({', '.join('f.' + name for name in tables.FACTS.names if name != 'vector')}, t.h) AS h
        FROM shard_facts f LEFT JOIN triplet_hashes t USING (event_id))
    SELECT p.primary_event_id, p.secondary_event_id,
           hash(p.primary_event_id, p.secondary_event_id, p.cosine, p.shared_entity_id, p.predicate_group, ep.h, es.h) AS fingerprint,
           {UNIT_SQL.format(a="ep.fact_key", b="es.fact_key")} AS unit
    FROM shard_pairs p JOIN event_hashes ep ON ep.event_id = p.primary_event_id
                       JOIN event_hashes es ON es.event_id = p.secondary_event_id"""



def invalidated_events(job: StageJob) -> StageResult:
    """Retire: each event's earliest retirement over every shard's judged pairs and the figure
    revisions; the judgments of every shard with the revisions' for audit, and their changes
    since the step's last version, which a publish applies instead of reloading them all."""
    store, connection = job.store, job.connection
    retirement_files = [path for shard in job.shard_keys for path in [store.shard_path("judged_pairs", shard, "retirements")]
                        if store.is_file(path)]
    winners = (store.relation(connection, retirement_files).to_arrow_table().cast(tables.RETIREMENTS)
               if retirement_files else tables.RETIREMENTS.empty_table())
    revisions = _revisions(job)
    positions, listings, position_counts = _positions(job)
    wanted = pa.table({"event_id": pa.array(involved_events(winners, revisions.retired_events, positions), pa.string())})
    connection.register("wanted_events", wanted)
    timing_rows = (partition_rows(store, connection, "temporal_events", tables.EVENTS).select("event_id", "invalid_at", "created_at")
                   .join(connection.table("wanted_events"), "event_id").to_arrow_table().to_pylist())
    timing = {row["event_id"]: row for row in timing_rows}
    invalidations = retirements(winners, revisions.retired_events, timing, positions)
    revision_judgments = revisions.judgments
    connection.register("revision_judgments", revision_judgments)
    stack_judgments(store, connection, [shard for shard in job.shard_keys
                                        if store.is_file(store.shard_path("judged_pairs", shard, "judgments"))],
                    "shard_judgments", "invalidated_events")
    columns = ", ".join(tables.INVALIDATION_JUDGMENTS.names)
    judgments = connection.sql(f"SELECT {columns} FROM shard_judgments UNION ALL SELECT {columns} FROM revision_judgments")
    # each shard's judgments read: (version, size, modification time)
    listed = store.listing("judged_pairs/shard=*/judgments.parquet")
    read = {shard: (store.stamp(path).version, *listed[path]) for shard in job.shard_keys
            for path in [store.shard_path("judged_pairs", shard, "judgments")] if path in listed}
    changes = _changed_judgments(job, read)
    counts = Counter({"retired_by_judge": winners.num_rows, "invalidated_events": invalidations.num_rows,
                      "revised_figures": revisions.figure_invalidations.num_rows,
                      "events_retired_by_figures": len(revisions.retired_events),
                      "figures_revised_again": revisions.revised_again,
                      "judgments_changed": connection.execute("SELECT count(gone) FROM changed_judgments").fetchall()[0][0],
                      **position_counts})
    return StageResult(invalidations, counts=counts, tables={
        "invalidation_judgments": judgments, "judgment_changes": changes,
        "judgments_read": pa.Table.from_pylist([{"shard": shard, "version": version, "size": size, "mtime_ns": mtime}
                                                for shard, (version, size, mtime) in sorted(read.items())],
                                               schema=tables.JUDGMENTS_READ),
        "revision_judgments": revision_judgments, "revision_figures": revisions.memo,
        "figure_invalidations": revisions.figure_invalidations,
        "event_invalidations": invalidations, "position_listings": listing_table(listings)})


def _changed_judgments(job: StageJob, read: dict[str, tuple[str, int, int]]) -> duckdb.DuckDBPyRelation:
    """`invalidation_judgments` against the step's last version (tables.JUDGMENT_CHANGES): each
    shard's changes since the judgments that version read, and the revisions' rows gone and
    new; or, when they cannot be told (`_shard_changes`), only a row saying so."""
    store, connection, previous = job.store, job.connection, job.previous
    columns = JUDGMENT_COLUMNS
    parts = _shard_changes(job, read)
    if parts is None:
        return _judgment_changes(connection, "changed_judgments", None, [])
    store.relation(connection, [previous["revision_judgments"]]).create_view("previous_revisions", replace=True)
    parts += [f"SELECT true AS gone, * FROM (SELECT {columns} FROM previous_revisions "
              f"EXCEPT ALL SELECT {columns} FROM revision_judgments)",
              f"SELECT false AS gone, * FROM (SELECT {columns} FROM revision_judgments "
              f"EXCEPT ALL SELECT {columns} FROM previous_revisions)"]
    return _judgment_changes(connection, "changed_judgments", store.stamp(previous["invalidation_judgments"]).version, parts)


def _shard_changes(job: StageJob, read: dict[str, tuple[str, int, int]]) -> list[str] | None:
    """The queries of each shard's judgment rows gone and new since the judgments the step's
    last version read (`read`: each shard's judgments now, as version, size and modification
    time), or None when that cannot be told: no last version (or one an older tkg wrote),
    another set of shards, or a shard whose judgments were rewritten and whose changes are not
    since the version read last (rebuilt twice in between, or from nothing) or were written by
    another run than its judgments."""
    store, connection, previous = job.store, job.connection, job.previous
    if not all(name in previous for name in ("invalidation_judgments", "judgments_read", "revision_judgments")):
        return None
    before = {row["shard"]: (row["version"], row.get("size"), row.get("mtime_ns"))
              for row in store.read(previous["judgments_read"]).to_pylist()}
    if before.keys() != read.keys():
        return None
    parts = []
    for shard in sorted(shard for shard, identity in read.items() if identity != before[shard]):
        path = store.shard_path("judged_pairs", shard, "judgment_changes")
        stamp = store.stamp(path) if store.is_file(path) else None
        if stamp is None or stamp.version != read[shard][0]:
            return None
        store.relation(connection, [path]).create_view(f"shard_changes_{shard}", replace=True)
        if connection.execute(f"SELECT list(DISTINCT since_version) FROM shard_changes_{shard}").fetchall()[0][0] \
                != [before[shard][0]]:
            return None
        parts.append(f"SELECT gone, {JUDGMENT_COLUMNS} FROM shard_changes_{shard} WHERE gone IS NOT NULL")
    return parts


def _positions(job: StageJob) -> tuple[dict[str, PositionEnd], list[Listing], dict[str, int]]:
    """What the participants lists end (tkg.invalidate.positions): their HOLDS_ROLE events with
    canonical people and offices, read once over every partition."""
    store, connection = job.store, job.connection
    chunk_files = store.partition_files("chunks")
    if not chunk_files or not store.partition_files("temporal_events"):
        return {}, [], {}
    raw_view(job, "triplets", tables.TRIPLETS)
    raw_view(job, "entity_resolution", tables.ENTITY_RESOLUTION, [store.global_path("canonical_entities", "entity_resolution")])
    raw_view(job, "canonical_entities", tables.CANONICAL_ENTITIES, [store.global_path("canonical_entities")])
    apply_model(connection, model("triplets"), record=False)
    partition_view(job, "events", "temporal_events", tables.EVENTS)
    packed(store, connection, chunk_files).filter("kind = 'participants'").select("chunk_id").create_view(
        "participant_chunks", replace=True)
    rows = connection.sql(LISTINGS_SQL).to_arrow_table().to_pylist()
    # the text of the lists the rows are stated in, from the chunk files (the packs leave text out)
    connection.register("listed_chunks", pa.table({"chunk_id": pa.array(sorted({row["chunk_id"] for row in rows}), pa.string())}))
    scan(store, connection, chunk_files).create_view("chunk_texts", replace=True)
    texts = dict(connection.execute("SELECT chunk_id, text FROM chunk_texts SEMI JOIN listed_chunks USING (chunk_id) "
                                    "WHERE kind = 'participants'").fetchall())
    listings, unmatched = listings_from_rows(rows, texts)
    ends = end_positions(listings)
    return ends, listings, {"position_listings": len(listings), "position_listings_unmatched": unmatched,
                  "positions_ended": sum(end.evidence == STATEMENT for end in ends.values()),
                  "positions_ended_by_absence": sum(end.evidence == ABSENCE for end in ends.values())}


def _revisions(job: StageJob) -> RevisedFigures:
    """Figure revisions (tkg.invalidate.revisions) against the step's last output: only the
    guidance a changed figure may retire differently is revised again (tkg.invalidate.revising)."""
    store, connection, previous = job.store, job.connection, job.previous
    files = store.partition_files("figures")
    figures = (packed(store, connection, files).select(*READ_COLUMNS) if files
               else connection.from_arrow(READ_SCHEMA.empty_table()))
    last = None
    if all(name in previous for name in ("figure_invalidations", "revision_figures")):
        last = (store.relation(connection, [previous["figure_invalidations"]]),
                store.relation(connection, [previous["revision_figures"]]))
    return revise_since(connection, figures, last)


def fact_relevance(job: StageJob) -> StageResult:
    """Score every fact for retention and mark the ones to archive (tkg.invalidate.retention)."""
    partition_view(job, "events", "temporal_events", tables.EVENTS)
    # scored once: the counts and the output read the same rows
    score_facts(job.connection, "events", retention_settings()).to_table("scored")
    archived, facts = job.connection.execute("SELECT count(archive_reason), count(*) FROM scored").fetchall()[0]
    return StageResult(tables.FACT_RELEVANCE.empty_table(), tables={"fact_relevance": job.connection.table("scored")},
                       counts=Counter(archived=archived, facts=facts))
