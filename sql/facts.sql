-- description: One row per triplet joined to its event and canonical entities: the table to query (a table, not a view, so as-of queries do not redo the joins). subject and object hold canonical names. Facts retention archived are in facts_archive instead.
-- depends_on: events, triplets, transcripts
-- The join is materialised before the sort (a MATERIALIZED CTE): joining and sorting in one
-- pipeline held the join's hash table and the sort's runs at once, and at 5M events ran out of
-- the publish's memory (TKG_STEP_MEMORY); apart, each spills as it must.
-- A publish that starts from the last file keeps this table and runs the query for the events
-- that changed alone, with `events` and `triplets` narrowed to them (tkg.store.warehouse.FactsInPlace):
-- keep it one query over those views, whose rows are keyed by event.
CREATE OR REPLACE TABLE facts AS
WITH joined AS MATERIALIZED (
SELECT e.company, tr.fiscal_quarter, tr.call_date, t.subject, t.subject_id, t.predicate, t.object, t.object_id, t.value,
       e.statement, e.statement_type, e.temporal_type, e.valid_at, e.invalid_at, e.created_at, e.expired_at,
       e.invalidated_by, e.end_evidence, e.end_reason, e.asserted_invalid_at, e.chunk_id, e.event_id, t.triplet_id, e.transcript_id, r.relevance
FROM triplets AS t
JOIN events AS e ON e.event_id = t.event_id
JOIN transcripts AS tr ON tr.transcript_id = e.transcript_id
LEFT JOIN raw.fact_relevance AS r ON r.event_id = e.event_id
WHERE r.archive_reason IS NULL
)
SELECT * FROM joined
ORDER BY company, valid_at, triplet_id;
