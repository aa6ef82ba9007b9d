"""Checks that guard the warehouse, run on every new tkg.duckdb before it replaces the old one.

Each is a query on the finished file. An ERROR check that fails stops the publish: the file
is discarded and readers keep the last good graph, since bad rows would otherwise spread into
every view and every answer. WARN checks are reported and do not block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from tkg.core import policy
from tkg.core.models import Predicate

# Per partition: a call yields at least this many chunks, and a chunk at most this many
# statements; outside these bounds a stage has gone wrong (an empty parse, a runaway split).
MIN_CHUNKS_PER_CALL = 1
MAX_STATEMENTS_PER_CHUNK = 60


@dataclass
class CheckResult:
    name: str
    passed: bool
    description: str
    blocking: bool = True
    failures: int = 0
    examples: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.name}: {self.failures} failure(s), e.g. {'; '.join(self.examples[:3])}"


@dataclass(frozen=True)
class Check:
    name: str
    description: str
    sql: str  # rows that break the rule; each row is one failure, rendered as its example
    blocking: bool = True
    parameters: tuple = ()


CHECKS = (
    Check("predicates_in_vocabulary", "Every triplet's predicate is one of the 20 of the vocabulary.",
          "SELECT triplet_id || ': ' || predicate FROM raw.triplets WHERE predicate NOT IN (SELECT unnest(?::VARCHAR[]))",
          parameters=([p.value for p in Predicate],)),
    Check("timestamps_are_utc", "Every timestamp column of the raw tables is TIMESTAMP WITH TIME ZONE (UTC).",
          "SELECT table_name || '.' || column_name || ' is ' || data_type FROM information_schema.columns "
          "WHERE table_schema = 'raw' AND data_type LIKE 'TIMESTAMP%' AND data_type <> 'TIMESTAMP WITH TIME ZONE'"),
    Check("statements_have_provenance", "Every statement can be traced to the words it came from: it has text, its "
          "call, and its chunk, which lies in that call.",
          """
          SELECT 'statement ' || s.statement_id || ' has no chunk' FROM raw.statements s ANTI JOIN raw.chunks USING (chunk_id)
          UNION ALL SELECT 'statement ' || s.statement_id || ' has no call' FROM raw.statements s
              ANTI JOIN raw.transcripts USING (transcript_id)
          UNION ALL SELECT 'statement ' || s.statement_id || ' has no text' FROM raw.statements s
              WHERE coalesce(trim(s.statement), '') = ''
          UNION ALL SELECT 'statement ' || s.statement_id || ' names chunk ' || s.chunk_id || ' of another call'
              FROM raw.statements s JOIN raw.chunks c USING (chunk_id) WHERE c.transcript_id <> s.transcript_id
          """),
    Check("no_orphans", "Every triplet has its event, every event its statement and call, every figure its event.",
          """
          SELECT 'triplet ' || t.triplet_id || ' has no event' FROM raw.triplets t ANTI JOIN raw.events e USING (event_id)
          UNION ALL SELECT 'event ' || e.event_id || ' has no statement' FROM raw.events e
              ANTI JOIN raw.statements s ON s.statement_id = e.event_id
          UNION ALL SELECT 'event ' || e.event_id || ' has no call' FROM raw.events e ANTI JOIN raw.transcripts USING (transcript_id)
          UNION ALL SELECT 'figure ' || f.figure_id || ' has no event' FROM raw.figures f ANTI JOIN raw.events e USING (event_id)
          UNION ALL SELECT 'retirement of ' || i.event_id || ' names no event' FROM raw.event_invalidations i
              ANTI JOIN raw.events e USING (event_id)
          """),
    Check("retirements_are_complete", "A retired fact has both expired_at and invalidated_by; a fact expired without a "
          "retiring event is one whose own statement gave its end, or one ended by absence (with its reason).",
          """
          SELECT event_id || ': invalidated_by without expired_at' FROM events WHERE invalidated_by IS NOT NULL AND expired_at IS NULL
          UNION ALL SELECT event_id || ': expired_at without invalidated_by or a stated end' FROM events
              WHERE expired_at IS NOT NULL AND invalidated_by IS NULL AND asserted_invalid_at IS NULL
                AND NOT (end_evidence = 'absence' AND end_reason IS NOT NULL)
          UNION ALL SELECT event_id || ': ended by absence without a reason or with a retiring event' FROM events
              WHERE end_evidence = 'absence' AND (end_reason IS NULL OR invalidated_by IS NOT NULL)
          UNION ALL SELECT event_id || ': retired by ' || invalidated_by || ', which does not exist' FROM events
              WHERE invalidated_by IS NOT NULL AND invalidated_by NOT IN (SELECT event_id FROM raw.events)
          """),
    Check("validity_ranges_are_ordered", "No fact ends before it starts, and every non-ATEMPORAL fact has a valid_at.",
          """
          SELECT event_id || ': ends ' || invalid_at || ' before it starts ' || valid_at FROM events WHERE invalid_at < valid_at
          UNION ALL SELECT event_id || ': ' || temporal_type || ' without valid_at' FROM events
              WHERE temporal_type <> 'ATEMPORAL' AND valid_at IS NULL
          """),
    Check("row_counts_within_bounds", f"Per partition, each call has at least {MIN_CHUNKS_PER_CALL} chunk(s) and each "
          f"chunk at most {MAX_STATEMENTS_PER_CHUNK} statements.",
          """
          WITH chunk_counts AS (SELECT t.transcript_id, count(c.chunk_id) AS n FROM raw.transcripts t
                                LEFT JOIN raw.chunks c USING (transcript_id) GROUP BY ALL),
               statement_counts AS (SELECT chunk_id, count(*) AS n FROM raw.statements GROUP BY ALL)
          SELECT transcript_id || ' has ' || n || ' chunk(s)' FROM chunk_counts WHERE n < ?
          UNION ALL SELECT 'chunk ' || chunk_id || ' has ' || n || ' statements' FROM statement_counts WHERE n > ?
          """, parameters=(MIN_CHUNKS_PER_CALL, MAX_STATEMENTS_PER_CHUNK)),
    Check("one_holder_per_office", "At no time do two different people hold the same one-at-a-time office (CEO, CFO, ...) "
          "at the same organisation; a failure points at a missed invalidation or a wrong entity merge.",
          """
          SELECT a.company || ' ' || a.office || ': ' || a.person || ' and ' || b.person || ' from '
                 || greatest(a.valid_at, b.valid_at)
          FROM officers a JOIN officers b
            ON a.office_id = b.office_id AND a.person_id < b.person_id
           AND a.valid_at < coalesce(b.invalid_at, 'infinity'::TIMESTAMPTZ)
           AND b.valid_at < coalesce(a.invalid_at, 'infinity'::TIMESTAMPTZ)
          WHERE a.role IN (SELECT unnest(?::VARCHAR[]))
          """, blocking=False, parameters=(sorted(policy.POLICY.offices),)),
)


def run_checks(connection: duckdb.DuckDBPyConnection, checks: tuple[Check, ...] = CHECKS) -> list[CheckResult]:
    results = []
    for check in checks:
        rows = connection.execute(f"SELECT * FROM ({check.sql}) ORDER BY ALL", list(check.parameters)).fetchall()
        results.append(CheckResult(check.name, passed=not rows, description=check.description, blocking=check.blocking,
                                   failures=len(rows), examples=[str(row[0]) for row in rows[:10]]))
    return results


class WarehouseCheckFailed(RuntimeError):
    """A blocking check failed on a new tkg.duckdb: it was not published."""

    def __init__(self, results: list[CheckResult]) -> None:
        self.results = results
        failed = [result for result in results if result.blocking and not result.passed]
        super().__init__("the new tkg.duckdb failed its checks and was not published (the last good one stays): "
                         + " | ".join(str(result) for result in failed))


def guard(results_sink: list[CheckResult] | None = None):
    """A `publish(check=...)` hook: run every check, keep the results, refuse on a blocking failure."""

    def check(connection: duckdb.DuckDBPyConnection) -> None:
        results = run_checks(connection)
        if results_sink is not None:
            results_sink.extend(results)
        if any(result.blocking and not result.passed for result in results):
            raise WarehouseCheckFailed(results)

    return check
