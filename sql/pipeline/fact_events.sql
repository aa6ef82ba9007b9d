-- FACT, non-ATEMPORAL events with at least one triplet: the only events invalidation looks at
-- (the statement and temporal types are parameters, from tkg/core/policy.py).
-- fact_key names the fact an event states (its canonical triplets), so that the same fact
-- restated in every quarter's call can be recognised as one candidate.
-- company and quarter name the partition an event comes from. The rows come in no set order.
-- Without the statement and its embedding, the bulk of an event's bytes: a reader that wants
-- them joins them from the events (fact_blocks reads them for the rows it writes alone).
-- Registered: events, resolved_triplets (from canonical_triplets.sql).
-- An event of one triplet (most) has that triplet's text as its key: the ordered aggregate, which
-- costs a sort per event, runs for the events of several triplets alone, with the same result.
WITH triplet_counts AS (
    SELECT event_id, count(*) AS triplets FROM resolved_triplets GROUP BY event_id
), keys AS (
    SELECT t.event_id, concat_ws('|', t.subject_id, t.predicate, coalesce(t.object_id, t.object), t.value) AS fact_key
    FROM resolved_triplets AS t SEMI JOIN (SELECT event_id FROM triplet_counts WHERE triplets = 1) USING (event_id)
    UNION ALL
    SELECT event_id,
           string_agg(concat_ws('|', subject_id, predicate, coalesce(object_id, object), value), ';'
                      ORDER BY subject_id, predicate, object_id, value) AS fact_key
    FROM resolved_triplets SEMI JOIN (SELECT event_id FROM triplet_counts WHERE triplets > 1) USING (event_id)
    GROUP BY event_id
)
SELECT e.event_id, e.statement_type, e.temporal_type, e.valid_at, e.invalid_at, e.created_at,
       k.fact_key, e.company, e.quarter
FROM events AS e
JOIN keys AS k ON k.event_id = e.event_id
WHERE e.statement_type IN (SELECT unnest(?::VARCHAR[])) AND e.temporal_type NOT IN (SELECT unnest(?::VARCHAR[]))
  AND e.valid_at IS NOT NULL
