-- description: One row per fact and continuous period of validity: restatements of the same subject, predicate, object and value merged. When it began, when it was last restated, how often, and when and by which statement it was retired (NULL while it holds); end_evidence 'statement' or 'absence' (inferred from the participants lists, retired_by NULL, end_reason in words).
-- depends_on: facts
CREATE OR REPLACE VIEW fact_history AS
WITH keyed AS (
    SELECT *, coalesce(valid_at, call_date::TIMESTAMPTZ) AS began,
           md5(concat_ws('|', subject_id, predicate, object_id, coalesce(value, ''))) AS fact_key
    FROM facts
), ordered AS (
    -- a restatement opens a new period when every earlier one had already ended before it began
    SELECT *, max(coalesce(invalid_at, 'infinity'::TIMESTAMPTZ)) OVER (
               PARTITION BY fact_key ORDER BY began, call_date, event_id
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS open_until
    FROM keyed
), periods AS (
    SELECT *, sum(CASE WHEN began >= open_until THEN 1 ELSE 0 END) OVER (
               PARTITION BY fact_key ORDER BY began, call_date, event_id) AS period
    FROM ordered
), merged AS (
    -- first and last in the periods' own order (began, call_date, event_id), whatever order the
    -- rows of `facts` are stored in; subject_id, predicate, object_id and value make the fact_key
    SELECT fact_key, period,
           arg_min(company, (began, call_date, event_id)) AS company, arg_min(subject, (began, call_date, event_id)) AS subject,
           any_value(subject_id) AS subject_id, any_value(predicate) AS predicate,
           arg_min(object, (began, call_date, event_id)) AS object, any_value(object_id) AS object_id,
           any_value(value) AS value, min(began) AS began_at, max(call_date) AS last_restated_on,
           count(*) AS restatements, count(DISTINCT company) AS companies,
           arg_min(event_id, (began, call_date, event_id)) AS first_event_id,
           arg_min(statement, (began, call_date, event_id)) AS first_statement,
           arg_max(event_id, (began, call_date, event_id)) AS last_event_id,
           CASE WHEN bool_and(invalid_at IS NOT NULL) THEN max(invalid_at) END AS ended_at,
           -- the ending of the last event to end: by which statement, or inferred from absence
           CASE WHEN bool_and(invalid_at IS NOT NULL)
                THEN arg_max({'by': invalidated_by, 'evidence': end_evidence, 'reason': end_reason},
                             (invalid_at, event_id)) END AS ending,
           list(event_id ORDER BY began, event_id) AS event_ids
    FROM periods
    GROUP BY fact_key, period
)
SELECT m.company, m.subject, m.subject_id, m.predicate, m.object, m.object_id, m.value,
       m.began_at, m.ended_at, m.last_restated_on, m.restatements, m.companies,
       m.ending.by AS retired_by, e.statement AS retired_by_statement,
       m.ending.evidence AS end_evidence, m.ending.reason AS end_reason,
       m.first_event_id, m.first_statement, m.last_event_id, m.event_ids, m.fact_key || '-' || m.period AS fact_id
FROM merged AS m
LEFT JOIN events AS e ON e.event_id = m.ending.by;
