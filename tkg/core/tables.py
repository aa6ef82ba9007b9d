"""Arrow schemas of every table tkg writes. Parquet files, DuckDB views and the README's SQL
surface all follow these; an empty partition still gets a file with the right columns."""

from __future__ import annotations

from typing import Any, Iterable

import pyarrow as pa

TIMESTAMP = pa.timestamp("us", tz="UTC")
EMBEDDING = pa.list_(pa.float32())

PARTICIPANT = pa.struct([("name", pa.string()), ("organization", pa.string()), ("title", pa.string()), ("kind", pa.string())])

TURN = pa.struct([
    ("index", pa.int32()), ("section", pa.string()), ("speaker", pa.string()), ("organization", pa.string()),
    ("title", pa.string()), ("heading", pa.string()), ("start", pa.int64()), ("end", pa.int64()),
])

TRANSCRIPTS = pa.schema([
    ("transcript_id", pa.string()), ("company", pa.string()), ("quarter", pa.date32()),
    ("company_name", pa.string()), ("call_date", pa.date32()), ("call_datetime", TIMESTAMP),
    ("title", pa.string()), ("doc_type", pa.string()), ("fiscal_quarter", pa.string()), ("fiscal_year", pa.int32()),
    ("fiscal_period_start", pa.date32()), ("fiscal_period_end", pa.date32()),
    ("participants", pa.list_(PARTICIPANT)), ("participants_start", pa.int64()), ("participants_end", pa.int64()),
    ("turns", pa.list_(TURN)), ("body_end", pa.int64()),
    ("content_sha256", pa.string()), ("text", pa.large_string()),
])

CHUNKS = pa.schema([
    ("chunk_id", pa.string()), ("transcript_id", pa.string()), ("company", pa.string()), ("quarter", pa.date32()),
    ("chunk_index", pa.int32()), ("kind", pa.string()), ("section", pa.string()), ("speaker", pa.string()),
    ("speaker_organization", pa.string()), ("speaker_title", pa.string()),
    ("start_offset", pa.int64()), ("end_offset", pa.int64()), ("text", pa.large_string()),
])

STATEMENTS = pa.schema([
    ("statement_id", pa.string()), ("chunk_id", pa.string()), ("transcript_id", pa.string()),
    ("company", pa.string()), ("quarter", pa.date32()), ("statement_index", pa.int32()),
    ("statement", pa.string()), ("statement_hash", pa.string()),
    ("statement_type", pa.string()), ("temporal_type", pa.string()),
])

EVENTS = pa.schema([
    ("event_id", pa.string()), ("chunk_id", pa.string()), ("transcript_id", pa.string()),
    ("company", pa.string()), ("quarter", pa.date32()), ("statement", pa.string()), ("statement_hash", pa.string()),
    ("statement_type", pa.string()), ("temporal_type", pa.string()),
    ("valid_at", TIMESTAMP), ("invalid_at", TIMESTAMP), ("created_at", TIMESTAMP), ("expired_at", TIMESTAMP),
    ("ingested_at", TIMESTAMP), ("embedding", EMBEDDING),
])

TRIPLETS = pa.schema([
    ("triplet_id", pa.string()), ("event_id", pa.string()), ("company", pa.string()), ("quarter", pa.date32()),
    ("subject_name", pa.string()), ("subject_entity_id", pa.string()), ("predicate", pa.string()),
    ("object_name", pa.string()), ("object_entity_id", pa.string()), ("value", pa.string()),
    # The entities as extracted with the triplet; the `entities` step turns them into mention rows.
    ("subject_type", pa.string()), ("subject_description", pa.string()),
    ("object_type", pa.string()), ("object_description", pa.string()), ("seen_at", TIMESTAMP),
])

