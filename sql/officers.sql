-- description: HOLDS_ROLE facts split into person, role and organisation, with validity: who held which office when.
-- depends_on: facts
CREATE OR REPLACE VIEW officers AS
SELECT company, subject AS person, subject_id AS person_id,
       regexp_extract(object, '^(.*) of (.*)$', 1) AS role,
       regexp_extract(object, '^(.*) of (.*)$', 2) AS organization,
       object AS office, object_id AS office_id, value AS title,
       valid_at, invalid_at, created_at, expired_at, invalidated_by, end_evidence, end_reason, statement, event_id, call_date
FROM facts
WHERE predicate = 'HOLDS_ROLE';
