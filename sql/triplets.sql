-- description: Subject-predicate-object triplets with subject and object resolved to canonical entities (subject_mention/object_mention keep the extracted names).
-- upstream_assets: triplets, canonical_entities
CREATE OR REPLACE VIEW triplets AS
SELECT t.triplet_id, t.event_id, t.company, t.quarter,
       sm.canonical_id AS subject_id, coalesce(sc.name, t.subject_name) AS subject, t.subject_name AS subject_mention,
       t.predicate,
       om.canonical_id AS object_id, coalesce(oc.name, t.object_name) AS object, t.object_name AS object_mention,
       t.value
FROM raw.triplets AS t
LEFT JOIN raw.entity_resolution AS sm ON sm.entity_id = t.subject_entity_id
LEFT JOIN raw.canonical_entities AS sc ON sc.canonical_id = sm.canonical_id
LEFT JOIN raw.entity_resolution AS om ON om.entity_id = t.object_entity_id
LEFT JOIN raw.canonical_entities AS oc ON oc.canonical_id = om.canonical_id;
