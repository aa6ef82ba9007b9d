"""The resolution stages: every entity mention of every partition mapped to a canonical entity,
and the names spoken in the calls linked to the participants they name."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import groupby
from operator import itemgetter
from pathlib import PurePath

import pyarrow as pa
import pyarrow.compute as pc

from tkg.core import tables
from tkg.core.ids import short_hash
from tkg.core.machine import room_for_duckdb
from tkg.core.results import StageJob, StageResult
from tkg.resolve.resolution import MentionSource, ResolutionMemo, evidence_memo_groups, partition_key, resolve_entities
from tkg.resolve.spoken import SpokenForm, call_forms, linked_forms
from tkg.store.manifest import scan
from tkg.store.packs import packed, partition_rows
from tkg.store.parquet import ParquetStore, partition_of
from tkg.store.warehouse import apply_model, model


# Each partition's file of a stage, by partition key: (path, size, modification time in ns).
PartitionFiles = dict[str, tuple[PurePath, int, int]]


def _partition_files(store: ParquetStore, asset: str) -> PartitionFiles:
    """Every partition's file of `asset` (one listing), by partition key (partition_key)."""
    listed = store.listing(f"{asset}/company=*/quarter=*/{asset}.parquet")
    return {partition_key(*partition_of(str(path))): (path, *identity) for path, identity in listed.items()}


def canonical_entities(job: StageJob) -> StageResult:
    """Resolve every mention. Mentions are read a column at a time by DuckDB (the distinct
    names come into memory, the mentions and their embeddings do not); each mention's
    canonical is streamed to `entity_resolution`. The previous registry only contributes the
    ids it issued that no longer name an entity (kept, with `merged_into`), never names or ids
    of live entities. What the last run read (its memo: the name groups and their evidence) is
    added to, not read again, where none of its partitions changed (`_resolution_memo`)."""
    store, connection = job.store, job.connection
    registry = store.global_path("canonical_entities")
    previous = store.read(registry) if store.is_file(registry) else None
    now = _partition_files(store, "entities")
    files = sorted(path for path, _, _ in now.values())
    # the mentions' names from the packs; their embeddings, which only the evidence reads, from the files
    source = (MentionSource(connection, scan(store, connection, files), light=packed(store, connection, files)) if files
              else MentionSource(connection, connection.from_arrow(tables.ENTITIES.empty_table())))
    memo = _resolution_memo(job, now)
    resolution = resolve_entities(source, previous, memo)
    counts = resolution.counts
    if memo is not None:
        counts.update(evidence_partitions_added=len(memo.added_files), evidence_partitions_stale=len(memo.stale))
    mentions_read = _partitions_read(now)
    return StageResult(resolution.canonical_entities, counts=counts,
                       tables={"canonical_entities": resolution.canonical_entities,
                               "entity_resolution": resolution.mapping_relation(),
                               "group_evidence": resolution.evidence,
                               "name_groups": resolution.name_groups.cast(tables.NAME_GROUPS),
                               "mentions_read": mentions_read})


def _resolution_memo(job: StageJob, now: PartitionFiles) -> ResolutionMemo | None:
    """What the step's last output read (its memo, tkg.resolve.resolution.ResolutionMemo), with
    the partitions whose entity files were rewritten or are gone since (by size and
    modification time, `now`) and the mentions of the files new or rewritten since; None
    without a memo."""
    store, connection, previous = job.store, job.connection, job.previous
    if not all(name in previous for name in ("group_evidence", "mentions_read")):
        return None
    stale, changed = _since_read(store, previous["mentions_read"], now)
    added = [now[key][0] for key in changed]
    rows = scan(store, connection, added) if added else connection.from_arrow(tables.ENTITIES.empty_table())
    name_groups = None
    if "name_groups" in previous:
        name_groups = "previous_name_groups"
        store.relation(connection, [previous["name_groups"]]).create_view(name_groups, replace=True)
    return ResolutionMemo(evidence_memo_groups(store.read(previous["group_evidence"])), name_groups, stale,
                          MentionSource(connection, rows, view="added_mentions"), added)


