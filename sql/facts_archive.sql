-- description: The facts retention archived (tkg/config/retention.yaml; off by default): the same columns as facts, with why each was archived. Their history is kept; only the facts view leaves them out.
-- depends_on: events, triplets, transcripts
CREATE OR REPLACE VIEW facts_archive AS
SELECT e.company, tr.fiscal_quarter, tr.call_date, t.subject, t.subject_id, t.predicate, t.object, t.object_id, t.value,
       e.statement, e.statement_type, e.temporal_type, e.valid_at, e.invalid_at, e.created_at, e.expired_at,
       e.invalidated_by, e.end_evidence, e.end_reason, e.asserted_invalid_at, e.chunk_id, e.event_id, t.triplet_id, e.transcript_id, r.relevance,
       r.archive_reason
FROM triplets AS t
JOIN events AS e ON e.event_id = t.event_id
JOIN transcripts AS tr ON tr.transcript_id = e.transcript_id
JOIN raw.fact_relevance AS r ON r.event_id = e.event_id
WHERE r.archive_reason IS NOT NULL;
