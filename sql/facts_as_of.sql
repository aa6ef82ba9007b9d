-- description: Table macro facts_as_of(ts): the facts valid at ts (valid_at <= ts < invalid_at). A TIMESTAMP or DATE argument is read as UTC.
-- depends_on: facts
CREATE OR REPLACE MACRO facts_as_of(ts) AS TABLE
SELECT * FROM facts
WHERE valid_at <= timezone('UTC', CAST(ts AS TIMESTAMP))
  AND (invalid_at IS NULL OR invalid_at > timezone('UTC', CAST(ts AS TIMESTAMP)));
