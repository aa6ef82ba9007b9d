"""Extraction stages: statements from chunks, then their validity ranges (temporal events),
triplets, financial figures and entity mentions. Each takes a `StageJob` and returns a
`StageResult` (tkg.core.results), using the job's providers (an extractor, an embedder).

Nothing here imports dagster. Every id is derived from content (transcript, offsets,
statement text), so re-running a partition, or running partitions in any order, yields the
same ids.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

from tkg.core import tables
from tkg.core.companies import get_company
from tkg.core.ids import short_hash
from tkg.core.models import Chunk, RawStatement, TemporalEvent, TemporalType, Transcript
from tkg.core.results import StageJob, StageResult
from tkg.extract.base import (
    DocumentContext,
    apply_validity_rules,
    drop_dangling_triplets,
    statement_hash,
)
from tkg.ingest.stages import transcript_from_record

log = logging.getLogger(__name__)

# Bump when entity mentions change (the embedder is part of the code version too).
ENTITIES_VERSION = "entity-mentions-1"


def context_for(record: dict[str, Any]) -> tuple[Transcript, DocumentContext]:
    transcript = transcript_from_record(record)
    return transcript, DocumentContext.for_transcript(transcript, get_company(transcript.company))


def _chunk_from_record(record: dict[str, Any]) -> Chunk:
    return Chunk.model_validate({**record, "start": record["start_offset"], "end": record["end_offset"]})


# --- statements ------------------------------------------------------------------------------


def extract_statements(job: StageJob) -> StageResult:
    """One extraction call per chunk; statements keep their chunk and position for provenance."""
    transcripts, chunks, extractor = job.inputs["transcripts"], job.inputs["chunks"], job.providers.extractor
    chunks_by_transcript: dict[str, list[Chunk]] = {}
    for record in chunks.to_pylist():
        chunks_by_transcript.setdefault(record["transcript_id"], []).append(_chunk_from_record(record))
    records = []
    for transcript_record in transcripts.to_pylist():
        _, context = context_for(transcript_record)
        transcript_chunks = chunks_by_transcript.get(transcript_record["transcript_id"], [])
        for chunk, statements in zip(transcript_chunks, extractor.extract_statements(transcript_chunks, context)):
            seen: set[str] = set()
            for index, statement in enumerate(statements):
                digest = statement_hash(statement.statement)
                if digest in seen:  # the same statement twice in one chunk adds nothing
                    continue
                seen.add(digest)
                records.append({
                    "statement_id": short_hash(chunk.chunk_id, index, digest),
                    "chunk_id": chunk.chunk_id, "transcript_id": chunk.transcript_id, "company": chunk.company,
                    "quarter": transcript_record["quarter"], "statement_index": index,
                    "statement": statement.statement, "statement_hash": digest,
                    "statement_type": statement.statement_type.value, "temporal_type": statement.temporal_type.value,
                })
    return StageResult(tables.to_table(records, tables.STATEMENTS), Counter(statements=len(records)))


def _raw_statement(record: dict[str, Any]) -> RawStatement:
    return RawStatement(statement=record["statement"], statement_type=record["statement_type"], temporal_type=record["temporal_type"])


# --- temporal events -------------------------------------------------------------------------


def build_events(job: StageJob) -> StageResult:
    """Validity range and embedding per statement, as temporal events.

    `created_at` is the call's time: the moment the fact entered the record of published
    knowledge. Deriving it from the document rather than the clock keeps the bi-temporal
    history identical however and whenever partitions are (re)built; the wall-clock time of
    this run is kept separately as `ingested_at`.
    """
    transcripts, statements = job.inputs["transcripts"], job.inputs["statements"]
    extractor, embedder = job.providers.extractor, job.providers.embedder
    ingested_at = datetime.now(timezone.utc)
    by_transcript: dict[str, list[dict[str, Any]]] = {}
    for record in statements.to_pylist():
        by_transcript.setdefault(record["transcript_id"], []).append(record)
    result = StageResult(tables.EVENTS.empty_table())
    records = []
    for transcript_record in transcripts.to_pylist():
        transcript, context = context_for(transcript_record)
        rows = by_transcript.get(transcript.transcript_id, [])
        if not rows:
            continue
        raw = [_raw_statement(row) for row in rows]
        dated = [i for i, statement in enumerate(raw) if statement.temporal_type != TemporalType.ATEMPORAL]
        # Embeddings do not need the validity ranges: request both at once.
        with ThreadPoolExecutor(max_workers=1) as pool:
            embedding_job = pool.submit(embedder.embed, [row["statement"] for row in rows])
            ranges = dict(zip(dated, extractor.extract_validity([raw[i] for i in dated], context)))
            embeddings = embedding_job.result()
        for index, (row, statement) in enumerate(zip(rows, raw)):
            extracted = ranges.get(index)
            if index in ranges and extracted is None and statement.temporal_type != TemporalType.ATEMPORAL:
                result.counts["validity_unparsed_defaulted"] += 1
            validity = apply_validity_rules(statement, extracted, context.publication_date)
            event = TemporalEvent(
                event_id=row["statement_id"], chunk_id=row["chunk_id"], transcript_id=row["transcript_id"],
                company=row["company"], statement=row["statement"], statement_hash=row["statement_hash"],
                statement_type=statement.statement_type, temporal_type=statement.temporal_type,
                valid_at=validity.valid_at, invalid_at=validity.invalid_at, created_at=context.publication_date,
                embedding=[],
            )
            records.append({**event.model_dump(exclude={"invalidated_by"}), "quarter": row["quarter"],
                            "ingested_at": ingested_at, "embedding": embeddings[index].tolist()})
    result.table = tables.to_table(records, tables.EVENTS)
    result.counts["events"] = len(records)
    result.metadata["labels"] = dict(sorted(Counter(f"{record['statement_type']}/{record['temporal_type']}" for record in records).items()))
    return result


# --- triplets and entities -------------------------------------------------------------------


def extract_triplets(job: StageJob) -> StageResult:
    """Triplets (with their entities) for every statement (event ids are statement ids);
    dangling entity indices are dropped and counted. Needs only the statements, so it runs
    in parallel with the validity ranges."""
    transcripts, statements, extractor = job.inputs["transcripts"], job.inputs["statements"], job.providers.extractor
    by_transcript: dict[str, list[dict[str, Any]]] = {}
    for record in statements.select(["statement_id", "transcript_id", "statement", "statement_type", "temporal_type", "quarter", "company"]).to_pylist():
        by_transcript.setdefault(record["transcript_id"], []).append({**record, "event_id": record["statement_id"]})
    result = StageResult(tables.TRIPLETS.empty_table())
    stats = extractor.stats("triplets")
    dropped_before = stats.dropped_total
    records = []
    for transcript_record in transcripts.to_pylist():
        _, context = context_for(transcript_record)
        rows = by_transcript.get(transcript_record["transcript_id"], [])
        for row in rows:
            row["created_at"] = context.publication_date
        extractions = extractor.extract_triplets([_raw_statement(row) for row in rows], context) if rows else []
        for row, extraction in zip(rows, extractions):
            extraction = drop_dangling_triplets(extraction, stats)
            entities = {entity.entity_idx: entity for entity in extraction.entities}
            for position, triplet in enumerate(extraction.triplets):
                subject = entities[triplet.subject_id]
                obj = entities.get(triplet.object_id) if triplet.object_id is not None else None
                records.append({
                    "triplet_id": short_hash(row["event_id"], position, triplet.predicate.value),
                    "event_id": row["event_id"], "company": row["company"], "quarter": row["quarter"],
                    "subject_name": subject.name, "subject_entity_id": short_hash(row["event_id"], "entity", subject.entity_idx),
                    "predicate": triplet.predicate.value,
                    "object_name": obj.name if obj else triplet.object_name,
                    "object_entity_id": short_hash(row["event_id"], "entity", obj.entity_idx) if obj else None,
                    "value": triplet.value,
                    "subject_type": subject.type.value, "subject_description": subject.description,
                    "object_type": obj.type.value if obj else None, "object_description": obj.description if obj else None,
                    "seen_at": row["created_at"],
                })
    result.table = tables.to_table(records, tables.TRIPLETS)
    result.counts["triplets"] = len(records)
    result.counts["dropped_triplets"] = stats.dropped_total - dropped_before
    result.metadata["predicates"] = dict(sorted(Counter(record["predicate"] for record in records).items()))
    return result


def extract_figures(job: StageJob) -> StageResult:
    """Financial figures of the company's own statements: what its people said, not what an
    analyst or the operator said (an analyst restating guidance is not guidance). A call
    states one total per metric and period, so when a sentence without its segment's name
    ('Revenue was $163 million' in the Automotive paragraph) competes with the total, the
    smaller total is dropped and counted."""
    transcripts, chunks, statements = job.inputs["transcripts"], job.inputs["chunks"], job.inputs["statements"]
    extractor = job.providers.extractor
    speakers = {row["chunk_id"]: row for row in chunks.select(["chunk_id", "transcript_id", "chunk_index", "kind", "speaker",
                                                              "speaker_organization", "text"]).to_pylist()}
    # A paragraph may run over a chunk boundary: the speaker's previous chunk is part of its scope.
    by_index = {(row["transcript_id"], row["chunk_index"]): row for row in speakers.values()}
    for row in speakers.values():
        previous = by_index.get((row["transcript_id"], row["chunk_index"] - 1))
        same_turn = previous is not None and previous["speaker"] == row["speaker"] and previous["kind"] == row["kind"]
        row["before"] = previous["text"][-600:] + " " if same_turn else ""
    by_transcript: dict[str, list[dict[str, Any]]] = {}
    for record in sorted(statements.select(["statement_id", "chunk_id", "transcript_id", "statement", "statement_type",
                                            "temporal_type", "quarter", "company", "statement_index"]).to_pylist(),
                         key=lambda r: (r["transcript_id"], r["chunk_id"], r["statement_index"])):
        by_transcript.setdefault(record["transcript_id"], []).append(record)
    result = StageResult(tables.FIGURES.empty_table())
    records = []
    for transcript_record in transcripts.to_pylist():
        transcript, context = context_for(transcript_record)
        own_people = {p.name for p in transcript.participants if p.kind == "corporate"}
        rows = [row for row in by_transcript.get(transcript.transcript_id, [])
                if _said_by_the_company(speakers.get(row["chunk_id"]), own_people, context.ticker)]
        result.counts["statements_not_by_the_company"] += len(by_transcript.get(transcript.transcript_id, [])) - len(rows)
        scopes = _scopes(rows, speakers)
        found = extractor.extract_figures([_raw_statement(row) for row in rows], context, scopes) if rows else []
        call = []
        for row, figures in zip(rows, found):
            for figure in figures:
                call.append({
                    "figure_id": short_hash(row["statement_id"], *figure.key, figure.value, figure.low, figure.high, figure.unit),
                    "event_id": row["statement_id"], "transcript_id": transcript.transcript_id, "company": row["company"],
                    "quarter": row["quarter"], "call_date": transcript.call_date, "stated_at": context.publication_date,
                    "metric": figure.metric.value, "segment": figure.segment, "basis": figure.basis, "kind": figure.kind.value,
                    "fiscal_year": figure.fiscal_year, "fiscal_quarter": figure.fiscal_quarter, "value": figure.value,
                    "low": figure.low, "high": figure.high, "unit": figure.unit, "amount_text": figure.text,
                })
        kept = _one_total_per_period(call)
        result.counts["smaller_competing_totals"] += len(call) - len(kept)
        records.extend(kept)
    result.table = tables.to_table(sorted(records, key=lambda r: r["figure_id"]), tables.FIGURES)
    result.counts["figures"] = len(records)
    result.metadata["metrics"] = dict(sorted(Counter(f"{record['kind']} {record['metric']}" for record in records).items()))
    return result


def _scopes(rows: list[dict[str, Any]], chunks: dict[str, dict[str, Any]]) -> list[str]:
    """The paragraph before each statement: its chunk's text up to where the statement starts
    (short openers such as 'Moving to full year.' are not statements, so the text is read, not
    the earlier statements); the earlier statements of the chunk when the statement is not
    found verbatim (its pronouns were resolved)."""
    scopes, earlier = [], {}
    for row in rows:
        chunk = chunks.get(row["chunk_id"]) or {}
        text = chunk.get("text") or ""
        words = row["statement"].split()[:6]
        found = re.search(r"\s+".join(re.escape(w) for w in words), text) if len(words) >= 3 else None
        before = earlier.setdefault(row["chunk_id"], [])
        scopes.append(chunk.get("before", "") + (text[:found.start()] if found else " ".join(before)))
        before.append(row["statement"])
    return scopes


def _said_by_the_company(chunk: dict[str, Any] | None, own_people: set[str], ticker: str) -> bool:
    from tkg.core.names import company_for_name

    if chunk is None or chunk["kind"] == "participants":
        return False
    if chunk["kind"] == "summary":
        return True  # a vendor's summary of what the company said
    if chunk["speaker"] in own_people:
        return True
    organization = company_for_name(chunk["speaker_organization"]) if chunk["speaker_organization"] else None
    return organization is not None and organization.ticker == ticker


def _one_total_per_period(figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of competing company totals of revenue (and operating income, net income, operating
    expenses) for one period, kind and basis in one call, the largest. A statement whose total
    lost is about a part of the business, so its other company-total figures ('Revenue of $465
    million increased 7%', its margin) go too."""
    def key(figure: dict[str, Any]) -> tuple:
        return figure["kind"], figure["basis"], figure["fiscal_year"], figure["fiscal_quarter"], figure["unit"]

    largest: dict[tuple, float] = {}
    for figure in figures:
        if figure["metric"] in _TOTALS and figure["segment"] is None:
            largest[(figure["metric"], *key(figure))] = max(largest.get((figure["metric"], *key(figure)), abs(figure["value"])),
                                                            abs(figure["value"]))
    partial = {figure["event_id"] for figure in figures if figure["metric"] in _TOTALS and figure["segment"] is None
               and abs(figure["value"]) != largest[(figure["metric"], *key(figure))]}
    return [figure for figure in figures if figure["event_id"] not in partial or figure["segment"] is not None]