FIGURES = pa.schema([
    ("figure_id", pa.string()), ("event_id", pa.string()), ("transcript_id", pa.string()), ("company", pa.string()),
    ("quarter", pa.date32()), ("call_date", pa.date32()), ("stated_at", TIMESTAMP),
    ("metric", pa.string()), ("segment", pa.string()), ("basis", pa.string()), ("kind", pa.string()),
    ("fiscal_year", pa.int32()), ("fiscal_quarter", pa.int8()),
    ("value", pa.float64()), ("low", pa.float64()), ("high", pa.float64()), ("unit", pa.string()), ("amount_text", pa.string()),
])

FIGURE_INVALIDATIONS = pa.schema([
    ("figure_id", pa.string()), ("invalid_at", TIMESTAMP), ("expired_at", TIMESTAMP), ("invalidated_by", pa.string()),
    ("invalidated_by_figure", pa.string()), ("reason", pa.string()),
])

ENTITIES = pa.schema([
    ("entity_id", pa.string()), ("event_id", pa.string()), ("company", pa.string()), ("quarter", pa.date32()),
    ("name", pa.string()), ("type", pa.string()), ("description", pa.string()),
    ("seen_at", TIMESTAMP), ("embedding", EMBEDDING),
])

CANONICAL_ENTITIES = pa.schema([
    ("canonical_id", pa.string()), ("name", pa.string()), ("type", pa.string()), ("description", pa.string()),
    ("aliases", pa.list_(pa.string())), ("mention_count", pa.int64()),
    ("first_seen", TIMESTAMP), ("last_seen", TIMESTAMP), ("merged_into", pa.string()), ("source", pa.string()),
])

ENTITY_RESOLUTION = pa.schema([
    ("entity_id", pa.string()), ("canonical_id", pa.string()), ("method", pa.string()), ("score", pa.float64()),
])
# Resolution's memo (tkg.resolve.resolution.NameGroups.evidence): each name group whose evidence
# it read, with what that evidence is made of (its vectors' fixed-point sums, per length) ...
GROUP_EVIDENCE = pa.schema([
    ("type", pa.string()), ("name", pa.string()), ("descriptions", pa.list_(pa.string())),
    ("partitions", pa.list_(pa.string())), ("lengths", pa.list_(pa.int64())), ("sums", pa.list_(pa.list_(pa.int64()))),
])
# ... its name groups (tkg.resolve.resolution.GROUPS_SQL) ...
NAME_GROUPS = pa.schema([
    ("type", pa.string()), ("name", pa.string()), ("count", pa.int64()),
    ("first_description", pa.struct([("company", pa.string()), ("quarter", pa.date32()), ("entity_id", pa.string()),
                                     ("description", pa.string())])),
    ("first_seen", TIMESTAMP), ("last_seen", TIMESTAMP),
])
# ... and the entity files of every partition it read, by size and modification time (the
# spoken mentions' memo also keeps the chunk files it read so).
PARTITIONS_READ = pa.schema([("partition", pa.string()), ("size", pa.int64()), ("mtime_ns", pa.int64())])

# The name forms each call's text says (tkg.resolve.spoken.call_forms): the spoken mentions' memo.
SPOKEN_FORMS = pa.schema([
    ("partition", pa.string()), ("transcript_id", pa.string()), ("company", pa.string()), ("chunk_id", pa.string()),
    ("spoken", pa.string()), ("kind", pa.string()), ("target", pa.string()),
])

# A participant named in the call as the operator or a speaker said it (tkg.resolve.spoken).
SPOKEN_MENTIONS = pa.schema([
    ("mention_id", pa.string()), ("transcript_id", pa.string()), ("company", pa.string()), ("chunk_id", pa.string()),
    ("spoken", pa.string()), ("kind", pa.string()), ("participant", pa.string()), ("canonical_id", pa.string()),
    ("method", pa.string()),
])

