-- description: One row per entity mention, with the canonical entity it resolved to.
-- upstream_assets: entities, canonical_entities
CREATE OR REPLACE VIEW entities AS
SELECT m.entity_id, m.event_id, m.company, m.quarter, m.name, m.type, m.description,
       r.canonical_id, c.name AS canonical_name, r.method AS resolution_method, m.seen_at
FROM raw.entities AS m
LEFT JOIN raw.entity_resolution AS r ON r.entity_id = m.entity_id
LEFT JOIN raw.canonical_entities AS c ON c.canonical_id = r.canonical_id;
