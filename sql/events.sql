-- description: Temporal events, one per statement, with the bi-temporal history after invalidation: valid_at/invalid_at (real-world time), created_at/expired_at (when the record was published/retired) and invalidated_by; end_evidence says whether a statement ended it ('statement') or it was inferred from the holder's absence from the participants ('absence', invalidated_by NULL, end_reason in words). asserted_invalid_at is the end the statement itself gave.
-- upstream_assets: temporal_events, triplets, invalidated_events
CREATE OR REPLACE VIEW events AS
WITH triplet_ids AS (
    SELECT event_id, list(triplet_id ORDER BY triplet_id) AS triplet_ids FROM raw.triplets GROUP BY event_id
)
SELECT e.event_id, e.chunk_id, e.transcript_id, e.company, e.quarter, e.statement, e.statement_hash,
       e.statement_type, e.temporal_type,
       e.valid_at, coalesce(i.invalid_at, e.invalid_at) AS invalid_at,
       e.created_at, coalesce(i.expired_at, e.expired_at) AS expired_at, i.invalidated_by,
       i.end_evidence, i.end_reason,
       e.invalid_at AS asserted_invalid_at, e.ingested_at,
       coalesce(t.triplet_ids, []) AS triplet_ids, e.embedding
FROM raw.events AS e
LEFT JOIN raw.event_invalidations AS i ON i.event_id = e.event_id
LEFT JOIN triplet_ids AS t ON t.event_id = e.event_id;