# Bump when the phrases or linking rules of tkg.resolve.spoken change.
SPOKEN_VERSION = "spoken-mentions-2"

# Chunks read at a time (a reader's default is a million rows: at 10M events, GB of text as
# Python objects).
CHUNK_BATCH_ROWS = 8192

# Each call's participants with their canonical person: the subjects of the HOLDS_ROLE triplets
# stated from the participants chunk.
_LISTED_PEOPLE_SQL = """
    SELECT DISTINCT s.transcript_id, c.company, t.subject_mention AS participant, t.subject_id AS canonical_id
    FROM triplets AS t
    JOIN statements AS s ON s.statement_id = t.event_id
    JOIN call_chunks AS c ON c.chunk_id = s.chunk_id AND c.kind = 'participants'
    WHERE t.predicate = 'HOLDS_ROLE' AND t.subject_id IS NOT NULL"""


def spoken_mentions(job: StageJob) -> StageResult:
    """Spoken name forms (tkg.resolve.spoken) of every call, linked to the canonical person of
    the participant they name. A call's forms depend on its text alone: they are kept (a memo,
    `spoken_forms`) and only the calls of chunk files new or rewritten since the last run are
    read again, a call at a time in transcript order. Linking, which depends on every call's
    participants, runs over every form each time."""
    store, connection = job.store, job.connection
    now = _partition_files(store, "chunks")
    chunks_read = _partitions_read(now)
    if not now:
        return StageResult(tables.SPOKEN_MENTIONS.empty_table(), tables={
            "spoken_mentions": tables.SPOKEN_MENTIONS.empty_table(), "spoken_forms": tables.SPOKEN_FORMS.empty_table(),
            "chunks_read": chunks_read})
    connection.execute("CREATE SCHEMA IF NOT EXISTS raw")
    partition_rows(store, connection, "triplets", tables.TRIPLETS).create_view("_raw_triplets", replace=True)
    for name, schema, files in (("entity_resolution", tables.ENTITY_RESOLUTION,
                                 [store.global_path("canonical_entities", "entity_resolution")]),
                                ("canonical_entities", tables.CANONICAL_ENTITIES, [store.global_path("canonical_entities")])):
        relation = scan(store, connection, files) if files else connection.from_arrow(schema.empty_table())
        relation.create_view(f"_raw_{name}", replace=True)
    for name in ("triplets", "entity_resolution", "canonical_entities"):
        connection.execute(f"CREATE OR REPLACE VIEW raw.{name} AS SELECT * FROM _raw_{name}")
    apply_model(connection, model("triplets"), record=False)
    partition_rows(store, connection, "statements", tables.STATEMENTS).select(
        "statement_id", "chunk_id", "transcript_id").create_view("statements", replace=True)
    chunk_files = sorted(path for path, _, _ in now.values())
    packed(store, connection, chunk_files).select("chunk_id", "company", "kind").create_view("call_chunks", replace=True)
    people: dict[str, dict[str, str]] = {}
    company_people: dict[str, dict[str, str]] = {}  # every call's participants, by company
    for transcript_id, company, participant, canonical_id in connection.execute(_LISTED_PEOPLE_SQL + " ORDER BY ALL").fetchall():
        people.setdefault(transcript_id, {}).setdefault(participant, canonical_id)
        company_people.setdefault(company, {}).setdefault(participant, canonical_id)
    forms, read_again = _spoken_forms(job, now)
    counts = Counter(spoken_calls_read=read_again)
    records = []

    def link(call: list[dict]) -> None:
        transcript_id, company = call[0]["transcript_id"], call[0]["company"]
        listed_people, known = people.get(transcript_id, {}), company_people.get(company, {})
        found = [(row["chunk_id"], SpokenForm(row["spoken"], row["kind"], row["target"])) for row in call]
        rows, unlinked = linked_forms(found, sorted(listed_people), sorted(known))
        counts["spoken_forms_unlinked"] += unlinked
        records.extend({**row, "mention_id": short_hash(row["chunk_id"], row["spoken"], row["kind"]),
                        "transcript_id": transcript_id, "company": company,
                        "canonical_id": listed_people.get(row["participant"]) or known[row["participant"]]} for row in rows)

    for call in _calls(forms.to_batches(CHUNK_BATCH_ROWS)):  # the forms come call after call
        link(call)
    records.sort(key=lambda r: r["mention_id"])
    counts["spoken_mentions"] = len(records)
    table = tables.to_table(records, tables.SPOKEN_MENTIONS)
    return StageResult(table, counts=counts, tables={"spoken_mentions": table, "spoken_forms": forms,
                                                     "chunks_read": chunks_read})


