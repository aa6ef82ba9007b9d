-- description: Every invalidation judgment with both statements and validity ranges, the verdict, its reason and the judge (model or rule), so any invalidation can be audited.
-- upstream_assets: invalidated_events
-- depends_on: canonical_entities
CREATE OR REPLACE VIEW invalidation_judgments AS
SELECT p.company, j.primary_event_id, p.statement AS primary_statement, p.valid_at AS primary_valid_at,
       p.invalid_at AS primary_asserted_invalid_at,
       j.secondary_event_id, s.statement AS secondary_statement, s.valid_at AS secondary_valid_at,
       j.invalidates, j.reason, j.judge, j.cosine, j.predicate_group, j.shared_entity_id, c.name AS shared_entity
FROM raw.invalidation_judgments AS j
JOIN raw.events AS p ON p.event_id = j.primary_event_id
JOIN raw.events AS s ON s.event_id = j.secondary_event_id
LEFT JOIN canonical_entities AS c ON c.canonical_id = j.shared_entity_id;