# Amounts a company states one total of per period: a smaller one in the same call is a part's.
_TOTALS = frozenset({"revenue", "operating_income", "net_income", "operating_expenses"})


def build_entity_mentions(job: StageJob) -> StageResult:
    """One row per entity mention (subject or object of a triplet), with a description embedding
    that entity resolution uses when names alone are ambiguous."""
    triplets, embedder = job.inputs["triplets"], job.providers.embedder
    mentions: dict[str, dict[str, Any]] = {}
    for row in triplets.to_pylist():
        for side in ("subject", "object"):
            entity_id = row[f"{side}_entity_id"]
            if entity_id is None or entity_id in mentions:
                continue
            mentions[entity_id] = {
                "entity_id": entity_id, "event_id": row["event_id"], "company": row["company"], "quarter": row["quarter"],
                "name": row[f"{side}_name"], "type": row[f"{side}_type"],
                "description": row[f"{side}_description"] or "", "seen_at": row["seen_at"],
            }
    records = sorted(mentions.values(), key=lambda m: m["entity_id"])
    vectors = embedder.embed([f"{m['name']}: {m['description']}" for m in records])
    for record, vector in zip(records, vectors):
        record["embedding"] = vector.tolist()
    return StageResult(tables.to_table(records, tables.ENTITIES), Counter(entities=len(records)))