def _spoken_forms(job: StageJob, now: PartitionFiles) -> tuple[pa.Table, int]:
    """Every call's spoken forms (tables.SPOKEN_FORMS, in transcript and chunk order): the last
    run's (its memo) for the partitions whose chunk files stand as they were (by size and
    modification time, `now`), the others read from their chunks; and how many calls were read."""
    store, connection, previous = job.store, job.connection, job.previous
    kept = tables.SPOKEN_FORMS.empty_table()
    fresh = sorted(now)
    if all(name in previous for name in ("spoken_forms", "chunks_read")):
        _, fresh = _since_read(store, previous["chunks_read"], now)
        standing = sorted(set(now) - set(fresh))
        memo = store.read(previous["spoken_forms"]).cast(tables.SPOKEN_FORMS)
        kept = memo.filter(pc.is_in(memo.column("partition"), pa.array(standing, pa.string())))
    rows: list[dict] = []
    calls: list[str] = []  # the calls read
    if fresh:
        scan(store, connection, [now[key][0] for key in fresh]).select(
            "chunk_id", "transcript_id", "company", "quarter", "chunk_index", "kind", "speaker", "text"
        ).create_view("fresh_chunks", replace=True)

        def read(call: list[dict]) -> None:
            first = call[0]
            calls.append(first["transcript_id"])
            key = partition_key(first["company"], first["quarter"].isoformat())
            rows.extend({"partition": key, "transcript_id": first["transcript_id"], "company": first["company"],
                         "chunk_id": chunk_id, "spoken": form.spoken, "kind": form.kind, "target": form.target}
                        for chunk_id, form in call_forms(call))

        with room_for_duckdb(connection):  # the sort of the calls' text, beside the participants
            reader = connection.sql("SELECT * FROM fresh_chunks ORDER BY transcript_id, chunk_index"
                                    ).fetch_arrow_reader(CHUNK_BATCH_ROWS)
            for call in _calls(reader):
                read(call)
    forms = pa.concat_tables([kept, tables.to_table(rows, tables.SPOKEN_FORMS)])
    return forms.sort_by([("transcript_id", "ascending"), ("chunk_id", "ascending"), ("kind", "ascending"),
                          ("spoken", "ascending")]), len(calls)


def _calls(batches: Iterable[pa.RecordBatch]) -> Iterator[list[dict]]:
    """The rows of batches sorted by transcript, a call's at a time."""
    rows = (row for batch in batches for row in batch.to_pylist())
    for _, call in groupby(rows, key=itemgetter("transcript_id")):
        yield list(call)


def _since_read(store: ParquetStore, read: PurePath, now: PartitionFiles) -> tuple[set[str], list[str]]:
    """Against the partitions' files a step read last (`read`, tables.PARTITIONS_READ), by size
    and modification time (`now`): the partitions whose files were rewritten or are gone since,
    and those whose files are new or rewritten since."""
    before = {row["partition"]: (row["size"], row["mtime_ns"]) for row in store.read(read).to_pylist()}
    stale = {key for key, identity in before.items() if key not in now or tuple(now[key][1:]) != identity}
    return stale, sorted(key for key, (_, *identity) in now.items() if before.get(key) != tuple(identity))


def _partitions_read(now: PartitionFiles) -> pa.Table:
    """The files of every partition a step read, by size and modification time (tables.PARTITIONS_READ)."""
    return pa.table({"partition": list(now), "size": [size for _, size, _ in now.values()],
                     "mtime_ns": [mtime for _, _, mtime in now.values()]}, schema=tables.PARTITIONS_READ).sort_by("partition")
