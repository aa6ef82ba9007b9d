-- description: One row per person, office and continuous tenure (restatements merged): when it started, when it ended and what ended it, how often it was restated. ended_by is the retiring event, or for an ending inferred from absence the words 'absent from the participants from <call> on'; end_evidence tells observed ('statement') from inferred ('absence') endings. An interim tenure nothing ended closes when the next permanent tenure of the office starts (observed: the statement naming the permanent holder).
-- depends_on: fact_history
CREATE OR REPLACE VIEW officer_tenures AS
WITH tenures AS (
    SELECT company, subject AS person, subject_id AS person_id,
           regexp_extract(object, '^(.*) of (.*)$', 1) AS role,
           regexp_extract(object, '^(.*) of (.*)$', 2) AS organization,
           object AS office, object_id AS office_id, value AS title,
           began_at AS started_at, ended_at,
           CASE WHEN end_evidence = 'absence' THEN end_reason ELSE retired_by END AS ended_by,
           retired_by_statement AS ended_by_statement, end_evidence,
           last_restated_on, restatements, first_event_id, first_statement, fact_id
    FROM fact_history
    WHERE predicate = 'HOLDS_ROLE'
),
-- An interim tenure that nothing ended closes when the next permanent tenure of the same office
-- starts (the permanent holder may be the interim one, named again without 'interim').
permanent_after AS (
    SELECT i.fact_id, min(p.started_at) AS started_at, arg_min(p.first_event_id, (p.started_at, p.fact_id)) AS event_id,
           arg_min(p.first_statement, (p.started_at, p.fact_id)) AS statement
    FROM tenures AS i JOIN tenures AS p ON p.office = i.office AND p.started_at > i.started_at
    WHERE i.ended_at IS NULL AND lower(i.title) LIKE '%interim%' AND lower(coalesce(p.title, '')) NOT LIKE '%interim%'
    GROUP BY i.fact_id
)
SELECT t.* REPLACE (coalesce(t.ended_at, a.started_at) AS ended_at, coalesce(t.ended_by, a.event_id) AS ended_by,
                    coalesce(t.ended_by_statement, a.statement) AS ended_by_statement,
                    coalesce(t.end_evidence, CASE WHEN a.started_at IS NOT NULL THEN 'statement' END) AS end_evidence)
FROM tenures AS t LEFT JOIN permanent_after AS a USING (fact_id);