EVENT_INVALIDATIONS = pa.schema([
    ("event_id", pa.string()), ("invalid_at", TIMESTAMP), ("expired_at", TIMESTAMP), ("invalidated_by", pa.string()),
    # 'statement' (a later statement or listing retired it) or 'absence' (inferred: the holder is
    # no longer listed; invalidated_by is NULL), and the ending in words where a rule gives one.
    ("end_evidence", pa.string()), ("end_reason", pa.string()),
])

# Each office of each person in each call's participants list (tkg.invalidate.positions): the
# firm as listed and as one key per person ('bernstein' for 'Sanford C. Bernstein' and
# 'Bernstein'), whether they are the company's own, and the single-holder office it falls in.
POSITION_LISTINGS = pa.schema([
    ("event_id", pa.string()), ("company", pa.string()), ("call_at", TIMESTAMP), ("person_id", pa.string()),
    ("person", pa.string()), ("title", pa.string()), ("firm", pa.string()), ("firm_key", pa.string()),
    ("corporate", pa.bool_()), ("single_holder_office", pa.string()),
])

INVALIDATION_JUDGMENTS = pa.schema([
    ("primary_event_id", pa.string()), ("secondary_event_id", pa.string()), ("invalidates", pa.bool_()),
    ("reason", pa.string()), ("judge", pa.string()), ("cosine", pa.float32()), ("shared_entity_id", pa.string()),
    ("predicate_group", pa.int8()),
])

FACT_RELEVANCE = pa.schema([
    ("event_id", pa.string()), ("relevance", pa.float64()), ("restatements", pa.int64()), ("last_stated_at", TIMESTAMP),
    ("age_days", pa.int64()), ("archive_reason", pa.string()),
])


# -- the intermediate tables of the sharded global steps (tkg.invalidate.stages); not published --

# The facts invalidation looks at (FACT, non-ATEMPORAL events with triplets) and the fact each
# states; `vector` is the embedding rounded as cosines use it (tkg.invalidate.candidates.vector_blobs).
FACTS = pa.schema([
    ("event_id", pa.string()), ("statement", pa.string()), ("statement_type", pa.string()), ("temporal_type", pa.string()),
    ("valid_at", TIMESTAMP), ("invalid_at", TIMESTAMP), ("created_at", TIMESTAMP), ("vector", pa.binary()),
    ("fact_key", pa.string()),
])
# What ranking reads of a fact (tkg.invalidate.candidates.rank_candidates): not its text.
RANKED_FACTS = pa.schema([FACTS.field(name) for name in ("event_id", "temporal_type", "valid_at", "invalid_at", "vector",
                                                          "fact_key")])
# The blocks: the facts sharing a canonical entity under a predicate group.
BLOCK_MEMBERS = pa.schema([("canonical_id", pa.string()), ("predicate_group", pa.int8()), ("event_id", pa.string())])
# Triplets with canonical subject and object (what the judge reads of a fact).
RESOLVED_TRIPLETS = pa.schema([
    ("triplet_id", pa.string()), ("event_id", pa.string()), ("subject", pa.string()), ("subject_id", pa.string()),
    ("predicate", pa.string()), ("object", pa.string()), ("object_id", pa.string()), ("value", pa.string()),
])
# What fact_blocks' next run compares with (tkg.invalidate.blocks): every fact's links (the
# blocks it falls in) with its partition; every entity's resolution as the facts read it (a hash
# of its id, and of its canonical id and name); every partition's file versions (of its events
# and triplets) with its number of facts.
FACT_LINKS = pa.schema([("event_id", pa.string()), ("canonical_id", pa.string()), ("predicate_group", pa.int8()),
                        ("company", pa.string()), ("quarter", pa.date32())])
FACT_ENTITIES = pa.schema([("entity_hash", pa.uint64()), ("resolution_hash", pa.uint64())])
FACT_PARTITIONS = pa.schema([("company", pa.string()), ("quarter", pa.date32()), ("events_source", pa.string()),
                             ("triplets_source", pa.string()), ("facts", pa.int64())])
