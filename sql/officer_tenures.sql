-- description: One row per person, office and continuous tenure (restatements merged): when it started, when it ended and what ended it, how often it was restated. ended_by is the retiring event, or for an ending inferred from absence the words 'absent from the participants from <call> on'; end_evidence tells observed ('statement') from inferred ('absence') endings.
-- depends_on: fact_history
CREATE OR REPLACE VIEW officer_tenures AS
SELECT company, subject AS person, subject_id AS person_id,
       regexp_extract(object, '^(.*) of (.*)$', 1) AS role,
       regexp_extract(object, '^(.*) of (.*)$', 2) AS organization,
       object AS office, object_id AS office_id, value AS title,
       began_at AS started_at, ended_at,
       CASE WHEN end_evidence = 'absence' THEN end_reason ELSE retired_by END AS ended_by,
       retired_by_statement AS ended_by_statement, end_evidence,
       last_restated_on, restatements, first_event_id, first_statement, fact_id
FROM fact_history
WHERE predicate = 'HOLDS_ROLE';
