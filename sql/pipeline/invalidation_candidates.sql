-- Candidate (primary, secondary) pairs for invalidation, REFERENCE 1.8, for all events at once.
-- Registered by tkg.invalidation before this runs:
--   facts(event_id, temporal_type, valid_at, invalid_at, embedding, fact_key)   FACT, non-ATEMPORAL
--   links(event_id, canonical_id, predicate_group)                               one row per triplet endpoint
-- Parameters: $min_cosine (0.5 in the seed), $top_k (10 in the seed).
WITH shared AS (
    -- 1. a shared canonical entity at triplet level, with a predicate from the same group
    SELECT x.event_id AS incoming_id, c.event_id AS candidate_id,
           min(x.canonical_id) AS shared_entity_id, min(x.predicate_group) AS predicate_group
    FROM links AS x
    JOIN links AS c
      ON c.canonical_id = x.canonical_id AND c.predicate_group = x.predicate_group AND c.event_id <> x.event_id
    GROUP BY ALL
),
overlapping AS (
    -- 2. overlap in time, seen from the incoming event's bounds [valid_at, coalesce(invalid_at, valid_at)]
    SELECT s.*, c.temporal_type AS candidate_type, c.fact_key,
           list_cosine_similarity(x.embedding, c.embedding) AS cosine
    FROM shared AS s
    JOIN facts AS x ON x.event_id = s.incoming_id
    JOIN facts AS c ON c.event_id = s.candidate_id
    WHERE (c.temporal_type = 'STATIC'
           AND c.valid_at BETWEEN x.valid_at AND coalesce(x.invalid_at, x.valid_at))
       OR (c.temporal_type = 'DYNAMIC'
           AND ((c.valid_at <= x.valid_at AND (c.invalid_at IS NULL OR c.invalid_at >= x.valid_at))
                OR c.valid_at BETWEEN x.valid_at AND coalesce(x.invalid_at, x.valid_at)))
),
ranked AS (
    -- 3. cosine >= $min_cosine, the top $top_k per incoming event and candidate type. A fact
    --    restated every quarter counts once (its fact_key), so restatements do not crowd out
    --    the other candidates.
    SELECT *, dense_rank() OVER (
               PARTITION BY incoming_id, candidate_type ORDER BY key_cosine DESC, fact_key) AS key_rank
    FROM (SELECT *, max(cosine) OVER (PARTITION BY incoming_id, fact_key) AS key_cosine
          FROM overlapping WHERE cosine >= $min_cosine)
),
oriented AS (
    -- 4. both directions: an older open DYNAMIC candidate may be retired by the incoming event,
    --    and an incoming DYNAMIC event may be retired by a candidate that starts after it.
    SELECT r.candidate_id AS primary_event_id, r.incoming_id AS secondary_event_id,
           r.cosine, r.shared_entity_id, r.predicate_group
    FROM ranked AS r
    JOIN facts AS p ON p.event_id = r.candidate_id
    JOIN facts AS s ON s.event_id = r.incoming_id
    WHERE r.key_rank <= $top_k AND p.temporal_type = 'DYNAMIC' AND p.valid_at < s.valid_at
    UNION ALL
    SELECT r.incoming_id, r.candidate_id, r.cosine, r.shared_entity_id, r.predicate_group
    FROM ranked AS r
    JOIN facts AS p ON p.event_id = r.incoming_id
    JOIN facts AS s ON s.event_id = r.candidate_id
    WHERE r.key_rank <= $top_k AND p.temporal_type = 'DYNAMIC' AND s.valid_at > p.valid_at
)
SELECT o.primary_event_id, o.secondary_event_id,
       max(o.cosine)::FLOAT AS cosine, min(o.shared_entity_id) AS shared_entity_id,
       min(o.predicate_group)::TINYINT AS predicate_group
FROM oriented AS o
JOIN facts AS p ON p.event_id = o.primary_event_id
JOIN facts AS s ON s.event_id = o.secondary_event_id
-- a finished event can only have its end moved earlier
WHERE p.invalid_at IS NULL OR s.valid_at < p.invalid_at
GROUP BY ALL
ORDER BY o.primary_event_id, o.secondary_event_id