# Per shard, how many rows a step wrote for it (the stamp table of a step with sharded outputs).
SHARD_SUMMARY = pa.schema([("shard", pa.int32()), ("table_name", pa.string()), ("rows", pa.int64())])
# An incoming event's best facts per candidate type (tkg.invalidate.candidates).
CANDIDATE_RANKS = pa.schema([
    ("incoming_event_id", pa.string()), ("candidate_dynamic", pa.bool_()), ("fact_key", pa.string()),
    ("cosine", pa.float32()), ("block_entity", pa.string()), ("block_group", pa.int8()), ("predicate_group", pa.int8()),
])
# The base a shard's candidate ranks or judgments are stacked on: its file (relative to the
# shard's folder) and rows (tkg.invalidate.stages.stack_ranks, stack_judgments).
SHARD_BASE = pa.schema([("file", pa.string()), ("rows", pa.int64())])
# The block members a shard's candidate ranks cover, each with a fingerprint of its fact.
RANKED_MEMBERS = pa.schema([("canonical_id", pa.string()), ("predicate_group", pa.int8()), ("event_id", pa.string()),
                            ("fingerprint", pa.uint64())])
# The incoming events whose candidate ranks in a shard differ from the shard's last output
# (`since_version`, its version); a row without an event names that version even when none did.
RANK_CHANGES = pa.schema([("since_version", pa.string()), ("incoming_event_id", pa.string())])
# The version of each shard's candidate ranks a selection read ...
SHARDS_READ = pa.schema([("shard", pa.string()), ("version", pa.string())])
# ... and of each shard's judgments, with the file's size and time: a shard rebuilt with the same
# version (its inputs unchanged) is a rewritten file all the same, and its verdicts may differ.
JUDGMENTS_READ = pa.schema([*SHARDS_READ, ("size", pa.int64()), ("mtime_ns", pa.int64())])
# A shard's judgments, each with what the shard's next run compares: a fingerprint of what its
# verdict depends on, and its unit (a hash of its two facts' keys, see tkg.invalidate.stages).
SHARD_JUDGMENTS = pa.schema([*INVALIDATION_JUDGMENTS, ("fingerprint", pa.uint64()), ("unit", pa.uint64())])
# A shard's judgments as stored: the changes since its base (tkg.invalidate.stages.stack_judgments),
# a row per pair of the base that is gone (`gone`) and per pair judged since, as judged now.
SHARD_JUDGMENT_DELTA = pa.schema([("gone", pa.bool_()), *SHARD_JUDGMENTS])
# The figure revisions' memo (tkg.invalidate.revising): each figure as last read (a hash of what
# the revisions read of it, its company, a hash of its guidance key, its time) and, for a retired
# guidance figure, when that was settled: revised_at by a later figure of its key, closed_at by
# its period's results.
REVISION_FIGURES = pa.schema([("figure_id", pa.string()), ("row_hash", pa.uint64()), ("company", pa.string()),
                              ("key_hash", pa.uint64()), ("stated_at", TIMESTAMP), ("revised_at", TIMESTAMP),
                              ("closed_at", TIMESTAMP)])
# The version of each global step's split tables a shard step read: its next run reads the rows
# changed since (tkg.store.splits.shard_changes_since) rather than every row.
SPLITS_READ = pa.schema([("asset", pa.string()), ("version", pa.string())])
# What a shard's judge pairs were made from, for its next run to tell which pairs to make again:
# each fact it held, with the hash of its row in the facts split and of its canonical triplets
# (the judge reads them; the pairing does not) ...
PAIRED_EVENTS = pa.schema([("event_id", pa.string()), ("fact_key", pa.string()), ("fact_hash", pa.uint64()),
                           ("triplets_hash", pa.uint64())])
