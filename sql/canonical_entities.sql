-- description: Canonical entities: stable id, name, type, aliases and mention counts. A canonical merged into another keeps its row with merged_into set.
-- upstream_assets: canonical_entities
CREATE OR REPLACE VIEW canonical_entities AS
SELECT canonical_id, name, type, description, aliases, mention_count, first_seen, last_seen, merged_into, source
FROM raw.canonical_entities;
