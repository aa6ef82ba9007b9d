"""Ingestion stages: a partition's source rows parsed into transcripts, then cut into semantic
chunks. Each takes a `StageJob` and returns a `StageResult` (tkg.core.results); the stage
catalog (tkg.build.catalog) says what each reads and writes."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from tkg.core import tables
from tkg.core.companies import get_company
from tkg.core.models import Transcript, Turn
from tkg.core.partitions import key_of, quarter_start
from tkg.core.results import StageIncomplete, StageJob, StageResult
from tkg.ingest.chunking import chunk_transcript
from tkg.ingest.parsing import TranscriptParseError, parse_transcript

log = logging.getLogger(__name__)

# Bump when the parser's output changes: every partition's transcripts are then rebuilt.
TRANSCRIPTS_VERSION = "streetevents-parser-1"
# Bump when chunking changes (its settings and the embedder are part of the code version too).
CHUNKS_VERSION = "semantic-chunks-1"


def parse_transcripts(job: StageJob) -> StageResult:
    """Parse the partition's source rows; a row that does not parse is skipped and named, the
    others go on. Unless a partial result is allowed, a skipped row fails the stage, so the
    partition keeps what it was built from."""
    company, quarter = job.partition
    registry_entry = get_company(company)
    records, result = [], StageResult(tables.TRANSCRIPTS.empty_table())
    for row in job.rows:
        try:
            transcript = parse_transcript(row, registry_entry)
        except TranscriptParseError as error:
            result.counts["skipped_unparseable"] += 1
            result.notes.append(str(error))
            log.warning("skipping %s", error)
            continue
        record = transcript.model_dump(exclude={"participants", "turns"})
        record["quarter"] = quarter_start(transcript.call_date)
        record["participants"] = [p.model_dump() for p in transcript.participants]
        record["turns"] = [t.model_dump(exclude={"text"}) for t in transcript.turns]
        records.append(record)
        result.counts["transcripts"] += 1
    result.table = tables.to_table(records, tables.TRANSCRIPTS)
    if result.counts["skipped_unparseable"]:
        if not job.allow_partial:
            raise StageIncomplete("transcripts", key_of(company, quarter), "; ".join(result.notes))
        result.missing["unparseable_rows"] = result.counts["skipped_unparseable"]
    if not job.rows:
        result.notes.append(f"no call for {company} in the quarter starting {quarter.isoformat()}")
    return result


def transcript_from_record(record: dict[str, Any]) -> Transcript:
    """Rebuild a `Transcript` (turn texts included) from a stored transcripts row."""
    text = record["text"]
    turns = [Turn(**turn, text=text[turn["start"] : turn["end"]]) for turn in record["turns"]]
    return Transcript.model_validate({**record, "turns": turns})



def chunk_transcripts(job: StageJob) -> StageResult:
    """Semantic chunks of every speaker turn, and one chunk for the participants list."""
    records = []
    for record in job.inputs["transcripts"].to_pylist():
        transcript = transcript_from_record(record)
        for chunk in chunk_transcript(transcript, job.providers.chunk_embedder, job.providers.chunking):
            records.append({**chunk.model_dump(), "quarter": record["quarter"], "start_offset": chunk.start, "end_offset": chunk.end})
    return StageResult(tables.to_table(records, tables.CHUNKS), Counter(chunks=len(records)))