# ... and per unit (two facts, named by a hash of their keys in text order) a digest of the
# selected rows that link them.
PAIRED_UNITS = pa.schema([("unit", pa.uint64()), ("digest", pa.uint64())])
# The judgments that differ from an output's last version (`since_version`, that version's; NULL
# when the output was not made from it): the rows gone from it (`gone`) and the rows new in it,
# whole. A row with `gone` NULL and no judgment names the version even when nothing changed.
JUDGMENT_CHANGES = pa.schema([("since_version", pa.string()), ("gone", pa.bool_()), *INVALIDATION_JUDGMENTS])
# A primary event's earliest retirer in one shard.
RETIREMENTS = pa.schema([("event_id", pa.string()), ("invalid_at", TIMESTAMP), ("invalidated_by", pa.string())])


LLM_CALLS = pa.schema([
    ("step", pa.string()), ("stage", pa.string()), ("company", pa.string()), ("quarter", pa.date32()),
    ("backend", pa.string()), ("model", pa.string()), ("requests", pa.int64()), ("cache_hits", pa.int64()),
    ("input_tokens", pa.int64()), ("cached_input_tokens", pa.int64()), ("output_tokens", pa.int64()),
    ("retries", pa.int64()), ("rate_limited", pa.int64()), ("reasks", pa.int64()), ("partial_answers", pa.int64()),
    ("dropped", pa.int64()),
    ("dropped_by_reason", pa.string()), ("repaired_by_reason", pa.string()),
    ("latency_p50_ms", pa.float64()), ("latency_p95_ms", pa.float64()), ("latency_p99_ms", pa.float64()),
    ("estimated_cost_usd", pa.float64()), ("recorded_at", TIMESTAMP),
    # How the requests went: 'sync' (answered as they came) or 'batch' (OpenAI's Batch API, half
    # price); and what the same tokens cost as synchronous requests, so the saving shows.
    ("mode", pa.string()), ("sync_cost_usd", pa.float64()),
])


