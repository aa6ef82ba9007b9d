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

EVENT_INVALIDATIONS = pa.schema([
    ("event_id", pa.string()), ("invalid_at", TIMESTAMP), ("expired_at", TIMESTAMP), ("invalidated_by", pa.string()),
])

INVALIDATION_JUDGMENTS = pa.schema([
    ("primary_event_id", pa.string()), ("secondary_event_id", pa.string()), ("invalidates", pa.bool_()),
    ("reason", pa.string()), ("judge", pa.string()), ("cosine", pa.float32()), ("shared_entity_id", pa.string()),
    ("predicate_group", pa.int8()),
])


LLM_CALLS = pa.schema([
    ("step", pa.string()), ("stage", pa.string()), ("company", pa.string()), ("quarter", pa.date32()),
    ("backend", pa.string()), ("model", pa.string()), ("requests", pa.int64()), ("cache_hits", pa.int64()),
    ("input_tokens", pa.int64()), ("cached_input_tokens", pa.int64()), ("output_tokens", pa.int64()),
    ("retries", pa.int64()), ("rate_limited", pa.int64()), ("reasks", pa.int64()), ("dropped", pa.int64()),
    ("dropped_by_reason", pa.string()), ("repaired_by_reason", pa.string()),
    ("latency_p50_ms", pa.float64()), ("latency_p95_ms", pa.float64()), ("latency_p99_ms", pa.float64()),
    ("estimated_cost_usd", pa.float64()), ("recorded_at", TIMESTAMP),
])


def to_table(records: Iterable[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows (dicts) to an Arrow table with exactly `schema`'s columns, in order."""
    rows = list(records)
    return pa.Table.from_pylist(rows, schema=schema) if rows else schema.empty_table()
