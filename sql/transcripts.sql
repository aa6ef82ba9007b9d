-- description: One row per earnings call: ticker, call date and time, the title's fiscal quarter and the period it covers, participants and the full text.
-- upstream_assets: transcripts
CREATE OR REPLACE VIEW transcripts AS
SELECT transcript_id, company, quarter, company_name, call_date, call_datetime, title, doc_type,
       fiscal_quarter, fiscal_year, fiscal_period_start, fiscal_period_end,
       participants, len(turns) AS n_turns, body_end, content_sha256, text
FROM raw.transcripts;
