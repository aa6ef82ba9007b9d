-- description: Semantic chunks of each transcript with speaker, section and character offsets into transcripts.text.
-- upstream_assets: chunks
CREATE OR REPLACE VIEW chunks AS
SELECT chunk_id, transcript_id, company, quarter, chunk_index, kind, section, speaker, speaker_organization,
       speaker_title, start_offset, end_offset, text
FROM raw.chunks;
