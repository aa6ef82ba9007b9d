-- description: Table macro facts_known_as_of(ts, known_at): the facts valid at ts as the graph stood at known_at, i.e. using only calls published by then (bi-temporal query).
-- depends_on: facts
CREATE OR REPLACE MACRO facts_known_as_of(ts, known_at) AS TABLE
WITH known AS (
    SELECT *,
           -- a retirement published after known_at was not yet known: use the statement's own end
           CASE WHEN expired_at IS NOT NULL AND expired_at <= timezone('UTC', CAST(known_at AS TIMESTAMP))
                THEN invalid_at ELSE asserted_invalid_at END AS known_invalid_at
    FROM facts
    WHERE created_at <= timezone('UTC', CAST(known_at AS TIMESTAMP))
)
SELECT * EXCLUDE (invalid_at, known_invalid_at), known_invalid_at AS invalid_at
FROM known
WHERE valid_at <= timezone('UTC', CAST(ts AS TIMESTAMP))
  AND (known_invalid_at IS NULL OR known_invalid_at > timezone('UTC', CAST(ts AS TIMESTAMP)));