def to_table(records: Iterable[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows (dicts) to an Arrow table with exactly `schema`'s columns, in order."""
    rows = list(records)
    return pa.Table.from_pylist(rows, schema=schema) if rows else schema.empty_table()


# What each column holds: shown in Dagster's column schema and kept in one place.
COLUMN_DESCRIPTIONS: dict[str, str] = {
    "transcript_id": "The call: ticker and call date, e.g. INTC_20161018",
    "company": "Ticker of the company whose call it is (the partition's company)",
    "quarter": "First day of the calendar quarter of the call date (the partition's quarter)",
    "company_name": "The company's name as the transcript title gives it",
    "call_date": "Date of the call",
    "call_datetime": "Date and time of the call, UTC",
    "title": "Title line of the transcript",
    "doc_type": "Vendor line of the transcript (e.g. 'Thomson Reuters StreetEvents Event Transcript')",
    "fiscal_quarter": "The company's own fiscal label, e.g. 'Q2 2021' (NVIDIA's and AMD's Q1 2019 differ); "
                      "of a figure, its fiscal quarter 1-4 (null: a full year)",
    "fiscal_year": "Fiscal year of the call's fiscal quarter; of a figure, the fiscal year it is for",
    "fiscal_period_start": "First day of the fiscal quarter the call discusses",
    "fiscal_period_end": "Last day of the fiscal quarter the call discusses",
    "participants": "Corporate and conference-call participants with organisation and title",
    "turns": "Speaker turns with their character offsets into `text`",
    "content_sha256": "sha256 of the transcript text",
    "text": "The transcript text (chunks and turns point into it by offset)",
    "chunk_id": "Semantic chunk: a hash of transcript and offsets",
    "chunk_index": "Position of the chunk in its transcript",
    "kind": "Of a chunk: participants, speech or summary; of a figure: reported or guidance",
    "section": "Transcript section (Presentation, Questions and Answers, ...)",
    "speaker": "Who said the chunk",
    "start_offset": "First character of the chunk in transcripts.text",
    "end_offset": "Character after the last of the chunk in transcripts.text",
    "statement_id": "Atomic statement: a hash of chunk, position and text; also its event id",
    "statement_index": "Position of the statement in its chunk",
    "statement": "The atomic, self-contained statement",
    "statement_hash": "sha256 of the normalised statement text (the cache and dedup key)",
    "statement_type": "FACT, OPINION or PREDICTION",
    "temporal_type": "STATIC, DYNAMIC or ATEMPORAL",
    "event_id": "Temporal event (one per statement; equal to its statement_id)",
    "valid_at": "When the fact began to hold (real-world time, UTC)",
    "invalid_at": "When the fact stopped holding (real-world time, UTC); null while it holds",
    "created_at": "When the fact entered the record: the call's time (transaction time, UTC)",
    "expired_at": "When the record was retired: the time of the call that retired it (transaction time, UTC)",
    "ingested_at": "Wall-clock time tkg computed the row",
    "embedding": "Unit-length statement or description embedding",
    "triplet_id": "Triplet: a hash of event, position and predicate",
    "subject_name": "Subject as extracted", "object_name": "Object as extracted",
    "subject_entity_id": "Entity mention of the subject", "object_entity_id": "Entity mention of the object",
    "predicate": "One of the 20 predicates of the vocabulary (HOLDS_ROLE, HAS_REVENUE, ...)",
    "value": "A quantity the triplet carries ('$1.48 billion', '61.9%'); of a figure, the number in base units "
             "(1.48e9, 61.9; a range's midpoint)",
    "seen_at": "Time of the call the mention comes from",
    "entity_id": "Entity mention", "name": "Name as extracted (or the canonical name)", "type": "Entity type",
    "description": "What the entity is, as the extractor described it",
    "canonical_id": "Canonical entity: stable id", "aliases": "Every name the entity goes by",
    "mention_count": "Mentions resolved to the entity (0: an id kept from an earlier build)",
    "first_seen": "First call that mentions the entity", "last_seen": "Last call that mentions the entity",
    "merged_into": "For an id no longer in use: the canonical entity that now holds its names",
    "source": "registry (a configured company) or mentions",
    "method": "How the mention was resolved: registry, cluster or split; ':alias' when its name is not the canonical name",
    "invalidated_by": "The event whose statement retired this one",
    "figure_id": "Financial figure: a hash of its event, metric, period and value",
    "stated_at": "Time of the call that stated the figure",
    "metric": "revenue, segment_revenue, gross_margin, operating_margin, operating_income, operating_expenses, net_income, "
              "eps, capex, free_cash_flow or revenue_growth",
    "segment": "The segment or product line of a segment figure (names from tkg/config/companies.yaml), else null",
    "basis": "GAAP, non-GAAP, or null when not stated",
    "low": "Low end of a range (or value minus a plus-or-minus), in base units",
    "high": "High end of a range (or value plus a plus-or-minus), in base units",
    "unit": "USD (or the stated currency), percent, or USD/share",
    "amount_text": "The amount as the statement writes it",
    "invalidated_by_figure": "The figure that revised this one",
    "primary_event_id": "The older event the judge was asked about",
    "secondary_event_id": "The newer event that may retire it",
    "invalidates": "The judge's verdict", "reason": "The judge's reason", "judge": "Rules or the LLM model that judged",
    "cosine": "Statement-embedding cosine of the pair", "shared_entity_id": "The canonical entity the pair shares",
    "predicate_group": "Predicate group (1-4) of the pair",
    "relevance": "recency x source trust x (1 + ln restatements); see tkg/config/retention.yaml",
    "restatements": "Calls that state the same statement", "last_stated_at": "The last call that stated it",
    "age_days": "Days from its last statement to the latest call in the graph",
    "archive_reason": "Why retention archived the fact (null: not archived)",
}


def column_description(column: str) -> str | None:
    return COLUMN_DESCRIPTIONS.get(column)
