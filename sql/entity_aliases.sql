-- description: Every known name of every canonical entity (alias -> canonical id and name), including the company registry's tickers and aliases (source 'name'), and the forms people are called by in the calls (source 'spoken': operator introductions, self-introductions, 'in for' phrases, linked to the participant they name). A spoken form already known as a name of any entity is not added again.
-- depends_on: canonical_entities
-- upstream_assets: spoken_mentions
CREATE OR REPLACE VIEW entity_aliases AS
WITH named AS (
    SELECT DISTINCT alias, type, canonical_id, name
    FROM (SELECT unnest(aliases) AS alias, type, canonical_id, name FROM canonical_entities WHERE merged_into IS NULL)
), spoken AS (
    SELECT DISTINCT m.spoken AS alias, c.type, c.canonical_id, c.name
    FROM raw.spoken_mentions AS m
    JOIN canonical_entities AS c ON c.canonical_id = m.canonical_id AND c.merged_into IS NULL
    WHERE m.spoken NOT IN (SELECT alias FROM named) AND m.spoken LIKE '% %'  -- a first name alone names nobody across calls
)
SELECT alias, type, canonical_id, name AS canonical_name, 'name' AS source FROM named
UNION ALL
SELECT alias, type, canonical_id, name AS canonical_name, 'spoken' AS source FROM spoken;
