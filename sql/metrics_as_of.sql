-- description: Table macro metrics_as_of(ts): the figures valid at ts (valid_at <= ts < invalid_at): what had been reported, and the guidance that stood, as of that time. A TIMESTAMP or DATE argument is read as UTC.
-- depends_on: metrics
CREATE OR REPLACE MACRO metrics_as_of(ts) AS TABLE
SELECT * FROM metrics
WHERE valid_at <= timezone('UTC', CAST(ts AS TIMESTAMP))
  AND (invalid_at IS NULL OR invalid_at > timezone('UTC', CAST(ts AS TIMESTAMP)));
