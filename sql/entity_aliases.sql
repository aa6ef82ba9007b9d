-- description: Every known name of every canonical entity (alias -> canonical id and name), including the company registry's tickers and aliases.
-- depends_on: canonical_entities
CREATE OR REPLACE VIEW entity_aliases AS
SELECT DISTINCT alias, type, canonical_id, name AS canonical_name
FROM (SELECT unnest(aliases) AS alias, type, canonical_id, name FROM canonical_entities WHERE merged_into IS NULL);
