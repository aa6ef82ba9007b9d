-- description: Atomic statements extracted from each chunk, with their statement and temporal types.
-- upstream_assets: statements
CREATE OR REPLACE VIEW statements AS
SELECT statement_id, chunk_id, transcript_id, company, quarter, statement_index, statement, statement_hash,
       statement_type, temporal_type
FROM raw.statements;
